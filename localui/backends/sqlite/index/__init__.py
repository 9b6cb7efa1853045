"""The runs index: one row per run, kept by the app in a file of its own.

The runs list orders runs by their newest row and counts them by state. Over
the SDK's own tables that is a scan and a sort of every checkpoint on every
request (seconds at 100,000 runs), and the app may not add indexes to the SDK's
tables. So the app keeps this summary in a SQLite file beside its cache, with
the store ATTACHed read-only, and brings it up to date before answering.

- :mod:`.schema`: where the file lives, its tables, triggers and bookkeeping;
- :mod:`.sync`: the catch-up engine and the background build;
- :mod:`.query`: the reads, rows by column name.

While a large store is first indexed the app answers at once: the runs list
shows the runs written to most recently, read straight from the store, and says
how far the indexing has got; one run's facts are read straight from its rows;
everything that needs the whole index (filters, counts, totals) waits for it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from localui.backends.sqlite.index import query
from localui.backends.sqlite.index.sync import BACKGROUND_FROM_ROWS, IndexSync, StoreColumns
from localui.errors import Unavailable
from localui.records import (
    AttentionCounts,
    AttentionPage,
    AttentionQuery,
    FleetCounts,
    IndexProgress,
    RunFacts,
    RunFactsPage,
    RunQuery,
)

__all__ = ["BACKGROUND_FROM_ROWS", "RunIndex", "StoreColumns"]


class RunIndex:
    """The summary of one store's runs, brought up to date on each read."""

    def __init__(
        self,
        store_path: Path,
        *,
        columns: Callable[[], StoreColumns | None],
        index_dir: Path | None = None,
        busy_timeout: float = 10.0,
        background_from_rows: int = BACKGROUND_FROM_ROWS,
    ) -> None:
        """``columns`` says how to read the store's checkpoints, or None when it has none."""
        self._sync = IndexSync(
            store_path,
            columns=columns,
            index_dir=index_dir,
            busy_timeout=busy_timeout,
            background_from_rows=background_from_rows,
        )
        self.path = self._sync.path
        self.store_path = self._sync.store_path

    def refresh(self) -> bool:
        """Bring the index up to date; False while a background build runs."""
        return self._sync.refresh()

    def progress(self) -> IndexProgress | None:
        """How far a background build has got, or None when none runs."""
        return self._sync.progress()

    def close(self) -> None:
        self._sync.close()

    def get_run(self, execution_id: str) -> RunFacts | None:
        sync = self._sync
        if not sync.refresh():
            columns = sync.columns()
            if columns is None:
                return None
            with sync.lock:
                found = query.from_store(sync.conn, columns, [execution_id])
            return found[0] if found else None
        with sync.lock:
            return query.get_run(sync.conn, execution_id)

    def listed(self, execution_id: str) -> bool:
        """Whether the index lists the run, without bringing it up to date first (a
        background build's transaction is not seen until it commits)."""
        with self._sync.lock:
            return query.get_run(self._sync.conn, execution_id) is not None

    def list_runs(self, runs_query: RunQuery) -> RunFactsPage:
        sync = self._sync
        if not sync.refresh():
            progress = sync.progress()
            columns = sync.columns()
            if progress is not None and runs_query == RunQuery(limit=runs_query.limit):
                # The first page, unfiltered: answered now, from the store itself.
                found: list[RunFacts] = []
                if columns is not None:
                    with sync.lock:
                        recent = query.recently_written(sync.conn, runs_query.limit)
                    with sync.lock:
                        found = query.from_store(sync.conn, columns, recent)
                return RunFactsPage(runs=tuple(found), next_key=None, counts={}, indexing=progress)
            sync.complete()
        with sync.lock:
            return query.list_runs(sync.conn, runs_query, has_text_index=sync.text_complete())

    def _ready(self) -> None:
        """Up to date, or :class:`Unavailable` at once while a first build runs: what
        needs attention is asked on every page (the nav's count), which must not wait."""
        if not self._sync.refresh():
            progress = self._sync.progress()
            done = f" ({progress.percent}% read)" if progress is not None else ""
            raise Unavailable(
                f"this store's runs are being indexed{done}: what needs attention is "
                "known once that is done"
            )

    def list_attention(self, attention: AttentionQuery) -> AttentionPage:
        """The runs that need a person, from the whole index."""
        self._ready()
        with self._sync.lock:
            return query.list_attention(self._sync.conn, attention)

    def attention_counts(self, stale_before: str, overdue_before: str) -> AttentionCounts:
        self._ready()
        with self._sync.lock:
            return query.attention_counts(self._sync.conn, stale_before, overdue_before)

    def fleet_counts(
        self, stale_before: str, overdue_before: str, *, pending: bool
    ) -> FleetCounts | None:
        """Runs per state, what needs attention, the outbox totals and the pending pauses
        (``pending``: the store has the table) after one catch-up, in one snapshot; None
        while a first build runs (those wait for it)."""
        sync = self._sync
        if not sync.refresh():
            if sync.progress() is not None:
                return None
            sync.complete()
        with sync.lock:
            return query.fleet_counts(sync.conn, stale_before, overdue_before, pending=pending)

    def resumable_cache_before(self, cutoff: str) -> dict[str, int]:
        """Cache entries older than ``cutoff`` of runs that can still resume, per run."""
        self._sync.complete()
        with self._sync.lock:
            return query.resumable_cache_before(self._sync.conn, cutoff)

    def totals(self) -> tuple[int, int, int]:
        """``(rows, rows waiting for the plane, rows quarantined)`` across the store."""
        self._sync.complete()
        with self._sync.lock:
            return query.totals(self._sync.conn)

    def forks_of(self, execution_id: str) -> list[tuple[str, str, str, str]]:
        """``(fork id, parent checkpoint id, parent node id, fork's first row time)`` of
        the runs forked from any row of this run, oldest first."""
        self._sync.complete()
        columns = self._sync.columns()
        if columns is None:
            return []
        with self._sync.lock:
            return query.forks_of(self._sync.conn, execution_id, columns)
