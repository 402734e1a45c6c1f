// A server-sent events parser over a fetch body, by the rules of the HTML
// standard's event stream interpretation: lines end with CRLF, LF or CR; a blank
// line dispatches; `:` lines are comments (waitd's keep-alives).

/** One dispatched event of a stream. */
export interface SseFrame {
  /** The `id` field, or undefined when the frame set none. */
  id: string | undefined;
  /** The `event` field; `message` when absent. */
  event: string;
  /** The `data` lines, joined by `\n`. */
  data: string;
}

/**
 * Reads `body` and yields each frame. It cancels the body when the caller stops
 * early, and ends when `signal` aborts (whatever the fetch that made the body
 * does with its own signal).
 */
export async function* parseSse(body: ReadableStream<Uint8Array>, signal?: AbortSignal): AsyncGenerator<SseFrame> {
  const reader = body.getReader();
  const onAbort = () => {
    reader.cancel(signal?.reason).catch(() => {});
  };
  if (signal?.aborted) onAbort();
  signal?.addEventListener("abort", onAbort, { once: true });
  const decoder = new TextDecoder("utf-8");
  let buf = "";
  let first = true;
  let id: string | undefined;
  let event = "";
  let data: string[] = [];
  let hasData = false;

  // Applies one line; returns a frame when the line is blank and one is ready.
  const line = (l: string): SseFrame | undefined => {
    if (l === "") {
      const frame = hasData ? { id, event: event || "message", data: data.join("\n") } : undefined;
      id = undefined;
      event = "";
      data = [];
      hasData = false;
      return frame;
    }
    if (l.startsWith(":")) return undefined;
    const colon = l.indexOf(":");
    const field = colon < 0 ? l : l.slice(0, colon);
    let value = colon < 0 ? "" : l.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        data.push(value);
        hasData = true;
        break;
      case "event":
        event = value;
        break;
      case "id":
        if (!value.includes("\0")) id = value;
        break;
      default:
        break; // `retry` and unknown fields: this client keeps its own schedule
    }
    return undefined;
  };

  // Splits what has arrived into lines, keeping an unfinished one (and a CR that
  // may yet be followed by LF) for later.
  function* lines(final: boolean): Generator<string> {
    let start = 0;
    for (let i = 0; i < buf.length; i++) {
      const c = buf.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      if (c === 13 && i === buf.length - 1 && !final) break;
      yield buf.slice(start, i);
      if (c === 13 && buf.charCodeAt(i + 1) === 10) i++;
      start = i + 1;
    }
    buf = buf.slice(start);
  }

  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        buf += decoder.decode();
        for (const l of lines(true)) {
          const f = line(l);
          if (f) yield f;
        }
        return; // an unfinished frame at the end of the stream is dropped, as the standard says
      }
      buf += decoder.decode(value, { stream: true });
      if (first && buf.length > 0) {
        if (buf.charCodeAt(0) === 0xfeff) buf = buf.slice(1);
        first = false;
      }
      for (const l of lines(false)) {
        const f = line(l);
        if (f) yield f;
      }
    }
  } finally {
    signal?.removeEventListener("abort", onAbort);
    reader.cancel().catch(() => {});
  }
}
