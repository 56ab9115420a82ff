// The owner's web page: its state, shared by its parts (window.__sl for the tests and the benchmark).
import { status } from './dom.js';

export const PROTOCOL_VERSION = '0.2.2';
export const PRESENCE_EVERY_MS = 60000;
export const IDLE_MS = 10 * 60000;
export const HISTORY_PAGE = 100;
export const CHUNK = 50;
export const RECONNECT_MS = 1500;
export const CLOSE_LOGGED_OUT = 4003;  // the server closes a connection whose login ended

// --- state -----------------------------------------------------------------------------------------

export const S = {
  rpc: null, appName: 'sessionloop', features: {}, sessions: new Map(), groups: [], archived: false, query: '',
  matches: null, children: new Map(), approvals: new Map(), tasks: new Map(), cur: null, files: [],
};
window.__sl = S;  // the tests and the benchmark read the page's state and timings here
S.perf = { renders: [], deltas: 0 };

export async function call(method, params) {
  try {
    return await S.rpc.call(method, params);
  } catch (e) {
    status(`${method}: ${e.message}`);
    throw e;
  }
}

export const V = {};  // the page's standing elements
