"""The outbox marking rows synced or quarantined refolds only the runs it marked, on
SQLite and on PostgreSQL.

A store connected to the plane has a drain marking rows all the time, and nearly
every run of a large store has rows waiting: folding them all again on each mark
would read the whole store per catch-up. Which runs the index folded again is read
from what the index did: on SQLite its statements (a run folded again is updated by
id, or deleted by id and inserted anew), on PostgreSQL its table (a run folded again
has a new row version ``xmin``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fastaiagent.checkpointers import SQLiteCheckpointer

from localui.backends.base import Store
from localui.records import RunFacts, RunQuery

if TYPE_CHECKING:
    from conftest import PgStore


@dataclass(frozen=True)
class Marking:
    """A store's read model, the SDK's checkpointer on the same store, and which runs
    the index folded again since the last ask."""

    store: Store
    sdk: Any
    refolded: Callable[[], set[str]]


@pytest.fixture(params=["sqlite", "postgres"])
def marking(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Marking]:
    if request.param == "sqlite":
        from localui.backends.sqlite.store import SQLiteStore

        path: Path = request.getfixturevalue("store_copy")
        sqlite_store = SQLiteStore(path, index_dir=tmp_path / "index")
        # A run folded again is updated in ``runs`` by id, or deleted by id and
        # inserted anew: the index's own statements say which (a rowid may be reused,
        # so it cannot).
        statements: list[str] = []
        sqlite_store._index._sync.conn.set_trace_callback(statements.append)
        by_id = re.compile(r"(?:DELETE FROM|UPDATE) runs .*WHERE execution_id = '([^']*)'", re.S)

        def sqlite_refolded() -> set[str]:
            found = {m.group(1) for s in statements if (m := by_id.fullmatch(s.strip()))}
            statements.clear()
            return found

        yield Marking(sqlite_store, SQLiteCheckpointer(str(path)), sqlite_refolded)
        sqlite_store.close()
        return
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    from localui.backends.postgres.store import PostgresStore

    pg: PgStore = request.getfixturevalue("pg_store")
    pg_store = PostgresStore(pg.dsn, schema=pg.schema, app_schema=pg.app_schema)
    index = pg_store.runs_index
    assert index is not None

    def versions() -> dict[str, str]:
        rows = pg.raw.query(f"SELECT execution_id, xmin::text AS v FROM {index.tables.runs}")
        return {r["execution_id"]: r["v"] for r in rows}

    seen: dict[str, str] = {}

    def pg_refolded() -> set[str]:
        now = versions()
        found = {e for e, v in now.items() if seen.get(e, v) != v}
        seen.clear()
        seen.update(now)
        return found

    sdk = PostgresCheckpointer(pg.dsn, schema=pg.schema)
    yield Marking(pg_store, sdk, pg_refolded)
    sdk.close()
    pg_store.close()


def listed(store: Store) -> dict[str, RunFacts]:
    return {f.execution_id: f for f in store.list_runs(RunQuery(limit=500)).runs}


def oldest_first(facts: dict[str, RunFacts]) -> list[str]:
    return sorted(facts, key=lambda e: (facts[e].last_at, e))


def test_a_marking_folds_again_only_the_runs_it_marked(marking: Marking) -> None:
    """The drain marks rows oldest first, as the SDK's does."""
    before = listed(marking.store)
    assert all(f.rows_waiting == f.row_count for f in before.values())
    marking.refolded()
    synced_run, quarantined_run, *_, newest = oldest_first(before)
    rows = marking.sdk.list(synced_run)
    marking.sdk.mark_synced([r.checkpoint_id for r in rows[:2]])
    [first_row, *_] = marking.sdk.list(quarantined_run)
    marking.sdk.mark_quarantined({first_row.checkpoint_id: "over the plane's size cap"})

    after = listed(marking.store)
    assert marking.refolded() == {synced_run, quarantined_run}
    assert after[synced_run].rows_waiting == len(rows) - 2
    quarantined = after[quarantined_run]
    assert (quarantined.rows_waiting, quarantined.rows_quarantined) == (
        quarantined.row_count - 1,
        1,
    )
    unmarked = set(before) - {synced_run, quarantined_run}
    assert {e: after[e] for e in unmarked} == {e: before[e] for e in unmarked}
    totals = marking.store.totals()
    assert totals.rows_waiting == sum(f.rows_waiting for f in after.values())
    assert totals.rows_quarantined == 1

    # Marked again, later: the runs marked before are not folded a second time (on
    # PostgreSQL the catch-up reads from the newest mark of its last look on, so the
    # run holding that row may be folded once more).
    marking.sdk.mark_synced([r.checkpoint_id for r in marking.sdk.list(newest)])
    assert listed(marking.store)[newest].rows_waiting == 0
    refolded = marking.refolded()
    assert newest in refolded
    assert len(refolded - {newest} - {synced_run, quarantined_run}) == 0
    assert len(refolded) <= 2


def test_rows_marked_out_of_the_drains_order_are_still_counted(marking: Marking) -> None:
    """A mark on a row older than the newest one marked before (another drain, rows
    marked by hand) is outside the range the catch-up reads first: the rows waiting
    behind that newest mark say so. SQLite folds again every run with rows waiting;
    PostgreSQL only the runs whose rows waiting are not what its index holds."""
    facts = listed(marking.store)
    older, *_, newer = oldest_first(facts)
    newest_rows = marking.sdk.list(newer)
    marking.sdk.mark_synced([newest_rows[-1].checkpoint_id])
    assert listed(marking.store)[newer].rows_waiting == len(newest_rows) - 1
    marking.refolded()
    older_rows = marking.sdk.list(older)
    marking.sdk.mark_synced([older_rows[0].checkpoint_id])
    after = listed(marking.store)
    refolded = marking.refolded()
    assert after[older].rows_waiting == len(older_rows) - 1
    assert after[newer].rows_waiting == len(newest_rows) - 1
    assert marking.store.totals().rows_waiting == sum(f.rows_waiting for f in after.values())
    assert older in refolded
    if not isinstance(marking.sdk, SQLiteCheckpointer):
        assert refolded == {older}

    # Nothing marked since: the next look folds nothing again.
    marking.sdk.mark_synced([older_rows[0].checkpoint_id])
    assert listed(marking.store) == after
    assert marking.refolded() <= {older}


def test_a_mark_is_folded_in_place_without_counting_the_whole_store(
    store_copy: Path, tmp_path: Path, seeded: Any
) -> None:
    """A store the plane drains changes every moment without a row added: each look
    folds the marked runs again in place (their searched text is as it was, so their
    trigrams stay as they are) and does not count every row of the store (80 ms at a
    million runs), which only a change that neither adds nor marks rows needs."""
    from localui.backends.sqlite.store import SQLiteStore

    store = SQLiteStore(store_copy, index_dir=tmp_path / "index")
    sdk = SQLiteCheckpointer(str(store_copy))
    try:
        run = seeded.id("completed")
        before = listed(store)[run]
        assert before.rows_waiting == before.row_count
        statements: list[str] = []
        store._index._sync.conn.set_trace_callback(statements.append)

        sdk.mark_synced([r.checkpoint_id for r in sdk.list(run)])
        after = listed(store)

        assert after[run].rows_waiting == 0
        assert store.totals().rows_waiting == sum(f.rows_waiting for f in after.values())
        done = [" ".join(s.split()) for s in statements]
        assert any(s.startswith("UPDATE runs SET") and run in s for s in done), done
        assert not any(s.startswith("DELETE FROM runs") for s in done), done
        assert "SELECT COUNT(*) FROM s.checkpoints" not in done
        # Still found by its text, and counted in its state once.
        found = store.list_runs(RunQuery(text=run[4:20], limit=500))
        assert [f.execution_id for f in found.runs] == [run]
        assert sum(found.counts.values()) == 1

        # A prune deletes rows without a mark: the next look counts the store.
        statements.clear()
        assert sdk.prune(timedelta(seconds=0)) > 0
        listed(store)
        assert "SELECT COUNT(*) FROM s.checkpoints" in [" ".join(s.split()) for s in statements]
    finally:
        sdk.close()
        store.close()
