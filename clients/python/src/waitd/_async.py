"""The asyncio client, `waitd.AsyncClient`: `waitd.Client`'s methods, awaited.

Kept method for method in step with _sync.py."""

from __future__ import annotations

import builtins
import logging
import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, cast

import httpx

from . import _core
from ._errors import Error, TransportError, Unavailable, WaitTimeout
from ._models import Event, Status, Wait, WaitPage
from ._types import CallbackWait

log = logging.getLogger("waitd")


class AsyncClient:
    """A waitd server's API, for asyncio (see `waitd.Client`).

    `base_url` defaults to `WAITD_URL` (else http://127.0.0.1:8080) and `token`
    to `WAITD_TOKEN`; the token goes as `Authorization: Bearer` and is never
    shown. `timeout` bounds each ordinary request; `wait()` and `follow()`
    choose their own. `reconnect_for` is how long `wait()` and `follow()` keep
    trying to reach a server that went away (a restart, a deploy) before they
    give up, when the caller gave them no timeout of their own.
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        reconnect_for: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = _core.base_url(base_url)
        self._token = _core.token(token)
        self.reconnect_for = reconnect_for
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=_core.CONNECT_TIMEOUT),
            transport=transport,
            headers={"User-Agent": "waitd-python"},
        )

    def __repr__(self) -> str:
        shown = "<redacted>" if self._token else None
        return f"AsyncClient(base_url={self.base_url!r}, token={shown!r})"

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _send(
        self,
        method: str,
        url: str,
        *,
        params: Any = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        auth: bool = True,
    ) -> httpx.Response:
        hdrs = dict(_core.auth_headers(self._token) if auth else {})
        hdrs.update(headers or {})
        request = self._http.build_request(
            method,
            url,
            params=params,
            json=json,
            headers=hdrs,
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )
        try:
            return await self._http.send(request)
        except httpx.TransportError as e:
            raise TransportError(f"{method} to waitd failed: {_core.describe(e)}") from e

    # -- creating -------------------------------------------------------------

    async def create(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        preset: str | None = None,
        params: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> Wait:
        """Creates a wait from a request (`spec`), or from a preset and its
        params (laid over `spec` when both are given)."""
        body = _core.create_body(spec, preset, params)
        return cast(Wait, await self._create(body, idempotency_key))

    async def create_group(
        self,
        members: Sequence[Mapping[str, Any] | str],
        *,
        mode: str = "all",
        timeout: str | None = None,
        labels: Mapping[str, str] | None = None,
        keep_running: bool | None = None,
        notify: Sequence[Mapping[str, Any]] | None = None,
        idempotency_key: str | None = None,
    ) -> Wait:
        """Creates a group: a wait over `members` (each a request, or the id of
        a wait already made) that succeeds when `all` do, or `any` one does."""
        body = _core.group_body(members, mode, timeout, labels, keep_running, notify)
        return cast(Wait, await self._create(body, idempotency_key))

    async def create_callback(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        heartbeat: str | None = None,
        idempotency_key: str | None = None,
    ) -> CallbackWait:
        """Creates a callback wait: it ends when its `callback_url` (in the answer,
        and only there) is completed or failed. `spec` may add `timeout`,
        `labels`, `notify`, `state`/`want`/`fail` to judge the body…"""
        body = _core.callback_body(spec, heartbeat)
        wait = await self._create(body, idempotency_key)
        if not isinstance(wait.get("callback_url"), str):
            raise Error(
                "the answer carries no callback_url: it replayed an earlier create with this "
                "idempotency key, and only the first answer shows the URL"
            )
        return cast(CallbackWait, wait)

    async def _create(self, body: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return cast("dict[str, Any]", _core.answer(await self._send("POST", "/waits", json=body, headers=headers)))

    # -- reading --------------------------------------------------------------

    async def get(self, wait_id: str) -> Wait:
        """The wait as it stands now."""
        return cast(Wait, _core.answer(await self._send("GET", _core.wait_path(wait_id))))

    async def list(
        self,
        *,
        status: Status | None = None,
        labels: Mapping[str, str] | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[Wait]:
        """Every wait that matches, newest first, page after page."""
        cursor: str | None = None
        while True:
            page = await self.list_page(status=status, labels=labels, limit=page_size, cursor=cursor)
            for item in page["items"]:
                yield item
            cursor = page.get("next_cursor")
            if not cursor:
                return

    async def list_page(
        self,
        *,
        status: Status | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> WaitPage:
        """One page of waits; pass its `next_cursor` as `cursor` for the next."""
        params = _core.list_params(status, labels, limit, cursor)
        return cast(WaitPage, _core.answer(await self._send("GET", "/waits", params=params)))

    async def events(self, wait_id: str) -> builtins.list[Event]:
        """A wait's history so far, oldest first."""
        out: builtins.list[Event] = []
        after: str | None = None
        while True:
            params = {"after": after} if after else None
            page = _core.answer(await self._send("GET", f"{_core.wait_path(wait_id)}/events", params=params))
            out.extend(page["items"])
            after = page.get("next_cursor")
            if not after or not page["items"]:
                return out

    # -- changing -------------------------------------------------------------

    async def cancel(self, wait_id: str) -> Wait:
        """Cancels a running wait (an ended one is returned as it is)."""
        return cast(Wait, _core.answer(await self._send("POST", f"{_core.wait_path(wait_id)}/cancel")))

    async def complete(self, callback_url: str, output: Any = None) -> Wait:
        """Completes a callback wait: it ends `succeeded` with `output` (any JSON;
        `{}` when None), unless its spec judges the body otherwise (then it may
        fail, or go on running with the state read from it)."""
        return await self._callback(_core.callback_url(callback_url), {} if output is None else output)

    async def fail(self, callback_url: str, detail: Any = None) -> Wait:
        """Fails a callback wait, with `detail` (any JSON) as its `error_detail`."""
        return await self._callback(_core.callback_url(callback_url, "/fail"), {} if detail is None else detail)

    async def heartbeat(self, callback_url: str) -> Wait:
        """Keeps a callback wait with a `heartbeat` alive."""
        return await self._callback(_core.callback_url(callback_url, "/heartbeat"), {})

    async def _callback(self, url: str, body: Any) -> Wait:
        # The URL is the credential: no token goes with it, and it is never shown.
        try:
            response = await self._send("POST", url, json=body, auth=False)
        except TransportError as e:
            raise TransportError(f"the callback could not be sent: {e.detail}") from None
        return cast(Wait, _core.answer(response))

    # -- waiting --------------------------------------------------------------

    async def wait(self, wait_id: str, *, timeout: float | None = None) -> Wait:
        """Blocks until the wait ends and returns it, whatever its status
        (succeeded, failed, timed_out, canceled or error).

        It holds a blocking read on the server, and rides out a restart: while
        the server is away (a refused or broken connection, a 503), it asks
        again with backoff. `timeout` (seconds) bounds it all: past it,
        `waitd.WaitTimeout` carries the wait as last seen. Without one, the
        wait's own deadline bounds it, and `reconnect_for` how long the server
        may stay away."""
        path = _core.wait_path(wait_id)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        backoff = _core.Backoff()
        away_since: float | None = None
        away = ""
        last: Wait | None = None
        while True:
            now = time.monotonic()
            left = None if deadline is None else deadline - now
            if left is not None and left <= 0:
                if away_since is not None:
                    raise WaitTimeout(f"waitd could not be reached within {timeout}s ({away})", last)
                raise WaitTimeout(f"the wait did not end within {timeout}s", last)
            hold = _core.HOLD_CHUNK if left is None else min(left, _core.HOLD_CHUNK)
            delay: float
            try:
                response = await self._send(
                    "GET", path, params={"wait": _core.hold_param(hold)}, timeout=_core.hold_timeout(hold)
                )
            except TransportError as e:
                away_since = away_since or now
                away = e.detail
                if deadline is None and now - away_since > self.reconnect_for:
                    raise _core.unreachable("wait", now - away_since, e.__cause__ or e) from None
                delay = backoff.next()
                log.info("waitd is not answering (%s); asking again in %.1fs", e.detail, delay)
            else:
                away_since = None
                ended = _core.held(response)
                if ended is not None:
                    return ended
                if response.status_code == 202:
                    backoff.reset()
                    last = cast(Wait, _core.body_json(response))
                    continue
                if response.status_code in (429, 503):
                    err = _core.api_error(response.status_code, _core.body_json(response), _core.retry_after(response))
                    delay = err.retry_after if err.retry_after is not None else backoff.next()
                    log.info("waitd answered %s (%s); asking again in %.1fs", err.status, err.detail, delay)
                else:
                    _core.raise_for(response)
                    return cast(Wait, _core.answer(response))
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - time.monotonic()))
            await asyncio.sleep(delay)

    async def follow(self, wait_id: str, *, after: int | None = None) -> AsyncIterator[Event]:
        """The wait's events as they happen, from the first (or after the `seq`
        `after`), ending after the terminal one. A dropped connection or a
        restarted server is resumed from the last event seen (`Last-Event-ID`),
        so no event comes twice or goes missing."""
        path = f"{_core.wait_path(wait_id)}/events"
        last = None if after is None else str(after)
        backoff = _core.Backoff()
        away_since: float | None = None
        while True:
            delay: float
            try:
                request = self._http.build_request(
                    "GET",
                    path,
                    params={"follow": "true"},
                    headers={**_core.auth_headers(self._token), **_core.stream_headers(last)},
                    timeout=_core.stream_timeout(),
                )
                response = await self._http.send(request, stream=True)
                try:
                    if response.status_code != 200:
                        await response.aread()
                        if response.status_code not in (429, 503):
                            _core.raise_for(response)
                        err = _core.api_error(response.status_code, _core.body_json(response), _core.retry_after(response))
                        raise Unavailable(err.status, err.detail, retry_after=err.retry_after)
                    away_since = None
                    backoff.reset()
                    parser = _core.SSEParser()
                    async for line in response.aiter_lines():
                        frame = parser.feed(line)
                        if frame is None:
                            continue
                        event = _core.event_of(frame)
                        last = frame.id if frame.id is not None else str(event["seq"])
                        yield event
                        if _core.is_terminal(event):
                            return
                finally:
                    await response.aclose()
                # The stream ended before the terminal event: resume it.
                delay = backoff.next()
            except (httpx.TransportError, Unavailable) as e:
                now = time.monotonic()
                away_since = away_since or now
                if now - away_since > self.reconnect_for:
                    raise _core.unreachable("follow", now - away_since, e) from None
                wait_for = getattr(e, "retry_after", None)
                delay = wait_for if wait_for is not None else backoff.next()
                log.info("the event stream broke (%s); resuming in %.1fs", _core.describe(e), delay)
            await asyncio.sleep(delay)
