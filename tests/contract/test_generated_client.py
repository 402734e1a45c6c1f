"""A client generated from openapi/openapi.json (openapi-python-client), used the
way an integrator would: it creates, reads, holds on, lists, follows and cancels
waits, a group and a preset's wait against a live waitd (WAITD_URL, token in
TOKEN) polling a scripted upstream on 127.0.0.1, and reads problems as the
document describes them. Any status the document does not list for an operation
makes the generated code raise.

Run by .ci/contract with the generated package on PYTHONPATH.
"""

import json
import os
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from waitd_client import AuthenticatedClient, Client
from waitd_client.api.events import list_events, list_wait_events
from waitd_client.api.operations import healthz
from waitd_client.api.presets import get_preset, list_presets
from waitd_client.api.waits import cancel_wait, create_wait, get_wait, list_waits
from waitd_client.models import (
    CreatedWait,
    CreateWait,
    EventCanceled,
    EventCreated,
    EventFailed,
    EventState,
    EventSucceeded,
    Labels,
    Poll,
    Preset,
    Problem,
    Status,
    TargetOverlay,
    Wait,
    WaitPage,
)

STATE = {"status": "building"}


class Upstream(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = json.dumps({"data": {"status": STATE["status"]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def main():
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    target_url = f"http://127.0.0.1:{upstream.server_address[1]}/servers/1"

    base = os.environ["WAITD_URL"]
    api = AuthenticatedClient(
        base_url=base, token=os.environ["TOKEN"], timeout=15.0, raise_on_unexpected_status=True
    )
    anonymous = Client(base_url=base, timeout=5.0, raise_on_unexpected_status=True)

    r = healthz.sync_detailed(client=anonymous)
    check(r.status_code == 200 and r.content == b"ok\n", "GET /healthz needs no token")

    r = list_waits.sync_detailed(client=anonymous)
    check(r.status_code == 401 and isinstance(r.parsed, Problem), "no token: a 401 problem")

    suite = f"contract-{uuid.uuid4().hex[:8]}"
    spec = CreateWait(
        target=TargetOverlay(url=target_url),
        state="/data/status",
        want=["on"],
        fail=["failed"],
        timeout="5s",
        poll=Poll(initial="20ms", factor=1.0),
        labels=Labels.from_dict({"suite": suite}),
    )
    key = uuid.uuid4().hex
    r = create_wait.sync_detailed(client=api, body=spec, idempotency_key=key)
    check(r.status_code == 201 and isinstance(r.parsed, CreatedWait), "POST /waits: 201 and a CreatedWait")
    wait = r.parsed
    check(wait.status == Status.RUNNING, "a new wait is running")
    check(r.headers["location"] == f"/waits/{wait.id}", "Location names the wait")
    check(wait.spec.timeout == "5s" and wait.spec.want == ["on"], "the normalised spec comes back")

    r = create_wait.sync_detailed(client=api, body=spec, idempotency_key=key)
    check(
        r.status_code == 201 and r.parsed.id == wait.id and r.headers["idempotent-replayed"] == "true",
        "the same Idempotency-Key answers with the same wait",
    )

    r = get_wait.sync_detailed(wait.id, client=api, wait="200ms")
    check(r.status_code == 202 and r.parsed.status == Status.RUNNING, "held 200ms, still running: 202")

    STATE["status"] = "on"
    r = get_wait.sync_detailed(wait.id, client=api, wait="true")
    check(r.status_code == 200 and r.parsed.status == Status.SUCCEEDED, "held until the end: 200 succeeded")
    check(r.parsed.state == "on" and r.parsed.polls >= 1, "the ended wait shows its state and polls")

    r = list_wait_events.sync_detailed(wait.id, client=api)
    page = r.parsed
    kinds = [type(e) for e in page.items]
    check(
        kinds[0] is EventCreated and kinds[-1] is EventSucceeded and EventState in kinds,
        "the history reads as typed events: created, state…, succeeded",
    )
    check([e.seq for e in page.items] == list(range(1, len(page.items) + 1)), "seqs count from 1")

    r = list_waits.sync_detailed(client=api, label=[f"suite:{suite}"], status=Status.SUCCEEDED)
    check(
        isinstance(r.parsed, WaitPage) and [w.id for w in r.parsed.items] == [wait.id],
        "GET /waits filters by label and status",
    )

    r = list_events.sync_detailed(client=api, after="latest")
    check(r.status_code == 200 and r.parsed.items == [] and r.parsed.next_cursor, "after=latest: an empty page and a cursor")

    STATE["status"] = "building"
    r = create_wait.sync_detailed(client=api, body=spec)
    other = r.parsed
    r = cancel_wait.sync_detailed(other.id, client=api)
    check(r.status_code == 200 and r.parsed.status == Status.CANCELED, "POST /waits/{id}/cancel: canceled")
    r = get_wait.sync_detailed(other.id, client=api, wait="1s")
    check(r.status_code == 409 and isinstance(r.parsed, Wait), "held on a canceled wait: 409 with the Wait")
    events = list_wait_events.sync_detailed(other.id, client=api).parsed.items
    check(isinstance(events[-1], EventCanceled), "the canceled event ends its history")

    r = get_wait.sync_detailed(uuid.uuid4(), client=api)
    check(r.status_code == 404 and isinstance(r.parsed, Problem) and "no wait" in r.parsed.detail, "an unknown wait: 404 problem")

    r = create_wait.sync_detailed(
        client=api, body=CreateWait(target=TargetOverlay(url=target_url), state="/data/status", want=[], timeout="1h")
    )
    fields = sorted(e.field for e in r.parsed.errors)
    check(r.status_code == 400 and fields == ["timeout", "want"], "a bad request: 400 naming each field")

    # A group of a member it makes and a wait it names; the member fails, so the
    # group does, and the named wait ends (canceled, or failed on the same
    # answer). (A group's request and
    # spec, objects with all or any, are plain JSON to this generator.)
    STATE["status"] = "building"
    named = create_wait.sync_detailed(client=api, body=spec).parsed
    member = spec.to_dict()
    del member["labels"]
    group = {"all": [member, {"id": str(named.id), "required": False}], "timeout": "5s", "labels": {"suite": suite}}
    r = create_wait.sync_detailed(client=api, body=group)
    check(r.status_code == 201 and r.parsed.mode == "all", "POST /waits with all: 201, a group")
    made = r.parsed
    members = json.loads(r.content)["spec"]["all"]
    check(
        members[0]["target"]["url"] == target_url and members[1] == {"id": str(named.id), "required": False},
        "a group's spec lists its members as made and as named",
    )
    r = get_wait.sync_detailed(made.id, client=api, wait="200ms")
    check(r.status_code == 202 and r.parsed.state.startswith("0 of 2"), "a running group, held 200ms: 202")
    STATE["status"] = "failed"
    r = get_wait.sync_detailed(made.id, client=api, wait="true")
    check(r.status_code == 422 and r.parsed.status == Status.FAILED, "held on a failed group: 422 with the Wait")
    r = list_waits.sync_detailed(client=api, label=[f"suite:{suite}"], status=Status.FAILED)
    check(made.id in [w.id for w in r.parsed.items], "GET /waits lists the group")
    r = cancel_wait.sync_detailed(made.id, client=api)
    check(r.status_code == 200 and r.parsed.status == Status.FAILED, "canceling an ended group leaves it")
    r = get_wait.sync_detailed(named.id, client=api)
    check(r.parsed.status != Status.RUNNING and r.parsed.group == made.id, "its named member ended and shows its group")
    events = list_wait_events.sync_detailed(made.id, client=api).parsed.items
    check(isinstance(events[0], EventCreated) and isinstance(events[-1], EventFailed), "a group's history")

    # A preset's wait, and the same without the parameter it requires.
    STATE["status"] = "on"
    r = create_wait.sync_detailed(
        client=api, body=CreateWait.from_dict({"preset": "http.ok", "params": {"url": target_url}, "timeout": "5s"})
    )
    check(r.status_code == 201 and r.parsed.spec.target.url == target_url, "a preset's wait: 201")
    # (A 422 is a held wait that failed, or a refusal; the generated code reads it
    # as the former, so the refusal is read as it comes.)
    r = api.get_httpx_client().post("/waits", json={"preset": "http.ok", "timeout": "5s"})
    check(
        r.status_code == 422
        and r.headers["content-type"] == "application/problem+json"
        and r.json()["errors"][0]["field"] == "params.url",
        "a preset without its required parameter: a 422 problem naming it",
    )

    names = [p.name for p in list_presets.sync_detailed(client=api).parsed.items]
    check("latitude.server" in names, "GET /presets lists the built-in presets")
    r = get_preset.sync_detailed("latitude.server", client=api)
    check(isinstance(r.parsed, Preset), "GET /presets/{name}: a Preset")

    upstream.shutdown()
    print("the generated client works against waitd")


if __name__ == "__main__":
    main()
