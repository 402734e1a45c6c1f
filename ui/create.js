// create.js — the "new wait" form: either a URL with a state path and its wanted
// and failing states, or conditions (CEL), or a preset from GET /presets with its
// parameters (required ones marked, defaults as placeholders); and optional labels,
// timeout and target headers. Problems are shown next to the fields they name.
//
// Everything from the server is rendered as text through el() (see common.js).

import { el, clear, append, parseLabelList } from './common.js';
import { api, ApiError } from './api.js';

/** The select's value for "no preset: a URL of my own". */
const OWN_URL = '';

function randomKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

export class CreatePanel {
  /**
   * @param {HTMLElement} host the panel's container (hidden when closed)
   * @param {{onCreated: (wait) => void, onClose: () => void}} hooks
   */
  constructor(host, hooks) {
    this.host = host;
    this.hooks = hooks;
    this.presets = null;
    this.built = false;
    this.pendingKey = null; // reused when a submit failed on the network (same body)
  }

  get isOpen() {
    return !this.host.hidden;
  }

  open() {
    if (!this.built) this.build();
    this.host.hidden = false;
    if (!this.presets) this.loadPresets();
    else this.r.select.focus();
  }

  close() {
    this.host.hidden = true;
  }

  /** Forgets the presets (another token may see other ones). */
  reset() {
    this.presets = null;
    this.built = false;
    clear(this.host);
  }

  build() {
    const r = {};
    this.r = r;
    r.form = el('form', {
      class: 'create-form',
      data: { testid: 'create-form' },
      attrs: { novalidate: true, autocomplete: 'off' },
      on: { submit: (e) => { e.preventDefault(); this.submit(); } },
    });
    r.select = el('select', {
      class: 'input',
      data: { testid: 'preset-select' },
      attrs: { id: 'preset-select', name: 'preset' },
      on: { change: () => this.renderParams() },
    }, el('option', { text: 'A URL of my own', props: { value: OWN_URL } }));
    r.presetError = el('p', { class: 'field-error', attrs: { role: 'alert' } });
    r.desc = el('p', { class: 'preset-desc muted small' });
    r.params = el('div', { class: 'params' });
    r.labels = el('textarea', {
      class: 'input mono',
      data: { testid: 'create-labels' },
      attrs: { id: 'create-labels', rows: '2', placeholder: 'pipeline:1234\nteam:infra', spellcheck: 'false' },
    });
    r.labelsError = el('p', { class: 'field-error', attrs: { role: 'alert' } });
    r.timeout = el('input', {
      class: 'input mono',
      data: { testid: 'create-timeout' },
      attrs: { id: 'create-timeout', type: 'text', placeholder: 'the preset’s own, e.g. 10m', spellcheck: 'false' },
    });
    r.timeoutError = el('p', { class: 'field-error', attrs: { role: 'alert' } });
    r.headers = el('textarea', {
      class: 'input mono',
      data: { testid: 'create-headers' },
      attrs: { id: 'create-headers', rows: '2', placeholder: 'Authorization: Bearer …', spellcheck: 'false' },
    });
    r.headersError = el('p', { class: 'field-error', attrs: { role: 'alert' } });
    r.errors = el('div', { class: 'create-errors', data: { testid: 'create-errors' }, attrs: { role: 'alert', 'aria-live': 'polite' } });
    r.submit = el('button', { class: 'btn primary', text: 'Create wait', data: { testid: 'create-submit' }, attrs: { type: 'submit' } });
    const field = (label, forId, input, help, error) =>
      el('div', { class: 'field' }, el('label', { text: label, attrs: { for: forId } }), input, help ? el('p', { class: 'help muted small', text: help }) : null, error);
    append(r.form, [
      field('What to wait for', 'preset-select', r.select, null, r.presetError),
      r.desc,
      r.params,
      el('details', { class: 'more' },
        el('summary', { text: 'Labels, timeout and target headers' }),
        field('Labels', 'create-labels', r.labels, 'One key:value a line; follow or filter waits by them.', r.labelsError),
        field('Timeout', 'create-timeout', r.timeout, 'A duration such as 30s, 10m or 2h; empty keeps the preset’s, or 10m.', r.timeoutError),
        field('Target headers', 'create-headers', r.headers, 'One “Name: value” a line, e.g. the target API’s token. Write-only: waitd never shows the values back.', r.headersError)),
      r.errors,
      el('div', { class: 'form-actions' }, r.submit,
        el('button', { class: 'btn', text: 'Close', data: { testid: 'close-create' }, attrs: { type: 'button' }, on: { click: () => this.hooks.onClose() } })),
    ]);
    const root = el('section', { class: 'panel create', attrs: { 'aria-label': 'New wait' } },
      el('header', { class: 'panel-head' },
        el('div', { class: 'panel-title' }, el('h2', { text: 'New wait' })),
        el('button', { class: 'btn icon', text: '✕', title: 'Close (Esc)', attrs: { type: 'button', 'aria-label': 'Close new wait' }, on: { click: () => this.hooks.onClose() } })),
      el('div', { class: 'panel-body' }, r.form));
    clear(this.host).appendChild(root);
    this.built = true;
    this.renderParams();
  }

  async loadPresets() {
    const r = this.r;
    try {
      const page = await api.presets();
      this.presets = Array.isArray(page.items) ? page.items : [];
      const chosen = r.select.value;
      clear(r.select);
      r.select.appendChild(el('option', { text: 'A URL of my own', props: { value: OWN_URL } }));
      for (const p of this.presets) r.select.appendChild(el('option', { text: `Preset: ${p.name}`, props: { value: String(p.name) } }));
      r.select.value = chosen;
      if (r.select.value !== chosen) this.renderParams();
      r.select.focus();
    } catch (e) {
      if (e.name === 'AbortError') return;
      this.showErrors(e instanceof ApiError ? e.detail : String(e), []);
    }
  }

  selectedPreset() {
    return (this.presets || []).find((p) => p.name === this.r.select.value) || null;
  }

  /** The fields of a wait on a URL of one's own, keyed by the request field each sets. */
  renderOwn() {
    const r = this.r;
    r.desc.textContent = 'Poll a URL until the value at a path is one of the wanted states, or until a condition holds.';
    const fields = [
      ['target.url', 'URL', 'https://api.example.com/servers/sv_1', 'The URL to GET; an internal address needs the operator’s WAITD_ALLOW_TARGETS.', true],
      ['state', 'State path', '/data/attributes/status', 'A JSON Pointer or JSONPath to the state in the answer.'],
      ['want', 'Wanted states', 'on', 'Comma-separated; the wait succeeds when the state is one of them.'],
      ['fail', 'Failing states', 'failed_deployment', 'Comma-separated; the wait fails at once when the state is one of them.'],
      ['success_condition', 'Success condition', 'status == 200 && body.ready', 'CEL over body, status, headers and state, instead of or besides the wanted states.'],
      ['failure_condition', 'Failure condition', 'status == 403', 'CEL: the wait fails as soon as it is true.'],
    ];
    for (const [name, label, example, help, required] of fields) {
      const id = `own-${name.replace('.', '-')}`;
      const input = el('input', {
        class: 'input mono',
        data: { testid: id },
        attrs: { id, type: 'text', name, placeholder: `e.g. ${example}`, spellcheck: 'false', 'aria-required': required ? 'true' : null },
      });
      const error = el('p', { class: 'field-error', attrs: { role: 'alert' } });
      this.paramInputs.set(name, input);
      this.paramErrors.set(name, error);
      r.params.appendChild(el('div', { class: 'field' },
        el('label', { attrs: { for: id } }, el('span', { text: label }), required ? el('span', { class: 'req', text: ' * required' }) : null),
        input, el('p', { class: 'help muted small', text: help }), error));
    }
  }

  /** The body of a wait on a URL of one's own, from its fields. */
  ownBody() {
    const value = (name) => this.paramInputs.get(name).value.trim();
    const list = (name) => value(name).split(',').map((x) => x.trim()).filter((x) => x);
    const body = { target: { url: value('target.url') } };
    if (value('state')) body.state = value('state');
    if (list('want').length) body.want = list('want');
    if (list('fail').length) body.fail = list('fail');
    for (const c of ['success_condition', 'failure_condition']) if (value(c)) body[c] = value(c);
    return body;
  }

  /** The inputs of the chosen preset's parameters (required ones first), or of a URL of one's own. */
  renderParams() {
    const r = this.r;
    const p = this.selectedPreset();
    clear(r.params);
    this.paramInputs = new Map();
    this.paramErrors = new Map();
    r.desc.textContent = p ? String(p.description || '') : '';
    this.clearErrors();
    if (r.select.value === OWN_URL) return this.renderOwn();
    if (!p) return;
    // params is an object {name: Param} (PresetSummary); accept an array too.
    const entries = Array.isArray(p.params)
      ? p.params.map((x) => [x.name, x])
      : Object.entries(p.params || {});
    entries.sort((a, b) => Number(!!b[1].required) - Number(!!a[1].required));
    if (!entries.length) r.params.appendChild(el('p', { class: 'muted small', text: 'This preset takes no parameters.' }));
    for (const [name, param] of entries) {
      const id = `param-${name}`;
      const required = !!param.required || param.default === undefined || param.default === null;
      const placeholder = param.default ? String(param.default) : param.example ? `e.g. ${param.example}` : '';
      const input = el('input', {
        class: 'input mono',
        data: { testid: `param-${name}` },
        attrs: { id, type: 'text', name, placeholder, spellcheck: 'false', 'aria-required': required ? 'true' : null },
      });
      const error = el('p', { class: 'field-error', attrs: { role: 'alert' } });
      this.paramInputs.set(name, input);
      this.paramErrors.set(name, error);
      const label = el('label', { attrs: { for: id } }, el('span', { class: 'mono', text: String(name) }),
        required ? el('span', { class: 'req', text: ' * required' }) : el('span', { class: 'muted small', text: ' optional' }),
        param.kind ? el('span', { class: 'kind', text: String(param.kind) }) : null);
      r.params.appendChild(el('div', { class: 'field' }, label, input,
        param.description ? el('p', { class: 'help muted small', text: String(param.description) }) : null,
        param.default ? el('p', { class: 'help muted small', text: `Default: ${param.default}` }) : null,
        error));
    }
  }

  clearErrors() {
    const r = this.r;
    clear(r.errors);
    for (const n of [r.presetError, r.labelsError, r.timeoutError, r.headersError, ...(this.paramErrors?.values() || [])]) n.textContent = '';
    r.form.querySelectorAll('.invalid').forEach((n) => n.classList.remove('invalid'));
  }

  /** Shows a problem: `detail` on top, each {field, message} next to its input. */
  showErrors(detail, errors) {
    const r = this.r;
    this.clearErrors();
    append(r.errors, [el('p', { class: 'notice error', text: detail })]);
    // One problem is usually already the detail sentence ("field message"): no list.
    const same = errors.length === 1 && `${errors[0].field || ''} ${errors[0].message || ''}`.trim() === String(detail).trim();
    if (errors.length && !same) {
      const ul = el('ul', { class: 'error-list' });
      for (const e of errors) ul.appendChild(el('li', {}, el('span', { class: 'mono', text: String(e.field || '(request)') }), ` ${e.message || ''}`));
      r.errors.appendChild(ul);
    }
    for (const e of errors) {
      const f = String(e.field || '');
      const msg = `${f} ${e.message || ''}`.trim();
      let target = null;
      let input = null;
      if (this.paramErrors.has(f)) {
        target = this.paramErrors.get(f);
        input = this.paramInputs.get(f);
      } else if (f.startsWith('params.') && this.paramErrors.has(f.slice(7))) {
        target = this.paramErrors.get(f.slice(7));
        input = this.paramInputs.get(f.slice(7));
      } else if (f === 'preset') [target, input] = [r.presetError, r.select];
      else if (f === 'labels' || f.startsWith('labels.')) [target, input] = [r.labelsError, r.labels];
      else if (f === 'timeout') [target, input] = [r.timeoutError, r.timeout];
      else if (f.startsWith('target.headers')) [target, input] = [r.headersError, r.headers];
      if (target) {
        target.textContent = target.textContent ? `${target.textContent}; ${msg}` : msg;
        input.classList.add('invalid');
        if (input.closest('details')) input.closest('details').open = true;
      }
    }
  }

  /** Reads "Name: value" / "key:value" lines into an object; throws on a bad line. */
  static lines(text, what, sep) {
    const out = {};
    text.split(/\r?\n/).forEach((line, i) => {
      if (!line.trim()) return;
      const at = line.indexOf(sep);
      if (at <= 0) throw new Error(`${what}, line ${i + 1}: write ${what === 'labels' ? 'key:value' : 'Name: value'}`);
      out[line.slice(0, at).trim()] = line.slice(at + 1).trim();
    });
    return out;
  }

  async submit() {
    const r = this.r;
    this.clearErrors();
    const preset = r.select.value;
    let body;
    if (preset === OWN_URL) {
      body = this.ownBody();
    } else {
      const params = {};
      for (const [name, input] of this.paramInputs) if (input.value.trim() !== '') params[name] = input.value.trim();
      body = { preset, params };
    }
    try {
      if (r.labels.value.trim()) {
        body.labels = Object.fromEntries(r.labels.value.split(/\r?\n/).filter((l) => l.trim()).flatMap((l) => parseLabelList(l)));
      }
    } catch (e) {
      r.labelsError.textContent = e.message;
      r.labels.classList.add('invalid');
      this.showErrors(`labels: ${e.message}`, []);
      return;
    }
    try {
      const headers = CreatePanel.lines(r.headers.value, 'target headers', ':');
      if (Object.keys(headers).length) body.target = { ...body.target, headers };
    } catch (e) {
      r.headersError.textContent = e.message;
      this.showErrors(e.message, []);
      return;
    }
    if (r.timeout.value.trim()) body.timeout = r.timeout.value.trim();

    const text = JSON.stringify(body);
    const key = this.pendingKey && this.pendingKey.body === text ? this.pendingKey.key : randomKey();
    r.submit.disabled = true;
    r.submit.textContent = 'Creating…';
    try {
      const wait = await api.createWait(body, key);
      this.pendingKey = null;
      // The next wait starts from an empty form of the same kind.
      for (const n of [r.labels, r.timeout, r.headers]) n.value = '';
      this.renderParams();
      this.hooks.onCreated(wait);
    } catch (e) {
      if (e instanceof ApiError) {
        this.pendingKey = e.network ? { key, body: text } : null;
        this.showErrors(e.detail, e.errors);
      } else if (e.name !== 'AbortError') this.showErrors(String(e), []);
    } finally {
      r.submit.disabled = false;
      r.submit.textContent = 'Create wait';
    }
  }
}
