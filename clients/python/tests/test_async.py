"""waitd.AsyncClient: the same methods, awaited, against the live waitd."""

from __future__ import annotations

import asyncio
import logging
import uuid

import httpx
import pytest

import waitd

from conftest import Target, Waitd, spec


def test_async_client(server: Waitd, target: Target) -> None:
    async def main() -> None:
        async with waitd.AsyncClient(server.url, server.token) as client:
            assert "<redacted>" in repr(client) and server.token not in repr(client)
            run = uuid.uuid4().hex[:12]
            url = target.add("deploying")
            w = await client.create(spec(url, labels={"run": run}))
            assert (await client.get(w["id"]))["status"] == "running"

            kinds = []
            async for event in client.follow(w["id"]):
                kinds.append(event["kind"])
                if event["kind"] == "state":
                    target.set(url, "on")
            assert kinds[0] == "created" and kinds[-1] == "succeeded"
            assert (await client.wait(w["id"], timeout=10))["status"] == "succeeded"

            p = await client.create(preset="http.ok", params={"url": target.add("up")})
            g = await client.create_group([spec(target.add("on")), p["id"]], mode="any", labels={"run": run})
            assert (await client.wait(g["id"], timeout=30))["status"] == "succeeded"

            c = await client.create_callback({"labels": {"run": run}})
            assert (await client.complete(c["callback_url"], {"ok": True}))["output"] == {"ok": True}
            f = await client.create_callback()
            assert (await client.fail(f["callback_url"], "no"))["error_detail"] == "no"

            x = await client.create(spec(target.add("deploying"), labels={"run": run}))
            assert (await client.cancel(x["id"]))["status"] == "canceled"

            listed = [v["id"] async for v in client.list(labels={"run": run}, page_size=1)]
            assert listed == [x["id"], c["id"], g["id"], w["id"]]

            with pytest.raises(waitd.NotFound) as nf:
                await client.get(str(uuid.uuid4()))
            assert nf.value.detail

    asyncio.run(main())


class Sent(httpx.AsyncHTTPTransport):
    """A transport that signals when a blocking read has gone out."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if "wait=" in str(request.url.query):
            self.holding.set()
        return await super().handle_async_request(request)


def test_async_wait_survives_a_server_restart(
    server: Waitd, target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="waitd")

    async def main() -> None:
        url = target.add("deploying")
        transport = Sent()
        async with waitd.AsyncClient(server.url, server.token, transport=transport) as client:
            w = await client.create(spec(url))
            await asyncio.to_thread(target.polled, url)
            blocked = asyncio.create_task(client.wait(w["id"], timeout=60))
            await asyncio.wait_for(transport.holding.wait(), 10)
            await asyncio.to_thread(server.restart)
            target.set(url, "on")
            assert (await blocked)["status"] == "succeeded"

            # And a stream broken by a restart resumes where it was.
            url2 = target.add("deploying")
            w2 = await client.create(spec(url2))
            seqs = []
            async for event in client.follow(w2["id"]):
                seqs.append(event["seq"])
                if event["kind"] == "state" and len(seqs) == 2:
                    await asyncio.to_thread(server.restart)
                    target.set(url2, "on")
            assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 3

    asyncio.run(main())
    messages = [r.getMessage() for r in caplog.records]
    assert any("not answering" in m for m in messages)
    assert any("event stream broke" in m for m in messages)


def test_both_clients_have_the_same_methods() -> None:
    def public(cls: type) -> set[str]:
        return {n for n in vars(cls) if not n.startswith("_")} - {"close", "aclose"}

    assert public(waitd.Client) == public(waitd.AsyncClient)
