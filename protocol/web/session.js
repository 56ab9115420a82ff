// The owner's web page: a session: the timeline streaming by (epoch, seq), history paging, the items, the input.
import { fill, h, status } from './dom.js';
import { renderApprovals, renderTasks } from './cards.js';
import { badges, renderList } from './list.js';
import { settingsPanel } from './settings.js';
import { CHUNK, HISTORY_PAGE, S, V, call } from './state.js';
import { t } from './texts.js';

S.rerender = () => renderTimeline();

// --- a session -----------------------------------------------------------------------------------------

export function closeSession() {
  S.cur = null;
  location.hash = '';
  V.main.replaceChildren(h('p', { class: 'empty', text: t('pick') }));
}

export async function openSession(id, again) {
  const previous = S.cur && S.cur.id;
  if (previous && previous !== id) S.rpc.call('session/unsubscribe', { sessionId: previous }).catch(() => {});
  let snap;
  try {
    snap = await call('session/subscribe', { sessionId: id });
  } catch (e) {
    if (e.code === 'not-found') closeSession();
    return;
  }
  const cur = { id, epoch: snap.epoch, seq: snap.seq, session: snap.session, items: new Map(), order: [], nodes: new Map(),
    before: snap.before || null, plan: null, usage: null, queue: null };
  for (const item of snap.items) place(cur, item, false);
  S.cur = cur;
  S.sessions.set(id, snap.session);
  for (const a of snap.approvals) S.approvals.set(a.id, a);
  if (location.hash.slice(1) !== id) history.replaceState(null, '', '#' + id);
  const draft = again && previous === id && V.input ? V.input.value : '';  // a resubscribe keeps what was typed
  if (!again || previous !== id) S.files = [];
  buildSession();
  V.input.value = draft;
  renderList();
  S.rpc.call('session/markSeen', { sessionId: id }).catch(() => {});
}

// A new epoch or a resync: a fresh snapshot, once however many pushes say so meanwhile.
export function resubscribe(cur) {
  if (cur.stale) return;
  cur.stale = true;
  openSession(cur.id, true);
}

// Keep an item in the session's state: the plan, the usage and the queue are not on the timeline.
function place(cur, item, prepend) {
  if (item.kind === 'plan') { cur.plan = item; return 'plan'; }
  if (item.kind === 'usage') { cur.usage = item; return 'usage'; }
  if (item.kind === 'queue') { cur.queue = item; return 'queue'; }
  const known = cur.items.has(item.itemId);
  cur.items.set(item.itemId, item);
  if (!known) { if (prepend) cur.order.unshift(item.itemId); else cur.order.push(item.itemId); }
  return known ? 'replace' : 'add';
}

function buildSession() {
  const cur = S.cur;
  V.header = h('header', {});
  V.plan = h('section', { class: 'plan', 'aria-label': t('plan') });
  V.timeline = h('div', { class: 'timeline', role: 'log', 'aria-live': 'polite', 'aria-label': cur.session.title,
    onscroll: () => { const tl = V.timeline; atBottom = tl.scrollHeight - tl.scrollTop - tl.clientHeight < 120; } });
  atBottom = true;
  V.tasks = h('section', { class: 'tasks', 'aria-label': t('tasks') });
  V.queue = h('div', { class: 'queue' });
  V.files = h('div', { class: 'files' });
  V.input = h('textarea', { id: 'input', 'aria-label': t('input'), placeholder: t('input'), onkeydown: (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); sendInput(); }
  }, onpaste: onPaste });
  V.picker = h('input', { type: 'file', multiple: true, class: 'sr-only', tabindex: '-1', 'aria-hidden': 'true',
    onchange: () => { addFiles([...V.picker.files]); V.picker.value = ''; } });
  const composer = h('div', { class: 'composer' }, V.input, V.picker,
    h('button', { text: t('attach'), onclick: () => V.picker.click() }),
    h('button', { class: 'primary', id: 'send', text: t('send'), onclick: sendInput }));
  V.settings = settingsPanel(cur.id);
  V.main.replaceChildren(V.header, V.plan, V.settings, V.approvals, V.timeline, V.tasks, V.queue, V.files, composer);
  renderHeader();
  renderTimeline();
  renderApprovals();
  renderTasks();
  renderFiles();
  V.input.focus();
}

export function renderHeader() {
  const cur = S.cur;
  if (!cur || !V.header) return;
  const s = S.sessions.get(cur.id) || cur.session;
  cur.session = s;
  const path = (s.ancestors || []).map((a) => a.title).concat([s.title]).join(' › ');
  const u = cur.usage;
  let usage = '';
  if (u && u.tokens != null) usage = u.contextWindow ? t('usage', u.tokens, Math.round((100 * u.tokens) / u.contextWindow)) : t('context', u.tokens);
  const title = h('h2', { tabindex: '0', title: s.id, text: s.title });
  fill(V.header, title, s.ancestors ? h('span', { class: 'path', text: path }) : null, ...badges(s),
    h('span', { class: 'usage', text: usage }),
    h('button', { id: 'rename', text: t('rename'), onclick: async () => {
      const title = prompt(t('rename'), s.title);
      if (title && title.trim() && title.trim() !== s.title) await call('session/rename', { sessionId: cur.id, title: title.trim() });
    } }),
    s.running && h('button', { class: 'danger', id: 'abort', text: t('abort'), onclick: () => call('turn/abort', { sessionId: cur.id }) }),
    S.features.compress && h('button', { text: t('compress'), onclick: () => call('session/compress', { sessionId: cur.id }) }),
    s.background > 0 && h('button', { text: t('stopAll'), onclick: () => call('background/stopAll', { sessionId: cur.id }) }));
  renderPlan();
  renderQueue();
  V.timeline.classList.toggle('running', !!s.running);  // the rewind buttons hide while a turn runs
}

export function renderPlan() {
  const plan = S.cur.plan;
  if (!plan || !plan.entries.length) { V.plan.replaceChildren(); V.plan.hidden = true; return; }
  V.plan.hidden = false;
  V.plan.replaceChildren(h('strong', { text: t('plan') }), ' ',
    h('button', { text: t('clearPlan'), onclick: () => call('plan/clear', { sessionId: S.cur.id }) }),
    h('ol', {}, plan.entries.map((e) => h('li', { class: e.status === 'completed' ? 'done' : null, text: e.content || e.text || JSON.stringify(e) }))));
}

export function renderQueue() {
  const q = S.cur.queue;
  V.queue.textContent = q && q.entries.length ? t('queue', q.entries.map((e) => e.text || '').join(' · ')) : '';
}

export function renderTimeline() {
  const cur = S.cur;
  performance.mark('sl-render-start');
  const frag = document.createDocumentFragment();
  if (cur.before) frag.append(h('button', { class: 'older', id: 'older', text: t('older'), onclick: loadOlder }));
  cur.nodes.clear();
  // in chunks of CHUNK items, each skipped by the browser while off screen (content-visibility):
  // a frame of a long session then lays out and paints a few chunks, not every item
  let chunk = null;
  cur.order.forEach((id, i) => {
    if (i % CHUNK === 0) frag.append((chunk = h('div', { class: 'chunk' })));
    const node = itemNode(cur.items.get(id));
    cur.nodes.set(id, node);
    chunk.append(node);
  });
  V.timeline.replaceChildren(frag);
  V.timeline.scrollTop = V.timeline.scrollHeight;
  performance.mark('sl-render-end');
  const m = performance.measure('sl-render', 'sl-render-start', 'sl-render-end');
  S.perf.renders.push({ items: cur.order.length, ms: m.duration });
}

async function loadOlder() {
  const cur = S.cur;
  const page = await call('session/history', { sessionId: cur.id, before: cur.before, limit: HISTORY_PAGE });
  if (S.cur !== cur) return;
  for (const item of page.items.slice().reverse()) place(cur, item, true);
  cur.before = page.before || null;
  const keep = V.timeline.scrollHeight - V.timeline.scrollTop;
  renderTimeline();
  V.timeline.scrollTop = V.timeline.scrollHeight - keep;
}

export function onItem(method, p) {
  const cur = S.cur;
  if (!cur || cur.id !== p.sessionId) return;
  if (p.epoch !== cur.epoch) { resubscribe(cur); return; }
  if (p.seq <= cur.seq) return;
  cur.seq = p.seq;
  if (method === 'item/delta') {
    S.perf.deltas++;
    const item = cur.items.get(p.itemId);
    if (!item) return;
    if (item.kind === 'tool-call') item.output = (item.output || '') + p.text; else item.text = (item.text || '') + p.text;
    const node = cur.nodes.get(p.itemId);
    if (node && node._text) {
      const text = node._text.lastChild;
      if (text && text.nodeType === Node.TEXT_NODE) text.appendData(p.text); else node._text.append(p.text);
    }
    stickToBottom();
    return;
  }
  if (p.item.kind === 'turn' && p.item.outcome && cur.items.has(p.item.itemId)) {
    // a turn's line closes it: after the turn's last item, where the history puts it too
    cur.order.splice(cur.order.indexOf(p.item.itemId), 1);
    cur.items.delete(p.item.itemId);
    const stale = cur.nodes.get(p.item.itemId);
    if (stale) stale.remove();
    cur.nodes.delete(p.item.itemId);
  }
  const what = place(cur, p.item, false);
  if (what === 'plan') { renderPlan(); return; }
  if (what === 'usage') { renderHeader(); return; }
  if (what === 'queue') { renderQueue(); return; }
  const node = itemNode(p.item);
  const old = cur.nodes.get(p.item.itemId);
  cur.nodes.set(p.item.itemId, node);
  if (old) old.replaceWith(node); else V.timeline.append(node);
  if (p.item.kind === 'turn' && p.item.outcome) S.rpc.call('session/markSeen', { sessionId: cur.id }).catch(() => {});
  stickToBottom();
}

// Follow the stream when the reader is at the bottom; once a frame, however many pushes came in it.
let stick = null;
let atBottom = true;
function stickToBottom() {
  if (stick !== null) return;
  stick = requestAnimationFrame(() => {
    stick = null;
    const tl = V.timeline;
    if (atBottom) tl.scrollTop = tl.scrollHeight;
  });
}

// --- items -------------------------------------------------------------------------------------------------

function attachmentList(sessionId, atts) {
  return (atts || []).map((a) => (a.src && /^[A-Za-z0-9_-]+\.?[A-Za-z0-9_-]*$/.test(a.src)
    ? h('a', { class: 'att', href: `/api/session-file?sessionId=${encodeURIComponent(sessionId)}&handle=${encodeURIComponent(a.src)}`, text: a.name })
    : h('span', { class: 'att', text: a.name })));
}

function itemNode(item) {
  const sid = S.cur.id;
  const wrap = h('div', { class: 'item ' + item.kind, 'data-item': item.itemId, 'data-kind': item.kind });
  if (item.kind === 'user-message' || item.kind === 'agent-message') {
    const text = h('span', { text: item.text });
    wrap.append(h('div', { class: 'msg ' + (item.kind === 'user-message' ? 'user' : 'agent') },
      item.speaker && item.speaker.nickname ? h('strong', { text: item.speaker.nickname + ': ' }) : null, text,
      attachmentList(sid, item.attachments)));
    wrap._text = text;
  } else if (item.kind === 'reasoning') {
    const text = h('pre', { text: item.text });
    wrap.append(h('details', { class: 'reasoning' }, h('summary', { text: t('reasoning') }), text));
    wrap._text = text;
  } else if (item.kind === 'tool-call') {
    wrap.append(toolCard(item, wrap));
  } else if (item.kind === 'notice') {
    wrap.append(h('div', { class: 'notice' }, h('strong', { text: `[${item.topic}] ` }), item.text,
      item.canContinue && h('button', { text: t('continue'), onclick: () => call('turn/continue', { sessionId: sid }) }),
      attachmentList(sid, item.attachments)));
  } else if (item.kind === 'turn') {
    wrap.append(turnLine(item));
  }
  return wrap;
}

function toolCard(item, wrap) {
  const d = item.display;
  const out = h('pre', { class: 'out', text: item.output || '' });
  wrap._text = out;
  let shown = null;
  if (d && d.kind === 'command') {
    shown = h('pre', { text: `${d.cwd ? d.cwd + ' ' : ''}$ ${d.command}${d.exitCode != null ? '\n' + t('exitCode', d.exitCode) : ''}` });
  } else if (d && d.kind === 'file-change') {
    shown = h('pre', { class: 'diff' }, d.path + '\n',
      (d.removed || '').split('\n').filter(Boolean).map((l) => h('span', { class: 'del', text: '- ' + l + '\n' })),
      (d.added || '').split('\n').filter(Boolean).map((l) => h('span', { class: 'add', text: '+ ' + l + '\n' })));
  }
  const st = item.settlement;
  return h('div', { class: 'tool' },
    h('div', { class: 'head' }, h('strong', { text: item.tool }), h('span', { class: 'st-' + item.status, text: item.status }),
      item.durationMs != null ? h('span', { text: `${item.durationMs} ms` }) : null,
      item.notExecuted ? h('span', { text: t('notExecuted') }) : null,
      item.taskId ? h('span', { text: t('backgroundTask', item.taskId) }) : null,
      st ? h('span', { text: t('settled', st.state, st.source) }) : null),
    shown,
    !shown && item.args !== undefined && item.args !== null ? h('details', {}, h('summary', { text: 'args' }), h('pre', { text: JSON.stringify(item.args, null, 2) })) : null,
    out,
    item.reason ? h('div', { class: 'st-failed', text: item.reason }) : null);
}

function turnLine(item) {
  if (!item.outcome) return h('div', { class: 'turn', text: t('turnRunning') });
  const label = { replied: t('replied'), silent: t('silent'), aborted: t('aborted'), error: t('failed') }[item.outcome];
  const sid = S.cur.id;
  const rewind = (scope) => async () => {
    const r = await call('turn/rewind', { sessionId: sid, turnId: item.turnId, scope });
    status(t('rewound', r.restored.length, r.removed.length));
  };
  return h('div', { class: 'turn' }, h('span', { class: item.outcome === 'error' ? 'error' : null, text: label }),
    item.reason ? h('span', { class: 'error', text: item.reason }) : null,
    S.features.rewind && item.turnId && h('button', { class: 'rewind rewind-code', text: t('rewindCode'), onclick: rewind('code') }),
    S.features.rewind && item.turnId && h('button', { class: 'rewind rewind-all', text: t('rewindAll'), onclick: rewind('code-and-chat') }));
}

// --- the input --------------------------------------------------------------------------------------------

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

async function addFiles(files) {
  for (const f of files) S.files.push({ name: f.name || 'pasted', data: await readAsDataUrl(f) });
  renderFiles();
}

function onPaste(ev) {
  const files = [...(ev.clipboardData ? ev.clipboardData.files : [])];
  if (files.length) { ev.preventDefault(); addFiles(files); }
}

function renderFiles() {
  V.files.replaceChildren(...S.files.map((f, i) => h('span', {}, f.name, ' ',
    h('button', { 'aria-label': `✕ ${f.name}`, text: '✕', onclick: () => { S.files.splice(i, 1); renderFiles(); } }), ' ')));
}

async function sendInput() {
  const content = V.input.value.trim();
  if (!content && !S.files.length) return;
  const params = { sessionId: S.cur.id, content };
  if (S.files.length) params.attachments = S.files.map((f) => ({ name: f.name, data: f.data }));
  await call('turn/send', params);
  V.input.value = '';
  S.files = [];
  renderFiles();
}
