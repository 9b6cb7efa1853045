"""One person's decision link pressed on two servers of one store at once, on SQLite and
on PostgreSQL: the pause is decided once and its tool runs once, whichever server takes
the press; the other shows what was decided.

Two real ``localui serve`` processes with sign-in on and the payout-bot registered
(``bench/crash_agent.py``: a real agent on the SDK's offline model whose tool appends to
a ledger, whichever process runs it). Ada's address is Apprise's ``json://`` to a
receiver here, so her link comes in the message a server sends her; the servers share
the store's keys, so either opens it.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from helpers import all_at_once
from test_deadlines import Desk, desk, policy

from bench.receiver import Receiver
from localui.backends import open_backend
from localui.backends.users import token_hash

__all__ = ["desk"]  # the fixture, shared with the deadline tests

LINK = re.compile(r"https?://[^/\s]+(/decide/([^/\s]+)/\S+)")
HIDDEN = re.compile(r'type="hidden" name="(\w+)" value="([^"]*)"')
ADA_DECIDES = policy('approvers = ["user:ada"]')


def test_one_link_pressed_on_two_servers_at_once_decides_once(desk: Desk) -> None:
    with Receiver() as receiver:
        backend = open_backend(desk.settings(ADA_DECIDES))
        users = backend.users(writable=True)
        try:
            users.add(
                "ada",
                "approver",
                token_hash("token-of-ada-0123456789abcdef"),
                (),
                f"json://127.0.0.1:{receiver.port}/ada",
            )
        finally:
            users.close()
            backend.close()
        servers = [desk.serve(name, ADA_DECIDES, sign_in=True) for name in ("a", "b")]
        run = desk.pause("LINK1")

        def links(received: list[Any]) -> dict[str, str]:
            said = " ".join(r.json()["message"] for r in received if r.path == "/ada")
            return {found_run: path for path, found_run in LINK.findall(said)}

        got = receiver.wait_for(lambda r: run in links(r), 60)
        path = links(got)[run]
        pages = [httpx.get(server.url + path, timeout=30) for server in servers]
        for page in pages:
            assert page.status_code == 200 and 'id="decision-form"' in page.text, page.text

        def press(i: int) -> httpx.Response:
            form = dict(HIDDEN.findall(pages[i].text))
            return httpx.post(
                f"{servers[i].url}/decide/{run}",
                data={**form, "decision": "approve", "reason": "pressed twice"},
                timeout=60,
            )

        answers = all_at_once(2, press)
        # One press decides (303, to the page that shows it); the other is told it was
        # decided (200: by ada herself) or, while the first is still being carried out,
        # that it is taken (409).
        statuses = sorted(a.status_code for a in answers)
        assert statuses in ([200, 303], [303, 409]), [(a.status_code, a.text) for a in answers]
        decision = desk.wait_decided(run)
        assert (decision.actor, decision.approved, decision.outcome) == ("ada", True, "completed")
        assert len(desk.decisions(run)) == 1
        assert [r["metadata"]["approver"] for r in desk.ran(run)] == ["ada"]
        assert desk.run_ends(run) == ["completed"]
        # Whichever server is asked now, the link shows what was decided, and no form.
        for server in servers:
            shown = httpx.get(server.url + path, timeout=30)
            assert shown.status_code == 200, shown.text
            assert "ada approved it at" in shown.text and "decision-form" not in shown.text
        [other] = [a for a in answers if a.status_code != 303]
        assert "ada approved it at" in other.text or "already" in other.text.lower(), other.text
