"""waitd.Client against a live waitd: every method, errors, a restart."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import httpx
import pytest

import waitd

from conftest import Target, Waitd, spec


@pytest.fixture
def client(server: Waitd) -> Any:
    with waitd.Client(server.url, server.token) as c:
        yield c


def test_create_get_and_wait(client: waitd.Client, target: Target) -> None:
    url = target.add("deploying")
    w = client.create(spec(url, labels={"suite": "py"}))
    assert w["status"] == "running"
    assert w["labels"] == {"suite": "py"}
    target.polled(url)
    assert client.get(w["id"])["id"] == w["id"]
    target.set(url, "on")
    done = client.wait(w["id"], timeout=30)
    assert done["status"] == "succeeded"
    assert done["state"] == "on"
    assert done["reason"]


def test_wait_returns_every_end(client: waitd.Client, target: Target) -> None:
    url = target.add("broken")
    failed = client.wait(client.create(spec(url))["id"], timeout=30)
    assert failed["status"] == "failed"
    canceled = client.cancel(client.create(spec(target.add("deploying")))["id"])
    assert canceled["status"] == "canceled"
    assert client.wait(canceled["id"], timeout=30)["status"] == "canceled"
    # Cancelling an ended wait returns it unchanged.
    assert client.cancel(canceled["id"])["status"] == "canceled"


def test_wait_gives_up_at_the_callers_timeout(client: waitd.Client, target: Target) -> None:
    url = target.add("deploying")
    w = client.create(spec(url))
    with pytest.raises(waitd.WaitTimeout) as raised:
        client.wait(w["id"], timeout=0.3)
    assert isinstance(raised.value, waitd.Error)
    assert raised.value.wait is None or raised.value.wait["status"] == "running"
    client.cancel(w["id"])


def test_preset_with_params(client: waitd.Client, target: Target) -> None:
    url = target.add("up")
    w = client.create(preset="http.ok", params={"url": url})
    assert w["spec"]["target"]["url"] == url
    assert client.wait(w["id"], timeout=30)["status"] == "succeeded"


def test_group(client: waitd.Client, target: Target) -> None:
    a, b = target.add("deploying"), target.add("deploying")
    existing = client.create(spec(b))
    group = client.create_group([spec(a), existing["id"]], mode="all", timeout="1m", labels={"kind": "group"})
    assert group["mode"] == "all"
    assert [m["id"] for m in group["members"] or []][1] == existing["id"]
    target.set(a, "on")
    target.set(b, "on")
    done = client.wait(group["id"], timeout=30)
    assert done["status"] == "succeeded"
    assert all(m["status"] == "succeeded" for m in done["members"] or [])


def test_callback_complete_and_fail(client: waitd.Client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    cw = client.create_callback({"timeout": "1m", "labels": {"kind": "callback"}}, heartbeat="30s")
    url = cw["callback_url"]
    assert url.startswith(client.base_url + "/callbacks/")
    assert client.heartbeat(url)["status"] == "running"
    done = client.complete(url, {"build": 42})
    assert done["status"] == "succeeded"
    assert done["output"] == {"build": 42}
    assert client.wait(cw["id"], timeout=10)["output"] == {"build": 42}
    # The first completion wins; a later one says how the wait ended.
    with pytest.raises(waitd.Conflict) as raised:
        client.complete(url, {"build": 43})
    assert raised.value.wait is not None and raised.value.wait["status"] == "succeeded"
    assert url.split("/callbacks/")[1] not in str(raised.value) + repr(raised.value)

    other = client.create_callback()
    failed = client.fail(other["callback_url"], {"step": "tests", "exit": 1})
    assert failed["status"] == "failed"
    assert failed["error_detail"] == {"step": "tests", "exit": 1}
    # httpx logs each request's URL: a callback URL's secret is not in the log.
    assert "/callbacks/<redacted>" in caplog.text
    for secret_url in (url, other["callback_url"]):
        assert secret_url.split("/callbacks/")[1] not in caplog.text


def test_idempotency_key(client: waitd.Client, target: Target) -> None:
    key = "py-" + uuid.uuid4().hex
    body = spec(target.add("deploying"))
    first = client.create(body, idempotency_key=key)
    assert client.create(body, idempotency_key=key)["id"] == first["id"]
    with pytest.raises(waitd.Conflict) as raised:
        client.create({**body, "timeout": "2m"}, idempotency_key=key)
    assert raised.value.detail
    client.cancel(first["id"])


def test_list_follows_the_cursor(client: waitd.Client, target: Target) -> None:
    run = uuid.uuid4().hex[:12]
    made = [client.create(spec(target.add("deploying"), labels={"run": run}))["id"] for _ in range(3)]
    page = client.list_page(labels={"run": run}, limit=1)
    assert len(page["items"]) == 1 and page.get("next_cursor")
    listed = [w["id"] for w in client.list(labels={"run": run}, page_size=1)]
    assert listed == list(reversed(made))  # newest first, every page
    for wid in made:
        client.cancel(wid)
    assert [w["id"] for w in client.list(labels={"run": run}, status="canceled")] == listed
    assert list(client.list(labels={"run": run}, status="running")) == []


def test_problems_carry_the_servers_sentence(server: Waitd, client: waitd.Client, target: Target) -> None:
    with pytest.raises(waitd.NotFound) as nf:
        client.get(str(uuid.uuid4()))
    assert nf.value.status == 404 and len(nf.value.detail) > 10

    with pytest.raises(waitd.BadRequest) as bad:
        client.create({"target": {"url": target.add("x")}, "state": "/status", "want": ["on"], "poll": {"initial": "soon"}})
    assert bad.value.status == 400 and bad.value.detail
    assert any(e["field"].startswith("poll") for e in bad.value.errors)

    with pytest.raises(waitd.Unprocessable):
        client.create(preset="no.such.preset", params={})

    with waitd.Client(server.url, "wrong-" + server.token) as stranger:
        with pytest.raises(waitd.Unauthorized) as unauth:
            stranger.get(str(uuid.uuid4()))
    for shown in (str(unauth.value), repr(unauth.value), repr(stranger), repr(client)):
        assert server.token not in shown
    assert "<redacted>" in repr(client)

    with pytest.raises(waitd.NotFound) as cb:
        client.complete(server.url + "/callbacks/not-a-secret-we-made")
    assert "not-a-secret-we-made" not in str(cb.value) + repr(cb.value)

    with waitd.Client(f"http://127.0.0.1:{server.port + 0}/", server.token) as same:
        assert same.base_url == server.url


def test_unreachable_is_a_transport_error() -> None:
    from conftest import free_port

    wid = str(uuid.uuid4())
    with waitd.Client(f"http://127.0.0.1:{free_port()}", "tok", reconnect_for=0.3) as c:
        with pytest.raises(waitd.TransportError) as raised:
            c.get(wid)
        assert raised.value.status is None
        # wait() and follow() keep trying, for reconnect_for or the caller's timeout.
        with pytest.raises(waitd.TransportError, match="could not be reached"):
            c.wait(wid)
        with pytest.raises(waitd.TransportError, match="could not be reached"):
            list(c.follow(wid))
        with pytest.raises(waitd.WaitTimeout, match="could not be reached within"):
            c.wait(wid, timeout=0.3)


class Sent(httpx.HTTPTransport):
    """A transport that signals when a blocking read has gone out."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if "wait=" in str(request.url.query):
            self.holding.set()
        return super().handle_request(request)


def test_wait_survives_a_server_restart(
    server: Waitd, target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="waitd")
    url = target.add("deploying")
    transport = Sent()
    with waitd.Client(server.url, server.token, transport=transport) as c:
        w = c.create(spec(url))
        target.polled(url)
        result: dict[str, Any] = {}

        def block() -> None:
            try:
                result["wait"] = c.wait(w["id"], timeout=60)
            except BaseException as e:  # handed to the test thread
                result["error"] = e

        t = threading.Thread(target=block)
        t.start()
        assert transport.holding.wait(10)
        server.kill()
        # While it is down, the client keeps asking (connection refused).
        server.start()
        target.set(url, "on")
        t.join(60)
    assert not t.is_alive()
    assert "error" not in result, result.get("error")
    assert result["wait"]["status"] == "succeeded"
    assert any("not answering" in r.getMessage() for r in caplog.records)


def test_follow(client: waitd.Client, target: Target) -> None:
    url = target.add("deploying")
    w = client.create(spec(url))
    kinds = []
    for event in client.follow(w["id"]):
        kinds.append(event["kind"])
        if event["kind"] == "state":
            target.set(url, "on")
    assert kinds[0] == "created" and kinds[-1] == "succeeded"
    # A finished wait's stream replays its history after a given seq, and ends.
    assert [e["seq"] for e in client.follow(w["id"], after=1)][0] == 2
    assert [e["seq"] for e in client.events(w["id"])] == list(range(1, len(kinds) + 1))


def test_follow_resumes_after_a_restart(server: Waitd, client: waitd.Client, target: Target) -> None:
    url = target.add("deploying")
    w = client.create(spec(url))
    seqs: list[int] = []
    kinds: list[str] = []
    restarted = False
    for event in client.follow(w["id"]):
        seqs.append(event["seq"])
        kinds.append(event["kind"])
        if event["kind"] == "state" and not restarted:
            restarted = True
            server.restart()
            target.set(url, "on")
    assert restarted
    assert kinds[-1] == "succeeded"
    # Resumed with Last-Event-ID: nothing twice, nothing lost.
    assert seqs == list(range(1, len(seqs) + 1))
