"""``/runs/{execution_id}``: one run's verdict, actions, timeline, cache and lineage.

The page is built section by section (timeline, outbox, resume, pause, actions,
lineage); the live stream re-renders the same sections from the same builder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from localui import runs
from localui.actions import RECENT_SECONDS, ActionService, seconds_since
from localui.auth import OPEN, Person, person_of
from localui.backends.base import Store
from localui.backends.traces import SpanIndex
from localui.errors import BadRequest, NotFound
from localui.offloop import off_loop
from localui.records import (
    APPROVAL,
    CacheEntry,
    Decision,
    ForkLink,
    Pending,
    RowDetail,
    RowHeader,
)
from localui.shortids import shortest_unique
from localui.views.cards import ApprovalItem, approval_item
from localui.views.decision_views import DecisionView, decision_views
from localui.views.params import parse_count
from localui.views.respond import html_only, nav_ahead, pretty_json, respond
from localui.views.row import jsonable
from localui.views.state import approver_of, context
from localui.views.trace import (
    StepView,
    TraceSection,
    reentries,
    steps_by_row,
    trace_section,
)
from localui.views.urls import Urls, dom_id, urls_of

#: How many forks of forks the lineage walks before it stops listing.
MAX_LINEAGE = 200
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
class ResumeView:
    shape: str
    node_id: str
    checkpoint_id: str
    tool: str | None
    turn: int | None
    reason: str | None
    saved_args: Any
    #: A Chain's node that runs next; the team member that re-enters.
    start_node: str | None = None
    member: str | None = None


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


@dataclass(frozen=True, slots=True)
class ForkView:
    execution_id: str
    source_execution_id: str | None
    source_checkpoint_id: str
    source_node_id: str | None
    created_at: str
    url: str
    source_url: str | None
    forks: tuple[ForkView, ...] = ()
    #: The ids as the lineage shows them (``localui.shortids``): the fork's, unique
    #: among the runs of this lineage, and its source run's.
    short_id: str = html_only("")
    source_short_id: str = html_only("")


@dataclass(frozen=True, slots=True)
class PendingView:
    node_id: str
    reason: str
    context: Any
    created_at: str
    context_json: str = html_only("")


@dataclass(frozen=True, slots=True)
class OutboxSummary:
    synced: int
    waiting: int
    quarantined: int
    unknown: int


#: What re-arming a pause does to its tool, on every page that offers or reports it.
RERUN_NOTE = (
    "A re-armed pause's tool runs again from the top with the decision: whatever it did"
    " after interrupt() returned and before its process died happens again, unless that"
    " step is @idempotent."
)


@dataclass(frozen=True, slots=True)
class OrphanView:
    """A paused row whose pending row is gone: the SDK can no longer resume it."""

    checkpoint_id: str
    node_id: str
    #: The unfinished decision of localui's that explains it, in words: localui carries
    #: that decision out itself once its process is known to be gone.
    carried_by: str | None
    #: Why this process cannot re-open the pause (its runner is not registered).
    problem: str | None
    rerun: str = RERUN_NOTE


def orphan_view(
    actions: ActionService, last: RowHeader, owner: runs.Owner, recorded: Sequence[Decision]
) -> OrphanView:
    carried_by = None
    for d in recorded:
        if d.kind == APPROVAL and d.outcome is None and d.bound_checkpoint_id == last.checkpoint_id:
            carried_by = (
                f"{d.actor} {d.verb} this pause at {d.decided_at}, and the process carrying"
                " that out stopped before the tool wrote its next row. Once that process has"
                f" been silent for {actions.decisions.lease_seconds:g} s, localui re-arms the"
                " pause and carries the same decision out, once."
            )
    return OrphanView(
        checkpoint_id=last.checkpoint_id,
        node_id=last.node_id,
        carried_by=carried_by,
        problem=actions.preflight.runner_problem(owner),
    )


@dataclass(frozen=True, slots=True)
class RunPage:
    execution_id: str
    state: str
    #: The name of the runner that owns the run (the top of its ``agent_path``).
    agent: str
    #: That runner as a person reads it, e.g. ``Chain 'refund-chain'``.
    runner: str
    #: What a resume would do (``shape`` tool, turn or approval), or null.
    resume: ResumeView | None
    #: Why there is no resume, in words, when ``resume`` is null.
    resume_refusal: str | None
    verdict: runs.Verdict
    run_error: str | None
    rows: tuple[RowView, ...]
    pending: PendingView | None
    idempotency: tuple[CacheView, ...]
    fork_of: ForkView | None
    forks: tuple[ForkView, ...]
    #: The rows of ``rows``: a window of a long run (``?from=N``, ``?rows=all``).
    window: RowWindow
    #: Approvals, rejections and resumes recorded by localui for this run.
    decisions: tuple[DecisionView, ...]
    outbox: OutboxSummary
    #: The SDK's spans of each attempt, the run's input and final answer.
    trace: TraceSection
    #: Who decided the pause the run answered, and why ("rejected by Ada: over budget").
    decided: str | None = None
    #: An orphaned pause: who will carry its decision out, or how to re-open it.
    orphan: OrphanView | None = None
    groups: tuple[GroupView, ...] = html_only(())
    #: Why this process cannot resume the run (agent or tool not registered).
    resume_problem: str | None = html_only(None)
    #: The newest row is recent: the run may be alive elsewhere, so ask first.
    resume_needs_confirm: bool = html_only(False)
    forkable: tuple[RowView, ...] = html_only(())
    fork_problem: str | None = html_only(None)
    #: Why nothing can be done with this run here: no runner of its owner is registered.
    runner_missing: str | None = html_only(None)
    approval: ApprovalItem | None = html_only(None)
    #: The approver this browser last decided as, to prefill the card.
    approver: str = html_only("")


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
        ago=runs.age_words(row.created_at, now),
        calls=calls,
        reentry=reentry,
    )


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


def fork_view(link: ForkLink, urls: Urls, children: tuple[ForkView, ...] = ()) -> ForkView:
    """One fork link, its ids shown as a page of these two runs would show them."""
    ids = [link.execution_id, *([link.source_execution_id] if link.source_execution_id else [])]
    shown = shortest_unique(ids)
    source_url = None
    if link.source_execution_id:
        source_url = urls.run(
            link.source_execution_id, fragment=f"row-{dom_id(link.source_checkpoint_id)}"
        )
    return ForkView(
        execution_id=link.execution_id,
        source_execution_id=link.source_execution_id,
        source_checkpoint_id=link.source_checkpoint_id,
        source_node_id=link.source_node_id,
        created_at=link.created_at,
        url=urls.run(link.execution_id),
        source_url=source_url,
        forks=children,
        short_id=shown.get(link.execution_id, link.execution_id),
        source_short_id=shown.get(link.source_execution_id or "", ""),
    )


def lineage(
    store: Store, execution_id: str, urls: Urls, forks: tuple[ForkLink, ...]
) -> tuple[ForkView, ...]:
    """This run's ``forks``, and theirs, depth first, at most ``MAX_LINEAGE`` in all;
    their ids shortened so that each reads apart from every other run of the lineage."""
    seen = {execution_id}

    def walk(run_id: str) -> tuple[ForkView, ...]:
        views = []
        for link in forks if run_id == execution_id else store.list_forks(run_id):
            if link.execution_id in seen or len(seen) > MAX_LINEAGE:
                continue
            seen.add(link.execution_id)
            views.append(fork_view(link, urls, walk(link.execution_id)))
        return tuple(views)

    tree = walk(execution_id)
    shown = shortest_unique(seen)

    def shorten(views: tuple[ForkView, ...]) -> tuple[ForkView, ...]:
        return tuple(
            dataclasses.replace(
                view,
                short_id=shown[view.execution_id],
                source_short_id=shown.get(view.source_execution_id or "", ""),
                forks=shorten(view.forks),
            )
            for view in views
        )

    return shorten(tree)


def _run_error(detail: RowDetail | None) -> str | None:
    if detail is None or not isinstance(detail.state_snapshot, dict):
        return None
    error = detail.state_snapshot.get("run_error")
    return str(error) if error else None


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


def resume_view(plan: runs.ResumePlan | runs.Refusal, saved_args: Any) -> ResumeView | None:
    if not isinstance(plan, runs.ResumePlan):
        return None
    return ResumeView(
        shape=plan.shape,
        node_id=plan.node_id,
        checkpoint_id=plan.checkpoint_id,
        tool=plan.tool,
        turn=plan.turn,
        reason=plan.reason,
        saved_args=jsonable(saved_args),
        start_node=plan.start_node,
        member=plan.member,
    )


def pending_view(pending: Pending | None) -> PendingView | None:
    if pending is None:
        return None
    return PendingView(
        node_id=pending.node_id,
        reason=pending.reason,
        context=jsonable(pending.context),
        created_at=pending.created_at,
        context_json=pretty_json(pending.context),
    )


@dataclass(frozen=True, slots=True)
class ActionsSection:
    """What this process can do with the run (its runner and tool registered or not), the
    pause's card, and what localui already did with the run."""

    decisions: tuple[DecisionView, ...] = ()
    #: The newest approval or rejection recorded for the run.
    last_approval: Decision | None = None
    resume_problem: str | None = None
    fork_problem: str | None = None
    approval: ApprovalItem | None = None
    #: No runner of the run's owner is registered here: said once, above the panels,
    #: which then are read-only without saying it again.
    runner_missing: str | None = None


def actions_section(
    actions: ActionService,
    execution_id: str,
    owner: runs.Owner,
    plan: runs.ResumePlan | runs.Refusal,
    pending: Pending | None,
    now: datetime,
    urls: Urls,
    person: Person = OPEN,
) -> ActionsSection:
    resume_problem = None
    if isinstance(plan, runs.ResumePlan) and plan.shape != "approval":
        resume_problem = actions.preflight.plan_problem(plan)
    fork_problem = actions.preflight.fork_problem(owner)
    missing = (
        actions.preflight.runner_problem(owner)
        if actions.registry.get(owner.name) is None
        else None
    )
    recorded = actions.decisions.list_for_run(execution_id)
    return ActionsSection(
        decisions=decision_views(actions, execution_id, recorded=recorded),
        last_approval=next((d for d in reversed(recorded) if d.kind == APPROVAL), None),
        # What the missing runner explains is not said again in a panel of its own.
        resume_problem=None
        if missing is not None and resume_problem == missing
        else resume_problem,
        fork_problem=None if missing is not None and fork_problem == missing else fork_problem,
        approval=approval_item(actions, pending, now, urls, person=person)
        if pending is not None
        else None,
        runner_missing=missing,
    )


def build_run_page(
    store: Store,
    execution_id: str,
    urls: Urls,
    actions: ActionService,
    *,
    start: int | None = None,
    window: int = TIMELINE_ROWS,
    traces: SpanIndex | None = None,
    person: Person = OPEN,
) -> RunPage:
    """The run page; ``person`` is who looks (a pause's rule may leave its card read-only)."""
    facts, headers, cache = store.run_reads(execution_id)
    if facts is None or not headers:
        raise NotFound(f"no run with execution id {execution_id!r} in this store")
    now = datetime.now(UTC)
    state = runs.run_state(facts.last_step_type, facts.last_status, facts.has_pending)
    # The owner's plan on this backend, with the registered Chain's node order.
    plan = actions.preflight.plan(state, headers)
    last = headers[-1]
    owner = runs.run_owner(headers)
    pending = store.get_pending(execution_id) if facts.has_pending else None
    saved_args: Any = None
    skipped: tuple[str, ...] = ()
    if isinstance(plan, runs.ResumePlan):
        reentry = store.get_row(plan.checkpoint_id)
        if reentry is not None:
            saved_args = reentry.node_input
            skipped = runs.skipped_siblings(reentry.state_snapshot)
    run_error = _run_error(store.get_row(last.checkpoint_id)) if state == runs.FAILED else None
    verdict = runs.verdict(
        state,
        plan,
        last=last,
        now=now,
        saved_args=saved_args,
        run_error=run_error,
        cached_calls=len(cache),
        skipped=skipped,
    )
    trace = trace_section(traces, execution_id, headers)
    timeline = timeline_section(
        execution_id,
        headers,
        start,
        window,
        now,
        urls,
        steps_by_row(trace),
        reentries(trace, headers),
    )
    origin, forks = store.fork_family(execution_id)
    acting = actions_section(actions, execution_id, owner, plan, pending, now, urls, person)
    orphan = None
    if state == runs.ORPHANED and last.status == "interrupted":
        recorded = actions.decisions.list_for_run(execution_id)
        orphan = orphan_view(actions, last, owner, recorded)
    age = seconds_since(last.created_at)
    return RunPage(
        execution_id=execution_id,
        state=state,
        agent=owner.name,
        runner=owner.describe(),
        resume=resume_view(plan, saved_args),
        resume_refusal=plan.reason if isinstance(plan, runs.Refusal) else None,
        verdict=verdict,
        run_error=run_error,
        rows=timeline.rows,
        pending=pending_view(pending),
        idempotency=tuple(cache_view(e, headers) for e in cache),
        fork_of=fork_view(origin, urls) if origin is not None else None,
        forks=lineage(store, execution_id, urls, forks),
        window=timeline.window,
        decisions=acting.decisions,
        outbox=outbox_summary(headers),
        trace=trace,
        decided=runs.decision_line(state, acting.last_approval),
        orphan=orphan,
        groups=timeline.groups,
        resume_problem=acting.resume_problem,
        resume_needs_confirm=age is not None and age < RECENT_SECONDS,
        forkable=timeline.forkable,
        fork_problem=acting.fork_problem,
        approval=acting.approval,
        runner_missing=acting.runner_missing,
    )


def _window_params(request: Request) -> tuple[int | None, int]:
    params = request.query_params
    start_text = params.get("from")
    start = None if start_text is None else parse_count("from", start_text, maximum=MAX_ROW_NUMBER)
    rows = params.get("rows")
    if rows is not None and rows != "all":
        raise BadRequest(f"rows={rows!r}: the only choice is rows=all")
    return start, (MAX_ROWS if rows == "all" else TIMELINE_ROWS)


async def run_page(request: Request) -> Response:
    ctx = context(request)
    execution_id = request.path_params["execution_id"]
    start, window = _window_params(request)
    urls = urls_of(request)
    nav_ahead(request)
    page = await off_loop(
        lambda: build_run_page(
            ctx.store,
            execution_id,
            urls,
            ctx.actions,
            start=start,
            window=window,
            traces=ctx.traces,
            person=person_of(request),
        )
    )
    page = dataclasses.replace(page, approver=approver_of(request))
    return await respond(request, "pages/run.html", page)
