"""The runs index on PostgreSQL agrees with the SDK's rows: every filter and search
text, two processes catching up at once, a prune."""

from __future__ import annotations

import contextvars
import html
import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from localui.backends import looks
from localui.backends.postgres.prune import PostgresPrune
from localui.backends.postgres.store import PostgresStore
from localui.records import RunFacts, RunQuery
from localui.runs import run_state

TEXTS = {"zz", "-", "A-", '"', '"order_id"', "NO-SUCH-TEXT", "Bot", "refund-BOT", "ap"}


def open_store(pg_store: Any, **options: Any) -> PostgresStore:
    return PostgresStore(
        pg_store.dsn, schema=pg_store.schema, app_schema=pg_store.app_schema, **options
    )


@pytest.fixture
def indexed(pg_store: Any) -> Iterator[PostgresStore]:
    store = open_store(pg_store)
    assert store.runs_index is not None
    try:
        yield store
    finally:
        store.close()


def all_runs(store: PostgresStore, query: RunQuery) -> tuple[list[RunFacts], dict[str, int]]:
    """Every page of a query, followed by its keys, and the first page's counts."""
    found: list[RunFacts] = []
    page = store.list_runs(query)
    counts = page.counts
    found.extend(page.runs)
    while page.next_key is not None:
        page = store.list_runs(
            RunQuery(
                state=query.state,
                agent=query.agent,
                text=query.text,
                outbox=query.outbox,
                limit=query.limit,
                after=page.next_key,
            )
        )
        found.extend(page.runs)
    return found, counts


def searched_fields(raw: Any) -> dict[str, list[str]]:
    """What text search looks in, per run, from the SDK's rows: id, agent, pause
    reason and each tool call's arguments."""
    fields: dict[str, list[str]] = {}
    for row in raw.query(
        "SELECT execution_id, chain_name, node_id, node_input::text AS node_input"
        " FROM {s}.checkpoints ORDER BY created_at"
    ):
        run = fields.setdefault(row["execution_id"], [row["execution_id"], row["chain_name"]])
        if "/tool:" in row["node_id"] and row["node_input"]:
            run.append(row["node_input"])
    for row in raw.query("SELECT execution_id, reason FROM {s}.pending_interrupts"):
        fields[row["execution_id"]].append(row["reason"] or "")
    return fields


def test_every_filter_agrees_with_the_sdks_rows(pg_store: Any, indexed: PostgresStore) -> None:
    """Each filter (state, agent, outbox, text) alone and together, paged three runs
    at a time, gives what the plain query over the SDK's rows gives."""
    plain = open_store(pg_store, runs_index=False)
    try:
        agents = {f.agent for f in plain.list_runs(RunQuery(limit=1000)).runs}
        assert len(agents) >= 1
        states = [None, "completed", "failed", "paused", "orphaned", "unfinished"]
        for state, agent, outbox, text in itertools.product(
            states, [None, *sorted(agents)], [None, "waiting", "quarantined"], [None, "ap", "Bot"]
        ):
            query = RunQuery(state=state, agent=agent, outbox=outbox, text=text, limit=3)
            assert all_runs(indexed, query) == all_runs(plain, query), query
    finally:
        plain.close()


def test_text_search_finds_exactly_the_runs_holding_the_text(
    pg_store: Any, indexed: PostgresStore
) -> None:
    """Trigram lookups (3 characters or more) and shorter texts agree with a plain
    substring test over each run's id, agent, pause reason and tool arguments."""
    assert indexed.runs_index is not None and indexed.runs_index.has_trigrams
    fields = searched_fields(pg_store.raw)
    texts = set(TEXTS)
    for run in fields.values():
        for field in run:
            texts.update({field[:3], field[2:9], field[-5:].upper()})
    for text in sorted(t for t in texts if t.strip()):
        expected = {
            eid for eid, run in fields.items() if any(text.lower() in f.lower() for f in run)
        }
        page = indexed.list_runs(RunQuery(text=text, limit=1000))
        assert {f.execution_id for f in page.runs} == expected, text
        assert sum(page.counts.values()) == len(expected), text


def test_a_search_asked_again_and_again_is_never_held_prepared(indexed: PostgresStore) -> None:
    """psycopg prepares a statement run five times on a connection, and PostgreSQL's
    generic plan for ``search ILIKE $1`` cannot know the text: at a million runs it
    walked every run in time order (0.8 s) instead of asking the trigram index (7 ms).
    A search is planned for its text each time, so no connection holds it prepared."""
    index = indexed.runs_index
    assert index is not None
    for _ in range(12):
        page = indexed.list_runs(RunQuery(text="refund", limit=3))
        assert page.runs
    held: list[str] = []
    for _ in range(8):  # every connection of the pool in turn
        held += index._sync.read(
            lambda cur: [
                r["statement"]
                for r in cur.execute("SELECT statement FROM pg_prepared_statements").fetchall()
            ]
        )
    assert held, "the index's other statements are prepared as usual"
    assert not [s for s in held if "ILIKE" in s], held


def test_two_reads_of_one_page_at_once_bring_the_index_up_to_date_once(
    indexed: PostgresStore,
) -> None:
    """A page reads its nav's counts beside its own reads, in another worker thread of
    the same look: whichever comes second waits for the first one's catch-up and reads
    the index as of it, without a round trip of its own."""
    index = indexed.runs_index
    assert index is not None
    sync = index._sync
    original = sync._read_gate
    gates: list[object] = []

    def read_gate(cur: Any, store: Any) -> Any:
        gates.append(store)
        time.sleep(0.2)  # long enough for the other read to arrive meanwhile
        return original(cur, store)

    sync._read_gate = read_gate  # type: ignore[method-assign]
    with looks.one_look():
        reads = [threading.Thread(target=contextvars.copy_context().run, args=(sync.refresh,))]
        reads.append(threading.Thread(target=contextvars.copy_context().run, args=(sync.refresh,)))
        for read in reads:
            read.start()
        for read in reads:
            read.join()
    assert len(gates) == 1
    with looks.one_look():
        sync.refresh()
    assert len(gates) == 2, "the next page looks again"


def index_rows(pg_store: Any, store: PostgresStore) -> list[list[dict[str, Any]]]:
    """Every table of the index but the window of seen rows, in a stable order."""
    index = store.runs_index
    assert index is not None
    t = index.tables
    return [
        pg_store.raw.query(f"SELECT * FROM {t.runs} ORDER BY execution_id"),
        pg_store.raw.query(f"SELECT * FROM {t.counts} WHERE n > 0 ORDER BY state"),
        pg_store.raw.query(f"SELECT * FROM {t.totals}"),
    ]


def write_runs(pg_store: Any, tmp_path: Path, scenarios: list[str]) -> list[str]:
    """Runs the real SDK writes into the store, from a child process each."""
    ids = []
    for scenario in scenarios:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "localui.demo.worker",
                "--store",
                pg_store.dsn,
                "--pg-schema",
                pg_store.schema,
                "--scenario",
                scenario,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        ids.append(out.stdout.strip().splitlines()[-1])
    return ids


_CATCH_UP = """
import sys, time
from localui.backends.postgres.store import PostgresStore
from localui.records import RunQuery
dsn, schema, app_schema, start = sys.argv[1:5]
store = PostgresStore(dsn, schema=schema, app_schema=app_schema)
while time.time() < float(start):
    time.sleep(0.001)
for _ in range(20):
    store.list_runs(RunQuery(limit=5))
store.runs_index.complete()
store.close()
"""


def catch_up_at_once(pg_store: Any, processes: int = 2) -> None:
    start = time.time() + 3.0
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CATCH_UP,
                pg_store.dsn,
                pg_store.schema,
                pg_store.app_schema,
                str(start),
            ]
        )
        for _ in range(processes)
    ]
    for child in children:
        assert child.wait(timeout=120) == 0


def test_two_processes_catching_up_at_once_agree_with_one_alone(
    pg_store: Any, tmp_path: Path
) -> None:
    """Two processes build the index at the same moment, then both catch up with new
    runs at the same moment: the index equals one built alone, in another schema."""
    catch_up_at_once(pg_store)
    write_runs(pg_store, tmp_path, ["paused-1", "completed"])
    catch_up_at_once(pg_store)
    shared = open_store(pg_store)
    alone_schema = pg_store.app_schema + "_alone"
    alone = PostgresStore(pg_store.dsn, schema=pg_store.schema, app_schema=alone_schema)
    try:
        # Nothing was written since: reading the shared one changes nothing.
        before = index_rows(pg_store, shared)
        shared.list_runs(RunQuery())
        alone.list_runs(RunQuery())
        assert index_rows(pg_store, shared) == before
        assert index_rows(pg_store, alone) == before
        assert len(before[0]) == len(
            pg_store.raw.query("SELECT DISTINCT execution_id FROM {s}.checkpoints")
        )
    finally:
        shared.close()
        alone.close()
        pg_store.raw.execute(f"DROP SCHEMA IF EXISTS {alone_schema} CASCADE")


def test_a_prune_leaves_the_index_right(pg_store: Any, indexed: PostgresStore) -> None:
    """The SDK's prune deletes finished runs' rows: the index follows, states and
    counts as the SDK's rows say."""
    before = indexed.list_runs(RunQuery(limit=1000))
    assert before.counts.get("completed")
    deleted = PostgresPrune(pg_store.dsn, schema=pg_store.schema).prune(timedelta(0))
    assert deleted > 0
    plain = open_store(pg_store, runs_index=False)
    try:
        expected = plain.list_runs(RunQuery(limit=1000))
        assert expected.counts != before.counts
        # The server publishes the deletes count when the pruning session ends.
        deadline = time.monotonic() + 15
        while indexed.list_runs(RunQuery(limit=1000)) != expected:
            assert time.monotonic() < deadline, "the index never caught up with the prune"
            time.sleep(0.2)
        totals = indexed.totals()
        assert totals == plain.totals()
        states = {
            f.execution_id: run_state(f.last_step_type, f.last_status, f.has_pending)
            for f in expected.runs
        }
        assert "completed" not in states.values()
    finally:
        plain.close()


def test_a_large_store_answers_its_first_page_at_once_then_fills_in(pg_store: Any) -> None:
    """Indexed in the background (any store counts as large here): the first page,
    unfiltered, comes from the SDK's rows at once, newest first; then the index."""
    import psycopg

    store = open_store(pg_store, index_background_from_rows=0)
    plain = open_store(pg_store, runs_index=False)
    assert store.runs_index is not None
    # Another process holds the index's lock (as while it builds): the build waits.
    other = psycopg.connect(pg_store.dsn, autocommit=True)
    other.execute("SELECT pg_advisory_lock(hashtext(%s))", (store.runs_index.tables.lock_key,))
    try:
        expected = plain.list_runs(RunQuery(limit=4))
        started = time.perf_counter()
        first = store.list_runs(RunQuery(limit=4))
        assert time.perf_counter() - started < 1.0
        assert first.indexing is not None
        assert first.runs == expected.runs
        assert first.counts == {}
        other.close()
        store.runs_index.complete()
        assert store.list_runs(RunQuery(limit=4)) == expected
        assert store.list_runs(RunQuery(state="paused")) == plain.list_runs(
            RunQuery(state="paused")
        )
    finally:
        other.close()
        store.close()
        plain.close()


_BUILD_IN_CHUNKS = """
import sys
from localui.backends.postgres.store import PostgresStore
dsn, schema, app_schema = sys.argv[1:4]
store = PostgresStore(
    dsn, schema=schema, app_schema=app_schema,
    index_background_from_rows=0, index_chunk_rows=1,
)
store.runs_index.complete()
store.close()
"""


def kill_a_build_mid_way(pg_store: Any, attempts: int = 5) -> str:
    """Start a build of a run per chunk in a child process and kill it once some
    chunks have committed and others have not; the build's cursor then."""
    import psycopg

    probe = open_store(pg_store, index_background_from_rows=10**9)
    assert probe.runs_index is not None
    t = probe.runs_index.tables
    probe.close()
    with psycopg.connect(pg_store.dsn, autocommit=True) as watcher:
        for _ in range(attempts):
            watcher.execute(f"DELETE FROM {t.meta} WHERE key <> 'version'")
            watcher.execute(f"TRUNCATE {t.runs}, {t.counts}, {t.seen}")
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _BUILD_IN_CHUNKS,
                    pg_store.dsn,
                    pg_store.schema,
                    pg_store.app_schema,
                ]
            )
            try:
                while child.poll() is None:
                    meta = dict(watcher.execute(f"SELECT key, value FROM {t.meta}").fetchall())
                    if meta.get("build_after"):
                        break
                # Between two of its chunks: the child waits for this lock, then dies.
                watcher.execute("SELECT pg_advisory_lock(hashtext(%s))", (t.lock_key,))
                try:
                    meta = dict(watcher.execute(f"SELECT key, value FROM {t.meta}").fetchall())
                    child.kill()
                    child.wait(timeout=30)
                finally:
                    watcher.execute("SELECT pg_advisory_unlock(hashtext(%s))", (t.lock_key,))
            finally:
                child.kill()
                child.wait(timeout=30)
            if meta.get("build_after") and meta.get("built") != "1":
                folded = watcher.execute(f"SELECT COUNT(*) FROM {t.runs}").fetchone()
                assert folded is not None and folded[0] > 0
                return meta["build_after"]
    raise AssertionError(f"the build was never caught mid-way in {attempts} attempts")


def test_a_build_cut_short_is_finished_by_the_next_start(pg_store: Any) -> None:
    """A large store is built a chunk of runs per transaction. The process building
    it is killed between two chunks; the next start goes on from the build's cursor
    and leaves an index equal to one built alone, in another schema."""
    cursor = int(kill_a_build_mid_way(pg_store))
    runs = [
        r["execution_id"] for r in pg_store.raw.query("SELECT execution_id FROM {s}.checkpoints")
    ]
    [table] = pg_store.raw.query(
        "SELECT pg_relation_size('{s}.checkpoints') / current_setting('block_size')::int AS n"
    )
    # The cursor is a block of the SDK's table: the build walks it block by block.
    assert 0 < cursor < table["n"]
    resumed = open_store(pg_store, index_background_from_rows=0, index_chunk_rows=3)
    assert resumed.runs_index is not None
    # The runs whose rows all lie before the cursor: folded before the kill.
    folded_sql = (
        f"SELECT execution_id, xmin::text AS version FROM {resumed.runs_index.tables.runs}"
        " WHERE execution_id IN (SELECT execution_id FROM {s}.checkpoints GROUP BY execution_id"
        " HAVING MAX((ctid::text::point)[0]) < %s) ORDER BY execution_id"
    )
    folded_before = pg_store.raw.query(folded_sql, (cursor,))
    assert folded_before
    alone_schema = pg_store.app_schema + "_alone"
    alone = PostgresStore(pg_store.dsn, schema=pg_store.schema, app_schema=alone_schema)
    try:
        resumed.runs_index.complete()
        # Went on from the cursor: the runs folded before the kill were not folded again.
        assert pg_store.raw.query(folded_sql, (cursor,)) == folded_before
        alone.list_runs(RunQuery())
        assert index_rows(pg_store, resumed) == index_rows(pg_store, alone)
        assert len(index_rows(pg_store, resumed)[0]) == len(set(runs))
        plain = open_store(pg_store, runs_index=False)
        try:
            assert resumed.list_runs(RunQuery(limit=1000)) == plain.list_runs(RunQuery(limit=1000))
        finally:
            plain.close()
        search_index = f"{pg_store.app_schema}.{resumed.runs_index.tables.index('search')}"
    finally:
        resumed.close()
        alone.close()
        pg_store.raw.execute(f"DROP SCHEMA IF EXISTS {alone_schema} CASCADE")
    # Once every run is folded, the trigram index is made (closing waits for it).
    [made] = pg_store.raw.query("SELECT to_regclass(%s) IS NOT NULL AS made", (search_index,))
    assert made["made"]


def test_a_prune_after_a_build_cut_short_leaves_the_index_right(pg_store: Any) -> None:
    """Rows deleted (a prune) while a build is under way: runs already folded may be
    gone. The next start folds every range again and the index is the store's."""
    kill_a_build_mid_way(pg_store)
    assert PostgresPrune(pg_store.dsn, schema=pg_store.schema).prune(timedelta(0)) > 0
    resumed = open_store(pg_store, index_background_from_rows=0, index_chunk_rows=3)
    plain = open_store(pg_store, runs_index=False)
    try:
        assert resumed.runs_index is not None
        expected = plain.list_runs(RunQuery(limit=1000))
        # The server publishes the deletes count when the pruning session ends.
        deadline = time.monotonic() + 15
        while True:
            resumed.runs_index.complete()
            if resumed.list_runs(RunQuery(limit=1000)) == expected:
                break
            assert time.monotonic() < deadline, "the index never caught up with the prune"
            time.sleep(0.2)
        assert resumed.totals() == plain.totals()
    finally:
        resumed.close()
        plain.close()


def analyzed_by_localui(pg_store: Any, store: PostgresStore) -> bool:
    """Whether the runs table has statistics from an ``ANALYZE`` this app ran (autovacuum's
    own, perhaps a minute later, are counted apart, in ``last_autoanalyze``)."""
    assert store.runs_index is not None
    [row] = pg_store.raw.query(
        "SELECT last_analyze IS NOT NULL AS analyzed FROM pg_stat_user_tables"
        " WHERE relid = to_regclass(%s)",
        (store.runs_index.tables.runs,),
    )
    return bool(row["analyzed"])


def runs_table_options(pg_store: Any, store: PostgresStore) -> list[str] | None:
    """The storage options set on the runs index's table (None: the server's own)."""
    assert store.runs_index is not None
    [table] = pg_store.raw.query(
        "SELECT reloptions FROM pg_class WHERE oid = to_regclass(%s)",
        (store.runs_index.tables.runs,),
    )
    options: list[str] | None = table["reloptions"]
    return options


@pytest.mark.parametrize("in_chunks", [False, True], ids=["at-once", "in-chunks"])
def test_a_build_leaves_the_planner_its_statistics(pg_store: Any, in_chunks: bool) -> None:
    """A fresh index has statistics as soon as it is built, at once or in chunks: without
    them a run page's lookup of its forks scanned every run until autovacuum came by."""
    options = {"index_background_from_rows": 0, "index_chunk_rows": 3} if in_chunks else {}
    store = open_store(pg_store, **options)
    try:
        assert store.runs_index is not None
        assert not analyzed_by_localui(pg_store, store)
        store.runs_index.complete()
        assert analyzed_by_localui(pg_store, store)
        [stats] = pg_store.raw.query(
            "SELECT COUNT(*) AS n FROM pg_stats WHERE schemaname = %s AND attname = 'fork_parent'",
            (pg_store.app_schema,),
        )
        assert stats["n"] == 1
        # Autovacuum, kept off the runs table while a first build in chunks inserts,
        # looks after it again once the build is done.
        assert runs_table_options(pg_store, store) is None
    finally:
        store.close()


def test_a_first_build_in_chunks_keeps_autovacuum_away_until_it_is_done(pg_store: Any) -> None:
    store = open_store(pg_store, index_background_from_rows=0, index_chunk_rows=1)
    try:
        assert store.runs_index is not None
        assert not store.runs_index.refresh()  # the build has begun, in the background
        options = []
        while store.runs_index.progress() is not None:
            options.append(runs_table_options(pg_store, store))
        store.runs_index.complete()
        assert ["autovacuum_enabled=false"] in options
        assert runs_table_options(pg_store, store) is None
    finally:
        store.close()


def test_closing_during_a_build_stops_it_between_chunks(pg_store: Any) -> None:
    """Closing the store (the app shutting down) while a large store is first indexed
    does not wait for the whole build: it stops after the chunk under way, and the
    next start goes on from its cursor to an index equal to the store's runs."""
    import threading

    import psycopg

    store = open_store(pg_store, index_background_from_rows=0, index_chunk_rows=1)
    assert store.runs_index is not None
    t = store.runs_index.tables
    other = psycopg.connect(pg_store.dsn, autocommit=True)
    # Held as while another process folds a chunk: the build waits before its first.
    other.execute("SELECT pg_advisory_lock(hashtext(%s))", (t.lock_key,))
    closing = threading.Thread(target=store.close)
    try:
        assert store.list_runs(RunQuery(limit=4)).indexing is not None
        # The build is waiting for the lock (its first step, before anything is done).
        while not other.execute(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone():
            time.sleep(0.01)
        closing.start()
        while not store.runs_index._sync._closing:
            time.sleep(0.01)
    finally:
        other.close()
    closing.join(timeout=60)
    assert not closing.is_alive()
    meta = {r["key"]: r["value"] for r in pg_store.raw.query(f"SELECT key, value FROM {t.meta}")}
    assert meta.get("built") != "1"
    assert "build_upto" in meta
    resumed = open_store(pg_store, index_background_from_rows=0, index_chunk_rows=1)
    plain = open_store(pg_store, runs_index=False)
    try:
        assert resumed.runs_index is not None
        resumed.runs_index.complete()
        assert resumed.list_runs(RunQuery(limit=1000)) == plain.list_runs(RunQuery(limit=1000))
    finally:
        resumed.close()
        plain.close()


def test_a_prune_after_a_build_in_chunks_leaves_the_index_right(pg_store: Any) -> None:
    """A complete index built in chunks, then a prune: the rebuild walks the SDK's
    blocks again and sweeps out the runs the prune emptied, a chunk at a time."""
    store = open_store(pg_store, index_background_from_rows=0, index_chunk_rows=3)
    plain = open_store(pg_store, runs_index=False)
    try:
        assert store.runs_index is not None
        store.runs_index.complete()
        before = store.list_runs(RunQuery(limit=1000))
        assert before == plain.list_runs(RunQuery(limit=1000))
        assert PostgresPrune(pg_store.dsn, schema=pg_store.schema).prune(timedelta(0)) > 0
        expected = plain.list_runs(RunQuery(limit=1000))
        assert len(expected.runs) < len(before.runs)
        # The server publishes the deletes count when the pruning session ends.
        deadline = time.monotonic() + 15
        while True:
            store.runs_index.complete()
            if store.list_runs(RunQuery(limit=1000)) == expected:
                break
            assert time.monotonic() < deadline, "the index never caught up with the prune"
            time.sleep(0.2)
        assert store.totals() == plain.totals()
    finally:
        store.close()
        plain.close()


def holding_the_walk(sync: Any, walked: threading.Event, go: threading.Event) -> Any:
    """The index walk's own step, wrapped to wait between two chunks (no real part can
    hold a thread between two of its transactions and not the looks beside it):
    ``walked`` is set once it waits, ``go`` lets it on."""
    step = sync._build_step

    def held_between_chunks(conn: Any, cur: Any) -> bool:
        done = step(conn, cur)
        if not done and not go.is_set():
            walked.set()
            go.wait(60)
        return done

    return held_between_chunks


def test_a_run_written_while_a_prune_is_folded_in_is_listed_at_once(
    pg_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a prune the index is walked again, chunk by chunk (a minute at a million
    runs); a run written meanwhile is listed at the next look, not when the walk ends.
    The walk is held between two chunks (its own step wrapped to wait: no real part can
    hold a thread between two of its transactions and not the looks beside it) while
    the run is written and the list read."""
    store = open_store(pg_store, index_background_from_rows=0, index_chunk_rows=1)
    plain = open_store(pg_store, runs_index=False)
    assert store.runs_index is not None
    sync = store.runs_index._sync
    walked, go = threading.Event(), threading.Event()
    held_between_chunks = holding_the_walk(sync, walked, go)

    try:
        store.runs_index.complete()
        monkeypatch.setattr(sync, "_build_step", held_between_chunks)
        assert PostgresPrune(pg_store.dsn, schema=pg_store.schema).prune(timedelta(0)) > 0
        # The server publishes the deletes count when the pruning session ends.
        deadline = time.monotonic() + 15
        while not walked.is_set():
            store.list_runs(RunQuery(limit=4))
            assert time.monotonic() < deadline, "the prune was never noticed"
            time.sleep(0.05)
        [new] = write_runs(pg_store, tmp_path, ["completed"])
        listed = store.list_runs(RunQuery(limit=1000))
        assert listed.indexing is None
        assert new in [r.execution_id for r in listed.runs]
        builder = sync._builder
        assert builder is not None  # still held: the walk has not finished
        go.set()
        builder.join(60)
        store.runs_index.complete()
        assert store.list_runs(RunQuery(limit=1000)) == plain.list_runs(RunQuery(limit=1000))
        assert store.totals() == plain.totals()
    finally:
        go.set()
        store.close()
        plain.close()


def test_a_run_pruned_while_the_index_is_walked_again_says_it_was_deleted(
    pg_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the index is walked again after a prune, the runs list answers from the
    index as it was, pruned runs included: such a run's page, its compare and its bundle
    say the run's rows were deleted since the list was read, not that no such run
    exists (which an unknown id still gets). The walk is held between two chunks as
    in the test above."""
    from conftest import BASE_URL
    from helpers import LOOPBACK_CLIENT
    from starlette.testclient import TestClient

    from localui.app import create_app
    from localui.backends.postgres import PostgresBackend

    store = open_store(pg_store, index_background_from_rows=0, index_chunk_rows=1)
    plain = open_store(pg_store, runs_index=False)
    assert store.runs_index is not None
    sync = store.runs_index._sync
    walked, go = threading.Event(), threading.Event()
    held_between_chunks = holding_the_walk(sync, walked, go)

    backend = PostgresBackend(
        pg_store.dsn, schema=pg_store.schema, app_schema=pg_store.app_schema, store=store
    )
    app = create_app(pg_store.settings(), backend=backend)
    try:
        with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
            store.runs_index.complete()
            listed = {r.execution_id for r in store.list_runs(RunQuery(limit=1000)).runs}
            monkeypatch.setattr(sync, "_build_step", held_between_chunks)
            assert PostgresPrune(pg_store.dsn, schema=pg_store.schema).prune(timedelta(0)) > 0
            kept = {r.execution_id for r in plain.list_runs(RunQuery(limit=1000)).runs}
            deadline = time.monotonic() + 15
            while not walked.is_set():
                store.list_runs(RunQuery(limit=4))
                assert time.monotonic() < deadline, "the prune was never noticed"
                time.sleep(0.05)
            pruned = sorted(listed - kept)
            assert pruned and kept
            gone = pruned[0]
            # Still listed: the walk has not swept it out.
            assert store.listed(gone) and store.get_run(gone) is None
            said = "is no longer in this store: its rows were deleted"
            for url in (
                f"/runs/{gone}",
                f"/runs/{gone}.json",
                f"/runs/{gone}/bundle",
                f"/runs/{gone}/fork.json",
            ):
                answer = client.get(url)
                assert answer.status_code == 404, (url, answer.text)
                assert said in html.unescape(answer.text), (url, answer.text)
            other = sorted(kept)[0]
            compared = client.get("/compare.json", params={"a": other, "b": gone})
            assert compared.status_code == 404
            assert f"b: run {gone!r} {said}" in compared.json()["error"]["message"]
            unknown = client.get("/runs/no-such-run")
            assert unknown.status_code == 404
            assert "no run with execution id 'no-such-run'" in html.unescape(unknown.text)
            assert said not in html.unescape(unknown.text)
            go.set()
            deadline = time.monotonic() + 30
            while store.listed(gone):
                store.runs_index.complete()
                assert time.monotonic() < deadline, "the walk never swept the pruned run out"
                time.sleep(0.1)
            # Swept out: now it is an unknown id like any other.
            after = client.get(f"/runs/{gone}")
            assert after.status_code == 404 and said not in html.unescape(after.text)
    finally:
        go.set()
        plain.close()


def test_a_run_written_while_the_search_index_is_made_is_listed_at_once(
    pg_store: Any, tmp_path: Path
) -> None:
    """The trigram index a first build in chunks makes last takes a while at a million
    runs; meanwhile runs written elsewhere must still reach the runs list, so it is made
    concurrently and the catch-ups go on beside it. Here an open snapshot in another
    connection holds the concurrent build at its end for as long as the test needs."""
    import psycopg

    store = open_store(pg_store, index_background_from_rows=0, index_chunk_rows=3)
    assert store.runs_index is not None
    t = store.runs_index.tables
    holder = psycopg.connect(pg_store.dsn)
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1").fetchone()  # a snapshot: CREATE INDEX CONCURRENTLY waits
    try:
        deadline = time.monotonic() + 60
        while True:
            store.list_runs(RunQuery(limit=4))
            building = pg_store.raw.query(
                "SELECT 1 AS x FROM pg_stat_activity"
                " WHERE starts_with(query, 'CREATE INDEX CONCURRENTLY') AND state = 'active'"
            )
            if building:
                break
            assert time.monotonic() < deadline, "the search index was never begun"
            time.sleep(0.05)
        [new] = write_runs(pg_store, tmp_path, ["completed"])
        listed = store.list_runs(RunQuery(limit=4))
        assert listed.indexing is None
        assert new in [r.execution_id for r in listed.runs]
        # The search index is still being made (held by the snapshot above).
        meta = {r["key"]: r["value"] for r in pg_store.raw.query(f"SELECT * FROM {t.meta}")}
        assert "search_index_pending" in meta, meta
    finally:
        holder.rollback()
        holder.close()
        store.runs_index.complete()
        store.close()
    searched = open_store(pg_store)
    try:
        valid = pg_store.raw.query(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
            (t.qualified_index("search"),),
        )
        assert [r["indisvalid"] for r in valid] == [True]
    finally:
        searched.close()
