"""A run's cached side effects (``@idempotent`` results) and the row that wrote each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from localui import runs
from localui.records import (
    CacheEntry,
    RowHeader,
)
from localui.views.respond import html_only, pretty_json


@dataclass(frozen=True, slots=True)
class CacheView:
    function_key: str
    value: Any
    enveloped: bool
    created_at: str
    #: The tool row that most likely wrote the entry: the last one before it was written.
    written_by: str | None
    written_by_node: str | None
    value_json: str = html_only("")


def writer_row(entry: CacheEntry, rows: Sequence[RowHeader]) -> RowHeader | None:
    """The tool row that most likely wrote a cache entry, judged by time.

    The key is an opaque hash, so the store cannot say; but the SDK writes a tool's
    row before it runs the tool, and the tool writes the entry while it runs, so the
    newest tool row written before the entry is the best guess.
    """
    written = runs.parse_time(entry.created_at)
    best: RowHeader | None = None
    for row in rows:
        if runs.parse_node(row.node_id).tool is None:
            continue
        at = runs.parse_time(row.created_at)
        if written is not None and at is not None and at <= written:
            best = row
    return best


def cache_view(entry: CacheEntry, rows: Sequence[RowHeader] = ()) -> CacheView:
    value = entry.value
    writer = writer_row(entry, rows)
    return CacheView(
        function_key=entry.function_key,
        value=value,
        enveloped=entry.enveloped,
        created_at=entry.created_at,
        written_by=writer.checkpoint_id if writer else None,
        written_by_node=writer.node_id if writer else None,
        value_json=pretty_json(value),
    )
