"""The decision record with votes, on SQLite and on PostgreSQL: a two-person rule's
first approvals are entries of ``/decisions`` (kind ``vote``) beside the approvals,
rejections and resumes, in one order newest first, paged across both tables, and the
same in ``/decisions.csv`` and ``localui decisions export``.

The votes are cast through the app by people signed in with their own tokens, on real
pauses the SDK wrote (the seeded refund-bot runs), under a policy that needs two.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from helpers import JSON, TEST_TOKEN
from test_approval_policy import TWO_FROM_FINANCE, Desk, approve, open_desk

__all__ = ["open_desk"]  # the fixture, used by name below


def _paused(desk: Desk, headers: dict[str, str]) -> dict[str, str]:
    """Each paused run's checkpoint id, as the queue shows it."""
    shown = desk.client.get("/approvals.json", headers=headers).json()["approvals"]
    return {item["execution_id"]: item["checkpoint_id"] for item in shown}


def _record_with_votes(desk: Desk) -> dict[str, str]:
    """Ada votes on two pauses; Bob completes the first and rejects a third. Returns the
    runs by role, and leaves the record as (newest first): Bob's rejection, Ada's
    standing vote, Bob's approval, Ada's first vote."""
    ada = desk.add("ada", "approver")
    bob = desk.add("bob", "approver", "finance")
    checkpoints = _paused(desk, ada)
    runs = {
        "approved": desk.ids("paused-1"),
        "voted": desk.ids("paused-2"),
        "rejected": desk.ids("paused-3"),
    }
    steps = [
        (runs["approved"], ada, "voted"),
        (runs["approved"], bob, "completed"),
        (runs["voted"], ada, "voted"),
    ]
    for run, person, status in steps:
        done = approve(desk, run, checkpoints[run], person, amount="100")
        assert done.status_code == 200, done.text
        assert done.json()["status"] == status, done.text
    rejected = desk.client.post(
        f"/approvals/{runs['rejected']}/reject",
        data={
            "checkpoint_id": checkpoints[runs["rejected"]],
            "reason": "not this one",
            "field.amount": "100",
        },
        headers=bob,
    )
    assert rejected.status_code == 200, rejected.text
    return runs


def _all(client: Any, url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """Every entry ``url`` lists, following ``next`` page by page."""
    entries: list[dict[str, Any]] = []
    joiner = "&" if "?" in url else "?"
    page_url = url
    while page_url:
        page = client.get(page_url, headers=headers)
        assert page.status_code == 200, page.text
        body = page.json()
        entries.extend(body["decisions"])
        page_url = f"{url}{joiner}after={body['next']}" if body["next"] else ""
    return entries


OWNER = {**JSON, "Authorization": f"Bearer {TEST_TOKEN}"}


def test_votes_are_entries_of_the_record_newest_first_across_pages(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    runs = _record_with_votes(desk)
    expected = [
        (runs["rejected"], "approval", False, "bob"),
        (runs["voted"], "vote", True, "ada"),
        (runs["approved"], "approval", True, "bob"),
        (runs["approved"], "vote", True, "ada"),
    ]

    def summary(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(e["execution_id"], e["kind"], e["approved"], e["approver"]) for e in entries]

    whole = _all(desk.client, "/decisions.json", OWNER)
    # Bob's own vote completed the count: it is listed once, as his approval.
    assert summary(whole) == expected
    assert [e["outcome"] for e in whole] == ["completed", "voted", "completed", "voted"]
    assert all(e["agent"] == "refund-bot" for e in whole)
    assert all(e["url"] == f"/runs/{e['execution_id']}" for e in whole)
    assert whole[1]["reason"] == "checked the order"
    # Votes and decisions count their ids apart: an entry is its kind and id together.
    assert len({(e["kind"], e["id"]) for e in whole}) == len(whole)
    decided = [e["decided_at"] for e in whole]
    assert decided == sorted(decided, reverse=True)

    # Pages of one and of three entries cross from one table to the other and back.
    for size in (1, 3):
        assert desk.client_with is not None
        client = desk.client_with(page_size=size)
        assert _all(client, "/decisions.json", OWNER) == whole

    one = desk.client_with(page_size=1)

    def listed(query: str) -> list[tuple[Any, ...]]:
        return summary(_all(one, f"/decisions.json?{query}", OWNER))

    votes = [e for e in expected if e[1] == "vote"]
    assert listed("kind=vote") == votes
    assert listed("outcome=voted") == votes
    assert listed("kind=approval") == [e for e in expected if e[1] == "approval"]
    assert listed("kind=resume") == []
    assert listed("approver=ada") == votes
    assert listed("approver=bob") == [e for e in expected if e[3] == "bob"]
    assert listed("agent=refund-bot") == expected
    assert listed("agent=no-such-agent") == []
    assert listed("since=1h") == expected
    # Before Bob's approval: Ada's first vote alone.
    until = whole[2]["decided_at"].replace("+", "%2B")
    assert listed(f"until={until}") == [expected[3]]
    assert listed(f"kind=vote&until={until}") == [expected[3]]
    assert one.get("/decisions.json?after=dm90ZS14", headers=OWNER).status_code == 400

    html = desk.client.get(
        "/decisions?kind=vote", headers={"Authorization": OWNER["Authorization"]}
    ).text
    assert html.count("voted to approve") == 2
    assert f'href="/runs/{runs["voted"]}"' in html and f'href="/runs/{runs["approved"]}"' in html
    assert f'href="/runs/{runs["rejected"]}"' not in html
    assert 'id="vote-' in html


def test_a_vote_and_a_decision_of_the_same_instant_are_each_listed_once(
    open_desk: Callable[..., Desk],
) -> None:
    """Two people decide within one clock tick on busy servers; paging one entry at a
    time must neither skip nor repeat either (the app's own rows, moved to one instant,
    as the app cannot be made to write them so)."""
    desk = open_desk(TWO_FROM_FINANCE)
    runs = _record_with_votes(desk)
    moved = desk.execute(
        "UPDATE {app}localui_votes SET voted_at = (SELECT decided_at FROM"
        " {app}localui_decisions WHERE execution_id = ?) WHERE execution_id = ?",
        (runs["rejected"], runs["voted"]),
    )
    assert moved == 1
    whole = _all(desk.client, "/decisions.json", OWNER)
    assert whole[0]["decided_at"] == whole[1]["decided_at"]
    # At one instant the vote comes first, then the decision (newest first by time,
    # then votes before decisions, then id).
    assert [(e["execution_id"], e["kind"]) for e in whole[:2]] == [
        (runs["voted"], "vote"),
        (runs["rejected"], "approval"),
    ]
    assert desk.client_with is not None
    one = desk.client_with(page_size=1)
    assert _all(one, "/decisions.json", OWNER) == whole
    served = one.get("/decisions.csv", headers={"Authorization": OWNER["Authorization"]})
    assert [row["kind"] for row in csv.DictReader(io.StringIO(served.text))] == [
        e["kind"] for e in whole
    ]


def test_a_withdrawn_vote_is_not_listed(open_desk: Callable[..., Desk]) -> None:
    """A vote whose claim lost to another decision counts for nothing: the app deletes
    it (``withdraw_vote``), and the record does not list it as standing."""
    desk = open_desk(TWO_FROM_FINANCE)
    runs = _record_with_votes(desk)
    [standing] = [
        e
        for e in _all(desk.client, "/decisions.json?kind=vote", OWNER)
        if e["execution_id"] == runs["voted"]
    ]
    done = subprocess.run(
        [sys.executable, "-c", f"{desk.open_log}; log.withdraw_vote({standing['id']})"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    left = _all(desk.client, "/decisions.json?kind=vote", OWNER)
    assert [(e["execution_id"], e["approver"]) for e in left] == [(runs["approved"], "ada")]


def test_csv_and_jsonl_exports_round_trip_the_votes(open_desk: Callable[..., Desk]) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    _record_with_votes(desk)
    listed = _all(desk.client, "/decisions.json", OWNER)

    served = desk.client.get("/decisions.csv", headers={"Authorization": OWNER["Authorization"]})
    assert served.status_code == 200 and served.headers["content-type"].startswith("text/csv")
    from_csv = list(csv.DictReader(io.StringIO(served.text)))

    def export(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "localui", "decisions", "export", *desk.export_args, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    from_jsonl = [json.loads(line) for line in export("--format", "jsonl").splitlines()]
    from_cli_csv = list(csv.DictReader(io.StringIO(export())))

    def as_text(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    columns = list(from_csv[0].keys())
    assert [row["kind"] for row in from_csv] == ["approval", "vote", "approval", "vote"]
    assert [{k: as_text(e[k]) for k in columns} for e in listed] == from_csv
    assert [{k: as_text(v) for k, v in row.items()} for row in from_jsonl] == from_csv
    assert from_cli_csv == from_csv
    # Read back, the votes are what was cast: who, on which run, approved, counted.
    votes = [row for row in from_jsonl if row["kind"] == "vote"]
    assert [(v["approver"], v["approved"], v["outcome"]) for v in votes] == [
        ("ada", True, "voted"),
        ("ada", True, "voted"),
    ]
    assert len({(row["kind"], row["id"]) for row in from_jsonl}) == len(from_jsonl)

    def csv_of(query: str) -> list[tuple[str, str]]:
        got = desk.client.get(
            f"/decisions.csv?{query}", headers={"Authorization": OWNER["Authorization"]}
        )
        assert got.status_code == 200, got.text
        return [(r["kind"], r["approver"]) for r in csv.DictReader(io.StringIO(got.text))]

    # The CSV takes the page's filters.
    assert csv_of("kind=vote") == [("vote", "ada"), ("vote", "ada")]
    assert csv_of("approver=bob") == [("approval", "bob"), ("approval", "bob")]
    assert csv_of("outcome=voted&approver=bob") == []
    assert csv_of("agent=refund-bot&since=1h") == [(r["kind"], r["approver"]) for r in from_csv]
