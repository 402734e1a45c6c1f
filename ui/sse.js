// sse.js — server-sent events over fetch().
//
// The browser's EventSource cannot send an Authorization header, so the dashboard
// reads event streams with fetch() and a streaming body reader:
//
//   * SseParser turns decoded text chunks into events, following the WHATWG
//     event-stream rules: lines end in \n, \r\n or \r (also when a \r\n pair is split
//     across chunks), "data:" lines join with \n, lines starting with ":" are
//     comments (waitd's keep-alives), one space after the colon is dropped, a field
//     without a colon has an empty value, an "id" containing NUL is ignored, and an
//     unfinished event at the end of the stream is discarded.
//   * EventStream keeps one stream open: it sends Authorization and, on every
//     (re)connect, Last-Event-ID with the id of the last event it dispatched, so
//     waitd neither repeats nor loses an event. It reconnects with backoff (0.5 s
//     doubling to 10 s), treats 45 s without a byte (waitd sends a keep-alive every
//     ~10 s) as a dead connection, stops with an AbortController, and reports its
//     state: "connected", "reconnecting" (with the attempt count) or "offline".

/** Incremental parser of a text/event-stream body. */
export class SseParser {
  constructor() {
    this.buf = ''; // an unfinished line
    this.skipLF = false; // the last chunk ended in \r: a leading \n belongs to it
    this.started = false;
    this.data = [];
    this.type = '';
    this.idBuf = null; // the "last event ID buffer" of the spec
    this.out = [];
    this.comments = 0;
  }

  /** Feeds one decoded chunk; returns the events it completed: [{type, data, id}]. */
  push(chunk) {
    let s = this.buf + chunk;
    let start = 0;
    if (!this.started && s.length) {
      this.started = true;
      if (s.charCodeAt(0) === 0xfeff) start = 1; // a leading BOM is dropped
    }
    if (this.skipLF && s.length) {
      if (s.charCodeAt(start) === 10) start++;
      this.skipLF = false;
    }
    for (let i = start; i < s.length; i++) {
      const c = s.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      this.line(s.slice(start, i));
      if (c === 13) {
        if (i + 1 < s.length) {
          if (s.charCodeAt(i + 1) === 10) i++;
        } else {
          this.skipLF = true;
        }
      }
      start = i + 1;
    }
    this.buf = s.slice(start);
    const out = this.out;
    this.out = [];
    return out;
  }

  line(l) {
    if (l === '') return this.dispatch();
    if (l.charCodeAt(0) === 58 /* : */) {
      this.comments++;
      return;
    }
    const i = l.indexOf(':');
    const field = i < 0 ? l : l.slice(0, i);
    let value = i < 0 ? '' : l.slice(i + 1);
    if (value.charCodeAt(0) === 32) value = value.slice(1);
    switch (field) {
      case 'event':
        this.type = value;
        break;
      case 'data':
        this.data.push(value);
        break;
      case 'id':
        if (!value.includes('\0')) this.idBuf = value;
        break;
      default:
        break; // "retry" and unknown fields: waitd does not send them; ignored
    }
  }

  dispatch() {
    if (this.data.length === 0) {
      this.type = '';
      return;
    }
    this.out.push({ type: this.type || 'message', data: this.data.join('\n'), id: this.idBuf });
    this.data = [];
    this.type = '';
  }
}

const BACKOFF_MIN = 500;
const BACKOFF_MAX = 10000;
/** Consecutive failed attempts after which the indicator says "offline". */
const OFFLINE_AFTER = 5;
/** No byte for this long (keep-alives come every ~10 s) means a dead connection. */
const IDLE_TIMEOUT = 45000;

/** The delay before reconnect attempt n (n ≥ 1): 0.5 s, 1 s, 2 s … 10 s. */
export function backoffDelay(n) {
  return Math.min(BACKOFF_MAX, BACKOFF_MIN * 2 ** Math.max(0, n - 1));
}

/**
 * One followed event stream.
 *
 *   new EventStream({
 *     url: () => '/events?follow=true&label=…',   // read at every (re)connect
 *     headers: () => ({Authorization: …}),         // read at every (re)connect
 *     lastEventId: '123',                          // resume point of the first connect
 *     onEvents: (events) => …,                     // [{type, data, id}] per chunk
 *     onState: (state, info) => …,                 // 'connected'|'reconnecting'|'offline'
 *     onUnauthorized: (problem) => …,              // a 401: the stream stops
 *     onFatal: (apiError) => …,                    // a 4xx that retrying cannot fix
 *                                                  // (409: Last-Event-ID is past every
 *                                                  // event the server has)
 *     isFinished: () => bool,                      // a wait's stream: ended for good
 *     readProblem: async (res) => ApiError,
 *   })
 */
export class EventStream {
  constructor(opts) {
    this.opts = opts;
    this.lastEventId = opts.lastEventId ?? null;
    this.stopped = true;
    this.state = 'offline';
    this.attempt = 0;
    this.ctl = null;
    this.wakeUp = null;
    this.onOnline = () => this.wake();
    this.onOffline = () => {
      if (!this.stopped && this.state !== 'connected') this.setState('offline', { attempt: this.attempt });
    };
  }

  start() {
    if (!this.stopped) return;
    this.stopped = false;
    window.addEventListener('online', this.onOnline);
    window.addEventListener('offline', this.onOffline);
    this.run();
  }

  /** Stops for good: aborts the open request and any pending reconnect. */
  stop() {
    if (this.stopped) return;
    this.stopped = true;
    window.removeEventListener('online', this.onOnline);
    window.removeEventListener('offline', this.onOffline);
    if (this.ctl) this.ctl.abort();
    this.wake();
    this.setState('offline', { stopped: true });
  }

  /** Cuts the current connection to reconnect at once (tests, "retry now"). */
  reconnectNow() {
    if (this.ctl) this.ctl.abort();
    this.wake();
  }

  wake() {
    if (this.wakeUp) this.wakeUp();
  }

  setState(state, info = {}) {
    this.state = state;
    if (this.opts.onState) this.opts.onState(state, info);
  }

  sleep(msec) {
    return new Promise((resolve) => {
      const t = setTimeout(done, msec);
      const self = this;
      function done() {
        clearTimeout(t);
        self.wakeUp = null;
        resolve();
      }
      this.wakeUp = done;
    });
  }

  async run() {
    let failures = 0; // consecutive failed attempts (a drop counts as one)
    let everConnected = false;
    // The attempt about to be made: 1, 2, … since start-up, or since the last drop.
    const attempt = () => (everConnected ? failures : failures + 1);
    while (!this.stopped) {
      this.attempt = attempt();
      const offline = failures >= OFFLINE_AFTER || navigator.onLine === false;
      this.setState(offline ? 'offline' : 'reconnecting', { attempt: this.attempt, initial: !everConnected });
      const ctl = new AbortController();
      this.ctl = ctl;
      let res = null;
      try {
        const headers = { Accept: 'text/event-stream', ...(this.opts.headers ? this.opts.headers() : {}) };
        if (this.lastEventId !== null && this.lastEventId !== '') headers['Last-Event-ID'] = this.lastEventId;
        res = await fetch(this.opts.url(), { headers, signal: ctl.signal, cache: 'no-store', credentials: 'omit' });
      } catch {
        res = null; // network error or aborted
      }
      if (this.stopped) break;
      if (res && !res.ok) {
        const err = await this.opts.readProblem(res);
        if (res.status === 401) {
          this.stopped = true;
          this.setState('offline', { stopped: true });
          this.opts.onUnauthorized?.(err.problem);
          break;
        }
        const retryable = res.status >= 500 || res.status === 408 || res.status === 429;
        if (!retryable) {
          this.stopped = true;
          this.setState('offline', { stopped: true, error: err });
          this.opts.onFatal?.(err);
          break;
        }
        failures++;
        const after = Number(res.headers.get('retry-after'));
        await this.sleep(Number.isFinite(after) && after > 0 ? Math.min(after * 1000, BACKOFF_MAX) : backoffDelay(failures));
        continue;
      }
      if (res && !(res.headers.get('content-type') || '').includes('text/event-stream')) {
        this.stopped = true;
        this.setState('offline', { stopped: true });
        this.opts.onFatal?.(new Error('the event stream answered something that is not text/event-stream'));
        break;
      }
      if (res) {
        failures = 0;
        everConnected = true;
        this.setState('connected', {});
        await this.read(res, ctl);
        if (this.stopped) break;
        if (this.opts.isFinished && this.opts.isFinished()) {
          this.stopped = true;
          this.setState('offline', { stopped: true, finished: true });
          break;
        }
      }
      // The connection failed or dropped: back off, then reconnect with Last-Event-ID.
      failures++;
      this.attempt = attempt();
      this.setState(failures >= OFFLINE_AFTER || navigator.onLine === false ? 'offline' : 'reconnecting', {
        attempt: this.attempt,
        initial: !everConnected,
        delay: backoffDelay(failures),
      });
      await this.sleep(backoffDelay(failures));
    }
    this.ctl = null;
  }

  /** Reads one response body until it ends, fails, idles out or is aborted. */
  async read(res, ctl) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder('utf-8');
    const parser = new SseParser();
    let idle = setTimeout(() => ctl.abort(), IDLE_TIMEOUT);
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        clearTimeout(idle);
        idle = setTimeout(() => ctl.abort(), IDLE_TIMEOUT);
        const events = parser.push(decoder.decode(value, { stream: true }));
        if (events.length) {
          // Resume after the last event handed over, not after a half-received one.
          this.lastEventId = events[events.length - 1].id ?? this.lastEventId;
          try {
            this.opts.onEvents(events);
          } catch (e) {
            console.error('waitd: applying events failed', e);
          }
        }
        if (this.stopped) break;
      }
    } catch {
      /* aborted or the connection broke */
    } finally {
      clearTimeout(idle);
      try {
        reader.cancel().catch(() => {});
      } catch {
        /* ignore */
      }
    }
  }
}
