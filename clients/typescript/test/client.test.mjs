// Every method of the client, against a live waitd.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Waitd, WaitdError, completeCallback, failCallback, isTerminal } from "../dist/index.js";
import { Fixture, TOKEN, WaitdProcess, spec, unique } from "./helpers.mjs";

const server = new WaitdProcess();
const fixture = new Fixture();
let waitd;

before(async () => {
  await Promise.all([server.start(), fixture.start()]);
  waitd = new Waitd({ url: server.url, token: TOKEN, retry: { initialMs: 50, maxMs: 500 } });
});
after(async () => {
  await server.dispose();
  await fixture.close();
});

describe("create, get, wait", () => {
  test("a spec: created running, then blocked on until it succeeds", async () => {
    const name = unique();
    fixture.set(name, "deploying");
    const polled = fixture.nextPoll(name);
    const wait = await waitd.create(spec(fixture, name, { labels: { suite: "create" } }));
    assert.equal(wait.status, "running");
    assert.deepEqual(wait.labels, { suite: "create" });
    await polled;
    const read = await waitd.get(wait.id);
    assert.equal(read.id, wait.id);
    const ended = waitd.wait(wait.id, { timeout: 20_000 });
    fixture.set(name, "on");
    const done = await ended;
    assert.equal(done.status, "succeeded");
    assert.equal(done.state, "on");
    assert.match(done.reason, /on/);
  });

  test("an idempotency key makes a repeated create answer with the first wait", async () => {
    const name = unique();
    fixture.set(name, "on");
    const key = unique("key");
    const first = await waitd.create(spec(fixture, name), { idempotencyKey: key });
    const again = await waitd.create(spec(fixture, name), { idempotencyKey: key });
    assert.equal(again.id, first.id);
    await assert.rejects(waitd.create(spec(fixture, name, { timeout: "2m" }), { idempotencyKey: key }), { status: 409 });
  });

  test("a wait that fails resolves with its failed status, not an error", async () => {
    const name = unique();
    fixture.set(name, "failed_deployment");
    const wait = await waitd.create(spec(fixture, name));
    const done = await waitd.wait(wait.id, { timeout: 20_000 });
    assert.equal(done.status, "failed");
  });

  test("a preset with params", async () => {
    const name = unique();
    fixture.set(name, "anything");
    const wait = await waitd.createFromPreset("http.ok", { url: `${fixture.url}/state/${name}` }, { timeout: "1m" });
    assert.equal(wait.spec.target.url, `${fixture.url}/state/${name}`);
    const done = await waitd.wait(wait.id, { timeout: 20_000 });
    assert.equal(done.status, "succeeded");
    assert.equal(done.state, "200");
  });

  test("the presets list names http.ok", async () => {
    const presets = await waitd.presets();
    assert.ok(presets.some((p) => p.name === "http.ok"), JSON.stringify(presets).slice(0, 200));
  });

  test("a group of all its members succeeds when both do", async () => {
    const a = unique("a");
    const b = unique("b");
    fixture.set(a, "deploying");
    fixture.set(b, "deploying");
    const group = await waitd.createGroup({ all: [spec(fixture, a), spec(fixture, b)], timeout: "1m" });
    assert.equal(group.mode, "all");
    assert.equal(group.members.length, 2);
    const ended = waitd.wait(group.id, { timeout: 20_000 });
    fixture.set(a, "on");
    fixture.set(b, "on");
    const done = await ended;
    assert.equal(done.status, "succeeded");
    assert.ok(done.members.every((m) => m.status === "succeeded"));
  });

  test("wait with a timeout shorter than the wait rejects with status 0", async () => {
    const name = unique();
    fixture.set(name, "deploying");
    const wait = await waitd.create(spec(fixture, name));
    await assert.rejects(waitd.wait(wait.id, { timeout: 300 }), (e) => {
      assert.ok(e instanceof WaitdError);
      assert.equal(e.status, 0);
      assert.match(e.message, /had not ended/);
      assert.equal(e.wait.status, "running", "the wait as last read");
      return true;
    });
    await waitd.cancel(wait.id);
  });

  test("wait stops when its signal aborts", async () => {
    const name = unique();
    fixture.set(name, "deploying");
    const wait = await waitd.create(spec(fixture, name));
    const ctl = new AbortController();
    const pending = waitd.wait(wait.id, { signal: ctl.signal });
    ctl.abort(new Error("no longer needed"));
    await assert.rejects(pending, /no longer needed/);
    await waitd.cancel(wait.id);
  });
});

describe("callback waits", () => {
  test("completed through the callback URL, with its body as output", async () => {
    const wait = await waitd.createCallback({ timeout: "1m", labels: { suite: "callback" } });
    assert.equal(wait.status, "running");
    assert.match(wait.callback_url, /^http:\/\/127\.0\.0\.1:\d+\/callbacks\//);
    const ended = waitd.wait(wait.id, { timeout: 20_000 });
    // A job needs only the URL: no client, no token.
    const done = await completeCallback(wait.callback_url, { build: 42 });
    assert.equal(done.status, "succeeded");
    assert.deepEqual(done.output, { build: 42 });
    assert.equal((await ended).status, "succeeded");
    // The first completion wins; a later one says the wait had ended, and carries it.
    await assert.rejects(waitd.completeCallback(wait.callback_url, {}), (e) => {
      assert.ok(e instanceof WaitdError);
      assert.equal(e.status, 409);
      assert.equal(e.wait.status, "succeeded");
      assert.ok(!e.message.includes(wait.callback_url.split("/callbacks/")[1]), "the secret is in the error");
      return true;
    });
  });

  test("failed through the callback URL, with its body as error_detail", async () => {
    const wait = await waitd.createCallback({ heartbeat: "30s", timeout: "1m" });
    const beat = await waitd.heartbeatCallback(wait.callback_url);
    assert.equal(beat.status, "running");
    const done = await failCallback(wait.callback_url, { step: "migrate" });
    assert.equal(done.status, "failed");
    assert.deepEqual(done.error_detail, { step: "migrate" });
  });

  test("an unknown callback URL is waitd's 404 sentence", async () => {
    const wait = await waitd.createCallback({ timeout: "1m" });
    const wrong = wait.callback_url.replace(/.$/, (c) => (c === "a" ? "b" : "a"));
    await assert.rejects(completeCallback(wrong, {}), (e) => {
      assert.equal(e.status, 404);
      assert.match(e.message, /no callback wait has this URL/);
      return true;
    });
    await waitd.cancel(wait.id);
  });
});

describe("list and cancel", () => {
  test("list follows the cursor across pages, filtered by label and status", async () => {
    const batch = unique("batch");
    const ids = [];
    for (let i = 0; i < 3; i++) {
      const w = await waitd.createCallback({ timeout: "1m", labels: { batch } });
      ids.push(w.id);
    }
    const seen = [];
    for await (const w of waitd.list({ labels: { batch }, limit: 1 })) seen.push(w.id);
    assert.deepEqual(seen, [...ids].reverse(), "newest first, every page");

    const canceled = await waitd.cancel(ids[1]);
    assert.equal(canceled.status, "canceled");
    assert.match(canceled.reason, /canceled/);
    const again = await waitd.cancel(ids[1]);
    assert.equal(again.status, "canceled", "an ended wait comes back unchanged");
    const only = [];
    for await (const w of waitd.list({ labels: { batch }, status: "canceled" })) only.push(w.id);
    assert.deepEqual(only, [ids[1]]);

    const page = await waitd.listPage({ labels: { batch }, limit: 2 });
    assert.equal(page.items.length, 2);
    assert.ok(page.next_cursor);
    for (const id of [ids[0], ids[2]]) await waitd.cancel(id);
    // A blocking wait on a canceled wait answers it at once.
    assert.equal((await waitd.wait(ids[1])).status, "canceled");
  });
});

describe("events", () => {
  test("follow yields each event to the terminal one, then ends", async () => {
    const name = unique();
    fixture.set(name, "deploying");
    const wait = await waitd.create(spec(fixture, name));
    const kinds = [];
    for await (const event of waitd.follow(wait.id)) {
      kinds.push(event.kind);
      assert.equal(event.wait_id, wait.id);
      if (event.kind === "state" && event.to === "deploying") fixture.set(name, "on");
    }
    assert.deepEqual(kinds, ["created", "state", "state", "succeeded"]);
    const history = [];
    for await (const e of waitd.events(wait.id)) history.push(e.seq);
    assert.deepEqual(history, [1, 2, 3, 4]);
    const later = [];
    for await (const e of waitd.follow(wait.id, { after: 2 })) later.push(e.seq);
    assert.deepEqual(later, [3, 4], "after a seq, only the events past it");
  });

  test("follow stops when its signal aborts, and on break", async () => {
    const name = unique();
    fixture.set(name, "deploying");
    const wait = await waitd.create(spec(fixture, name));
    const ctl = new AbortController();
    const seen = [];
    await assert.rejects(
      (async () => {
        for await (const event of waitd.follow(wait.id, { signal: ctl.signal })) {
          seen.push(event.kind);
          if (event.kind === "created") ctl.abort(new Error("stop following"));
        }
      })(),
      /stop following/,
    );
    assert.deepEqual(seen, ["created"]);
    for await (const event of waitd.follow(wait.id)) {
      if (event.kind === "created") break;
    }
    const canceled = await waitd.cancel(wait.id);
    assert.ok(isTerminal(canceled.status));
  });
});

describe("errors", () => {
  test("waitd's sentence comes through, with the status", async () => {
    await assert.rejects(waitd.get("0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21"), (e) => {
      assert.ok(e instanceof WaitdError);
      assert.equal(e.status, 404);
      assert.ok(e.message.length > 10, e.message);
      assert.equal(e.message, e.problem.detail);
      return true;
    });
    await assert.rejects(waitd.create({ target: { url: `${fixture.url}/state/x` }, state: "/status", wnat: ["on"] }), (e) => {
      assert.equal(e.status, 400);
      assert.match(e.message, /wnat/);
      assert.ok(e.problem.errors.length > 0);
      return true;
    });
    await assert.rejects(waitd.create({ target: { url: "http://169.254.169.254/latest" }, state: "/s", want: ["on"] }), (e) => {
      assert.equal(e.status, 422);
      assert.ok(e.message.length > 10, e.message);
      return true;
    });
  });

  test("a wrong token is a 401 whose error never shows the token", async () => {
    const secret = "not-the-token-0123456789";
    const bad = new Waitd({ url: server.url, token: secret });
    await assert.rejects(bad.get("0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21"), (e) => {
      assert.equal(e.status, 401);
      const shown = `${e.message} ${e.stack} ${JSON.stringify(e)} ${JSON.stringify(e.problem)}`;
      assert.ok(!shown.includes(secret), shown);
      return true;
    });
  });

  test("an unreachable waitd is status 0, naming where, never the token", async () => {
    const gone = new Waitd({ url: "http://127.0.0.1:9", token: TOKEN });
    await assert.rejects(gone.list().next(), (e) => {
      assert.ok(e instanceof WaitdError);
      assert.equal(e.status, 0);
      assert.match(e.message, /could not reach waitd at http:\/\/127\.0\.0\.1:9/);
      assert.ok(!`${e.message} ${e.stack} ${JSON.stringify(e)}`.includes(TOKEN));
      return true;
    });
  });
});
