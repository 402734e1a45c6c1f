// app.js — the dashboard's entry point and controller.
//
// Start-up: find out whether waitd wants a token (GET /waits?limit=1 without one:
// 401 means yes), ask for it if so, then load the list and follow the live stream.
// Whether a token may write is found out once it is accepted (see probeAccess):
// a read-only token sees no buttons that would change a wait.
//
// Data flow:
//   1. GET /events?after=latest: the caller's newest event id now (H).
//   2. GET /waits (status, labels, limit=500): the first page, newest first.
//   3. GET /events?follow=true&label=… with Last-Event-ID: H: every event after H,
//      live. Events are queued and applied in order, in batches (one batch per
//      chunk the stream delivers): a `created` event of an unknown wait makes one
//      GET /waits page with the current filters (so waitd decides whether it
//      matches), and its new waits go on top; every other event changes its wait in
//      the Map (O(1)) and its row if that row is on screen; a wait that no longer
//      matches the status filter leaves the list. Events of waits not loaded are
//      ignored. window.__waitd counts what has been applied, for tests.
//   4. Polls and retries are not events: one GET /waits page for the rows on screen
//      reads them again every 10 s, and about a second after events changed a row
//      on screen (at most one such read a second, whatever the rate of events).
//
// Routes (location.hash): "#/" the list, "#/waits/<uuid>" a wait's detail,
// "#/new" the new-wait form.

import {
  el, clear, append, STATUSES, STATUS_GLYPH, applyEvent, isUuid, parseLabelList, fmtNumber,
} from './common.js';
import {
  api, token, authHeaders, onUnauthorized, reportUnauthorized, readProblem, queryString,
  latestEventId, ApiError,
} from './api.js';
import { EventStream, backoffDelay } from './sse.js';
import { WaitList } from './list.js';
import { DetailPanel } from './panels.js';
import { CreatePanel } from './create.js';

const PAGE = 500;
const REFRESH_MS = 10000;
/** How long after an event changed a row on screen its counters are read again. */
const REFRESH_SOON_MS = 1000;

/**
 * For automated tests: what the page has applied so far. Each change of it
 * dispatches a `waitd-hook` event on window, so a test awaits the page's
 * progress instead of looking at it on a clock.
 */
const hook = new Proxy({
  lastEventId: 0, // the global id of the last event applied (or the start point)
  eventsApplied: 0, // events from the global stream applied to the page
  streamState: 'offline',
  waitsLoaded: 0,
  ready: false, // the first list page is shown and the stream was started
  canWrite: null, // whether the token may change waits; null until known
}, {
  set(target, key, value) {
    target[key] = value;
    window.dispatchEvent(new Event('waitd-hook'));
    return true;
  },
});
window.__waitd = hook;

const $ = (id) => document.getElementById(id);

const S = {
  gen: 0, // bumped by every reload; stale responses compare and drop out
  filters: { status: '', labels: [] }, // labels as "k:v" strings
  nextCursor: null,
  loading: false,
  loadingMore: false,
  stream: null,
  queue: [],
  pumping: false,
  authMode: null, // 'anonymous' | 'token'
  canWrite: null, // true | false (a read-only token) | null (not known yet)
  accessGen: 0, // bumped by every change of token; a stale probe drops out
  askingToken: null, // the promise of the token form while it is shown
  retryTimer: 0,
  lastReset: 0, // when a 409 last made the page load everything again
  refreshSoon: 0, // the timer of the read that follows events on screen
};

// ---------------------------------------------------------------------------
// Banners (errors that concern the whole page)

const banners = new Map(); // key -> {text, action}

function showBanner(key, text, action = null) {
  banners.set(key, { text, action });
  renderBanners();
}
function clearBanner(key) {
  if (banners.delete(key)) renderBanners();
}
function renderBanners() {
  const host = clear($('banner'));
  host.hidden = banners.size === 0;
  for (const [key, { text, action }] of banners) {
    host.appendChild(el('div', { class: 'banner-item', data: { key } },
      el('span', { class: 'banner-glyph', text: '⚠', attrs: { 'aria-hidden': 'true' } }),
      el('span', { class: 'banner-text', text }),
      action ? el('button', { class: 'btn small', text: action.label, attrs: { type: 'button' }, on: { click: action.run } }) : null,
      el('button', { class: 'btn small ghost', text: 'Dismiss', attrs: { type: 'button' }, on: { click: () => clearBanner(key) } })));
  }
}

// ---------------------------------------------------------------------------
// Authentication

/** Resolves once the page may call the API (anonymous, or with a working token). */
async function ensureAccess() {
  for (let attempt = 1; ; attempt++) {
    const stored = token.get();
    try {
      await api.listWaits({ limit: 1 }, { tokenOverride: stored || '', notify401: false });
      setAuthMode(stored ? 'token' : 'anonymous');
      clearBanner('unreachable');
      return;
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) {
        token.clear();
        await askToken(stored ? `The saved token was refused: ${e.detail}` : null);
        return;
      }
      showBanner('unreachable', `Cannot reach waitd: ${e.detail || e.message}. Retrying…`);
      await new Promise((r) => setTimeout(r, backoffDelay(attempt)));
    }
  }
}

function setAuthMode(mode) {
  S.authMode = mode;
  $('forget-token').hidden = mode !== 'token';
  updateFooter();
  // Anonymous use may do everything; a token's access is found out.
  setCanWrite(mode === 'anonymous' ? true : null);
  if (mode === 'token') probeAccess();
}

function setCanWrite(canWrite) {
  S.canWrite = canWrite;
  hook.canWrite = canWrite;
  const mode = S.authMode;
  $('auth-mode').textContent = mode === 'token' ? (canWrite === false ? 'token · read-only' : 'token') : mode === 'anonymous' ? 'anonymous' : '';
  $('auth-mode').title = mode === 'token'
    ? (canWrite === false
      ? 'Using a read-only API token kept in this tab only: it reads and follows waits, and changes none'
      : 'Using an API token kept in this tab only')
    : 'This waitd serves without tokens';
  $('new-wait').hidden = canWrite === false;
  detail.accessChanged();
}

/**
 * Whether the token may change waits. waitd refuses a read-only token every POST
 * with a 403 before it looks at the route, so a cancel of the nil id, which names
 * no wait, answers 403 to a read-only token and 404 to any other, and changes
 * nothing either way. Anything else (waitd away) leaves the buttons shown: a
 * refusal then says why.
 */
async function probeAccess() {
  const gen = ++S.accessGen;
  let canWrite = true;
  try {
    await api.cancelWait('00000000-0000-0000-0000-000000000000', { notify401: false });
  } catch (e) {
    canWrite = !(e instanceof ApiError && e.status === 403);
  }
  if (gen === S.accessGen && S.authMode === 'token') setCanWrite(canWrite);
}

/** Shows the token form (once) and resolves when a token has been accepted. */
function askToken(message) {
  if (S.askingToken) return S.askingToken;
  setAuthMode(null);
  S.askingToken = new Promise((resolve) => {
    const input = el('input', {
      class: 'input mono',
      data: { testid: 'token-input' },
      attrs: { id: 'token-input', type: 'password', autocomplete: 'off', spellcheck: 'false', placeholder: 'API token' },
    });
    const error = el('p', { class: 'field-error', attrs: { role: 'alert' }, text: message || '' });
    const submit = el('button', { class: 'btn primary', text: 'Continue', data: { testid: 'token-submit' }, attrs: { type: 'submit' } });
    const form = el('form', {
      class: 'token-card',
      data: { testid: 'token-form' },
      attrs: { novalidate: true, 'aria-labelledby': 'token-title' },
      on: {
        submit: async (e) => {
          e.preventDefault();
          const t = input.value.trim();
          if (!t) {
            error.textContent = 'Enter the API token.';
            return;
          }
          submit.disabled = true;
          error.textContent = '';
          try {
            await api.listWaits({ limit: 1 }, { tokenOverride: t, notify401: false });
            token.set(t);
            overlay.remove();
            S.askingToken = null;
            setAuthMode('token');
            resolve();
          } catch (err) {
            error.textContent = err.status === 401 ? `Refused: ${err.detail}` : `Could not check the token: ${err.detail || err.message}`;
            submit.disabled = false;
            input.select();
          }
        },
      },
    },
    el('h2', { text: 'API token required', attrs: { id: 'token-title' } }),
    el('p', { class: 'muted', text: 'This waitd asks for an API token. It is kept in this browser tab only (sessionStorage) and sent as “Authorization: Bearer …”.' }),
    el('label', { text: 'Token', attrs: { for: 'token-input' } }),
    input,
    error,
    el('div', { class: 'form-actions' }, submit));
    const overlay = el('div', { class: 'overlay' }, form);
    $('token-host').appendChild(overlay);
    input.focus();
  });
  return S.askingToken;
}

/** Stops everything that talks to the API (before asking for a token again). */
function stopAll() {
  S.gen++;
  stopStream();
  S.queue = [];
  detail.close();
  create.close();
  list.reset();
  S.nextCursor = null;
  updateFooter();
}

// A 401 after start-up (a token revoked, the server restarted with tokens…).
onUnauthorized((problem) => {
  if (S.askingToken) return;
  stopAll();
  create.reset();
  const why = problem && problem.detail ? `waitd refused the token (${problem.detail}).` : 'waitd refused the token.';
  askToken(`${why} Enter a token again.`).then(() => {
    reload();
    route();
  });
});

function forgetToken() {
  token.clear();
  stopAll();
  create.reset();
  askToken(null).then(() => {
    reload();
    route();
  });
}

// ---------------------------------------------------------------------------
// The list and its filters

const list = new WaitList($('viewport'), {
  onOpen: (id) => {
    if (isUuid(id)) location.hash = `#/waits/${id}`;
  },
  onNearEnd: () => loadMore(),
  onCount: () => updateFooter(),
});

function currentQuery() {
  return { status: S.filters.status || undefined, labels: S.filters.labels };
}

/** Loads the list from scratch with the current filters and (re)starts the stream. */
async function reload() {
  const gen = ++S.gen;
  clearTimeout(S.retryTimer);
  stopStream();
  S.queue = [];
  S.nextCursor = null;
  list.reset();
  S.loading = true;
  hook.ready = false;
  updateFooter();
  try {
    const head = await latestEventId();
    if (gen !== S.gen) return;
    const page = await api.listWaits({ ...currentQuery(), limit: PAGE });
    if (gen !== S.gen) return;
    S.loading = false;
    list.append(page.items || []);
    S.nextCursor = page.next_cursor || null;
    hook.lastEventId = head;
    clearBanner('load');
    startStream(gen, head);
    hook.ready = true;
  } catch (e) {
    if (gen !== S.gen || e.name === 'AbortError') return;
    S.loading = false;
    if (e.status === 401) return; // the token flow takes over
    if (e.status === 400) {
      $('filter-error').textContent = e.detail;
      showBanner('load', `The filter was refused: ${e.detail}`);
    } else {
      showBanner('load', `Could not load waits: ${e.detail || e.message}`, { label: 'Retry now', run: () => reload() });
      S.retryTimer = setTimeout(() => { if (gen === S.gen) reload(); }, 5000);
    }
  } finally {
    if (gen === S.gen) {
      S.loading = false;
      updateFooter();
    }
  }
}

/** The next page of 500 (infinite scroll, or the "Load more" button). */
async function loadMore() {
  if (!S.nextCursor || S.loadingMore || S.loading) return;
  const gen = S.gen;
  S.loadingMore = true;
  updateFooter();
  try {
    const page = await api.listWaits({ ...currentQuery(), limit: PAGE, cursor: S.nextCursor });
    if (gen !== S.gen) return;
    S.nextCursor = page.next_cursor || null;
    S.loadingMore = false;
    list.append(page.items || []);
  } catch (e) {
    if (gen === S.gen && e.status !== 401 && e.name !== 'AbortError') {
      showBanner('more', `Could not load more waits: ${e.detail || e.message}`);
    }
  } finally {
    if (gen === S.gen) {
      S.loadingMore = false;
      updateFooter();
    }
  }
}

/** Every ~10 s: one GET /waits page covering the rows on screen (polls are not evented). */
async function refreshVisible() {
  if (document.hidden || S.loading || !S.authMode || list.size === 0) return;
  const gen = S.gen;
  const { start, end } = list.visibleRange();
  const cursor = start > 0 ? list.order[start - 1] : undefined;
  const limit = Math.min(PAGE, Math.max(1, end - start + 2));
  let page;
  try {
    page = await api.listWaits({ ...currentQuery(), limit, cursor });
  } catch {
    return; // the stream indicator and the next refresh tell the story
  }
  if (gen !== S.gen) return;
  let unknown = [];
  for (const item of page.items || []) {
    if (list.has(item.id)) {
      // Waits we did not have, between known ones (e.g. one that just reached the
      // status a filter asks for): put them where the server says they belong.
      if (unknown.length) list.insertBefore(item.id, unknown);
      unknown = [];
      list.merge(item);
      const w = list.get(item.id);
      if (S.filters.status && w.status !== S.filters.status) list.remove(item.id);
      detail.updateWait(item);
    } else {
      unknown.push(item);
    }
  }
  list.flush();
  hook.waitsLoaded = list.size;
}

/** Reads the rows on screen again shortly, once for any number of calls meanwhile. */
function refreshSoon() {
  if (S.refreshSoon) return;
  S.refreshSoon = setTimeout(() => {
    S.refreshSoon = 0;
    refreshVisible();
  }, REFRESH_SOON_MS);
}

function updateFooter() {
  const n = list.size;
  hook.waitsLoaded = n;
  const text = !S.authMode && !S.loading
    ? ''
    : S.loading
    ? 'Loading waits…'
    : `${fmtNumber(n)} wait${n === 1 ? '' : 's'} loaded${S.nextCursor ? ' · more on the server' : ''}`;
  $('footer-text').textContent = S.loadingMore ? `${text} · loading more…` : text;
  const more = $('load-more');
  more.hidden = !S.nextCursor;
  more.disabled = S.loadingMore;
  // Empty state
  const empty = $('empty');
  const filtered = !!(S.filters.status || S.filters.labels.length);
  empty.hidden = S.loading || n > 0 || !S.authMode;
  if (!empty.hidden) {
    clear(empty);
    if (filtered) {
      append(empty, [
        el('p', { class: 'empty-title', text: 'No waits match these filters.' }),
        el('p', { class: 'muted', text: 'New waits that match will appear here as they are created.' }),
        el('button', { class: 'btn', text: 'Clear filters', attrs: { type: 'button' }, on: { click: clearFilters } }),
      ]);
    } else {
      append(empty, [
        el('p', { class: 'empty-title', text: 'No waits yet.' }),
        el('p', { class: 'muted', text: 'Create one with “New wait”, or POST /waits; it will appear here live.' }),
      ]);
    }
  }
}

function applyFilters(e) {
  if (e) e.preventDefault();
  const errorEl = $('filter-error');
  errorEl.textContent = '';
  // A full id opens that wait, whether or not the list has it loaded.
  const id = $('id-filter').value.trim();
  $('id-filter').classList.remove('invalid');
  if (id) {
    if (!isUuid(id)) {
      errorEl.textContent = 'Id: write a wait’s full id, a UUID such as 0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21.';
      $('id-filter').classList.add('invalid');
      return;
    }
    location.hash = `#/waits/${id.toLowerCase()}`;
  }
  let labels;
  try {
    labels = parseLabelList($('label-filter').value).map(([k, v]) => `${k}:${v}`);
  } catch (err) {
    errorEl.textContent = err.message;
    $('label-filter').classList.add('invalid');
    return;
  }
  $('label-filter').classList.remove('invalid');
  S.filters = { status: $('status-filter').value, labels };
  if (S.authMode) reload();
}

function clearFilters() {
  $('status-filter').value = '';
  $('id-filter').value = '';
  $('label-filter').value = '';
  applyFilters();
}

// ---------------------------------------------------------------------------
// The live stream

function setStreamState(state, info = {}) {
  const ind = $('stream-status');
  ind.dataset.state = state;
  hook.streamState = state;
  let text;
  let title;
  if (state === 'connected') {
    text = 'Live';
    title = 'Following GET /events live';
  } else if (state === 'reconnecting') {
    text = info.initial && info.attempt <= 1 ? 'Connecting…' : `Reconnecting (attempt ${info.attempt})`;
    title = 'The live stream dropped; reconnecting with Last-Event-ID, so no event is lost';
  } else {
    text = info.stopped ? 'Offline' : `Offline · retrying (attempt ${info.attempt})`;
    title = info.stopped ? 'Not following the live stream' : 'waitd is unreachable; still retrying every 10 s';
  }
  ind.querySelector('.stream-text').textContent = text;
  ind.title = title;
}

function startStream(gen, head) {
  stopStream();
  let connectedOnce = false;
  S.stream = new EventStream({
    url: () => `/events${queryString({ follow: 'true', label: S.filters.labels })}`,
    headers: () => authHeaders(),
    lastEventId: String(head),
    readProblem,
    onEvents: (events) => {
      if (gen !== S.gen) return;
      for (const raw of events) {
        try {
          S.queue.push(JSON.parse(raw.data));
        } catch {
          console.warn('waitd: an event that is not JSON was skipped');
        }
      }
      pump();
    },
    onState: (state, info) => {
      if (gen !== S.gen) return;
      setStreamState(state, info);
      if (state === 'offline' && !info.stopped) {
        showBanner('stream', 'Lost the connection to waitd; retrying every 10 s. What is shown may be out of date.');
      }
      if (state !== 'connected') return;
      clearBanner('stream');
      if (connectedOnce) afterReconnect(gen);
      connectedOnce = true;
    },
    onUnauthorized: (problem) => reportUnauthorized(problem),
    onFatal: (err) => {
      if (gen !== S.gen) return;
      if (err.status === 409) return historyReset(gen);
      showBanner('stream', `The live stream stopped: ${err.message}`, { label: 'Reload', run: () => reload() });
    },
  });
  S.stream.start();
}

/**
 * After a reconnect: the stream resumed from Last-Event-ID, so no event was lost, but
 * polls are not events: read the rows on screen again.
 */
function afterReconnect(gen) {
  if (gen === S.gen) refreshVisible();
}

/**
 * waitd answered 409 to our Last-Event-ID: the cursor is past every event it has (its
 * in-memory store was reset, or this is another server). What the page shows may be
 * gone: load the list again and follow from waitd's newest event (reload() reads it
 * with after=latest before the list). A second reset within seconds waits a little,
 * so a server that keeps answering 409 is not asked in a tight loop.
 */
function historyReset(gen) {
  showBanner('reset', 'waitd’s event history restarted (its store was reset, or this is another server); the list was loaded again.');
  const wait = Date.now() - S.lastReset < 5000 ? 2000 : 0;
  S.lastReset = Date.now();
  clearTimeout(S.retryTimer);
  S.retryTimer = setTimeout(() => { if (gen === S.gen) reload(); }, wait);
}

function stopStream() {
  if (S.stream) S.stream.stop();
  S.stream = null;
  setStreamState('offline', { stopped: true });
}

/** Applies queued events in order, a batch at a time (see the top of this file). */
async function pump() {
  if (S.pumping) return;
  S.pumping = true;
  const gen = S.gen;
  try {
    while (S.queue.length && gen === S.gen) {
      const batch = S.queue.splice(0, S.queue.length);
      const unknown = new Set();
      for (const ev of batch) if (ev.kind === 'created' && !list.has(ev.wait_id)) unknown.add(ev.wait_id);
      if (unknown.size) {
        let fresh = [];
        try {
          fresh = await fetchNewest(unknown, gen);
        } catch (e) {
          if (e.status !== 401) console.warn('waitd: could not read new waits', e);
        }
        if (gen !== S.gen) return;
        list.prepend(fresh);
      }
      let shown = false;
      for (const ev of batch) shown = applyOne(ev) || shown;
      list.flush();
      if (shown) refreshSoon();
      const last = Number(batch[batch.length - 1].id);
      if (Number.isFinite(last)) hook.lastEventId = last;
      hook.eventsApplied += batch.length;
      hook.waitsLoaded = list.size;
    }
  } finally {
    S.pumping = false;
    if (S.queue.length) pump(); // events of a newer generation that came meanwhile
  }
}

/**
 * The waits created since the list was read, as waitd filters them: GET /waits pages
 * (newest first, current filters) until a wait we already have, the end, or every
 * created id was seen. One request for any burst of creations, and a wait that does
 * not match the filters is simply not returned.
 */
async function fetchNewest(ids, gen) {
  const found = [];
  const remaining = new Set(ids);
  let cursor;
  for (let pages = 0; pages < 20; pages++) {
    const limit = Math.min(PAGE, Math.max(20, remaining.size + 10));
    const page = await api.listWaits({ ...currentQuery(), limit, cursor });
    if (gen !== S.gen) return [];
    let known = false;
    for (const w of page.items || []) {
      if (list.has(w.id)) {
        known = true;
        break;
      }
      found.push(w);
      remaining.delete(w.id);
    }
    if (known || !page.next_cursor || remaining.size === 0) break;
    cursor = page.next_cursor;
  }
  return found;
}

/** Applies one event; true when it changed a row that is on screen. */
function applyOne(ev) {
  detail.applyEvent(ev);
  detail.memberEvent(ev);
  // A member's end shows on the rows of its groups, loaded or not itself.
  const groups = list.memberEvent(ev);
  if (!list.has(ev.wait_id)) return groups; // not loaded: ignored
  const w = list.get(ev.wait_id);
  if (!applyEvent(w, ev)) return false;
  list.changed(w.id);
  if (S.filters.status && w.status !== S.filters.status) list.remove(w.id);
  return list.isShown(w.id) || groups;
}

// ---------------------------------------------------------------------------
// Panels and routing

const detail = new DetailPanel($('detail-host'), {
  canWrite: () => S.canWrite,
  onClose: () => goList(),
  onWaitChanged: (w) => {
    if (list.has(w.id)) {
      list.merge(w);
      if (S.filters.status && w.status !== S.filters.status) list.remove(w.id);
      list.flush();
    }
  },
});

const create = new CreatePanel($('create-host'), {
  onCreated: (w) => {
    location.hash = `#/waits/${w.id}`;
  },
  onClose: () => goList(),
});

function goList() {
  if (location.hash && location.hash !== '#/' && location.hash !== '#') location.hash = '#/';
  else route();
}

/** Shows what location.hash names. */
function route() {
  if (!S.authMode) return; // after the token form
  const h = location.hash;
  const m = /^#\/waits\/([^/?#]+)$/.exec(h);
  document.body.classList.toggle('panel-open', !!m || h === '#/new');
  if (m) {
    create.close();
    let id;
    try {
      id = decodeURIComponent(m[1]);
    } catch {
      id = m[1];
    }
    if (isUuid(id)) {
      detail.open(id.toLowerCase());
      list.setSelected(id.toLowerCase());
    } else {
      detail.openInvalid(id);
      list.setSelected(null);
    }
  } else if (h === '#/new') {
    detail.close();
    list.setSelected(null);
    create.open();
  } else {
    detail.close();
    create.close();
    list.setSelected(null);
  }
}

// ---------------------------------------------------------------------------
// Start

function buildStatusFilter() {
  const sel = $('status-filter');
  sel.appendChild(el('option', { text: 'All statuses', props: { value: '' } }));
  for (const s of STATUSES) sel.appendChild(el('option', { text: `${STATUS_GLYPH[s]} ${s.replace('_', ' ')}`, props: { value: s } }));
}

async function boot() {
  buildStatusFilter();
  setStreamState('offline', { stopped: true });
  $('filters').addEventListener('submit', applyFilters);
  $('status-filter').addEventListener('change', () => applyFilters());
  $('clear-filters').addEventListener('click', clearFilters);
  $('load-more').addEventListener('click', () => loadMore());
  $('new-wait').addEventListener('click', () => { location.hash = '#/new'; });
  $('forget-token').addEventListener('click', forgetToken);
  window.addEventListener('hashchange', route);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && (detail.isOpen || create.isOpen) && !S.askingToken) goList();
  });
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden) refreshVisible();
  });
  setInterval(() => {
    const now = Date.now();
    list.tick(now);
    detail.tick(now);
  }, 1000);
  setInterval(() => {
    refreshVisible();
    if (detail.isOpen && detail.wait && detail.wait.status === 'running' && !document.hidden) detail.refresh();
  }, REFRESH_MS);
  updateFooter();

  await ensureAccess();
  route();
  await reload();
}

boot();
