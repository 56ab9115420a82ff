// The owner's web page: a client of the session protocol over /session (surface webui), no build
// step, no library. This module starts it: the login, the connection, presence, the layout, the pushes.
import { renderApprovals, loadTasks, renderTasks } from './cards.js';
import { Rpc, h, status } from './dom.js';
import { loadSessions, newSession, scheduleList } from './list.js';
import { closeSession, onItem, openSession, renderHeader, resubscribe } from './session.js';
import { CLOSE_LOGGED_OUT, IDLE_MS, PRESENCE_EVERY_MS, PROTOCOL_VERSION, RECONNECT_MS, S, V } from './state.js';
import { setLanguage, t } from './texts.js';

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

// Also after a dropped connection (a restart, a worker gone): the cookie is the login, so a server
// that verifies it again is reconnected to without asking; one that does not shows the login.
async function start() {
  let info;
  try {
    info = await (await fetch('/api/web', { cache: 'no-store' })).json();
  } catch {
    status(t('disconnected'));
    setTimeout(start, RECONNECT_MS);
    return;
  }
  setLanguage(info.language);
  document.documentElement.lang = info.language === 'zh' ? 'zh' : 'en';
  if (info.authenticated) connect(); else loggedOut();
}

function loggedOut() {
  if (S.rpc) { S.rpc.close(); S.rpc = null; }
  S.cur = null;
  showLogin();
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
  loggedOut();
}

async function connect() {
  const rpc = new Rpc(onPush, (code) => {
    if (S.rpc !== rpc) return;
    S.rpc = null;
    if (code === CLOSE_LOGGED_OUT) { loggedOut(); return; }  // logged out on another page, or expired
    status(t('disconnected'));
    setTimeout(start, RECONNECT_MS);
  });
  S.rpc = rpc;
  try { await rpc.opened; } catch { return; }
  const init = await rpc.call('initialize', { protocolVersion: PROTOCOL_VERSION, client: { name: 'sessionloop-web', version: '1' } });
  S.appName = init.appName;
  S.features = init.features;
  document.title = init.appName;
  presence.sent = null;
  activity();
  const again = !!(V.main && V.main.isConnected);  // a reconnect keeps the page as it is
  if (!again) layout();
  S.approvals.clear();  // the snapshot and the pushes say again which are pending
  await Promise.all([loadSessions(), rpc.call('sessions/watch', {}), loadTasks(), rpc.call('background/watch', {})]);
  const wanted = S.cur ? S.cur.id : location.hash.slice(1);
  if (!again) S.cur = null;
  // a fresh snapshot (the server's epoch is new after a restart): the timeline is rebuilt from it,
  // then pushes above its seq extend it; the draft and the attachments picked stay
  if (wanted) openSession(wanted, again); else renderApprovals();
  status('');
}

// --- layout ------------------------------------------------------------------------------------------

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
      if (S.cur && S.cur.id === p.sessionId) resubscribe(S.cur);
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
    case 'session/config/changed':
      if (V.settings && V.settings.isConnected) V.settings.refresh();
      break;
    case 'features/changed':
      S.features = p.features;
      break;
    default:
      break;
  }
}

start();
