// verifyWebhook accepts what waitd sends, and refuses a forged, stale or
// tampered one.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, test } from "node:test";
import { Waitd, WebhookVerificationError, signWebhook, verifyWebhook } from "../dist/index.js";
import { Fixture, TOKEN, WaitdProcess, unique } from "./helpers.mjs";

const server = new WaitdProcess();
const fixture = new Fixture();
let waitd;
const secret = `whsec_${randomBytes(32).toString("base64")}`;
let received; // { headers, body } of a webhook waitd sent

before(async () => {
  await Promise.all([server.start(), fixture.start()]);
  waitd = new Waitd({ url: server.url, token: TOKEN });
  const hook = unique("hook");
  const wait = await waitd.createCallback({
    timeout: "1m",
    notify: [{ url: `${fixture.url}/hook/${hook}`, secret }],
  });
  const arrived = fixture.hook(hook);
  await waitd.completeCallback(wait.callback_url, { build: 7 });
  received = await arrived;
  received.waitId = wait.id;
});
after(async () => {
  await server.dispose();
  await fixture.close();
});

const refused = (pattern) => (e) => {
  assert.ok(e instanceof WebhookVerificationError, String(e));
  assert.match(e.message, pattern);
  assert.ok(!e.message.includes(secret.slice(6)), "the secret is in the error");
  return true;
};

test("a real webhook from waitd verifies, from Node's headers and from Headers", async () => {
  const msg = await verifyWebhook(secret, received.headers, received.body);
  assert.equal(msg.type, "wait.succeeded");
  assert.equal(msg.data.id, received.waitId);
  assert.equal(msg.data.status, "succeeded");
  assert.deepEqual(msg.data.output, { build: 7 });
  assert.equal(msg.event.kind, "succeeded");
  const headers = new Headers(Object.entries(received.headers));
  const again = await verifyWebhook(secret, headers, received.body.toString("utf8"));
  assert.equal(again.data.id, received.waitId);
  // The secret without its prefix is the same key.
  await verifyWebhook(secret.slice("whsec_".length), headers, new Uint8Array(received.body));
});

test("a tampered body, id or timestamp is refused", async () => {
  const body = received.body.toString("utf8").replace('"build":7', '"build":8');
  assert.notEqual(body, received.body.toString("utf8"));
  await assert.rejects(verifyWebhook(secret, received.headers, body), refused(/does not match/));
  const id = { ...received.headers, "webhook-id": `${received.headers["webhook-id"]}x` };
  await assert.rejects(verifyWebhook(secret, id, received.body), refused(/does not match/));
  const ts = { ...received.headers, "webhook-timestamp": String(Number(received.headers["webhook-timestamp"]) - 1) };
  await assert.rejects(verifyWebhook(secret, ts, received.body), refused(/does not match/));
});

test("a forged webhook (another secret) is refused", async () => {
  const other = `whsec_${randomBytes(32).toString("base64")}`;
  const now = Math.floor(Date.now() / 1000);
  const headers = {
    "webhook-id": "msg_forged",
    "webhook-timestamp": String(now),
    "webhook-signature": await signWebhook(other, "msg_forged", now, received.body),
  };
  await assert.rejects(verifyWebhook(secret, headers, received.body), refused(/does not match/));
  // The same message signed with the right secret passes: only the key differed.
  headers["webhook-signature"] = `v1,AAAA ${await signWebhook(secret, "msg_forged", now, received.body)}`;
  await verifyWebhook(secret, headers, received.body);
});

test("a stale or future webhook is refused even when its signature is right", async () => {
  const old = Math.floor(Date.now() / 1000) - 301;
  const stale = {
    "webhook-id": "msg_old",
    "webhook-timestamp": String(old),
    "webhook-signature": await signWebhook(secret, "msg_old", old, received.body),
  };
  await assert.rejects(verifyWebhook(secret, stale, received.body), refused(/old.*replay/));
  const ahead = old + 602;
  const future = {
    "webhook-id": "msg_new",
    "webhook-timestamp": String(ahead),
    "webhook-signature": await signWebhook(secret, "msg_new", ahead, received.body),
  };
  await assert.rejects(verifyWebhook(secret, future, received.body), refused(/future/));
  // waitd's own, ten minutes on, is a replay.
  const later = new Date(Number(received.headers["webhook-timestamp"]) * 1000 + 10 * 60_000);
  await assert.rejects(verifyWebhook(secret, received.headers, received.body, { now: later }), refused(/old/));
});

test("missing headers and a malformed secret are refused", async () => {
  const { "webhook-signature": _, ...unsigned } = received.headers;
  await assert.rejects(verifyWebhook(secret, unsigned, received.body), refused(/no webhook-signature/));
  await assert.rejects(verifyWebhook("whsec_!!not base64!!", received.headers, received.body), refused(/not a Standard Webhooks secret/));
});
