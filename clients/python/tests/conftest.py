"""A live waitd for the tests, on each store named by WAITD_TEST_STORES, and the
local HTTP servers its waits poll and post to.

WAITD_BIN is the binary (default: target/debug/waitd of the repository);
WAITD_TEST_STORES a space-separated list of store URLs (default: a temporary
SQLite file). .ci/client-python sets both.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
BIN = Path(os.environ.get("WAITD_BIN", REPO / "target" / "debug" / "waitd"))
SIGNAL_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Waitd:
    """One waitd server process on a store; restart() kills it (SIGKILL) and
    starts it again on the same store and port."""

    def __init__(self, store: str, workdir: Path) -> None:
        self.store = store
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = "t-" + secrets.token_hex(16)
        self.secret_key = secrets.token_hex(32)
        self.log = workdir / f"waitd-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [
            str(BIN), "serve",
            "--listen", f"127.0.0.1:{self.port}",
            "--database-url", self.store,
            "--tokens", f"tests:{self.token}",
            "--secret-key", self.secret_key,
            "--allow-targets", "127.0.0.1",
            "--min-poll-interval", "10ms",
            "--lease-ttl", os.environ.get("WAITD_TEST_LEASE_TTL", "2s"),
            "--rate-limit", "0",
            "--webhook-timeout", "1s",
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        # The CI script kills what is listed here should the tests die too hard
        # to stop their servers themselves.
        pids = os.environ.get("WAITD_TEST_PIDS")
        if pids:
            with open(pids, "a") as f:
                f.write(f"{self.proc.pid}\n")
        deadline = time.monotonic() + SIGNAL_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"waitd did not become ready on {self.url}; its log:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def kill(self) -> None:
        """Ends the server at once, as a crash would: SIGKILL, no goodbye."""
        self.stop()

    def restart(self) -> None:
        self.kill()
        self.start()


def _stores() -> list[str]:
    listed = os.environ.get("WAITD_TEST_STORES", "").split()
    return listed or ["sqlite"]


def _store_id(store: str) -> str:
    return store.split(":", 1)[0]


@pytest.fixture(scope="session", params=_stores(), ids=_store_id)
def waitd_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Waitd]:
    if not BIN.exists():
        pytest.exit(f"the waitd binary {BIN} is missing: build it with cargo build --bin waitd", 2)
    workdir = tmp_path_factory.mktemp(_store_id(request.param))
    store = request.param
    if store == "sqlite":
        store = f"sqlite://{workdir / 'waitd.db'}"
    server = Waitd(store, workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def server(waitd_server: Waitd) -> Waitd:
    # A test that killed the server and failed before it started again leaves
    # it stopped: start it for the next one.
    if waitd_server.proc is None or waitd_server.proc.poll() is not None:
        waitd_server.start()
    return waitd_server


class Target:
    """The API a wait polls: GET /<name> answers {"status": <its state>}, and
    every poll is counted so that a test can await one."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}
        self.polls: dict[str, int] = {}
        self.cond = threading.Condition()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                name = self.path.lstrip("/")
                with target.cond:
                    state = target.states.get(name)
                    target.polls[name] = target.polls.get(name, 0) + 1
                    target.cond.notify_all()
                if state is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"status": state}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def add(self, state: str) -> str:
        """A new resource in `state`; its URL."""
        name = "r-" + secrets.token_hex(6)
        self.set(name, state)
        return f"{self.base}/{name}"

    @staticmethod
    def name_of(url: str) -> str:
        return url.rsplit("/", 1)[-1]

    def set(self, name_or_url: str, state: str) -> None:
        with self.cond:
            self.states[self.name_of(name_or_url)] = state

    def polled(self, url: str, times: int = 1) -> None:
        """Returns once `url` has been polled `times` times in all."""
        name = self.name_of(url)
        with self.cond:
            if not self.cond.wait_for(lambda: self.polls.get(name, 0) >= times, SIGNAL_TIMEOUT):
                raise AssertionError(f"{url} was not polled {times} times within {SIGNAL_TIMEOUT}s")

    def poll_count(self, url: str) -> int:
        with self.cond:
            return self.polls.get(self.name_of(url), 0)

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture(scope="session")
def target() -> Iterator[Target]:
    t = Target()
    yield t
    t.close()


class Receiver:
    """A webhook receiver: keeps each POST's headers and body, answers 204."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.cond:
                    receiver.received.append((dict(self.headers.items()), body))
                    receiver.cond.notify_all()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"

    def next(self, kind: str) -> tuple[dict[str, str], bytes]:
        """The first webhook received whose type is `kind`, once it comes."""
        def find() -> tuple[dict[str, str], bytes] | None:
            for headers, body in self.received:
                if json.loads(body).get("type") == kind:
                    return headers, body
            return None

        with self.cond:
            found = self.cond.wait_for(find, SIGNAL_TIMEOUT)
        if not found:
            raise AssertionError(f"no {kind} webhook within {SIGNAL_TIMEOUT}s")
        return found

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


FAST = {"initial": "100ms", "factor": 1, "max": "100ms"}


def spec(url: str, **more: Any) -> dict[str, Any]:
    """A wait on `url` that succeeds at "on" and fails at "broken", polled every 100 ms."""
    body: dict[str, Any] = {
        "target": {"url": url},
        "state": "/status",
        "want": ["on"],
        "fail": ["broken"],
        "timeout": "1m",
        "poll": FAST,
    }
    body.update(more)
    return body


@pytest.fixture
def tmpdir_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)
