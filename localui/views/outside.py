"""Pauses decided outside localui: the resolutions the SDK recorded (a resume's span
naming who answered, or a ``resolved`` event of its HITL ledger) that localui's own
decision record does not account for: the user's own app, the SDK's UI or CLI, a
script. The run page lists them among its decisions, and ``/decisions?kind=outside``
lists them across runs, each marked "decided outside localui".

localui's own approvals reach the SDK with the approver's name as ``Resume.metadata``,
so the SDK records them too: a resolution is localui's when an approval of the same
run by the same person, made before the resume began, is in the record.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta

from localui import runs
from localui.backends.base import DecisionLog, Store
from localui.backends.traces import LEDGER, TRACE, Resolution, SpanIndex
from localui.errors import BadRequest
from localui.records import (
    ALREADY_RESUMED,
    APPROVAL,
    Decision,
    DecisionEntry,
    DecisionPage,
    DecisionQuery,
    RowHeader,
)
from localui.shortids import shortest_unique
from localui.views.decision_views import DecisionView

#: The kind these entries have among the decisions (``/decisions?kind=outside``).
OUTSIDE = "outside"
#: What an entry's outcome says.
DECIDED_OUTSIDE = "decided outside localui"
#: localui records its claim before the SDK's resume begins; this much slack allows
#: for the clocks of two processes.
_SLACK = timedelta(seconds=5)
#: A ledger event and a resume's span that agree this closely are one resolution.
_SAME = timedelta(seconds=60)
#: Pages of resolutions read at most, to fill one page of ``/decisions?kind=outside``
#: when most of what is read turns out to be localui's own.
_MAX_READS = 20

_SOURCE_WORDS = {
    TRACE: "named by the SDK's trace of the resume",
    LEDGER: "from the SDK's HITL ledger",
}


def _close(a: str, b: str, within: timedelta) -> bool:
    at, bt = runs.parse_time(a), runs.parse_time(b)
    return at is not None and bt is not None and abs(at - bt) <= within


def _one_per_resolution(found: Iterable[Resolution]) -> list[Resolution]:
    """The resume spans, and the ledger's events no span already tells."""
    found = list(found)
    spans = [r for r in found if r.source == TRACE]
    kept = list(spans)
    for event in (r for r in found if r.source == LEDGER):
        if not any(
            s.execution_id == event.execution_id
            and s.resolver == event.resolver
            and s.approved == event.approved
            and _close(s.at, event.at, _SAME)
            for s in spans
        ):
            kept.append(event)
    kept.sort(key=lambda r: (r.at, r.id))
    return kept


def decided_outside(
    resolutions: Iterable[Resolution], decisions: Sequence[Decision]
) -> list[Resolution]:
    """Of one run's ``resolutions``, those none of localui's ``decisions`` on it made,
    oldest first. Each approval localui carried to the SDK accounts for the first
    resolution by the same person from its claim on."""
    mine = sorted(
        (d for d in decisions if d.kind == APPROVAL and d.outcome != ALREADY_RESUMED),
        key=lambda d: d.decided_at,
    )
    outside = []
    for resolution in _one_per_resolution(resolutions):
        at = runs.parse_time(resolution.at)
        match = next(
            (
                d
                for d in mine
                if d.actor == resolution.resolver
                and (resolution.approved is None or d.approved == resolution.approved)
                and at is not None
                and (decided := runs.parse_time(d.decided_at)) is not None
                and decided - _SLACK <= at
            ),
            None,
        )
        if match is not None:
            mine.remove(match)
        else:
            outside.append(resolution)
    return outside


def _verb(resolution: Resolution) -> str:
    if resolution.approved is None:
        return "resolved"
    return "approved" if resolution.approved else "rejected"


def _who(resolution: Resolution) -> str:
    return resolution.resolver or "someone the SDK did not name"


def _pause_row(resolution: Resolution, headers: Sequence[RowHeader]) -> str:
    """The paused row the resolution answered: the newest pause at its node written
    before it; empty when the rows do not say."""
    at = runs.parse_time(resolution.at)
    best = ""
    for row in headers:
        written = runs.parse_time(row.created_at)
        if at is None or written is None or written > at:
            continue
        if row.status == "interrupted" and (resolution.node in (None, row.node_id)):
            best = row.checkpoint_id
    return best


def outside_views(
    traces: SpanIndex | None,
    execution_id: str,
    decisions: Sequence[Decision],
    headers: Sequence[RowHeader],
) -> tuple[DecisionView, ...]:
    """The run's pauses decided outside localui, as its decisions show them."""
    if traces is None:
        return ()
    found = decided_outside(traces.resolutions(execution_id), decisions)
    rows = [_pause_row(r, headers) for r in found]
    ids = shortest_unique([row for row in rows if row])
    views = []
    for resolution, row in zip(found, rows, strict=True):
        at_node = f" at {resolution.node}" if resolution.node else ""
        views.append(
            DecisionView(
                kind=OUTSIDE,
                checkpoint_id=row,
                approved=resolution.approved,
                approver=_who(resolution),
                reason=resolution.reason or "",
                decided_at=resolution.at,
                outcome=OUTSIDE,
                detail=None,
                finished_at=None,
                words=(
                    f"{_who(resolution)} {_verb(resolution)} the pause{at_node} at "
                    f"{resolution.at}, decided outside localui "
                    f"({_SOURCE_WORDS.get(resolution.source, resolution.source)})."
                ),
                short_checkpoint_id=ids.get(row, "") if row else "",
            )
        )
    return tuple(views)


def _entry(resolution: Resolution, agent: str) -> DecisionEntry:
    return DecisionEntry(
        decision=Decision(
            id=resolution.id,
            kind=OUTSIDE,
            execution_id=resolution.execution_id,
            checkpoint_id="",
            approved=resolution.approved,
            actor=_who(resolution),
            reason=resolution.reason or "",
            decided_at=resolution.at,
            outcome=DECIDED_OUTSIDE,
            detail=" ".join(
                part
                for part in (
                    f"at {resolution.node}" if resolution.node else "",
                    f"({_SOURCE_WORDS.get(resolution.source, resolution.source)})",
                )
                if part
            ),
            finished_at=None,
        ),
        agent=agent,
    )


def outside_page(
    traces: SpanIndex | None, log: DecisionLog, store: Store, query: DecisionQuery
) -> DecisionPage:
    """One page of ``/decisions?kind=outside``, newest first: resolutions of every run
    the SDK recorded that localui did not make, with the person, agent, outcome and
    time filters of the rest of the record. Its position is ``(at, id)``."""
    if traces is None or (query.outcome is not None and query.outcome != DECIDED_OUTSIDE):
        return DecisionPage(entries=(), next_key=None)
    before = None
    if query.after is not None:
        if not query.after[1].isdigit():
            raise BadRequest("after: not a position in the decisions decided outside localui")
        before = (query.after[0], int(query.after[1]))
    entries: list[DecisionEntry] = []
    for _ in range(_MAX_READS):
        found = traces.resolutions_page(
            resolver=query.actor,
            since=query.since,
            until=query.until,
            before=before,
            limit=query.limit,
        )
        for run_id in dict.fromkeys(r.execution_id for r in found):
            facts = store.get_run(run_id)
            agent = facts.agent if facts is not None else ""
            if query.agent is not None and agent != query.agent:
                continue
            # The run's every resolution and decision: which is whose is told in order.
            mine = log.list_for_run(run_id)
            keep = {r.id for r in decided_outside(traces.resolutions(run_id), mine)}
            entries += [
                _entry(r, agent) for r in found if r.execution_id == run_id and r.id in keep
            ]
        entries.sort(key=lambda e: (e.decision.decided_at, e.decision.id), reverse=True)
        if len(found) < query.limit:
            return DecisionPage(entries=tuple(entries[: query.limit]), next_key=None)
        before = (found[-1].at, found[-1].id)
        if len(entries) >= query.limit:
            break
    shown = tuple(entries[: query.limit])
    if len(shown) == query.limit:
        last = shown[-1].decision
        return DecisionPage(entries=shown, next_key=(last.decided_at, str(last.id)))
    # Fewer than a page after every read allowed: more may follow where reading stopped.
    assert before is not None  # set by every read that found a full page
    return DecisionPage(entries=shown, next_key=(before[0], str(before[1])))
