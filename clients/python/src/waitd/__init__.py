"""A client for waitd, the service that waits for things.

    import waitd
    client = waitd.Client()          # WAITD_URL, WAITD_TOKEN
    w = client.create({"target": {"url": "https://api.example.com/servers/1"},
                       "state": "/status", "want": ["on"]})
    print(client.wait(w["id"], timeout=600)["status"])

`waitd.Client` blocks, `waitd.AsyncClient` awaits; both have the same methods.
The API reference is waitd's openapi/openapi.json.
"""

from ._async import AsyncClient
from ._errors import (
    APIError,
    BadRequest,
    Conflict,
    Error,
    Forbidden,
    NotFound,
    RateLimited,
    TransportError,
    Unauthorized,
    Unavailable,
    Unprocessable,
    WaitTimeout,
    WebhookVerificationError,
)
from ._models import (
    Delivery,
    Event,
    EventCanceled,
    EventCreated,
    EventError,
    EventFailed,
    EventPage,
    EventRetry,
    EventState,
    EventSucceeded,
    EventTimedOut,
    GroupMember,
    Problem,
    Status,
    Wait,
    WaitPage,
)
from ._sync import Client
from ._types import CallbackWait, WebhookMessage
from ._webhooks import sign as sign_webhook
from ._webhooks import verify_webhook

__version__ = "0.1.0"

__all__ = [
    "APIError",
    "AsyncClient",
    "BadRequest",
    "CallbackWait",
    "Client",
    "Conflict",
    "Delivery",
    "Error",
    "Event",
    "EventCanceled",
    "EventCreated",
    "EventError",
    "EventFailed",
    "EventPage",
    "EventRetry",
    "EventState",
    "EventSucceeded",
    "EventTimedOut",
    "Forbidden",
    "GroupMember",
    "NotFound",
    "Problem",
    "RateLimited",
    "Status",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
    "Wait",
    "WaitPage",
    "WaitTimeout",
    "WebhookMessage",
    "WebhookVerificationError",
    "sign_webhook",
    "verify_webhook",
]
