"""Types written by hand: what the contract does not describe as a schema."""

from __future__ import annotations

from typing import TypedDict

from ._models import Event, Wait


class CallbackWait(Wait):
    """A callback wait as its create answers it: the wait and its `callback_url`,
    shown in this answer only (the server keeps a hash of its secret)."""

    callback_url: str


class WebhookMessage(TypedDict):
    """The body of a webhook (Standard Webhooks): `type` is `wait.` and the
    event's kind, `data` the wait when sent, `event` the event it announces."""

    type: str
    timestamp: str
    data: Wait
    event: Event
