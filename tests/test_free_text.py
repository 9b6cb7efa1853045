"""What people type (reasons, typed names, field values, a fork's input) holds no control
character but newline and tab, and no bidirectional override; a reason is at most 2,000
characters. Each is a 400 that names the character, and nothing is recorded or handed to
the tool. ``localui decisions export`` to a terminal escapes what an older record holds.
On SQLite and on PostgreSQL, with real pauses the SDK wrote.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Callable

from helpers import JSON, NO_SIGN_IN, TEST_TOKEN
from test_approval_policy import OTHER_TOOL, Desk, message, open_desk

__all__ = ["open_desk"]  # the fixture, used by name below

OWNER = {**JSON, "Authorization": f"Bearer {TEST_TOKEN}"}
#: Text no person's reason may hold, and the words the refusal names it by.
REFUSED = {
    "ok\x00then": "a control character (U+0000)",
    "\x1b]0;pwned\x07title set": "a control character (U+001B)",
    "\x1b[2Jscreen cleared": "a control character (U+001B)",
    "one\rline over another": "a control character (U+000D)",
    "refund \u202eoi-dnufer": "a bidirectional override (U+202E RIGHT-TO-LEFT OVERRIDE)",
    "an \u2066isolate\u2069": "a bidirectional override (U+2066 LEFT-TO-RIGHT ISOLATE)",
    "c1 \x9b2J": "a control character (U+009B)",
}
#: A note with a text field, so a typed field value is checked too.
WITH_A_NOTE = """
[[rule]]
name = "refunds"
agent = "refund-*"

[[rule.field]]
name = "note"
type = "text"
"""


def first_pause(desk: Desk) -> tuple[str, str]:
    item = desk.client.get("/approvals.json", headers=OWNER).json()["approvals"][0]
    return item["execution_id"], item["checkpoint_id"]


def test_control_characters_and_bidi_overrides_are_refused_everywhere_people_type(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(WITH_A_NOTE)
    run, checkpoint_id = first_pause(desk)
    for text, why in REFUSED.items():
        for field in ("reason", "field.note"):
            data = {"checkpoint_id": checkpoint_id, "reason": "fine", field: text}
            refused = desk.client.post(f"/approvals/{run}/reject", data=data, headers=OWNER)
            assert refused.status_code == 400, (field, text, refused.text)
            assert why in message(refused), message(refused)
        bulk = desk.client.post(
            "/approvals/bulk",
            data={"verb": "reject", "reason": text, "pick": f'["{run}", "{checkpoint_id}"]'},
            headers=OWNER,
        )
        assert bulk.status_code == 400 and why in message(bulk), bulk.text
    assert desk.decisions(run) == [] and desk.run_ends(run) == []

    # With sign-in off, the name a person types is held to the same rule.
    typed = desk.client_with(sign_in=NO_SIGN_IN) if desk.client_with else None
    assert typed is not None
    for field, path in (("approver", f"/approvals/{run}/reject"), ("actor", f"/runs/{run}/resume")):
        data = {"checkpoint_id": checkpoint_id, "reason": "fine", field: "ada\x1b[2J"}
        refused = typed.post(path, data=data, headers=JSON)
        assert refused.status_code == 400 and f"{field} holds a control" in message(refused)
    assert desk.decisions(run) == [] and desk.run_ends(run) == []


def test_a_reason_is_at_most_2000_characters_and_keeps_its_lines(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(OTHER_TOOL)
    run, checkpoint_id = first_pause(desk)
    too_long = {"checkpoint_id": checkpoint_id, "reason": "x" * 2001}
    refused = desk.client.post(f"/approvals/{run}/reject", data=too_long, headers=OWNER)
    assert refused.status_code == 400
    assert message(refused) == "reason is longer than 2,000 characters (2,001)"
    assert desk.decisions(run) == []

    # A browser sends a textarea's lines with CR LF; tabs stay.
    typed = "not this one:\r\n\tthe order was refunded already" + "." * 1950
    taken = {"checkpoint_id": checkpoint_id, "reason": typed}
    done = desk.client.post(f"/approvals/{run}/reject", data=taken, headers=OWNER)
    assert done.status_code == 200, done.text
    [decision] = desk.decisions(run)
    assert decision["metadata"]["reason"] == typed.replace("\r\n", "\n")


def test_the_export_escapes_control_characters_on_a_terminal_only(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(OTHER_TOOL)
    run, checkpoint_id = first_pause(desk)
    data = {"checkpoint_id": checkpoint_id, "reason": "checked"}
    assert desk.client.post(f"/approvals/{run}/reject", data=data, headers=OWNER).is_success
    # A record written before the rule: its reason sets a terminal's title and clears it.
    old = "\x1b]0;pwned\x07\x1b[2Jsee \u202eelif"
    assert desk.execute("UPDATE {app}localui_decisions SET reason = ?", (old,)) == 1
    command = [sys.executable, "-m", "localui", "decisions", "export", *desk.export_args]

    piped = subprocess.run(command, capture_output=True, timeout=120, check=False)
    assert piped.returncode == 0, piped.stderr
    assert old.encode() in piped.stdout  # a file gets the record as it is

    leader, follower = pty.openpty()
    try:
        on_terminal = subprocess.run(
            command, stdout=follower, stderr=subprocess.PIPE, timeout=120, check=False
        )
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: everything was read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert on_terminal.returncode == 0, on_terminal.stderr
    assert b"\x1b" not in shown and "\u202e".encode() not in shown
    assert b"\\x1b]0;pwned\\x07\\x1b[2Jsee \\u202eelif" in shown
