// What the tests share: a waitd process they start, stop and restart; a target
// server and webhook receiver in this process; and fetch wrappers that report
// what the client sends.
import { spawn } from "node:child_process";
import { once, EventEmitter } from "node:events";
import { appendFileSync, mkdtempSync, openSync, closeSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
export const repoRoot = resolve(here, "../../..");
export const TOKEN = "ci-0123456789abcdef-token";
const BIN = process.env.WAITD_BIN ?? join(repoRoot, "target/debug/waitd");

/** A port free now on 127.0.0.1, so that waitd can be started (and restarted) on it. */
export async function freePort() {
  const s = createServer();
  s.listen(0, "127.0.0.1");
  await once(s, "listening");
  const { port } = s.address();
  s.close();
  await once(s, "close");
  return port;
}

/**
 * A waitd on SQLite in a temp dir, on a fixed port, with a token and the
 * allow-list that lets it poll (and call) 127.0.0.1. `stop()` and `start()`
 * restart it on the same store and port.
 */
export class WaitdProcess {
  constructor() {
    this.dir = mkdtempSync(join(process.env.WAITD_TEST_DIR ?? tmpdir(), "waitd-ts-"));
    this.db = join(this.dir, "waitd.db");
    this.log = join(this.dir, "waitd.log");
    this.child = undefined;
    this.port = undefined;
  }

  get url() {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Starts it and resolves once it says it is listening. */
  async start() {
    this.port ??= await freePort();
    const fd = openSync(this.log, "a");
    const child = spawn(
      BIN,
      [
        "serve",
        "--listen", `127.0.0.1:${this.port}`,
        "--database-url", `sqlite://${this.db}`,
        "--tokens", `ci:${TOKEN}`,
        "--allow-targets", "127.0.0.1",
        "--min-poll-interval", "50ms",
        "--lease-ttl", "2s",
        "--webhook-retry-base", "200ms",
        "--rate-limit", "0",
      ],
      { stdio: ["ignore", fd, "pipe"], env: { ...process.env, RUST_LOG: "info", NO_COLOR: "1" } },
    );
    closeSync(fd);
    this.child = child;
    registerChild(child);
    // The log goes to the file, and its "listening" line is the signal it is up.
    let seen = "";
    await new Promise((resolveUp, reject) => {
      const onData = (chunk) => {
        appendFileSync(this.log, chunk);
        seen += chunk.toString();
        if (/listening/i.test(seen)) {
          seen = "";
          child.stderr.off("data", onData);
          child.stderr.on("data", (c) => appendFileSync(this.log, c));
          resolveUp();
        }
      };
      child.stderr.on("data", onData);
      child.once("exit", (code, sig) =>
        reject(new Error(`waitd exited (${code ?? sig}) before it listened; its log: ${this.log}\n${seen}`)),
      );
    });
    child.removeAllListeners("exit");
  }

  /** Stops it with `signal` and resolves once it has exited. */
  async stop(signal = "SIGTERM") {
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, "exit");
    child.kill(signal);
    await exited;
    this.child = undefined;
  }

  async dispose() {
    await this.stop("SIGKILL");
    if (!process.env.WAITD_KEEP_TEST_DIR) rmSync(this.dir, { recursive: true, force: true });
  }
}

// Every waitd started is killed when this process exits, whatever the outcome, and
// its pid is written where the CI script's trap finds it.
const children = new Set();
function registerChild(child) {
  children.add(child);
  child.once("exit", () => children.delete(child));
  if (process.env.WAITD_TEST_DIR) appendFileSync(join(process.env.WAITD_TEST_DIR, "pids"), `${child.pid}\n`);
}
process.once("exit", () => {
  for (const c of children) c.kill("SIGKILL");
});

/**
 * A target and a webhook receiver on 127.0.0.1:0. `GET /state/<name>` answers
 * `{"status": <the state set for name>}` (404 before one is set) and emits
 * `poll:<name>`; `POST /hook/<name>` keeps the request and emits `hook:<name>`.
 */
export class Fixture extends EventEmitter {
  constructor() {
    super();
    this.states = new Map();
    this.hooks = new Map();
    this.server = createServer((req, res) => this.#handle(req, res));
  }

  async start() {
    this.server.listen(0, "127.0.0.1");
    await once(this.server, "listening");
    this.url = `http://127.0.0.1:${this.server.address().port}`;
    return this;
  }

  async close() {
    this.server.closeAllConnections();
    this.server.close();
  }

  set(name, status) {
    this.states.set(name, status);
  }

  /** The next poll of `name`, after now. */
  nextPoll(name) {
    return once(this, `poll:${name}`);
  }

  /** The webhooks `name` has received, or the next one when there is none yet. */
  async hook(name) {
    const got = this.hooks.get(name);
    if (got?.length) return got[0];
    const [req] = await once(this, `hook:${name}`);
    return req;
  }

  #handle(req, res) {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const url = new URL(req.url, "http://x");
      const [, kind, name, ...rest] = url.pathname.split("/");
      if (rest.length) return void res.writeHead(404, { "content-type": "application/json" }).end("{}");
      if (req.method === "GET" && kind === "state" && name) {
        const status = this.states.get(name);
        if (status === undefined) {
          res.writeHead(404, { "content-type": "application/json" }).end("{}");
        } else {
          res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ status }));
        }
        this.emit(`poll:${name}`, status);
        return;
      }
      if (req.method === "POST" && kind === "hook" && name) {
        const got = { headers: req.headers, body: Buffer.concat(chunks) };
        const list = this.hooks.get(name) ?? [];
        list.push(got);
        this.hooks.set(name, list);
        res.writeHead(204).end();
        this.emit(`hook:${name}`, got);
        return;
      }
      res.writeHead(404).end();
    });
  }
}

/**
 * A fetch that reports each request (`request`: url and headers), each answer
 * (`response`: url, status and headers) and each failure (`failed`) on the
 * returned emitter, and otherwise does what the global fetch does.
 */
export function recordingFetch() {
  const events = new EventEmitter();
  const fetch = async (input, init = {}) => {
    const headers = new Headers(init.headers);
    events.emit("request", { url: String(input), headers });
    try {
      const res = await globalThis.fetch(input, init);
      events.emit("response", { url: String(input), status: res.status, headers: res.headers });
      return res;
    } catch (e) {
      events.emit("failed", e);
      throw e;
    }
  };
  return { fetch, events };
}

/** A spec polling `fixture`'s `name` every 100 ms until `want`. */
export function spec(fixture, name, extra = {}) {
  return {
    target: { url: `${fixture.url}/state/${name}` },
    state: "/status",
    want: ["on"],
    fail: ["failed_deployment"],
    timeout: "1m",
    poll: { initial: "100ms", factor: 1, max: "100ms" },
    not_found: "retry",
    ...extra,
  };
}

/** A fresh name for a target or a label. */
let n = 0;
export function unique(prefix = "t") {
  n += 1;
  return `${prefix}${process.pid}x${n}`;
}
