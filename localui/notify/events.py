"""Which events the store's state gives: pure rules, no I/O.

Every event has a key that names it once however many processes see it: its
type, its run and the row it is about (a pause's checkpoint, a decision's id, a
failed or stalled run's newest row), and for a reminder its number. The outbox
records each key once (``localui.backends.notifications``), so a watcher may
offer the same event again and again, from every process, and it is announced
once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from localui import runs
from localui.backends.notes import Note
from localui.bundle import redact
from localui.records import ALREADY_RESUMED, APPROVAL, Decision, PausedCall, Pending, RunFacts
from localui.settings import CANCELLED_FAILURES
from localui.words import call_text

PAUSED = "run.paused"
DECIDED = "run.decided"
FAILED = "run.failed"
STALLED = "run.stalled"
OVERDUE = "pause.overdue"
#: A pause past its rule's ``due``, whose ``escalate_to`` people may now decide it too.
ESCALATED = "pause.escalated"
#: A pause its rule decided at ``timeout_after`` (``on_timeout``), nobody having done so.
TIMED_OUT = "pause.timed_out"
#: A person who may decide a pause left a note on it (``localui.backends.notes``).
NOTED = "pause.noted"
EVENT_TYPES = (PAUSED, DECIDED, FAILED, STALLED, OVERDUE, ESCALATED, TIMED_OUT, NOTED)
#: ``--notify-on`` names: the part after the dot, and ``cancelled`` for the failures
#: of runs someone cancelled on purpose (``failed`` alone leaves them out).
SHORT_NAMES = {**{t.split(".", 1)[1]: t for t in EVENT_TYPES}, "cancelled": CANCELLED_FAILURES}

#: The SDK's ``run_reason`` of a cancelled run, as a ``run.failed`` event carries it.
CANCELLED_REASON = "cancelled"


def announces_failures(chosen: frozenset[str]) -> bool:
    """Whether any ``run.failed`` is to be announced."""
    return FAILED in chosen or CANCELLED_FAILURES in chosen


def wanted(event: Event, chosen: frozenset[str]) -> bool:
    """Whether ``--notify-on`` chose this event: a cancelled run's failure only when
    ``cancelled`` was chosen, every other failure only when ``failed`` was."""
    if event.type == FAILED:
        return (CANCELLED_FAILURES if event.reason == CANCELLED_REASON else FAILED) in chosen
    return event.type in chosen


class UnknownEvent(ValueError):
    """A ``--notify-on`` name that is not an event."""


def parse_notify_on(text: str) -> frozenset[str]:
    """``"paused,overdue"`` -> the event types; raises :class:`UnknownEvent`."""
    chosen: set[str] = set()
    for name in (part.strip() for part in text.split(",")):
        if not name:
            continue
        if name not in SHORT_NAMES:
            raise UnknownEvent(
                f"--notify-on: {name!r} is not an event (choose from {', '.join(SHORT_NAMES)})"
            )
        chosen.add(SHORT_NAMES[name])
    return frozenset(chosen)


@dataclass(frozen=True, slots=True)
class Event:
    """Something a person should hear about, as it is recorded and announced."""

    type: str
    execution_id: str
    #: The row the event is about: a checkpoint id, or a decision's id.
    row: str
    #: When what caused it happened (the pause's, the row's or the decision's time).
    at: str
    agent: str = ""
    runner: str = ""
    reason: str = ""
    node_id: str = ""
    checkpoint_id: str = ""
    #: The pause's frozen context, as the SDK stored it (redacted before it is sent).
    context: Any = None
    #: The paused call as it is written: ``refund(order="1042", amount=5000)``.
    call: str = ""
    #: Decided: who, how, and what the SDK did with it. Noted: ``actor`` wrote the note.
    actor: str = ""
    approved: bool | None = None
    outcome: str = ""
    #: Overdue: which reminder this is (1, 2, ...).
    reminder: int = 0
    #: A pause's: the approval policy's rule that governs it ("" without one); its
    #: ``notify`` URLs are told too.
    rule: str = ""
    #: Escalated: who the rule added (``escalate_to`` entries: ``group:managers``), so
    #: they can be told; and when the pause became overdue.
    escalate_to: tuple[str, ...] = ()
    due_at: str = ""
    #: Noted: the note's text, as its author wrote it.
    text: str = ""

    @property
    def key(self) -> str:
        """Unique per event kind, run and row (and reminder number)."""
        return event_key(self.type, self.execution_id, self.row, self.reminder)


def paused_call(
    pending: Pending, paused: PausedCall | None, redact_keys: frozenset[str] = frozenset()
) -> str:
    """The call a pause stopped in, or "" when it is a chain's node, not a tool call."""
    snapshot = paused.state_snapshot if paused is not None else None
    tool = ""
    if isinstance(snapshot, dict):
        tool = str(snapshot.get("tool_name") or "")
    tool = tool or (runs.parse_node(pending.node_id).tool or "")
    if not tool:
        return ""
    arguments = paused.node_input if paused is not None else None
    return call_text(tool, redact(arguments, redact_keys) if isinstance(arguments, dict) else None)


def _pause_fields(
    pending: Pending, paused: PausedCall | None, redact_keys: frozenset[str]
) -> dict[str, Any]:
    owner = runs.pause_owner(pending.agent_path, pending.agent, pending.node_id)
    return {
        "execution_id": pending.execution_id,
        "agent": pending.agent,
        "runner": owner.describe(),
        "reason": pending.reason,
        "node_id": pending.node_id,
        "checkpoint_id": pending.checkpoint_id or "",
        "context": redact(pending.context, redact_keys),
        "call": paused_call(pending, paused, redact_keys),
    }


def paused(
    pending: Pending,
    call: PausedCall | None,
    redact_keys: frozenset[str] = frozenset(),
    rule: str = "",
) -> Event:
    """A run that waits for a person; the values of ``redact_keys`` never leave."""
    return Event(
        type=PAUSED,
        row=pending.checkpoint_id or pending.created_at,
        at=pending.created_at,
        rule=rule,
        **_pause_fields(pending, call, redact_keys),
    )


def event_key(event_type: str, execution_id: str, row: str, reminder: int = 0) -> str:
    """:attr:`Event.key` from its parts, for an event not built yet."""
    parts = [event_type, execution_id, row]
    if reminder:
        parts.append(str(reminder))
    return "\x1f".join(parts)


def pause_keys(
    pending: Pending,
    now: datetime,
    remind_after: float,
    remind_times: int,
    every: float | None = None,
) -> tuple[str, ...]:
    """The keys of the events a sweep offers for ``pending``: its ``run.paused``, and
    its reminder when one is due (:func:`overdue`'s number), read from the pending
    row alone."""
    row = pending.checkpoint_id or pending.created_at
    keys = [event_key(PAUSED, pending.execution_id, row)]
    number = reminder_number(pending, now, remind_after, remind_times, every)
    if number:
        keys.append(event_key(OVERDUE, pending.execution_id, row, number))
    return tuple(keys)


def reminder_number(
    pending: Pending,
    now: datetime,
    remind_after: float,
    remind_times: int,
    every: float | None = None,
) -> int:
    """Which reminder is due for ``pending`` at ``now`` (0: none yet): the first
    ``remind_after`` seconds after it paused, then one each ``every`` (by default
    ``remind_after`` again: a rule's ``due`` and ``remind_every`` give their own)."""
    then = runs.parse_time(pending.created_at)
    every = remind_after if every is None else every
    if then is None or remind_after <= 0 or every <= 0 or remind_times < 1:
        return 0
    waited = (now - then).total_seconds()
    if waited < remind_after:
        return 0
    return min(1 + math.floor((waited - remind_after) / every), remind_times)


def overdue(
    pending: Pending,
    call: PausedCall | None,
    now: datetime,
    remind_after: float,
    remind_times: int,
    redact_keys: frozenset[str] = frozenset(),
    rule: str = "",
    every: float | None = None,
) -> Event | None:
    """A reminder for a pause waiting longer than ``remind_after`` seconds: the
    first after one interval, then one each ``every`` (default: the same interval),
    ``remind_times`` at most."""
    number = reminder_number(pending, now, remind_after, remind_times, every)
    if number < 1:
        return None
    return Event(
        type=OVERDUE,
        row=pending.checkpoint_id or pending.created_at,
        at=pending.created_at,
        reminder=number,
        rule=rule,
        **_pause_fields(pending, call, redact_keys),
    )


def escalated(
    pending: Pending,
    call: PausedCall | None,
    rule: str,
    escalate_to: tuple[str, ...],
    due_at: str,
    redact_keys: frozenset[str] = frozenset(),
) -> Event:
    """A pause past its rule's ``due``: ``escalate_to`` may decide it too, and are told."""
    return Event(
        type=ESCALATED,
        row=pending.checkpoint_id or pending.created_at,
        at=due_at,
        rule=rule,
        escalate_to=escalate_to,
        due_at=due_at,
        **_pause_fields(pending, call, redact_keys),
    )


def timed_out(
    pending: Pending,
    call: PausedCall | None,
    decision: Decision,
    redact_keys: frozenset[str] = frozenset(),
) -> Event:
    """A pause its rule decided (``decision``, whose actor is ``policy:NAME``), told as
    soon as its claim is won: the outcome comes with ``run.decided``."""
    return Event(
        type=TIMED_OUT,
        row=pending.checkpoint_id or pending.created_at,
        at=decision.finished_at or decision.decided_at,
        rule=decision.actor.partition(":")[2],
        actor=decision.actor,
        approved=decision.approved,
        outcome=decision.outcome or "",
        **{**_pause_fields(pending, call, redact_keys), "reason": decision.reason},
    )


def decided(decision: Decision, agent: str = "") -> Event | None:
    """An approval the SDK has carried out; a claim still under way, or one that
    found the run already resumed elsewhere (it decided nothing), is not one yet."""
    if decision.kind != APPROVAL or decision.outcome in (None, ALREADY_RESUMED):
        return None
    return Event(
        type=DECIDED,
        execution_id=decision.execution_id,
        row=str(decision.id),
        at=decision.finished_at or decision.decided_at,
        agent=agent,
        checkpoint_id=decision.checkpoint_id,
        reason=decision.reason,
        actor=decision.actor,
        approved=decision.approved,
        outcome=decision.outcome or "",
    )


def noted(note: Note, pending: Pending | None, rule: str = "") -> Event:
    """A note left on a pause; its key names the note. ``pending`` is the pause when it
    still waits at the note's row (what it is about, for the message), else None.
    ``rule`` is the policy's rule of the pause: its ``notify`` URLs are told too, and
    who may decide (the note's readers) follows from it."""
    about: dict[str, Any] = {}
    if pending is not None and pending.checkpoint_id == note.checkpoint_id:
        owner = runs.pause_owner(pending.agent_path, pending.agent, pending.node_id)
        about = {
            "agent": pending.agent,
            "runner": owner.describe(),
            "reason": pending.reason,
            "node_id": pending.node_id,
        }
    return Event(
        type=NOTED,
        execution_id=note.execution_id,
        row=str(note.id),
        at=note.created_at,
        checkpoint_id=note.checkpoint_id,
        actor=note.author,
        text=note.text,
        rule=rule,
        **about,
    )


def _run_state(facts: RunFacts) -> str:
    return runs.state_of(facts)


def _run_event(event_type: str, facts: RunFacts, reason: str = "") -> Event:
    return Event(
        type=event_type,
        execution_id=facts.execution_id,
        row=facts.last_checkpoint_id,
        at=facts.last_at,
        agent=facts.agent,
        node_id=facts.last_node_id,
        checkpoint_id=facts.last_checkpoint_id,
        reason=reason,
    )


def failed(facts: RunFacts) -> Event | None:
    """A run whose newest row is a failed ``run_end``; its reason is the SDK's
    ``run_reason`` when the run was stopped on purpose (``cancelled``, ``timeout``)."""
    if _run_state(facts) not in runs.FAILURES:
        return None
    return _run_event(FAILED, facts, facts.run_reason or "")


def stalled(facts: RunFacts, now: datetime, stale_after: float) -> Event | None:
    """An unfinished run that has written nothing for longer than ``stale_after``; its
    reason says what it stopped at (``tool``, ``turn`` or ``node``)."""
    if not runs.is_stalled(_run_state(facts), facts.last_at, now, stale_after):
        return None
    return _run_event(STALLED, facts, runs.stopped_at(facts.last_node_id, facts.last_step_type))
