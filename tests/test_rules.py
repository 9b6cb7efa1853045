"""``localui.runs`` held to the SDK's own answers on runs the SDK really wrote."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fastaiagent._internal.errors import ChainCheckpointError
from fastaiagent.chain.checkpoint import is_run_end as sdk_is_run_end
from fastaiagent.chain.checkpoint import latest_forkable, latest_resumable
from fastaiagent.chain.interrupt import AlreadyResumed
from fastaiagent.checkpointers import SQLiteCheckpointer

from localui import runs
from localui.backends.base import Store
from localui.backends.sqlite.store import SQLiteStore
from localui.demo.scenarios import SCENARIO_NAMES
from localui.records import ALREADY_RESUMED, APPROVAL, Decision, RowHeader, RunQuery
from localui.words import Verdict, age_words, decision_line, short_json, verdict

if TYPE_CHECKING:
    from conftest import Raw, Seeded

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="session")
def sdk(session_copy: Path) -> Iterator[SQLiteCheckpointer]:
    """The SDK's own checkpointer, on a copy: its setup may take the write lock."""
    checkpointer = SQLiteCheckpointer(str(session_copy))
    yield checkpointer
    checkpointer.close()


def plan_for(store: SQLiteStore, execution_id: str) -> tuple[str, runs.ResumePlan | runs.Refusal]:
    facts = store.get_run(execution_id)
    assert facts is not None
    state = runs.run_state(facts.last_step_type, facts.last_status, facts.has_pending)
    # The session's store is a SQLite file: the SDK lists its rows in SQLite's order.
    return state, runs.resume_plan(state, store.list_rows(execution_id), backend=runs.SQLITE)


# --- agreement with the SDK, scenario by scenario ---------------------------


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_resume_agrees_with_latest_resumable(
    store: SQLiteStore, seeded: Seeded, sdk: SQLiteCheckpointer, scenario: str
) -> None:
    execution_id = seeded.id(scenario)
    state, plan = plan_for(store, execution_id)
    assert state == seeded.STATES[scenario]
    if state == runs.COMPLETED:
        with pytest.raises(AlreadyResumed):
            latest_resumable(sdk, execution_id)
        assert isinstance(plan, runs.Refusal) and plan.action == "resume"
        assert "AlreadyResumed" in plan.reason
    else:
        picked = latest_resumable(sdk, execution_id)
        assert picked is not None
        assert isinstance(plan, runs.ResumePlan)
        assert plan.checkpoint_id == picked.checkpoint_id
        assert plan.node_id == picked.node_id


EXPECTED_PLANS = {
    "crashed-in-tool": ("tool", "turn:0/tool:refund", "refund", 0, None),
    "crashed-waiting-on-model": ("turn", "turn:1", None, 1, None),
    "failed": ("turn", "turn:0", None, 0, None),
    "paused-1": ("approval", "turn:0/tool:refund", "refund", 0, "manager_approval"),
    "two-tools-first-pauses": ("approval", "turn:0/tool:refund", "refund", 0, "manager_approval"),
}


@pytest.mark.parametrize("scenario", sorted(EXPECTED_PLANS))
def test_resume_shape(store: SQLiteStore, seeded: Seeded, scenario: str) -> None:
    _, plan = plan_for(store, seeded.id(scenario))
    assert isinstance(plan, runs.ResumePlan)
    assert (plan.shape, plan.node_id, plan.tool, plan.turn, plan.reason) == EXPECTED_PLANS[scenario]


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_fork_pick_agrees_with_latest_forkable(
    store: SQLiteStore, seeded: Seeded, sdk: SQLiteCheckpointer, scenario: str
) -> None:
    execution_id = seeded.id(scenario)
    ours = runs.reentry_row(store.list_rows(execution_id))
    theirs = latest_forkable(sdk, execution_id)
    assert ours is not None and theirs is not None
    assert ours.checkpoint_id == theirs.checkpoint_id
    assert not runs.is_run_end(ours.step_type)


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_row_by_row_run_end_and_fork_refusal_agree(
    store: SQLiteStore, seeded: Seeded, sdk: SQLiteCheckpointer, scenario: str
) -> None:
    execution_id = seeded.id(scenario)
    for row in store.list_rows(execution_id):
        checkpoint = sdk.get_by_id(execution_id, row.checkpoint_id)
        assert checkpoint is not None
        assert runs.is_run_end(row.step_type) is sdk_is_run_end(checkpoint)
        try:
            latest_forkable(sdk, execution_id, checkpoint_id=row.checkpoint_id)
            sdk_refuses = False
        except ChainCheckpointError:
            sdk_refuses = True
        refusal = runs.fork_refusal(row)
        if runs.is_fork_origin(row):
            # Stricter than the SDK on purpose: the marker row is not a step.
            assert not sdk_refuses and refusal is not None
        else:
            assert (refusal is not None) is sdk_refuses, row.node_id


def test_fork_refusal_words() -> None:
    end = header("e", "c1", "run_end", step_type="run_end")
    origin = header("e", "c2", "__fork_origin__", step_type="fork_origin")
    step = header("e", "c3", "turn:0/tool:refund", step_type="tool_call")
    end_refusal, origin_refusal = runs.fork_refusal(end), runs.fork_refusal(origin)
    assert end_refusal is not None and origin_refusal is not None
    assert end_refusal.action == origin_refusal.action == "fork"
    assert "run-end marker" in end_refusal.reason
    assert "fork marker" in origin_refusal.reason
    assert runs.fork_refusal(step) is None
    # An old store has no step_type: the node id alone marks a fork origin.
    assert runs.fork_refusal(header("e", "c4", "__fork_origin__")) is not None


# --- the SQL state and the Python state are one rule -----------------------

STEP_TYPES = ("run_end", "llm_call", "tool_call", "hitl_pause", "fork_origin", None)
STATUSES = ("completed", "failed", "interrupted", None)


def _combinations() -> Iterator[tuple[str, str, str, str, int, str | None, str | None, str]]:
    """``(run, checkpoint id, node id, created_at, node_index, step_type, status, pending?)``
    rows of every (newest step_type, status, pending) combination; the last field is
    ``"p"`` on a run's newest row when that run has a pending interrupt."""
    for n, (step, status, pending) in enumerate(
        itertools.product(STEP_TYPES, STATUSES, (True, False))
    ):
        run = f"run-{step}-{status}-{'p' if pending else 'np'}"
        first_at = f"2025-01-01T00:00:{n:02d}.000000+00:00"
        last_at = first_at if n % 2 else f"2025-01-01T00:01:{n:02d}.000000+00:00"
        for i, (node, st, stat, at) in enumerate(
            [("turn:0", "llm_call", "completed", first_at), ("last", step, status, last_at)]
        ):
            yield run, f"{run}-{i}", node, at, i, st, stat, "p" if pending and i else ""


def _sqlite_combinations(path: Path) -> Store:
    SQLiteCheckpointer(str(path)).setup()
    conn = sqlite3.connect(path)
    try:
        with conn:
            for run, cid, node, at, i, step, status, pending in _combinations():
                conn.execute(
                    "INSERT INTO checkpoints (id, checkpoint_id, chain_name, execution_id,"
                    " node_id, node_index, step_type, status, created_at)"
                    " VALUES (?, ?, 'combo-bot', ?, ?, ?, ?, ?, ?)",
                    (cid, cid, run, node, i, step, status, at),
                )
                if pending:
                    conn.execute(
                        "INSERT INTO pending_interrupts (execution_id, chain_name, node_id,"
                        " reason, context, created_at) VALUES (?, 'combo-bot', 'last', 'why',"
                        " '{}', ?)",
                        (run, at),
                    )
    finally:
        conn.close()
    return SQLiteStore(path)


def _postgres_combinations(dsn: str, schema: str) -> Store:
    import psycopg
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    from localui.backends.postgres.store import PostgresStore

    checkpointer = PostgresCheckpointer(dsn, schema=schema, max_pool_size=1)
    try:
        checkpointer.setup()
    finally:
        checkpointer.close()
    with psycopg.connect(dsn) as conn:
        for run, cid, node, at, i, step, status, pending in _combinations():
            # The SDK writes ``status`` NOT NULL; its default is what a NULL reads as.
            conn.execute(
                f"INSERT INTO {schema}.checkpoints (checkpoint_id, chain_name, execution_id,"
                " node_id, node_index, step_type, status, state_snapshot, created_at)"
                " VALUES (%s, 'combo-bot', %s, %s, %s, %s, COALESCE(%s, 'completed'), '{}', %s)",
                (cid, run, node, i, step, status, at),
            )
            if pending:
                conn.execute(
                    f"INSERT INTO {schema}.pending_interrupts (execution_id, chain_name, node_id,"
                    " reason, context, created_at) VALUES (%s, 'combo-bot', 'last', 'why',"
                    " '{}', %s)",
                    (run, at),
                )
    return PostgresStore(dsn, schema=schema)


@pytest.fixture(params=["sqlite", "postgres"])
def combinations_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every (newest step_type, status, pending) in one store, on the SDK's schema, on
    each backend: on PostgreSQL the state filter and counts are SQL (``STATE_SQL``), on
    SQLite the runs index stores what ``run_state`` said.

    Most combinations no run writes (a failed pause, an interrupted run end), so
    the rows go in by hand; the schema is the one the SDK creates. Each run has
    an older first row, and half of them tie on ``created_at`` so insertion
    order must break it, as in the SDK's ``get_last``.
    """
    if request.param == "sqlite":
        store = _sqlite_combinations(tmp_path / "local.db")
        yield store
        store.close()
        return
    from conftest import PgRaw, pg_name

    dsn: str = request.getfixturevalue("pg_dsn")
    schema = pg_name("fastaiagent_combos")
    try:
        store = _postgres_combinations(dsn, schema)
        try:
            yield store
        finally:
            store.close()
    finally:
        PgRaw(dsn, schema).drop()


def test_state_sql_agrees_with_run_state_on_every_combination(combinations_store: Store) -> None:
    combos = combinations_store
    page = combos.list_runs(RunQuery(limit=1000))
    assert len(page.runs) == len(STEP_TYPES) * len(STATUSES) * 2
    python_states: dict[str, str] = {}
    for facts in page.runs:
        step, status, pending = facts.execution_id.split("-", 1)[1].rsplit("-", 2)
        assert facts.last_checkpoint_id == f"{facts.execution_id}-1"
        assert facts.last_step_type == (None if step == "None" else step)
        assert facts.has_pending is (pending == "p")
        state = runs.run_state(facts.last_step_type, facts.last_status, facts.has_pending)
        assert state == runs.run_state(
            None if step == "None" else step,
            "completed" if status == "None" else status,
            pending == "p",
        )
        python_states[facts.execution_id] = state
    # The state filter and the counts: SQL's CASE on PostgreSQL, the index on SQLite.
    for state in {*python_states.values(), runs.ORPHANED}:
        filtered = combos.list_runs(RunQuery(state=state, limit=1000))
        expected = {k for k, v in python_states.items() if v == state}
        assert {f.execution_id for f in filtered.runs} == expected, state
        assert page.counts.get(state, 0) == len(expected), state
    assert set(python_states.values()) == {
        "completed",
        "failed",
        "paused",
        "orphaned",
        "unfinished",
    }


# --- an orphaned pause --------------------------------------------------------


@pytest.mark.parametrize("claim", ["sdk", "sql"])
def test_a_claimed_pause_that_never_went_on_is_orphaned(
    store_copy: Path, seeded: Seeded, raw: Callable[[Path], Raw], claim: str
) -> None:
    run = seeded.id("paused-1")
    # What Agent.aresume does first: claim (delete) the pending row. Then nothing.
    if claim == "sdk":
        claimer = SQLiteCheckpointer(str(store_copy))
        try:
            claimed = claimer.delete_pending_interrupt_atomic(run)
        finally:
            claimer.close()
        assert claimed is not None and claimed.reason == "manager_approval"
    else:
        deleted = raw(store_copy).execute(
            "DELETE FROM pending_interrupts WHERE execution_id = ?", (run,)
        )
        assert deleted == 1
    assert (
        raw(store_copy).query("SELECT * FROM pending_interrupts WHERE execution_id = ?", (run,))
        == []
    )

    copy = SQLiteStore(store_copy)
    try:
        state, plan = plan_for(copy, run)
        assert state == runs.ORPHANED
        assert isinstance(plan, runs.Refusal) and plan.action == "resume"
        assert "claimed" in plan.reason
        orphaned = copy.list_runs(RunQuery(state="orphaned"))
        assert [f.execution_id for f in orphaned.runs] == [run]
        assert (orphaned.counts["orphaned"], orphaned.counts["paused"]) == (1, 3)
        last = copy.list_rows(run)[-1]
        words = verdict(state, plan, last=last, now=NOW)
        assert words.headline.startswith("Orphaned pause at `turn:0/tool:refund`")
        assert words.resume == plan.reason
    finally:
        copy.close()


# --- timeline, node ids, verdicts -------------------------------------------


def header(
    execution_id: str, checkpoint_id: str, node_id: str, *, step_type: str | None = None
) -> RowHeader:
    """A row header for the pure rules; the rules read no other field."""
    return RowHeader(
        checkpoint_id=checkpoint_id,
        execution_id=execution_id,
        parent_checkpoint_id=None,
        agent="a",
        node_id=node_id,
        node_index=0,
        step_type=step_type,
        status="completed",
        interrupt_reason=None,
        agent_path=None,
        created_at="2025-01-01T00:00:00+00:00",
        synced=None,
        sync_error=None,
    )


def shape(groups: tuple[runs.TurnGroup, ...]) -> list[tuple[str, str, list[str]]]:
    return [(g.key, g.title, [r.step_type or r.node_id for r in g.rows]) for g in groups]


def test_group_timeline_of_a_resumed_run(store: SQLiteStore, seeded: Seeded) -> None:
    groups = runs.group_timeline(store.list_rows(seeded.id("idempotent-resumed")))
    assert shape(groups) == [
        ("turn:0", "Turn 0", ["llm_call", "tool_call", "hitl_pause"]),
        ("turn:1", "Turn 1", ["llm_call"]),
        ("end", "Run end", ["run_end"]),
    ]


def test_group_timeline_of_a_fork(store: SQLiteStore, seeded: Seeded) -> None:
    groups = runs.group_timeline(store.list_rows(seeded.id("fork-of-completed")))
    assert shape(groups) == [
        ("fork", "Fork origin", ["fork_origin"]),
        ("turn:1", "Turn 1", ["llm_call"]),
        ("end", "Run end", ["run_end"]),
    ]


def test_group_timeline_of_chain_nodes() -> None:
    rows = [
        header("c", str(i), node)
        for i, node in enumerate(["fetch", "fetch", "transform", "fetch", "turn:2"])
    ]
    groups = runs.group_timeline(rows)
    assert [(g.key, g.title, len(g.rows)) for g in groups] == [
        ("node:fetch", "fetch", 2),
        ("node:transform", "transform", 1),
        ("node:fetch", "fetch", 1),
        ("turn:2", "Turn 2", 1),
    ]
    assert runs.group_timeline([]) == ()


@pytest.mark.parametrize(
    ("node_id", "turn", "tool"),
    [
        ("turn:0", 0, None),
        ("turn:12", 12, None),
        ("turn:3/tool:refund", 3, "refund"),
        ("turn:1/tool:ns/tool", 1, "ns/tool"),
        ("supervisor:s/worker:w/tool:search", None, "search"),
        ("fetch", None, None),
        ("turn:x", None, None),
        ("run_end", None, None),
        ("__fork_origin__", None, None),
    ],
)
def test_parse_node(node_id: str, turn: int | None, tool: str | None) -> None:
    assert runs.parse_node(node_id) == runs.NodeRef(turn=turn, tool=tool)


def verdict_for(store: SQLiteStore, execution_id: str) -> Verdict:
    """The banner built as the run page builds it, from the store's records."""
    state, plan = plan_for(store, execution_id)
    rows = store.list_rows(execution_id)
    saved: Any = None
    if isinstance(plan, runs.ResumePlan):
        detail = store.get_row(plan.checkpoint_id)
        assert detail is not None
        saved = detail.node_input
    error = None
    if state == runs.FAILED:
        end = store.get_row(rows[-1].checkpoint_id)
        assert end is not None
        error = end.state_snapshot["run_error"]
    return verdict(
        state,
        plan,
        last=rows[-1],
        now=NOW,
        saved_args=saved,
        run_error=error,
        cached_calls=len(store.list_cache(execution_id)),
    )


def test_verdict_for_a_crash_inside_a_tool(store: SQLiteStore, seeded: Seeded) -> None:
    words = verdict_for(store, seeded.id("crashed-in-tool"))
    assert words.tone == "warn"
    assert words.headline.startswith("No end marker: still running, or its process died")
    assert "inside tool `refund`" in words.headline
    assert words.resume == (
        'Resume re-invokes `refund` with the saved arguments {"amount": 80.0, "order_id": '
        '"A-1006"}; the model is not called again.'
    )


def test_verdict_for_a_crash_waiting_on_the_model(store: SQLiteStore, seeded: Seeded) -> None:
    words = verdict_for(store, seeded.id("crashed-waiting-on-model"))
    assert "waiting on the model at `turn:1`" in words.headline
    assert words.resume == (
        "Resume re-issues the model call of turn 1 (`turn:1`). 1 @idempotent result will be "
        "answered from the cache instead of running again."
    )


def test_verdict_for_the_other_states(store: SQLiteStore, seeded: Seeded) -> None:
    done = verdict_for(store, seeded.id("completed"))
    assert (done.tone, done.headline.split(" ")[0]) == ("ok", "Completed")
    assert "AlreadyResumed" in done.resume
    failed = verdict_for(store, seeded.id("failed"))
    assert failed.tone == "bad"
    assert failed.headline.endswith(": RuntimeError: model provider returned 503.")
    assert failed.resume == "Resume re-issues the model call of turn 0 (`turn:0`)."
    paused = verdict_for(store, seeded.id("paused-3"))
    assert paused.tone == "wait"
    assert paused.headline.startswith("Paused for `manager_approval` at `turn:0/tool:refund`")
    assert paused.resume.startswith("Approve or reject to resume: the paused tool `refund`")
    assert "1 @idempotent result will be answered from the cache" in paused.resume
    for words in (done, failed, paused):
        assert words.fork.startswith("Fork branches a new run")


@pytest.mark.parametrize(
    ("delta", "words"),
    [
        (timedelta(seconds=-5), "just now"),
        (timedelta(seconds=59), "59 s ago"),
        (timedelta(minutes=3, seconds=5), "3 min ago"),
        (timedelta(hours=5), "5 h ago"),
        (timedelta(days=2, hours=1), "2 d ago"),
    ],
)
def test_age_words(delta: timedelta, words: str) -> None:
    assert age_words((NOW - delta).isoformat(), NOW) == words


def test_age_words_of_a_naive_and_a_broken_time() -> None:
    assert age_words("2029-12-31T23:59:00", NOW) == "1 min ago"
    assert age_words("yesterday", NOW) == "at an unknown time"


def test_short_json_cuts_long_values() -> None:
    text = short_json({"k": "x" * 500}, limit=40)
    assert len(text) == 40 and text.endswith("…")
    assert short_json({"b": 1, "a": 2}) == '{"a": 2, "b": 1}'


def _decision(approved: bool, reason: str, outcome: str | None) -> Decision:
    return Decision(
        id=1,
        kind=APPROVAL,
        execution_id="run-1",
        checkpoint_id="ck-1",
        approved=approved,
        actor="Ada",
        reason=reason,
        decided_at=NOW.isoformat(),
        outcome=outcome,
        detail=None,
        finished_at=None,
    )


@pytest.mark.parametrize(
    ("state", "decision", "line"),
    [
        (
            runs.COMPLETED,
            _decision(False, "over budget", "completed"),
            "rejected by Ada: over budget",
        ),
        (runs.COMPLETED, _decision(True, "", "completed"), "approved by Ada"),
        (runs.FAILED, _decision(True, "ok", "failed"), "approved by Ada: ok"),
        # Paused again: the run waits on a new question, the old answer is not its state.
        (runs.PAUSED, _decision(True, "ok", "paused"), None),
        # Still being carried out, or resumed elsewhere first: nothing decided it yet.
        (runs.UNFINISHED, _decision(True, "ok", None), None),
        (runs.COMPLETED, _decision(True, "ok", ALREADY_RESUMED), None),
        (runs.COMPLETED, None, None),
    ],
)
def test_the_state_line_names_the_decision_that_moved_the_run(
    state: str, decision: Decision | None, line: str | None
) -> None:
    assert decision_line(state, decision) == line


def test_a_pause_under_an_agent_is_owned_as_the_runs_index_says() -> None:
    """``agent:front-desk/agent:refund-bot`` is front-desk's pause inside its own run, and
    refund-bot's in refund-bot's own execution: the row alone cannot tell, the index can."""
    path, node = "agent:front-desk/agent:refund-bot", "turn:0/tool:refund"
    assert runs.pause_owner_needs_run(path)
    assert runs.pause_owner(path, "refund-bot", node, "front-desk") == runs.Owner(
        runs.AGENT, "front-desk"
    )
    assert runs.pause_owner(path, "refund-bot", node, "refund-bot") == runs.Owner(
        runs.AGENT, "refund-bot"
    )
    team = "swarm:refund-swarm/agent:refunder"
    assert not runs.pause_owner_needs_run(team)
    assert runs.pause_owner(team, "refunder", node) == runs.Owner(runs.SWARM, "refund-swarm")
    assert runs.execution_owner("agent:a/agent:b/swarm:s/agent:c") == runs.Owner(runs.SWARM, "s")
    assert runs.owner_path(["agent:a/agent:b", None, "agent:a", "agent:a/agent:c"]) == "agent:a"
