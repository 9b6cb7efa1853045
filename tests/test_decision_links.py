"""Personal decision links on real pauses the SDK wrote, on SQLite and on PostgreSQL: a
link opens one pause's page for one person, decides nothing on GET or HEAD, decides once
when its person presses, keeps the desk's rules, and refuses with a page saying why.

The links are minted by the served app's own signer, as the sender mints them for a
message (``localui.links``); the announcements that carry them are tested with a real
Apprise target in ``test_personal_announcements.py``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from helpers import JSON, all_at_once
from test_approval_policy import TWO_FROM_FINANCE, Desk, open_desk

from localui.policy import parse_policy

__all__ = ["open_desk"]  # the fixture, shared with the policy tests

ANY_APPROVER = """
[[rule]]
name = "refunds"
agent = "refund-*"
approvers = ["role:approver"]
"""


def paused_rows(desk: Desk, headers: dict[str, str]) -> dict[str, str]:
    """Each waiting run's paused row, as the desk's queue shows it."""
    shown = desk.client.get("/approvals.json", headers=headers).json()["approvals"]
    return {item["execution_id"]: item["checkpoint_id"] for item in shown}


def mint(desk: Desk, person: str, run: str, checkpoint_id: str) -> str:
    """The link the sender would put in ``person``'s message about this pause."""
    state = desk.client.app.state.localui  # type: ignore[attr-defined]
    pending = state.store.get_pending(run)
    rule = state.actions.preflight.rule_for(pending)
    return str(state.links.mint(person, run, checkpoint_id, rule))


def page_of(desk: Desk, run: str, link: str) -> httpx.Response:
    return desk.client.get(f"/decide/{run}/{link}")


def form_of(page: httpx.Response) -> dict[str, str]:
    """The hidden values the rendered form posts back."""
    found = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page.text))
    assert set(found) == {"link", "form_key"}, page.text
    return found


def press(
    desk: Desk, run: str, page: httpx.Response, decision: str = "approve", **more: str
) -> httpx.Response:
    data = {**form_of(page), "decision": decision, "reason": "checked by phone", **more}
    return desk.client.post(f"/decide/{run}", data=data, follow_redirects=False)


def a_paused_run(desk: Desk, person: dict[str, str]) -> tuple[str, str]:
    run = desk.ids("paused-1")
    return run, paused_rows(desk, person)[run]


def test_the_link_opens_the_pause_for_its_person_and_decides_only_when_pressed(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(ANY_APPROVER)
    ada = desk.add("ada", "approver")
    run, checkpoint_id = a_paused_run(desk, ada)
    link = mint(desk, "ada", run, checkpoint_id)

    # Fetched again and again, as unfurlers and mail scanners do: nothing decided.
    for _ in range(20):
        page = page_of(desk, run, link)
        assert page.status_code == 200, page.text
        assert desk.client.head(f"/decide/{run}/{link}").status_code == 200
    assert desk.decisions(run) == [] and desk.run_ends(run) == []
    assert "Deciding as <strong>ada</strong>" in page.text
    assert "refund" in page.text and checkpoint_id in page.text
    # No script at all, no cookie: the page signs nobody in to the desk.
    assert "<script" not in page.text
    assert "set-cookie" not in page.headers
    assert page.headers["cache-control"] == "no-store"
    # The desk itself still asks for sign-in.
    assert desk.client.get("/approvals", headers=JSON).status_code == 401

    pressed = press(desk, run, page)
    assert pressed.status_code == 303, pressed.text
    assert pressed.headers["location"].endswith(f"/decide/{run}/{link}")
    [decision] = desk.decisions(run)
    assert decision["actor"] == "ada" and bool(decision["approved"])
    assert decision["metadata"]["approver"] == "ada"
    assert desk.run_ends(run) == ["completed"]

    # Spent: the page now says what was decided, by whom, and offers nothing more.
    after = page_of(desk, run, link)
    assert after.status_code == 200
    assert "ada approved it at" in after.text and "decision-form" not in after.text
    again = press(desk, run, page)
    assert again.status_code == 200 and "ada approved it at" in again.text
    assert len(desk.decisions(run)) == 1
    # The audit log names ada, come by her link.
    rows = desk.query(
        "SELECT actor, via, action, status FROM {app}localui_audit WHERE execution_id = ?", (run,)
    )
    assert [(r["actor"], r["via"], r["status"]) for r in rows][-2:] == [
        ("ada", "link", 303),
        ("ada", "link", 200),
    ]


def test_a_post_without_the_rendered_form_key_decides_nothing(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(ANY_APPROVER)
    ada = desk.add("ada", "approver")
    run, checkpoint_id = a_paused_run(desk, ada)
    link = mint(desk, "ada", run, checkpoint_id)
    other_link = mint(
        desk, "ada", desk.ids("paused-2"), paused_rows(desk, ada)[desk.ids("paused-2")]
    )
    other_page = page_of(desk, desk.ids("paused-2"), other_link)
    for form_key in ("", "made-up", form_of(other_page)["form_key"]):
        answer = desk.client.post(
            f"/decide/{run}",
            data={"link": link, "form_key": form_key, "decision": "approve", "reason": "x"},
        )
        assert answer.status_code == 403, answer.text
        assert "Nothing was decided" in answer.text
    # A cross-site POST is refused before anything reads it, as every POST is.
    page = page_of(desk, run, link)
    refused = desk.client.post(
        f"/decide/{run}",
        data={**form_of(page), "decision": "approve"},
        headers={"Origin": "https://mail-scanner.example", "Sec-Fetch-Site": "cross-site"},
    )
    assert refused.status_code == 403
    assert desk.decisions(run) == [] and desk.run_ends(run) == []


def test_refusals_each_say_why(open_desk: Callable[..., Desk]) -> None:
    desk = open_desk(ANY_APPROVER, notifications=_ttl(2.0))
    ada = desk.add("ada", "approver")
    desk.add("vic", "viewer")
    run, checkpoint_id = a_paused_run(desk, ada)
    other_run = desk.ids("paused-2")

    def said(answer: httpx.Response, status: int, words: str) -> None:
        assert answer.status_code == status, answer.text
        assert words in answer.text, answer.text

    link = mint(desk, "ada", run, checkpoint_id)
    said(page_of(desk, run, link[:-3] + "abc"), 404, "does not open anything")
    said(page_of(desk, other_run, link), 403, "This link is for another pause")
    # Its form posted for another run (the run in the path changed): refused the same.
    moved = desk.client.post(
        f"/decide/{other_run}",
        data={**form_of(page_of(desk, run, link)), "decision": "approve"},
        follow_redirects=False,
    )
    said(moved, 403, "This link is for another pause")
    # Sent for another row of this run than the one it waits at (as after a second
    # pause): the pause it was sent for is gone, and the link does not follow.
    rows = desk.client.get(f"/runs/{run}.json", headers=ada).json()["rows"]
    earlier = next(r["checkpoint_id"] for r in rows if r["checkpoint_id"] != checkpoint_id)
    elsewhere = mint(desk, "ada", run, earlier)
    said(
        page_of(desk, run, elsewhere),
        409,
        f"no longer waits at the row this link was sent for ({earlier})",
    )
    said(
        desk.client.post(
            f"/decide/{run}",
            data={"link": elsewhere, "form_key": form_of(page_of(desk, run, link))["form_key"]},
            follow_redirects=False,
        ),
        409,
        "it waits for a new decision now, on the desk",
    )
    said(page_of(desk, run, mint(desk, "vic", run, checkpoint_id)), 403, "viewers decide nothing")
    said(page_of(desk, run, mint(desk, "nobody", run, checkpoint_id)), 403, "No one named nobody")
    # Signed in to the desk as someone else: the link is not theirs to use.
    desk.add("bob", "approver")
    desk.client.cookies.update(_session_of(desk, "bob"))
    said(page_of(desk, run, link), 403, "You are signed in to this desk as bob")
    desk.client.cookies.clear()
    # Expired (the test server's links live 2 s).
    time.sleep(3.1)
    said(page_of(desk, run, link), 410, "This link has expired")
    assert desk.decisions(run) == []


def test_a_link_for_a_pause_decided_on_the_desk_is_spent(open_desk: Callable[..., Desk]) -> None:
    desk = open_desk(ANY_APPROVER)
    ada = desk.add("ada", "approver")
    bob = desk.add("bob", "approver")
    run, checkpoint_id = a_paused_run(desk, ada)
    link = mint(desk, "ada", run, checkpoint_id)
    page = page_of(desk, run, link)
    decided = desk.client.post(
        f"/approvals/{run}/reject",
        data={"checkpoint_id": checkpoint_id, "reason": "not this one"},
        headers=bob,
    )
    assert decided.status_code == 200, decided.text
    spent = page_of(desk, run, link)
    assert spent.status_code == 409
    assert "bob rejected it at" in spent.text and "not this one" in spent.text
    late = press(desk, run, page)
    assert late.status_code == 409 and len(desk.decisions(run)) == 1


def test_a_two_person_rule_counts_the_link_person_once_and_checks_fields(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    ada = desk.add("ada", "approver")
    bob = desk.add("bob", "approver", "finance")
    run, checkpoint_id = a_paused_run(desk, ada)
    link = mint(desk, "ada", run, checkpoint_id)
    page = page_of(desk, run, link)
    assert 'name="field.amount"' in page.text
    too_much = press(desk, run, page, **{"field.amount": "999999"})
    assert too_much.status_code == 400 and "above the maximum" in too_much.text
    voted = press(desk, run, page_of(desk, run, link), **{"field.amount": "120.5"})
    assert voted.status_code == 303
    assert desk.votes(run) == ["ada"] and desk.run_ends(run) == []
    counted = page_of(desk, run, link)
    assert counted.status_code == 200 and "Your approval is counted" in counted.text
    assert "decision-form" not in counted.text
    # ada on the desk is the same person: refused there too.
    twice = desk.client.post(
        f"/approvals/{run}/approve",
        data={"checkpoint_id": checkpoint_id, "reason": "me", "field.amount": "120.5"},
        headers=ada,
    )
    assert twice.status_code == 409
    done = desk.client.post(
        f"/approvals/{run}/approve",
        data={"checkpoint_id": checkpoint_id, "reason": "ok", "field.amount": "120.5"},
        headers=bob,
    )
    assert done.status_code == 200 and done.json()["status"] == "completed"
    [decision] = desk.decisions(run)
    assert decision["metadata"]["approvers"] == ["ada", "bob"]


def test_a_link_under_a_changed_rule_is_refused(open_desk: Callable[..., Desk]) -> None:
    desk = open_desk(ANY_APPROVER)
    ada = desk.add("ada", "approver")
    run, checkpoint_id = a_paused_run(desk, ada)
    # Sent while the policy said something else of this pause: a reason to approve too.
    before = parse_policy(ANY_APPROVER + 'reason_required = "always"\n').rules[0]
    state = desk.client.app.state.localui  # type: ignore[attr-defined]
    link = state.links.mint("ada", run, checkpoint_id, before)
    answer = page_of(desk, run, link)
    assert answer.status_code == 403 and "has changed" in answer.text
    # Sent with no rule over the pause at all, the same.
    unruled = state.links.mint("ada", run, checkpoint_id, None)
    assert page_of(desk, run, unruled).status_code == 403
    assert desk.decisions(run) == []


def _ttl(seconds: float) -> Any:
    from localui.settings import Notifications

    return Notifications(link_ttl=seconds)


def _session_of(desk: Desk, name: str) -> dict[str, str]:
    """A desk session cookie of ``name``, signed in with their token."""
    token = f"token-of-{name}-0123456789abcdef"
    desk.client.cookies.clear()
    answer = desk.client.get(f"/?token={token}", follow_redirects=False)
    assert answer.status_code in (302, 303), answer.text
    cookies = dict(desk.client.cookies)
    desk.client.cookies.clear()
    assert cookies
    return cookies


def test_presses_at_once_decide_once(open_desk: Callable[..., Desk]) -> None:
    """Ten presses of one link's form at once (a double click, a form sent again): one
    decision, carried out once; the others see it decided."""
    desk = open_desk(ANY_APPROVER)
    ada = desk.add("ada", "approver")
    run, checkpoint_id = a_paused_run(desk, ada)
    link = mint(desk, "ada", run, checkpoint_id)
    page = page_of(desk, run, link)
    answers = all_at_once(10, lambda _: press(desk, run, page))
    assert {a.status_code for a in answers} <= {200, 303}, [
        (a.status_code, a.text[-300:]) for a in answers
    ]
    assert [a.status_code for a in answers].count(303) >= 1
    assert len(desk.decisions(run)) == 1 and desk.run_ends(run) == ["completed"]


def test_link_ttl_is_a_day_unless_told_and_a_bad_one_is_refused() -> None:
    """``--link-ttl``: 24 h when not given, any length ``--older-than`` takes, and a
    one-line refusal of anything else, before the server starts."""
    from localui.cli import NotifyOptionError, _notifications, build_parser

    parser = build_parser()

    def ttl(*extra: str) -> float:
        args = parser.parse_args(["serve", "--store", "x.db", *extra])
        return _notifications(args).link_ttl

    assert ttl() == 86400.0
    assert ttl("--link-ttl", "90m") == 5400.0
    assert ttl("--link-ttl", "2d") == 172800.0
    for bad in ("soon", "0s", "-1h"):
        with pytest.raises(NotifyOptionError) as refused:
            ttl(f"--link-ttl={bad}")
        assert "--link-ttl" in str(refused.value) and "\n" not in str(refused.value)
