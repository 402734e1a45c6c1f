"""What the sync and async clients share: building requests, reading answers,
backing off, and parsing server-sent events. No I/O here."""

from __future__ import annotations

import json
import logging
import os
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import httpx

from ._errors import Error
from ._errors import api_error as api_error
from ._models import Event, Wait

DEFAULT_URL = "http://127.0.0.1:8080"
TERMINAL = frozenset({"succeeded", "failed", "timed_out", "canceled", "error"})
# A blocked read's answer for each end (and 200 for succeeded): a wait, not a problem.
HELD_ENDS = frozenset({200, 409, 412, 422, 424})
# The longest one blocked request holds: shorter than the idle timeouts of most
# proxies, so that a quiet wait is never cut by one.
HOLD_CHUNK = 50.0
# SSE: the server sends a keep-alive comment every 10 s; silence for this long
# means the connection is dead.
STREAM_IDLE = 35.0
CONNECT_TIMEOUT = 5.0


_CALLBACK_SECRET = re.compile(r"(/callbacks/)[^/?#\s\"']+")


class RedactCallbackURLs(logging.Filter):
    """httpx logs each request's URL at INFO; a callback URL's path is its
    secret, so it is logged as /callbacks/<redacted>."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any("/callbacks/" in str(a) for a in record.args):
            record.args = tuple(
                _CALLBACK_SECRET.sub(r"\1<redacted>", str(a)) if "/callbacks/" in str(a) else a
                for a in record.args
            )
        return True


logging.getLogger("httpx").addFilter(RedactCallbackURLs())


def base_url(url: str | None) -> str:
    url = url or os.environ.get("WAITD_URL") or DEFAULT_URL
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise Error("the waitd URL must be http:// or https:// with a host, e.g. http://127.0.0.1:8080")
    return url.rstrip("/")


def token(tok: str | None) -> str | None:
    return tok if tok is not None else (os.environ.get("WAITD_TOKEN") or None)


def auth_headers(tok: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"} if tok else {}


def wait_path(wait_id: str) -> str:
    if not wait_id or "/" in wait_id or "?" in wait_id or "#" in wait_id:
        raise Error(f"not a wait id: {wait_id!r}")
    return f"/waits/{wait_id}"


def callback_url(url: str, suffix: str = "") -> str:
    """The callback URL (a secret: it never goes into a message) with `suffix`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or "/callbacks/" not in parts.path:
        raise Error("not a callback URL: use the callback_url that create_callback returned, exactly as given")
    return url.rstrip("/") + suffix


def hold_param(seconds: float) -> str:
    """`?wait=` for a hold of `seconds` (waitd's duration syntax)."""
    return f"{max(1, int(seconds * 1000))}ms"


def retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        # At least 0.1 s, so that a Retry-After of 0 does not make a busy loop.
        return max(0.1, float(value))
    except ValueError:
        return None


def is_problem(response: httpx.Response) -> bool:
    kind: str = response.headers.get("content-type", "")
    return kind.startswith("application/problem+json")


def body_json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def raise_for(response: httpx.Response) -> None:
    """Raises the `waitd.Error` a non-2xx answer stands for."""
    if response.status_code < 300:
        return
    raise api_error(response.status_code, body_json(response), retry_after(response))


def answer(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer; the matching `waitd.Error` for any other."""
    raise_for(response)
    data = body_json(response)
    if data is None:
        raise Error("waitd answered with something that is not JSON", response.status_code)
    return data


def held(response: httpx.Response) -> Wait | None:
    """The wait a blocked read ended with, or None when it is still running (202)."""
    if response.status_code in HELD_ENDS and not is_problem(response):
        data = body_json(response)
        if isinstance(data, dict) and data.get("status") in TERMINAL:
            return cast(Wait, data)
    return None


def create_body(
    spec: Mapping[str, Any] | None, preset: str | None, params: Mapping[str, str] | None
) -> dict[str, Any]:
    body = dict(spec or {})
    if preset is not None:
        body["preset"] = preset
    if params is not None:
        body["params"] = dict(params)
    if not body:
        raise Error("create needs a spec, or a preset with its params")
    return body


def group_body(
    members: Sequence[Mapping[str, Any] | str],
    mode: str,
    timeout: str | None,
    labels: Mapping[str, str] | None,
    keep_running: bool | None,
    notify: Sequence[Mapping[str, Any]] | None,
) -> dict[str, Any]:
    if mode not in ("all", "any"):
        raise Error(f"a group's mode is \"all\" or \"any\", not {mode!r}")
    body: dict[str, Any] = {
        mode: [{"id": m} if isinstance(m, str) else dict(m) for m in members],
    }
    for key, value in (("timeout", timeout), ("labels", labels), ("keep_running", keep_running), ("notify", notify)):
        if value is not None:
            body[key] = value if not isinstance(value, Mapping) else dict(value)
    return body


def callback_body(spec: Mapping[str, Any] | None, heartbeat: str | None) -> dict[str, Any]:
    body = dict(spec or {})
    cb = dict(body.get("callback") or {})
    if heartbeat is not None:
        cb["heartbeat"] = heartbeat
    body["callback"] = cb
    return body


def list_params(
    status: str | None, labels: Mapping[str, str] | None, limit: int | None, cursor: str | None
) -> list[tuple[str, str]]:
    params: list[tuple[str, str]] = []
    if status is not None:
        params.append(("status", status))
    for k, v in (labels or {}).items():
        params.append(("label", f"{k}:{v}"))
    if limit is not None:
        params.append(("limit", str(limit)))
    if cursor is not None:
        params.append(("cursor", cursor))
    return params


class Backoff:
    """Delays between attempts to reach a server that is away: 0.1 s doubling up
    to `cap`, each with up to 20% jitter."""

    def __init__(self, first: float = 0.1, cap: float = 2.0) -> None:
        self.first = first
        self.cap = cap
        self.next_delay = first

    def reset(self) -> None:
        self.next_delay = self.first

    def next(self) -> float:
        delay = self.next_delay
        self.next_delay = min(self.cap, self.next_delay * 2)
        return delay * (1 + random.uniform(0, 0.2))


@dataclass
class Frame:
    """One server-sent event: its `id`, `event` name and `data`."""

    id: str | None
    event: str | None
    data: str


class SSEParser:
    """Server-sent events from lines (the text/event-stream format): feed each
    line, get a Frame when a blank line ends one. Comments (keep-alives) and
    frames without data are skipped."""

    def __init__(self) -> None:
        self._id: str | None = None
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> Frame | None:
        if line == "":
            if not self._data:
                self._event = None
                return None
            frame = Frame(self._id, self._event, "\n".join(self._data))
            self._event, self._data = None, []
            return frame
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def frames(self, lines: Iterable[str]) -> Iterable[Frame]:
        for line in lines:
            frame = self.feed(line)
            if frame is not None:
                yield frame


def event_of(frame: Frame) -> Event:
    try:
        data = json.loads(frame.data)
    except ValueError as e:
        raise Error(f"waitd sent an event that is not JSON: {e}") from None
    if not isinstance(data, dict) or "kind" not in data:
        raise Error("waitd sent an event without a kind")
    return cast(Event, data)


def is_terminal(event: Event) -> bool:
    return event["kind"] in TERMINAL


def stream_headers(last_event_id: str | None) -> dict[str, str]:
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return headers


def hold_timeout(hold: float) -> httpx.Timeout:
    return httpx.Timeout(hold + 15.0, connect=CONNECT_TIMEOUT)


def stream_timeout() -> httpx.Timeout:
    return httpx.Timeout(STREAM_IDLE, connect=CONNECT_TIMEOUT)


def unreachable(what: str, seconds: float, cause: BaseException) -> Error:
    from ._errors import TransportError

    return TransportError(f"{what}: waitd could not be reached for {seconds:.0f}s ({describe(cause)})")


def describe(e: BaseException) -> str:
    """A transport error as a sentence, without its URL."""
    text = str(e) or type(e).__name__
    return text
