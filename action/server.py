"""A waitd server's API, as the action uses it: create a wait (or read one), and
follow its event stream to its end, printing each event as `waitd create --wait`
does.

Python's standard library only, so a job that uses a server needs no waitd binary.
A refused connection, a 5xx (a replica restarting answers 503 with Retry-After) or
a 429 is tried again, for up to two minutes without an answer, as the waitd client
does; the create carries an Idempotency-Key of its own, so a create tried again
finds the first wait instead of making a second, and a dropped stream resumes
after the last event seen (Last-Event-ID). Any other 4xx is a problem, told with
the server's sentence.
"""

import http.client
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid


class Problem(Exception):
    """A mistake in the inputs, or a problem reaching or with the server: the
    step ends with exit code 5 and this sentence."""


# How long without a usable answer before the server counts as unreachable.
GIVE_UP_AFTER = 120.0
# A stream silent this long is dead: the server sends a keep-alive at least
# every 10 s.
STREAM_TIMEOUT = 35
TERMINAL = ("succeeded", "failed", "timed_out", "canceled", "error")
USER_AGENT = "waitd-action"


class _Again(Exception):
    """An answer worth asking again for (a 5xx, a 429), after `wait_for` seconds
    when the server said."""

    def __init__(self, why, wait_for=None):
        super().__init__(why)
        self.why = why
        self.wait_for = wait_for


class Answer:
    def __init__(self, status, content_type, body):
        self.status = status
        self.content_type = content_type
        self.body = body

    @property
    def problem(self):
        return self.content_type.startswith("application/problem+json")


def _problem_text(answer, doing):
    """The server's problem as one message: its detail, then each field error."""
    body = answer.body if isinstance(answer.body, dict) else {}
    detail = body.get("detail") or body.get("title") or ("HTTP %d" % answer.status)
    text = "%s: the server answered %d: %s" % (doing, answer.status, detail)
    for e in body.get("errors") or []:
        if isinstance(e, dict):
            text += "\n  %s: %s" % (e.get("field", ""), e.get("message", ""))
    return text


class Server:
    def __init__(self, base, token):
        self.base = base.rstrip("/")
        self.token = token

    def dashboard(self, wait_id):
        """The wait's page in the server's dashboard."""
        return "%s/ui/#/waits/%s" % (self.base, wait_id)

    def _request(self, method, path, body=None, headers=None, accept="application/json"):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Accept", accept)
        req.add_header("User-Agent", USER_AGENT)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        return req

    def _attempt(self, req, doing, timeout, stream=False):
        """One request: an Answer (or, with `stream`, the open response of a 2xx).
        A 4xx problem raises Problem; what is worth trying again raises _Again."""
        try:
            resp = urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            resp = e
        status = getattr(resp, "status", None) or resp.code
        if stream and 200 <= status < 300:
            return resp
        with resp:
            raw = resp.read()
            ctype = resp.headers.get("Content-Type", "") or ""
            retry_after = resp.headers.get("Retry-After")
        try:
            parsed = json.loads(raw.decode("utf-8")) if raw else None
        except ValueError:
            parsed = raw.decode("utf-8", "replace")
        answer = Answer(status, ctype, parsed)
        if status >= 500 or status == 429:
            why = "it answered %d" % status
            if isinstance(parsed, dict) and parsed.get("detail"):
                why += ": " + str(parsed["detail"])
            raise _Again(why, _retry_after(retry_after))
        if answer.problem or (status >= 400 and not isinstance(parsed, dict)):
            raise Problem(_problem_text(answer, doing))
        return answer

    def _retrying(self, doing, attempt):
        """attempt(), tried again while the server cannot answer (refused, 5xx,
        429) for up to GIVE_UP_AFTER; a 4xx problem raises at once."""
        started = time.monotonic()
        delay = 1.0
        while True:
            try:
                return attempt()
            except _Again as e:
                why, wait_for = e.why, e.wait_for or delay
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                why, wait_for = "it did not answer: %s" % getattr(e, "reason", e), delay
            if time.monotonic() - started + wait_for > GIVE_UP_AFTER:
                raise Problem("%s: gave up on the server at %s after %d s; %s"
                              % (doing, self.base, int(GIVE_UP_AFTER), why))
            print("waitd: %s: %s; trying again in %d s" % (doing, why, wait_for), file=sys.stderr, flush=True)
            time.sleep(wait_for)
            delay = min(delay * 2, 10.0)

    def call(self, method, path, doing, body=None, headers=None, timeout=30):
        req = self._request(method, path, body, headers)
        return self._retrying(doing, lambda: self._attempt(req, doing, timeout))

    def create(self, request):
        """Creates the wait; the server's answer (the wait, and a callback wait's
        callback_url)."""
        key = "waitd-action-" + str(uuid.uuid4())
        answer = self.call("POST", "/waits", "creating the wait", body=request,
                           headers={"Idempotency-Key": key})
        if not isinstance(answer.body, dict) or "id" not in answer.body:
            raise Problem("creating the wait: the server's answer is not a wait")
        return answer.body

    def get(self, wait_id):
        path = "/waits/" + urllib.parse.quote(wait_id, safe="")
        answer = self.call("GET", path, "reading wait %s" % wait_id)
        if not isinstance(answer.body, dict) or "status" not in answer.body:
            raise Problem("reading wait %s: the server's answer is not a wait" % wait_id)
        return answer.body

    def follow(self, wait_id, say):
        """Follows the wait's event stream to its terminal event, calling
        say(line) for each event but the first (`created`), and returns the
        ended wait. A dropped stream is resumed after the last event seen."""
        doing = "following wait %s" % wait_id
        path = "/waits/%s/events?follow=true" % urllib.parse.quote(wait_id, safe="")
        last = 1
        while True:
            req = self._request("GET", path, accept="text/event-stream",
                                headers={"Last-Event-ID": str(last)})
            resp = self._retrying(doing, lambda: self._attempt(req, doing, STREAM_TIMEOUT, stream=True))
            data = []
            try:
                with resp:
                    for raw in resp:
                        line = raw.decode("utf-8", "replace").rstrip("\r\n")
                        if line.startswith("data:"):
                            data.append(line[5:][1:] if line[5:6] == " " else line[5:])
                            continue
                        if line or not data:
                            continue  # id:, event:, a keep-alive comment
                        event = json.loads("\n".join(data))
                        data = []
                        last = max(last, int(event.get("seq", last)))
                        say(event_line(event))
                        if event.get("kind") in TERMINAL:
                            return self.get(wait_id)
            except (OSError, http.client.HTTPException, ValueError) as e:
                print("waitd: %s: the stream broke (%s); resuming" % (doing, e), file=sys.stderr, flush=True)
            time.sleep(1)


def _retry_after(value):
    try:
        return max(1.0, min(float(value), 30.0))
    except (TypeError, ValueError):
        return None


def event_line(e):
    """One event as one line, `HH:MM:SS <kind> …`, as the waitd client prints it."""
    at = str(e.get("at", ""))
    clock = at[11:19] if len(at) >= 19 else at
    kind = e.get("kind", "")
    if kind == "created":
        rest = " (deadline %s)" % e.get("deadline", "")
    elif kind == "state":
        rest = " %s -> %s" % (e["from"], e.get("to")) if e.get("from") is not None else " %s" % e.get("to")
    elif kind == "retry":
        rest = " %s in %s: %s" % (e.get("attempt"), e.get("delay"), e.get("error"))
    elif e.get("reason"):
        rest = ": %s" % e["reason"]
    else:
        rest = ""
    return "%s %s%s" % (clock, kind, rest)
