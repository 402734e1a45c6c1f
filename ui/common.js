// common.js — helpers shared by every module of the dashboard:
//
//   * el(): the one way this UI builds DOM. Children and the `text` option become
//     text nodes, attributes go through setAttribute, and event-handler attributes
//     and href/src are refused, so a value that came from a client or a target
//     (labels, states, reasons, error details, URLs, ids, problem details) can only
//     ever be shown as text. Nothing in the UI uses innerHTML or builds HTML strings.
//   * waitHref(): the only href built from data: "#/waits/<id>" for a valid UUID.
//   * status metadata (glyph + label per status, readable without colour).
//   * formatting of times (browser time zone), durations and JSON.
//   * applyEvent(): the pure model rule "this event changes this wait like so".

/** The six statuses a wait can have, in the order the filter lists them. */
export const STATUSES = ['running', 'succeeded', 'failed', 'timed_out', 'canceled', 'error'];

/** The terminal statuses, which are also the kinds of terminal events. */
export const TERMINAL = new Set(['succeeded', 'failed', 'timed_out', 'canceled', 'error']);

/** A distinct glyph per status, so the status reads without colour. */
export const STATUS_GLYPH = {
  running: '●',
  succeeded: '✔',
  failed: '✖',
  timed_out: '◷', // a clock face; U+23F1 (⏱) is missing from many fonts
  canceled: '⊘',
  error: '⚠',
};

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** True for a well-formed UUID (wait ids are UUIDs). */
export function isUuid(s) {
  return typeof s === 'string' && UUID_RE.test(s);
}

/** The link to a wait's detail view; null unless `id` is a valid UUID. */
export function waitHref(id) {
  return isUuid(id) ? `#/waits/${id.toLowerCase()}` : null;
}

/** A status as a known key (unknown values render as "error"-like, never as markup). */
export function statusKey(s) {
  return STATUSES.includes(s) ? s : 'unknown';
}

// ---------------------------------------------------------------------------
// Safe DOM construction

const FORBIDDEN_ATTR = /^(on|href$|src$|srcdoc$|formaction$|action$|style$)/i;

/**
 * Creates an element. `opts` may hold:
 *   class: string, text: string (textContent), title: string,
 *   data: {key: value} (dataset), attrs: {name: value} (setAttribute),
 *   on: {event: handler}, and any of id/type/name/value/placeholder/disabled/hidden…
 *   as plain properties via `props`.
 * Children: strings/numbers (become text nodes), nodes, null/false (skipped), arrays.
 */
export function el(tag, opts = null, ...children) {
  const node = document.createElement(tag);
  if (opts) {
    if (opts.class) node.className = opts.class;
    if (opts.text !== undefined && opts.text !== null) node.textContent = String(opts.text);
    if (opts.title !== undefined && opts.title !== null) node.title = String(opts.title);
    if (opts.data) for (const [k, v] of Object.entries(opts.data)) node.dataset[k] = String(v);
    if (opts.attrs) {
      for (const [k, v] of Object.entries(opts.attrs)) {
        if (v === null || v === undefined || v === false) continue;
        if (FORBIDDEN_ATTR.test(k)) throw new Error(`el(): attribute ${k} is not allowed`);
        node.setAttribute(k, v === true ? '' : String(v));
      }
    }
    if (opts.props) Object.assign(node, opts.props);
    if (opts.on) for (const [ev, fn] of Object.entries(opts.on)) node.addEventListener(ev, fn);
  }
  append(node, children);
  return node;
}

/** Appends children (text, nodes, arrays; null/false skipped) as el() does. */
export function append(node, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(node, c);
    else if (c instanceof Node) node.appendChild(c);
    else node.appendChild(document.createTextNode(String(c)));
  }
  return node;
}

/** An <a> to a wait's detail view; plain text when the id is not a UUID. */
export function waitLink(id, text, cls) {
  const href = waitHref(id);
  if (!href) return el('span', { class: cls, text });
  const a = el('a', { class: cls, text, title: id });
  a.setAttribute('href', href); // built from a validated UUID only
  return a;
}

/** Removes every child of `node`. */
export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

/**
 * A status badge: its text is the status itself ("timed_out"), its glyph comes from
 * the CSS (.badge.st-<status>::before, the same glyphs as STATUS_GLYPH) and its colour
 * from the class, so the text stays exactly the status for copy-paste and tests.
 */
export function statusBadge(status, extra = {}) {
  const key = statusKey(status);
  return el('span', { class: `badge st-${key}`, data: { status: String(status) }, text: String(status), ...extra });
}

/** Re-points an existing badge at another status. */
export function setBadge(badge, status) {
  badge.className = `badge st-${statusKey(status)}`;
  badge.dataset.status = String(status);
  badge.textContent = String(status);
}

// ---------------------------------------------------------------------------
// Formatting (the browser's locale and time zone)

const DATE_TIME = new Intl.DateTimeFormat(undefined, {
  year: 'numeric', month: 'short', day: '2-digit',
  hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false,
});
const TIME_ONLY = new Intl.DateTimeFormat(undefined, {
  hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false,
});
const NUMBER = new Intl.NumberFormat();
export const TIME_ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone || 'local time';

/**
 * Milliseconds since the epoch of an RFC 3339 time, or NaN. Fractions beyond
 * milliseconds are cut first: waitd's `created` events carry nanoseconds, which
 * Date.parse is only guaranteed to read with three digits.
 */
export function ms(iso) {
  return typeof iso === 'string' && iso ? Date.parse(iso.replace(/(\.\d{3})\d+/, '$1')) : NaN;
}

/** "01 Dec 2026, 11:28:01" in the browser's time zone; "—" for null. */
export function fmtDateTime(iso) {
  const t = ms(iso);
  return Number.isFinite(t) ? DATE_TIME.format(t) : '—';
}

/** "11:28:01" in the browser's time zone. */
export function fmtTime(iso) {
  const t = ms(iso);
  return Number.isFinite(t) ? TIME_ONLY.format(t) : '—';
}

export function fmtNumber(n) {
  return Number.isFinite(n) ? NUMBER.format(n) : '—';
}

/** A compact duration: "850ms", "42s", "3m 12s", "2h 05m", "3d 4h". */
export function fmtDuration(msec) {
  if (!Number.isFinite(msec)) return '—';
  const neg = msec < 0;
  let s = Math.abs(msec) / 1000;
  let out;
  if (s === 0) out = '0s';
  else if (s < 1) out = `${Math.round(s * 1000)}ms`;
  else if (s < 60) out = `${Math.floor(s)}s`;
  else if (s < 3600) out = `${Math.floor(s / 60)}m ${String(Math.floor(s % 60)).padStart(2, '0')}s`;
  else if (s < 86400) out = `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
  else out = `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
  return neg ? `-${out}` : out;
}

/** The age of something created at `iso`, e.g. "3m 12s". */
export function fmtAge(iso, now) {
  const t = ms(iso);
  return Number.isFinite(t) ? fmtDuration(Math.max(0, Math.floor((now - t) / 1000) * 1000)) : '—';
}

/** A coarse duration, one unit: "49s", "12m", "3h", "2d". */
export function fmtCoarse(msec) {
  if (!Number.isFinite(msec)) return '—';
  const s = Math.max(0, msec) / 1000;
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

/** Time left to a deadline: "9m 12s", or "overdue 3s". */
export function fmtLeft(iso, now) {
  const t = ms(iso);
  if (!Number.isFinite(t)) return '—';
  const left = t - now;
  return left >= 0 ? fmtDuration(left) : `overdue ${fmtDuration(-left)}`;
}

/** Pretty JSON (2 spaces) of any value, for a <pre> textContent. */
export function prettyJson(v) {
  try {
    return JSON.stringify(v, null, 2);
  } catch {
    return String(v);
  }
}

/**
 * A short form of a wait id for the list: its head, as the CLI prints the id first.
 * Wait ids are UUIDv7: the first 12 hex digits are the creation's millisecond and
 * the next three (after the version digit) random, so the first three groups tell
 * apart waits created together. The full id shows on hover and in the detail.
 */
export function shortId(id) {
  return isUuid(id) ? `${id.slice(0, 18)}…` : String(id);
}

/**
 * A callback wait's `callback` ({heartbeat?}) from its spec, or null for a wait
 * that polls a target (or a group). A callback wait has no target: a POST to its
 * callback URL, or an approval through the API, ends it.
 */
export function callbackOf(w) {
  const cb = w && w.spec && w.spec.callback;
  return cb && typeof cb === 'object' ? cb : null;
}

/** A wait's target as the list shows it: the URL without its scheme or query. */
export function targetText(w) {
  // A group polls nothing itself: say what it waits for.
  if (w && w.mode && Array.isArray(w.members)) return `${w.mode} of ${w.members.length} waits`;
  // Nor does a callback wait: it waits for a POST.
  const cb = callbackOf(w);
  if (cb) return typeof cb.heartbeat === 'string' ? `callback · heartbeat ${cb.heartbeat}` : 'callback';
  const url = w && w.spec && w.spec.target && w.spec.target.url;
  if (typeof url !== 'string') return '';
  try {
    const u = new URL(url);
    return `${u.host}${u.pathname}`;
  } catch {
    return url;
  }
}

/** Labels {k: v} as "k:v, k2:v2" (for titles). */
export function labelsText(labels) {
  return Object.entries(labels || {}).map(([k, v]) => `${k}:${v}`).join(', ');
}

// ---------------------------------------------------------------------------
// Label syntax shared by the filter and the create form

// A label name as waitd accepts it: 1 to 63 of letters, digits, - _ . /
const LABEL_KEY = '[A-Za-z0-9._/-]{1,63}';

/**
 * Parses "key:value, key2:value2" into [[k, v]…]. A new entry starts only at a comma
 * followed by a valid label name and a colon, so values may contain commas and spaces.
 * Throws an Error with a readable message on a malformed entry.
 */
export function parseLabelList(text) {
  const s = text.trim();
  if (!s) return [];
  const parts = s.split(new RegExp(`,\\s*(?=${LABEL_KEY}:)`));
  return parts.map((p) => {
    const i = p.indexOf(':');
    const k = i < 0 ? '' : p.slice(0, i).trim();
    if (!new RegExp(`^${LABEL_KEY}$`).test(k)) {
      throw new Error(`"${p.trim()}" is not key:value (a key is 1–63 letters, digits, - _ . /)`);
    }
    return [k, p.slice(i + 1).trim()];
  });
}

// ---------------------------------------------------------------------------
// The model: how an event changes a wait

/**
 * Applies one event to a wait object in place and returns true when a shown field
 * changed. `countRetries` is false where the caller refetches the wait instead
 * (a replayed retry must not be counted twice).
 */
export function applyEvent(w, ev, { countRetries = true } = {}) {
  switch (ev.kind) {
    case 'created':
      return false;
    case 'state':
      if (w.status !== 'running') return false; // a late event never reopens a wait
      w.state = ev.to ?? null;
      w.updated_at = ev.at;
      return true;
    case 'retry':
      if (w.status !== 'running') return false;
      if (countRetries) w.retries = (w.retries || 0) + 1;
      w.last_error = ev.error ?? w.last_error;
      w.updated_at = ev.at;
      return true;
    default:
      if (!TERMINAL.has(ev.kind)) return false;
      w.status = ev.kind;
      if ('reason' in ev) w.reason = ev.reason;
      if ('state' in ev) w.state = ev.state;
      if ('error_detail' in ev) w.error_detail = ev.error_detail;
      if ('last_error' in ev) w.last_error = ev.last_error;
      w.finished_at = ev.at;
      w.updated_at = ev.at;
      w.next_poll_at = null;
      return true;
  }
}
