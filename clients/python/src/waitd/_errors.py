"""The exceptions the client raises: every one a `waitd.Error`.

No message, `str()` or `repr()` of one carries a token, a webhook secret or a
callback URL (whose path is a secret): only statuses and the server's sentences.
"""

from __future__ import annotations

from typing import Any

from ._models import ProblemField, Wait


class Error(Exception):
    """Anything the client could not do. `status` is the HTTP status when the
    server answered (None when it could not be reached), `detail` a sentence."""

    def __init__(self, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status

    def __str__(self) -> str:
        if self.status is None:
            return self.detail
        return f"{self.status}: {self.detail}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, detail={self.detail!r})"


class APIError(Error):
    """waitd answered with a problem (`application/problem+json`): `detail` is its
    sentence, `title` and `type` name the kind, `errors` lists the fields a
    validation problem found wrong."""

    status: int

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        title: str = "",
        type: str = "about:blank",
        errors: list[ProblemField] | None = None,
        retry_after: float | None = None,
        wait: Wait | None = None,
    ) -> None:
        super().__init__(detail, status)
        self.title = title
        self.type = type
        self.errors: list[ProblemField] = errors or []
        self.retry_after = retry_after
        self.wait = wait


class BadRequest(APIError):
    """400: the request is malformed or a field is invalid (see `errors`)."""


class Unauthorized(APIError):
    """401: no token, or one the server does not know."""


class Forbidden(APIError):
    """403: a read-only token asked for a change, or a credential it may not name."""


class NotFound(APIError):
    """404: no such wait (or callback URL), or one deleted after its retention."""


class Conflict(APIError):
    """409: the wait has already ended (a callback's `wait` shows how), or an
    Idempotency-Key was reused with another body."""


class Unprocessable(APIError):
    """422: a target the SSRF guard refuses, or an unknown preset or parameter."""


class RateLimited(APIError):
    """429: too many requests or open streams; `retry_after` says when to ask again."""


class Unavailable(APIError):
    """503: the store is unreachable, or the server is stopping."""


class TransportError(Error):
    """The server could not be reached, or the connection broke, and the client
    did not retry (or gave up retrying)."""


class WaitTimeout(Error):
    """`wait()` or `follow()` ran out of the caller's time before the wait ended.
    `wait` is the wait as last seen, when it was seen."""

    def __init__(self, detail: str, wait: Wait | None = None) -> None:
        super().__init__(detail)
        self.wait = wait


class WebhookVerificationError(Error):
    """A webhook whose signature, timestamp or headers do not hold: refuse it."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Unprocessable,
    429: RateLimited,
    503: Unavailable,
}


def api_error(status: int, problem: Any, retry_after: float | None) -> APIError:
    """The exception for an answer of `status` whose body was `problem`."""
    cls = _BY_STATUS.get(status, APIError)
    if isinstance(problem, dict) and isinstance(problem.get("detail"), str):
        errors = problem.get("errors")
        return cls(
            status,
            problem["detail"],
            title=str(problem.get("title", "")),
            type=str(problem.get("type", "about:blank")),
            errors=errors if isinstance(errors, list) else None,
            retry_after=retry_after,
        )
    if isinstance(problem, dict) and "id" in problem and "status" in problem:
        # A wait where a problem was expected: a callback on an ended wait (409).
        reason = problem.get("reason") or problem["status"]
        return cls(status, f"the wait has already ended ({reason})", wait=problem)  # type: ignore[arg-type]
    return cls(status, f"waitd answered {status} without a problem sentence", retry_after=retry_after)
