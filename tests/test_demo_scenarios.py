"""The demo seeder, end to end: real child processes, a real store, read back raw."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from localui.demo.scenarios import (
    SCENARIO_NAMES,
    Scenario,
    Seeding,
    SeedReport,
    create_store,
    get_scenario,
    seed,
)
from localui.records import SeedProgress

if TYPE_CHECKING:
    from conftest import ClientFactory

#: Reads of a store the demo wrote: also run on the lowest SDK the project declares.
pytestmark = pytest.mark.floor


@dataclass(frozen=True, slots=True)
class Seeded:
    report: SeedReport
    ledger: Path
    cwd_after: list[str]
    progress: list[str]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    base = tmp_path_factory.mktemp("seed")
    cwd = base / "cwd"
    cwd.mkdir()
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        # Relative on purpose: the children run elsewhere, seed must resolve them.
        report = seed(Path("../store.db"), ledger=Path("../ledger.jsonl"), progress=lines.append)
    return Seeded(
        report=report,
        ledger=base / "ledger.jsonl",
        cwd_after=sorted(p.name for p in cwd.iterdir()),
        progress=lines,
    )


@pytest.fixture
def db(seeded: Seeded) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(f"file:{seeded.report.store}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    yield conn
    conn.close()


def rows(db: sqlite3.Connection, execution_id: str) -> list[sqlite3.Row]:
    """A run's rows in the order they were written."""
    return db.execute(
        "SELECT * FROM checkpoints WHERE execution_id = ? ORDER BY created_at, rowid",
        (execution_id,),
    ).fetchall()


def pending(db: sqlite3.Connection, execution_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = db.execute(
        "SELECT * FROM pending_interrupts WHERE execution_id = ?", (execution_id,)
    ).fetchone()
    return row


def ledger_effects(seeded: Seeded) -> list[dict[str, Any]]:
    return [json.loads(line) for line in seeded.ledger.read_text().splitlines()]


def test_every_scenario_has_its_own_run(seeded: Seeded, db: sqlite3.Connection) -> None:
    runs = seeded.report.runs
    assert tuple(runs) == SCENARIO_NAMES
    assert len(set(runs.values())) == len(SCENARIO_NAMES)
    for execution_id in runs.values():
        assert rows(db, execution_id), execution_id
    assert len(seeded.progress) == len(SCENARIO_NAMES)
    assert seeded.report.store.is_absolute()


def test_seeding_leaves_the_callers_cwd_clean(seeded: Seeded) -> None:
    assert seeded.cwd_after == []


def test_report_names_a_missing_scenario(seeded: Seeded) -> None:
    assert seeded.report.run_id("completed") == seeded.report.runs["completed"]
    with pytest.raises(KeyError, match="no-such"):
        seeded.report.run_id("no-such")


# scenario -> newest row (node_id, step_type, status), has run_end, has pending row
NEWEST = {
    "completed": (("run_end", "run_end", "completed"), True, False),
    "paused-1": (("turn:0/tool:refund", "hitl_pause", "interrupted"), False, True),
    "paused-2": (("turn:0/tool:refund", "hitl_pause", "interrupted"), False, True),
    "paused-3": (("turn:0/tool:refund", "hitl_pause", "interrupted"), False, True),
    "crashed-in-tool": (("turn:0/tool:refund", "tool_call", "completed"), False, False),
    "crashed-waiting-on-model": (("turn:1", "llm_call", "completed"), False, False),
    "failed": (("run_end", "run_end", "failed"), True, False),
    "two-tools-first-pauses": (("turn:0/tool:refund", "hitl_pause", "interrupted"), False, True),
    "idempotent-resumed": (("run_end", "run_end", "completed"), True, False),
    "fork-of-completed": (("run_end", "run_end", "completed"), True, False),
}


def test_the_table_covers_every_scenario() -> None:
    assert set(NEWEST) == set(SCENARIO_NAMES)


@pytest.mark.parametrize("scenario", sorted(NEWEST))
def test_newest_row_run_end_and_pending(
    seeded: Seeded, db: sqlite3.Connection, scenario: str
) -> None:
    newest, has_end, has_pending = NEWEST[scenario]
    history = rows(db, seeded.report.run_id(scenario))
    last = history[-1]
    assert (last["node_id"], last["step_type"], last["status"]) == newest
    assert any(r["step_type"] == "run_end" for r in history) is has_end
    assert (pending(db, seeded.report.run_id(scenario)) is not None) is has_pending


def test_failed_run_records_the_model_error(seeded: Seeded, db: sqlite3.Connection) -> None:
    end = rows(db, seeded.report.run_id("failed"))[-1]
    snapshot = json.loads(end["state_snapshot"])
    assert snapshot["run_error"] == "RuntimeError: model provider returned 503"


def test_crash_in_tool_keeps_the_tool_args(seeded: Seeded, db: sqlite3.Connection) -> None:
    last = rows(db, seeded.report.run_id("crashed-in-tool"))[-1]
    assert json.loads(last["node_input"]) == {"order_id": "A-1006", "amount": 80.0}


def test_pauses_freeze_distinct_approval_contexts(seeded: Seeded, db: sqlite3.Connection) -> None:
    contexts = []
    for name in ("paused-1", "paused-2", "paused-3"):
        row = pending(db, seeded.report.run_id(name))
        assert row is not None
        assert row["reason"] == "manager_approval"
        assert row["node_id"] == "turn:0/tool:refund"
        contexts.append(json.loads(row["context"]))
    assert [c["amount"] for c in contexts] == [250.0, 900.0, 1200.0]
    assert len({c["order_id"] for c in contexts}) == 3
    assert len({c["customer"] for c in contexts}) == 3
    assert all(c["policy"]["requires"]["role"] == "manager" for c in contexts)


def test_pauses_are_queued_in_scenario_order(seeded: Seeded, db: sqlite3.Connection) -> None:
    created = []
    for name in ("paused-1", "paused-2", "paused-3"):
        row = pending(db, seeded.report.run_id(name))
        assert row is not None
        created.append(row["created_at"])
    assert created == sorted(created)


def test_two_tools_pause_on_the_first_before_the_second_runs(
    seeded: Seeded, db: sqlite3.Connection
) -> None:
    history = rows(db, seeded.report.run_id("two-tools-first-pauses"))
    snapshot = json.loads(history[-1]["state_snapshot"])
    assistant = [m for m in snapshot["messages"] if m.get("role") == "assistant"][-1]
    assert [c["name"] for c in assistant["tool_calls"]] == ["refund", "notify_customer"]
    assert not any("notify_customer" in r["node_id"] for r in history)
    assert not [e for e in ledger_effects(seeded) if e["effect"] == "notify_customer"]


def test_fork_starts_at_an_origin_inside_the_completed_run(
    seeded: Seeded, db: sqlite3.Connection
) -> None:
    fork = rows(db, seeded.report.run_id("fork-of-completed"))
    origin = fork[0]
    assert (origin["node_id"], origin["step_type"]) == ("__fork_origin__", "fork_origin")
    source = {r["checkpoint_id"]: r for r in rows(db, seeded.report.run_id("completed"))}
    # No checkpoint named: the source's last executed step, stepping over its run_end.
    parent = source[origin["parent_checkpoint_id"]]
    assert (parent["node_id"], parent["step_type"]) == ("turn:1", "llm_call")


def test_resumed_run_passed_its_approval(seeded: Seeded, db: sqlite3.Connection) -> None:
    history = rows(db, seeded.report.run_id("idempotent-resumed"))
    assert [r["step_type"] for r in history] == [
        "llm_call",
        "tool_call",
        "hitl_pause",
        "llm_call",
        "run_end",
    ]
    messages = json.loads(history[-1]["state_snapshot"])["messages"]
    assert any(m.get("content") == "refunded 450.00 on A-1009" for m in messages)
    cache = db.execute(
        "SELECT result FROM idempotency_cache WHERE execution_id = ?",
        (seeded.report.run_id("idempotent-resumed"),),
    ).fetchall()
    from conftest import sdk_version

    # The SDK wraps cached results as {"__fa_idem__": value} since 1.92, bare before.
    stored = "cb-A-1009-450.00"
    wrapped = {"__fa_idem__": stored} if sdk_version() >= (1, 92) else stored
    assert [json.loads(r["result"]) for r in cache] == [wrapped]


def test_each_charge_back_happened_once(seeded: Seeded) -> None:
    charges = Counter(e["order_id"] for e in ledger_effects(seeded) if e["effect"] == "charge_back")
    assert charges == {
        "A-1001": 1,  # completed; the fork repeated no tool
        "A-1002": 1,
        "A-1003": 1,
        "A-1004": 1,
        "A-1005": 1,
        "A-1007": 1,  # crashed after its tool, waiting on the model
        "A-1009": 1,  # paused after the charge, resumed: answered from the cache
    }  # A-1006 died before its charge; A-1008's model never asked for one


def test_worker_refuses_a_fork_without_source(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "localui.demo.worker", "--store", str(tmp_path / "s.db")]
        + ["--scenario", "fork-of-completed"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "--source" in done.stderr
    assert not (tmp_path / "s.db").exists()


def test_worker_refuses_an_unknown_scenario(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "localui.demo.worker", "--store", str(tmp_path / "s.db")]
        + ["--scenario", "no-such"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "no-such" in done.stderr


# --- seeding while serving: what `localui demo` runs in its lifespan ---------------


def test_a_failed_scenario_is_named_with_its_reason_and_the_rest_go_on(
    tmp_path: Path, make_client: ClientFactory
) -> None:
    """A scenario its worker cannot run fails, with the worker's words; the one waiting
    for it fails too; the others land. The terminal lines and the runs page say so."""
    store = tmp_path / "local.db"
    create_store(store)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.db"]
    unknown = Scenario("no-such-scenario", "Refund order Z-1 for 1.00", "completed")
    waiting = Scenario("waits-for-it", None, "completed", fork=True, after="no-such-scenario")
    said: list[str] = []
    seeding = Seeding(
        store,
        scenarios=(get_scenario("completed"), unknown, waiting, get_scenario("paused-1")),
        say=said.append,
    )
    announced: list[str] = []
    report = asyncio.run(seeding.run(announced.append))

    assert set(report.runs) == {"completed", "paused-1"}
    assert sorted(announced) == sorted(report.runs.values())
    progress = seeding.progress()
    assert progress.finished and progress.landed == 2 and progress.total == 4
    failed = {f.scenario: f.reason for f in progress.failures}
    assert set(failed) == {"no-such-scenario", "waits-for-it"}
    assert "exited with 2" in failed["no-such-scenario"]
    assert "no demo scenario 'no-such-scenario'" in failed["no-such-scenario"]
    assert failed["waits-for-it"] == "waits for scenario 'no-such-scenario', which failed"
    assert any(line.startswith("no-such-scenario") and "FAILED" in line for line in said)

    client = make_client(store, seeding=_Finished(seeding))
    listing = client.get("/runs.json").json()
    page = client.get("/").text
    assert len(listing["runs"]) == 2
    assert listing["seeding"]["finished"] is True
    assert [f["scenario"] for f in listing["seeding"]["failures"]] == [
        "no-such-scenario",
        "waits-for-it",
    ]
    assert "seeded the demo: 2 of 4; 2 failed" in page
    assert "Scenario <code>no-such-scenario</code> failed" in page
    assert "no demo scenario &#39;no-such-scenario&#39;" in page


class _Finished:
    """A seeding that already ran: the app shows its progress and runs nothing."""

    def __init__(self, seeding: Seeding) -> None:
        self._seeding = seeding

    def progress(self) -> SeedProgress:
        return self._seeding.progress()

    async def run(self, landed: Callable[[str], None], actions: object) -> object:
        return None
