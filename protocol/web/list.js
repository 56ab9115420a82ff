// The owner's web page: the sessions list: sections, groups, search, archived, the actions.
import { h } from './dom.js';
import { openSession } from './session.js';
import { S, V, call } from './state.js';
import { t } from './texts.js';

// --- the sessions list ---------------------------------------------------------------------------------

export async function loadSessions() {
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
export function scheduleList() {
  if (listFrame === null) listFrame = requestAnimationFrame(() => { listFrame = null; renderList(); });
}

export function renderList() {
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

export function badges(s) {
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

export async function newSession() {
  const { session } = await call('session/create', {});
  S.sessions.set(session.id, session);
  renderList();
  openSession(session.id);
}
