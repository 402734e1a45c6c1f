// What every request shares: sending it, reading waitd's answer or its problem,
// and waiting between attempts.
import { WaitdError } from "./errors.js";
import type { Problem, Wait } from "./types.js";

export type Fetch = typeof globalThis.fetch;

/** Statuses worth asking again after: waitd stopping or its store away, a rate limit, a proxy's. */
export const RETRYABLE_STATUSES: ReadonlySet<number> = new Set([429, 502, 503, 504]);

/**
 * Sends one request. A failure to get an answer becomes a `WaitdError` with status
 * 0 whose sentence names only `origin`; an abort by `signal` is rethrown as its
 * reason.
 */
export async function send(
  fetchFn: Fetch,
  url: string,
  init: RequestInit,
  origin: string,
  signal?: AbortSignal,
): Promise<Response> {
  try {
    if (!signal) return await fetchFn(url, init);
    // A fetch of the caller's may not honour the signal; this answers it anyway.
    let onAbort = () => {};
    const aborted = new Promise<never>((_, reject) => {
      onAbort = () => reject(signal.reason);
      if (signal.aborted) onAbort();
      else signal.addEventListener("abort", onAbort, { once: true });
    });
    try {
      return await Promise.race([fetchFn(url, init), aborted]);
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  } catch (e) {
    if (signal?.aborted) throw signal.reason;
    throw new WaitdError(0, `could not reach waitd at ${origin}: ${why(e)}`);
  }
}

/** A short reason a fetch failed, without its URL (a callback URL holds a secret). */
function why(e: unknown): string {
  const err = e as { message?: unknown; cause?: { code?: unknown; message?: unknown } };
  const cause = err?.cause;
  const reason =
    (typeof cause?.code === "string" && cause.code) ||
    (typeof cause?.message === "string" && cause.message) ||
    (typeof err?.message === "string" && err.message) ||
    "the request failed";
  return reason.replace(/\b[a-z][a-z0-9+.-]*:\/\/\S+/gi, "<url>");
}

/** The answer's JSON, or a `WaitdError` when it is not JSON. */
export async function json<T>(res: Response): Promise<T> {
  const text = await res.text();
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new WaitdError(res.status, `waitd answered ${res.status} with a body that is not JSON`);
  }
}

/** True when the answer is a problem (application/problem+json). */
export function isProblem(res: Response): boolean {
  return (res.headers.get("content-type") ?? "").toLowerCase().includes("problem+json");
}

/** `Retry-After` in seconds, when it is a number. */
export function retryAfter(res: Response): number | undefined {
  const v = res.headers.get("retry-after");
  if (v === null || !/^[0-9]+$/.test(v.trim())) return undefined;
  return Number(v.trim());
}

/**
 * The `WaitdError` for an answer that is not what was asked: waitd's sentence
 * when it is a problem; a wait's status and reason when it carries a wait.
 */
export async function failure(res: Response): Promise<WaitdError> {
  const after = retryAfter(res);
  const text = await res.text().catch(() => "");
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  const init = after === undefined ? {} : { retryAfter: after };
  if (body && typeof body === "object") {
    const p = body as Partial<Problem> & Partial<Wait>;
    if (typeof p.detail === "string") {
      return new WaitdError(res.status, p.detail, { ...init, problem: p as Problem }, fields(p.errors));
    }
    if (typeof p.id === "string" && typeof p.status === "string") {
      const wait = p as unknown as Wait;
      const reason = wait.reason ? `: ${wait.reason}` : "";
      return new WaitdError(res.status, `the wait had already ended ${wait.status}${reason}`, {
        ...init,
        wait,
      });
    }
  }
  const status = `${res.status}${res.statusText ? ` ${res.statusText}` : ""}`;
  return new WaitdError(res.status, `waitd answered ${status}`, init);
}

/** A validation problem's fields as one clause: `field: message; field: message`. */
function fields(errors: unknown): string | undefined {
  if (!Array.isArray(errors) || errors.length === 0) return undefined;
  return errors
    .map((e: { field?: unknown; message?: unknown }) => `${String(e?.field ?? "")}: ${String(e?.message ?? "")}`)
    .join("; ");
}

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * A signal that aborts when `parent` does or after `ms`; `timedOut()` tells
 * which. `done()` lets go of the timer and the listener.
 */
export function deadlineSignal(ms: number, parent?: AbortSignal) {
  const ctl = new AbortController();
  let timedOut = false;
  const onAbort = () => ctl.abort(parent?.reason);
  if (parent?.aborted) ctl.abort(parent.reason);
  else parent?.addEventListener("abort", onAbort, { once: true });
  const timer = setTimeout(() => {
    timedOut = true;
    ctl.abort(new WaitdError(0, "waitd did not answer in time"));
  }, Math.max(0, ms));
  return {
    signal: ctl.signal,
    timedOut: () => timedOut,
    done: () => {
      clearTimeout(timer);
      parent?.removeEventListener("abort", onAbort);
    },
  };
}

/** Exponential backoff with jitter: `initial`, doubling up to `max`, each ±20%. */
export class Backoff {
  private next: number;
  constructor(
    private readonly initial: number,
    private readonly max: number,
  ) {
    this.next = initial;
  }
  /** The next delay, at least `floor` ms (a Retry-After). */
  delay(floor = 0): number {
    const d = this.next * (0.8 + Math.random() * 0.4);
    this.next = Math.min(this.max, this.next * 2);
    return Math.max(floor, Math.min(d, this.max));
  }
  reset(): void {
    this.next = this.initial;
  }
}
