"""The read model, the pages and the actions, each test run on SQLite and on PostgreSQL.

The ``backend`` fixture hands a test the same demo scenarios, written by the real
SDK into either store, behind one small interface: the read model over the
session's seeded runs, plain SQL on them as ground truth, an app serving them,
and an acting app (the refund-bot registered) over a fresh copy. So one test body
checks both stores; each parameter only asks for its own fixtures, and a missing
PostgreSQL fails (``pg_dsn``), never skips.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import pytest
from helpers import all_at_once, card, decide

from localui import runs
from localui.backends.base import STATES, Store
from localui.backends.sqlite.store import SQLiteStore
from localui.demo.scenarios import SCENARIO_NAMES
from localui.records import RunFacts, RunQuery

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import Ledger, PgRaw, PgSeeded, Raw, Seeded
    from starlette.testclient import TestClient

    from localui.backends.postgres.store import PostgresStore

JSON = {"Accept": "application/json"}
COUNTS = {"completed": 3, "paused": 4, "failed": 1, "unfinished": 2}
RUN_KEYS = {"execution_id", "state", "agent", "resume", "rows", "idempotency", "fork_of"}
RUN_KEYS |= {"forks", "decisions"}
LIST_RUN_KEYS = {"execution_id", "state", "agent", "rows", "first_at", "last_at", "pending_reason"}
#: What ``datetime.now(timezone.utc).isoformat()`` writes into the SQLite store.
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00$")
ROW_KEYS = ("checkpoint_id", "node_id", "step_type", "status", "created_at", "agent_path")


# --- one interface over both stores -------------------------------------------------


class SeededIds(Protocol):
    """``conftest.Seeded`` and ``conftest.PgSeeded``: which run each scenario wrote."""

    def id(self, scenario: str) -> str: ...

    def ids(self, state: str) -> set[str]: ...


class Truth(Protocol):
    """Plain SQL on one store: what the tests compare the app's answers against."""

    def rows(self, execution_id: str) -> list[dict[str, Any]]:
        """A run's rows in the order the SDK wrote them."""
        ...

    def newest_first(self) -> list[str]:
        """Execution ids by newest row, ties by id, descending."""
        ...

    def pending_order(self) -> list[str]:
        """``pending_interrupts`` oldest first, ties by id."""
        ...

    def decisions(self, execution_id: str) -> list[dict[str, Any]]:
        """The app's decision rows of a run; empty when the app made no table yet."""
        ...

    def fingerprint(self) -> tuple[Any, ...]:
        """Every row id and status, every pause and the cache size: to see that nothing changed."""
        ...


class SqliteTruth:
    def __init__(self, raw: Raw) -> None:
        self.raw = raw

    def rows(self, execution_id: str) -> list[dict[str, Any]]:
        return [dict(zip(r.keys(), r, strict=True)) for r in self.raw.rows(execution_id)]

    def newest_first(self) -> list[str]:
        return [
            r["execution_id"]
            for r in self.raw.query(
                "SELECT execution_id, MAX(created_at) AS last_at FROM checkpoints"
                " GROUP BY execution_id ORDER BY last_at DESC, execution_id DESC"
            )
        ]

    def pending_order(self) -> list[str]:
        return [
            r["execution_id"]
            for r in self.raw.query(
                "SELECT execution_id FROM pending_interrupts ORDER BY created_at, execution_id"
            )
        ]

    def decisions(self, execution_id: str) -> list[dict[str, Any]]:
        if not self.raw.query("SELECT 1 FROM sqlite_master WHERE name = 'localui_decisions'"):
            return []
        rows = self.raw.query(
            "SELECT * FROM localui_decisions WHERE execution_id = ? ORDER BY id", (execution_id,)
        )
        return [dict(zip(r.keys(), r, strict=True)) for r in rows]

    def fingerprint(self) -> tuple[Any, ...]:
        return (
            [tuple(r) for r in self.raw.query("SELECT id, status FROM checkpoints ORDER BY id")],
            sorted(self.pending_order()),
            self.raw.query("SELECT COUNT(*) AS n FROM idempotency_cache")[0]["n"],
        )


class PgTruth:
    def __init__(self, raw: PgRaw, app: PgRaw | None = None) -> None:
        self.raw, self.app = raw, app

    def rows(self, execution_id: str) -> list[dict[str, Any]]:
        return self.raw.rows(execution_id)

    def newest_first(self) -> list[str]:
        return [
            r["execution_id"]
            for r in self.raw.query(
                "SELECT execution_id FROM {s}.checkpoints GROUP BY execution_id"
                ' ORDER BY MAX(created_at) DESC, execution_id COLLATE "C" DESC'
            )
        ]

    def pending_order(self) -> list[str]:
        return [
            r["execution_id"]
            for r in self.raw.query(
                "SELECT execution_id FROM {s}.pending_interrupts"
                ' ORDER BY created_at, execution_id COLLATE "C"'
            )
        ]

    def decisions(self, execution_id: str) -> list[dict[str, Any]]:
        if self.app is None:
            return []
        [found] = self.app.query("SELECT to_regclass('{s}.localui_decisions') IS NOT NULL AS t")
        if not found["t"]:
            return []
        return self.app.query(
            "SELECT * FROM {s}.localui_decisions WHERE execution_id = %s ORDER BY id",
            (execution_id,),
        )

    def fingerprint(self) -> tuple[Any, ...]:
        return (
            [
                (r["checkpoint_id"], r["status"])
                for r in self.raw.query(
                    "SELECT checkpoint_id, status FROM {s}.checkpoints ORDER BY checkpoint_id"
                )
            ],
            sorted(self.pending_order()),
            self.raw.query("SELECT COUNT(*) AS n FROM {s}.idempotency_cache")[0]["n"],
        )


@dataclass(frozen=True)
class Acting:
    """An app with the refund-bot registered, over a fresh copy of the seeded runs."""

    client: TestClient
    truth: Truth


@dataclass(frozen=True)
class Backend:
    """One store's seeded runs, behind the interface every test here uses."""

    seeded: SeededIds
    #: The read model over the session's seeded runs: shared, never written to.
    store: Store
    #: Plain SQL on the session's seeded runs.
    truth: Truth
    #: ``client()``: the app (no agent registered) over the seeded runs.
    client: Callable[[], TestClient]
    #: ``acting(ledger=None, **settings)``: a fresh copy and an app acting on it.
    acting: Callable[..., Acting]


@pytest.fixture(scope="session")
def pg_seeded_store(pg_seeded: PgSeeded) -> Iterator[PostgresStore]:
    """The read model over the session's seeded PostgreSQL runs; never written to."""
    from localui.backends.postgres.store import PostgresStore

    opened = PostgresStore(pg_seeded.dsn, schema=pg_seeded.schema)
    yield opened
    opened.close()


@pytest.fixture
def _pg_schemas_to_drop() -> Iterator[list[PgRaw]]:
    """Schemas a test made, dropped after its apps closed (``backend`` asks for this
    before ``make_pg_client``, so it is torn down after the clients are)."""
    made: list[PgRaw] = []
    yield made
    for raw in made:
        raw.drop()


def _sqlite_backend(request: pytest.FixtureRequest) -> Backend:
    from conftest import Raw

    seeded: Seeded = request.getfixturevalue("seeded")
    app_store: Path = request.getfixturevalue("app_store")
    make_client = request.getfixturevalue("make_client")
    copy_store = request.getfixturevalue("copy_store")
    make_acting_client = request.getfixturevalue("make_acting_client")

    def acting(ledger: Ledger | None = None, **settings: Any) -> Acting:
        path = copy_store()
        return Acting(make_acting_client(path, ledger, **settings), SqliteTruth(Raw(path)))

    return Backend(
        seeded=seeded,
        store=request.getfixturevalue("store"),
        truth=SqliteTruth(Raw(seeded.path)),
        client=lambda: make_client(app_store),
        acting=acting,
    )


def _postgres_backend(request: pytest.FixtureRequest) -> Backend:
    from conftest import PgRaw, PgStore, copy_pg_store, pg_name

    seeded: PgSeeded = request.getfixturevalue("pg_seeded")
    store: PostgresStore = request.getfixturevalue("pg_seeded_store")
    to_drop: list[PgRaw] = request.getfixturevalue("_pg_schemas_to_drop")
    make_pg_client = request.getfixturevalue("make_pg_client")

    def client() -> TestClient:
        # The seeded runs, with a decision schema of this test's own.
        serving = PgStore(seeded.dsn, seeded.schema, pg_name("localui"))
        to_drop.append(serving.app_raw)
        return make_pg_client(serving, agents=[])

    def acting(ledger: Ledger | None = None, **settings: Any) -> Acting:
        copy = PgStore(seeded.dsn, pg_name("fastaiagent"), pg_name("localui"))
        to_drop.extend((copy.raw, copy.app_raw))
        copy_pg_store(seeded.dsn, seeded.schema, copy.dsn, copy.schema)
        return Acting(make_pg_client(copy, ledger, **settings), PgTruth(copy.raw, copy.app_raw))

    return Backend(
        seeded=seeded,
        store=store,
        truth=PgTruth(PgRaw(seeded.dsn, seeded.schema)),
        client=client,
        acting=acting,
    )


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "sqlite":
        return _sqlite_backend(request)
    return _postgres_backend(request)


# --- helpers --------------------------------------------------------------------------


def state_of(facts: RunFacts) -> str:
    return runs.state_of(facts)


def all_runs(store: Store, **query: Any) -> list[RunFacts]:
    page = store.list_runs(replace(RunQuery(limit=1000), **query))
    assert page.next_key is None
    return list(page.runs)


def scenario_states() -> dict[str, str]:
    """Each scenario's state (DESIGN.md's table, as conftest's ``Seeded`` holds it)."""
    from conftest import Seeded

    return dict(Seeded.STATES)


def expected_states(b: Backend) -> dict[str, str]:
    return {b.seeded.id(name): state for name, state in scenario_states().items()}


def run_ends(truth: Truth, execution_id: str) -> list[str]:
    return [r["status"] for r in truth.rows(execution_id) if r["step_type"] == "run_end"]


def message(response: httpx.Response) -> str:
    return str(response.json()["error"]["message"])


# --- the read model -------------------------------------------------------------------


def test_every_scenario_lists_and_gets_in_its_state(backend: Backend) -> None:
    listed = all_runs(backend.store)
    assert {f.execution_id: state_of(f) for f in listed} == expected_states(backend)
    for facts in listed:
        assert backend.store.get_run(facts.execution_id) == facts
    assert backend.store.get_run("no-such-run") is None
    assert backend.store.list_rows("no-such-run") == ()


def test_counts_per_state_and_totals(backend: Backend) -> None:
    assert dict(backend.store.list_runs(RunQuery()).counts) == COUNTS
    totals = backend.store.totals()
    assert (totals.rows, totals.rows_waiting, totals.rows_quarantined, totals.pending) == (
        31,
        31,
        0,
        4,
    )
    assert backend.store.count_pending() == 4


def test_state_filter_returns_exactly_that_state(backend: Backend) -> None:
    for state in STATES:
        page = backend.store.list_runs(RunQuery(state=state, limit=1000))
        assert {f.execution_id for f in page.runs} == backend.seeded.ids(state), state
        assert all(state_of(f) == state for f in page.runs), state
        assert dict(page.counts) == COUNTS, state


def test_agent_and_text_filters(backend: Backend) -> None:
    store, seeded = backend.store, backend.seeded
    assert len(all_runs(store, agent="refund-bot")) == len(SCENARIO_NAMES) == 10
    nobody = store.list_runs(RunQuery(agent="no-such-bot"))
    assert (nobody.runs, dict(nobody.counts)) == ((), {})
    # Only the refund tool's arguments carry the order id, in any case.
    for text in ("A-1003", "a-1003"):
        assert [f.execution_id for f in all_runs(store, text=text)] == [seeded.id("paused-2")]
    for pattern in ("A_1003", "A%1003", "A-100_", "%A-1003"):
        assert all_runs(store, text=pattern) == [], pattern
    assert {f.execution_id for f in all_runs(store, text="manager_approval")} == seeded.ids(
        "paused"
    )
    failed = seeded.id("failed")
    assert failed in {f.execution_id for f in all_runs(store, text=failed[:13])}
    assert dict(store.list_runs(RunQuery(text="A-1007")).counts) == {"unfinished": 1}


def test_keyset_pages_of_three_walk_every_run_once_newest_first(backend: Backend) -> None:
    seen: list[str] = []
    sizes: list[int] = []
    after = None
    for _ in range(10):
        page = backend.store.list_runs(RunQuery(limit=3, after=after))
        sizes.append(len(page.runs))
        seen.extend(f.execution_id for f in page.runs)
        if page.next_key is None:
            break
        last = page.runs[-1]
        assert page.next_key == (last.last_at, last.execution_id)
        # Cursors carry the ISO text the SDK's SQLite store holds, on either store.
        assert ISO_UTC.match(page.next_key[0]), page.next_key
        after = page.next_key
    assert sizes == [3, 3, 3, 1]
    assert len(set(seen)) == 10
    assert seen == backend.truth.newest_first()
    first = backend.store.list_runs(RunQuery(state="paused", limit=3))
    second = backend.store.list_runs(RunQuery(state="paused", limit=3, after=first.next_key))
    assert (len(first.runs), len(second.runs), second.next_key) == (3, 1, None)
    assert {f.execution_id for f in (*first.runs, *second.runs)} == backend.seeded.ids("paused")


def test_rows_in_written_order_with_run_end_and_fork_origin(backend: Backend) -> None:
    store, seeded = backend.store, backend.seeded
    for name in SCENARIO_NAMES:
        run = seeded.id(name)
        expected = [r["checkpoint_id"] for r in backend.truth.rows(run)]
        assert [h.checkpoint_id for h in store.list_rows(run)] == expected, name
    rows = store.list_rows(seeded.id("idempotent-resumed"))
    assert [(h.node_id, h.step_type, h.status) for h in rows] == [
        ("turn:0", "llm_call", "completed"),
        ("turn:0/tool:refund", "tool_call", "completed"),
        ("turn:0/tool:refund", "hitl_pause", "interrupted"),
        ("turn:1", "llm_call", "completed"),
        ("run_end", "run_end", "completed"),
    ]
    assert rows[2].interrupt_reason == "manager_approval"
    assert {(h.agent, h.synced, h.sync_error) for h in rows} == {("refund-bot", 0, None)}
    failed_end = store.list_rows(seeded.id("failed"))[-1]
    assert (failed_end.node_id, failed_end.step_type, failed_end.status) == (
        "run_end",
        "run_end",
        "failed",
    )
    source_turn1 = [h for h in store.list_rows(seeded.id("completed")) if h.node_id == "turn:1"]
    origin = store.list_rows(seeded.id("fork-of-completed"))[0]
    assert (origin.node_id, origin.step_type) == ("__fork_origin__", "fork_origin")
    assert [origin.parent_checkpoint_id] == [h.checkpoint_id for h in source_turn1]


def test_row_payloads(backend: Backend) -> None:
    store, seeded = backend.store, backend.seeded
    last = store.list_rows(seeded.id("crashed-in-tool"))[-1]
    detail = store.get_row(last.checkpoint_id)
    assert detail is not None and detail.header == last
    assert detail.node_input == {"order_id": "A-1006", "amount": 80.0}
    assert detail.unreadable == ()
    messages = detail.state_snapshot["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[1]["content"] == "Refund order A-1006 for 80.00"
    assert messages[2]["tool_calls"][0]["name"] == "refund"

    pause = store.get_row(store.list_rows(seeded.id("paused-2"))[-1].checkpoint_id)
    assert pause is not None
    assert (pause.header.step_type, pause.header.interrupt_reason) == (
        "hitl_pause",
        "manager_approval",
    )
    assert (pause.interrupt_context["customer"], pause.interrupt_context["amount"]) == (
        "Alan Turing",
        900.0,
    )
    end = store.get_row(store.list_rows(seeded.id("failed"))[-1].checkpoint_id)
    assert end is not None
    assert end.state_snapshot["run_error"] == "RuntimeError: model provider returned 503"
    assert store.get_row("no-such-checkpoint") is None


def test_pending_names_the_newest_interrupted_row(backend: Backend) -> None:
    run = backend.seeded.id("paused-3")
    pending = backend.store.get_pending(run)
    assert pending is not None
    interrupted = [r for r in backend.truth.rows(run) if r["status"] == "interrupted"]
    assert pending.checkpoint_id == interrupted[-1]["checkpoint_id"]
    assert (pending.execution_id, pending.agent, pending.node_id, pending.reason) == (
        run,
        "refund-bot",
        "turn:0/tool:refund",
        "manager_approval",
    )
    assert pending.agent_path == "agent:refund-bot/tool:refund"
    assert (pending.context["order_id"], pending.context["customer"]) == (
        "A-1004",
        "Katherine Johnson",
    )
    assert pending.context["policy"]["requires"] == {"role": "manager", "approvals": 1}
    assert ISO_UTC.match(pending.created_at), pending.created_at
    assert backend.store.get_pending(backend.seeded.id("completed")) is None
    assert backend.store.get_pending(backend.seeded.id("idempotent-resumed")) is None


def test_pending_oldest_first_and_in_pages_of_one(backend: Backend) -> None:
    expected = backend.truth.pending_order()
    assert set(expected) == backend.seeded.ids("paused")
    page = backend.store.list_pending()
    assert [p.execution_id for p in page.items] == expected
    assert (page.total, page.next_key) == (4, None)
    for newest_first in (False, True):
        walked: list[str] = []
        after = None
        for _ in range(10):
            one = backend.store.list_pending(after=after, limit=1, newest_first=newest_first)
            assert one.total == 4
            walked.extend(p.execution_id for p in one.items)
            if one.next_key is None:
                break
            after = one.next_key
        assert walked == (expected[::-1] if newest_first else expected), newest_first


def test_cache_unwraps_the_envelope(backend: Backend) -> None:
    store, seeded = backend.store, backend.seeded
    (entry,) = store.list_cache(seeded.id("idempotent-resumed"))
    assert (entry.execution_id, entry.value, entry.enveloped) == (
        seeded.id("idempotent-resumed"),
        "cb-A-1009-450.00",
        True,
    )
    assert [e.value for e in store.list_cache(seeded.id("completed"))] == ["cb-A-1001-40.00"]
    # Died before its charge; and a model that never asked for one.
    assert store.list_cache(seeded.id("crashed-in-tool")) == ()
    assert store.list_cache(seeded.id("failed")) == ()


def test_a_run_page_s_first_reads_at_once_are_the_three_reads(backend: Backend) -> None:
    store, seeded = backend.store, backend.seeded
    for name in ("completed", "paused-1", "crashed-in-tool", "fork-of-completed", "failed"):
        execution_id = seeded.id(name)
        reads = store.run_reads(execution_id)
        assert reads == (
            store.get_run(execution_id),
            store.list_rows(execution_id),
            store.list_cache(execution_id),
        ), name
        assert reads[0] is not None and reads[1], name
    assert any(store.run_reads(seeded.id(n))[2] for n in ("completed", "crashed-in-tool"))
    assert store.run_reads("no-such-run") == (None, (), ())


def test_a_comparison_s_first_reads_at_once_are_each_run_s_three_reads(backend: Backend) -> None:
    store, seeded = backend.store, backend.seeded
    names = ("completed", "fork-of-completed", "paused-1", "crashed-in-tool")
    ids = [seeded.id(n) for n in names]
    reads = store.compare_reads([*ids, ids[0], "no-such-run"])
    assert list(reads) == [*ids, "no-such-run"]
    for name, execution_id in zip(names, ids, strict=True):
        assert reads[execution_id] == (
            store.get_run(execution_id),
            store.list_rows(execution_id),
            store.get_fork_origin(execution_id),
        ), name
    assert reads[seeded.id("fork-of-completed")][2] is not None
    assert reads["no-such-run"] == (None, (), None)


def test_fork_links_both_ways(backend: Backend) -> None:
    store, seeded = backend.store, backend.seeded
    source, fork = seeded.id("completed"), seeded.id("fork-of-completed")
    [turn1] = [h for h in store.list_rows(source) if h.node_id == "turn:1"]
    link = store.get_fork_origin(fork)
    assert link is not None
    assert (link.execution_id, link.source_execution_id) == (fork, source)
    assert (link.source_checkpoint_id, link.source_node_id) == (turn1.checkpoint_id, "turn:1")
    assert link.created_at == store.list_rows(fork)[0].created_at
    assert store.list_forks(source) == (link,)
    assert store.get_fork_origin(source) is None
    assert store.list_forks(fork) == ()
    assert store.list_forks(seeded.id("failed")) == ()
    # What a run page reads, at once.
    assert store.fork_family(source) == (None, (link,))
    assert store.fork_family(fork) == (link, ())
    assert store.fork_family(seeded.id("failed")) == (None, ())
    facts = store.get_run(fork)
    assert facts is not None and facts.fork_parent_checkpoint_id == turn1.checkpoint_id


def test_prune_preview_counts(backend: Backend) -> None:
    assert backend.store.prune_preview("2000-01-01T00:00:00+00:00").would_delete == 0
    # An hour ahead: every row the seed wrote is older than that.
    preview = backend.store.prune_preview((datetime.now(UTC) + timedelta(hours=1)).isoformat())
    assert (
        preview.checkpoint_rows,
        preview.cache_rows,
        preview.pauses_kept,
        preview.would_delete,
    ) == (26, 7, 5, 33)
    seeded = backend.seeded
    assert {r.execution_id for r in preview.runs if r.rows_kept} == seeded.ids("paused") | {
        seeded.id("idempotent-resumed")
    }
    resumable = ("paused-1", "paused-2", "paused-3", "two-tools-first-pauses")
    resumable += ("crashed-waiting-on-model",)
    assert dict(preview.resumable_cache) == {seeded.id(n): 1 for n in resumable}


# --- pages and JSON ------------------------------------------------------------------


def test_runs_json_keys_and_counts(backend: Backend) -> None:
    response = backend.client().get("/runs.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    # Every state has its count, the stopped ones too (none among the seeded runs).
    none = {"orphaned": 0, "cancelled": 0, "timed_out": 0}
    assert (body["counts"], body["next"]) == ({**COUNTS, **none}, None)
    listed = {r["execution_id"]: r for r in body["runs"]}
    assert {k: r["state"] for k, r in listed.items()} == expected_states(backend)
    for run in body["runs"]:
        assert LIST_RUN_KEYS <= set(run), run
        facts = backend.store.get_run(run["execution_id"])
        assert facts is not None
        assert (run["rows"], run["first_at"], run["last_at"]) == (
            facts.row_count,
            facts.first_at,
            facts.last_at,
        )
    seeded = backend.seeded
    assert listed[seeded.id("paused-2")]["pending_reason"] == "manager_approval"
    assert listed[seeded.id("completed")]["pending_reason"] is None
    assert listed[seeded.id("crashed-in-tool")]["stopped_at"] == "tool"


def test_run_json_for_every_scenario(backend: Backend) -> None:
    client = backend.client()
    for name, state in scenario_states().items():
        run = backend.seeded.id(name)
        response = client.get(f"/runs/{run}.json")
        assert response.status_code == 200, name
        body = response.json()
        assert RUN_KEYS <= set(body), name
        assert (body["execution_id"], body["state"], body["agent"]) == (run, state, "refund-bot")
        # The seeding approves this run through the SDK, not localui: decided outside it,
        # as its resume's span says where the spans are (the SQLite store's own file).
        traced = isinstance(backend.store, SQLiteStore)
        outside = [("outside", "demo-seed")] if traced and name == "idempotent-resumed" else []
        assert [(d["kind"], d["approver"]) for d in body["decisions"]] == outside, name
        assert [tuple(r[k] for k in ROW_KEYS) for r in body["rows"]] == [
            (h.checkpoint_id, h.node_id, h.step_type, h.status, h.created_at, h.agent_path)
            for h in backend.store.list_rows(run)
        ], name
        if state == "completed":
            assert body["resume"] is None, name
        else:
            assert body["resume"]["shape"] in ("tool", "turn", "approval"), name
        assert (body["fork_of"] is None) is (name != "fork-of-completed"), name
    source = client.get(f"/runs/{backend.seeded.id('completed')}.json").json()
    assert [f["execution_id"] for f in source["forks"]] == [backend.seeded.id("fork-of-completed")]
    resumed = client.get(f"/runs/{backend.seeded.id('idempotent-resumed')}.json").json()
    assert [(e["value"], e["enveloped"]) for e in resumed["idempotency"]] == [
        ("cb-A-1009-450.00", True)
    ]


def test_row_detail_json(backend: Backend) -> None:
    run = backend.seeded.id("paused-2")
    cid = backend.store.list_rows(run)[-1].checkpoint_id
    body = backend.client().get(f"/runs/{run}/rows/{cid}.json").json()
    assert (body["execution_id"], body["checkpoint_id"]) == (run, cid)
    assert (body["node_id"], body["step_type"], body["status"]) == (
        "turn:0/tool:refund",
        "hitl_pause",
        "interrupted",
    )
    assert body["unreadable"] == []
    assert body["node_input"] == {"order_id": "A-1003", "amount": 900.0}
    assert body["interrupt_reason"] == "manager_approval"
    assert body["interrupt_context"]["customer"] == "Alan Turing"
    assert [m["role"] for m in body["transcript"]] == ["system", "user", "assistant"]
    assert body["transcript"][1]["text"] == "Refund order A-1003 for 900.00"
    (call,) = body["transcript"][2]["tool_calls"]
    assert (call["name"], call["arguments"]) == ("refund", {"order_id": "A-1003", "amount": 900.0})


def test_approvals_json_oldest_first_with_checkpoint_ids(backend: Backend) -> None:
    approvals = backend.client().get("/approvals.json").json()["approvals"]
    assert [a["execution_id"] for a in approvals] == backend.truth.pending_order()
    for item in approvals:
        interrupted = [
            r for r in backend.truth.rows(item["execution_id"]) if r["status"] == "interrupted"
        ]
        assert item["checkpoint_id"] == interrupted[-1]["checkpoint_id"], item["execution_id"]
    by_run = {a["execution_id"]: a for a in approvals}
    assert by_run[backend.seeded.id("paused-1")]["context"]["order_id"] == "A-1002"


def test_paused_calls_of_a_page_in_one_read(backend: Backend) -> None:
    page = backend.store.list_pending()
    calls = backend.store.paused_calls(page.items)
    assert set(calls) == {p.checkpoint_id for p in page.items}
    two_tools = backend.store.get_pending(backend.seeded.id("two-tools-first-pauses"))
    assert two_tools is not None and two_tools.checkpoint_id is not None
    paused = calls[two_tools.checkpoint_id]
    assert paused.node_input == {"order_id": "A-1005", "amount": 700.0}
    assert paused.state_snapshot["tool_name"] == "refund"
    names = [c["name"] for c in paused.state_snapshot["messages"][-1]["tool_calls"]]
    assert names == ["refund", "notify_customer"]
    # The charge the run made before it paused is the one cached result a resume reuses.
    assert paused.cached_results == 1
    # And the run's rows and paused rows, which say whether a card needs the exact check.
    for pending in page.items:
        rows = backend.store.list_rows(pending.execution_id)
        call = calls[pending.checkpoint_id or ""]
        assert call.run_rows == len(rows) > 0
        assert call.run_pauses == sum(r.status == "interrupted" for r in rows) >= 1
    assert backend.store.paused_calls(()) == {}
    # The cards say it as a call, by the same read on either store.
    effects = {
        a["execution_id"]: a["effects"]
        for a in backend.client().get("/approvals.json").json()["approvals"]
    }
    # PostgreSQL's jsonb keeps keys in its own order, not the call's: the arguments
    # are the same, their order is the store's.
    call = effects[two_tools.execution_id].pop("call")
    assert call in (
        'refund(order_id="A-1005", amount=700.0)',
        'refund(amount=700.0, order_id="A-1005")',
    )
    assert effects[two_tools.execution_id] == {
        "tool": "refund",
        "skipped": ["notify_customer"],
        "reused": 1,
    }


def test_unknown_run_is_404_and_a_bad_state_filter_400(backend: Backend) -> None:
    client = backend.client()
    missing = client.get("/runs/no-such-run.json")
    assert missing.status_code == 404
    assert message(missing) == "no run with execution id 'no-such-run' in this store"
    assert client.get("/runs/no-such-run").status_code == 404
    bad = client.get("/runs.json", params={"state": "bogus"})
    assert bad.status_code == 400
    assert message(bad) == f"state='bogus' is not one of {', '.join(STATES)}"


def test_verdict_of_a_run_that_died_in_its_tool(
    backend: Backend, page_text: Callable[..., str]
) -> None:
    html = backend.client().get(f"/runs/{backend.seeded.id('crashed-in-tool')}").text
    banner = page_text(html, "verdict")
    assert "No end marker: still running, or its process died inside tool refund" in banner
    assert (
        'Resume: Resume re-invokes refund with the saved arguments {"amount": 80.0, '
        '"order_id": "A-1006"}; the model is not called again.' in banner
    )


# --- acting ---------------------------------------------------------------------------


def test_approve_completes_from_the_cache_and_records_the_decision(
    backend: Backend, ledger: Ledger
) -> None:
    desk = backend.acting(ledger)
    run = backend.seeded.id("paused-1")
    shown = card(desk.client, run)
    rows_before = len(desk.truth.rows(run))

    response = decide(desk.client, run, shown["checkpoint_id"])

    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["action"], body["status"], body["output"]) == (
        "approve",
        "completed",
        "Done: refunded 250.00 on A-1002.",
    )
    assert (body["decision"]["approver"], body["decision"]["approved"]) == ("Ann Approver", True)
    assert run_ends(desk.truth, run) == ["completed"]
    assert len(desk.truth.rows(run)) == rows_before + 2
    assert run not in desk.truth.pending_order()
    [row] = desk.truth.decisions(run)
    assert (row["kind"], bool(row["approved"]), row["actor"], row["outcome"]) == (
        "approval",
        True,
        "Ann Approver",
        "completed",
    )
    assert row["checkpoint_id"] == shown["checkpoint_id"]
    page = desk.client.get(f"/runs/{run}.json").json()
    assert page["state"] == "completed"
    assert page["decisions"] == [body["decision"]]
    # The paused run charged before it paused: the resumed refund got it from the cache.
    assert ledger.count("charge_back") == 0
    assert ledger.count() == 0


def test_reject_with_a_reason_declines_in_the_tool(backend: Backend, ledger: Ledger) -> None:
    desk = backend.acting(ledger)
    run = backend.seeded.id("paused-2")
    shown = card(desk.client, run)
    refused = decide(desk.client, run, shown["checkpoint_id"], verb="reject", reason="  ")
    assert refused.status_code == 400
    assert message(refused) == "a reason is required to reject"
    assert desk.truth.decisions(run) == []

    response = decide(desk.client, run, shown["checkpoint_id"], verb="reject", reason="too large")

    assert response.status_code == 200, response.text
    assert response.json()["output"] == "Done: refund of 900.00 on A-1003 declined: too large."
    [decision] = desk.client.get(f"/runs/{run}.json").json()["decisions"]
    assert (decision["approved"], decision["reason"]) == (False, "too large")
    assert [bool(r["approved"]) for r in desk.truth.decisions(run)] == [False]
    assert run_ends(desk.truth, run) == ["completed"]
    assert ledger.count() == 0


def test_a_decided_run_says_who_decided_in_the_list_and_on_its_page(
    backend: Backend, ledger: Ledger, page_text: Callable[..., str]
) -> None:
    desk = backend.acting(ledger)
    rejected, approved = backend.seeded.id("paused-2"), backend.seeded.id("paused-1")
    still_paused = backend.seeded.id("paused-3")
    for run, verb, reason in ((rejected, "reject", "too large"), (approved, "approve", "")):
        answer = decide(
            desk.client, run, card(desk.client, run)["checkpoint_id"], verb=verb, reason=reason
        )
        assert answer.status_code == 200, answer.text

    listed = {r["execution_id"]: r for r in desk.client.get("/runs.json").json()["runs"]}
    assert listed[rejected]["state"] == "completed"
    assert listed[rejected]["decided"] == "rejected by Ann Approver: too large"
    assert listed[approved]["decided"] == "approved by Ann Approver"
    assert listed[still_paused]["decided"] is None
    assert backend.seeded.id("completed") in listed
    assert listed[backend.seeded.id("completed")]["decided"] is None
    html = desk.client.get("/").text
    # The list says it once, as the run's outcome, beside its state.
    row = page_text(html, f"run-{rejected}")
    assert row.startswith("completed ") and row.count("rejected by Ann Approver: too large") == 1
    outcome = re.search(
        r'<td class="run-outcome"><span class="decided">(.*?)</span></td>',
        html.split(f'id="run-{rejected}"')[1],
    )
    assert outcome is not None and outcome.group(1) == "rejected by Ann Approver: too large"
    state_line = page_text(desk.client.get(f"/runs/{rejected}").text, "run-state")
    assert state_line.startswith("completed · rejected by Ann Approver: too large · "), state_line
    assert desk.client.get(f"/runs/{approved}.json").json()["decided"] == "approved by Ann Approver"
    assert desk.client.get(f"/runs/{still_paused}.json").json()["decided"] is None


class CountingLog:
    """The app's real decision log, counting the reads a runs page makes of it."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.reads: list[tuple[str, int]] = []

    def latest_for_runs(self, kind: str, execution_ids: Any) -> Any:
        self.reads.append(("latest_for_runs", len(execution_ids)))
        return self.log.latest_for_runs(kind, execution_ids)

    def list_for_run(self, execution_id: str) -> Any:
        self.reads.append(("list_for_run", 1))
        return self.log.list_for_run(execution_id)


def test_a_runs_page_reads_its_decisions_once(backend: Backend, ledger: Ledger) -> None:
    from localui.views.runs import RunFilters, build_runs_page
    from localui.views.urls import Urls

    desk = backend.acting(ledger)
    run = backend.seeded.id("paused-2")
    decide(desk.client, run, card(desk.client, run)["checkpoint_id"], verb="reject", reason="no")
    state = desk.client.app.state.localui  # type: ignore[attr-defined]
    counting = CountingLog(state.actions.decisions)
    urls = Urls(desk.client.app.router, "")  # type: ignore[attr-defined]
    page = build_runs_page(
        state.store, counting, RunFilters(None, None, None, None), None, 100, urls
    )
    assert len(page.runs) > 5
    not_paused = [r for r in page.runs if r.state != "paused"]
    assert counting.reads == [("latest_for_runs", len(not_paused))]
    assert [r.execution_id for r in page.runs if r.decided] == [run]


def test_a_stale_card_is_refused_with_the_current_row(backend: Backend, ledger: Ledger) -> None:
    desk = backend.acting(ledger)
    run = backend.seeded.id("paused-3")
    current = card(desk.client, run)["checkpoint_id"]
    [earlier] = [r["checkpoint_id"] for r in desk.truth.rows(run) if r["step_type"] == "tool_call"]
    before = desk.truth.fingerprint()

    response = decide(desk.client, run, earlier)

    assert response.status_code == 409
    assert response.json()["error"]["details"] == {"current_checkpoint_id": current}
    assert desk.truth.fingerprint() == before
    assert run in desk.truth.pending_order()
    assert desk.truth.decisions(run) == []
    assert ledger.count() == 0


def test_twenty_concurrent_approvals_resume_the_run_once(backend: Backend, ledger: Ledger) -> None:
    desk = backend.acting(ledger, raise_server_exceptions=False)
    run = backend.seeded.id("paused-1")
    shown = card(desk.client, run)
    rows_before = len(desk.truth.rows(run))

    responses = all_at_once(
        20, lambda i: decide(desk.client, run, shown["checkpoint_id"], approver=f"approver-{i:02d}")
    )

    statuses = [r.status_code for r in responses]
    assert [s for s in statuses if s >= 500] == []
    assert (statuses.count(200), statuses.count(409)) == (1, 19), statuses
    [won] = [r.json() for r in responses if r.status_code == 200]
    winner = won["decision"]["approver"]
    for lost in (r for r in responses if r.status_code == 409):
        assert re.match(rf"This pause was (already|being) approved by {winner} ", message(lost))
    assert run_ends(desk.truth, run) == ["completed"]
    assert len(desk.truth.rows(run)) == rows_before + 2
    assert [r["actor"] for r in desk.truth.decisions(run)] == [winner]
    assert ledger.count() == 0


def test_resume_of_a_run_that_died_in_its_tool_charges_once(
    backend: Backend, ledger: Ledger
) -> None:
    desk = backend.acting(ledger)
    run = backend.seeded.id("crashed-in-tool")
    plan = desk.client.get(f"/runs/{run}.json").json()["resume"]
    assert (plan["shape"], plan["tool"]) == ("tool", "refund")

    response = desk.client.post(
        f"/runs/{run}/resume",
        data={"checkpoint_id": plan["checkpoint_id"], "actor": "Ops", "confirm": "yes"},
        headers=JSON,
    )

    assert response.status_code == 200, response.text
    assert (response.json()["status"], response.json()["output"]) == (
        "completed",
        "Done: refunded 80.00 on A-1006.",
    )
    # The run died as refund started, before charging: the resume charges exactly once.
    assert ledger.count("charge_back", "A-1006") == 1
    assert ledger.count() == 1
    assert [r["node_id"] for r in desk.truth.rows(run)] == [
        "turn:0",
        "turn:0/tool:refund",
        "turn:1",
        "run_end",
    ]
    assert run_ends(desk.truth, run) == ["completed"]
    again = desk.client.post(
        f"/runs/{run}/resume",
        data={"checkpoint_id": plan["checkpoint_id"], "actor": "Ops", "confirm": "yes"},
        headers=JSON,
    )
    assert again.status_code in (409, 422)
    assert ledger.count() == 1


def test_resume_of_a_failed_run_reenters_and_completes(backend: Backend) -> None:
    desk = backend.acting()
    run = backend.seeded.id("failed")
    plan = desk.client.get(f"/runs/{run}.json").json()["resume"]
    data = {"checkpoint_id": plan["checkpoint_id"], "actor": "Ops", "confirm": "yes"}

    response = desk.client.post(f"/runs/{run}/resume", data=data, headers=JSON)

    assert response.status_code == 200, response.text
    assert response.json()["status"] == "completed"
    assert run_ends(desk.truth, run) == ["failed", "completed"]


def test_fork_with_new_input_answers_json_with_the_new_run(backend: Backend) -> None:
    desk = backend.acting()
    source = backend.seeded.id("failed")
    row = desk.truth.rows(source)[0]["checkpoint_id"]

    response = desk.client.post(
        f"/runs/{source}/fork",
        data={"checkpoint_id": row, "input": "Refund order A-1010 for 15.00"},
        headers=JSON,
    )

    assert response.status_code == 200, response.text
    new = response.json()["new_execution_id"]
    page = desk.client.get(f"/runs/{new}.json").json()
    assert page["state"] == "completed"
    assert page["fork_of"]["source_execution_id"] == source
    forks = desk.client.get(f"/runs/{source}.json").json()["forks"]
    assert [f["execution_id"] for f in forks] == [new]


def test_fork_redirects_to_the_new_run_linked_to_its_source_row(backend: Backend) -> None:
    desk = backend.acting()
    source = backend.seeded.id("completed")
    [row] = [r for r in desk.truth.rows(source) if r["node_id"] == "turn:0/tool:refund"]
    before = set(desk.truth.newest_first())

    response = desk.client.post(
        f"/runs/{source}/fork",
        data={"checkpoint_id": row["checkpoint_id"], "input": ""},
        follow_redirects=False,
    )

    assert response.status_code == 303
    match = re.fullmatch(r"/runs/([0-9a-f-]{36})", response.headers["location"])
    assert match is not None, response.headers["location"]
    new = match.group(1)
    assert set(desk.truth.newest_first()) - before == {new}
    forked = desk.client.get(f"/runs/{new}.json").json()
    assert (
        forked["fork_of"]["source_execution_id"],
        forked["fork_of"]["source_checkpoint_id"],
    ) == (
        source,
        row["checkpoint_id"],
    )
    assert forked["state"] == "completed"
    listed = desk.client.get(f"/runs/{source}.json").json()["forks"]
    assert {f["execution_id"] for f in listed} == {new, backend.seeded.id("fork-of-completed")}


def test_prune_deletes_what_it_previewed(backend: Backend) -> None:
    desk = backend.acting()
    preview = desk.client.get("/prune.json", params={"older_than": "0s"}).json()
    assert (
        preview["checkpoint_rows"],
        preview["cache_rows"],
        preview["pauses_kept"],
        preview["would_delete"],
    ) == (26, 7, 5, 33)

    done = desk.client.post(
        "/prune",
        data={
            "older_than": "0s",
            "cutoff": preview["cutoff"],
            "prune_token": preview["prune_token"],
        },
        headers=JSON,
    )

    assert done.status_code == 200, done.text
    assert (done.json()["deleted"], done.json()["cutoff"]) == (33, preview["cutoff"])
    assert set(desk.truth.pending_order()) == backend.seeded.ids("paused")
    after = desk.client.get("/prune.json", params={"older_than": "0s"}).json()
    assert (after["would_delete"], after["pauses_kept"]) == (0, 5)
    assert desk.client.get("/runs.json").json()["counts"]["paused"] == 4


@pytest.mark.parametrize("forged", ["now-1s", "other-token", "no-token", "year-one"])
def test_prune_refuses_a_cutoff_no_preview_showed(backend: Backend, forged: str) -> None:
    desk = backend.acting()
    # The 7-day preview shows nothing to delete: the seeded rows are minutes old.
    preview = desk.client.get("/prune.json", params={"older_than": "7d"}).json()
    assert preview["would_delete"] == 0
    before = desk.truth.fingerprint()
    recent = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    form = {
        "now-1s": {"cutoff": recent, "prune_token": preview["prune_token"]},
        "other-token": {"cutoff": recent, "prune_token": "0" * 64},
        "no-token": {"cutoff": recent},
        "year-one": {"cutoff": "0001-01-01T00:00:00+14:00", "prune_token": "0" * 64},
    }[forged]

    refused = desk.client.post("/prune", data={"older_than": "7d", **form}, headers=JSON)

    assert refused.status_code in (400, 403), refused.text
    assert "preview" in refused.json()["error"]["message"]
    assert desk.truth.fingerprint() == before
    assert desk.client.get("/prune.json", params={"older_than": "0s"}).json()["would_delete"] > 0


def test_read_only_refuses_every_post(backend: Backend, ledger: Ledger) -> None:
    desk = backend.acting(ledger, read_only=True)
    seeded = backend.seeded
    paused, crashed, completed = (
        seeded.id(n) for n in ("paused-1", "crashed-in-tool", "completed")
    )
    paused_row = card(desk.client, paused)["checkpoint_id"]
    posts = [
        (f"/approvals/{paused}/approve", {"approver": "Ann", "checkpoint_id": paused_row}),
        (
            f"/approvals/{paused}/reject",
            {"approver": "Ann", "reason": "no", "checkpoint_id": paused_row},
        ),
        (
            f"/runs/{crashed}/resume",
            {"checkpoint_id": desk.truth.rows(crashed)[-1]["checkpoint_id"], "confirm": "yes"},
        ),
        (
            f"/runs/{completed}/fork",
            {"checkpoint_id": desk.truth.rows(completed)[0]["checkpoint_id"]},
        ),
        ("/prune", {"older_than": "0s"}),
    ]
    before = desk.truth.fingerprint()

    for path, form in posts:
        response = desk.client.post(path, data=form, headers=JSON)
        assert response.status_code == 403, path
        assert message(response).startswith("this server is read-only"), path

    assert desk.truth.fingerprint() == before
    assert desk.truth.decisions(paused) == []
    assert ledger.count() == 0
