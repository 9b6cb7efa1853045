"""``/runs/{execution_id}``: one run's timeline, verdict, cache and lineage; and
``/runs/{execution_id}/rows/{checkpoint_id}``: one row opened, loaded on demand."""

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
from localui.errors import BadRequest, NotFound
from localui.store.base import Store
from localui.store.records import CacheEntry, ForkLink, RowDetail, RowHeader, Unreadable
from localui.views.approvals import (
    APPROVER_COOKIE,
    ApprovalItem,
    DecisionView,
    approval_item,
    decisions_for_run,
)
from localui.views.common import context, html_only, off_loop, pretty_json, respond

#: How many forks of forks the lineage walks before it stops listing.
MAX_LINEAGE = 200
#: Rows the timeline shows at once; a longer run pages (``?from=N``).
TIMELINE_ROWS = 200
#: ``?rows=all`` shows at most this many.
MAX_ROWS = 100_000


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


@dataclass(frozen=True, slots=True)
class PendingView:
    node_id: str
    reason: str
    context: Any
    created_at: str
    context_json: str = html_only("")


@dataclass(frozen=True, slots=True)
class VerdictView:
    tone: str
    headline: str
    resume: str
    fork: str


@dataclass(frozen=True, slots=True)
class OutboxSummary:
    synced: int
    waiting: int
    quarantined: int
    unknown: int


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
    verdict: VerdictView
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
    groups: tuple[GroupView, ...] = html_only(())
    #: Why this process cannot resume the run (agent or tool not registered).
    resume_problem: str | None = html_only(None)
    #: The newest row is recent: the run may be alive elsewhere, so ask first.
    resume_needs_confirm: bool = html_only(False)
    forkable: tuple[RowView, ...] = html_only(())
    fork_problem: str | None = html_only(None)
    approval: ApprovalItem | None = html_only(None)
    #: The approver this browser last decided as, to prefill the card.
    approver: str = html_only("")


def row_view(execution_id: str, row: RowHeader, now: datetime) -> RowView:
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
        detail_url=f"/runs/{execution_id}/rows/{row.checkpoint_id}",
        kind=row_kind(row),
        ago=runs.age_words(row.created_at, now),
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


def fork_view(link: ForkLink, children: tuple[ForkView, ...] = ()) -> ForkView:
    source_url = None
    if link.source_execution_id:
        source_url = f"/runs/{link.source_execution_id}#row-{link.source_checkpoint_id}"
    return ForkView(
        execution_id=link.execution_id,
        source_execution_id=link.source_execution_id,
        source_checkpoint_id=link.source_checkpoint_id,
        source_node_id=link.source_node_id,
        created_at=link.created_at,
        url=f"/runs/{link.execution_id}",
        source_url=source_url,
        forks=children,
    )


def lineage(store: Store, execution_id: str) -> tuple[ForkView, ...]:
    """This run's forks, and theirs, depth first, at most ``MAX_LINEAGE`` in all."""
    seen = {execution_id}

    def walk(run_id: str) -> tuple[ForkView, ...]:
        views = []
        for link in store.list_forks(run_id):
            if link.execution_id in seen or len(seen) > MAX_LINEAGE:
                continue
            seen.add(link.execution_id)
            views.append(fork_view(link, walk(link.execution_id)))
        return tuple(views)

    return walk(execution_id)


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


def row_window(execution_id: str, total: int, start: int | None, size: int) -> RowWindow:
    """The newest ``size`` rows by default: the end of a run is where it crashed or paused."""
    if start is None:
        start = max(0, total - size)
    start = min(max(0, start), max(0, total - 1))
    end = min(total, start + size)
    base = f"/runs/{execution_id}?from="
    return RowWindow(
        start=start,
        count=end - start,
        total=total,
        earlier_url=f"{base}{max(0, start - size)}#timeline" if start > 0 else None,
        later_url=f"{base}{end}#timeline" if end < total else None,
        all_url=f"/runs/{execution_id}?from=0&rows=all#timeline" if total > size else None,
    )


def build_run_page(
    store: Store,
    execution_id: str,
    actions: ActionService | None = None,
    *,
    start: int | None = None,
    window: int = TIMELINE_ROWS,
) -> RunPage:
    facts = store.get_run(execution_id)
    if facts is None:
        raise NotFound(f"no run with execution id {execution_id!r} in this store")
    headers = store.list_rows(execution_id)
    now = datetime.now(UTC)
    state = runs.run_state(facts.last_step_type, facts.last_status, facts.has_pending)
    plan = (
        actions.plan(state, headers)
        if actions is not None
        else runs.resume_plan(state, headers, backend=store.backend)
    )
    last = headers[-1]
    owner = runs.run_owner(headers)
    cache = store.list_cache(execution_id)
    pending = store.get_pending(execution_id) if facts.has_pending else None

    saved_args: Any = None
    if isinstance(plan, runs.ResumePlan):
        reentry = store.get_row(plan.checkpoint_id)
        if reentry is not None:
            saved_args = reentry.node_input
    run_error = _run_error(store.get_row(last.checkpoint_id)) if state == runs.FAILED else None

    verdict = runs.verdict(
        state,
        plan,
        last=last,
        now=now,
        saved_args=saved_args,
        run_error=run_error,
        cached_calls=len(cache),
    )
    shown = row_window(execution_id, len(headers), start, window)
    visible = headers[shown.start : shown.start + shown.count]
    rows = tuple(row_view(execution_id, h, now) for h in visible)
    by_id = {r.checkpoint_id: r for r in rows}
    groups = tuple(
        GroupView(title=g.title, rows=tuple(by_id[h.checkpoint_id] for h in g.rows))
        for g in runs.group_timeline(visible)
    )
    outbox = [outbox_state(h) for h in headers]
    origin = store.get_fork_origin(execution_id)
    decisions: tuple[DecisionView, ...] = ()
    resume_problem = fork_problem = None
    approval = None
    if actions is not None:
        decisions = decisions_for_run(actions, execution_id)
        fork_problem = actions.fork_problem(owner)
        if isinstance(plan, runs.ResumePlan) and plan.shape != "approval":
            resume_problem = actions.plan_problem(plan)
        if pending is not None:
            approval = approval_item(actions, pending, now)
    age = seconds_since(last.created_at)
    return RunPage(
        execution_id=execution_id,
        state=state,
        agent=owner.name,
        runner=owner.describe(),
        resume=(
            ResumeView(
                shape=plan.shape,
                node_id=plan.node_id,
                checkpoint_id=plan.checkpoint_id,
                tool=plan.tool,
                turn=plan.turn,
                reason=plan.reason,
                saved_args=_jsonable(saved_args),
                start_node=plan.start_node,
                member=plan.member,
            )
            if isinstance(plan, runs.ResumePlan)
            else None
        ),
        resume_refusal=plan.reason if isinstance(plan, runs.Refusal) else None,
        verdict=VerdictView(
            tone=verdict.tone,
            headline=verdict.headline,
            resume=verdict.resume,
            fork=verdict.fork,
        ),
        run_error=run_error,
        rows=rows,
        pending=(
            PendingView(
                node_id=pending.node_id,
                reason=pending.reason,
                context=_jsonable(pending.context),
                created_at=pending.created_at,
                context_json=pretty_json(pending.context),
            )
            if pending is not None
            else None
        ),
        idempotency=tuple(cache_view(e, headers) for e in cache),
        fork_of=fork_view(origin) if origin is not None else None,
        forks=lineage(store, execution_id),
        decisions=decisions,
        outbox=OutboxSummary(
            synced=outbox.count("synced"),
            waiting=outbox.count("waiting"),
            quarantined=outbox.count("quarantined"),
            unknown=outbox.count("unknown"),
        ),
        groups=groups,
        resume_problem=resume_problem,
        resume_needs_confirm=age is not None and age < RECENT_SECONDS,
        forkable=tuple(
            r for r, h in zip(rows, visible, strict=True) if runs.fork_refusal(h) is None
        ),
        window=shown,
        fork_problem=fork_problem,
        approval=approval,
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, Unreadable):
        return {"unreadable": value.error}
    return value


def _window_params(request: Request) -> tuple[int | None, int]:
    params = request.query_params
    start_text = params.get("from")
    start = None
    if start_text is not None:
        if not start_text.isdigit():
            raise BadRequest(f"from={start_text!r} is not a row number")
        start = int(start_text)
    rows = params.get("rows")
    if rows is not None and rows != "all":
        raise BadRequest(f"rows={rows!r}: the only choice is rows=all")
    return start, (MAX_ROWS if rows == "all" else TIMELINE_ROWS)


async def run_page(request: Request) -> Response:
    ctx = context(request)
    execution_id = request.path_params["execution_id"]
    start, window = _window_params(request)
    page = await off_loop(
        lambda: build_run_page(
            ctx.store, execution_id, ctx.extensions.get("actions"), start=start, window=window
        )
    )
    page = dataclasses.replace(page, approver=request.cookies.get(APPROVER_COOKIE, ""))
    return await respond(request, "pages/run.html", page)


# --- one row, opened -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCallView:
    id: str
    name: str
    arguments: Any
    arguments_json: str = html_only("")


@dataclass(frozen=True, slots=True)
class MessageView:
    """One message of the conversation, as a person reads a transcript."""

    role: str
    text: str
    tool_calls: tuple[ToolCallView, ...]
    tool_call_id: str | None


@dataclass(frozen=True, slots=True)
class RowPage:
    execution_id: str
    checkpoint_id: str
    node_id: str
    step_type: str | None
    status: str
    created_at: str
    agent_path: str | None
    #: Columns whose JSON could not be parsed; their raw text is still shown.
    unreadable: tuple[str, ...]
    transcript: tuple[MessageView, ...] | None
    node_input: Any
    node_output: Any
    interrupt_reason: str | None
    interrupt_context: Any
    state_snapshot: Any
    raw: dict[str, str | None] = html_only()
    node_input_json: str = html_only("")
    node_output_json: str = html_only("")
    interrupt_context_json: str = html_only("")
    snapshot_extra_json: str = html_only("")


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return str(content)


def transcript(snapshot: Any) -> tuple[MessageView, ...] | None:
    """The snapshot's ``messages`` as a transcript, or None when it holds none."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("messages"), list):
        return None
    views = []
    for message in snapshot["messages"]:
        if not isinstance(message, dict):
            views.append(MessageView(role="?", text=str(message), tool_calls=(), tool_call_id=None))
            continue
        calls = []
        raw_calls = message.get("tool_calls")
        for call in raw_calls if isinstance(raw_calls, list) else []:
            if isinstance(call, dict):
                arguments = call.get("arguments")
                calls.append(
                    ToolCallView(
                        id=str(call.get("id") or ""),
                        name=str(call.get("name") or "?"),
                        arguments=arguments,
                        arguments_json=pretty_json(arguments),
                    )
                )
        views.append(
            MessageView(
                role=str(message.get("role") or "?"),
                text=_text_of(message.get("content")),
                tool_calls=tuple(calls),
                tool_call_id=message.get("tool_call_id"),
            )
        )
    return tuple(views)


def build_row_page(store: Store, execution_id: str, checkpoint_id: str) -> RowPage:
    detail = store.get_row(checkpoint_id)
    if detail is None or detail.header.execution_id != execution_id:
        raise NotFound(f"run {execution_id!r} has no row {checkpoint_id!r}")
    h = detail.header
    snapshot = detail.state_snapshot
    extra: Any = snapshot
    if isinstance(snapshot, dict):
        extra = {k: v for k, v in snapshot.items() if k != "messages"}
    return RowPage(
        execution_id=execution_id,
        checkpoint_id=h.checkpoint_id,
        node_id=h.node_id,
        step_type=h.step_type,
        status=h.status,
        created_at=h.created_at,
        agent_path=h.agent_path,
        unreadable=detail.unreadable,
        transcript=transcript(snapshot),
        node_input=_jsonable(detail.node_input),
        node_output=_jsonable(detail.node_output),
        interrupt_reason=h.interrupt_reason,
        interrupt_context=_jsonable(detail.interrupt_context),
        state_snapshot=_jsonable(snapshot),
        raw=dict(detail.raw),
        node_input_json=pretty_json(detail.node_input),
        node_output_json=pretty_json(detail.node_output),
        interrupt_context_json=pretty_json(detail.interrupt_context),
        snapshot_extra_json=pretty_json(extra),
    )


async def row_detail(request: Request) -> Response:
    ctx = context(request)
    page = await off_loop(
        build_row_page,
        ctx.store,
        request.path_params["execution_id"],
        request.path_params["checkpoint_id"],
    )
    return await respond(request, "pages/row.html", page, partial="partials/_row_detail.html")
