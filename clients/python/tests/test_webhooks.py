"""verify_webhook: a real webhook from waitd passes; forged, stale, tampered
and incomplete ones are refused."""

from __future__ import annotations

import base64
import json
import secrets
import time

import pytest

import waitd

from conftest import Receiver, Target, Waitd, spec


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def test_a_webhook_from_waitd_verifies(server: Waitd, target: Target, receiver: Receiver) -> None:
    secret = new_secret()
    with waitd.Client(server.url, server.token) as client:
        w = client.create(spec(target.add("on"), notify=[{"url": receiver.url, "secret": secret}]))
        # The secret is write-only: reads show it redacted.
        assert secret not in json.dumps(client.get(w["id"]))
    headers, body = receiver.next("wait.succeeded")

    msg = waitd.verify_webhook(secret, headers, body)
    assert msg["type"] == "wait.succeeded"
    assert msg["data"]["id"] == w["id"] and msg["data"]["status"] == "succeeded"
    assert msg["event"]["kind"] == "succeeded"
    # Headers in any case; the body as text too.
    assert waitd.verify_webhook(secret, {k.upper(): v for k, v in headers.items()}, body.decode())

    refused = [
        ("another secret", new_secret(), headers, body),
        ("a tampered body", secret, headers, body.replace(b"succeeded", b"failed")),
        ("another id", secret, {**headers, "webhook-id": "msg_other"}, body),
        ("a moved timestamp", secret, {**headers, "webhook-timestamp": str(int(headers["webhook-timestamp"]) + 1)}, body),
        ("no signature", secret, {k: v for k, v in headers.items() if k.lower() != "webhook-signature"}, body),
        ("a v2 signature", secret, {**headers, "webhook-signature": headers["webhook-signature"].replace("v1,", "v2,")}, body),
    ]
    for what, key, hdrs, raw in refused:
        with pytest.raises(waitd.WebhookVerificationError) as raised:
            waitd.verify_webhook(key, hdrs, raw)
        assert key not in str(raised.value) + repr(raised.value), what


def test_stale_and_future_webhooks_are_refused() -> None:
    secret = new_secret()
    body = json.dumps({"type": "wait.succeeded", "data": {}, "event": {}}).encode()
    for offset, word in ((-301, "old"), (301, "future")):
        ts = int(time.time()) + offset
        headers = {
            "webhook-id": "msg_1",
            "webhook-timestamp": str(ts),
            "webhook-signature": waitd.sign_webhook(secret, "msg_1", ts, body),
        }
        with pytest.raises(waitd.WebhookVerificationError, match=word):
            waitd.verify_webhook(secret, headers, body)
        # Within the tolerance (or with a wider one) the same webhook passes.
        waitd.verify_webhook(secret, headers, body, tolerance=400)
    ts = int(time.time())
    good = {"webhook-id": "m", "webhook-timestamp": str(ts), "webhook-signature": waitd.sign_webhook(secret, "m", ts, body)}
    # Several signatures (a rotated secret): any one that matches will do.
    rotated = {**good, "webhook-signature": "v1,bm90LWl0 " + good["webhook-signature"]}
    assert waitd.verify_webhook(secret, rotated, body)["type"] == "wait.succeeded"
    with pytest.raises(waitd.WebhookVerificationError):
        waitd.verify_webhook("whsec_", good, body)
