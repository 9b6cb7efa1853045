"""The runs index on PostgreSQL: one row per run, kept by the app in its own schema.

The runs list orders runs by their newest row and counts them by state. Over the
SDK's tables that is an aggregate of every checkpoint per request (about a
second at 100,000 runs), and the app may not add to the SDK's tables. So it
keeps this summary in ``--pg-app-schema``, shared by every localui process on
the database, brought up to date before answering.

- :mod:`.schema`: its tables, triggers and indexes;
- :mod:`.sync`: the catch-up, the build and how processes take turns;
- :mod:`.query`: the reads.

While a large store is first indexed the app answers at once: the runs list's
first page, unfiltered, is the runs written to most recently, read from the
store; anything that needs the whole index (filters, counts, later pages)
waits for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localui.backends.postgres.index import query
from localui.backends.postgres.index.schema import Tables
from localui.backends.postgres.index.sync import (
    BACKGROUND_FROM_ROWS,
    BUILD_CHUNK_ROWS,
    IndexSync,
    StoreSql,
)
from localui.errors import Unavailable
from localui.records import (
    AttentionCounts,
    AttentionPage,
    AttentionQuery,
    FleetCounts,
    IndexProgress,
    RunFactsPage,
    RunQuery,
)

__all__ = ["BACKGROUND_FROM_ROWS", "BUILD_CHUNK_ROWS", "PgRunIndex", "StoreSql"]


class PgRunIndex:
    """The summary of one PostgreSQL store's runs, brought up to date on each read."""

    def __init__(
        self,
        dsn: str,
        *,
        store_schema: str,
        app_schema: str,
        store_sql: Callable[[], StoreSql | None],
        background_from_rows: int = BACKGROUND_FROM_ROWS,
        chunk_rows: int = BUILD_CHUNK_ROWS,
    ) -> None:
        self.tables = Tables(app_schema=app_schema, store_schema=store_schema)
        self._sync = IndexSync(
            dsn,
            self.tables,
            store_sql,
            background_from_rows=background_from_rows,
            chunk_rows=chunk_rows,
        )

    @property
    def has_trigrams(self) -> bool:
        """Whether text search has a trigram index (``pg_trgm`` could be used)."""
        return self._sync.has_trigrams

    def refresh(self) -> bool:
        """Bring the index up to date; False while a background build runs."""
        return self._sync.refresh()

    def complete(self) -> None:
        self._sync.complete()

    def progress(self) -> IndexProgress | None:
        return self._sync.progress()

    def listed(self, execution_id: str) -> bool:
        """Whether the index lists the run, without bringing it up to date first."""

        def work(cur: Any) -> bool:
            cur.execute(
                f"SELECT 1 FROM {self.tables.runs} WHERE execution_id = %s", (execution_id,)
            )
            return cur.fetchone() is not None

        return self._sync.read(work)

    def list_runs(self, runs_query: RunQuery) -> RunFactsPage:
        """A page from the index, which must be complete (see :meth:`refresh`)."""
        return self._sync.read(lambda cur: query.list_runs(cur, self.tables, runs_query))

    def _ready(self) -> None:
        """Up to date, or :class:`Unavailable` at once while a first build runs: what
        needs attention is asked on every page (the nav's count), which must not wait."""
        if not self._sync.refresh():
            raise Unavailable(
                "this store's runs are being indexed: what needs attention is known once"
                " that is done"
            )

    def list_attention(self, attention: AttentionQuery) -> AttentionPage:
        """The runs that need a person, from the whole index."""
        self._ready()
        return self._sync.read(lambda cur: query.list_attention(cur, self.tables, attention))

    def attention_counts(self, stale_before: str, overdue_before: str) -> AttentionCounts:
        self._ready()
        return self._sync.read(
            lambda cur: query.attention_counts(cur, self.tables, stale_before, overdue_before)
        )

    def fleet_counts(self, stale_before: str, overdue_before: str) -> FleetCounts | None:
        """Runs per state, what needs attention and the outbox totals after one catch-up,
        in one statement; None while a first build runs (those wait for it)."""
        if not self._sync.refresh():
            if self._sync.progress() is not None:
                return None
            self._sync.complete()
        store = self._sync.store_sql()
        pending = store.pending if store is not None else None
        return self._sync.read(
            lambda cur: query.fleet_counts(
                cur, self.tables, stale_before, overdue_before, pending=pending
            )
        )

    def totals(self) -> tuple[int, int, int]:
        self._sync.complete()
        return self._sync.read(lambda cur: query.totals(cur, self.tables))

    def close(self) -> None:
        self._sync.close()
