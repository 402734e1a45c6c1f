"""Verifying the webhooks waitd sends (Standard Webhooks)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Iterable
from typing import Any, Protocol, cast

from ._errors import WebhookVerificationError
from ._types import WebhookMessage

TOLERANCE = 300.0


class Headers(Protocol):
    """Anything with `items()` of names and values: a dict, httpx.Headers,
    http.server's `self.headers`, a framework's request headers."""

    def items(self) -> Iterable[tuple[str, Any]]: ...


def _key(secret: str) -> bytes:
    b64 = secret.strip()
    if b64.startswith("whsec_"):
        b64 = b64[len("whsec_") :]
    try:
        key = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not key:
        # Never the secret itself in the message.
        raise WebhookVerificationError("the webhook secret is not whsec_ followed by base64")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` waitd sends: `v1,` and the base64 HMAC-SHA256 of
    `id.timestamp.body` under the secret's key."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify_webhook(
    secret: str,
    headers: Headers,
    body: bytes | str,
    *,
    tolerance: float = TOLERANCE,
    now: float | None = None,
) -> WebhookMessage:
    """Checks a webhook waitd sent and returns its message.

    `secret` is the webhook's `whsec_…` secret, `headers` the request's headers
    (any case), `body` its raw body, exactly as received. Raises
    `waitd.WebhookVerificationError` when a header is missing, the timestamp is
    more than `tolerance` seconds (5 minutes) from now, or no `v1` signature
    matches (compared in constant time)."""
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    missing = [h for h in ("webhook-id", "webhook-timestamp", "webhook-signature") if not lower.get(h)]
    if missing:
        raise WebhookVerificationError(f"the webhook lacks the header {', '.join(missing)}")
    msg_id = lower["webhook-id"]
    try:
        timestamp = int(lower["webhook-timestamp"])
    except ValueError:
        raise WebhookVerificationError("the webhook's timestamp is not a number of seconds") from None
    current = time.time() if now is None else now
    if timestamp < current - tolerance:
        raise WebhookVerificationError("the webhook's timestamp is too old: a replay, or a clock far off")
    if timestamp > current + tolerance:
        raise WebhookVerificationError("the webhook's timestamp is in the future: a clock far off")
    raw = body.encode() if isinstance(body, str) else bytes(body)
    expected = sign(secret, msg_id, timestamp, raw).encode()
    matched = False
    for candidate in lower["webhook-signature"].split(" "):
        version, _, _sig = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(candidate.encode(), expected):
            matched = True
    if not matched:
        raise WebhookVerificationError("no signature of the webhook matches its secret")
    try:
        message = json.loads(raw)
    except ValueError:
        raise WebhookVerificationError("the webhook's body is not JSON") from None
    return cast(WebhookMessage, message)
