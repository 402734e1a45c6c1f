// Ending a callback wait through its callback URL. The URL is its own credential
// (no API token goes with it), so a job that holds only the URL needs no client.
import { WaitdError } from "./errors.js";
import { failure, json, send, type Fetch } from "./http.js";
import type { Wait } from "./types.js";

export interface CallbackOptions {
  /** The `fetch` to use (default: the global one). */
  fetch?: Fetch;
  signal?: AbortSignal;
}

/**
 * Ends a callback wait `succeeded`, with `body` (any JSON value, `{}` by default)
 * as its `output`. When the wait's spec judges bodies (`state`/`want`,
 * conditions), the body may end it `failed`, or be progress that leaves it
 * running. Resolves to the wait as it stands after; rejects with a `WaitdError`
 * (status 409, and the wait) when it had already ended.
 */
export function completeCallback(callbackUrl: string, body: unknown = {}, options: CallbackOptions = {}): Promise<Wait> {
  return post(callbackUrl, "", body, options);
}

/** Ends a callback wait `failed`, with `body` as its `error_detail`. */
export function failCallback(callbackUrl: string, body: unknown = {}, options: CallbackOptions = {}): Promise<Wait> {
  return post(callbackUrl, "/fail", body, options);
}

/** Keeps a callback wait with a `callback.heartbeat` alive. */
export function heartbeatCallback(callbackUrl: string, options: CallbackOptions = {}): Promise<Wait> {
  return post(callbackUrl, "/heartbeat", undefined, options);
}

async function post(callbackUrl: string, suffix: string, body: unknown, options: CallbackOptions): Promise<Wait> {
  let url: URL;
  try {
    url = new URL(callbackUrl);
  } catch {
    throw new WaitdError(0, "the callback URL is not a URL; pass the callback_url the create answered with");
  }
  const origin = url.origin;
  const target = callbackUrl.replace(/\/+$/, "") + suffix;
  const init: RequestInit = {
    method: "POST",
    headers: { accept: "application/json" },
  };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { accept: "application/json", "content-type": "application/json" };
  }
  if (options.signal) init.signal = options.signal;
  const res = await send(options.fetch ?? globalThis.fetch, target, init, origin, options.signal);
  if (res.status === 200 || res.status === 202) return json<Wait>(res);
  throw await failure(res);
}
