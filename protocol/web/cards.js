// The owner's web page: approval cards (sanitized facts, the time left, a note, a grant) and background tasks.
import { h, sanitize } from './dom.js';
import { S, V, call } from './state.js';
import { t } from './texts.js';

// --- approvals ---------------------------------------------------------------------------------------------

let countdown = null;
export function renderApprovals() {
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

export async function loadTasks() {
  const { tasks } = await call('background/list', {});
  S.tasks = new Map(tasks.map((task) => [task.id, task]));
  renderTasks();
}

export function renderTasks() {
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
