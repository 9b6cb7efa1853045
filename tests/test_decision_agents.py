"""Each entry of the decision record names its run's agent, on SQLite and on
PostgreSQL: a decision and a vote record it when they are written (the owner the runs
list shows), and the listing, its filter and the export read it from there; entries
written before the record kept agents (NULL, or a table without the column that a
read-only localui may not migrate) are named by the runs index, as before.

The entries are made through the app by people signed in with their own tokens, on
real pauses and a real crashed run the SDK wrote (the seeded refund-bot runs). The
older record is the same record with the column taken away again, as the table was
before it had one: the app cannot be made to write that shape any more.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from test_approval_policy import TWO_FROM_FINANCE, Desk, open_desk
from test_decision_record import OWNER, _all, _record_with_votes

__all__ = ["open_desk"]  # the fixture, used by name below

AUTH = {"Authorization": OWNER["Authorization"]}
TABLES = ("localui_decisions", "localui_votes")


def _recorded(desk: Desk) -> dict[tuple[str, str], str | None]:
    """The agent each entry records, by ``(kind, execution_id)`` (one entry each here)."""
    decisions = desk.query("SELECT kind, execution_id, agent FROM {app}localui_decisions", ())
    votes = desk.query("SELECT execution_id, agent FROM {app}localui_votes", ())
    found = {(r["kind"], r["execution_id"]): r["agent"] for r in decisions}
    found.update({("vote", r["execution_id"]): r["agent"] for r in votes})
    return found


def _resume_crashed(desk: Desk, client: Any = None) -> str:
    """An operator resumes the run that crashed waiting on the model (through
    ``client``, else the desk's)."""
    client = client or desk.client
    crashed = desk.ids("crashed-waiting-on-model")
    plan = client.get(f"/runs/{crashed}.json", headers=OWNER).json()["resume"]
    done = client.post(
        f"/runs/{crashed}/resume",
        data={"checkpoint_id": plan["checkpoint_id"], "actor": "cy", "confirm": "yes"},
        headers=OWNER,
    )
    assert done.status_code == 200, done.text
    return crashed


def _agents(client: Any, query: str = "") -> list[tuple[str, str, str]]:
    """``(kind, execution_id, agent)`` of every entry the listing gives for ``query``."""
    url = f"/decisions.json?{query}" if query else "/decisions.json"
    return [(e["kind"], e["execution_id"], e["agent"]) for e in _all(client, url, OWNER)]


def _csv_agents(client: Any, query: str = "") -> list[tuple[str, str, str]]:
    served = client.get(f"/decisions.csv?{query}", headers=AUTH)
    assert served.status_code == 200, served.text
    rows = csv.DictReader(io.StringIO(served.text))
    return [(r["kind"], r["execution_id"], r["agent"]) for r in rows]


def test_a_new_decision_and_vote_record_the_agent_the_runs_list_shows(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    runs = _record_with_votes(desk)
    crashed = _resume_crashed(desk)
    listed = {
        r["execution_id"]: r["agent"]
        for r in desk.client.get("/runs.json", headers=OWNER).json()["runs"]
    }
    recorded = _recorded(desk)
    assert sorted(recorded) == sorted(
        [
            ("approval", runs["approved"]),
            ("approval", runs["rejected"]),
            ("resume", crashed),
            ("vote", runs["approved"]),
            ("vote", runs["voted"]),
        ]
    )
    assert {key: listed[key[1]] for key in recorded} == recorded
    assert set(recorded.values()) == {"refund-bot"}

    # The listing names an entry by what it records, not by a look in the runs index:
    # an entry recorded under another name lists, filters and exports under that one.
    assert (
        desk.execute(
            "UPDATE {app}localui_votes SET agent = 'refund-desk' WHERE execution_id = ?",
            (runs["voted"],),
        )
        == 1
    )
    assert (
        desk.execute(
            "UPDATE {app}localui_decisions SET agent = 'refund-desk' WHERE kind = 'resume'", ()
        )
        == 1
    )
    renamed = [("resume", crashed, "refund-desk"), ("vote", runs["voted"], "refund-desk")]
    whole = _agents(desk.client)
    assert sorted(e for e in whole if e[2] == "refund-desk") == renamed
    assert sorted(_agents(desk.client, "agent=refund-desk")) == renamed
    assert _agents(desk.client, "agent=refund-bot") == [e for e in whole if e[2] == "refund-bot"]
    assert len(_agents(desk.client, "agent=refund-bot")) == 3
    assert _csv_agents(desk.client) == whole
    assert sorted(_csv_agents(desk.client, "agent=refund-desk")) == renamed


def test_an_older_record_lists_by_the_runs_index_and_a_newer_entry_by_its_own(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    runs = _record_with_votes(desk)
    # The acting localui's runs index, which a read-only one reads agents from, as its
    # runs list brings it up to date (on PostgreSQL nothing else of this test does: it
    # held the runs only when a background sweep happened to look first).
    assert desk.client.get("/runs.json", headers=OWNER).status_code == 200
    before = _all(desk.client, "/decisions.json", OWNER)
    for table in TABLES:
        desk.execute(f"ALTER TABLE {{app}}{table} DROP COLUMN agent", ())

    # A read-only localui may not migrate the table: it names every entry by the runs
    # index, lists, filters and exports the record as it was.
    reader = desk.client_with(read_only=True)
    assert _all(reader, "/decisions.json", OWNER) == before
    assert {e["agent"] for e in before} == {"refund-bot"}
    assert _all(reader, "/decisions.json?agent=refund-bot", OWNER) == before
    assert _all(reader, "/decisions.json?agent=refund-desk", OWNER) == []
    assert _csv_agents(reader) == [(e["kind"], e["execution_id"], e["agent"]) for e in before]

    # An acting localui adds the column back, empty for the entries written before it:
    # they keep their agent from the runs index, and a new entry records its own.
    actor = desk.client_with()
    crashed = _resume_crashed(desk, actor)
    recorded = _recorded(desk)
    assert recorded.pop(("resume", crashed)) == "refund-bot"
    assert set(recorded.values()) == {None}
    assert len(recorded) == 4
    desk.execute(
        "UPDATE {app}localui_decisions SET agent = 'refund-desk' WHERE kind = 'resume'", ()
    )
    whole = _agents(actor)
    assert whole[0] == ("resume", crashed, "refund-desk")
    assert whole[1:] == [(e["kind"], e["execution_id"], "refund-bot") for e in before]
    # Filtered by agent: the older entries by the runs index, the newer by its own.
    assert _agents(actor, "agent=refund-bot") == whole[1:]
    assert _agents(actor, "agent=refund-desk") == whole[:1]
    assert _agents(actor, "agent=refund-desk&kind=vote") == []
    assert _agents(actor, "agent=refund-bot&approver=ada") == [
        e for e in whole[1:] if e[0] == "vote"
    ]
    assert runs["voted"] in {e[1] for e in whole}

    # The export round trip: the page, its CSV, and `localui decisions export` agree.
    listed = _all(actor, "/decisions.json", OWNER)
    from_csv = list(csv.DictReader(io.StringIO(actor.get("/decisions.csv", headers=AUTH).text)))
    done = subprocess.run(
        [sys.executable, "-m", "localui", "decisions", "export", *desk.export_args]
        + ["--format", "jsonl"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    from_jsonl = [json.loads(line) for line in done.stdout.splitlines()]
    columns = list(from_csv[0])
    assert [{k: _text(e[k]) for k in columns} for e in listed] == from_csv
    assert [{k: _text(v) for k, v in row.items()} for row in from_jsonl] == from_csv
    assert [row["agent"] for row in from_jsonl] == [e[2] for e in whole]


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
