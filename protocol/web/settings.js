// The owner's web page: a session's settings with their layers. Each row shows the effective value
// and the layer it comes from (session/config/get); the owner writes a value on this session or on
// one of the layers (session/config/update, session/config/layer/update) and the server's refusal
// is shown on the row, as the server words it.
import { h, status } from './dom.js';
import { S } from './state.js';
import { t } from './texts.js';

const SHOWN = 160;  // characters of a long value shown (the whole in its tooltip)

function shown(v) {
  const s = typeof v === 'string' ? v : JSON.stringify(v);
  return s.length > SHOWN ? s.slice(0, SHOWN) + '…' : s;
}

function layerLabel(layers, info) {
  const l = info.layer;
  const name = (layers.order.find((o) => o.name === l.scope) || { label: l.scope }).label;
  const detail = info.label || [l.platform, l.type, l.key].filter(Boolean).join(' / ');
  return detail ? `${name}: ${detail}` : name;
}

export function settingsPanel(sid) {
  const rows = h('div', { class: 'rows' });
  // another layer: its rows replace these, which must not take a write meanwhile
  const target = h('select', { class: 'target', 'aria-label': t('writeTo'),
    onchange: () => { rows.replaceChildren(); rendered = ''; refresh(); } });
  const panel = h('details', { class: 'settings', ontoggle: () => refresh() },
    h('summary', { text: t('settings') }), h('label', {}, t('writeTo') + ' ', target), rows);
  let layers = null;
  let targets = [];
  let shownFor = null;
  let rendered = '';
  let models = null;
  let generation = 0;
  const refused = new Map();  // 'plugin/key' -> { value, message }: kept in view across re-renders until a write succeeds
  const refresh = () => { if (panel.open) load().catch((e) => status(`${t('settings')}: ${e.message}`)); };

  async function load() {
    const mine = ++generation;
    if (!layers) {
      layers = await S.rpc.call('session/config/layers', {});
    }
    const got = await S.rpc.call('session/config/get', { sessionId: sid });
    if (!targets.length) {
      // this session, then the layers that can hold its values: global, its platform's, the places
      const fits = layers.layers.filter((i) => i.layer.scope === 'global' || i.layer.scope === 'place'
        || i.layer.platform === got.platform);
      targets = [null, ...fits.map((i) => i.layer)];
      const own = (layers.order.find((o) => o.name === 'session') || { label: 'session' }).label;
      target.replaceChildren(h('option', { value: '0', text: own }),
        ...fits.map((i, n) => h('option', { value: String(n + 1), text: layerLabel(layers, i) })));
    }
    const layer = targets[Number(target.value) || 0];
    if (layer !== shownFor) refused.clear();  // another layer: the refusals were about writes to the one before
    shownFor = layer;
    const here = layer ? (await S.rpc.call('session/config/layer/get', { layer })).items : got.items;
    if (!models && got.items.some((r) => r.field.type === 'llm-ref')) {
      const r = await fetch('/api/models/llm', { cache: 'no-store' });
      models = r.ok ? (await r.json()).options : [];
    }
    if (mine !== generation) return;  // a later load is under way
    const same = (a) => (b) => a.plugin === b.plugin && a.key === b.key;
    // a layer may hold fields this session's own layer cannot (a place-wide one): shown as the layer resolves them
    const list = got.items.concat(layer ? here.filter((x) => !got.items.some(same(x))) : []);
    // the same answer again (a change pushed after this page's own write) leaves the rows, and what is typed, alone
    const seen = JSON.stringify([list, here]);  // a refusal is shown in place: no re-render for it
    if (seen === rendered) return;
    rendered = seen;
    rows.replaceChildren(...list.map((r) => row(r, here.find(same(r)), layer)));
  }

  function row(r, at, layer) {
    const f = r.field;
    const name = `${r.plugin}/${r.key}`;
    const set = at && at.value !== undefined ? at.value : undefined;
    const tried = refused.get(name);
    const alert = h('p', { role: 'alert', class: 'error', text: tried ? tried.message : '' });
    const write = async (value) => {
      alert.textContent = '';
      refused.delete(name);
      try {
        if (layer) await S.rpc.call('session/config/layer/update', { layer, plugin: r.plugin, key: r.key, value });
        else await S.rpc.call('session/config/update', { sessionId: sid, plugin: r.plugin, key: r.key, value });
      } catch (e) {
        refused.set(name, { value, message: e.message });
        alert.textContent = e.message;  // the server's refusal, as it words it
        return;
      }
      refresh();
    };
    let now = '—';
    if (r.effective !== undefined && r.effective !== null) now = shown(r.effective);
    else if (r.actual) now = r.actual.label || shown(r.actual.value);
    let source = t('notSet');
    if (r.source === 'default') source = t('fromDefault');
    else if (r.source) source = t('from', (layers.order.find((o) => o.name === r.source) || { label: r.source }).label);
    const label = `${f.title || r.key} (${r.plugin}/${r.key})`;
    return h('div', { class: 'setting ' + r.prominence, 'data-setting': name },
      h('div', { class: 'name', title: f.description || '', text: f.title || r.key }),
      control(f, tried ? tried.value : set, now, label, write),
      set !== undefined ? h('button', { class: 'reset', text: t('reset'), onclick: () => write(null) }) : h('span', {}),
      h('div', { class: 'now' }, h('span', { class: 'effective', title: now, text: now }), ' ', h('span', { class: 'source', text: source })),
      alert);
  }

  function control(f, set, now, label, write) {
    const choices = (values) => {
      const sel = h('select', { 'aria-label': label, onchange: () => write(sel.value === '' ? null : JSON.parse(sel.value)) },
        h('option', { value: '', text: t('inherit') }),
        values.map(([v, text]) => h('option', { value: JSON.stringify(v), text })));
      sel.value = set === undefined ? '' : JSON.stringify(set);
      return sel;
    };
    if (f.type === 'enum') return choices((f.options || []).map((o) => [o, String(o)]));
    if (f.type === 'boolean') return choices([[true, 'true'], [false, 'false']]);
    if (f.type === 'llm-ref') {
      const opts = (models || []).map((m) => [m.id, m.label || m.id]);
      if (set !== undefined && !opts.some(([v]) => v === set)) opts.push([set, String(set)]);
      return choices(opts);
    }
    if (f.type === 'integer' || f.type === 'number') {
      const input = h('input', { type: 'number', 'aria-label': label, placeholder: now, min: f.minimum, max: f.maximum,
        step: f.type === 'integer' ? '1' : 'any', onchange: () => write(input.value === '' ? null : Number(input.value)) });
      input.value = set === undefined ? '' : String(set);
      return input;
    }
    const text = h('textarea', { 'aria-label': label, placeholder: now, rows: '2', maxlength: f.maxLength });
    text.value = set === undefined ? '' : (typeof set === 'string' ? set : JSON.stringify(set));
    return h('span', { class: 'text' }, text, h('button', { class: 'save', text: t('save'), onclick: () => write(text.value) }));
  }

  panel.refresh = refresh;  // session/config/changed
  return panel;
}
