// Standard Webhooks (https://www.standardwebhooks.com/): the signature waitd puts on
// each delivery, and its verification, with WebCrypto only.
import { WebhookVerificationError } from "./errors.js";
import type { WebhookMessage } from "./types.js";

/** How far a webhook's timestamp may be from now, either way, by default: 5 minutes. */
export const WEBHOOK_TOLERANCE_SECONDS = 5 * 60;

/** The headers of a received request: a `Headers`, or a plain object (Node's `req.headers`). */
export type HeadersLike =
  | { get(name: string): string | null }
  | Record<string, string | readonly string[] | undefined>;

/** A request body as received: the exact bytes, or a string of them. */
export type BodyLike = string | Uint8Array | ArrayBuffer;

export interface VerifyOptions {
  /** Seconds the timestamp may be from now, either way (default 300). */
  toleranceSeconds?: number;
  /** The time to check against (default: now). */
  now?: Date;
}

/**
 * Checks that a webhook came from waitd: its `webhook-signature` is the
 * HMAC-SHA256 under `secret` of `webhook-id.webhook-timestamp.body`, and its
 * timestamp is within 5 minutes of now. Resolves to the parsed body; rejects with
 * a `WebhookVerificationError` (whose message never holds the secret) otherwise.
 *
 * Pass the body exactly as received, before any JSON parsing.
 */
export async function verifyWebhook(
  secret: string,
  headers: HeadersLike,
  body: BodyLike,
  options: VerifyOptions = {},
): Promise<WebhookMessage> {
  const id = header(headers, "webhook-id");
  const timestamp = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  if (!id || !timestamp || !signatures) {
    const missing = [
      !id && "webhook-id",
      !timestamp && "webhook-timestamp",
      !signatures && "webhook-signature",
    ].filter(Boolean);
    throw new WebhookVerificationError(`the webhook has no ${missing.join(", ")} header`);
  }
  if (!/^[0-9]{1,15}$/.test(timestamp)) {
    throw new WebhookVerificationError("the webhook's webhook-timestamp is not a number of seconds");
  }
  const tolerance = options.toleranceSeconds ?? WEBHOOK_TOLERANCE_SECONDS;
  const now = Math.floor((options.now ?? new Date()).getTime() / 1000);
  const skew = now - Number(timestamp);
  if (skew > tolerance) {
    throw new WebhookVerificationError(
      `the webhook's timestamp is ${skew} s old, more than the ${tolerance} s allowed: it may be a replay`,
    );
  }
  if (-skew > tolerance) {
    throw new WebhookVerificationError(
      `the webhook's timestamp is ${-skew} s in the future, more than the ${tolerance} s allowed`,
    );
  }
  const bytes = toBytes(body);
  const expected = await hmac(secretKey(secret), id, timestamp, bytes);
  let ok = false;
  for (const entry of signatures.split(" ")) {
    const comma = entry.indexOf(",");
    if (comma < 0 || entry.slice(0, comma) !== "v1") continue;
    const given = fromBase64(entry.slice(comma + 1));
    // Every candidate is compared, each in constant time, so the time taken says nothing.
    if (given && timingSafeEqual(given, expected)) ok = true;
  }
  if (!ok) {
    throw new WebhookVerificationError(
      "the webhook's signature does not match: it was not signed with this secret, or its id, timestamp or body changed",
    );
  }
  try {
    return JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes)) as WebhookMessage;
  } catch {
    throw new WebhookVerificationError("the webhook's body is signed but is not JSON");
  }
}

/**
 * The `webhook-signature` waitd would send: `v1,` and the base64 HMAC-SHA256 of
 * `id.timestamp.body` under `secret`. For tests of a receiver.
 */
export async function signWebhook(
  secret: string,
  id: string,
  timestamp: number | string,
  body: BodyLike,
): Promise<string> {
  const tag = await hmac(secretKey(secret), id, String(timestamp), toBytes(body));
  return `v1,${toBase64(tag)}`;
}

/** The key bytes of a `whsec_<base64>` secret (the prefix may be left off). */
function secretKey(secret: string): Uint8Array<ArrayBuffer> {
  const key = fromBase64(secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret);
  if (!key || key.length === 0) {
    throw new WebhookVerificationError(
      "the webhook secret is not a Standard Webhooks secret: whsec_ followed by base64",
    );
  }
  return key;
}

async function hmac(key: Uint8Array<ArrayBuffer>, id: string, timestamp: string, body: Uint8Array): Promise<Uint8Array> {
  const subtle = globalThis.crypto?.subtle;
  if (!subtle) {
    throw new WebhookVerificationError(
      "WebCrypto (globalThis.crypto.subtle) is not available here; browsers offer it only to secure contexts",
    );
  }
  const k = await subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const prefix = new TextEncoder().encode(`${id}.${timestamp}.`);
  const msg = new Uint8Array(prefix.length + body.length);
  msg.set(prefix, 0);
  msg.set(body, prefix.length);
  return new Uint8Array(await subtle.sign("HMAC", k, msg));
}

function header(headers: HeadersLike, name: string): string | undefined {
  if (typeof (headers as { get?: unknown }).get === "function") {
    return (headers as { get(n: string): string | null }).get(name) ?? undefined;
  }
  const record = headers as Record<string, string | readonly string[] | undefined>;
  for (const key of Object.keys(record)) {
    if (key.toLowerCase() !== name) continue;
    const v = record[key];
    return typeof v === "string" ? v : v?.join(" ");
  }
  return undefined;
}

function toBytes(body: BodyLike): Uint8Array {
  if (typeof body === "string") return new TextEncoder().encode(body);
  if (body instanceof Uint8Array) return body;
  return new Uint8Array(body);
}

function timingSafeEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= (a[i] as number) ^ (b[i] as number);
  return diff === 0;
}

function fromBase64(s: string): Uint8Array<ArrayBuffer> | undefined {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(s)) return undefined;
  try {
    const bin = atob(s);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  } catch {
    return undefined;
  }
}

function toBase64(bytes: Uint8Array): string {
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin);
}
