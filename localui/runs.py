"""The rules of a run: its state, what a resume or a fork would do, its timeline.

Pure functions over store records, no I/O. They follow the SDK's own
``latest_resumable`` / ``latest_forkable`` / ``is_run_end``
(``fastaiagent/chain/checkpoint.py``) and ``Agent.aresume``; the tests hold
them to the SDK's answers on runs the SDK really wrote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from localui.records import (
    FORK_ORIGIN_NODE,
    FORK_ORIGIN_STEP,
    RUN_END_STEP,
    RowHeader,
    Unreadable,
)

COMPLETED = "completed"
FAILED = "failed"
PAUSED = "paused"
ORPHANED = "orphaned"
UNFINISHED = "unfinished"

_TURN = re.compile(r"^turn:(\d+)(?:/tool:(.+))?$")


@dataclass(frozen=True, slots=True)
class NodeRef:
    """What an agent's node id says: ``turn:N`` or ``turn:N/tool:X``."""

    turn: int | None
    tool: str | None


def parse_node(node_id: str) -> NodeRef:
    match = _TURN.match(node_id)
    if match is None:
        # The SDK decides "tool boundary" by this substring alone (Agent.aresume).
        tool = node_id.split("/tool:", 1)[1] if "/tool:" in node_id else None
        return NodeRef(turn=None, tool=tool)
    return NodeRef(turn=int(match.group(1)), tool=match.group(2))


def is_run_end(step_type: str | None) -> bool:
    """The SDK's ``is_run_end``: only ``step_type`` marks the end of a run."""
    return step_type == RUN_END_STEP


def is_fork_origin(row: RowHeader) -> bool:
    return row.step_type == FORK_ORIGIN_STEP or row.node_id == FORK_ORIGIN_NODE


def run_state(last_step_type: str | None, last_status: str, has_pending: bool) -> str:
    """A run's state from its newest row and whether its pending row is still there."""
    if is_run_end(last_step_type):
        return FAILED if last_status == "failed" else COMPLETED
    if last_status == "interrupted":
        return PAUSED if has_pending else ORPHANED
    return UNFINISHED


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """Where a resume would re-enter, and how.

    ``shape`` is ``tool`` (re-invoke the saved tool with its saved arguments, no
    model call), ``turn`` (re-issue the model call of that turn) or ``approval``
    (needs a person's ``Resume``; re-invokes the paused tool with the answer).
    """

    shape: str
    node_id: str
    checkpoint_id: str
    tool: str | None
    turn: int | None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an action cannot work on this run, in words for a person."""

    action: str
    reason: str


def reentry_row(rows: Sequence[RowHeader]) -> RowHeader | None:
    """The row a resume re-enters at: the newest row, stepping back over a run-end marker.

    ``rows`` are in the order written. This is ``latest_resumable`` without its
    refusal; :func:`resume_plan` refuses where the SDK would.
    """
    for row in reversed(rows):
        if not is_run_end(row.step_type):
            return row
    return None


def resume_plan(state: str, rows: Sequence[RowHeader]) -> ResumePlan | Refusal:
    """What ``Agent.aresume`` would do with this run, or why it cannot."""
    if state == COMPLETED:
        return Refusal(
            "resume",
            "The run completed: the SDK refuses to resume it (AlreadyResumed), because that "
            "would repeat its side effects. Fork it from a row to run part of it again.",
        )
    if state == ORPHANED:
        return Refusal(
            "resume",
            "The run paused, and its pending approval was claimed, but the run never went on. "
            "The SDK cannot resume it: a resume without an answer is refused for a paused "
            "row, and an answer needs the pending row that is gone. Fork it from a row to "
            "run it again.",
        )
    row = reentry_row(rows)
    if row is None:
        return Refusal("resume", "The run holds no step to re-enter at.")
    node = parse_node(row.node_id)
    if state == PAUSED:
        return ResumePlan(
            shape="approval",
            node_id=row.node_id,
            checkpoint_id=row.checkpoint_id,
            tool=node.tool,
            turn=node.turn,
            reason=row.interrupt_reason,
        )
    if row.status == "interrupted":
        # A failed run whose last step is a pause: the claim already happened.
        return Refusal(
            "resume",
            "The run failed after its pause was claimed. The SDK refuses a resume without an "
            "answer at a paused row, and the pending row an answer needs is gone. Fork it "
            "to run it again.",
        )
    return ResumePlan(
        shape="tool" if node.tool is not None else "turn",
        node_id=row.node_id,
        checkpoint_id=row.checkpoint_id,
        tool=node.tool,
        turn=node.turn,
    )


def fork_refusal(row: RowHeader) -> Refusal | None:
    """Why a fork from this row is refused (the SDK's ``latest_forkable``), or None."""
    if is_run_end(row.step_type):
        return Refusal(
            "fork",
            "This is the run-end marker, not a step: there is nothing to run forward from it. "
            "Fork from a step before it.",
        )
    if is_fork_origin(row):
        return Refusal(
            "fork",
            "This is the fork marker that opens this run; fork from the source row it points "
            "to, or from a later step.",
        )
    return None


@dataclass(frozen=True, slots=True)
class TurnGroup:
    """Consecutive timeline rows that belong together: one model turn and its tools."""

    key: str
    title: str
    rows: tuple[RowHeader, ...]


def group_timeline(rows: Sequence[RowHeader]) -> tuple[TurnGroup, ...]:
    """Group rows as written: a ``turn:N`` with its tool and pause rows, the fork
    origin and the run end on their own, any other node (a Chain's) by node id."""
    groups: list[TurnGroup] = []
    for row in rows:
        if is_fork_origin(row):
            key, title = "fork", "Fork origin"
        elif is_run_end(row.step_type):
            key, title = "end", "Run end"
        else:
            node = parse_node(row.node_id)
            if node.turn is not None:
                key, title = f"turn:{node.turn}", f"Turn {node.turn}"
            else:
                key, title = f"node:{row.node_id}", row.node_id
        if groups and groups[-1].key == key:
            last = groups[-1]
            groups[-1] = TurnGroup(key=last.key, title=last.title, rows=(*last.rows, row))
        else:
            groups.append(TurnGroup(key=key, title=title, rows=(row,)))
    return tuple(groups)


def parse_time(value: str) -> datetime | None:
    """An SDK timestamp (ISO 8601, UTC) as an aware datetime, or None if unreadable."""
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def age_words(value: str, now: datetime) -> str:
    """``"3 min ago"``: how long before ``now`` a timestamp was."""
    then = parse_time(value)
    if then is None:
        return "at an unknown time"
    seconds = int((now - then).total_seconds())
    if seconds < 0:
        return "just now"
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


def short_json(value: Any, limit: int = 160) -> str:
    """Compact JSON for a sentence, cut at ``limit`` characters."""
    if isinstance(value, Unreadable):
        return "(unreadable)"
    text = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The banner on a run page: what state the run is in, and what each action would do."""

    tone: str
    headline: str
    resume: str
    fork: str


def verdict(
    state: str,
    plan: ResumePlan | Refusal,
    *,
    last: RowHeader,
    now: datetime,
    saved_args: Any = None,
    run_error: str | None = None,
    cached_calls: int = 0,
) -> Verdict:
    """Plain words for the run page's banner."""
    when = age_words(last.created_at, now)
    cache_words = (
        f" {cached_calls} @idempotent result{'s' if cached_calls != 1 else ''} will be answered "
        "from the cache instead of running again."
        if cached_calls
        else ""
    )
    fork = "Fork branches a new run from any executed row; this run stays as it is."
    if isinstance(plan, Refusal):
        resume = plan.reason
    elif plan.shape == "approval":
        resume = (
            f"Approve or reject to resume: the paused tool `{plan.tool}` runs again with the "
            "answer, then the agent goes on." + cache_words
        )
    elif plan.shape == "tool":
        resume = (
            f"Resume re-invokes `{plan.tool}` with the saved arguments {short_json(saved_args)}; "
            "the model is not called again." + cache_words
        )
    else:
        resume = (
            f"Resume re-issues the model call of turn {plan.turn if plan.turn is not None else '?'}"
            f" (`{plan.node_id}`)." + cache_words
        )

    if state == COMPLETED:
        return Verdict("ok", f"Completed {when}: the run wrote its end marker.", resume, fork)
    if state == FAILED:
        error = f": {run_error}" if run_error else ""
        return Verdict("bad", f"Failed {when}{error}.", resume, fork)
    if state == PAUSED:
        reason = f" for `{last.interrupt_reason}`" if last.interrupt_reason else ""
        return Verdict(
            "wait",
            f"Paused{reason} at `{last.node_id}` {when}, waiting for a person.",
            resume,
            fork,
        )
    if state == ORPHANED:
        return Verdict(
            "bad",
            f"Orphaned pause at `{last.node_id}` ({when}): its approval was claimed but the run "
            "never continued.",
            resume,
            fork,
        )
    where = (
        f"inside tool `{plan.tool}`"
        if isinstance(plan, ResumePlan) and plan.shape == "tool"
        else f"waiting on the model at `{last.node_id}`"
    )
    return Verdict(
        "warn",
        f"No end marker: still running, or its process died {where} (last row {when}).",
        resume,
        fork,
    )
