// deliveries.js — a wait's webhooks in its detail view: each `notify` entry (its
// secret is never shown back), and each delivery with its status, attempts, next
// attempt and latest result, and Redeliver for one that has finished. Read from
// GET /waits/{id}/deliveries when the wait changes, and every few seconds while a
// delivery is pending; Redeliver is POST …/deliveries/{delivery}/retry.
//
// Everything from the server is rendered as text through el() (see common.js).

import { el, clear, fmtDateTime } from './common.js';
import { api, ApiError } from './api.js';

/** How often pending deliveries are read again while the view is open. */
const PENDING_EVERY = 2000;

export class DeliveriesView {
  constructor() {
    this.section = el('section', { class: 'block', data: { testid: 'deliveries' }, props: { hidden: true } },
      el('h3', { text: 'Webhooks' }),
      (this.hooks = el('ul', { class: 'hooks' })),
      (this.note = el('p', { class: 'muted small', attrs: { role: 'status', 'aria-live': 'polite' } })),
      el('div', { class: 'deliveries-scroll' },
        (this.table = el('table', { class: 'deliveries' },
          el('thead', {}, el('tr', {}, ...['Event', 'Webhook', 'Status', 'Attempts', 'Next attempt', 'Last result', ''].map((t) => el('th', { text: t })))),
          (this.rows = el('tbody', {}))))));
    this.id = null;
    this.gen = 0;
    this.timer = 0;
    this.loading = false;
  }

  /** Shows wait `w`'s webhooks, and reads its deliveries if it has any. */
  show(w) {
    const notify = (w.spec && Array.isArray(w.spec.notify)) ? w.spec.notify : [];
    this.section.hidden = notify.length === 0;
    if (this.id !== w.id) {
      this.stop();
      this.id = w.id;
      clear(this.rows);
      this.note.textContent = 'Loading deliveries…';
    }
    clear(this.hooks);
    for (const n of notify) {
      const events = Array.isArray(n.events) && n.events.length ? n.events.join(', ') : 'ended';
      this.hooks.appendChild(el('li', {}, el('span', { class: 'mono', text: String(n.url) }), el('span', { class: 'muted small', text: ` on ${events}` })));
    }
    if (notify.length) this.load();
  }

  stop() {
    this.gen++;
    clearTimeout(this.timer);
    this.id = null;
  }

  async load() {
    if (this.loading) {
      this.again = true;
      return;
    }
    const gen = this.gen;
    this.loading = true;
    try {
      const page = await api.deliveries(this.id);
      if (gen !== this.gen) return;
      const items = Array.isArray(page.items) ? page.items : [];
      this.render(items);
      clearTimeout(this.timer);
      if (items.some((d) => d.status === 'pending')) this.timer = setTimeout(() => this.load(), PENDING_EVERY);
    } catch (e) {
      if (gen === this.gen && e.name !== 'AbortError') this.note.textContent = e instanceof ApiError ? e.detail : String(e);
    } finally {
      this.loading = false;
      if (this.again && gen === this.gen) {
        this.again = false;
        this.load();
      }
    }
  }

  render(items) {
    if (!this.redelivered) this.note.textContent = items.length ? '' : 'No deliveries yet: they are made when an event the webhooks name happens.';
    clear(this.rows);
    for (const d of items) {
      const last = Array.isArray(d.attempts) && d.attempts.length ? d.attempts[d.attempts.length - 1] : null;
      const result = last ? (last.status_code ? `HTTP ${last.status_code}` : String(last.error || '')) : '—';
      const status = d.status === 'dropped' && d.drop_reason ? `dropped (${d.drop_reason})` : d.status;
      const button = d.status === 'pending' ? null : el('button', {
        class: 'btn small',
        text: 'Redeliver',
        data: { testid: 'redeliver' },
        attrs: { type: 'button' },
        on: { click: (e) => this.redeliver(d, e.target) },
      });
      this.rows.appendChild(el('tr', { data: { testid: 'delivery', status: d.status, deliveryId: String(d.id) } },
        el('td', { class: 'mono', text: `${d.seq} ${d.kind}` }),
        el('td', { class: 'mono url', text: String(d.url), title: String(d.url) }),
        el('td', { data: { testid: 'delivery-status' }, text: status }),
        el('td', { class: 'num', data: { testid: 'delivery-attempts' }, text: String(d.attempts_total) }),
        el('td', { text: d.next_attempt_at ? fmtDateTime(d.next_attempt_at) : '—', title: d.next_attempt_at || '' }),
        el('td', { text: result, title: last ? `${fmtDateTime(last.at)}, ${last.duration_ms} ms` : '' }),
        el('td', {}, button)));
    }
  }

  async redeliver(d, button) {
    button.disabled = true;
    try {
      await api.redeliver(this.id, d.id);
      this.redelivered = true;
      this.note.textContent = `Delivery ${d.id} queued again.`;
    } catch (e) {
      this.redelivered = true;
      this.note.textContent = e instanceof ApiError ? e.detail : String(e);
    }
    this.load();
  }
}
