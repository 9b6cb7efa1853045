"""The store's batched reads (``list_rows_of``, ``get_rows``, ``list_cache_of``) give
each run exactly what the one-run reads give it, on SQLite and on PostgreSQL, and
``/attention``, which reads a page of runs with them, describes every run as that
run's own page does.

A batched read that handed one run another's rows would make a row of the attention
page describe the wrong run's resume. So runs of every runner shape (Agent, Chain,
Supervisor, Swarm, a long agent; paused, crashed in a tool and waiting on the model,
failed, finished with a cached result and a row the plane refused) are written by
the real SDK into one store per backend and read both ways.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import BASE_URL, PgRaw, pg_name
from helpers import LOOPBACK_CLIENT, NO_SIGN_IN
from starlette.testclient import TestClient

from localui import runs
from localui.app import create_app
from localui.backends.base import Backend
from localui.demo import teams
from localui.demo.agent import build_agent
from localui.demo.scenarios import ALL_SCENARIOS, seed
from localui.records import CacheEntry, RunQuery
from localui.settings import Settings

#: Runs of every shape that need a person, side by side on one page.
NEED_A_PERSON = (
    "paused-1",
    "crashed-in-tool",
    "crashed-waiting-on-model",
    "failed",
    "two-tools-first-pauses",
    "chain-paused",
    "chain-crashed",
    "supervisor-paused",
    "supervisor-crashed",
    "swarm-paused",
    "swarm-crashed",
    "long-failed",
)
#: A finished run with a cached result; one of its rows is quarantined, so it is on
#: the page too, the only run there with cache entries.
CACHED = "idempotent-resumed"
SCENARIOS = tuple(s for s in ALL_SCENARIOS if s.name in {*NEED_A_PERSON, CACHED})

#: The run page's sentence on cached results, which the attention page leaves to it.
CACHE_WORDS = re.compile(
    r" \d+ @idempotent results? will be answered from the cache instead of running again\.$"
)


@dataclass(frozen=True, slots=True)
class Shapes:
    """One backend's store of the runs above, the app's settings over it, the ids."""

    backend: Backend
    settings: Settings
    checkpointer: Any
    ids: dict[str, str]


def _quarantine_one_row(checkpointer: Any, backend: Backend, execution_id: str) -> None:
    first = backend.store.list_rows(execution_id)[0]
    checkpointer.mark_quarantined({first.checkpoint_id: "state_snapshot over the plane's cap"})


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def shapes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Shapes]:
    with ExitStack() as stack:
        if request.param == "sqlite":
            from fastaiagent.checkpointers import SQLiteCheckpointer

            from localui.backends.sqlite import SQLiteBackend

            path = Path(tmp_path_factory.mktemp("shapes")) / "local.db"
            report = seed(path, scenarios=SCENARIOS)
            checkpointer: Any = SQLiteCheckpointer(str(path))
            backend: Backend = SQLiteBackend(path)
            settings = Settings(store=str(path), sign_in=NO_SIGN_IN)
        else:
            from fastaiagent.checkpointers.postgres import PostgresCheckpointer

            from localui.backends.postgres import PostgresBackend

            dsn: str = request.getfixturevalue("pg_dsn")
            schema, app_schema = pg_name("fastaiagent_shapes"), pg_name("localui_shapes")
            stack.callback(PgRaw(dsn, schema).drop)
            stack.callback(PgRaw(dsn, app_schema).drop)
            report = seed(dsn, pg_schema=schema, scenarios=SCENARIOS)
            checkpointer = PostgresCheckpointer(dsn, schema=schema)
            backend = PostgresBackend(dsn, schema=schema, app_schema=app_schema)
            settings = Settings(
                store=dsn, pg_schema=schema, pg_app_schema=app_schema, sign_in=NO_SIGN_IN
            )
        stack.callback(checkpointer.close)
        stack.callback(backend.close)
        ids = {s.name: report.run_id(s.name) for s in SCENARIOS}
        _quarantine_one_row(checkpointer, backend, ids[CACHED])
        yield Shapes(backend, settings, checkpointer, ids)


# --- the store's batched reads --------------------------------------------------------


def test_rows_of_many_runs_are_each_runs_own(shapes: Shapes) -> None:
    store, ids = shapes.backend.store, list(shapes.ids.values())

    batched = store.list_rows_of([*ids, "no-such-run", ids[0]])

    assert set(batched) == set(ids)
    assert len({len(rows) for rows in batched.values()}) > 2, "runs of one length only"
    for execution_id in ids:
        assert batched[execution_id] == store.list_rows(execution_id), execution_id
    assert store.list_rows_of([]) == {}


def test_rows_by_checkpoint_id_are_the_rows_asked_for(shapes: Shapes) -> None:
    store = shapes.backend.store
    rows = store.list_rows_of(list(shapes.ids.values()))
    # Every run's first and newest rows: end markers, paused rows, tool rows, turns.
    wanted = [r.checkpoint_id for run in rows.values() for r in (run[0], run[-1])]

    found = store.get_rows([*wanted, "no-such-row"])

    assert set(found) == set(wanted)
    for checkpoint_id in wanted:
        assert found[checkpoint_id] == store.get_row(checkpoint_id), checkpoint_id
    payloads = {repr(found[c].state_snapshot) + repr(found[c].node_input) for c in wanted}
    assert len(payloads) > 2, "the rows compared all hold the same payloads"
    assert store.get_rows([]) == {}


def test_pairs_the_store_holds_as_equal_are_equal_and_no_others(shapes: Shapes) -> None:
    from localui.compare import payloads_same

    store = shapes.backend.store
    rows = [
        r.checkpoint_id
        for run in store.list_rows_of(list(shapes.ids.values())).values()
        for r in run
    ]
    details = store.get_rows(rows)
    # Every row beside itself, and beside the next one written (of its run or the next).
    pairs = [(c, c) for c in rows] + list(zip(rows, rows[1:], strict=False))
    pairs.append((rows[0], "no-such-row"))

    same = store.same_payloads(pairs)

    assert {(c, c) for c in rows} <= same
    assert (rows[0], "no-such-row") not in same
    differing = [
        (a, b) for a, b in pairs[len(rows) : -1] if not payloads_same(details[a], details[b])
    ]
    assert len(differing) > 10, "the rows compared all hold the same payloads"
    assert not same & set(differing), "a pair of different payloads was called equal"
    for a, b in same:
        assert payloads_same(details[a], details[b]), (a, b)
    assert store.same_payloads([]) == set()


def _in_order(entries: tuple[CacheEntry, ...]) -> list[CacheEntry]:
    # Entries written at the same instant have no order between them in either read.
    return sorted(entries, key=lambda e: (e.created_at, e.function_key))


def test_cache_of_many_runs_is_each_runs_own(shapes: Shapes) -> None:
    store, ids = shapes.backend.store, list(shapes.ids.values())

    batched = store.list_cache_of([*ids, "no-such-run"])

    with_cache = {eid for eid in ids if store.list_cache(eid)}
    assert shapes.ids[CACHED] in with_cache
    assert set(batched) == with_cache
    for execution_id in with_cache:
        assert _in_order(batched[execution_id]) == _in_order(store.list_cache(execution_id))
    assert store.list_cache_of([]) == {}


def test_a_page_of_the_runs_list_read_in_one_go(shapes: Shapes) -> None:
    store = shapes.backend.store
    page = store.list_runs(RunQuery(limit=25))

    batched = store.list_rows_of([f.execution_id for f in page.runs])

    assert len(page.runs) == len(SCENARIOS)
    for facts in page.runs:
        rows = batched[facts.execution_id]
        assert len(rows) == facts.row_count, facts.execution_id
        assert rows[-1].checkpoint_id == facts.last_checkpoint_id, facts.execution_id


# --- the attention page over them -----------------------------------------------------


@pytest.fixture
def client(shapes: Shapes) -> Iterator[TestClient]:
    """The app over the store, every runner registered, everything needing a person."""
    c = shapes.checkpointer
    agents = [
        build_agent(c),
        teams.build_chain(c),
        teams.build_supervisor(c),
        teams.build_swarm(c),
        teams.build_long_agent(c),
    ]
    settings = Settings(
        store=shapes.settings.store,
        pg_schema=shapes.settings.pg_schema,
        pg_app_schema=shapes.settings.pg_app_schema,
        sign_in=NO_SIGN_IN,
        stale_after=0.0,
        remind_after=0.0,
    )
    app = create_app(settings, agents=agents)
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as opened:
        yield opened


def test_each_attention_row_says_what_its_own_run_page_says(
    shapes: Shapes, client: TestClient
) -> None:
    page = client.get("/attention.json").json()

    listed = {row["execution_id"]: row for row in page["runs"]}
    # All of them on the one page: one batched read per kind of row for all of them.
    assert set(listed) == set(shapes.ids.values()) and page["next"] is None
    shapes_seen, owners, saved_args = set(), set(), set()
    for name, execution_id in shapes.ids.items():
        row = listed[execution_id]
        run = client.get(f"/runs/{execution_id}.json").json()
        assert row["state"] == run["state"], name
        assert row["resume"] == CACHE_WORDS.sub("", run["verdict"]["resume"]), name
        plan = run["resume"]
        if plan is not None and plan["shape"] != "approval":
            assert row["checkpoint_id"] == plan["checkpoint_id"], name
        else:
            assert row["checkpoint_id"] is None, name
        if run["run_error"]:
            assert row["detail"] == f"error: {run['run_error']}", name
        elif row["detail"] is not None:
            assert not row["detail"].startswith("error: "), name
        written = {entry["written_by"] for entry in run["idempotency"]}
        repeats = (
            plan["tool"]
            if plan is not None and plan["shape"] == "tool" and plan["checkpoint_id"] not in written
            else None
        )
        assert row["repeats"] == repeats, name
        if plan is not None:
            shapes_seen.add(plan["shape"])
            saved_args.add(repr(plan["saved_args"]))
        owners.add(run["runner"].split(" ")[0])
    # What a wrong run's rows would give away was there to be given away.
    assert {"tool", "turn", "approval"} <= shapes_seen, shapes_seen
    assert {"Agent", "Chain", "Supervisor", "Swarm"} <= owners, owners
    assert len(saved_args) > 2, "every run re-enters with the same saved arguments"
    assert (
        sum(bool(r["detail"] and r["detail"].startswith("error: ")) for r in listed.values()) >= 2
    )
    assert listed[shapes.ids["crashed-in-tool"]]["repeats"] is not None


# --- the counts a metrics scrape reads ------------------------------------------------


def test_fleet_counts_are_the_runs_own_counts_at_every_cutoff(shapes: Shapes) -> None:
    """Stalled and overdue are read as a state's count less its runs newer than the
    cutoff: at a cutoff at, between and around every run's newest row they must be
    exactly the runs of the state older than it, as the runs list's facts say."""
    store = shapes.backend.store
    page = store.list_runs(RunQuery(limit=100))
    facts = {f.execution_id: f for f in page.runs}
    state = {
        eid: runs.run_state(f.last_step_type, f.last_status, f.has_pending)
        for eid, f in facts.items()
    }
    times = sorted({f.last_at for f in facts.values()})
    first, last = runs.parse_time(times[0]), runs.parse_time(times[-1])
    assert first is not None and last is not None
    # Before every run, at each run's newest row, and after every run.
    cutoffs = [runs.cutoff(first, 1.0), *times, runs.cutoff(last, -1.0)]
    totals = store.totals()
    seen_stalled, seen_overdue = set(), set()
    for cutoff in cutoffs:
        fleet = store.fleet_counts(cutoff, cutoff)

        assert fleet is not None
        stalled = sum(state[e] == runs.UNFINISHED and f.last_at < cutoff for e, f in facts.items())
        overdue = sum(state[e] == runs.PAUSED and f.last_at < cutoff for e, f in facts.items())
        assert (fleet.attention.stalled, fleet.attention.overdue) == (stalled, overdue), cutoff
        assert fleet.attention == store.attention_counts(cutoff, cutoff), cutoff
        seen_stalled.add(stalled)
        seen_overdue.add(overdue)
    assert len(seen_stalled) > 2 and len(seen_overdue) > 2, "the cutoffs split no runs"
    assert {s: n for s, n in fleet.states.items() if n} == page.counts
    assert (fleet.rows_waiting, fleet.rows_quarantined) == (
        totals.rows_waiting,
        totals.rows_quarantined,
    )
    assert fleet.rows_quarantined == 1
    assert fleet.pending == store.count_pending() > 0
