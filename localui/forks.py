"""What a fork would do, as the SDK does it: pure rules over the rows a store hands back.

The SDK's own rules (``Agent.afork`` and ``Chain.afork``, fastaiagent 1.94), which the
tests hold this module to by forking copies with a model and tools that record what
they were sent:

- A branch is a new execution: the ``@idempotent`` cache is keyed by execution id, so
  **no cached result of the source run is reused**; every side effect the branch reaches
  runs again.
- An agent forked **without** an input goes on from the chosen row's conversation
  (``state_snapshot["messages"]``): the model is called again at the row's turn. A call
  the row declares but had no result for (the row before a tool, a pause) is **not
  run**: ``balance_tool_messages`` answers it with the SDK's note, and the model decides
  what to do next.
- An agent forked **with** an input runs a fresh conversation under the new id: the row
  only names the lineage, and the model starts from the new request alone.
- A chain restores the row's state (with ``input`` and ``modified_state`` merged into
  it) and runs the nodes after the row's node, in the chain's topological order.
- A Supervisor or a Swarm has no fork.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localui import runs
from localui.records import CacheEntry, RowDetail, RowHeader

CONTINUED = "continued"
FRESH = "fresh"

#: Tool calls after the branch point whose arguments a preview reads at most; past
#: this it counts them.
MAX_CALLS_SHOWN = 50


@dataclass(frozen=True, slots=True)
class ToolAgain:
    """A tool call the branch may make again: one the source run made after the branch
    point (with a fresh conversation, any the source made)."""

    tool: str
    arguments: Any
    #: A call of this tool stored an ``@idempotent`` result in the source run (the cache
    #: is the only witness of which tools are idempotent: its keys are opaque hashes).
    idempotent: bool
    #: This very call stored one: a side effect the branch repeats if it calls it, since
    #: a branch reuses no cached result.
    cached_in_source: bool
    #: The source row of the call.
    node_id: str
    checkpoint_id: str


@dataclass(frozen=True, slots=True)
class CallNotRun:
    """A call the chosen row declares with no result: the branch does not run it."""

    tool: str
    arguments: Any


@dataclass(frozen=True, slots=True)
class PauseAhead:
    """A pause the source run met after the branch point: a branch that makes the same
    call pauses there too."""

    node_id: str
    reason: str | None


@dataclass(frozen=True, slots=True)
class ForkPlan:
    """What a fork from one row would do."""

    checkpoint_id: str
    node_id: str
    #: Who forks: ``agent`` or ``chain`` (``runs.AGENT``, ``runs.CHAIN``).
    kind: str
    #: ``continued`` (from the row's conversation or state) or ``fresh``.
    conversation: str
    model_called_again: bool
    tools_again: tuple[ToolAgain, ...]
    #: Source tool calls after the branch point not read (past :data:`MAX_CALLS_SHOWN`).
    more_tools: int
    #: Calls the row declares without a result, answered by the SDK's note instead.
    not_run: tuple[CallNotRun, ...]
    pauses_ahead: tuple[PauseAhead, ...]
    #: ``@idempotent`` results the source run stored: a branch reuses none of them.
    cached_results: int
    #: How many messages the branch's conversation starts from (None for a chain).
    messages: int | None
    #: The model turn the branch starts at (an agent), or the chain nodes that run.
    turn: int | None
    nodes_again: tuple[str, ...] = ()
    #: Chain nodes among ``nodes_again`` that call a model.
    model_nodes: tuple[str, ...] = ()


def is_tool_step(row: RowHeader) -> bool:
    """A row the SDK writes before it runs a tool (``tool_call``; on a store too old for
    ``step_type``, a tool node id that is not a pause)."""
    if row.step_type is not None:
        return row.step_type == "tool_call"
    return runs.parse_node(row.node_id).tool is not None and row.status != "interrupted"


def is_pause(row: RowHeader) -> bool:
    return row.status == "interrupted"


def rows_after(rows: Sequence[RowHeader], checkpoint_id: str) -> tuple[RowHeader, ...]:
    """The rows the source wrote after the branch point, in the run's order."""
    for i, row in enumerate(rows):
        if row.checkpoint_id == checkpoint_id:
            return tuple(rows[i + 1 :])
    return ()


def cache_writers(entries: Sequence[CacheEntry], rows: Sequence[RowHeader]) -> dict[str, int]:
    """How many ``@idempotent`` results each row's call stored, judged by time: the SDK
    writes a step's row before it runs it, and the call stores its result while it runs,
    so the newest step row written before an entry is the one that wrote it."""
    if not entries:
        return {}
    # In time order (rows come oldest first, so the sort finds them sorted; it is
    # stable, so of rows written at one instant the later stays later), the newest
    # before an entry is found by bisection, not by a pass over every row per entry.
    steps = sorted(
        (
            (when, r)
            for r in rows
            if not is_pause(r)
            for when in [runs.parse_time(r.created_at)]
            if when is not None
        ),
        key=lambda step: step[0],
    )
    times = [when for when, _ in steps]
    written: dict[str, int] = {}
    for entry in entries:
        at = runs.parse_time(entry.created_at)
        if at is None:
            continue
        before = bisect.bisect_right(times, at)
        if before:
            best = steps[before - 1][1]
            written[best.checkpoint_id] = written.get(best.checkpoint_id, 0) + 1
    return written


def unanswered_calls(snapshot: Any) -> tuple[CallNotRun, ...]:
    """The tool calls the snapshot's conversation declares and has no result for: the
    ones ``balance_tool_messages`` answers with the SDK's note."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("messages"), list):
        return ()
    messages = [m for m in snapshot["messages"] if isinstance(m, dict)]
    answered = {m.get("tool_call_id") for m in messages if isinstance(m.get("tool_call_id"), str)}
    found: list[CallNotRun] = []
    for message in messages:
        if message.get("role") != "assistant" or not isinstance(message.get("tool_calls"), list):
            continue
        for call in message["tool_calls"]:
            if isinstance(call, dict) and call.get("id") not in answered:
                found.append(CallNotRun(str(call.get("name") or "?"), call.get("arguments")))
    return tuple(found)


def tool_calls(
    rows: Sequence[RowHeader],
    candidates: Sequence[RowHeader],
    details: Mapping[str, RowDetail],
    written: Mapping[str, int],
) -> tuple[ToolAgain, ...]:
    """The tool calls of ``candidates`` (tool rows of ``rows``), with the arguments their
    rows hold and what the source's cache says of them."""
    calls = []
    cached_tools = {
        runs.parse_node(row.node_id).tool or row.node_id
        for row in rows
        if written.get(row.checkpoint_id)
    }
    for row in candidates:
        detail = details.get(row.checkpoint_id)
        arguments = detail.node_input if detail is not None else None
        tool = runs.parse_node(row.node_id).tool or row.node_id
        if detail is not None and isinstance(detail.state_snapshot, dict):
            named = detail.state_snapshot.get("tool_name")
            tool = named if isinstance(named, str) and named else tool
        cached = written.get(row.checkpoint_id, 0) > 0
        idempotent = cached or tool in cached_tools or row.node_id in cached_tools
        calls.append(ToolAgain(tool, arguments, idempotent, cached, row.node_id, row.checkpoint_id))
    return tuple(calls)


def calls_to_read(
    rows: Sequence[RowHeader], base: RowHeader, *, fresh: bool
) -> tuple[tuple[RowHeader, ...], int]:
    """The source's tool rows a preview names (at most :data:`MAX_CALLS_SHOWN`) and how
    many more there are: those after the branch point, or with a fresh conversation
    every one the run made."""
    scope = rows if fresh else rows_after(rows, base.checkpoint_id)
    tools = [r for r in scope if is_tool_step(r)]
    return tuple(tools[:MAX_CALLS_SHOWN]), max(0, len(tools) - MAX_CALLS_SHOWN)


def agent_plan(
    base: RowDetail,
    rows: Sequence[RowHeader],
    calls: Mapping[str, RowDetail],
    cache: Sequence[CacheEntry],
    *,
    new_input: str | None,
) -> ForkPlan:
    """An agent's fork from ``base`` (see the module's docstring). ``calls`` holds the
    details of the tool rows :func:`calls_to_read` named."""
    fresh = bool(new_input)
    candidates, more = calls_to_read(rows, base.header, fresh=fresh)
    written = cache_writers(cache, rows)
    scope = rows if fresh else rows_after(rows, base.header.checkpoint_id)
    snapshot = base.state_snapshot if isinstance(base.state_snapshot, dict) else {}
    messages = snapshot.get("messages")
    turn = snapshot.get("turn")
    return ForkPlan(
        checkpoint_id=base.header.checkpoint_id,
        node_id=base.header.node_id,
        kind=runs.AGENT,
        conversation=FRESH if fresh else CONTINUED,
        model_called_again=True,
        tools_again=tool_calls(rows, candidates, calls, written),
        more_tools=more,
        not_run=() if fresh else unanswered_calls(snapshot),
        pauses_ahead=tuple(PauseAhead(r.node_id, r.interrupt_reason) for r in scope if is_pause(r)),
        cached_results=len(cache),
        messages=None if fresh else len(messages) if isinstance(messages, list) else 0,
        turn=0 if fresh else turn if isinstance(turn, int) else None,
    )


def chain_plan(
    base: RowDetail,
    rows: Sequence[RowHeader],
    cache: Sequence[CacheEntry],
    order: Sequence[str],
    node_kinds: Mapping[str, str],
    node_tools: Mapping[str, str],
) -> ForkPlan:
    """A chain's fork from ``base``: the nodes after its node in the chain's order run,
    from the row's state (``input`` merged in when one is given). Its tool nodes run up
    to the first where the source paused: the rest only once a person decides."""
    node = base.header.node_id
    after = tuple(order[order.index(node) + 1 :]) if node in order else ()
    written = cache_writers(cache, rows)
    later = rows_after(rows, base.header.checkpoint_id)
    paused_at = {r.node_id for r in later if is_pause(r)}
    source = {r.node_id: r for r in rows if not is_pause(r)}
    tools = []
    for name in after:
        if node_kinds.get(name) == "tool":
            row = source.get(name)
            cached = row is not None and written.get(row.checkpoint_id, 0) > 0
            checkpoint_id = row.checkpoint_id if row is not None else ""
            tool = node_tools.get(name, name)
            tools.append(ToolAgain(tool, None, cached, cached, name, checkpoint_id))
        if name in paused_at:
            break
    return ForkPlan(
        checkpoint_id=base.header.checkpoint_id,
        node_id=node,
        kind=runs.CHAIN,
        conversation=CONTINUED,
        model_called_again=any(node_kinds.get(n) == "agent" for n in after),
        tools_again=tuple(tools),
        more_tools=0,
        not_run=(),
        pauses_ahead=tuple(PauseAhead(r.node_id, r.interrupt_reason) for r in later if is_pause(r)),
        cached_results=len(cache),
        messages=None,
        turn=None,
        nodes_again=after,
        model_nodes=tuple(n for n in after if node_kinds.get(n) == "agent"),
    )
