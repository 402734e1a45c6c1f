// list.js — the list of waits: a model (Map by id + newest-first order) and a
// windowed view of it.
//
// Only the rows in (or near) the scrolled viewport exist in the DOM: rows are
// absolutely positioned inside a spacer as tall as the whole list, and recycled as
// the user scrolls, so 5,000 or 50,000 loaded waits cost the same few dozen rows.
// Applying an event is O(1): find the wait in the Map, change it, and refresh its row
// if that row is on screen. Structural changes (waits inserted at the top, waits that
// leave a filtered view) are batched: the caller marks them and calls flush() once
// per batch of events, which compacts the order array once and re-renders the window.

import {
  el, clear, statusBadge, setBadge, statusKey, shortId, targetText, callbackOf, waitHref, fmtAge, fmtLeft,
  fmtDateTime, fmtNumber, fmtCoarse, labelsText, TIME_ZONE, ms, STATUS_GLYPH, TERMINAL,
} from './common.js';

/** Row height in px; the CSS reads it from --row-h, which the list sets from here. */
export const ROW_H = 44;
/** Rows rendered above and below the visible ones. */
const OVERSCAN = 8;
/** Ask for the next page when the window gets this close to the end. */
const NEAR_END = 60;

export class WaitList {
  /**
   * @param {HTMLElement} viewport the scrolling element (rows go inside it)
   * @param {{onOpen: (id) => void, onNearEnd: () => void, onCount: (n) => void}} hooks
   */
  constructor(viewport, hooks) {
    this.viewport = viewport;
    this.hooks = hooks;
    this.waits = new Map(); // id -> Wait (the loaded waits)
    this.order = []; // ids, newest first
    this.removed = new Set(); // ids leaving the view at the next flush()
    this.groupsOf = new Map(); // member id -> Set of the loaded groups that name it
    this.rendered = new Map(); // id -> row element currently in the DOM
    this.pool = []; // detached rows to reuse
    this.selected = null;
    this.frame = 0;
    this.lastCount = -1;
    viewport.style.setProperty('--row-h', `${ROW_H}px`);
    this.spacer = el('div', { class: 'list-spacer', attrs: { role: 'presentation' } });
    viewport.appendChild(this.spacer);
    viewport.addEventListener('scroll', () => this.schedule(), { passive: true });
    new ResizeObserver(() => this.schedule()).observe(viewport);
    // One listener for every row (rows are recycled).
    viewport.addEventListener('click', (e) => {
      const row = e.target.closest('[data-testid="wait-row"]');
      if (!row || e.target.closest('a')) return; // the id link navigates by itself
      this.hooks.onOpen(row.dataset.waitId);
    });
    viewport.addEventListener('keydown', (e) => {
      if (e.key !== 'Enter' && e.key !== ' ') return;
      const row = e.target.closest('[data-testid="wait-row"]');
      if (!row || e.target.closest('a')) return;
      e.preventDefault();
      this.hooks.onOpen(row.dataset.waitId);
    });
  }

  get size() {
    return this.order.length;
  }
  has(id) {
    return this.waits.has(id) && !this.removed.has(id);
  }
  get(id) {
    return this.waits.get(id);
  }

  /** Forgets every wait (a filter change, a new token). */
  reset() {
    this.waits.clear();
    this.groupsOf.clear();
    this.order = [];
    this.removed.clear();
    for (const row of this.rendered.values()) this.recycle(row);
    this.rendered.clear();
    this.viewport.scrollTop = 0;
    this.render();
  }

  /** Adds waits at the end (the next page), skipping known ones. */
  append(items) {
    for (const w of items) {
      if (this.waits.has(w.id)) continue;
      this.waits.set(w.id, w);
      this.indexGroup(w);
      this.order.push(w.id);
    }
    this.render();
  }

  /** Adds waits at the top (newly created), newest first; keeps the scrolled view still. */
  prepend(items) {
    const fresh = items.filter((w) => !this.waits.has(w.id));
    if (!fresh.length) return;
    for (const w of fresh) {
      this.waits.set(w.id, w);
      this.indexGroup(w);
    }
    this.order = fresh.map((w) => w.id).concat(this.order);
    if (this.viewport.scrollTop > 0) this.viewport.scrollTop += fresh.length * ROW_H;
    this.structural = true;
  }

  /** Inserts waits just before `anchorId` (found by a refresh of the visible page). */
  insertBefore(anchorId, items) {
    const fresh = items.filter((w) => !this.waits.has(w.id));
    const at = this.order.indexOf(anchorId);
    if (!fresh.length || at < 0) return;
    for (const w of fresh) {
      this.waits.set(w.id, w);
      this.indexGroup(w);
    }
    this.order.splice(at, 0, ...fresh.map((w) => w.id));
    if (at < this.firstVisible()) this.viewport.scrollTop += fresh.length * ROW_H;
    this.structural = true;
  }

  /**
   * Takes a fresher copy of a loaded wait (from a refresh). An older copy than what
   * events already told us (updated_at) only contributes its counters, and a wait
   * that ended is never shown running again.
   */
  merge(item) {
    const w = this.waits.get(item.id);
    if (!w) return false;
    const newer = ms(item.updated_at) >= ms(w.updated_at);
    if (newer && !(w.status !== 'running' && item.status === 'running')) {
      Object.assign(w, item);
    } else {
      w.polls = Math.max(w.polls || 0, item.polls || 0);
      w.retries = Math.max(w.retries || 0, item.retries || 0);
      // How the last poll came is only in the live read: it is never behind.
      if ('last_poll' in item) w.last_poll = item.last_poll;
    }
    this.changed(item.id);
    return true;
  }

  /** Notes which members a loaded group names, so their ends reach its row. */
  indexGroup(w) {
    if (!Array.isArray(w.members)) return;
    for (const m of w.members) {
      if (!m || typeof m.id !== 'string') continue;
      let groups = this.groupsOf.get(m.id);
      if (!groups) this.groupsOf.set(m.id, (groups = new Set()));
      groups.add(w.id);
    }
  }

  unindexGroup(w) {
    if (!w || !Array.isArray(w.members)) return;
    for (const m of w.members) {
      const groups = m && this.groupsOf.get(m.id);
      if (!groups) continue;
      groups.delete(w.id);
      if (!groups.size) this.groupsOf.delete(m.id);
    }
  }

  /**
   * An event of any wait: when it ends a member of loaded groups, their member
   * lists say so (a group's own events say only how far it is). Returns whether a
   * row on screen changed. O(groups naming it).
   */
  memberEvent(ev) {
    if (!TERMINAL.has(ev.kind)) return false;
    const groups = this.groupsOf.get(ev.wait_id);
    if (!groups) return false;
    let shown = false;
    for (const gid of groups) {
      const g = this.waits.get(gid);
      const m = g && g.members.find((x) => x.id === ev.wait_id);
      if (!m || TERMINAL.has(m.status)) continue; // a member ends once
      m.status = ev.kind;
      this.changed(gid);
      shown = this.isShown(gid) || shown;
    }
    return shown;
  }

  /** Whether the wait's row is in the DOM (on screen or just around it). */
  isShown(id) {
    return this.rendered.has(id);
  }

  /** The wait's data changed: refresh its row if it is on screen. O(1). */
  changed(id) {
    const row = this.rendered.get(id);
    const w = this.waits.get(id);
    if (row && w) this.fill(row, w, Date.now());
  }

  /** The wait leaves the view at the next flush() (e.g. it ended in a running view). */
  remove(id) {
    if (this.waits.has(id)) this.removed.add(id);
  }

  /** Applies batched structural changes and re-renders the window once. */
  flush() {
    if (this.removed.size) {
      const first = this.firstVisible();
      let above = 0;
      const keep = [];
      for (let i = 0; i < this.order.length; i++) {
        const id = this.order[i];
        if (this.removed.has(id)) {
          if (i < first) above++;
          this.unindexGroup(this.waits.get(id));
          this.waits.delete(id);
        } else keep.push(id);
      }
      this.order = keep;
      this.removed.clear();
      if (above) this.viewport.scrollTop -= above * ROW_H;
      this.structural = true;
    }
    if (this.structural) {
      this.structural = false;
      this.render();
    }
  }

  /** Marks the row of the wait shown in the detail panel. */
  setSelected(id) {
    this.selected = id;
    for (const [rid, row] of this.rendered) row.classList.toggle('selected', rid === id);
  }

  firstVisible() {
    return Math.floor(this.viewport.scrollTop / ROW_H);
  }

  /** The indices of the rows on screen (without overscan): [start, end). */
  visibleRange() {
    const start = Math.min(this.firstVisible(), Math.max(0, this.order.length - 1));
    const rows = Math.ceil(this.viewport.clientHeight / ROW_H) + 1;
    return { start: Math.max(0, start), end: Math.min(this.order.length, start + rows) };
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.render();
    });
  }

  /** Renders the rows of the window; reuses rows already there. */
  render() {
    const n = this.order.length;
    const height = `${n * ROW_H}px`;
    if (this.spacer.style.height !== height) this.spacer.style.height = height;
    const top = this.viewport.scrollTop;
    const start = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    const end = Math.min(n, Math.ceil((top + this.viewport.clientHeight) / ROW_H) + OVERSCAN);
    const want = new Set();
    for (let i = start; i < end; i++) want.add(this.order[i]);
    for (const [id, row] of this.rendered) {
      if (!want.has(id)) {
        this.rendered.delete(id);
        this.recycle(row);
      }
    }
    const now = Date.now();
    // Rows stay in the DOM in list order (newest first), as they are on screen; a
    // row moves only when its neighbours changed.
    let prev = null;
    for (let i = start; i < end; i++) {
      const id = this.order[i];
      const w = this.waits.get(id);
      if (!w) continue;
      let row = this.rendered.get(id);
      if (!row) {
        row = this.pool.pop() || this.createRow();
        this.fill(row, w, now);
        this.rendered.set(id, row);
      }
      const slot = prev ? prev.nextSibling : this.spacer.firstChild;
      if (row !== slot) this.spacer.insertBefore(row, slot);
      prev = row;
      if (row._index !== i) {
        row._index = i;
        row.style.transform = `translateY(${i * ROW_H}px)`;
        row.setAttribute('aria-rowindex', String(i + 2)); // +1: 1-based, +1: header row
      }
    }
    if (n !== this.lastCount) {
      this.lastCount = n;
      this.hooks.onCount(n);
    }
    if (n > 0 && end >= n - NEAR_END) this.hooks.onNearEnd();
  }

  recycle(row) {
    row.remove();
    row._index = -1;
    row._id = null;
    if (this.pool.length < 200) this.pool.push(row);
  }

  /** Builds an empty row; fill() gives it a wait. */
  createRow() {
    const c = {};
    const row = el(
      'div',
      { class: 'row', data: { testid: 'wait-row' }, attrs: { role: 'row', tabindex: '0' } },
      (c.status = el('div', { class: 'cell c-status', attrs: { role: 'cell' } }, (c.badge = statusBadge('running')))),
      (c.idCell = el('div', { class: 'cell c-id mono', attrs: { role: 'cell' } }, (c.link = el('a', { class: 'id-link' })))),
      (c.target = el('div', { class: 'cell c-target mono', attrs: { role: 'cell' } },
        (c.targetText = el('span', { class: 'target-text', data: { testid: 'wait-target' } })),
        // A group: one mark a member, in order, its status as glyph and colour.
        (c.members = el('span', { class: 'member-marks', data: { testid: 'row-members' }, props: { hidden: true } })),
        // A member: a link to its group.
        (c.group = el('a', { class: 'group-link', data: { testid: 'row-group' }, props: { hidden: true } })))),
      (c.state = el('div', { class: 'cell c-state mono', data: { testid: 'wait-state' }, attrs: { role: 'cell' } })),
      (c.labels = el('div', { class: 'cell c-labels', data: { testid: 'wait-labels' }, attrs: { role: 'cell' } })),
      (c.age = el('div', { class: 'cell c-age num', attrs: { role: 'cell' } })),
      (c.deadline = el('div', { class: 'cell c-deadline num', attrs: { role: 'cell' } })),
      (c.polls = el('div', { class: 'cell c-polls num', attrs: { role: 'cell' } })),
      (c.retries = el('div', { class: 'cell c-retries num', attrs: { role: 'cell' } })),
    );
    row._c = c;
    row._index = -1;
    return row;
  }

  /** Shows wait `w` in `row` (text only). */
  fill(row, w, now) {
    const c = row._c;
    if (row._id !== w.id) {
      row._id = w.id;
      row.dataset.waitId = w.id;
      const href = waitHref(w.id);
      if (href) c.link.setAttribute('href', href);
      else c.link.removeAttribute('href');
      c.link.textContent = shortId(w.id);
      c.link.title = w.id;
      c.targetText.textContent = targetText(w);
      const cb = callbackOf(w);
      c.targetText.classList.toggle('callback-target', !!cb);
      c.targetText.dataset.kind = cb ? 'callback' : '';
      c.target.title = cb
        ? 'A callback wait: a POST to its callback URL, or Approve or Reject in its detail, ends it'
        : (w.spec && w.spec.target && w.spec.target.url) || '';
      this.fillLabels(c.labels, w.labels);
      const group = typeof w.group === 'string' ? waitHref(w.group) : null;
      c.group.hidden = !group;
      if (group) {
        c.group.setAttribute('href', group);
        c.group.textContent = '↳ group';
        c.group.title = `a member of group ${w.group}`;
        c.group.dataset.group = w.group;
      } else c.group.removeAttribute('href');
    }
    this.fillMembers(c, w);
    row.classList.toggle('selected', w.id === this.selected);
    if (row.dataset.status !== w.status) {
      row.dataset.status = w.status;
      setBadge(c.badge, w.status);
    }
    c.badge.title = w.reason || w.status;
    const state = w.state ?? '';
    if (c.state.textContent !== state) c.state.textContent = state;
    c.state.title = state;
    // A host that asked for quiet: its waits send nothing until it lets go.
    const paused = w.status === 'running' && w.last_poll === 'paused';
    row.dataset.lastPoll = (w.status === 'running' && w.last_poll) || '';
    c.state.classList.toggle('host-paused', paused);
    if (paused) c.state.title = `${state}${state ? ' · ' : ''}host paused: it asked for quiet, so nothing is sent to it for now`;
    c.polls.textContent = fmtNumber(w.polls);
    c.retries.textContent = fmtNumber(w.retries);
    c.retries.title = w.last_error ? `last error: ${w.last_error}` : '';
    c.retries.classList.toggle('has-error', !!w.last_error && w.status === 'running');
    c.age.title = `created ${fmtDateTime(w.created_at)} (${TIME_ZONE})`;
    this.fillTimes(row, w, now);
  }

  /** A group's members as marks, rebuilt only when one of them changed. */
  fillMembers(c, w) {
    const members = Array.isArray(w.members) ? w.members : null;
    const key = members ? members.map((m) => `${m.id}:${m.status}`).join(',') : '';
    if (c.members._key === key) return;
    c.members._key = key;
    clear(c.members);
    c.members.hidden = !members;
    if (!members) return;
    const ended = members.filter((m) => m.status !== 'running').length;
    c.target.title = `${w.mode} of ${members.length} waits, ${ended} ended:\n${members
      .map((m) => `${m.id} ${m.status}${m.required === false ? ' (optional)' : ''}`)
      .join('\n')}`;
    for (const m of members) {
      const status = String(m.status);
      c.members.appendChild(el('span', {
        class: `member-mark st-${statusKey(status)}`,
        data: { testid: 'row-member', memberId: String(m.id), status },
        text: STATUS_GLYPH[status] || '?',
        attrs: { title: `${m.id} ${status}` },
      }));
    }
  }

  fillLabels(cell, labels) {
    clear(cell);
    const entries = Object.entries(labels || {});
    cell.title = labelsText(labels);
    for (const [k, v] of entries) {
      if (cell.firstChild) cell.appendChild(document.createTextNode(' '));
      cell.appendChild(el('span', { class: 'chip' }, el('span', { class: 'chip-k', text: k }), el('span', { class: 'chip-sep', text: ':' }), el('span', { class: 'chip-v', text: v })));
    }
  }

  /** The two live columns: age and time to deadline. */
  fillTimes(row, w, now) {
    const c = row._c;
    const age = fmtAge(w.created_at, now);
    if (c.age.textContent !== age) c.age.textContent = age;
    let text;
    if (w.status === 'running') {
      text = fmtLeft(w.deadline, now);
      c.deadline.title = `deadline ${fmtDateTime(w.deadline)} (${TIME_ZONE})`;
    } else {
      text = w.finished_at ? `ended ${fmtCoarse(now - ms(w.finished_at))} ago` : 'ended';
      c.deadline.title = w.finished_at ? `finished ${fmtDateTime(w.finished_at)} (${TIME_ZONE})` : '';
    }
    if (c.deadline.textContent !== text) c.deadline.textContent = text;
    c.deadline.classList.toggle('muted', w.status !== 'running');
    c.deadline.classList.toggle('urgent', w.status === 'running' && ms(w.deadline) - now < 60000);
  }

  /** Called every second: updates ages and countdowns of the rows on screen only. */
  tick(now) {
    for (const [id, row] of this.rendered) {
      const w = this.waits.get(id);
      if (w) this.fillTimes(row, w, now);
    }
  }
}
