#!/usr/bin/env python3
"""The waitd action's entry: reads the action's inputs (INPUT_<NAME>, as action.yml
passes them), makes one wait request of them, and waits.

- Without a server, `waitd wait` runs the wait in this step: a waitd from
  waitd-path, else the one on PATH, else one built with `cargo install --locked
  --path $GITHUB_ACTION_PATH`.
- With a server, the wait is created on it (or, with `id`, an existing one is
  taken up) and followed there over its HTTP API; no waitd binary is needed.

Then, whatever happened, the step's outputs and a job summary are written, and
the step exits with waitd's exit code: 0 only when the wait succeeded (or, with
`wait: false`, was created), 1 failed, 2 timed out, 3 error, 4 canceled, 5 a
problem with the inputs or the server, 130/143 interrupted.

Secrets (the token, header values, a callback URL) are masked before anything
is printed, and no message repeats them.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.parse
from datetime import datetime, timezone

# The modules beside this file; no __pycache__ left in the action's checkout.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gha  # noqa: E402
from server import TERMINAL, Problem, Server  # noqa: E402

# Every input this script reads, as action.yml declares it; each arrives as
# INPUT_<NAME> with `-` written `_` (action.yml maps them, since a composite
# action passes no inputs to its steps by itself).
INPUTS = (
    "spec",
    "preset",
    "params",
    "headers",
    "labels",
    "callback",
    "heartbeat",
    "timeout",
    "server",
    "token",
    "id",
    "wait",
    "allow-targets",
    "waitd-path",
    "summary",
)

EXIT_FOR = {"succeeded": 0, "failed": 1, "timed_out": 2, "error": 3, "canceled": 4}
EXIT_PROBLEM = 5
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
# The most of a spec file read: the most a server takes in a request.
MAX_SPEC = 64 * 1024
UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def read_inputs():
    """The inputs, by their action.yml names; an input not given is ''."""
    return {name: os.environ.get("INPUT_" + name.upper().replace("-", "_"), "") for name in INPUTS}


class Interrupted(Exception):
    def __init__(self, code):
        super().__init__(code)
        self.code = code


# The waitd process `waitd wait` runs in, while it runs: a signal goes to it.
CHILD = None


def on_signal(signum, _frame):
    child = CHILD
    if child is not None and child.poll() is None:
        child.send_signal(signum)
        return
    raise Interrupted(EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_TERMINATED)


# ---------------------------------------------------------------------------
# The inputs, checked, made into a request.


def flag(inputs, name, default):
    value = inputs[name].strip().lower()
    if value == "":
        return default
    if value in ("true", "false"):
        return value == "true"
    raise Problem('%s takes true or false, not "%s"' % (name, shown(inputs[name])))


def shown(text, limit=80):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pairs(name, text, sep, secret=False):
    """Lines of NAME<sep>VALUE (blank lines and # comments skipped) as a dict."""
    out = {}
    form = "NAME%sVALUE" % ("=" if sep == "=" else ": ")
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, found, value = line.partition(sep)
        key = key.strip()
        if not found or not key:
            what = "" if secret else ': "%s"' % shown(line)
            raise Problem("%s: line %d is not %s%s (one a line)" % (name, n, form, what))
        out[key] = value.strip()
    return out


def read_spec(text):
    """The spec input: a JSON object written inline, or the path of a file holding one."""
    s = text.strip()
    if s.startswith("{") or s.startswith("["):
        where, raw = "spec", s
    else:
        if not os.path.isfile(s):
            raise Problem(
                'spec: there is no file "%s" (from %s); give the path of a JSON file, or the request itself as JSON starting with {'
                % (shown(s, 200), os.getcwd())
            )
        with open(s, "rb") as f:
            data = f.read(MAX_SPEC + 1)
        if len(data) > MAX_SPEC:
            raise Problem("spec file %s is longer than 64 KiB, more than a wait request can be; is it the right file?" % s)
        where = "spec file %s" % s
        try:
            raw = data.decode("utf-8")
        except UnicodeDecodeError:
            raise Problem("%s is not UTF-8 text" % where)
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise Problem("%s is not valid JSON: %s" % (where, e))
    if not isinstance(value, dict):
        raise Problem("%s is not a JSON object: a wait request is one, such as {\"target\": {\"url\": …}, …}" % where)
    return value


def mask_spec_secrets(request):
    """Masks the secrets a request may carry: header values, client secrets and
    keys, webhook secrets."""
    target = request.get("target")
    if isinstance(target, dict):
        headers = target.get("headers")
        if isinstance(headers, dict):
            for v in headers.values():
                if isinstance(v, str):
                    gha.mask(v)
        auth = target.get("auth")
        oauth2 = auth.get("oauth2") if isinstance(auth, dict) else None
        if isinstance(oauth2, dict) and isinstance(oauth2.get("client_secret"), str):
            gha.mask(oauth2["client_secret"])
        tls = target.get("tls")
        if isinstance(tls, dict) and isinstance(tls.get("client_key"), str):
            gha.mask(tls["client_key"])
    for hook in request.get("notify") or []:
        if isinstance(hook, dict) and isinstance(hook.get("secret"), str):
            gha.mask(hook["secret"])


def merge_object(request, key, extra, input_name):
    if not extra:
        return
    current = request.get(key)
    if current is None:
        current = {}
    if not isinstance(current, dict):
        raise Problem("%s: the spec's %s is not a JSON object, so %s cannot add to it" % (input_name, key, input_name))
    current.update(extra)
    request[key] = current


def build_request(inputs):
    """The wait request the inputs describe, or None when they name an existing
    wait (`id`)."""
    headers = pairs("headers", inputs["headers"], ":", secret=True)
    for v in headers.values():
        gha.mask(v)
    params = pairs("params", inputs["params"], "=")
    labels = pairs("labels", inputs["labels"], "=")
    callback = flag(inputs, "callback", False)
    heartbeat = inputs["heartbeat"].strip()
    preset = inputs["preset"].strip()
    timeout = inputs["timeout"].strip()
    spec = inputs["spec"]

    if inputs["id"].strip():
        given = [n for n, v in (("spec", spec.strip()), ("preset", preset), ("params", params),
                                ("headers", headers), ("labels", labels), ("callback", callback),
                                ("heartbeat", heartbeat), ("timeout", timeout)) if v]
        if given:
            raise Problem("id takes up a wait that already exists, so it takes no %s: give id alone, or leave it out to create a wait"
                          % ", ".join(given))
        return None

    request = read_spec(spec) if spec.strip() else {}
    mask_spec_secrets(request)
    if preset:
        request["preset"] = preset
    if params and "preset" not in request:
        raise Problem("params are a preset's parameters: give preset (e.g. http.ok) with them")
    merge_object(request, "params", params, "params")
    if headers:
        target = request.get("target")
        if target is None:
            target = request["target"] = {}
        if not isinstance(target, dict):
            raise Problem("headers: the spec's target is not a JSON object, so headers cannot add to it")
        merge_object(target, "headers", headers, "headers")
    merge_object(request, "labels", labels, "labels")
    if timeout:
        request["timeout"] = timeout
    if callback or heartbeat:
        if "preset" in request:
            raise Problem("callback: a callback wait polls nothing, so it takes no preset")
        if headers:
            raise Problem("callback: a callback wait polls nothing, so it takes no headers")
        cb = request.get("callback")
        cb = dict(cb) if isinstance(cb, dict) else {}
        if heartbeat:
            cb["heartbeat"] = heartbeat
        request["callback"] = cb
    if not request:
        raise Problem(
            "say what to wait for: spec (a request as JSON, or the path of a JSON file), preset with params, "
            "callback: true (with a server), or id (a wait already on the server)"
        )
    return request


# ---------------------------------------------------------------------------
# What happened, for the outputs and the summary.


class Result:
    def __init__(self):
        self.wait = None
        self.id = ""
        self.status = ""
        self.reason = ""
        self.code = EXIT_PROBLEM
        self.callback_url = ""
        self.dashboard_url = ""
        self.followed = True
        self.target = ""

    def took(self, wait):
        self.wait = wait
        self.id = str(wait.get("id") or self.id)
        self.status = str(wait.get("status") or "")
        self.reason = wait.get("reason") or ""


def short_line(wait):
    """`<id> <status>[ state=<state>][: <reason>]`, as the waitd client prints a wait."""
    line = "%s %s" % (wait.get("id"), wait.get("status"))
    if wait.get("state") is not None:
        line += " state=%s" % wait["state"]
    if wait.get("reason"):
        line += ": %s" % wait["reason"]
    return line


def as_text(value):
    """An output's text: a string as it is, anything else as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def write_outputs(result):
    wait = result.wait or {}
    output = wait.get("output")
    gha.set_output("status", result.status)
    gha.set_output("reason", result.reason)
    gha.set_output("state", as_text(wait.get("state")))
    gha.set_output("id", result.id)
    gha.set_output("exit-code", result.code)
    gha.set_output("output", json.dumps(output, ensure_ascii=False, separators=(",", ":")))
    gha.set_output("error-detail", as_text(wait.get("error_detail")))
    gha.set_output("callback-url", result.callback_url)
    gha.set_output("dashboard-url", result.dashboard_url)
    if isinstance(output, dict):
        for name, value in output.items():
            if gha.OUTPUT_NAME.match(name):
                gha.set_output("output-" + name, as_text(value))
            else:
                print('waitd: the output field "%s" gets no output of its own (not a valid output name); it is in output'
                      % shown(name))


def safe_url(url):
    """A URL as the summary shows it: no user, password, query or fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(a URL)"
    netloc = parts.netloc.rpartition("@")[2]
    tail = "?…" if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")) + tail


def describe_target(inputs, request, wait):
    """What was waited for, in a few words."""
    spec = (wait or {}).get("spec") if isinstance((wait or {}).get("spec"), dict) else None
    spec = spec or request or {}
    if "callback" in spec:
        return "a callback"
    for mode in ("all", "any"):
        if isinstance(spec.get(mode), list):
            return "%s of %d waits" % (mode, len(spec[mode]))
    target = spec.get("target") if isinstance(spec.get("target"), dict) else {}
    url = target.get("url")
    preset = (request or {}).get("preset") or spec.get("preset")
    text = gha.code(safe_url(url)) if isinstance(url, str) else ""
    if preset:
        text = ("preset %s: %s" % (gha.code(preset), text)) if text else "preset %s" % gha.code(preset)
    return text or "—"


def parse_time(text):
    m = re.match(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", str(text or ""))
    if not m:
        return None
    y, mo, d, h, mi, s = (int(x) for x in m.groups()[:6])
    frac = float(m.group(7)) if m.group(7) else 0.0
    at = datetime(y, mo, d, h, mi, s, tzinfo=timezone.utc).timestamp() + frac
    tz = m.group(8)
    if tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        at -= sign * (int(tz[1:3]) * 3600 + int(tz[4:6]) * 60)
    return at


def duration(seconds):
    if seconds < 10:
        return "%.1f s" % seconds
    seconds = int(round(seconds))
    if seconds < 60:
        return "%d s" % seconds
    if seconds < 3600:
        return "%d min %d s" % (seconds // 60, seconds % 60)
    return "%d h %d min" % (seconds // 3600, seconds % 3600 // 60)


def write_summary(result):
    wait = result.wait or {}
    if result.code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        outcome = "**interrupted**"
        if result.status == "running":
            outcome += ": the wait keeps running on the server"
    elif result.status and result.status != "running":
        outcome = "**%s**" % result.status
        if result.reason:
            outcome += ": " + gha.cell(result.reason)
    elif result.status == "running":
        outcome = "**running**" + ("" if result.followed else " (not waited for)")
    else:
        outcome = "**problem**: " + gha.cell(result.reason or "see the log")
    started, ended = parse_time(wait.get("created_at")), parse_time(wait.get("finished_at"))
    took = duration(max(0.0, ended - started)) if started is not None and ended is not None else "—"
    polls = str(wait.get("polls")) if wait.get("polls") is not None else "—"
    if result.dashboard_url and result.id:
        link = "[%s](%s)" % (result.id, result.dashboard_url)
    elif result.id:
        link = gha.code(result.id)
    else:
        link = "—"
    gha.add_summary(
        "| target | outcome | time taken | polls | wait |\n"
        "|---|---|---|---|---|\n"
        "| %s | %s | %s | %s | %s |\n\n" % (result.target, outcome, took, polls, link)
    )


# ---------------------------------------------------------------------------
# Running the wait here, with `waitd wait`.


def find_waitd(inputs):
    given = inputs["waitd-path"].strip()
    if given:
        path = os.path.expanduser(given)
        if os.path.isdir(path):
            path = os.path.join(path, "waitd")
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise Problem('waitd-path: "%s" is not an executable file' % shown(given, 200))
        return path
    found = shutil.which("waitd")
    if found:
        return found
    return build_waitd()


def build_waitd():
    source = os.environ.get("GITHUB_ACTION_PATH", "")
    cargo = shutil.which("cargo")
    if not cargo:
        raise Problem(
            "there is no waitd on PATH and no cargo to build one: install Rust first (e.g. with "
            "dtolnay/rust-toolchain), put a waitd on PATH, give waitd-path, or give a server"
        )
    if not source or not os.path.isfile(os.path.join(source, "Cargo.toml")):
        raise Problem("there is no waitd on PATH, and GITHUB_ACTION_PATH (\"%s\") holds no waitd source to build" % source)
    gha.group("Building waitd: cargo install --locked --path %s" % source)
    sys.stdout.flush()
    built = subprocess.run([cargo, "install", "--locked", "--path", source], stdout=sys.stderr)
    gha.endgroup()
    if built.returncode != 0:
        raise Problem("cargo install --locked --path %s failed (exit %d); its output is above" % (source, built.returncode))
    home = os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo")
    for candidate in (shutil.which("waitd"), os.path.join(home, "bin", "waitd")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise Problem("cargo install succeeded, but no waitd is on PATH or in %s/bin" % home)


def run_here(inputs, request, result):
    global CHILD
    if request.get("callback") is not None:
        raise Problem(
            "callback: a callback wait needs a server (give server and token), so that the job or person "
            "who ends it can reach its URL; without one, nothing outside this step could"
        )
    waitd = find_waitd(inputs)
    env = dict(os.environ)
    allow = inputs["allow-targets"].strip()
    if allow:
        env["WAITD_ALLOW_TARGETS"] = ",".join(allow.replace(",", " ").split())
    print("waitd: running the wait in this step (%s wait)" % waitd, flush=True)
    proc = subprocess.Popen(
        [waitd, "wait", "--spec", "-", "--output", "json"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    CHILD = proc
    said = []

    def relay():
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace")
            said.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        proc.stdin.write(json.dumps(request).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    out = proc.stdout.read()
    code = proc.wait()
    reader.join(timeout=5)
    CHILD = None
    try:
        wait = json.loads(out.decode("utf-8")) if out.strip() else None
    except ValueError:
        wait = None
    if isinstance(wait, dict):
        result.took(wait)
    else:
        # waitd said why on stderr: its last "waitd: " line and what follows it.
        starts = [i for i, line in enumerate(said) if line.startswith("waitd: ")]
        told = "\n".join(said[starts[-1]:]) if starts else "\n".join(said[-3:])
        result.reason = told[len("waitd: "):] if told.startswith("waitd: ") else told
        if not result.reason:
            result.reason = "waitd exited with %d and said nothing" % code
    result.code = code if code >= 0 else 128 - code
    result.target = describe_target(inputs, request, result.wait)
    return result.code


# ---------------------------------------------------------------------------
# Waiting on a server.


def run_on_server(inputs, request, result, follow):
    base = inputs["server"].strip()
    if not re.match(r"^https?://[^/\s]+", base):
        raise Problem('server takes the URL of a waitd server, such as https://waitd.example.com, not "%s"' % shown(base))
    server = Server(base, inputs["token"].strip())
    if request is not None:
        print("waitd: creating the wait on %s" % server.base, flush=True)
        wait = server.create(request)
        callback_url = wait.pop("callback_url", None)
        if callback_url:
            gha.mask(callback_url)
            gha.mask(callback_url.rstrip("/").rpartition("/")[2])
            result.callback_url = callback_url
        elif "callback" in request:
            print("waitd: the server's answer carries no callback URL", flush=True)
    else:
        wait_id = inputs["id"].strip()
        if not UUID.match(wait_id):
            raise Problem('id: "%s" is not a wait id; wait ids are UUIDs such as 0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21'
                          % shown(wait_id))
        wait = server.get(wait_id)
    result.took(wait)
    result.dashboard_url = server.dashboard(result.id)
    result.target = describe_target(inputs, request, wait)
    print(short_line(wait), flush=True)
    print("waitd: the wait in the dashboard: %s" % result.dashboard_url, flush=True)
    if result.callback_url:
        print("waitd: its callback URL is in the step's callback-url output (masked here)", flush=True)
    if not follow:
        result.followed = False
        result.code = 0
        return 0
    if result.status not in TERMINAL:
        try:
            wait = server.follow(result.id, lambda line: print(line, flush=True))
        except Interrupted:
            result.reason = "interrupted; the wait keeps running on the server"
            raise
        result.took(wait)
        print(short_line(wait), flush=True)
    result.target = describe_target(inputs, request, wait)
    result.code = EXIT_FOR.get(result.status, EXIT_PROBLEM)
    return result.code


# ---------------------------------------------------------------------------


def main():
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    inputs = read_inputs()
    # Masked before anything else is printed.
    if inputs["token"].strip():
        gha.mask(inputs["token"].strip())
    result = Result()
    request = None
    summary = inputs["summary"].strip().lower() != "false"
    try:
        flag(inputs, "summary", True)
        follow = flag(inputs, "wait", True)
        request = build_request(inputs)
        if inputs["server"].strip():
            run_on_server(inputs, request, result, follow)
        else:
            for name in ("id", "token"):
                if inputs[name].strip():
                    raise Problem("%s is for a wait on a server: give server too" % name)
            if not follow:
                raise Problem("wait: false needs a server: without one, the wait runs in this step and ends with it")
            run_here(inputs, request, result)
    except Problem as e:
        result.code = EXIT_PROBLEM
        result.reason = str(e)
        print("waitd: %s" % e, file=sys.stderr, flush=True)
    except Interrupted as e:
        result.code = e.code
        result.reason = result.reason or "interrupted"
    if not result.target:
        result.target = describe_target(inputs, request, result.wait)
    write_outputs(result)
    if summary:
        write_summary(result)
    if result.code != 0:
        if result.status in TERMINAL:
            gha.error("wait %s %s: %s" % (result.id, result.status, result.reason))
        else:
            gha.error(result.reason or "waitd exited with %d" % result.code)
    return result.code


if __name__ == "__main__":
    sys.exit(main())
