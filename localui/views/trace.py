"""The run page's trace section: the SDK's spans of each attempt, on the rows they
belong to, with the run's input and final answer, and a waterfall per attempt.

Spans come from :class:`localui.backends.traces.SpanIndex`; this module only turns
them into view models. In an agent's or a team's run a model call belongs to the
newest ``turn`` row written before it started, a tool call to the newest row of
that tool written before it started: the SDK writes each row just before the call
it describes. A chain writes a node's row after the node ran, so in a chain's run
a call belongs to the first row written once it had ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from localui import runs
from localui.backends.traces import Attempt, Span, SpanIndex
from localui.records import RowHeader
from localui.views.respond import html_only

#: Said when the store's file has no ``spans`` table.
TRACING_OFF = (
    "Tracing was off for this store, so there are no durations, tokens or final answers "
    "to show. Run your agents with FASTAIAGENT_TRACE_ENABLED=true (the default) and the "
    "SDK writes spans into the same local.db; for a PostgreSQL store, serve with "
    "--traces PATH naming the SQLite file the agents traced into."
)
#: Said when spans exist but none belongs to this run.
NO_SPANS = (
    "No trace spans for this run: it ran with tracing off, its spans were pruned, or its "
    "process died before the attempt ended (the SDK writes an attempt's span when it ends; "
    "a chain's first run that raised leaves its span without the run's id)."
)
#: Said while a large store's spans are first indexed.
INDEXING = "Indexing this store's trace spans; the trace shows here when that is done."
#: Waterfall bars narrower than this (percent of the axis) are drawn this wide.
MIN_BAR = 0.6


@dataclass(frozen=True, slots=True)
class StepView:
    """One model call or tool call of an attempt."""

    kind: str
    name: str
    started_at: str | None
    duration_ms: int | None
    #: ``ok``, ``error`` or ``paused`` (the tool asked a person, an interrupt).
    status: str
    model: str | None
    tool: str | None
    tokens_in: int | None
    tokens_out: int | None
    finish_reason: str | None
    error: str | None
    #: The timeline row the call belongs to.
    checkpoint_id: str | None
    summary: str = html_only("")


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar of a waterfall, placed in percent of the attempt's time axis."""

    label: str
    kind: str
    status: str
    x: str
    width: str
    y: int
    title: str


@dataclass(frozen=True, slots=True)
class AttemptView:
    """One attempt of the run: the first run, a resume or a fork."""

    kind: str
    span_id: str
    started_at: str | None
    duration_ms: int | None
    status: str | None
    input: str | None
    output: str | None
    tokens: int | None
    model: str | None
    #: Where a resume re-entered (``agent.resume.node_id``, ``chain.resume.node_id``) and how.
    resume_node: str | None
    resume_kind: str | None
    #: Who approved or rejected the pause this resume continued, when recorded.
    resumed_by: str | None
    approved: bool | None
    steps: tuple[StepView, ...]
    title: str = html_only("")
    bars: tuple[Bar, ...] = html_only(())
    height: int = html_only(0)
    duration: str = html_only("")


@dataclass(frozen=True, slots=True)
class TraceSection:
    #: The store's file (or ``--traces``) holds the SDK's ``spans`` table.
    traced: bool
    input: str | None
    #: The final answer: the ``output`` of the newest attempt that has one.
    answer: str | None
    attempts: tuple[AttemptView, ...]
    #: Why there is nothing to show, in words.
    note: str | None


def duration_ms(span: Span) -> int | None:
    start = runs.parse_time(span.start_time or "")
    end = runs.parse_time(span.end_time or "")
    if start is None or end is None:
        return None
    return max(0, round((end - start).total_seconds() * 1000))


def duration_words(ms: int | None) -> str:
    if ms is None:
        return "unknown duration"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms // 60_000} min {ms % 60_000 // 1000} s"


#: The SDK's exceptions that carry a pause up through the spans it passes (a
#: supervisor's delegating tool is left by its worker's ``_AgentInterrupted``).
_PAUSES = ("InterruptSignal", "_AgentInterrupted")


def _status(span: Span) -> str:
    if span.error and span.error.split(":", 1)[0] in _PAUSES:
        return "paused"
    tool_status = span.text("tool.status")
    if span.status == "ERROR" or (tool_status is not None and tool_status != "ok"):
        return "error"
    return "ok"


def _kind(span: Span) -> str | None:
    if span.name.startswith("llm."):
        return "model"
    if span.name.startswith("tool."):
        return "tool"
    if span.name.startswith("agent."):
        # A chain node's agent, a supervisor's worker, a swarm's member.
        return "agent"
    return None


Timed = Sequence[tuple[datetime, RowHeader, runs.NodeRef]]


def _owner(span: Span, kind: str, rows: Timed) -> str | None:
    """The row written last before the call started, of the call's turn or tool:
    agents and teams write a turn's or a tool's row just before the call."""

    start = runs.parse_time(span.start_time or "")
    if start is None:
        return None
    tool = span.text("tool.name") if kind == "tool" else None
    best: str | None = None
    for at, row, node in rows:
        if at > start:
            break
        if kind == "model" and node.tool is None and node.turn is not None:
            best = row.checkpoint_id
        elif kind == "tool" and node.tool is not None and node.tool == tool:
            best = row.checkpoint_id
    return best


def _chain_owner(span: Span, rows: Timed) -> str | None:
    """The first row written once the call had ended: a chain writes a node's row
    after the node ran (its pause row, when the node asked a person)."""
    end = runs.parse_time(span.end_time or "")
    if end is None:
        return None
    return next((row.checkpoint_id for at, row, _ in rows if at >= end), None)


def step_view(span: Span, kind: str, rows: Timed, *, in_chain: bool = False) -> StepView:
    status = _status(span)
    if kind == "agent" and span.text("agent.status") == "paused":
        status = "paused"
    ms = duration_ms(span)
    model = (
        span.text("gen_ai.request.model")
        or span.text("gen_ai.response.model")
        or span.text("agent.llm.model")
    )
    tokens_in = span.number("gen_ai.usage.input_tokens")
    tokens_out = span.number("gen_ai.usage.output_tokens")
    tool = span.text("tool.name") if kind == "tool" else None
    error = span.error or (span.text("tool.error") if status == "error" else None)
    if span.unreadable:
        error = "its attributes are unreadable (not a JSON object)"
    parts = [duration_words(ms)]
    if kind == "agent":
        parts.insert(0, f"agent {span.text('agent.name') or span.name.split('.', 1)[-1]}")
    if model:
        parts.append(model)
    if tokens_in is not None or tokens_out is not None:
        parts.append(f"{tokens_in or 0} tokens in, {tokens_out or 0} out")
    elif kind == "agent" and span.number("agent.tokens_used"):
        parts.append(f"{span.number('agent.tokens_used')} tokens")
    parts.append(status)
    owner = _chain_owner(span, rows) if in_chain else _owner(span, kind, rows)
    return StepView(
        kind=kind,
        name=span.name,
        started_at=span.start_time,
        duration_ms=ms,
        status=status,
        model=model,
        tool=tool,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        finish_reason=span.text("gen_ai.response.finish_reason"),
        error=error,
        checkpoint_id=owner,
        summary=" · ".join(parts),
    )


def _bars(attempt: Attempt, steps: Sequence[tuple[Span, StepView]]) -> tuple[Bar, ...]:
    start = runs.parse_time(attempt.root.start_time or "")
    total = duration_ms(attempt.root)
    if start is None or not total:
        return ()
    bars = []
    for i, (span, step) in enumerate(steps):
        at = runs.parse_time(span.start_time or "")
        if at is None:
            continue
        offset = max(0.0, min(100.0, (at - start).total_seconds() * 100_000 / total))
        width = max(MIN_BAR, min(100.0 - offset, (step.duration_ms or 0) * 100 / total))
        label = step.tool or (step.name if step.kind == "agent" else step.model) or step.name
        bars.append(
            Bar(
                label=label,
                kind=step.kind,
                status=step.status,
                x=f"{offset:.2f}%",
                width=f"{width:.2f}%",
                y=i * 18,
                title=f"{label}: {step.summary}",
            )
        )
    return tuple(bars)


#: What each runner's root span is called in a title.
_RUNNER_WORDS = {"agent": "", "chain": "chain ", "swarm": "swarm ", "supervisor": "supervisor "}


def attempt_view(attempt: Attempt, index: int, rows: Timed) -> AttemptView:
    root = attempt.root
    if attempt.text("resumed_execution_id") or attempt.value("resumed") is True:
        kind = "resume"
    elif attempt.text("forked_execution_id"):
        kind = "fork"
    else:
        kind = "first run" if index == 0 else "run again"
    in_chain = attempt.runner == "chain"
    pairs = []
    for span in attempt.children:
        step_kind = _kind(span)
        if step_kind is not None:
            pairs.append((span, step_view(span, step_kind, rows, in_chain=in_chain)))
    steps = tuple(step for _, step in pairs)
    # A team's resume is told by the member that went on (its agent span's
    # ``agent.resume.*``); a chain's and an agent's by the root itself.
    told = attempt.root if attempt.runner in ("agent", "chain") else _resumed_member(attempt)
    prefix = "chain" if attempt.runner == "chain" else "agent"
    approved = told.attributes.get(f"{prefix}.resume.approved") if told else None
    resumed_by = told.text(f"{prefix}.resume.resolver") if told else None
    resume_node = told.text(f"{prefix}.resume.node_id") if told else None
    ms = duration_ms(root)
    title = f"Attempt {index + 1}: {_RUNNER_WORDS.get(attempt.runner, '')}{kind}"
    if kind == "resume" and resume_node:
        title += f" at {resume_node}"
    if resumed_by:
        verb = "approved" if approved else "rejected" if approved is False else "resumed"
        title += f", {verb} by {resumed_by}"
    return AttemptView(
        kind=kind,
        span_id=root.span_id,
        started_at=root.start_time,
        duration_ms=ms,
        status=_attempt_status(attempt),
        input=attempt.text("input"),
        output=_answer(attempt),
        tokens=root.number(f"{attempt.runner}.tokens_used"),
        model=root.text("agent.llm.model"),
        resume_node=resume_node,
        resume_kind=told.text(f"{prefix}.resume.kind") if told else None,
        resumed_by=resumed_by,
        approved=approved if isinstance(approved, bool) else None,
        steps=steps,
        title=title,
        bars=_bars(attempt, pairs),
        height=max(18, 18 * len(pairs)),
        duration=duration_words(ms),
    )


def _resumed_member(attempt: Attempt) -> Span | None:
    """The first agent span of a team's attempt that resumed the run."""
    return next((s for s in attempt.children if s.text("agent.resumed_execution_id")), None)


def _attempt_status(attempt: Attempt) -> str | None:
    """``completed``, ``paused``, ``failed``...: the root's own word (an agent's, a
    chain's), else, for a team, that of the member that spoke last (a swarm's active
    agent, a supervisor's planner), else ``error`` when the root span failed, else
    ``paused`` when its last call asked a person."""
    said = attempt.text("status")
    if said:
        return said
    root = attempt.root
    members = [
        s
        for s in attempt.children
        if s.parent_span_id == root.span_id and s.name.startswith("agent.")
    ]
    if members and members[-1].text("agent.status"):
        return members[-1].text("agent.status")
    if root.status == "ERROR":
        return "error"
    # A chain's fork says nothing of how it ended: one whose last call asked a
    # person ended waiting on that person.
    calls = [s for s in attempt.children if _kind(s) in ("tool", "agent")]
    return "paused" if calls and _status(calls[-1]) == "paused" else None


def _answer(attempt: Attempt) -> str | None:
    """The attempt's answer: a chain's ``output`` is JSON, and ``null`` (or an empty
    text, from a team that paused) is no answer."""
    output = attempt.text("output")
    if output in (None, "", "null"):
        return None
    return output


def trace_section(
    index: SpanIndex | None, execution_id: str, headers: Sequence[RowHeader]
) -> TraceSection:
    found = index.attempts(execution_id) if index is not None else None
    if found is None:
        return TraceSection(traced=False, input=None, answer=None, attempts=(), note=TRACING_OFF)
    if not found and index is not None and index.indexing:
        return TraceSection(traced=True, input=None, answer=None, attempts=(), note=INDEXING)
    timed = []
    for row in headers:
        at = runs.parse_time(row.created_at)
        if at is not None:
            timed.append((at, row, runs.parse_node(row.node_id)))
    timed.sort(key=lambda t: t[0])
    attempts = tuple(attempt_view(a, i, timed) for i, a in enumerate(found))
    first_input = next((a.input for a in attempts if a.input), None)
    answer = next((a.output for a in reversed(attempts) if a.output), None)
    return TraceSection(
        traced=True,
        input=first_input,
        answer=answer,
        attempts=attempts,
        note=None if attempts else NO_SPANS,
    )


def reentries(section: TraceSection, headers: Sequence[RowHeader]) -> dict[str, str]:
    """Where each later attempt re-entered the timeline: its first row, with the
    attempt's title (``Attempt 2: resume at turn:0/tool:refund, approved by ann``)."""
    marks: dict[str, str] = {}
    timed = [(runs.parse_time(h.created_at), h.checkpoint_id) for h in headers]
    for attempt in section.attempts[1:]:
        start = runs.parse_time(attempt.started_at or "")
        if start is None:
            continue
        first = min(
            ((at, cid) for at, cid in timed if at is not None and at >= start), default=None
        )
        if first is not None:
            marks.setdefault(first[1], attempt.title)
    return marks


def steps_by_row(section: TraceSection) -> dict[str, tuple[StepView, ...]]:
    """The calls of every attempt, keyed by the timeline row they belong to."""
    by_row: dict[str, list[StepView]] = {}
    for attempt in section.attempts:
        for step in attempt.steps:
            if step.checkpoint_id is not None:
                by_row.setdefault(step.checkpoint_id, []).append(step)
    return {k: tuple(v) for k, v in by_row.items()}
