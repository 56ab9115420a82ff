// The owner's web page: a client of the session protocol over /session (surface webui), no build
// step, no library. Every text from the server is put in the DOM as text (textContent), never as HTML.
'use strict';

const PROTOCOL_VERSION = '0.2.1';
const PRESENCE_EVERY_MS = 60000;
const IDLE_MS = 10 * 60000;
const HISTORY_PAGE = 100;
const CHUNK = 50;

const TEXTS = {
  en: {
    login: 'Log in', token: 'Owner token', tokenHint: 'The owner token: DATA/token, or the link sessionloop serve printed.',
    wrongToken: 'That token was not accepted.', logout: 'Log out', newSession: 'New session', search: 'Search sessions',
    mine: 'Mine', rooms: 'Rooms', archived: 'Archived', showArchived: 'Archived', showActive: 'Active',
    running: 'running', error: 'error', attention: 'needs you', unread: 'unread', background: 'background {0}',
    tokens: '{0} tokens', children: '{0} child sessions', archive: 'Archive', unarchive: 'Unarchive', delete: 'Delete',
    confirmDelete: 'Delete "{0}" and every session below it?', noSessions: 'No sessions', pick: 'Pick a session or make a new one.',
    send: 'Send', attach: 'Attach', abort: 'Stop', compress: 'Compress', clearPlan: 'Clear plan', stopAll: 'Stop all background',
    input: 'Message', older: 'Older messages', reasoning: 'Reasoning', rewindCode: 'Rewind code', rewindAll: 'Rewind code and chat',
    continue: 'Continue', approve: 'Approve', deny: 'Deny', note: 'Note (sent to the model when you deny)',
    expiresIn: 'expires in {0} s', approvalFor: 'Approval: {0}', inSession: 'in {0}', tasks: 'Background tasks',
    stop: 'Stop', output: 'Output', exitCode: 'exit {0}', queue: 'Waiting: {0}', disconnected: 'Disconnected: reconnecting…',
    turnRunning: 'turn running', replied: 'replied', silent: 'silent', aborted: 'aborted', failed: 'failed',
    plan: 'Plan', usage: 'context {0} tokens ({1}%)', context: 'context {0} tokens', rename: 'Rename',
    grant: 'Answer later calls of this tool the same way', grantNone: 'only this call', grantTurn: 'for the rest of this turn',
    grantSession: 'for this session (24 h)', backgroundTask: 'background task {0}', notExecuted: 'not executed',
    settled: '{0} ({1})', attachments: '{0} attachment(s)', children_: 'Child sessions', rewound: 'Rewound: {0} restored, {1} removed',
    speaker: '{0}',
  },
  zh: {
    login: '登录', token: 'owner 令牌', tokenHint: 'owner 令牌:DATA/token,或 sessionloop serve 打印的链接。',
    wrongToken: '令牌不对。', logout: '退出', newSession: '新会话', search: '搜索会话',
    mine: '我的', rooms: '房间', archived: '已归档', showArchived: '已归档', showActive: '未归档',
    running: '运行中', error: '出错', attention: '需要我处理', unread: '未读', background: '后台 {0}',
    tokens: '{0} token', children: '{0} 个子会话', archive: '归档', unarchive: '取消归档', delete: '删除',
    confirmDelete: '删除「{0}」及其下所有会话?', noSessions: '没有会话', pick: '选一个会话,或新建一个。',
    send: '发送', attach: '附件', abort: '停止', compress: '压缩', clearPlan: '清空计划', stopAll: '停止全部后台工作',
    input: '消息', older: '更早的消息', reasoning: '思考', rewindCode: '回滚代码', rewindAll: '回滚代码与对话',
    continue: '继续', approve: '批准', deny: '拒绝', note: '说明(拒绝时回给模型)',
    expiresIn: '{0} 秒后到期', approvalFor: '审批:{0}', inSession: '在 {0}', tasks: '后台任务',
    stop: '停止', output: '输出', exitCode: '退出码 {0}', queue: '排队中:{0}', disconnected: '连接断开,正在重连…',
    turnRunning: '回合进行中', replied: '已回复', silent: '静默', aborted: '已中止', failed: '出错',
    plan: '计划', usage: '上下文 {0} token({1}%)', context: '上下文 {0} token', rename: '改名',
    grant: '之后同一工具的调用按同样处理', grantNone: '只这一次', grantTurn: '本回合余下的调用',
    grantSession: '本会话(24 小时)', backgroundTask: '后台任务 {0}', notExecuted: '没有执行',
    settled: '{0}({1})', attachments: '{0} 个附件', children_: '子会话', rewound: '已回滚:恢复 {0} 个,删除 {1} 个',
    speaker: '{0}',
  },
};
let TX = TEXTS.en;
function t(key, ...args) {
  let s = TX[key] ?? TEXTS.en[key] ?? key;
  args.forEach((v, i) => { s = s.replace('{' + i + '}', String(v)); });
  return s;
}

function fill(el, ...kids) {
  el.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false && k !== 0 && k !== ''));
  return el;
}

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
}

// Control, bidi and zero-width characters shown as their code point: approval facts are verbatim.
const HIDDEN = /[\u0000-\u0008\u000B-\u001F\u007F-\u009F\u061C\u200B-\u200F\u2028-\u202E\u2060-\u2069\uFEFF]/g;
function sanitize(s) {
  return String(s).replace(HIDDEN, (c) => '\\u{' + c.codePointAt(0).toString(16) + '}');
}

function status(text) {
  const el = document.getElementById('status');
  el.textContent = text || '';
  if (text) setTimeout(() => { if (el.textContent === text) el.textContent = ''; }, 6000);
}

// --- the connection --------------------------------------------------------------------------------

class Rpc {
  constructor(onPush, onClose) {
    this.next = 0;
    this.waiting = new Map();
    const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
    this.ws = new WebSocket(`${scheme}//${location.host}/session?surface=webui`);
    this.opened = new Promise((resolve, reject) => {
      this.ws.onopen = resolve;
      this.ws.onerror = reject;
    });
    this.ws.onmessage = (ev) => {
      const msg = JSON.parse(ev.data);
      if (msg.id !== undefined && msg.id !== null && this.waiting.has(msg.id)) {
        const [resolve, reject] = this.waiting.get(msg.id);
        this.waiting.delete(msg.id);
        if (msg.error) {
          const err = new Error(msg.error.message);
          err.code = msg.error.data && msg.error.data.code;
          reject(err);
        } else resolve(msg.result);
      } else if (msg.method) onPush(msg.method, msg.params);
    };
    this.ws.onclose = () => {
      for (const [, reject] of this.waiting.values()) reject(new Error('disconnected'));
      this.waiting.clear();
      onClose();
    };
  }
  call(method, params) {
    const id = ++this.next;
    return new Promise((resolve, reject) => {
      this.waiting.set(id, [resolve, reject]);
      this.ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params: params || {} }));
    });
  }
  close() { this.ws.onclose = null; this.ws.close(); }
}

// --- state -----------------------------------------------------------------------------------------

const S = {
  rpc: null, appName: 'sessionloop', features: {}, sessions: new Map(), groups: [], archived: false, query: '',
  matches: null, children: new Map(), approvals: new Map(), tasks: new Map(), cur: null, files: [],
};
window.__sl = S;  // the tests and the benchmark read the page's state and timings here
S.perf = { renders: [], deltas: 0 };
S.rerender = () => renderTimeline();

async function call(method, params) {
  try {
    return await S.rpc.call(method, params);
  } catch (e) {
    status(`${method}: ${e.message}`);
    throw e;
  }
}

// --- presence: visible and active, throttled; false when hidden or idle 10 minutes ------------------

const presence = { sent: null, at: 0, lastActivity: Date.now(), idle: null };
function report(active) {
  if (!S.rpc) return;
  const now = Date.now();
  if (active === presence.sent && (!active || now - presence.at < PRESENCE_EVERY_MS)) return;
  presence.sent = active;
  presence.at = now;
  S.rpc.call('presence/update', { active }).catch(() => {});
}
function activity() {
  presence.lastActivity = Date.now();
  clearTimeout(presence.idle);
  presence.idle = setTimeout(() => report(false), IDLE_MS);
  if (document.visibilityState === 'visible') report(true);
}
for (const ev of ['keydown', 'pointerdown', 'pointermove', 'wheel']) addEventListener(ev, activity, { passive: true });
document.addEventListener('visibilitychange', () => (document.visibilityState === 'visible' ? activity() : report(false)));

// --- start, login, connect -------------------------------------------------------------------------

async function start() {
  const info = await (await fetch('/api/web', { cache: 'no-store' })).json();
  TX = TEXTS[info.language] || TEXTS.en;
  document.documentElement.lang = info.language === 'zh' ? 'zh' : 'en';
  if (info.authenticated) connect(); else showLogin();
}

function showLogin(message) {
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'current-password', 'aria-describedby': 'token-hint' });
  const note = h('p', { role: 'alert', class: 'error', text: message || '' });
  const form = h('form', { class: 'login', onsubmit: async (ev) => {
    ev.preventDefault();
    const r = await fetch('/api/login', { headers: { Authorization: 'Bearer ' + input.value.trim() }, cache: 'no-store' });
    if (r.ok) connect(); else { note.textContent = t('wrongToken'); input.select(); }
  } },
  h('h1', { text: S.appName }), h('label', { for: 'token', text: t('token') }), input,
  h('small', { id: 'token-hint', text: t('tokenHint') }), h('button', { class: 'primary', type: 'submit', text: t('login') }), note);
  document.getElementById('app').replaceChildren(form);
  input.focus();
}

async function logout() {
  if (S.rpc) { S.rpc.close(); S.rpc = null; }
  await fetch('/api/logout', { cache: 'no-store' });
  S.cur = null;
  showLogin();
}

async function connect() {
  const rpc = new Rpc(onPush, () => {
    if (S.rpc !== rpc) return;
    S.rpc = null;
    status(t('disconnected'));
    setTimeout(start, 1500);
  });
  S.rpc = rpc;
  try { await rpc.opened; } catch { return; }
  const init = await rpc.call('initialize', { protocolVersion: PROTOCOL_VERSION, client: { name: 'sessionloop-web', version: '1' } });
  S.appName = init.appName;
  S.features = init.features;
  document.title = init.appName;
  presence.sent = null;
  activity();
  layout();
  await Promise.all([loadSessions(), rpc.call('sessions/watch', {}), loadTasks(), rpc.call('background/watch', {})]);
  const wanted = S.cur ? S.cur.id : location.hash.slice(1);
  S.cur = null;
  if (wanted) openSession(wanted);
}

// --- layout ------------------------------------------------------------------------------------------

const V = {};
function layout() {
  V.search = h('input', { class: 'search', type: 'search', placeholder: t('search'), 'aria-label': t('search'),
    oninput: () => { S.query = V.search.value.trim(); loadSessions(); } });
  V.archivedBtn = h('button', { 'aria-pressed': 'false', text: t('showArchived'), onclick: () => {
    S.archived = !S.archived;
    V.archivedBtn.setAttribute('aria-pressed', String(S.archived));
    V.archivedBtn.textContent = S.archived ? t('showActive') : t('showArchived');
    loadSessions();
  } });
  V.list = h('nav', { class: 'list', 'aria-label': t('mine') });
  V.main = h('main', { class: 'main' }, h('p', { class: 'empty', text: t('pick') }));
  V.approvals = h('section', { class: 'approvals', 'aria-label': t('approve') });
  const side = h('aside', { class: 'side' },
    h('header', {}, h('h1', { text: S.appName }),
      h('button', { class: 'primary', id: 'new-session', text: t('newSession'), onclick: newSession }),
      h('button', { id: 'logout', text: t('logout'), onclick: logout })),
    V.search, h('div', { style: null }, V.archivedBtn), V.list);
  document.getElementById('app').replaceChildren(h('div', { class: 'layout' }, side, V.main));
}

// --- the sessions list ---------------------------------------------------------------------------------

async function loadSessions() {
  const params = { limit: 200 };
  if (S.archived) params.archived = true;
  if (S.query) params.query = S.query;
  const page = await call('sessions/list', params);
  if (S.query || S.archived) S.matches = new Set(page.sessions.map((s) => s.id)); else S.matches = null;
  for (const s of page.sessions) S.sessions.set(s.id, s);
  S.groups = page.groups;
  renderList();
}

function visible(s) {
  if (s.parentId) return false;
  if (S.matches) return S.matches.has(s.id) && !!s.archived === S.archived;
  return !s.archived;
}

function ownerOrder(a, b) {
  for (const k of ['attention', 'error', 'unread', 'running']) if (a[k] !== b[k]) return a[k] ? -1 : 1;
  return b.updatedAt - a.updatedAt;
}

let listFrame = null;
function scheduleList() {
  if (listFrame === null) listFrame = requestAnimationFrame(() => { listFrame = null; renderList(); });
}

function renderList() {
  if (!V.list) return;
  const shown = [...S.sessions.values()].filter(visible);
  const mine = shown.filter((s) => s.section !== 'rooms').sort(ownerOrder);
  const rooms = shown.filter((s) => s.section === 'rooms').sort((a, b) => b.updatedAt - a.updatedAt);
  const kids = [];
  if (!shown.length) kids.push(h('p', { class: 'empty', text: t('noSessions') }));
  if (mine.length) kids.push(h('h2', { text: S.archived ? t('archived') : t('mine') }), h('ul', {}, mine.map(row)));
  if (rooms.length) {
    kids.push(h('h2', { text: t('rooms') }));
    for (const g of S.groups) {
      const inGroup = rooms.filter((s) => s.platform === g.platform && (s.instance || null) === (g.instance || null));
      if (!inGroup.length) continue;
      kids.push(h('h3', { text: g.attention ? `${g.label} · ${t('attention')} ${g.attention}` : g.label }), h('ul', {}, inGroup.map(row)));
    }
    const grouped = new Set(S.groups.map((g) => g.platform + '/' + (g.instance || '')));
    const rest = rooms.filter((s) => !grouped.has(s.platform + '/' + (s.instance || '')));
    if (rest.length) kids.push(h('ul', {}, rest.map(row)));
  }
  V.list.replaceChildren(...kids);
}

function badges(s) {
  return [
    s.running && h('span', { class: 'badge running', text: t('running') }),
    s.error && h('span', { class: 'badge error', title: s.reason || '', text: s.reason ? `${t('error')}: ${s.reason}` : t('error') }),
    s.attention && h('span', { class: 'badge attention', text: t('attention') }),
    s.unread && h('span', { class: 'badge unread', text: t('unread') }),
    s.background > 0 && h('span', { class: 'badge', text: t('background', s.background) }),
    s.tokens && h('span', { text: t('tokens', s.tokens.input + s.tokens.output) }),
  ];
}

function row(s) {
  const act = (label, fn, cls) => h('button', { class: cls, text: label, onclick: (ev) => { ev.stopPropagation(); fn(); } });
  const childList = S.children.get(s.id);
  return h('li', { class: 'row', tabindex: '0', 'data-id': s.id, 'aria-current': S.cur && S.cur.id === s.id ? 'true' : null,
    onclick: () => openSession(s.id), onkeydown: (ev) => { if (ev.key === 'Enter' && ev.target === ev.currentTarget) openSession(s.id); } },
  h('div', { class: 'title', text: s.title }),
  h('div', { class: 'meta' }, badges(s),
    s.childCount > 0 && act(t('children', s.childCount), () => toggleChildren(s.id))),
  h('div', { class: 'acts' },
    s.archived ? act(t('unarchive'), () => call('session/unarchive', { sessionId: s.id }).then(loadSessions))
      : act(t('archive'), () => call('session/archive', { sessionId: s.id }).then(loadSessions)),
    act(t('delete'), () => { if (confirm(t('confirmDelete', s.title))) call('session/delete', { sessionId: s.id }); }, 'danger')),
  childList && h('ul', { 'aria-label': t('children_') }, childList.map((id) => S.sessions.get(id)).filter(Boolean).map(row)));
}

async function toggleChildren(id) {
  if (S.children.has(id)) { S.children.delete(id); renderList(); return; }
  const page = await call('sessions/list', { parentId: id, limit: 200 });
  for (const s of page.sessions) S.sessions.set(s.id, s);
  S.children.set(id, page.sessions.map((s) => s.id));
  renderList();
}

async function newSession() {
  const { session } = await call('session/create', {});
  S.sessions.set(session.id, session);
  renderList();
  openSession(session.id);
}

// --- pushes ----------------------------------------------------------------------------------------------

function onPush(method, p) {
  switch (method) {
    case 'sessions/changed':
      for (const s of p.upserts) S.sessions.set(s.id, s);
      for (const id of p.removes) { S.sessions.delete(id); if (S.cur && S.cur.id === id) closeSession(); }
      S.groups = p.groups;
      scheduleList();
      if (S.cur && p.upserts.some((s) => s.id === S.cur.id)) renderHeader();
      break;
    case 'item/started': case 'item/completed': case 'item/delta':
      onItem(method, p);
      break;
    case 'session/resync':
      if (S.cur && S.cur.id === p.sessionId) openSession(p.sessionId, true);
      break;
    case 'approval/requested':
      S.approvals.set(p.approval.id, p.approval);
      renderApprovals();
      break;
    case 'approval/settled':
      S.approvals.delete(p.approvalId);
      renderApprovals();
      break;
    case 'background/changed':
      for (const task of p.upserts) S.tasks.set(task.id, task);
      for (const id of p.removes) S.tasks.delete(id);
      renderTasks();
      break;
    case 'features/changed':
      S.features = p.features;
      break;
    default:
      break;
  }
}

// --- a session -----------------------------------------------------------------------------------------

function closeSession() {
  S.cur = null;
  location.hash = '';
  V.main.replaceChildren(h('p', { class: 'empty', text: t('pick') }));
}

async function openSession(id, again) {
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
  if (!again || previous !== id) S.files = [];
  buildSession();
  renderList();
  S.rpc.call('session/markSeen', { sessionId: id }).catch(() => {});
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
  V.main.replaceChildren(V.header, V.plan, V.approvals, V.timeline, V.tasks, V.queue, V.files, composer);
  renderHeader();
  renderTimeline();
  renderApprovals();
  renderTasks();
  renderFiles();
  V.input.focus();
}

function renderHeader() {
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

function renderPlan() {
  const plan = S.cur.plan;
  if (!plan || !plan.entries.length) { V.plan.replaceChildren(); V.plan.hidden = true; return; }
  V.plan.hidden = false;
  V.plan.replaceChildren(h('strong', { text: t('plan') }), ' ',
    h('button', { text: t('clearPlan'), onclick: () => call('plan/clear', { sessionId: S.cur.id }) }),
    h('ol', {}, plan.entries.map((e) => h('li', { class: e.status === 'completed' ? 'done' : null, text: e.content || e.text || JSON.stringify(e) }))));
}

function renderQueue() {
  const q = S.cur.queue;
  V.queue.textContent = q && q.entries.length ? t('queue', q.entries.map((e) => e.text || '').join(' · ')) : '';
}

function renderTimeline() {
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

function onItem(method, p) {
  const cur = S.cur;
  if (!cur || cur.id !== p.sessionId) return;
  if (p.epoch !== cur.epoch) { openSession(cur.id, true); return; }
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

// --- approvals ---------------------------------------------------------------------------------------------

let countdown = null;
function renderApprovals() {
  if (!V.approvals) return;
  const pending = [...S.approvals.values()].filter((a) => a.state === 'pending');
  V.approvals.replaceChildren(...pending.map(approvalCard));
  clearInterval(countdown);
  if (pending.length) countdown = setInterval(tick, 1000);
  tick();
  if (V.main && !V.main.contains(V.approvals)) V.main.prepend(V.approvals);
}

function tick() {
  for (const el of document.querySelectorAll('[data-expires]')) {
    const left = Math.max(0, Math.round((Number(el.dataset.expires) - Date.now()) / 1000));
    el.textContent = t('expiresIn', left);
  }
}

function approvalCard(a) {
  const f = a.facts || {};
  const note = h('input', { type: 'text', 'aria-label': t('note'), placeholder: t('note'), maxlength: '100000' });
  const session = S.sessions.get(a.sessionId);
  const grant = h('select', { 'aria-label': t('grant'), title: t('grant'), class: 'grant' },
    h('option', { value: '', text: t('grantNone') }), h('option', { value: 'turn', text: t('grantTurn') }),
    h('option', { value: 'session', text: t('grantSession') }));
  const answer = (decision) => async () => {
    const params = { approvalId: a.id, decision, contentHash: a.contentHash, note: note.value || null };
    if (grant.value) params.grant = { scope: grant.value };
    await call('approval/respond', params);
    S.approvals.delete(a.id);
    renderApprovals();
  };
  const facts = [];
  if (f.command) facts.push(h('pre', { text: `${f.cwd ? sanitize(f.cwd) + ' ' : ''}$ ${sanitize(f.command)}` }));
  if (f.diff) facts.push(h('pre', { text: `${sanitize(f.diff.path)}\n${sanitize(f.diff.patch)}` }));
  if (!f.command && !f.diff) facts.push(h('pre', { text: sanitize(JSON.stringify(f.params, null, 2)) }));
  if (f.sandbox) facts.push(h('small', { text: 'sandbox: ' + sanitize(f.sandbox) }));
  const chain = (a.chain || []).map((c) => c.title).join(' › ');
  return h('div', { class: 'approval', role: 'group', 'aria-label': t('approvalFor', a.tool), 'data-approval': a.id },
    h('strong', { text: t('approvalFor', a.tool) }), ' ',
    h('span', { text: t('inSession', sanitize(chain || (session ? session.title : a.sessionId))) }), ' ',
    h('span', { 'data-expires': a.expiresAt }),
    h('div', { class: 'facts' }, facts),
    h('div', { class: 'acts' }, note, grant,
      a.options.includes('approve') && h('button', { class: 'primary approve', text: t('approve'), onclick: answer('approve') }),
      a.options.includes('deny') && h('button', { class: 'danger deny', text: t('deny'), onclick: answer('deny') })));
}

// --- background tasks ----------------------------------------------------------------------------------------

async function loadTasks() {
  const { tasks } = await call('background/list', {});
  S.tasks = new Map(tasks.map((task) => [task.id, task]));
  renderTasks();
}

function renderTasks() {
  if (!V.tasks || !S.cur) return;
  const mine = [...S.tasks.values()].filter((task) => task.sessionId === S.cur.id)
    .sort((a, b) => (a.status === 'running') - (b.status === 'running') || b.startedAt - a.startedAt).reverse();
  V.tasks.hidden = !mine.length;
  V.tasks.replaceChildren(h('strong', { text: t('tasks') }), h('ul', {}, mine.map((task) => {
    const out = h('pre', { class: 'tail' });
    return h('li', { 'data-task': task.id },
      h('span', { text: task.label }), h('span', { class: 'badge ' + (task.status === 'running' ? 'running' : ''), text: task.status }),
      task.display && task.display.command ? h('code', { text: task.display.command }) : null,
      task.exitCode != null ? h('span', { text: t('exitCode', task.exitCode) }) : null,
      task.lastLine ? h('span', { class: 'last', text: task.lastLine }) : null,
      task.reason ? h('span', { class: 'st-failed', text: task.reason }) : null,
      h('button', { text: t('output'), onclick: async () => { const r = await call('background/output', { taskId: task.id }); out.textContent = r.text; } }),
      task.status === 'running' && h('button', { class: 'danger stop-task', text: t('stop'), onclick: () => call('background/stop', { taskId: task.id }) }),
      out);
  })));
}

start();
