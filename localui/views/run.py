"""``/runs/{execution_id}``: one run's verdict, actions, timeline, cache and lineage.

The page is built section by section (timeline, outbox, resume, pause, actions,
lineage); the live stream re-renders the same sections from the same builder.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from localui import runs, words
from localui.actions import RECENT_SECONDS, ActionService
from localui.auth import OPEN, Person, person_of
from localui.backends.base import Store
from localui.backends.traces import SpanIndex
from localui.errors import BadRequest, no_such_run
from localui.offloop import off_loop, read_ahead
from localui.records import (
    EDIT,
    RowDetail,
)
from localui.views.cards import ApprovalItem
from localui.views.decision_views import DecisionView
from localui.views.lineage import ForkView, fork_view, lineage
from localui.views.notes import NotesView, NoteView, earlier_notes, note_view
from localui.views.outside import outside_views
from localui.views.params import parse_count
from localui.views.respond import html_only, nav_ahead, respond
from localui.views.run_actions import (
    OrphanView,
    PendingView,
    ResumeView,
    actions_section,
    orphan_view,
    pending_view,
    resume_view,
)
from localui.views.run_cache import CacheView, cache_view
from localui.views.state import approver_of, context
from localui.views.timeline import (
    MAX_ROW_NUMBER,
    MAX_ROWS,
    TIMELINE_ROWS,
    GroupView,
    OutboxSummary,
    RowView,
    RowWindow,
    outbox_summary,
    timeline_section,
)
from localui.views.trace import (
    TraceSection,
    reentries,
    steps_by_row,
    trace_section,
)
from localui.views.urls import Urls, urls_of
from localui.words import Verdict, decision_line


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
    verdict: Verdict
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
    #: Every note left on any pause of the run, oldest first (``views.notes``); those
    #: of the pause it waits at show on its card too.
    notes: tuple[NoteView, ...] = ()
    #: The notes of pauses the run no longer waits at, one section per paused row.
    earlier_notes: tuple[NotesView, ...] = html_only(())


def _run_error(detail: RowDetail | None) -> str | None:
    if detail is None or not isinstance(detail.state_snapshot, dict):
        return None
    error = detail.state_snapshot.get("run_error")
    return str(error) if error else None


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
        raise no_such_run(execution_id, listed=facts is not None or store.listed(execution_id))
    # What the page shows beside the rows, read meanwhile (four round trips on PostgreSQL).
    family = read_ahead(store.fork_family, execution_id)
    recorded = read_ahead(actions.decisions.list_for_run, execution_id)
    votes = read_ahead(actions.decisions.votes_for_run, execution_id)
    noted = read_ahead(actions.notes.for_run, execution_id) if actions.notes is not None else None
    now = datetime.now(UTC)
    state = runs.state_of(facts)
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
    run_error = _run_error(store.get_row(last.checkpoint_id)) if state in runs.FAILURES else None
    verdict = words.verdict(
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
    origin, forks = family.result()
    edited = (
        actions.decisions.latest_for_runs(EDIT, [f.execution_id for f in forks]) if forks else {}
    )
    acting = actions_section(
        actions,
        execution_id,
        owner,
        plan,
        pending,
        now,
        urls,
        person,
        recorded=recorded.result(),
        votes=votes.result(),
    )
    orphan = None
    if state == runs.ORPHANED and last.status == "interrupted":
        orphan = orphan_view(actions, last, owner, acting.recorded)
    age = runs.seconds_since(last.created_at)
    run_notes = noted.result() if noted is not None else ()
    waiting_at = pending.checkpoint_id if pending is not None else None
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
        forks=lineage(store, execution_id, urls, forks, edited),
        window=timeline.window,
        decisions=tuple(
            sorted(
                (*acting.decisions, *outside_views(traces, execution_id, acting.recorded, headers)),
                key=lambda d: d.decided_at,
            )
        ),
        outbox=outbox_summary(headers),
        trace=trace,
        decided=decision_line(state, acting.last_approval),
        orphan=orphan,
        groups=timeline.groups,
        resume_problem=acting.resume_problem,
        resume_needs_confirm=age is not None and age < RECENT_SECONDS,
        forkable=timeline.forkable,
        fork_problem=acting.fork_problem,
        approval=acting.approval,
        runner_missing=acting.runner_missing,
        notes=tuple(note_view(n) for n in run_notes),
        earlier_notes=earlier_notes(run_notes, execution_id, waiting_at),
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
