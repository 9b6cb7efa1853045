"""The read model's one protocol, shared by the SQLite and PostgreSQL stores.

Every method is synchronous and may block on I/O: views call them off the
event loop. Implementations never write the SDK's tables.
"""

from __future__ import annotations

from typing import Protocol

from localui.store.records import (
    CacheEntry,
    CachePage,
    ForkLink,
    Pending,
    PendingPage,
    PrunePreview,
    RowDetail,
    RowHeader,
    RunFacts,
    RunFactsPage,
    RunQuery,
    StoreTotals,
)

#: The vocabulary of run states (DESIGN.md); the rules that derive them live in
#: ``localui.runs`` and the store's SQL mirrors them for filtering.
STATES = ("completed", "failed", "paused", "orphaned", "unfinished")


class Store(Protocol):
    """Read access to one checkpoint store."""

    #: Where the store is, as a person would recognise it (a path or a redacted URL).
    location: str
    #: ``sqlite`` or ``postgres``: the SDK orders a run's rows differently on each.
    backend: str

    def list_runs(self, query: RunQuery) -> RunFactsPage:
        """One page of runs, newest activity first, with counts per state."""
        ...

    def get_run(self, execution_id: str) -> RunFacts | None: ...

    def list_rows(self, execution_id: str) -> tuple[RowHeader, ...]:
        """The run's rows in the order they were written, without payloads."""
        ...

    def get_row(self, checkpoint_id: str) -> RowDetail | None:
        """One row with its payloads; checkpoint ids are unique across runs."""
        ...

    def get_pending(self, execution_id: str) -> Pending | None: ...

    def list_pending(
        self, *, after: tuple[str, str] | None = None, limit: int = 50, newest_first: bool = False
    ) -> PendingPage:
        """Pending interrupts ordered by ``(created_at, execution_id)``."""
        ...

    def list_cache(self, execution_id: str) -> tuple[CacheEntry, ...]: ...

    def list_cache_before(
        self, cutoff: str, *, after: tuple[str, str] | None = None, limit: int = 50
    ) -> CachePage:
        """Cache entries written before ``cutoff``, oldest first: what prune would remove."""
        ...

    def get_fork_origin(self, execution_id: str) -> ForkLink | None:
        """The row this run was forked from, when it is a fork."""
        ...

    def list_forks(self, execution_id: str) -> tuple[ForkLink, ...]:
        """Runs forked from any row of this run."""
        ...

    def totals(self) -> StoreTotals: ...

    def count_pending(self) -> int: ...

    def get_project_id(self, execution_id: str) -> str | None: ...

    def prune_preview(self, cutoff: str) -> PrunePreview:
        """What the SDK's ``prune`` would delete for rows older than ``cutoff``."""
        ...

    def close(self) -> None: ...
