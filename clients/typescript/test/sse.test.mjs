// The event-stream parser, and follow's handling of streams that break or go
// quiet, with a fetch of the test's own making (no waitd needed).
import assert from "node:assert/strict";
import { test } from "node:test";
import { Waitd, WaitdError, parseSse } from "../dist/index.js";

/** A body that sends `chunks`, then ends (or, with `hang`, stays open until canceled). */
function body(chunks, { hang = false } = {}) {
  const enc = new TextEncoder();
  return new ReadableStream({
    start(c) {
      for (const ch of chunks) c.enqueue(typeof ch === "string" ? enc.encode(ch) : ch);
      if (!hang) c.close();
    },
  });
}

async function frames(chunks) {
  const out = [];
  for await (const f of parseSse(body(chunks))) out.push(f);
  return out;
}

test("frames split anywhere, with CRLF, CR or LF, comments and multi-line data", async () => {
  const text = "\uFEFF: keep-alive\r\nid: 1\r\nevent: created\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nid:2\rdata:x\r\rdata: no end";
  const whole = await frames([text]);
  const bytes = new TextEncoder().encode(text);
  const split = await frames([...bytes].map((b) => new Uint8Array([b])));
  const expected = [
    { id: "1", event: "created", data: '{"a":\n1}' },
    { id: "2", event: "message", data: "x" },
  ];
  assert.deepEqual(whole, expected);
  assert.deepEqual(split, expected, "byte by byte, a CR then LF in the next chunk is one line end");
  // A UTF-8 character split across chunks is decoded whole.
  const e = new TextEncoder().encode("data: é\n\n");
  assert.deepEqual(await frames([e.slice(0, 7), e.slice(7)]), [{ id: undefined, event: "message", data: "é" }]);
});

test("follow replaces a stream that goes quiet, resuming with Last-Event-ID", async () => {
  const event = (seq, kind) => `id: ${seq}\nevent: ${kind}\ndata: ${JSON.stringify({ seq, kind, wait_id: "w" })}\n\n`;
  const asked = [];
  const fetch = async (url, init) => {
    const headers = new Headers(init.headers);
    asked.push(headers.get("last-event-id"));
    const sse = { headers: { "content-type": "text/event-stream" } };
    if (asked.length === 1) {
      // One event, then silence: no keep-alive, no end, and deaf to the abort.
      return new Response(body([event(1, "created")], { hang: true }), sse);
    }
    if (asked.length === 2) throw new TypeError("fetch failed");
    return new Response(body([event(2, "state"), event(3, "succeeded"), event(4, "never")]), sse);
  };
  const waitd = new Waitd({ url: "http://waitd.test", fetch, retry: { initialMs: 10, maxMs: 20 } });
  const seen = [];
  for await (const e of waitd.follow("w", { idleTimeout: 150 })) seen.push(e.seq);
  assert.deepEqual(seen, [1, 2, 3], "to the terminal event, and no further");
  assert.deepEqual(asked, [null, "1", "1"]);
});

test("follow gives up after reconnectFor without an answer, and a problem ends it at once", async () => {
  let calls = 0;
  const down = new Waitd({
    url: "http://waitd.test",
    fetch: async () => {
      calls++;
      throw new TypeError("fetch failed");
    },
    retry: { initialMs: 10, maxMs: 20 },
  });
  await assert.rejects(down.follow("w", { reconnectFor: 100 }).next(), (e) => {
    assert.ok(e instanceof WaitdError);
    assert.equal(e.status, 0);
    assert.match(e.message, /gave up following the wait w after 100 ms/);
    return true;
  });
  assert.ok(calls > 1, `${calls} attempts`);
  const gone = new Waitd({
    url: "http://waitd.test",
    fetch: async () =>
      new Response(JSON.stringify({ type: "/problems/not-found", title: "Not found", status: 404, detail: "no wait has the id w" }), {
        status: 404,
        headers: { "content-type": "application/problem+json" },
      }),
  });
  await assert.rejects(gone.follow("w").next(), { status: 404, message: "no wait has the id w" });
});
