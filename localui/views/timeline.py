"""A run's timeline as its page shows it: rows grouped by turn, a window of a long run,
and where each row stands with the plane (the outbox).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from localui import runs
from localui.records import (
    RowHeader,
)
from localui.views.respond import html_only
from localui.views.trace import (
    StepView,
)
from localui.views.urls import Urls
from localui.words import age_words

#: Rows the timeline shows at once; a longer run pages (``?from=N``).
TIMELINE_ROWS = 200


#: ``?rows=all`` shows at most this many.
MAX_ROWS = 100_000


#: The largest row number ``?from=`` accepts; past a run's end it shows the last rows.
MAX_ROW_NUMBER = 1_000_000_000


def outbox_state(row: RowHeader) -> str:
    """``synced``, ``waiting`` (for the plane) or ``quarantined``; ``unknown`` on old stores."""
    if row.sync_error:
        return "quarantined"
    if row.synced is None:
        return "unknown"
    return "synced" if row.synced else "waiting"


def row_kind(row: RowHeader) -> str:
    """A word for what the row is, from ``step_type`` or, on old stores, the node id."""
    if row.step_type:
        return row.step_type
    return "tool_call" if runs.parse_node(row.node_id).tool else "step"


@dataclass(frozen=True, slots=True)
class RowView:
    checkpoint_id: str
    node_id: str
    step_type: str | None
    status: str
    created_at: str
    agent_path: str | None
    interrupt_reason: str | None
    parent_checkpoint_id: str | None
    outbox: str
    sync_error: str | None
    detail_url: str
    kind: str = html_only("")
    ago: str = html_only("")
    #: The model and tool calls the trace places on this row.
    calls: tuple[StepView, ...] = ()
    #: A resume or fork re-entered the run here: which attempt, and who resumed it.
    reentry: str | None = None


@dataclass(frozen=True, slots=True)
class GroupView:
    title: str
    rows: tuple[RowView, ...]


@dataclass(frozen=True, slots=True)
class OutboxSummary:
    synced: int
    waiting: int
    quarantined: int
    unknown: int


def row_view(
    execution_id: str,
    row: RowHeader,
    now: datetime,
    urls: Urls,
    calls: tuple[StepView, ...] = (),
    reentry: str | None = None,
) -> RowView:
    return RowView(
        checkpoint_id=row.checkpoint_id,
        node_id=row.node_id,
        step_type=row.step_type,
        status=row.status,
        created_at=row.created_at,
        agent_path=row.agent_path,
        interrupt_reason=row.interrupt_reason,
        parent_checkpoint_id=row.parent_checkpoint_id,
        outbox=outbox_state(row),
        sync_error=row.sync_error,
        detail_url=urls.row(execution_id, row.checkpoint_id),
        kind=row_kind(row),
        ago=age_words(row.created_at, now),
        calls=calls,
        reentry=reentry,
    )


@dataclass(frozen=True, slots=True)
class RowWindow:
    """Which rows of a long run the timeline shows: ``count`` of ``total`` from ``start``."""

    start: int
    count: int
    total: int
    earlier_url: str | None
    later_url: str | None
    all_url: str | None


def row_window(
    execution_id: str, total: int, start: int | None, size: int, urls: Urls
) -> RowWindow:
    """The newest ``size`` rows by default: the end of a run is where it crashed or paused."""
    if start is None:
        start = max(0, total - size)
    start = min(max(0, start), max(0, total - 1))
    end = min(total, start + size)

    def at(first: int, rows: str | None = None) -> str:
        query = {"from": first, "rows": rows}
        return urls.path("run", query, fragment="timeline", execution_id=execution_id)

    return RowWindow(
        start=start,
        count=end - start,
        total=total,
        earlier_url=at(max(0, start - size)) if start > 0 else None,
        later_url=at(end) if end < total else None,
        all_url=at(0, "all") if total > size else None,
    )


@dataclass(frozen=True, slots=True)
class Timeline:
    """The timeline section: the window of rows shown, grouped, and those a fork may start at."""

    window: RowWindow
    rows: tuple[RowView, ...]
    groups: tuple[GroupView, ...]
    forkable: tuple[RowView, ...]


def timeline_section(
    execution_id: str,
    headers: Sequence[RowHeader],
    start: int | None,
    size: int,
    now: datetime,
    urls: Urls,
    calls: dict[str, tuple[StepView, ...]] | None = None,
    marks: dict[str, str] | None = None,
) -> Timeline:
    shown = row_window(execution_id, len(headers), start, size, urls)
    visible = headers[shown.start : shown.start + shown.count]
    calls = calls or {}
    marks = marks or {}
    rows = tuple(
        row_view(
            execution_id, h, now, urls, calls.get(h.checkpoint_id, ()), marks.get(h.checkpoint_id)
        )
        for h in visible
    )
    by_id = {r.checkpoint_id: r for r in rows}
    groups = tuple(
        GroupView(title=g.title, rows=tuple(by_id[h.checkpoint_id] for h in g.rows))
        for g in runs.group_timeline(visible)
    )
    forkable = tuple(r for r, h in zip(rows, visible, strict=True) if runs.fork_refusal(h) is None)
    return Timeline(window=shown, rows=rows, groups=groups, forkable=forkable)


def outbox_summary(headers: Sequence[RowHeader]) -> OutboxSummary:
    states = [outbox_state(h) for h in headers]
    return OutboxSummary(
        synced=states.count("synced"),
        waiting=states.count("waiting"),
        quarantined=states.count("quarantined"),
        unknown=states.count("unknown"),
    )
