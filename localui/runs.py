"""The rules of a run: its state, what a resume or a fork would do, its timeline.

Pure functions over store records, no I/O. They follow the SDK's own
``latest_resumable`` / ``latest_forkable`` / ``is_run_end``
(``fastaiagent/chain/checkpoint.py``) and ``Agent.aresume``; the tests hold
them to the SDK's answers on runs the SDK really wrote.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from localui.records import (
    FORK_ORIGIN_NODE,
    FORK_ORIGIN_STEP,
    RUN_END_STEP,
    RowHeader,
    RunFacts,
)

COMPLETED = "completed"
FAILED = "failed"
PAUSED = "paused"
ORPHANED = "orphaned"
UNFINISHED = "unfinished"
#: A failed run stopped on purpose (SDK 1.91 agents, 1.93 chains and swarms): its
#: run-end row is ``failed`` with ``state_snapshot["run_reason"]`` saying why.
CANCELLED = "cancelled"
TIMED_OUT = "timed_out"

#: The SDK's ``run_reason`` (``fastaiagent.agent.run_control``) -> the state it makes.
_STOPPED_BY = {"cancelled": CANCELLED, "timeout": TIMED_OUT}

#: The states of a run that ended ``failed``: where a total of failures is asked,
#: a cancelled or timed-out run is one of them.
FAILURES = (FAILED, CANCELLED, TIMED_OUT)

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


def run_state(
    last_step_type: str | None,
    last_status: str,
    has_pending: bool,
    run_reason: str | None = None,
) -> str:
    """A run's state from its newest row (and, on a run-end row, its ``run_reason``)
    and whether its pending row is still there."""
    if is_run_end(last_step_type):
        if last_status != "failed":
            return COMPLETED
        return _STOPPED_BY.get(run_reason or "", FAILED)
    if last_status == "interrupted":
        return PAUSED if has_pending else ORPHANED
    return UNFINISHED


def state_of(facts: RunFacts) -> str:
    """A run's state from what the runs index keeps of it."""
    return run_state(facts.last_step_type, facts.last_status, facts.has_pending, facts.run_reason)


#: Why a run needs a person (``/attention``), in the order the page explains them.
STALLED = "stalled"
OVERDUE = "overdue"
QUARANTINED = "quarantined"
ATTENTION_REASONS = (STALLED, FAILED, ORPHANED, OVERDUE, QUARANTINED)


def is_stalled(state: str, last_at: str, now: datetime, stale_after: float) -> bool:
    """An unfinished run whose newest row is older than ``stale_after`` seconds: its
    process most likely died (a live one writes a row before every call)."""
    if state != UNFINISHED:
        return False
    then = parse_time(last_at)
    return then is not None and (now - then).total_seconds() > stale_after


def is_overdue(state: str, last_at: str, now: datetime, remind_after: float) -> bool:
    """A pause that has waited for a person longer than ``remind_after`` seconds (a
    paused run's newest row is its paused row)."""
    if state != PAUSED:
        return False
    then = parse_time(last_at)
    return then is not None and (now - then).total_seconds() > remind_after


def needs_a_person_as_failed(state: str, has_pending: bool) -> bool:
    """Whether a run that ended ``failed`` needs a person. A cancelled run does not:
    someone stopped it on purpose, unless it was cancelled while a pause of it still
    waited for an answer. A run that ran out of time failed at its work."""
    if state == CANCELLED:
        return has_pending
    return state in (FAILED, TIMED_OUT)


def attention_reasons(
    state: str,
    last_at: str,
    rows_quarantined: int,
    now: datetime,
    *,
    stale_after: float,
    remind_after: float,
    has_pending: bool = False,
) -> tuple[str, ...]:
    """Every reason a run needs a person, in :data:`ATTENTION_REASONS` order."""
    found = []
    if is_stalled(state, last_at, now, stale_after):
        found.append(STALLED)
    if needs_a_person_as_failed(state, has_pending):
        found.append(FAILED)
    if state == ORPHANED:
        found.append(state)
    if is_overdue(state, last_at, now, remind_after):
        found.append(OVERDUE)
    if rows_quarantined > 0:
        found.append(QUARANTINED)
    return tuple(found)


def cutoff(now: datetime, seconds: float) -> str:
    """The instant ``seconds`` before ``now`` as the SDK writes its times (ISO 8601,
    UTC), so the stores compare it with their rows' times as they are."""
    return (now - timedelta(seconds=seconds)).astimezone(UTC).isoformat()


#: The SDK's checkpointers, whose ``list`` orders a run's rows differently.
SQLITE = "sqlite"
POSTGRES = "postgres"
#: How many rows ``latest_resumable`` and ``Agent.aresume`` read (``list(..., limit=500)``).
SDK_LIST_LIMIT = 500

#: The runners that own runs: the top of ``agent_path`` names one of them.
AGENT = "agent"
CHAIN = "chain"
SUPERVISOR = "supervisor"
SWARM = "swarm"

_RUNNER_TITLES = {AGENT: "Agent", CHAIN: "Chain", SUPERVISOR: "Supervisor", SWARM: "Swarm"}


@dataclass(frozen=True, slots=True)
class Owner:
    """The runner that owns a run: the one whose ``aresume``/``afork`` continue it."""

    kind: str
    name: str

    def describe(self) -> str:
        return f"{_RUNNER_TITLES.get(self.kind, self.kind)} {self.name!r}"


def _path_segment(agent_path: str | None, kind: str) -> str | None:
    """The name after ``kind:`` in an ``agent_path`` (``swarm:s/agent:a/tool:t``)."""
    for segment in (agent_path or "").split("/"):
        label, sep, name = segment.partition(":")
        if sep and label == kind and name:
            return name
    return None


def run_owner(rows: Sequence[RowHeader]) -> Owner:
    """Who owns the run: the runner whose execution it is, never the agent of the newest row.

    A Supervisor's or Swarm's rows nest their members' under ``supervisor:S`` or
    ``swarm:S``; a plain agent writes ``agent:A``, and an agent it runs inside its own
    execution writes ``agent:A/agent:B`` beside A's rows: all of those are the outer
    runner's. An agent used as a tool with an execution id of its own writes
    ``agent:A/agent:B`` too, but A wrote no row of that execution and never resumes
    it: B does (``B.aresume``), so B owns it. Hence the owner is read from the
    shallowest path of the run's rows (:func:`execution_owner`). A Chain writes no
    path at all: its rows are node ids under the chain's name.
    """
    shallowest = owner_path([row.agent_path for row in rows])
    if shallowest is not None:
        owner = execution_owner(shallowest)
        if owner is not None:
            return owner
    steps = [r for r in rows if not is_run_end(r.step_type) and not is_fork_origin(r)]
    if any(r.step_type == "node" or parse_node(r.node_id).turn is None for r in steps):
        return Owner(CHAIN, rows[0].agent if rows else "")
    return Owner(AGENT, rows[0].agent if rows else "")


def path_depth(agent_path: str) -> int:
    """How deep an ``agent_path`` nests: 0 for ``agent:A``, 1 for ``agent:A/agent:B``."""
    return agent_path.count("/")


def owner_path(paths: Sequence[str | None]) -> str | None:
    """The shallowest of a run's ``agent_path`` values that names an owner, the first of
    them on a tie (``paths`` in the order the rows were written); None when none does."""
    best: str | None = None
    # A run's thousands of rows carry a handful of paths: each is judged once, in the
    # order first written, so a tie still goes to the first.
    for path in dict.fromkeys(paths):
        if path and execution_owner(path) is not None:
            if best is None or path_depth(path) < path_depth(best):
                best = path
    return best


#: The agents above an agent-as-tool in its own execution's paths: they wrote no row.
#: Only those with a runner below them (``agent:A/tool:t`` is A's own tool row).
ENCLOSING_AGENTS = r"^(?:agent:[^/]*/)+(?=(?:agent|supervisor|swarm):)"
_ENCLOSING_AGENTS = re.compile(ENCLOSING_AGENTS)


def execution_owner(shallowest_path: str | None) -> Owner | None:
    """The owner a run's shallowest ``agent_path`` names (see :func:`run_owner`).

    When even the shallowest row is nested under ``agent:`` segments, those agents
    wrote nothing in this execution: the path is an agent-as-tool's, run under its
    own id, and the owner is the first runner below them. A Supervisor or Swarm at
    the top owns its members' rows.
    """
    if not shallowest_path:
        return None
    return _path_owner(_ENCLOSING_AGENTS.sub("", shallowest_path))


def _path_owner(agent_path: str | None) -> Owner | None:
    top = (agent_path or "").split("/", 1)[0]
    kind, sep, name = top.partition(":")
    if sep and name and kind in (AGENT, SUPERVISOR, SWARM):
        return Owner(kind, name)
    return None


def path_owner_name(shallowest_path: str | None) -> str | None:
    """The owner's name a run's shallowest ``agent_path`` gives, or None when it names
    none: the runs indexes name runs by it."""
    owner = execution_owner(shallowest_path)
    return owner.name if owner is not None else None


def pause_owner_needs_run(agent_path: str | None) -> bool:
    """Whether a pause's ``agent_path`` alone leaves its owner open: an agent under an
    agent, which is the outer one's in its execution, or its own under an id of its own."""
    top = _path_owner(agent_path)
    return top is not None and top.kind == AGENT and "/agent:" in (agent_path or "")


def pause_owner(
    agent_path: str | None, agent: str, node_id: str, run_agent: str | None = None
) -> Owner:
    """The owner as a pending approval's own row says (the queue reads no run rows).

    A pause nested as ``agent:A/agent:B`` is A's when B ran inside A's execution and
    B's when B ran as a tool under its own id; the row alone cannot tell. ``run_agent``
    is the run's owner by name as the runs index keeps it, which can: without it, a
    pause written by B itself (``agent`` is B) is taken for B's own execution.
    """
    top = _path_owner(agent_path)
    if top is None:
        return Owner(AGENT if parse_node(node_id).turn is not None else CHAIN, agent)
    if top.kind != AGENT:
        return top
    if run_agent is not None and f"agent:{run_agent}" in (agent_path or "").split("/"):
        return Owner(AGENT, run_agent)
    nested = execution_owner(agent_path)
    return nested if nested is not None else top


def pause_member(owner: Owner, agent_path: str | None, agent: str) -> str | None:
    """The team member a pause belongs to: a Supervisor's worker, a Swarm's agent."""
    if owner.kind == SUPERVISOR:
        return _path_segment(agent_path, "worker")
    if owner.kind == SWARM:
        return _path_segment(agent_path, "agent") or agent
    return None


def pruned_remains(rows: Sequence[RowHeader]) -> bool:
    """True when a run holds only paused rows, the first a tool's: what prune leaves.

    An agent writes its ``turn:0`` model-call row before any tool, and prune deletes
    every row but paused ones, so a run that starts at a paused tool row lost the
    rows around it to prune, and may well have gone on after its approval.
    """
    return (
        bool(rows) and all(r.status == "interrupted" for r in rows) and "/tool:" in rows[0].node_id
    )


def sdk_history(rows: Sequence[RowHeader], backend: str) -> tuple[RowHeader, ...]:
    """The rows the SDK's ``list(execution_id, limit=500)`` returns, in its order.

    SQLite orders by ``node_index`` then time: a fork's origin row carries its
    source's index and a Swarm restarts the index at each hand-off, so this is not
    the order written. PostgreSQL orders by time. ``rows`` are in the order written,
    so a stable sort keeps the write order among equal keys.
    """
    if backend == SQLITE:
        ordered = sorted(rows, key=lambda r: (r.node_index, r.created_at))
    else:
        ordered = sorted(rows, key=lambda r: (r.created_at, r.node_index))
    return tuple(ordered[:SDK_LIST_LIMIT])


def _latest_step(history: Sequence[RowHeader], *, prefix: str | None = None) -> RowHeader | None:
    """``latest_resumable``'s step back over a failed run's marker, as the SDK walks it."""
    for row in reversed(history):
        if is_run_end(row.step_type):
            continue
        if prefix is not None and not (row.agent_path or "").startswith(prefix):
            continue
        return row
    return None


def _latest_pause(history: Sequence[RowHeader], *, prefix: str | None = None) -> RowHeader | None:
    """The row ``Agent.aresume`` re-enters after it claimed a pending approval."""
    for row in reversed(history):
        if is_run_end(row.step_type) or row.status != "interrupted":
            continue
        if prefix is not None and not (row.agent_path or "").startswith(prefix):
            continue
        return row
    return None


@dataclass(frozen=True, slots=True)
class FirstAct:
    """What the SDK does first when the run is resumed.

    ``kind`` is ``model`` (a model call of ``agent``), ``tool`` (tool ``name`` of
    ``agent`` re-invoked, no model call before it) or ``node`` (chain node
    ``name`` runs; ``None`` when the chain's node order is not known here).
    """

    kind: str
    agent: str | None
    name: str | None


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """Where a resume would re-enter, and how.

    ``shape`` is ``tool`` (re-invoke the saved tool with its saved arguments, no
    model call), ``turn`` (re-issue the model call of that turn), ``approval``
    (needs a person's ``Resume``), ``node`` (a Chain goes on at a node) or
    ``team`` (a Supervisor runs its planner again). ``checkpoint_id`` is the row
    the SDK re-enters at (or after, for a Chain); ``first`` is what it does first;
    ``note`` says what a person would not expect, in plain words.
    """

    shape: str
    node_id: str
    checkpoint_id: str
    tool: str | None
    turn: int | None
    reason: str | None = None
    owner: Owner = Owner(AGENT, "")
    first: FirstAct = FirstAct("model", None, None)
    start_node: str | None = None
    #: The team member that re-enters: a Supervisor's worker, a Swarm's active agent.
    member: str | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an action cannot work on this run, in words for a person."""

    action: str
    reason: str


def reentry_row(rows: Sequence[RowHeader]) -> RowHeader | None:
    """The newest row that is a step, stepping back over a run-end marker.

    ``rows`` are in the order written. What the SDK really re-enters at can
    differ past 500 rows or on SQLite's order: :func:`resume_plan` decides that.
    """
    for row in reversed(rows):
        if not is_run_end(row.step_type):
            return row
    return None


_COMPLETED_REFUSAL = (
    "The run completed: the SDK refuses to resume it (AlreadyResumed), because that "
    "would repeat its side effects. Fork it from a row to run part of it again."
)
_ORPHANED_REFUSAL = (
    "The run paused, and its pending approval was claimed, but the run never went on. "
    "The SDK cannot resume it: a resume without an answer is refused for a paused "
    "row, and an answer needs the pending row that is gone. Fork it from a row to "
    "run it again."
)
#: Public because the verdict (``localui.words``) tells a pruned pause from an orphaned one.
PRUNED_REFUSAL = (
    "Only the run's paused rows are left: prune deleted the others (it keeps paused rows "
    "whatever their age). The SDK cannot resume it, since no pending approval is left to "
    "answer. Fork it from a row to run it again."
)
_CLAIMED_REFUSAL = (
    "The run failed after its pause was claimed. The SDK refuses a resume without an "
    "answer at a paused row, and the pending row an answer needs is gone. Fork it "
    "to run it again."
)


def _lost_pause(paused: RowHeader, total: int, picked: RowHeader | None) -> Refusal:
    where = (
        f"would re-enter the earlier pause at `{picked.node_id}` instead, re-running the "
        "wrong tool with your answer"
        if picked is not None
        else "would claim the pending approval and then fail with AlreadyResumed, "
        "losing the pause for good"
    )
    return Refusal(
        "approve",
        f"Approving here would lose this pause: the SDK looks for the paused row among the "
        f"first {SDK_LIST_LIMIT} rows it reads of the run, this run has {total} rows and "
        f"the paused row `{paused.node_id}` is not the one it finds, so it {where}. Nothing "
        "has been claimed. Fork the run from the row before the pause to run that step "
        "again as a new run, and leave this pause waiting.",
    )


def resume_plan(
    state: str,
    rows: Sequence[RowHeader],
    *,
    backend: str,
    chain_order: Sequence[str] | None = None,
) -> ResumePlan | Refusal:
    """What the owner's ``aresume`` would do with this run on ``backend``, or why not.

    ``chain_order`` is the node order of the registered Chain that owns the run
    (its topological order), when there is one: without it the node a Chain
    resumes at is known only as "the one after" its last row.
    """
    if state == COMPLETED:
        return Refusal("resume", _COMPLETED_REFUSAL)
    if state == ORPHANED:
        return Refusal("resume", PRUNED_REFUSAL if pruned_remains(rows) else _ORPHANED_REFUSAL)
    newest = reentry_row(rows)
    if newest is None:
        return Refusal("resume", "The run holds no step to re-enter at.")
    owner = run_owner(rows)
    history = sdk_history(rows, backend)
    if state == PAUSED:
        return _approval_plan(owner, newest, rows, history)
    # A failed run re-enters where ``latest_resumable`` says, in the SDK's own order
    # and within its first 500 rows; one that just stopped, at its newest row.
    failed = state in FAILURES
    row = _latest_step(history) if failed else newest
    if row is None:
        return Refusal("resume", "The run holds no step the SDK would re-enter at.")
    if row.status == "interrupted":
        return Refusal("resume", _CLAIMED_REFUSAL)
    note = _reentry_note(row, newest, rows, history) if failed else None
    if owner.kind == CHAIN:
        return _chain_plan(owner, row, chain_order, note)
    if owner.kind == SUPERVISOR:
        return _supervisor_plan(owner, row, note)
    if owner.kind == SWARM:
        agent = _path_segment(row.agent_path, "agent")
        # The Swarm re-runs its active agent from the start of its loop, whatever row
        # it stopped at (a tool's, for one killed in a tool): the first row the SDK
        # writes is that agent's ``turn:0``, so that is where it re-enters.
        return ResumePlan(
            shape="turn",
            node_id="turn:0",
            checkpoint_id=row.checkpoint_id,
            tool=None,
            turn=0,
            owner=owner,
            first=FirstAct("model", agent, None),
            member=agent,
            note=note,
        )
    node = parse_node(row.node_id)
    if is_fork_origin(row):
        note = (
            "The SDK re-enters at this fork's origin marker: it goes on with the source "
            "run's conversation from the row this run was forked at, and this fork's own "
            "input is not used again."
        )
    tool = node.tool
    return ResumePlan(
        shape="tool" if tool is not None else "turn",
        node_id=row.node_id,
        checkpoint_id=row.checkpoint_id,
        tool=tool,
        turn=node.turn,
        owner=owner,
        first=FirstAct("tool" if tool is not None else "model", owner.name, tool),
        note=note,
    )


def _reentry_note(
    row: RowHeader,
    newest: RowHeader,
    rows: Sequence[RowHeader],
    history: Sequence[RowHeader],
) -> str | None:
    """Words for a failed run the SDK re-enters elsewhere than at its newest step."""
    if row.checkpoint_id == newest.checkpoint_id or is_fork_origin(row):
        return None
    position = next(i for i, r in enumerate(rows) if r.checkpoint_id == row.checkpoint_id)
    again = len(rows) - 1 - position
    if len(rows) > len(history):
        why = (
            f"the SDK reads only the first {SDK_LIST_LIMIT} of this run's {len(rows)} rows, "
            f"so it re-enters at `{row.node_id}` (row {position + 1})"
        )
    else:
        why = f"the SDK's row order puts `{row.node_id}` (row {position + 1}) last"
    return f"Not at the newest step: {why}, and what the {again} rows after it did runs again."


def _approval_plan(
    owner: Owner,
    paused: RowHeader,
    rows: Sequence[RowHeader],
    history: Sequence[RowHeader],
) -> ResumePlan | Refusal:
    node = parse_node(paused.node_id)
    common = ResumePlan(
        shape="approval",
        node_id=paused.node_id,
        checkpoint_id=paused.checkpoint_id,
        tool=node.tool,
        turn=node.turn,
        reason=paused.interrupt_reason,
        owner=owner,
    )
    if owner.kind == CHAIN:
        # ``Chain.resume`` re-runs the node the pending row names; it reads no list.
        return replace(
            common, first=FirstAct("node", None, paused.node_id), start_node=paused.node_id
        )
    if owner.kind == SUPERVISOR:
        worker = _path_segment(paused.agent_path, "worker")
        if worker is None:
            return Refusal(
                "approve",
                "The run paused in the supervisor itself, not in one of its workers: a "
                "resume re-runs the planner, and no worker would claim this pause.",
            )
        prefix = f"supervisor:{owner.name}/worker:{worker}"
        picked = _latest_pause(history, prefix=prefix)
        if picked is None or picked.checkpoint_id != paused.checkpoint_id:
            return _lost_pause(paused, len(rows), picked)
        return replace(common, first=FirstAct("model", owner.name, None), member=worker)
    picked = _latest_pause(history)
    if picked is None or picked.checkpoint_id != paused.checkpoint_id:
        return _lost_pause(paused, len(rows), picked)
    agent = _path_segment(paused.agent_path, "agent") if owner.kind == SWARM else owner.name
    return replace(
        common,
        first=FirstAct("tool", agent or paused.agent, node.tool),
        member=agent if owner.kind == SWARM else None,
    )


def _chain_plan(
    owner: Owner, row: RowHeader, chain_order: Sequence[str] | None, note: str | None
) -> ResumePlan:
    """``Chain.resume`` starts at the node after ``row``; with no such node, at the top."""
    start: str | None = None
    if chain_order is not None:
        order = list(chain_order)
        after = order.index(row.node_id) + 1 if row.node_id in order else None
        if after is not None and after < len(order):
            start = order[after]
        else:
            start = order[0] if order else None
            note = (
                f"`{row.node_id}` is the chain's last node, or not one of its nodes: the SDK "
                "finds no node after it and runs the whole chain again from its first node."
            )
    return ResumePlan(
        shape="node",
        node_id=row.node_id,
        checkpoint_id=row.checkpoint_id,
        tool=None,
        turn=None,
        owner=owner,
        first=FirstAct("node", None, start),
        start_node=start,
        note=note,
    )


def _supervisor_plan(owner: Owner, row: RowHeader, note: str | None) -> ResumePlan:
    worker = _path_segment(row.agent_path, "worker")
    node = parse_node(row.node_id)
    return ResumePlan(
        shape="team",
        node_id=row.node_id,
        checkpoint_id=row.checkpoint_id,
        tool=node.tool if worker is not None else None,
        turn=node.turn,
        owner=owner,
        first=FirstAct("model", owner.name, None),
        member=worker,
        note=note,
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


def skipped_siblings(snapshot: Any) -> tuple[str, ...]:
    """The tools of the other calls in the turn a pre-tool row re-enters that have no
    result yet. A resume re-invokes the row's own call only; the SDK answers these
    "not run on resume" (``balance_tool_messages``) and never runs them. A snapshot of
    any other shape (rows are whatever the store holds) has none."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("messages"), list):
        return ()
    messages = [m for m in snapshot["messages"] if isinstance(m, dict)]
    answered = {m.get("tool_call_id") for m in messages if isinstance(m.get("tool_call_id"), str)}
    turn = next(
        (
            m
            for m in reversed(messages)
            if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list)
        ),
        None,
    )
    own = snapshot.get("tool_call_id")
    return tuple(
        str(call.get("name"))
        for call in (turn or {}).get("tool_calls") or []
        if isinstance(call, dict)
        and isinstance(call.get("id"), str)
        and call.get("id") != own
        and call.get("id") not in answered
    )


def stopped_at(last_node_id: str, last_step_type: str | None) -> str:
    """``tool``, ``turn`` or ``node``: what a run with no end marker stopped at."""
    if last_step_type == "node" or (
        parse_node(last_node_id).turn is None and "/tool:" not in last_node_id
    ):
        return "node"
    return "tool" if parse_node(last_node_id).tool is not None else "turn"


def seconds_since(value: str) -> float | None:
    """How long ago the store's timestamp ``value`` was, or None when it cannot be read."""
    then = parse_time(value)
    if then is None:
        return None
    return (datetime.now(UTC) - then).total_seconds()
