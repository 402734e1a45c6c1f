// api.js — the HTTP client for waitd's API (same origin).
//
//   * The API token lives in sessionStorage only (this tab, until it closes): never
//     localStorage, never a cookie, never a URL. It is sent as
//     "Authorization: Bearer <token>" on every call, the event stream included.
//   * Every failure becomes an ApiError carrying the problem+json body, so callers
//     show `detail` (and `errors` for validation problems) to the user.
//   * A 401 clears the token and calls the handler the app registered, which asks
//     for a token again.
//   * GETs answered 429 (rate limit) or 503 are retried after Retry-After, a couple
//     of times, before the error reaches the user.

const TOKEN_KEY = 'waitd.apiToken';

/** The API token of this tab, kept in sessionStorage only. */
export const token = {
  get() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || null;
    } catch {
      return null;
    }
  },
  set(t) {
    try {
      sessionStorage.setItem(TOKEN_KEY, t);
    } catch {
      /* storage disabled: the token lives as long as this page (see memory below) */
    }
    memory = t;
  },
  clear() {
    try {
      sessionStorage.removeItem(TOKEN_KEY);
    } catch {
      /* ignore */
    }
    memory = null;
  },
};
// Fallback when sessionStorage is unavailable (e.g. disabled storage).
let memory = null;
function currentToken() {
  return token.get() || memory;
}

/** The Authorization header for the current token, or {} in anonymous mode. */
export function authHeaders(t = currentToken()) {
  return t ? { Authorization: `Bearer ${t}` } : {};
}

let unauthorizedHandler = null;
/** Registers what to do when a call is answered 401 (the app asks for a token). */
export function onUnauthorized(fn) {
  unauthorizedHandler = fn;
}
/** Reports a 401 seen outside request() (the event streams). */
export function reportUnauthorized(problem) {
  token.clear();
  if (unauthorizedHandler) unauthorizedHandler(problem);
}

/** A failed call: `status` is the HTTP status, or 0 when waitd could not be reached. */
export class ApiError extends Error {
  constructor(status, problem, fallback) {
    const detail = (problem && typeof problem.detail === 'string' && problem.detail) || fallback;
    super(detail);
    this.name = 'ApiError';
    this.status = status;
    this.problem = problem || null;
    this.detail = detail;
    this.title = (problem && problem.title) || '';
    this.errors = problem && Array.isArray(problem.errors) ? problem.errors : [];
  }
  get network() {
    return this.status === 0;
  }
}

/** Reads an error response as problem+json (or a readable stand-in). */
export async function readProblem(res) {
  let problem = null;
  try {
    const type = res.headers.get('content-type') || '';
    if (type.includes('json')) problem = await res.json();
    else {
      const text = (await res.text()).trim();
      if (text) problem = { detail: text.slice(0, 300) };
    }
  } catch {
    /* unreadable body */
  }
  return new ApiError(res.status, problem, `waitd answered ${res.status} ${res.statusText || ''}`.trim());
}

/** Builds a query string from {key: value | [values]}; null/''/undefined are left out. */
export function queryString(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (Array.isArray(v)) v.forEach((x) => q.append(k, String(x)));
    else if (v !== null && v !== undefined && v !== '') q.append(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

const sleep = (msec, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(resolve, msec);
    signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });

/**
 * One API call. Options:
 *   query: object for queryString(); body: JSON-serialisable; headers: extra headers;
 *   signal: AbortSignal; tokenOverride: string | '' (send this token / none) — used by
 *   the token probe; notify401: false to not trigger the re-login flow.
 * Resolves with the parsed JSON body; rejects with ApiError (or an AbortError).
 */
export async function request(method, path, opts = {}) {
  const { query, body, headers = {}, signal, tokenOverride, notify401 = true } = opts;
  const url = path + queryString(query);
  const h = {
    Accept: 'application/json',
    ...(tokenOverride !== undefined ? authHeaders(tokenOverride) : authHeaders()),
    ...headers,
  };
  if (body !== undefined) h['Content-Type'] = 'application/json';
  for (let attempt = 0; ; attempt++) {
    let res;
    try {
      res = await fetch(url, {
        method,
        headers: h,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
        cache: 'no-store',
        credentials: 'omit', // the token is the only credential; no cookies
      });
    } catch (e) {
      if (e && e.name === 'AbortError') throw e;
      throw new ApiError(0, null, 'waitd cannot be reached (network error); is it running?');
    }
    if (res.ok) {
      if (res.status === 204) return null;
      try {
        return await res.json();
      } catch {
        throw new ApiError(res.status, null, 'waitd sent a response that is not JSON');
      }
    }
    const err = await readProblem(res);
    const retryable = method === 'GET' && (res.status === 429 || res.status === 503) && attempt < 2;
    if (retryable) {
      const after = Number(res.headers.get('retry-after'));
      await sleep(Number.isFinite(after) && after > 0 ? Math.min(after, 10) * 1000 : 1000, signal);
      if (signal?.aborted) throw new DOMException('aborted', 'AbortError');
      continue;
    }
    if (res.status === 401 && notify401) reportUnauthorized(err.problem);
    throw err;
  }
}

/** The API routes the dashboard uses. */
export const api = {
  /** GET /waits — {items, next_cursor}; filters: {status, labels: ["k:v"], limit, cursor}. next_cursor only when another page exists. */
  listWaits({ status, labels, limit, cursor } = {}, opts = {}) {
    return request('GET', '/waits', { ...opts, query: { status, label: labels || [], limit, cursor } });
  },
  /** GET /waits/{id} */
  getWait(id, opts = {}) {
    return request('GET', `/waits/${encodeURIComponent(id)}`, opts);
  },
  /** POST /waits/{id}/cancel — the wait, canceled or as it had already ended. */
  cancelWait(id, opts = {}) {
    return request('POST', `/waits/${encodeURIComponent(id)}/cancel`, opts);
  },
  /**
   * POST /waits/{id}/complete — a running callback wait, ended succeeded; `body` is
   * optional JSON. A wait that had ended is a 409 whose body is the wait.
   */
  completeWait(id, body, opts = {}) {
    return request('POST', `/waits/${encodeURIComponent(id)}/complete`, { ...opts, body });
  },
  /** POST /waits/{id}/fail — a running callback wait, ended failed with `body` as its error_detail. */
  failWait(id, body, opts = {}) {
    return request('POST', `/waits/${encodeURIComponent(id)}/fail`, { ...opts, body });
  },
  /** GET /events (JSON page) — {items, next_cursor}, ids greater than `after`; next_cursor only when another page exists. */
  globalEvents({ after, labels } = {}, opts = {}) {
    return request('GET', '/events', { ...opts, query: { after, label: labels || [] } });
  },
  /** GET /waits/{id}/deliveries — {items: [Delivery]}, in event order. */
  deliveries(id, opts = {}) {
    return request('GET', `/waits/${encodeURIComponent(id)}/deliveries`, opts);
  },
  /** POST /waits/{id}/deliveries/{delivery}/retry — 202 with the delivery, queued again. */
  redeliver(id, delivery, opts = {}) {
    return request('POST', `/waits/${encodeURIComponent(id)}/deliveries/${encodeURIComponent(delivery)}/retry`, opts);
  },
  /** GET /presets — {items: [{name, description, params: {name: Param}}]}. */
  presets(opts = {}) {
    return request('GET', '/presets', opts);
  },
  /** POST /waits — 201 with the wait. The idempotency key makes a double submit harmless. */
  createWait(body, idempotencyKey, opts = {}) {
    const headers = idempotencyKey ? { 'Idempotency-Key': idempotencyKey } : {};
    return request('POST', '/waits', { ...opts, body, headers });
  },
};

/**
 * The caller's newest event id now (0 when there is none): GET /events?after=latest
 * as JSON is an empty page whose next_cursor is that id. The dashboard reads it
 * before the list, then follows the stream from it, so no event that happens after
 * the list was read is missed, and the history is not replayed.
 */
export async function latestEventId(opts = {}) {
  const page = await request('GET', '/events', { ...opts, query: { after: 'latest' } });
  const id = Number(page && page.next_cursor);
  return Number.isFinite(id) && id > 0 ? id : 0;
}
