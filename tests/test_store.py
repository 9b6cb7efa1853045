"""The SQLite read model over stores the real SDK wrote, old stores and damaged ones."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from localui import runs
from localui.backends.base import STATES
from localui.backends.sqlite.store import SQLiteStore
from localui.errors import StoreMissing
from localui.records import RunFacts, RunQuery, Unreadable

if TYPE_CHECKING:
    from conftest import Raw, Seeded

#: The read model: also run on the lowest SDK the project declares.
pytestmark = pytest.mark.floor


def state_of(facts: RunFacts) -> str:
    return runs.run_state(facts.last_step_type, facts.last_status, facts.has_pending)


def all_runs(store: SQLiteStore, **query: Any) -> list[RunFacts]:
    page = store.list_runs(replace(RunQuery(limit=1000), **query))
    assert page.next_key is None
    return list(page.runs)


def newest_first(raw: Raw) -> list[str]:
    """Execution ids by newest row first, ties by id, straight from the table."""
    rows = raw.query(
        "SELECT execution_id, MAX(created_at) AS last_at FROM checkpoints"
        " GROUP BY execution_id ORDER BY last_at DESC, execution_id DESC"
    )
    return [r["execution_id"] for r in rows]


# --- list_runs ------------------------------------------------------------


def test_every_scenario_lists_in_its_state(store: SQLiteStore, seeded: Seeded) -> None:
    listed = {f.execution_id: state_of(f) for f in all_runs(store)}
    expected = {seeded.id(name): state for name, state in seeded.STATES.items()}
    assert listed == expected


def test_counts_per_state(store: SQLiteStore) -> None:
    page = store.list_runs(RunQuery())
    assert dict(page.counts) == {"completed": 3, "paused": 4, "failed": 1, "unfinished": 2}


@pytest.mark.parametrize("state", STATES)
def test_state_filter_returns_exactly_that_state(
    store: SQLiteStore, seeded: Seeded, state: str
) -> None:
    page = store.list_runs(RunQuery(state=state, limit=1000))
    assert {f.execution_id for f in page.runs} == seeded.ids(state)
    assert all(state_of(f) == state for f in page.runs)
    # The tabs' counts ignore the state filter itself.
    assert sum(page.counts.values()) == len(seeded.STATES)


def test_agent_filter(store: SQLiteStore, seeded: Seeded) -> None:
    assert len(all_runs(store, agent="refund-bot")) == len(seeded.STATES)
    page = store.list_runs(RunQuery(agent="no-such-bot"))
    assert page.runs == ()
    assert dict(page.counts) == {}


def test_text_finds_an_order_id_through_tool_args(
    store: SQLiteStore, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    target = seeded.id("paused-2")
    assert [f.execution_id for f in all_runs(store, text="A-1003")] == [target]
    # Nothing but node_input carries it: not the id, the agent or the pause reason.
    facts = store.get_run(target)
    assert facts is not None
    assert "A-1003" not in f"{facts.execution_id} {facts.agent} {facts.pending_reason}"
    tool_rows = raw(seeded.path).query(
        "SELECT node_id FROM checkpoints WHERE execution_id = ? AND node_input LIKE '%A-1003%'",
        (target,),
    )
    assert {r["node_id"] for r in tool_rows} == {"turn:0/tool:refund"}


def test_text_matches_case_insensitively(store: SQLiteStore, seeded: Seeded) -> None:
    assert [f.execution_id for f in all_runs(store, text="a-1003")] == [seeded.id("paused-2")]


@pytest.mark.parametrize("pattern", ["A_1003", "A%1003", "A-100_", "%A-1003"])
def test_text_treats_like_wildcards_literally(store: SQLiteStore, pattern: str) -> None:
    assert all_runs(store, text=pattern) == []


def test_text_finds_pause_reason_and_id_prefix(store: SQLiteStore, seeded: Seeded) -> None:
    assert {f.execution_id for f in all_runs(store, text="manager_approval")} == seeded.ids(
        "paused"
    )
    failed = seeded.id("failed")
    assert failed in {f.execution_id for f in all_runs(store, text=failed[:13])}


def test_text_filter_narrows_counts(store: SQLiteStore) -> None:
    page = store.list_runs(RunQuery(text="A-1007"))
    assert dict(page.counts) == {"unfinished": 1}


def test_outbox_filter_on_a_fresh_store(store: SQLiteStore, seeded: Seeded) -> None:
    # Nothing was ever connected to a plane: every row waits.
    assert len(all_runs(store, outbox="waiting")) == len(seeded.STATES)
    assert all_runs(store, outbox="quarantined") == []
    facts = store.get_run(seeded.id("completed"))
    assert facts is not None
    assert (facts.rows_waiting, facts.rows_quarantined) == (4, 0)


def test_outbox_filter_after_the_sdk_drained_and_quarantined(
    store_copy: Path, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    from fastaiagent.checkpointers import SQLiteCheckpointer

    failed, crashed = seeded.id("failed"), seeded.id("crashed-in-tool")
    others = [
        r["checkpoint_id"]
        for r in raw(store_copy).query(
            "SELECT checkpoint_id FROM checkpoints WHERE execution_id != ?", (failed,)
        )
    ]
    bad = raw(store_copy).rows(crashed)[-1]["checkpoint_id"]
    sdk = SQLiteCheckpointer(str(store_copy))
    try:
        sdk.mark_synced(others)
        sdk.mark_quarantined({bad: "payload too large for the plane"})
    finally:
        sdk.close()

    copy = SQLiteStore(store_copy)
    try:
        assert [f.execution_id for f in all_runs(copy, outbox="waiting")] == [failed]
        assert [f.execution_id for f in all_runs(copy, outbox="quarantined")] == [crashed]
        facts = copy.get_run(crashed)
        assert facts is not None
        assert (facts.rows_waiting, facts.rows_quarantined) == (0, 1)
        quarantined = [h for h in copy.list_rows(crashed) if h.sync_error]
        assert [(h.checkpoint_id, h.sync_error, h.synced) for h in quarantined] == [
            (bad, "payload too large for the plane", 1)
        ]
        totals = copy.totals()
        assert (totals.rows_waiting, totals.rows_quarantined) == (2, 1)
        page = copy.list_runs(RunQuery(outbox="quarantined"))
        assert dict(page.counts) == {"unfinished": 1}
    finally:
        copy.close()


def test_keyset_pages_of_three_walk_every_run_once(
    store: SQLiteStore, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    seen: list[str] = []
    sizes: list[int] = []
    after = None
    for _ in range(10):
        page = store.list_runs(RunQuery(limit=3, after=after))
        sizes.append(len(page.runs))
        seen.extend(f.execution_id for f in page.runs)
        if page.next_key is None:
            break
        last = page.runs[-1]
        assert page.next_key == (last.last_at, last.execution_id)
        after = page.next_key
    assert sizes == [3, 3, 3, 1]
    assert len(seen) == len(set(seen)) == len(seeded.STATES)
    assert seen == newest_first(raw(seeded.path))


def test_keyset_pages_within_a_state(store: SQLiteStore, seeded: Seeded) -> None:
    first = store.list_runs(RunQuery(state="paused", limit=3))
    assert len(first.runs) == 3 and first.next_key is not None
    second = store.list_runs(RunQuery(state="paused", limit=3, after=first.next_key))
    assert len(second.runs) == 1 and second.next_key is None
    ids = [f.execution_id for f in (*first.runs, *second.runs)]
    assert set(ids) == seeded.ids("paused") and len(ids) == 4


def test_runs_are_newest_activity_first(
    store: SQLiteStore, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    listed = all_runs(store)
    assert [f.execution_id for f in listed] == newest_first(raw(seeded.path))
    last_ats = [f.last_at for f in listed]
    assert last_ats == sorted(last_ats, reverse=True)


# --- one run ----------------------------------------------------------------


def test_get_run_facts_of_a_completed_run(
    store: SQLiteStore, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    history = raw(seeded.path).rows(seeded.id("completed"))
    facts = store.get_run(seeded.id("completed"))
    assert facts == RunFacts(
        execution_id=seeded.id("completed"),
        agent="refund-bot",
        row_count=4,
        first_at=history[0]["created_at"],
        last_at=history[-1]["created_at"],
        last_checkpoint_id=history[-1]["checkpoint_id"],
        last_node_id="run_end",
        last_step_type="run_end",
        last_status="completed",
        has_pending=False,
        pending_reason=None,
        fork_parent_checkpoint_id=None,
        rows_waiting=4,
        rows_quarantined=0,
    )


def test_get_run_of_a_pause_and_a_fork(store: SQLiteStore, seeded: Seeded) -> None:
    paused = store.get_run(seeded.id("paused-1"))
    assert paused is not None
    assert (paused.last_step_type, paused.last_status) == ("hitl_pause", "interrupted")
    assert (paused.has_pending, paused.pending_reason) == (True, "manager_approval")

    fork = store.get_run(seeded.id("fork-of-completed"))
    source_turn = [h for h in store.list_rows(seeded.id("completed")) if h.node_id == "turn:1"]
    assert fork is not None and len(source_turn) == 1
    assert fork.fork_parent_checkpoint_id == source_turn[0].checkpoint_id


def test_get_run_agrees_with_the_list(store: SQLiteStore) -> None:
    for facts in all_runs(store):
        assert store.get_run(facts.execution_id) == facts


def test_get_run_of_an_unknown_id(store: SQLiteStore) -> None:
    assert store.get_run("no-such-run") is None
    assert store.list_rows("no-such-run") == ()


def test_list_rows_in_written_order(
    store: SQLiteStore, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    for name in seeded.STATES:
        expected = [r["checkpoint_id"] for r in raw(seeded.path).rows(seeded.id(name))]
        assert [h.checkpoint_id for h in store.list_rows(seeded.id(name))] == expected, name


def test_list_rows_of_the_resumed_run(store: SQLiteStore, seeded: Seeded) -> None:
    rows = store.list_rows(seeded.id("idempotent-resumed"))
    assert [(h.node_id, h.step_type, h.status) for h in rows] == [
        ("turn:0", "llm_call", "completed"),
        ("turn:0/tool:refund", "tool_call", "completed"),
        ("turn:0/tool:refund", "hitl_pause", "interrupted"),
        ("turn:1", "llm_call", "completed"),
        ("run_end", "run_end", "completed"),
    ]
    assert [h.agent_path for h in rows[:3]] == [
        "agent:refund-bot",
        "agent:refund-bot/tool:refund",
        "agent:refund-bot/tool:refund",
    ]
    assert rows[2].interrupt_reason == "manager_approval"
    assert {(h.synced, h.sync_error, h.agent) for h in rows} == {(0, None, "refund-bot")}
    assert all(h.execution_id == seeded.id("idempotent-resumed") for h in rows)


def test_get_row_payloads_of_a_tool_row(
    store: SQLiteStore, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    last = store.list_rows(seeded.id("crashed-in-tool"))[-1]
    detail = store.get_row(last.checkpoint_id)
    assert detail is not None
    assert detail.header == last
    assert detail.node_input == {"order_id": "A-1006", "amount": 80.0}
    assert detail.unreadable == ()
    messages = detail.state_snapshot["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[1]["content"] == "Refund order A-1006 for 80.00"
    assert messages[2]["tool_calls"][0]["name"] == "refund"
    stored = raw(seeded.path).rows(seeded.id("crashed-in-tool"))[-1]
    assert detail.raw["node_input"] == stored["node_input"]
    assert detail.raw["state_snapshot"] == stored["state_snapshot"]


def test_get_row_payloads_of_a_pause(store: SQLiteStore, seeded: Seeded) -> None:
    pause = store.list_rows(seeded.id("paused-2"))[-1]
    detail = store.get_row(pause.checkpoint_id)
    assert detail is not None
    assert detail.header.interrupt_reason == "manager_approval"
    assert detail.interrupt_context["customer"] == "Alan Turing"
    assert detail.interrupt_context["amount"] == 900.0
    pending = store.get_pending(seeded.id("paused-2"))
    assert pending is not None and pending.context == detail.interrupt_context


def test_get_row_of_a_failed_run_end(store: SQLiteStore, seeded: Seeded) -> None:
    end = store.list_rows(seeded.id("failed"))[-1]
    detail = store.get_row(end.checkpoint_id)
    assert detail is not None
    assert (detail.header.step_type, detail.header.status) == ("run_end", "failed")
    assert detail.state_snapshot["run_error"] == "RuntimeError: model provider returned 503"


def test_get_row_of_an_unknown_id(store: SQLiteStore) -> None:
    assert store.get_row("no-such-checkpoint") is None


# --- pauses ---------------------------------------------------------------


def test_get_pending(store: SQLiteStore, seeded: Seeded) -> None:
    pending = store.get_pending(seeded.id("paused-3"))
    assert pending is not None
    assert (pending.execution_id, pending.agent, pending.node_id, pending.reason) == (
        seeded.id("paused-3"),
        "refund-bot",
        "turn:0/tool:refund",
        "manager_approval",
    )
    assert pending.agent_path == "agent:refund-bot/tool:refund"
    assert pending.context["order_id"] == "A-1004"
    assert pending.context["customer"] == "Katherine Johnson"
    assert pending.context["policy"]["requires"] == {"role": "manager", "approvals": 1}
    assert store.get_pending(seeded.id("completed")) is None
    assert store.get_pending(seeded.id("idempotent-resumed")) is None


def _pending_order(raw: Raw) -> list[str]:
    rows = raw.query(
        "SELECT execution_id FROM pending_interrupts ORDER BY created_at, execution_id"
    )
    return [r["execution_id"] for r in rows]


def test_list_pending_oldest_first(
    store: SQLiteStore, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    page = store.list_pending()
    order = [p.execution_id for p in page.items]
    assert order == _pending_order(raw(seeded.path))
    assert set(order) == seeded.ids("paused")
    assert (page.total, page.next_key) == (4, None)
    queued = [order.index(seeded.id(n)) for n in ("paused-1", "paused-2", "paused-3")]
    assert queued == sorted(queued)


@pytest.mark.parametrize("newest_first", [False, True])
def test_list_pending_pages_of_one(
    store: SQLiteStore, seeded: Seeded, raw: Callable[[Path], Raw], newest_first: bool
) -> None:
    walked: list[str] = []
    after = None
    for _ in range(10):
        page = store.list_pending(after=after, limit=1, newest_first=newest_first)
        assert page.total == 4
        walked.extend(p.execution_id for p in page.items)
        if page.next_key is None:
            break
        assert page.next_key == (page.items[-1].created_at, page.items[-1].execution_id)
        after = page.next_key
    expected = _pending_order(raw(seeded.path))
    assert walked == (expected[::-1] if newest_first else expected)


# --- idempotency cache ----------------------------------------------------


def test_list_cache_unwraps_the_envelope(
    store: SQLiteStore, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    (entry,) = store.list_cache(seeded.id("idempotent-resumed"))
    from conftest import sdk_version

    # The SDK wraps cached results since 1.92: older ones store them bare.
    assert (entry.value, entry.enveloped) == ("cb-A-1009-450.00", sdk_version() >= (1, 92))
    (stored,) = raw(seeded.path).query(
        "SELECT function_key, created_at FROM idempotency_cache WHERE execution_id = ?",
        (seeded.id("idempotent-resumed"),),
    )
    assert (entry.function_key, entry.created_at) == (stored["function_key"], stored["created_at"])
    assert [e.value for e in store.list_cache(seeded.id("completed"))] == ["cb-A-1001-40.00"]
    # Died before its charge; and a model that never asked for one.
    assert store.list_cache(seeded.id("crashed-in-tool")) == ()
    assert store.list_cache(seeded.id("failed")) == ()


def test_list_cache_reads_bare_values_of_old_sdks(
    store_copy: Path, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    failed = seeded.id("failed")
    for key, value, at in (
        ("k-bare-str", '"cb-bare"', "2024-01-01T00:00:01+00:00"),
        ("k-bare-dict", '{"refund": 1}', "2024-01-01T00:00:02+00:00"),
    ):
        raw(store_copy).execute(
            "INSERT INTO idempotency_cache (execution_id, function_key, result, created_at)"
            " VALUES (?, ?, ?, ?)",
            (failed, key, value, at),
        )
    copy = SQLiteStore(store_copy)
    try:
        entries = copy.list_cache(failed)
    finally:
        copy.close()
    assert [(e.function_key, e.value, e.enveloped) for e in entries] == [
        ("k-bare-str", "cb-bare", False),
        ("k-bare-dict", {"refund": 1}, False),
    ]


# --- lineage and totals ---------------------------------------------------


def test_fork_origin_and_forks(
    store: SQLiteStore, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    source, fork = seeded.id("completed"), seeded.id("fork-of-completed")
    origin_row = raw(seeded.path).rows(fork)[0]
    turn1 = [h for h in store.list_rows(source) if h.node_id == "turn:1"][0]
    link = store.get_fork_origin(fork)
    assert link is not None
    assert (link.execution_id, link.source_execution_id) == (fork, source)
    assert (link.source_checkpoint_id, link.source_node_id) == (turn1.checkpoint_id, "turn:1")
    assert link.created_at == origin_row["created_at"]
    assert store.list_forks(source) == (link,)
    assert store.get_fork_origin(source) is None
    assert store.list_forks(fork) == ()
    assert store.list_forks(seeded.id("failed")) == ()


def test_totals(store: SQLiteStore, seeded: Seeded, raw: Callable[[Path], Raw]) -> None:
    count = raw(seeded.path).query("SELECT COUNT(*) AS n FROM checkpoints")[0]["n"]
    assert count == 31
    totals = store.totals()
    assert (totals.rows, totals.rows_waiting, totals.rows_quarantined, totals.pending) == (
        31,
        31,
        0,
        4,
    )


# --- living with other processes -----------------------------------------


def test_reads_go_on_while_another_process_writes(store_copy: Path, tmp_path: Path) -> None:
    copy = SQLiteStore(store_copy)
    cwd = tmp_path / "worker-cwd"
    cwd.mkdir()
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"}
    command = [sys.executable, "-m", "localui.demo.worker", "--store", str(store_copy)]
    child = subprocess.Popen(
        [*command, "--scenario", "completed"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reads_during = 0
    seen_counts: set[int] = set()
    try:
        while child.poll() is None:
            page = copy.list_runs(RunQuery(limit=1000))
            seen_counts.add(len(page.runs))
            copy.totals()
            reads_during += 1
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    try:
        assert child.returncode == 0, err
        assert reads_during > 0
        new_id = out.strip().splitlines()[-1]
        facts = copy.get_run(new_id)
        assert facts is not None and state_of(facts) == "completed"
        assert facts.row_count == 4
        assert len(copy.list_runs(RunQuery(limit=1000)).runs) == 11
        assert seen_counts <= {10, 11}
    finally:
        copy.close()


def test_the_store_is_opened_read_only(store_copy: Path, raw: Callable[[Path], Raw]) -> None:
    before = raw(store_copy).query("SELECT COUNT(*) AS n FROM checkpoints")[0]["n"]
    copy = SQLiteStore(store_copy)
    try:
        with copy._read() as conn:
            assert conn.execute("PRAGMA query_only").fetchone()[0] == 1
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                conn.execute("DELETE FROM checkpoints")
            # Even with query_only lifted, the connection was opened mode=ro.
            conn.execute("PRAGMA query_only = 0")
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                conn.execute("DELETE FROM checkpoints")
    finally:
        copy.close()
    assert raw(store_copy).query("SELECT COUNT(*) AS n FROM checkpoints")[0]["n"] == before


# --- old, damaged and missing stores -------------------------------------


def test_a_first_schema_store_lists_and_reads(v1_store: Path) -> None:
    old = SQLiteStore(v1_store)
    try:
        listed = {f.execution_id: f for f in all_runs(old)}
        assert {k: state_of(f) for k, f in listed.items()} == {
            "old-at-tool": "unfinished",
            "old-at-turn": "unfinished",
            "old-interrupted": "orphaned",
        }
        assert listed["old-at-tool"].last_step_type is None
        assert listed["old-at-tool"].last_checkpoint_id == "v1-b"
        assert (listed["old-at-tool"].rows_waiting, listed["old-at-tool"].rows_quarantined) == (
            0,
            0,
        )
        rows = old.list_rows("old-at-tool")
        assert [(h.checkpoint_id, h.node_id) for h in rows] == [
            ("v1-a", "turn:0"),
            ("v1-b", "turn:0/tool:lookup"),
        ]
        assert {(h.step_type, h.agent_path, h.synced, h.sync_error) for h in rows} == {
            (None, None, None, None)
        }
        detail = old.get_row("v1-b")
        assert detail is not None
        assert detail.node_input == {"sku": "Z-42"}
        assert detail.interrupt_context == {}
        assert [f.execution_id for f in all_runs(old, text="Z-42")] == ["old-at-tool"]
        assert old.get_pending("old-interrupted") is None
        assert old.list_pending().items == ()
        assert old.list_cache("old-at-tool") == ()
        assert old.get_fork_origin("old-at-tool") is None
        assert old.list_forks("old-at-tool") == ()
        totals = old.totals()
        assert (totals.rows, totals.rows_waiting, totals.pending) == (5, 0, 0)
        assert all_runs(old, outbox="waiting") == []
    finally:
        old.close()


def test_a_pre_step_type_store_lists_and_reads(v2_store: Path) -> None:
    old = SQLiteStore(v2_store)
    try:
        states = {f.execution_id: state_of(f) for f in all_runs(old)}
        assert states == {
            "old-paused": "paused",
            "old-done": "unfinished",
            "old-fork": "unfinished",
        }
        # A row from before the checkpoint_id backfill is found by its legacy id.
        assert [h.checkpoint_id for h in old.list_rows("old-paused")] == ["v2-a", "v2-b"]
        detail = old.get_row("v2-a")
        assert detail is not None and detail.header.execution_id == "old-paused"
        pending = old.get_pending("old-paused")
        assert pending is not None and pending.context == {"order_id": "B-7"}
        (cached,) = old.list_cache("old-paused")
        assert (cached.value, cached.enveloped) == ("bare-old-value", False)
        link = old.get_fork_origin("old-fork")
        assert link is not None
        assert (link.source_execution_id, link.source_checkpoint_id) == ("old-done", "v2-c")
        assert [f.execution_id for f in old.list_forks("old-done")] == ["old-fork"]
    finally:
        old.close()


def test_corrupt_json_reads_as_unreadable(
    store_copy: Path, seeded: Seeded, raw: Callable[[Path], Raw]
) -> None:
    run = seeded.id("crashed-in-tool")
    target = raw(store_copy).rows(run)[-1]["checkpoint_id"]
    changed = raw(store_copy).execute(
        "UPDATE checkpoints SET state_snapshot = '{broken' WHERE checkpoint_id = ?", (target,)
    )
    assert changed == 1
    copy = SQLiteStore(store_copy)
    try:
        detail = copy.get_row(target)
        assert detail is not None
        assert isinstance(detail.state_snapshot, Unreadable)
        assert detail.state_snapshot.raw == "{broken"
        assert detail.unreadable == ("state_snapshot",)
        assert detail.node_input == {"order_id": "A-1006", "amount": 80.0}
        facts = copy.get_run(run)
        assert facts is not None and state_of(facts) == "unfinished"
        assert run in {f.execution_id for f in all_runs(copy)}
        assert len(copy.list_rows(run)) == 2
    finally:
        copy.close()


def test_a_missing_file_is_store_missing(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    with pytest.raises(StoreMissing, match="nope.db"):
        SQLiteStore(missing)
    assert not missing.exists()
    with pytest.raises(StoreMissing):
        SQLiteStore(tmp_path)  # a directory is not a store either


def test_a_file_that_is_not_sqlite_is_store_missing(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_text(json.dumps({"not": "a database"}) * 50)
    with pytest.raises(StoreMissing, match="not a SQLite store"):
        SQLiteStore(notes)
