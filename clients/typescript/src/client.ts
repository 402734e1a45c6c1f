// The client: a thin layer over waitd's HTTP API, written by hand over the types
// generated from openapi/openapi.json.
import { completeCallback, failCallback, heartbeatCallback } from "./callbacks.js";
import { WaitdError } from "./errors.js";
import {
  Backoff,
  deadlineSignal,
  failure,
  isProblem,
  json,
  RETRYABLE_STATUSES,
  send,
  sleep,
  type Fetch,
} from "./http.js";
import { parseSse } from "./sse.js";
import {
  isTerminal,
  type CallbackWait,
  type CreateGroup,
  type CreateWait,
  type EventPage,
  type PresetSummary,
  type Status,
  type Wait,
  type WaitEvent,
  type WaitPage,
} from "./types.js";

export interface WaitdOptions {
  /** waitd's base URL (default `http://127.0.0.1:8080`). */
  url?: string;
  /** An API token, sent as `Authorization: Bearer <token>`. */
  token?: string;
  /** The `fetch` to use (default: the global one). */
  fetch?: Fetch;
  /**
   * The delays between attempts when waitd cannot be reached or asks to be asked
   * again: from `initialMs` (250), doubling up to `maxMs` (5000).
   */
  retry?: { initialMs?: number; maxMs?: number };
}

export interface RequestOptions {
  signal?: AbortSignal;
}

export interface CreateOptions extends RequestOptions {
  /** Makes a repeated create answer with the first wait instead of making another. */
  idempotencyKey?: string;
}

export interface ListOptions extends RequestOptions {
  /** Only waits with this status. */
  status?: Status;
  /** Only waits that carry every one of these labels. */
  labels?: Record<string, string>;
  /** Waits per page (1 to 500; waitd's default is 50). */
  limit?: number;
}

export interface WaitOptions extends RequestOptions {
  /**
   * How long to wait for the end, in milliseconds; past it, `wait` rejects with a
   * `WaitdError` of status 0. Without it, until the wait ends.
   */
  timeout?: number;
}

export interface FollowOptions extends RequestOptions {
  /** Start after this event `seq` (default: from the first event). */
  after?: number | string;
  /**
   * How long to keep reconnecting while waitd cannot be reached, in milliseconds
   * (default 120000); past it, the iterator throws a `WaitdError` of status 0.
   */
  reconnectFor?: number;
  /**
   * How long a connection may bring nothing, not even waitd's keep-alive (sent at
   * least every 10 s), before it counts as dropped and is replaced, in
   * milliseconds (default 45000).
   */
  idleTimeout?: number;
}

/** Longest a single blocking read is held, so that no proxy or client timer cuts it. */
const MAX_HOLD_MS = 60_000;
/** How long past the hold a blocking read may take to answer before it counts as lost. */
const HOLD_GRACE_MS = 10_000;

/** A client of one waitd server. */
export class Waitd {
  readonly url: string;
  readonly #origin: string;
  readonly #token: string | undefined;
  readonly #fetch: Fetch;
  readonly #retryInitial: number;
  readonly #retryMax: number;

  constructor(options: WaitdOptions = {}) {
    const url = (options.url ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
    let origin: string;
    try {
      origin = new URL(url).origin;
    } catch {
      throw new WaitdError(0, "the waitd URL is not a URL, e.g. http://127.0.0.1:8080");
    }
    this.url = url;
    this.#origin = origin;
    this.#token = options.token || undefined;
    this.#fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.#retryInitial = options.retry?.initialMs ?? 250;
    this.#retryMax = options.retry?.maxMs ?? 5_000;
  }

  /** Creates a wait: a spec (`target`, `state`, `want`…), a preset with `params`, or a callback wait. */
  async create(spec: CreateWait | CreateGroup, options: CreateOptions = {}): Promise<Wait> {
    const headers: Record<string, string> = {};
    if (options.idempotencyKey) headers["idempotency-key"] = options.idempotencyKey;
    const res = await this.#request("POST", "/waits", { body: spec, headers, signal: options.signal });
    if (res.status === 201) return json<Wait>(res);
    throw await failure(res);
  }

  /** Creates a wait from a preset (`GET /presets` lists them), laying `fields` over it. */
  createFromPreset(
    preset: string,
    params: Record<string, string | number | boolean>,
    fields: Omit<CreateWait, "preset" | "params"> = {},
    options: CreateOptions = {},
  ): Promise<Wait> {
    return this.create({ ...fields, preset, params }, options);
  }

  /**
   * Creates a group: a wait that succeeds when `all` its members do, or the first
   * of `any` does, under one deadline.
   */
  createGroup(group: CreateGroup, options: CreateOptions = {}): Promise<Wait> {
    return this.create(group, options);
  }

  /**
   * Creates a callback wait, which ends when its callback URL is called instead of
   * by polling. The answer carries `callback_url`, shown this once: hand it to the
   * job that reports back (`completeCallback`, `failCallback`).
   */
  async createCallback(
    fields: Omit<CreateWait, "target" | "callback"> & { heartbeat?: string } = {},
    options: CreateOptions = {},
  ): Promise<CallbackWait> {
    const { heartbeat, ...rest } = fields;
    const callback = heartbeat === undefined ? {} : { heartbeat };
    const wait = (await this.create({ ...rest, callback }, options)) as Wait & { callback_url?: string };
    if (typeof wait.callback_url !== "string") {
      throw new WaitdError(
        201,
        "waitd's answer carries no callback_url: a create repeated with the same Idempotency-Key does not show it again",
      );
    }
    return wait as CallbackWait;
  }

  /** Reads a wait as it stands now. */
  async get(id: string, options: RequestOptions = {}): Promise<Wait> {
    const res = await this.#request("GET", waitPath(id), { signal: options.signal });
    if (res.status === 200) return json<Wait>(res);
    throw await failure(res);
  }

  /** One page of waits, newest first; pass its `next_cursor` as `cursor` for the next. */
  async listPage(options: ListOptions & { cursor?: string } = {}): Promise<WaitPage> {
    const query: [string, string][] = [];
    if (options.status) query.push(["status", options.status]);
    for (const [k, v] of Object.entries(options.labels ?? {})) query.push(["label", `${k}:${v}`]);
    if (options.limit !== undefined) query.push(["limit", String(options.limit)]);
    if (options.cursor) query.push(["cursor", options.cursor]);
    const res = await this.#request("GET", "/waits", { query, signal: options.signal });
    if (res.status === 200) return json<WaitPage>(res);
    throw await failure(res);
  }

  /** Every wait that matches, newest first, page after page. */
  async *list(options: ListOptions = {}): AsyncGenerator<Wait, void, undefined> {
    let cursor: string | undefined;
    do {
      const page = await this.listPage(cursor === undefined ? options : { ...options, cursor });
      yield* page.items;
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
  }

  /** Cancels a running wait (a group's running members with it); an ended wait comes back unchanged. */
  async cancel(id: string, options: RequestOptions = {}): Promise<Wait> {
    const res = await this.#request("POST", `${waitPath(id)}/cancel`, { signal: options.signal });
    if (res.status === 200) return json<Wait>(res);
    throw await failure(res);
  }

  /** The presets a request can name. */
  async presets(options: RequestOptions = {}): Promise<PresetSummary[]> {
    const res = await this.#request("GET", "/presets", { signal: options.signal });
    if (res.status !== 200) throw await failure(res);
    const body = await json<{ items?: PresetSummary[] } | PresetSummary[]>(res);
    return Array.isArray(body) ? body : (body.items ?? []);
  }

  /**
   * Resolves with the wait once it has ended, whatever the end (check `status`).
   * It holds a blocking read on waitd (`GET /waits/{id}?wait=`), and rides out a
   * restart: while waitd cannot be reached, or answers 503 or 429, it asks again
   * with backoff. Rejects with a `WaitdError` of status 0 when `timeout` passes
   * first (its `wait` is the wait as last read, when one was), and with waitd's
   * sentence for any other problem (a 404, a 401…).
   */
  async wait(id: string, options: WaitOptions = {}): Promise<Wait> {
    const { signal } = options;
    const deadline = options.timeout === undefined ? Infinity : Date.now() + options.timeout;
    const backoff = this.#backoff();
    let lastError: WaitdError | undefined;
    let lastSeen: Wait | undefined;
    for (;;) {
      const left = deadline - Date.now();
      if (left <= 0) {
        const why = lastError ? `; the last attempt: ${lastError.message}` : "";
        throw new WaitdError(0, `the wait ${id} had not ended when the timeout of ${options.timeout} ms passed${why}`, {
          ...(lastSeen ? { wait: lastSeen } : {}),
        });
      }
      const hold = Math.ceil(Math.min(left, MAX_HOLD_MS));
      const limit = deadlineSignal(Math.min(hold + HOLD_GRACE_MS, left + 1_000), signal);
      let res: Response;
      try {
        res = await this.#request("GET", waitPath(id), {
          query: [["wait", `${hold}ms`]],
          signal: limit.signal,
        });
        if (res.status === 200 || res.status === 202 || (isEnded(res.status) && !isProblem(res))) {
          const wait = await json<Wait>(res);
          limit.done();
          if (isTerminal(wait.status)) return wait;
          lastSeen = wait;
          lastError = undefined;
          backoff.reset();
          continue; // held as long as asked and still running: ask again
        }
        limit.done();
        const err = await failure(res);
        if (!RETRYABLE_STATUSES.has(res.status)) throw err;
        lastError = err;
        await sleep(Math.min(backoff.delay((err.retryAfter ?? 0) * 1000), deadline - Date.now()), signal);
      } catch (e) {
        limit.done();
        if (signal?.aborted) throw signal.reason;
        if (!(e instanceof WaitdError) && !limit.timedOut()) throw e;
        if (e instanceof WaitdError && e.status !== 0) throw e;
        // No answer: waitd is restarting, or the network is away. Ask again.
        lastError = e instanceof WaitdError ? e : new WaitdError(0, `waitd at ${this.#origin} did not answer in time`);
        await sleep(Math.min(backoff.delay(), Math.max(0, deadline - Date.now())), signal);
      }
    }
  }

  /**
   * The wait's events as they happen, from its first (or after `after`) to its
   * terminal one, read from waitd's server-sent-event stream. When the stream
   * drops (waitd restarting, a proxy's idle cut), it reconnects with
   * `Last-Event-ID`, so no event is lost or repeated. Stop early with `break` or
   * `signal`.
   */
  async *follow(id: string, options: FollowOptions = {}): AsyncGenerator<WaitEvent, void, undefined> {
    const { signal } = options;
    const reconnectFor = options.reconnectFor ?? 120_000;
    const idleFor = options.idleTimeout ?? 45_000;
    let last = options.after === undefined ? undefined : String(options.after);
    const backoff = this.#backoff();
    let downSince: number | undefined; // since when no connection has been answered
    let lastError: WaitdError | undefined;
    for (;;) {
      // Each connection has a signal of its own: the caller's, or a watchdog's when
      // nothing (not even a keep-alive) has come for `idleFor`.
      const conn = new AbortController();
      const onAbort = () => conn.abort(signal?.reason);
      if (signal?.aborted) throw signal.reason;
      signal?.addEventListener("abort", onAbort, { once: true });
      let idle: ReturnType<typeof setTimeout> | undefined;
      const arm = () => {
        clearTimeout(idle);
        idle = setTimeout(
          () => conn.abort(new WaitdError(0, `the event stream from waitd at ${this.#origin} went quiet for ${idleFor} ms`)),
          idleFor,
        );
      };
      try {
        arm();
        let res: Response | undefined;
        try {
          res = await this.#request("GET", `${waitPath(id)}/events`, {
            query: [["follow", "true"]],
            headers: last === undefined ? { accept: "text/event-stream" } : { accept: "text/event-stream", "last-event-id": last },
            signal: conn.signal,
          });
        } catch (e) {
          if (signal?.aborted) throw signal.reason;
          if (!(e instanceof WaitdError) || e.status !== 0) throw e;
          lastError = e;
        }
        if (res && !res.ok) {
          const err = await failure(res);
          if (!RETRYABLE_STATUSES.has(res.status)) throw err;
          lastError = err;
        } else if (res?.body) {
          downSince = undefined;
          const body = res.body.pipeThrough(
            new TransformStream<Uint8Array, Uint8Array>({
              transform(chunk, out) {
                arm();
                out.enqueue(chunk);
              },
            }),
          );
          try {
            for await (const frame of parseSse(body, conn.signal)) {
              if (frame.data === "") continue;
              const event = JSON.parse(frame.data) as WaitEvent;
              if (frame.id !== undefined) last = frame.id;
              else if (typeof event.seq === "number") last = String(event.seq);
              // Frames already read are not handed out once the caller has stopped.
              if (signal?.aborted) throw signal.reason;
              backoff.reset();
              yield event;
              if (isTerminal(event.kind)) return;
            }
          } catch (e) {
            if (signal?.aborted) throw signal.reason;
            if (e instanceof SyntaxError) throw new WaitdError(200, "waitd sent an event whose data is not JSON");
            // The stream broke (waitd stopped, the network): reconnect below.
          }
          if (signal?.aborted) throw signal.reason;
          lastError =
            conn.signal.reason instanceof WaitdError
              ? conn.signal.reason
              : new WaitdError(0, `the event stream from waitd at ${this.#origin} ended before the wait did`);
        }
      } finally {
        clearTimeout(idle);
        signal?.removeEventListener("abort", onAbort);
        conn.abort();
      }
      downSince ??= Date.now();
      if (Date.now() - downSince > reconnectFor) {
        throw new WaitdError(0, `gave up following the wait ${id} after ${reconnectFor} ms without reaching waitd: ${lastError?.message ?? "no answer"}`);
      }
      await sleep(backoff.delay((lastError?.retryAfter ?? 0) * 1000), signal);
    }
  }

  /** The wait's history so far (JSON pages, oldest first), without following it. */
  async *events(id: string, options: RequestOptions & { after?: number | string } = {}): AsyncGenerator<WaitEvent, void, undefined> {
    let after = options.after === undefined ? undefined : String(options.after);
    for (;;) {
      const query: [string, string][] = after === undefined ? [] : [["after", after]];
      const res = await this.#request("GET", `${waitPath(id)}/events`, { query, signal: options.signal });
      if (res.status !== 200) throw await failure(res);
      const page = await json<EventPage>(res);
      yield* page.items;
      if (!page.next_cursor) return;
      after = page.next_cursor;
    }
  }

  /** Ends a callback wait `succeeded` through its callback URL (see `completeCallback`). */
  completeCallback(callbackUrl: string, body: unknown = {}, options: RequestOptions = {}): Promise<Wait> {
    return completeCallback(callbackUrl, body, { ...options, fetch: this.#fetch });
  }

  /** Ends a callback wait `failed` through its callback URL, `body` its `error_detail`. */
  failCallback(callbackUrl: string, body: unknown = {}, options: RequestOptions = {}): Promise<Wait> {
    return failCallback(callbackUrl, body, { ...options, fetch: this.#fetch });
  }

  /** Keeps a callback wait with a `callback.heartbeat` alive. */
  heartbeatCallback(callbackUrl: string, options: RequestOptions = {}): Promise<Wait> {
    return heartbeatCallback(callbackUrl, { ...options, fetch: this.#fetch });
  }

  #backoff(): Backoff {
    return new Backoff(this.#retryInitial, this.#retryMax);
  }

  #request(
    method: string,
    path: string,
    opts: {
      query?: [string, string][];
      body?: unknown;
      headers?: Record<string, string>;
      signal?: AbortSignal | undefined;
    },
  ): Promise<Response> {
    const qs = opts.query?.length ? `?${new URLSearchParams(opts.query).toString()}` : "";
    const headers: Record<string, string> = { accept: "application/json", ...opts.headers };
    if (this.#token) headers.authorization = `Bearer ${this.#token}`;
    const init: RequestInit = { method, headers };
    if (opts.body !== undefined) {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(opts.body);
    }
    if (opts.signal) init.signal = opts.signal;
    return send(this.#fetch, `${this.url}${path}${qs}`, init, this.#origin, opts.signal);
  }
}

function waitPath(id: string): string {
  return `/waits/${encodeURIComponent(id)}`;
}

/** The codes of a blocked read that saw the wait end other than by success. */
function isEnded(status: number): boolean {
  return status === 409 || status === 412 || status === 422 || status === 424;
}
