"""The examples of docs/clients/python.md, run as written against the live
waitd. Each block marked `<!-- client-test: NAME -->` runs in a fresh namespace,
with WAITD_URL and WAITD_TOKEN set, and with the page's stand-in "cloud API",
http://127.0.0.1:9000, replaced by a local server on a free port (the only
change), which answers every resource "on"."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Waitd

PAGE = REPO / "docs" / "clients" / "python.md"
PACKAGE = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- client-test: ([\w-]+) -->\n```python\n(.*?)\n```", re.S)


def examples() -> list[tuple[str, str]]:
    found = BLOCK.findall(PAGE.read_text())
    assert found, f"no client-test examples in {PAGE}"
    return found


class CloudAPI(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"data": {"attributes": {"status": "on"}}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def cloud() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), CloudAPI)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.parametrize("name,code", examples(), ids=[n for n, _ in examples()])
def test_example(name: str, code: str, server: Waitd, cloud: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WAITD_URL", server.url)
    monkeypatch.setenv("WAITD_TOKEN", server.token)
    source = code.replace("http://127.0.0.1:9000", cloud)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, f"{PAGE.name}:{name}", "exec"), {"__name__": "__main__"})
    printed = out.getvalue()
    assert printed.strip(), f"the example {name} printed nothing"
    if name == "first-wait":
        assert printed.startswith("succeeded")
    if name == "webhook":
        assert printed.startswith("wait.succeeded")


def test_models_are_current_with_the_contract() -> None:
    check = subprocess.run(
        [sys.executable, str(PACKAGE / "scripts" / "gen_models.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
