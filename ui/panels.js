// panels.js — the detail panel (the "new wait" form is create.js, the webhooks'
// deliveries deliveries.js):
//
//   * DetailPanel: one wait in full (reachable as #/waits/<id>): its fields, its
//     event timeline, its spec as waitd returns it (header values read <redacted>),
//     and Cancel with an in-page confirm step; a running callback wait also has
//     Approve and Reject (with an optional reason), which end it through
//     POST /waits/{id}/complete and /fail. A read-only token sees none of them. The timeline comes from the wait's own
//     stream (GET /waits/{id}/events?follow=true replays the history, then follows
//     live and ends after the terminal event), and the app also hands over events of
//     this wait from the global stream; both are merged by seq, so nothing shows twice.
//
// Everything from the server is rendered as text through el() (see common.js).

import {
  el, clear, append, statusBadge, setBadge, fmtDateTime, fmtTime, fmtLeft, fmtDuration,
  fmtNumber, prettyJson, applyEvent, TERMINAL, STATUS_GLYPH, TIME_ZONE, ms, waitLink, callbackOf,
} from './common.js';
import { api, authHeaders, readProblem, reportUnauthorized, ApiError } from './api.js';
import { EventStream } from './sse.js';
import { DeliveriesView } from './deliveries.js';

const KIND_GLYPH = { created: '✚', state: '→', retry: '↻' };
/** Most timeline entries kept in the DOM: the first (created) and the newest ones. */
const MAX_TIMELINE = 300;
/** How a running wait's last poll got its response, in words. */
const LAST_POLL = {
  sent: 'sent',
  shared: 'shared with waits sending the same request',
  not_modified: '304 Not Modified: the response before, again',
  paused: 'host paused: it asked for quiet, so nothing was sent',
};

// ===========================================================================
// Detail

export class DetailPanel {
  /**
   * @param {HTMLElement} host the panel's container (hidden when closed)
   * @param {{onClose: () => void, onWaitChanged: (wait) => void, canWrite: () => boolean | null}} hooks
   *   canWrite: whether the token may end waits (null while that is not known yet)
   */
  constructor(host, hooks) {
    this.host = host;
    this.hooks = hooks;
    this.id = null;
    this.wait = null;
    this.stream = null;
    this.gen = 0;
    this.refetchTimer = 0;
  }

  get isOpen() {
    return this.id !== null;
  }

  /** Opens the panel on wait `id` (a validated UUID). */
  open(id) {
    if (this.id === id) return;
    this.teardown();
    const gen = ++this.gen;
    this.id = id;
    this.wait = null;
    this.seen = new Set(); // every seq received (from either stream)
    this.hiddenCount = 0; // older entries dropped from the DOM (MAX_TIMELINE)
    this.terminalSeen = false;
    this.actionMessage = null;
    this.actionsKey = null;
    this.renderQueued = false;
    this.build(id);
    this.host.hidden = false;
    this.load(gen);
  }

  /** Shows an error in place of a wait (e.g. a malformed id in the URL). */
  openInvalid(text) {
    this.teardown();
    this.gen++;
    this.id = '';
    this.build('');
    this.host.hidden = false;
    this.showProblem(`"${text}" is not a wait id (wait ids are UUIDs).`);
  }

  close() {
    if (this.id === null) return;
    this.teardown();
    this.host.hidden = true;
  }

  teardown() {
    this.gen++;
    if (this.deliveries) this.deliveries.stop();
    if (this.stream) this.stream.stop();
    this.stream = null;
    clearTimeout(this.refetchTimer);
    clear(this.host);
    this.id = null;
    this.wait = null;
  }

  async load(gen) {
    try {
      const w = await api.getWait(this.id);
      if (gen !== this.gen) return;
      this.setWait(w);
      this.startStream(gen);
    } catch (e) {
      if (gen !== this.gen || e.name === 'AbortError') return;
      this.showProblem(e instanceof ApiError ? e.detail : String(e));
    }
  }

  startStream(gen) {
    const id = this.id;
    this.stream = new EventStream({
      url: () => `/waits/${encodeURIComponent(id)}/events?follow=true`,
      headers: () => authHeaders(),
      lastEventId: null, // from the start: the stream replays the history first
      readProblem,
      isFinished: () => this.terminalSeen,
      onEvents: (events) => {
        if (gen !== this.gen) return;
        for (const raw of events) {
          let ev;
          try {
            ev = JSON.parse(raw.data);
          } catch {
            continue;
          }
          this.applyEvent(ev);
        }
      },
      onState: (state, info) => {
        if (gen === this.gen) this.setLive(state, info);
      },
      onUnauthorized: (problem) => reportUnauthorized(problem),
      onFatal: (err) => {
        if (gen === this.gen) this.r.live.textContent = `stream stopped: ${err.message}`;
      },
    });
    this.stream.start();
  }

  setLive(state, info) {
    const live = this.r.live;
    live.dataset.state = state;
    if (info.finished) live.textContent = 'complete';
    else if (state === 'connected') live.textContent = 'live';
    else if (state === 'reconnecting') live.textContent = `reconnecting (attempt ${info.attempt})`;
    else live.textContent = info.stopped ? '' : `offline (attempt ${info.attempt})`;
  }

  /** An event of this wait, from either stream (duplicates are dropped by seq). */
  applyEvent(ev) {
    if (!this.id || ev.wait_id !== this.id) return;
    if (this.seen.has(ev.seq)) return;
    this.seen.add(ev.seq);
    this.addTimelineItem(ev);
    if (TERMINAL.has(ev.kind)) this.terminalSeen = true;
    if (this.wait) {
      if (applyEvent(this.wait, ev, { countRetries: false })) this.queueRender();
      // The counters (polls, retries) are not in events: read them again shortly.
      if (this.wait.status === 'running' || TERMINAL.has(ev.kind)) this.scheduleRefetch(600);
    }
  }

  /**
   * An event of any wait (from the list's stream): the end of a member of the
   * group shown here changes its member list at once.
   */
  memberEvent(ev) {
    const w = this.wait;
    if (!w || !Array.isArray(w.members) || !TERMINAL.has(ev.kind)) return;
    const m = w.members.find((x) => x.id === ev.wait_id);
    if (!m || TERMINAL.has(m.status)) return;
    m.status = ev.kind;
    this.queueRender();
  }

  /** Renders once after a batch of events (a replayed history is one batch). */
  queueRender() {
    if (this.renderQueued) return;
    this.renderQueued = true;
    const gen = this.gen;
    queueMicrotask(() => {
      this.renderQueued = false;
      if (gen === this.gen && this.wait) this.renderWait();
    });
  }

  scheduleRefetch(delay) {
    clearTimeout(this.refetchTimer);
    const gen = this.gen;
    this.refetchTimer = setTimeout(() => this.refresh(gen), delay);
  }

  /** Reads the wait again (the app calls it every ~10 s while it runs). */
  async refresh(gen = this.gen) {
    if (!this.id || !this.wait) return;
    try {
      const w = await api.getWait(this.id);
      if (gen === this.gen) this.updateWait(w);
    } catch {
      /* the next refresh will try again; a 401 is handled by the api layer */
    }
  }

  /** A fresher copy of this wait (refresh, list refresh, cancel). */
  updateWait(w) {
    if (!this.id || !w || w.id !== this.id) return;
    if (!this.wait) return this.setWait(w);
    const older = ms(w.updated_at) < ms(this.wait.updated_at);
    const reopen = this.wait.status !== 'running' && w.status === 'running';
    if (older || reopen) return;
    this.wait = w;
    this.renderWait();
  }

  setWait(w) {
    this.wait = w;
    this.r.spec.textContent = prettyJson(w.spec);
    this.renderWait();
  }

  // ---- rendering ----------------------------------------------------------

  build(id) {
    const r = {};
    this.r = r;
    this.fieldRows = null;
    const root = el(
      'section',
      { class: 'panel detail', data: { testid: 'wait-detail', waitId: id }, attrs: { 'aria-label': 'Wait detail' } },
      el(
        'header',
        { class: 'panel-head' },
        el('div', { class: 'panel-title' }, el('h2', { text: 'Wait' }), (r.id = el('span', { class: 'mono full-id', text: id }))),
        el('button', {
          class: 'btn icon',
          text: '✕',
          title: 'Close (Esc)',
          data: { testid: 'close-detail' },
          attrs: { type: 'button', 'aria-label': 'Close detail' },
          on: { click: () => this.hooks.onClose() },
        }),
      ),
      (r.body = el(
        'div',
        { class: 'panel-body' },
        (r.problem = el('div', { class: 'notice error', attrs: { role: 'alert' }, props: { hidden: true } })),
        (r.head = el(
          'div',
          { class: 'detail-head' },
          (r.status = el('span', { class: 'badge st-unknown', data: { testid: 'detail-status', status: '' }, text: 'loading…' })),
          (r.reason = el('p', { class: 'reason' })),
        )),
        (r.actions = el('div', { class: 'actions' })),
        (r.fields = el('dl', { class: 'fields' })),
        (r.errorSection = el(
          'section',
          { class: 'block', props: { hidden: true } },
          el('h3', { text: 'Error detail' }),
          (r.errorDetail = el('pre', { class: 'json' })),
        )),
        el(
          'section',
          { class: 'block' },
          el('h3', {}, 'Timeline ', (r.live = el('span', { class: 'live', data: { state: 'offline' } }))),
          // "Loading events…" at first, then how many older entries are not shown.
          (r.timelineEmpty = el('p', { class: 'muted small timeline-note', text: 'Loading events…' })),
          (r.timeline = el('ol', { class: 'timeline', data: { testid: 'timeline' } })),
        ),
        (this.deliveries = new DeliveriesView()).section,
        el(
          'section',
          { class: 'block' },
          el('h3', { text: 'Spec' }),
          el('p', { class: 'muted small', text: 'The normalised request as waitd stores it; target header values are write-only and read <redacted>.' }),
          (r.spec = el('pre', { class: 'json', data: { testid: 'detail-spec' } })),
        ),
      )),
    );
    clear(this.host).appendChild(root);
    this.root = root;
  }

  showProblem(text) {
    this.r.problem.textContent = text;
    this.r.problem.hidden = false;
    this.r.head.hidden = true;
    this.r.body.querySelectorAll('.block, .fields, .actions').forEach((n) => { n.hidden = true; });
  }

  renderWait() {
    const w = this.wait;
    const r = this.r;
    if (r.status.textContent === 'loading…') {
      const badge = statusBadge(w.status, { data: { testid: 'detail-status', status: w.status } });
      r.status.replaceWith(badge);
      r.status = badge;
    } else {
      setBadge(r.status, w.status);
    }
    const running = callbackOf(w)
      ? 'Waiting for a POST to its callback URL, or for an approval.'
      : 'Polling the target.';
    r.reason.textContent = w.reason || (w.status === 'running' ? running : '');
    // Rebuilt only when they change, so an event does not undo an open confirm step.
    if (this.actionsKeyOf(w) !== this.actionsKey) this.renderActions();
    this.renderFields(Date.now());
    this.deliveries.show(w);
    const hasDetail = w.error_detail !== null && w.error_detail !== undefined;
    r.errorSection.hidden = !hasDetail;
    if (hasDetail) r.errorDetail.textContent = prettyJson(w.error_detail);
  }

  /**
   * The field list. Rows are built once and a value is re-rendered only when it
   * changed, so events do not churn the DOM (or stale a selection or a test's handle).
   */
  renderFields(now) {
    const w = this.wait;
    if (!w) return;
    const time = (iso) => el('time', { text: fmtDateTime(iso), title: iso || '', attrs: { datetime: iso || null } });
    const running = w.status === 'running';
    const url = w.spec && w.spec.target && w.spec.target.url;
    const cb = callbackOf(w);
    const heartbeat = cb && typeof cb.heartbeat === 'string' ? cb.heartbeat : null;
    const labels = Object.entries(w.labels || {});
    // [key, label, shown, signature, build()]
    const rows = [
      ['id', 'Id', true, w.id, () => el('span', { class: 'mono', text: w.id })],
      ['state', 'State', true, w.state, () => (w.state === null || w.state === undefined
        ? el('span', { class: 'muted', text: 'not read yet' })
        : el('span', { class: 'mono', text: w.state }))],
      ['last_error', 'Last error', !!w.last_error, w.last_error, () => el('span', { class: 'mono error-text', text: String(w.last_error) })],
      ['polls', 'Polls', true, w.polls, () => fmtNumber(w.polls)],
      ['last_poll', 'Last poll', running && !!w.last_poll, w.last_poll, () => el('span', {
        class: w.last_poll === 'paused' ? 'error-text' : '',
        data: { testid: 'last-poll', lastPoll: w.last_poll },
        text: LAST_POLL[w.last_poll] || String(w.last_poll),
      })],
      ['retries', 'Retries', true, w.retries, () => fmtNumber(w.retries)],
      ['target', 'Target', !!url, url, () => el('span', { class: 'mono break', text: String(url) })],
      // A callback wait: no target; a POST ends it.
      ['callback', 'Target', !!cb, 'callback', () => el('span', {
        data: { testid: 'detail-callback' },
        text: 'callback: a POST to its callback URL (which only its creator has), or Approve or Reject here, ends it',
      })],
      ['heartbeat', 'Heartbeat', !!heartbeat, heartbeat, () => [
        el('span', { class: 'mono', data: { testid: 'detail-heartbeat' }, text: String(heartbeat) }),
        el('span', { class: 'muted', text: ': silence that long at its callback URL fails it' }),
      ]],
      // A group: its members as they stand, each linking to its own page.
      ['members', w.mode === 'any' ? 'Any of' : 'All of', Array.isArray(w.members), JSON.stringify(w.members || []),
        () => el('ul', { class: 'members', data: { testid: 'group-members' } }, (w.members || []).map((m) => el('li', {},
          waitLink(m.id, String(m.id), 'mono'), ' ',
          statusBadge(m.status, { data: { testid: 'member-status', status: m.status } }),
          m.required === false ? el('span', { class: 'muted small', text: ' optional' }) : null)))],
      // A member: the group it belongs to.
      ['group', 'Group', !!w.group, w.group, () => {
        const a = waitLink(w.group, String(w.group), 'mono');
        a.dataset.testid = 'member-group';
        return a;
      }],
      ['labels', 'Labels', true, JSON.stringify(labels), () => (labels.length
        ? el('span', { class: 'chips' }, labels.map(([k, v]) => [el('span', { class: 'chip' }, el('span', { class: 'chip-k', text: k }), el('span', { class: 'chip-sep', text: ':' }), el('span', { class: 'chip-v', text: v })), ' ']))
        : el('span', { class: 'muted', text: 'none' }))],
      ['created', 'Created', true, w.created_at, () => time(w.created_at)],
      ['updated', 'Updated', true, w.updated_at, () => time(w.updated_at)],
      ['deadline', 'Deadline', true, `${w.deadline}|${running}`, () => [time(w.deadline), running ? ' · ' : null, running ? (this.r.countdown = el('span', { class: 'countdown' })) : null]],
      ['next_poll', 'Next poll', running && !cb, w.next_poll_at, () => time(w.next_poll_at)],
      ['finished', 'Finished', !!w.finished_at, w.finished_at, () => [time(w.finished_at), ` · after ${fmtDuration(ms(w.finished_at) - ms(w.created_at))}`]],
      ['tz', 'Times', true, TIME_ZONE, () => `in ${TIME_ZONE}`],
    ];
    if (!this.fieldRows) {
      this.fieldRows = new Map();
      const f = clear(this.r.fields);
      for (const [key, label] of rows) {
        const dt = el('dt', { text: label, class: key === 'tz' ? 'muted small' : '' });
        const dd = el('dd', { data: { field: key }, class: key === 'tz' ? 'muted small' : '' });
        append(f, [dt, dd]);
        this.fieldRows.set(key, { dt, dd, sig: undefined });
      }
    }
    for (const [key, , shown, sig, build] of rows) {
      const slot = this.fieldRows.get(key);
      slot.dt.hidden = !shown;
      slot.dd.hidden = !shown;
      if (!shown || slot.sig === String(sig)) continue;
      slot.sig = String(sig);
      if (key === 'deadline') this.r.countdown = null;
      append(clear(slot.dd), [build()]);
    }
    this.tick(now);
  }

  /** What the actions depend on: rebuilt only when it changes. */
  actionsKeyOf(w) {
    const canWrite = this.hooks.canWrite ? this.hooks.canWrite() : true;
    return `${w.status === 'running'}|${canWrite}|${this.actionMessage ? this.actionMessage.text : ''}`;
  }

  /** The token's access became known: show or hide the actions. */
  accessChanged() {
    if (this.wait) this.renderActions();
  }

  renderActions() {
    const w = this.wait;
    this.actionsKey = this.actionsKeyOf(w);
    const a = clear(this.r.actions);
    const result = el('p', { class: 'cancel-result', data: { testid: 'action-result' }, attrs: { role: 'status' } });
    if (this.actionMessage) {
      result.textContent = this.actionMessage.text;
      result.classList.toggle('error-text', this.actionMessage.error);
    }
    // A read-only token (or one whose access is not known yet) sees no buttons.
    const canWrite = this.hooks.canWrite ? this.hooks.canWrite() : true;
    if (w.status !== 'running' || canWrite !== true) {
      a.appendChild(result);
      return;
    }
    const buttons = [];
    if (callbackOf(w)) buttons.push(...this.approvalControls(result));
    buttons.push(...this.cancelControls(result));
    append(a, [...buttons, result]);
  }

  /** Approve, and Reject with a confirm step that asks for an optional reason. */
  approvalControls(result) {
    const approveBtn = el('button', {
      class: 'btn approve',
      text: '✔ Approve',
      title: 'End this wait succeeded (POST /waits/{id}/complete)',
      data: { testid: 'approve-wait' },
      attrs: { type: 'button' },
      on: { click: () => this.doEnd('complete', { approved: true }, [approveBtn, rejectBtn], result) },
    });
    const rejectBtn = el('button', {
      class: 'btn danger-outline',
      text: '✖ Reject…',
      data: { testid: 'reject-wait' },
      attrs: { type: 'button' },
      on: {
        click: () => {
          confirm.hidden = false;
          rejectBtn.hidden = true;
          approveBtn.disabled = true;
          reason.focus();
        },
      },
    });
    const reason = el('input', {
      class: 'input',
      data: { testid: 'reject-reason' },
      attrs: { type: 'text', maxlength: '2000', placeholder: 'Reason (optional)', 'aria-label': 'Reason for rejecting (optional)' },
    });
    const confirmBtn = el('button', {
      class: 'btn danger',
      text: 'Reject it',
      data: { testid: 'confirm-reject' },
      attrs: { type: 'submit' },
    });
    const keepBtn = el('button', {
      class: 'btn',
      text: 'Keep waiting',
      data: { testid: 'keep-wait-reject' },
      attrs: { type: 'button' },
      on: {
        click: () => {
          confirm.hidden = true;
          rejectBtn.hidden = false;
          approveBtn.disabled = false;
        },
      },
    });
    const confirm = el('form', {
      class: 'confirm',
      props: { hidden: true },
      attrs: { 'aria-label': 'Confirm reject', novalidate: true },
      on: {
        submit: (e) => {
          e.preventDefault();
          const text = reason.value.trim();
          this.doEnd('fail', text ? { reason: text } : undefined, [confirmBtn, keepBtn, reason], result);
        },
      },
    }, el('span', { text: 'End this wait as failed? ' }), reason, confirmBtn, keepBtn);
    return [approveBtn, rejectBtn, confirm];
  }

  cancelControls(result) {
    const confirm = el('div', { class: 'confirm', props: { hidden: true }, attrs: { role: 'group', 'aria-label': 'Confirm cancel' } });
    const cancelBtn = el('button', {
      class: 'btn danger-outline',
      text: 'Cancel wait…',
      data: { testid: 'cancel-wait' },
      attrs: { type: 'button' },
      on: {
        click: () => {
          confirm.hidden = false;
          cancelBtn.hidden = true;
          confirmBtn.focus();
        },
      },
    });
    const confirmBtn = el('button', {
      class: 'btn danger',
      text: 'Yes, cancel it',
      data: { testid: 'confirm-cancel' },
      attrs: { type: 'button' },
      on: { click: () => this.doCancel(confirmBtn, keepBtn, result) },
    });
    const keepBtn = el('button', {
      class: 'btn',
      text: 'Keep waiting',
      data: { testid: 'keep-wait' },
      attrs: { type: 'button' },
      on: {
        click: () => {
          confirm.hidden = true;
          cancelBtn.hidden = false;
        },
      },
    });
    append(confirm, [el('span', { text: 'Stop polling and end this wait as canceled? ' }), confirmBtn, keepBtn]);
    return [cancelBtn, confirm];
  }

  async doCancel(confirmBtn, keepBtn, result) {
    const id = this.id;
    const gen = this.gen;
    confirmBtn.disabled = true;
    keepBtn.disabled = true;
    result.textContent = 'Canceling…';
    try {
      const w = await api.cancelWait(id);
      if (gen !== this.gen) return;
      this.actionMessage = w.status === 'canceled'
        ? { text: `${STATUS_GLYPH.canceled} Canceled: ${w.reason || 'canceled by a client'}.`, error: false }
        : { text: `It had already ended as ${w.status}; nothing was changed.`, error: false };
      this.updateWait(w);
      this.renderActions();
      this.hooks.onWaitChanged(w);
    } catch (e) {
      if (gen !== this.gen) return;
      this.actionMessage = { text: `Cancel failed: ${e instanceof ApiError ? e.detail : e}`, error: true };
      this.renderActions();
    }
  }

  /**
   * Approve (`complete`) or reject (`fail`) this callback wait. A 409 carries the
   * wait as it had ended: the view shows that end.
   */
  async doEnd(route, body, controls, result) {
    const id = this.id;
    const gen = this.gen;
    const verb = route === 'complete' ? 'Approve' : 'Reject';
    controls.forEach((c) => { c.disabled = true; });
    result.classList.remove('error-text');
    result.textContent = route === 'complete' ? 'Approving…' : 'Rejecting…';
    let w;
    let already = false;
    try {
      w = await (route === 'complete' ? api.completeWait(id, body) : api.failWait(id, body));
    } catch (e) {
      if (gen !== this.gen) return;
      const ended = e instanceof ApiError && e.status === 409 && e.problem && e.problem.id === id;
      if (!ended) {
        this.actionMessage = { text: `${verb} failed: ${e instanceof ApiError ? e.detail : e}`, error: true };
        this.renderActions();
        return;
      }
      w = e.problem;
      already = true;
    }
    if (gen !== this.gen) return;
    this.actionMessage = already
      ? { text: `It had already ended as ${w.status}${w.reason ? ` (${w.reason})` : ''}; nothing was changed.`, error: false }
      : { text: `${STATUS_GLYPH[w.status] || ''} ${route === 'complete' ? 'Approved' : 'Rejected'}: ${w.reason || w.status}.`, error: false };
    this.updateWait(w);
    this.renderActions();
    this.hooks.onWaitChanged(w);
  }

  /** A timeline entry, kept in seq order. */
  addTimelineItem(ev) {
    const known = TERMINAL.has(ev.kind) || ev.kind in KIND_GLYPH;
    const li = el('li', {
      class: `tl-item k-${known ? ev.kind : 'other'}`,
      data: { testid: 'timeline-item', kind: String(ev.kind), seq: String(ev.seq) },
    });
    const glyph = KIND_GLYPH[ev.kind] || STATUS_GLYPH[ev.kind] || '•';
    const base = this.wait ? ms(this.wait.created_at) : NaN;
    const rel = ms(ev.at) - base;
    append(li, [
      el('div', { class: 'tl-head' },
        el('span', { class: 'tl-glyph', text: glyph, attrs: { 'aria-hidden': 'true' } }),
        el('span', { class: 'tl-kind', text: String(ev.kind).replace('_', ' ') }),
        el('time', { class: 'tl-time', text: fmtTime(ev.at), title: `${fmtDateTime(ev.at)} (${TIME_ZONE})`, attrs: { datetime: ev.at } }),
        Number.isFinite(rel) ? el('span', { class: 'tl-rel muted', text: `+${fmtDuration(Math.max(0, rel))}` }) : null,
        el('span', { class: 'tl-seq muted', text: `#${ev.seq}` })),
      this.timelineBody(ev),
    ]);
    // Usually the newest: append; otherwise insert before the first greater seq.
    const list = this.r.timeline;
    let before = null;
    for (let n = list.lastElementChild; n; n = n.previousElementSibling) {
      if (Number(n.dataset.seq) > ev.seq) before = n;
      else break;
    }
    list.insertBefore(li, before);
    // Keep the DOM bounded for waits with very long histories (retrying for hours):
    // the first entry stays, the oldest after it go.
    while (list.childElementCount > MAX_TIMELINE) {
      list.removeChild(list.firstElementChild.nextElementSibling);
      this.hiddenCount++;
    }
    const note = this.r.timelineEmpty;
    note.hidden = this.hiddenCount === 0;
    note.textContent = `${fmtNumber(this.hiddenCount)} older event${this.hiddenCount === 1 ? '' : 's'} after the first are not shown (GET /waits/{id}/events has them all).`;
  }

  timelineBody(ev) {
    const body = el('div', { class: 'tl-body' });
    const mono = (t) => el('span', { class: 'mono', text: String(t) });
    switch (ev.kind) {
      case 'created':
        append(body, ['Deadline ', el('time', { text: fmtDateTime(ev.deadline), title: ev.deadline || '' })]);
        break;
      case 'state':
        append(body, [
          ev.from === null || ev.from === undefined ? el('span', { class: 'muted', text: '(nothing)' }) : mono(ev.from),
          el('span', { class: 'arrow', text: ' → ' }),
          ev.to === null || ev.to === undefined ? el('span', { class: 'muted', text: '(nothing)' }) : mono(ev.to),
        ]);
        break;
      case 'retry':
        append(body, [
          el('div', {}, `Attempt ${ev.attempt ?? '?'}; next try in `, mono(ev.delay ?? '?')),
          ev.error ? el('div', { class: 'mono error-text' }, String(ev.error)) : null,
        ]);
        break;
      default:
        if (TERMINAL.has(ev.kind)) {
          append(body, [
            ev.reason ? el('div', { class: 'tl-reason', text: String(ev.reason) }) : null,
            'state' in ev ? el('div', {}, 'State: ', ev.state === null ? el('span', { class: 'muted', text: '(nothing)' }) : mono(ev.state)) : null,
            ev.last_error ? el('div', {}, 'Last error: ', el('span', { class: 'mono error-text', text: String(ev.last_error) })) : null,
            ev.error_detail !== undefined && ev.error_detail !== null
              ? el('div', {}, el('div', { class: 'muted small', text: 'error_detail' }), el('pre', { class: 'json', text: prettyJson(ev.error_detail) }))
              : null,
          ]);
        } else {
          const { id, seq, wait_id, kind, at, ...rest } = ev;
          body.appendChild(el('pre', { class: 'json', text: prettyJson(rest) }));
        }
    }
    return body;
  }

  /** Called every second: the deadline countdown. */
  tick(now) {
    const w = this.wait;
    if (!w || !this.r.countdown) return;
    if (w.status === 'running') {
      const t = fmtLeft(w.deadline, now);
      this.r.countdown.textContent = t.startsWith('overdue') ? t : `${t} left`;
    }
  }
}

// ===========================================================================
// Create
