"""The rules of a run in words for people: the run page's verdict, ages, calls, decisions.

Pure functions over the rules in :mod:`localui.runs` and the store's records, no I/O;
the views and the notifications say things the same way because they say them here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from localui import forks
from localui.records import ALREADY_RESUMED, FORK_ORIGIN_NODE, Decision, RowHeader, Unreadable
from localui.runs import (
    AGENT,
    CANCELLED,
    CHAIN,
    COMPLETED,
    FAILED,
    ORPHANED,
    PAUSED,
    PRUNED_REFUSAL,
    SUPERVISOR,
    SWARM,
    TIMED_OUT,
    Refusal,
    ResumePlan,
    parse_node,
    parse_time,
)


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


def _argument(value: Any) -> str:
    # JSON keeps each value's exact text (250.0 stays 250.0, strings stay quoted).
    return json.dumps(value, ensure_ascii=False, default=str)


def call_text(tool: str, arguments: Any) -> str:
    """A call as it is written: ``refund(order_id="A-1002", amount=250.0)``."""
    if isinstance(arguments, dict):
        inside = ", ".join(f"{k}={_argument(v)}" for k, v in arguments.items())
    elif arguments in (None, ""):
        inside = ""
    else:
        inside = _argument(arguments)
    return f"{tool}({inside})"


def skipped_words(skipped: Sequence[str]) -> str:
    """`` The other call of that turn, `notify`, is not run: …`` (empty for none)."""
    if not skipped:
        return ""
    names = ", ".join(f"`{name}`" for name in skipped)
    if len(skipped) == 1:
        return (
            f" The other call of that turn, {names}, is not run: the SDK tells the model it"
            " was not."
        )
    return (
        f" The other calls of that turn, {names}, are not run: the SDK tells the model they"
        " were not."
    )


def decided_words(decision: Decision) -> str:
    """``"rejected by Ada: over budget"``: who decided a pause, how, and why."""
    words = f"{decision.verb} by {decision.actor}"
    return f"{words}: {decision.reason}" if decision.reason else words


def being_or_already(decision: Decision) -> str:
    """``"already approved by Ada at …"``, or ``"being approved by Ada since …"`` while
    the SDK still carries the decision out: what a second click is told."""
    if decision.outcome is None:
        return f"being {decision.verb} by {decision.actor} since {decision.decided_at}"
    return f"already {decision.verb} by {decision.actor} at {decision.decided_at}"


def decision_line(state: str, decision: Decision | None) -> str | None:
    """What a run's state line says of its newest approval decision, if anything: once
    the SDK has carried it out and the run has moved on from the pause it answered (a
    run paused again waits on a new question; a claim resumed elsewhere first decided
    nothing)."""
    if decision is None or state == PAUSED:
        return None
    if decision.outcome is None or decision.outcome == ALREADY_RESUMED:
        return None
    return decided_words(decision)


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
    skipped: Sequence[str] = (),
) -> Verdict:
    """Plain words for the run page's banner. ``skipped``: the tools of the re-entered
    turn's other unanswered calls (:func:`localui.runs.skipped_siblings` of the
    re-entry row)."""
    when = age_words(last.created_at, now)
    cache_words = (
        f" {cached_calls} @idempotent result{'s' if cached_calls != 1 else ''} will be answered "
        "from the cache instead of running again."
        if cached_calls
        else ""
    )
    fork = "Fork branches a new run from any executed row; this run stays as it is."
    resume = plan.reason if isinstance(plan, Refusal) else _resume_words(plan, saved_args)
    if isinstance(plan, ResumePlan):
        resume += (f" {plan.note}" if plan.note else "") + cache_words
        if plan.shape == "tool":
            resume += skipped_words(skipped)

    if state == COMPLETED:
        return Verdict("ok", f"Completed {when}: the run wrote its end marker.", resume, fork)
    if state == FAILED:
        error = f": {run_error}" if run_error else ""
        return Verdict("bad", f"Failed {when}{error}.", resume, fork)
    if state in (CANCELLED, TIMED_OUT):
        return _stopped_on_purpose(state, plan, when, run_error, resume, fork)
    if state == PAUSED:
        reason = f" for `{last.interrupt_reason}`" if last.interrupt_reason else ""
        return Verdict(
            "wait",
            f"Paused{reason} at `{last.node_id}` {when}, waiting for a person.",
            resume,
            fork,
        )
    if state == ORPHANED and isinstance(plan, Refusal) and plan.reason == PRUNED_REFUSAL:
        return Verdict(
            "warn",
            f"Paused row at `{last.node_id}` ({when}) kept by prune: the run's other rows "
            "were pruned, so whether it went on after its approval is no longer in the store.",
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
    where = _stopped_words(last, plan)
    return Verdict(
        "warn",
        f"No end marker: still running, or its process died {where} (last row {when}).",
        resume,
        fork,
    )


def state_label(state: str) -> str:
    """A state as a filter chip names it: ``Timed out``."""
    return state.replace("_", " ").capitalize()


def _stopped_on_purpose(
    state: str,
    plan: ResumePlan | Refusal,
    when: str,
    run_error: str | None,
    resume: str,
    fork: str,
) -> Verdict:
    """The verdict of a run the SDK stopped on purpose: its run-end row is ``failed``
    with ``run_reason`` ``cancelled`` or ``timeout``. Nothing crashed, so no crash
    advice; a resume steps back past the marker, as for any failed run."""
    where = f" {_stopped_in(plan)}" if isinstance(plan, ResumePlan) else ""
    if state == CANCELLED:
        headline = (
            f"Cancelled {when}{where}: someone stopped it on purpose with the SDK's"
            " cancel(execution_id), from the process that ran it (the SDK does not record"
            " who). Nothing crashed."
        )
        after = (
            " The cancel does not carry over: the resumed run goes on until it ends, pauses,"
            " or is cancelled again."
        )
    else:
        error = f" ({run_error})" if run_error else ""
        headline = (
            f"Timed out {when}{where}: the run passed its timeout_seconds and the SDK"
            f" stopped it{error}. Nothing crashed."
        )
        after = (
            " The resumed run has the runner's timeout_seconds afresh, counted from the"
            " resume: a step as slow as this one times out again."
        )
    if isinstance(plan, ResumePlan):
        resume = (
            "Resume steps back past the stop marker (the SDK's latest_resumable), as for any"
            f" failed run: {resume[0].lower()}{resume[1:]}{after}"
        )
    return Verdict("warn", headline, resume, fork)


def _stopped_in(plan: ResumePlan) -> str:
    """Where a run stopped on purpose was, from the row a resume re-enters at: an
    agent writes its row before each call, a chain its node's row once it is done."""
    if plan.owner.kind == CHAIN:
        if plan.start_node is not None:
            return f"in node `{plan.start_node}`, after `{plan.node_id}`"
        return f"in the node after `{plan.node_id}`"
    if plan.tool is not None:
        return f"inside tool `{plan.tool}`"
    return f"waiting on the model at `{plan.node_id}`"


def _resume_words(plan: ResumePlan, saved_args: Any) -> str:
    """What the owner's resume does first, and then, in a sentence."""
    owner = plan.owner.describe()
    member = repr(plan.member) if plan.member else "the active agent"
    if plan.shape == "approval":
        if plan.owner.kind == CHAIN:
            return (
                f"Approve or reject to resume: {owner} runs node `{plan.node_id}` again from "
                "its start with the answer, then the nodes after it; no model is called unless "
                "a node calls one."
            )
        if plan.owner.kind == SUPERVISOR:
            return (
                f"Approve or reject to resume: {owner} runs its planner again from the original "
                f"request (a new model call); when it delegates to worker {member}, the worker "
                f"re-invokes its paused tool `{plan.tool}` with the answer, then the team goes on."
            )
        if plan.owner.kind == SWARM:
            return (
                f"Approve or reject to resume: the active agent {member} of {owner} re-invokes "
                f"its paused tool `{plan.tool}` with the answer, then the swarm goes on."
            )
        return (
            f"Approve or reject to resume: the paused tool `{plan.tool}` runs again with the "
            "answer, then the agent goes on."
        )
    if plan.shape == "node":
        start = (
            f"node `{plan.start_node}`"
            if plan.start_node is not None
            else "the next node in the chain's order (register the chain here to name it)"
        )
        return (
            f"Resume goes on after `{plan.node_id}`, at {start}; no model is called unless "
            "that node calls one."
        )
    if plan.shape == "team":
        again = (
            f"re-invoking `{plan.tool}` with its saved arguments"
            if plan.tool is not None
            else "re-issuing its model call"
        )
        worker = (
            f"; when it delegates to worker {member}, the worker re-enters at its newest row "
            f"`{plan.node_id}`, {again}"
            if plan.member
            else ""
        )
        return (
            f"Resume runs the planner of {owner} again from the original request (a new model "
            f"call){worker}."
        )
    if plan.owner.kind == SWARM:
        return (
            f"Resume runs the active agent {member} of {owner} again from its current input: "
            "its model is called again and its tools run again, then the swarm goes on."
        )
    if plan.node_id == FORK_ORIGIN_NODE:
        return "Resume issues a model call from the fork marker `__fork_origin__`."
    if plan.shape == "tool":
        return (
            f"Resume re-invokes `{plan.tool}` with the saved arguments {short_json(saved_args)}; "
            "the model is not called again."
        )
    return (
        f"Resume re-issues the model call of turn {plan.turn if plan.turn is not None else '?'}"
        f" (`{plan.node_id}`)."
    )


def _stopped_words(last: RowHeader, plan: ResumePlan | Refusal) -> str:
    """Where a run with no end marker stopped, as its newest row says."""
    owner = plan.owner if isinstance(plan, ResumePlan) else None
    if owner is not None and owner.kind == CHAIN:
        return f"after node `{last.node_id}`"
    tool = parse_node(last.node_id).tool
    if tool is not None:
        whose = f" of {last.agent!r}" if owner is not None and owner.kind != AGENT else ""
        return f"inside tool `{tool}`{whose}"
    return f"waiting on the model at `{last.node_id}`"


#: What the SDK hands the model for a call a fork branched before (``FORK_SKIPPED_NOTE``
#: in ``UNANSWERED_TOOL_RESULT``, fastaiagent's agent and message modules).
FORK_SKIPPED_RESULT = (
    "[no result: this tool was not run: the conversation was branched before its result]"
)


def _calls_list(calls: Sequence[forks.ToolAgain], more: int) -> str:
    shown = ", ".join(f"`{call_text(c.tool, c.arguments)}`" for c in calls)
    return shown + (f" and {more} more" if more else "")


def fork_words(plan: forks.ForkPlan, new_input: str | None) -> tuple[str, ...]:
    """What a fork from the plan's row would do, sentence by sentence, as the SDK does it
    (``localui.forks``)."""
    said: list[str] = []
    if plan.kind == CHAIN:
        patched = " with `input` set to the new input" if new_input else ""
        said.append(
            f"The branch restores the state at `{plan.node_id}`{patched} and runs the nodes"
            f" after it: {', '.join(f'`{n}`' for n in plan.nodes_again)}."
        )
        if plan.model_nodes:
            models = ", ".join(f"`{n}`" for n in plan.model_nodes)
            said.append(f"The model is called again, by {models}.")
        else:
            said.append("None of them calls a model.")
        if plan.tools_again:
            names = ", ".join(f"`{c.node_id}` (`{c.tool}`)" for c in plan.tools_again)
            said.append(f"Tool nodes that run again: {names}.")
    elif plan.conversation == forks.FRESH:
        said.append(
            "A new input starts a fresh conversation: the model sees only the new request"
            " (and the agent's instructions), none of this run's messages; this row only"
            " names where the branch came from."
        )
        if plan.tools_again:
            said.append(
                "Any tool the model then calls runs. This run called, from its start: "
                f"{_calls_list(plan.tools_again, plan.more_tools)}."
            )
    else:
        said.append(
            f"The branch goes on from this row's conversation ({plan.messages} messages):"
            f" the model is called again at turn {plan.turn}."
        )
        for call in plan.not_run:
            said.append(
                f"`{call_text(call.tool, call.arguments)}` is not run: the row has no result"
                f" for it, and the SDK answers it `{FORK_SKIPPED_RESULT}`; the model then"
                " decides what to call."
            )
        if plan.tools_again:
            said.append(
                "Then the tools the model calls run. After this row the original called "
                f"{_calls_list(plan.tools_again, plan.more_tools)}."
            )
        else:
            said.append("After this row the original called no tool.")
    again = [c for c in plan.tools_again if c.cached_in_source]
    if again:
        names = ", ".join(
            f"`{call_text(c.tool, c.arguments) if c.arguments is not None else c.node_id}`"
            for c in again
        )
        said.append(
            "No @idempotent result of this run is reused: a branch is a new execution."
            f" These side effects happen again if the branch makes the call: {names}."
        )
    elif plan.cached_results:
        n = plan.cached_results
        said.append(
            f"This run's {n} @idempotent result{'s' if n != 1 else ''} "
            f"{'stays' if n == 1 else 'stay'} with it: a"
            " branch is a new execution and reuses none."
        )
    else:
        said.append("No @idempotent result is reused: a branch is a new execution.")
    where = " after this row" if plan.conversation == forks.CONTINUED else ""
    for pause in plan.pauses_ahead:
        why = f" ({pause.reason})" if pause.reason else ""
        said.append(
            f"The original paused at `{pause.node_id}`{why}{where}: a branch that gets"
            " there pauses too, and waits for a person."
        )
    return tuple(said)


#: What each kind of edited message is called.
_EDITED = {"text": "text", "arguments": "arguments", "result": "result"}


def edit_lines(metadata: Any) -> tuple[str, ...]:
    """What an edit changed, a line per change, from its decision record's metadata
    (``localui.edits.edit_record``): ``message 3 (tool) result: "…" → "…"``, or
    ``state.order_id: "B-7" → "Z-9"``."""
    if not isinstance(metadata, dict):
        return ()
    lines: list[str] = []
    for change in metadata.get("changes") or ():
        if not isinstance(change, dict):
            continue
        before, after = short_json(change.get("before")), short_json(change.get("after"))
        if "key" in change:
            if change.get("added"):
                lines.append(f"state.{change['key']} added: {after}")
            else:
                lines.append(f"state.{change['key']}: {before} → {after}")
            continue
        where = f"message {int(change.get('index', 0)) + 1} ({change.get('role')})"
        what = change.get("what")
        if what == "added":
            lines.append(f"{where} added: {after}")
        elif what == "removed":
            lines.append(f"{where} removed: {before}")
        elif what == "arguments":
            lines.append(f"{where} arguments of {change.get('tool')}: {before} → {after}")
        else:
            lines.append(f"{where} {_EDITED.get(str(what), 'text')}: {before} → {after}")
    more = int(metadata.get("changed") or 0) - len(lines)
    if more > 0:
        lines.append(f"and {more} more")
    return tuple(lines)


#: What the record's reason of a timeout decision ends with when the deadline had passed
#: before the server that decided it started (``localui.deadlines``): no localui decided
#: it then, whether none ran or the one that ran could not (it stopped, or was read-only
#: or without the runner). It does not claim which: this server cannot know.
DECIDED_AT_START = " (decided at start: no localui decided it at the deadline)"


def _span(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def timeout_words(rule: str, approves: bool, timeout_at: datetime, now: datetime) -> str:
    """``rule 'refunds' rejects it in 20 h``: what a rule's ``on_timeout`` will do."""
    verb = "approves" if approves else "rejects"
    seconds = int((timeout_at - now).total_seconds())
    when = f"in {_span(seconds)}" if seconds > 0 else "now"
    return f"rule {rule!r} {verb} it {when} unless someone decides first"


def due_words(due_at: datetime, now: datetime) -> str:
    """``"due in 3 h"`` or ``"overdue by 20 min"``: a pause's deadline from ``now``."""
    seconds = int((due_at - now).total_seconds())
    if seconds > 0:
        return f"due in {_span(seconds)}"
    return f"overdue by {_span(-seconds)}"
