"""Two ``localui serve`` processes on one SQLite store: a pause is decided once.

People behind two servers (two terminals, two colleagues) click Approve on the
same card at the same moment. The decision record in the store's own file is
the lock both processes share; the store tells how many resumes happened.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import helpers
import httpx
import pytest
from helpers import LocalServer, all_at_once, decide, start_localui

if TYPE_CHECKING:
    from conftest import Ledger, Raw, Seeded

LOCALUI = Path(sys.executable).parent / "localui"
#: Import and bind take well under a second; a server not answering by then is stuck.
START_TIMEOUT_S = 30.0

AGENTS_FILE = """\
from pathlib import Path

from fastaiagent.checkpointers import SQLiteCheckpointer

from localui.demo.agent import build_agent


def refund_bot():
    return build_agent(SQLiteCheckpointer({store!r}), ledger=Path({ledger!r}))
"""


def start_server(store: Path, agents: Path, workdir: Path, name: str) -> LocalServer:
    env = {
        **os.environ,
        "FASTAIAGENT_TRACE_ENABLED": "false",
        "FASTAIAGENT_LOCAL_DB": str(store),
    }
    return start_localui(
        ["serve", "--store", str(store), "--agents", f"{agents}:refund_bot", "--no-auth"],
        cwd=workdir,
        log=workdir / f"{name}.log",
        env=env,
        ready="/approvals.json",
        timeout=START_TIMEOUT_S,
    )


@dataclass(frozen=True)
class Fleet:
    servers: tuple[LocalServer, ...]
    db: Raw
    ledger: Ledger


@pytest.fixture
def fleet(
    store_copy: Path, ledger: Ledger, raw: Callable[[Path], Raw], tmp_path: Path
) -> Iterator[Fleet]:
    """Two servers on one copy of the seeded store, each with the refund-bot bound to
    it and appending its side effects to one shared ledger."""
    workdir = tmp_path / "fleet"
    workdir.mkdir()
    agents = workdir / "fleet_agents.py"
    agents.write_text(AGENTS_FILE.format(store=str(store_copy), ledger=str(ledger.path)))
    servers: list[LocalServer] = []
    try:
        for name in ("server-a", "server-b"):
            servers.append(start_server(store_copy, agents, workdir, name))
        yield Fleet(tuple(servers), raw(store_copy), ledger)
    finally:
        for server in servers:
            server.stop()


def card(server: LocalServer, execution_id: str) -> dict[str, Any]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        return helpers.card(client, execution_id)


def approve(
    server: LocalServer, execution_id: str, checkpoint_id: str, approver: str
) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        return decide(client, execution_id, checkpoint_id, approver=approver, reason="race")


def run_ends(db: Raw, execution_id: str) -> list[str]:
    return [r["status"] for r in db.rows(execution_id) if r["step_type"] == "run_end"]


def decisions(db: Raw, execution_id: str) -> list[str]:
    rows = db.query(
        "SELECT actor FROM localui_decisions WHERE execution_id = ? ORDER BY id", (execution_id,)
    )
    return [r["actor"] for r in rows]


def test_ten_approvals_over_two_processes_resume_the_run_once(fleet: Fleet, seeded: Seeded) -> None:
    a, b = fleet.servers
    run = seeded.id("paused-1")
    shown = card(a, run)
    assert card(b, run)["checkpoint_id"] == shown["checkpoint_id"]
    rows_before = len(fleet.db.rows(run))

    responses = all_at_once(
        10,
        lambda i: approve(fleet.servers[i % 2], run, shown["checkpoint_id"], f"approver-{i}"),
    )

    statuses = [r.status_code for r in responses]
    wins, conflicts = statuses.count(200), statuses.count(409)
    errors = len(statuses) - wins - conflicts
    said = [r.json()["error"]["message"] for r in responses if r.status_code == 409]
    print(
        f"\nfleet race, 2 processes: {wins} win, {conflicts} conflicts (409: "
        f"{sum('already approved' in m for m in said)} 'already approved', "
        f"{sum('being approved' in m for m in said)} 'being approved'), {errors} errors"
    )
    assert [s for s in statuses if s >= 500] == [], a.output() + b.output()
    assert (wins, conflicts, errors) == (1, 9, 0), statuses
    [won] = [r.json() for r in responses if r.status_code == 200]
    assert won["status"] == "completed"
    winner = won["decision"]["approver"]
    for words in said:
        assert words.startswith(
            (
                f"This pause was already approved by {winner} ",
                f"This pause was being approved by {winner} ",
            )
        ), words
    # One resume: one run end, the next turn and the end written once, one decision.
    assert run_ends(fleet.db, run) == ["completed"]
    assert len(fleet.db.rows(run)) == rows_before + 2
    assert decisions(fleet.db, run) == [winner]
    # Its charge was answered from the @idempotent cache the paused run wrote.
    assert fleet.ledger.count() == 0
    for server in fleet.servers:
        shown_there = httpx.get(f"{server.url}/approvals/{run}.json", timeout=10).json()
        assert shown_there["pending"] is None
        assert [d["approver"] for d in shown_there["decisions"]] == [winner]


def test_every_pause_decided_once_when_both_processes_race_on_all_of_them(
    fleet: Fleet, seeded: Seeded
) -> None:
    pauses = sorted(seeded.ids("paused"))
    cards = {run: card(fleet.servers[0], run)["checkpoint_id"] for run in pauses}
    jobs = [(run, i) for run in pauses for i in range(4)]

    def act(k: int) -> httpx.Response:
        run, i = jobs[k]
        return approve(fleet.servers[k % 2], run, cards[run], f"approver-{k}")

    responses = all_at_once(len(jobs), act)

    by_run: dict[str, list[httpx.Response]] = {run: [] for run in pauses}
    for (run, _), response in zip(jobs, responses, strict=True):
        by_run[run].append(response)
    print(
        f"\nfleet, {len(pauses)} pauses x 4 clicks: "
        f"{[sorted(r.status_code for r in rs) for rs in by_run.values()]}"
    )
    for run, answers in by_run.items():
        assert sorted(r.status_code for r in answers) == [200, 409, 409, 409], run
        [winner] = [r.json()["decision"]["approver"] for r in answers if r.status_code == 200]
        for lost in (r for r in answers if r.status_code == 409):
            assert re.match(
                rf"This pause was (already|being) approved by {winner} ",
                lost.json()["error"]["message"],
            ), lost.text
        assert run_ends(fleet.db, run) == ["completed"]
        assert decisions(fleet.db, run) == [winner]
    assert fleet.db.query("SELECT COUNT(*) AS n FROM pending_interrupts")[0]["n"] == 0
    assert fleet.ledger.count() == 0
