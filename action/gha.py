"""GitHub Actions' side of the action: workflow commands (masks, annotations, log
groups), step outputs and the job summary.

Outputs go to the file named by GITHUB_OUTPUT in the heredoc form
(`name<<DELIMITER`, the value, `DELIMITER`), with a random delimiter that the value
does not contain, so a value may hold newlines and cannot end early or set another
output. Without GITHUB_OUTPUT (a run outside GitHub) they are printed instead.
"""

import os
import re
import secrets
import sys

# A name a workflow can read as steps.<id>.outputs.<name>.
OUTPUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _escape_data(text):
    """A workflow command's message, escaped as the runner unescapes it."""
    return str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def command(name, message=""):
    """Prints the workflow command `::name::message` on standard output."""
    sys.stdout.write("::%s::%s\n" % (name, _escape_data(message)))
    sys.stdout.flush()


def mask(value):
    """Asks the runner to hide `value` wherever the log would show it. A runner
    masks one line at a time, so each line of a multi-line value is masked too."""
    if value is None:
        return
    text = str(value)
    lines = [text] + text.splitlines()
    for line in dict.fromkeys(lines):
        if line.strip():
            sys.stdout.write("::add-mask::%s\n" % _escape_data(line))
    sys.stdout.flush()


def error(message):
    """An error annotation: shown on the run's page as well as in the log."""
    command("error title=waitd", message)


def group(title):
    command("group", title)


def endgroup():
    command("endgroup")


def _delimiter(value):
    while True:
        d = "ghadelimiter_" + secrets.token_hex(16)
        if d not in value:
            return d


def set_output(name, value):
    """Writes one output; None is written as the empty string."""
    if not OUTPUT_NAME.match(name):
        raise ValueError("not an output name: %r" % name)
    value = "" if value is None else str(value)
    path = os.environ.get("GITHUB_OUTPUT")
    if not path:
        print("output %s=%s" % (name, value))
        return
    d = _delimiter(value)
    with open(path, "a", encoding="utf-8") as f:
        f.write("%s<<%s\n%s\n%s\n" % (name, d, value, d))


def add_summary(markdown):
    """Appends to the job summary (GITHUB_STEP_SUMMARY), when there is one."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(markdown if markdown.endswith("\n") else markdown + "\n")


def cell(text, limit=300):
    """Text made safe for one markdown table cell: one line, pipes escaped, cut
    at `limit` characters."""
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|")


def code(text, limit=200):
    """Text as inline code in a table cell."""
    text = cell(text, limit).replace("`", "'")
    return "`%s`" % text
