// The blocking wait and the event stream ride out a restart of waitd: the same
// store, the same port, a new process.
import assert from "node:assert/strict";
import { once } from "node:events";
import { after, before, test } from "node:test";
import { Waitd } from "../dist/index.js";
import { Fixture, TOKEN, WaitdProcess, recordingFetch, spec, unique } from "./helpers.mjs";

const server = new WaitdProcess();
const fixture = new Fixture();

before(async () => {
  await Promise.all([server.start(), fixture.start()]);
});
after(async () => {
  await server.dispose();
  await fixture.close();
});

test("a blocking wait returns the terminal status across a crash and restart", async () => {
  const { fetch, events } = recordingFetch();
  const waitd = new Waitd({ url: server.url, token: TOKEN, fetch, retry: { initialMs: 50, maxMs: 300 } });
  const name = unique();
  fixture.set(name, "deploying");
  const polled = fixture.nextPoll(name);
  const wait = await waitd.create(spec(fixture, name));
  await polled;

  const held = once(events, "request");
  const ended = waitd.wait(wait.id, { timeout: 30_000 });
  const [req] = await held;
  assert.match(req.url, /\?wait=\d+ms$/);

  // The held read breaks, and asking again fails while waitd is down.
  const failing = once(events, "failed");
  await server.stop("SIGKILL");
  await failing;
  await once(events, "failed");
  fixture.set(name, "on");

  await server.start();
  const done = await ended;
  assert.equal(done.id, wait.id);
  assert.equal(done.status, "succeeded");
  assert.equal(done.state, "on");
});

test("a blocking wait held through a graceful stop asks again after waitd's 503", async () => {
  const { fetch, events } = recordingFetch();
  const waitd = new Waitd({ url: server.url, token: TOKEN, fetch, retry: { initialMs: 50, maxMs: 300 } });
  const name = unique();
  fixture.set(name, "deploying");
  const polled = fixture.nextPoll(name);
  const wait = await waitd.create(spec(fixture, name));
  await polled;

  const held = once(events, "request");
  const ended = waitd.wait(wait.id, { timeout: 30_000 });
  await held;
  const answered = once(events, "response");
  const failing = once(events, "failed");
  await server.stop("SIGTERM");
  const [res] = await answered;
  assert.equal(res.status, 503, "a held read cut by the stop is a 503");
  assert.equal(res.headers.get("retry-after"), "2");
  fixture.set(name, "on");
  await failing;
  await server.start();
  assert.equal((await ended).status, "succeeded");
});

test("follow resumes after a restart with Last-Event-ID: no event lost or repeated", async () => {
  const { fetch, events } = recordingFetch();
  const waitd = new Waitd({ url: server.url, token: TOKEN, fetch, retry: { initialMs: 50, maxMs: 300 } });
  const name = unique();
  fixture.set(name, "deploying");
  const wait = await waitd.create(spec(fixture, name));
  const requests = [];
  events.on("request", (r) => requests.push(r));

  const seen = [];
  let restarted;
  for await (const event of waitd.follow(wait.id)) {
    seen.push(event);
    if (event.kind === "state" && event.to === "deploying") {
      // Graceful this time: the stream ends, and the client's reconnects find no
      // one until the new process listens, which starts once one has failed.
      await server.stop("SIGTERM");
      fixture.set(name, "on");
      restarted = once(events, "failed").then(() => server.start());
    }
  }
  await restarted;
  assert.deepEqual(
    seen.map((e) => [e.seq, e.kind]),
    [
      [1, "created"],
      [2, "state"],
      [3, "state"],
      [4, "succeeded"],
    ],
  );
  const streams = requests.filter((r) => r.url.includes("/events"));
  assert.ok(streams.length >= 2, `${streams.length} stream requests`);
  assert.equal(streams[0].headers.get("last-event-id"), null);
  for (const r of streams.slice(1)) assert.equal(r.headers.get("last-event-id"), "2");
});
