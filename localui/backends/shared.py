"""What both stores do the same way, written once: the run-state SQL, the record
mappers over rows read by column name, and the tail of a keyset-paginated read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from localui.records import (
    CacheEntry,
    ForkLink,
    Pending,
    PruneRun,
    RowHeader,
    RunFacts,
    parse_json,
    stored_int,
    unwrap_cached,
)

R = TypeVar("R")


class NamedRow(Protocol):
    """A row whose values are read by column name (``sqlite3.Row``, a psycopg dict row)."""

    def __getitem__(self, name: str, /) -> Any: ...


T = TypeVar("T")

#: A database's time value as the ISO text records carry (SQLite's is text already).
Instant = Callable[[Any], str]

#: Run state in SQL over the newest row ``l`` (with its ``run_reason``) and the pending
#: row ``p``: the same rules as ``localui.runs.run_state`` (a test holds the two
#: together, on both backends).
STATE_SQL = """CASE
    WHEN l.step_type = 'run_end' AND l.status = 'failed' AND l.run_reason = 'cancelled'
        THEN 'cancelled'
    WHEN l.step_type = 'run_end' AND l.status = 'failed' AND l.run_reason = 'timeout'
        THEN 'timed_out'
    WHEN l.step_type = 'run_end' AND l.status = 'failed' THEN 'failed'
    WHEN l.step_type = 'run_end' THEN 'completed'
    WHEN l.status = 'interrupted' AND p.execution_id IS NOT NULL THEN 'paused'
    WHEN l.status = 'interrupted' THEN 'orphaned'
    ELSE 'unfinished'
END"""


def text_or_empty(value: Any) -> str:
    return "" if value is None else str(value)


def like(text: str) -> str:
    """A ``LIKE`` pattern (``ESCAPE '\\'``) matching ``text`` anywhere."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a keyset-paginated read that asked for ``limit + 1`` rows: the
    records, and the key to continue after when there was one more."""

    items: tuple[T, ...]
    next_key: tuple[str, str] | None

    @classmethod
    def of(
        cls,
        rows: Sequence[R],
        limit: int,
        record: Callable[[R], T],
        key: Callable[[T], tuple[str, str]],
    ) -> Page[T]:
        items = tuple(record(r) for r in rows[:limit])
        next_key = key(items[-1]) if len(rows) > limit and items else None
        return cls(items=items, next_key=next_key)


#: The checkpoint columns a row's header is read from, in the order both stores
#: select them (``chain_name`` is the agent).
HEADER_COLUMNS = (
    "checkpoint_id",
    "execution_id",
    "parent_checkpoint_id",
    "chain_name",
    "node_id",
    "node_index",
    "step_type",
    "status",
    "interrupt_reason",
    "agent_path",
    "created_at",
    "synced",
    "sync_error",
)


def header_select(column: Callable[[str], str]) -> str:
    """The select list of :data:`HEADER_COLUMNS`, each as ``column(name)`` gives it."""
    return ", ".join(f"{column(name)} AS {name}" for name in HEADER_COLUMNS)


def run_key(facts: RunFacts) -> tuple[str, str]:
    """Where the runs list continues: newest activity first."""
    return (facts.last_at, facts.execution_id)


def pending_key(item: Pending) -> tuple[str, str]:
    """Where the approvals queue continues."""
    return (item.created_at, item.execution_id)


def cache_key(entry: CacheEntry) -> tuple[str, str]:
    """Where a list of cache entries continues (a function key is unique within a run)."""
    return (entry.created_at, f"{entry.execution_id}:{entry.function_key}")


def row_header(row: NamedRow, instant: Instant = text_or_empty) -> RowHeader:
    """A row selected with :func:`header_select`, read by column name."""
    return row_header_values(tuple(row[name] for name in HEADER_COLUMNS), instant)


def row_header_values(values: Sequence[Any], instant: Instant = text_or_empty) -> RowHeader:
    """The values of :data:`HEADER_COLUMNS`, in its order: the fast path for a run's
    thousands of rows, where a lookup by name per field costs more than the query."""
    (cid, eid, parent, agent, node, index, step, status, reason, path, at, synced, error) = values
    return RowHeader(
        checkpoint_id=cid or "",
        execution_id=eid,
        parent_checkpoint_id=parent,
        agent=agent or "",
        node_id=node or "",
        node_index=stored_int(index),
        step_type=step,
        status=status or "completed",
        interrupt_reason=reason,
        agent_path=path,
        created_at=instant(at),
        # A boolean on PostgreSQL, 0/1 in SQLite: the records carry SQLite's shape.
        synced=None if synced is None else int(synced),
        sync_error=error,
    )


def pending(row: NamedRow, instant: Instant = text_or_empty) -> Pending:
    """A ``pending_interrupts`` row with the checkpoint id of its interrupted row."""
    return Pending(
        checkpoint_id=row["checkpoint_id"],
        execution_id=row["execution_id"],
        agent=row["chain_name"] or "",
        node_id=row["node_id"] or "",
        reason=row["reason"] or "",
        context=parse_json(row["context"], {}),
        agent_path=row["agent_path"],
        created_at=instant(row["created_at"]),
    )


def cache_entry(row: NamedRow, instant: Instant = text_or_empty) -> CacheEntry:
    """An ``idempotency_cache`` row, its value out of the SDK's envelope."""
    value, enveloped = unwrap_cached(parse_json(row["result"], None))
    return CacheEntry(
        execution_id=row["execution_id"],
        function_key=row["function_key"],
        value=value,
        enveloped=enveloped,
        created_at=instant(row["created_at"]),
    )


def fork_link(row: NamedRow, instant: Instant = text_or_empty) -> ForkLink:
    """A fork's origin row joined to the row it was forked from."""
    return ForkLink(
        execution_id=row["execution_id"],
        source_execution_id=row["source_execution_id"],
        source_checkpoint_id=row["parent"] or "",
        source_node_id=row["source_node_id"],
        created_at=instant(row["created_at"]),
    )


def prune_run(row: NamedRow) -> PruneRun:
    """One run of a prune preview: rows it would lose and keep."""
    return PruneRun(
        execution_id=row["execution_id"],
        agent=row["agent"] or "",
        rows_deleted=int(row["gone"]),
        rows_kept=int(row["total"]) - int(row["gone"]),
    )
