// The owner's web page: DOM helpers and the JSON-RPC connection. Every text from the server is put in the DOM as text
// (textContent), never as HTML.
export function fill(el, ...kids) {
  el.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false && k !== 0 && k !== ''));
  return el;
}

export function h(tag, attrs, ...kids) {
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
export function sanitize(s) {
  return String(s).replace(HIDDEN, (c) => '\\u{' + c.codePointAt(0).toString(16) + '}');
}

export function status(text) {
  const el = document.getElementById('status');
  el.textContent = text || '';
  if (text) setTimeout(() => { if (el.textContent === text) el.textContent = ''; }, 6000);
}

// --- the connection --------------------------------------------------------------------------------

export class Rpc {
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
    this.ws.onclose = (ev) => {
      for (const [, reject] of this.waiting.values()) reject(new Error('disconnected'));
      this.waiting.clear();
      onClose(ev.code);
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
