"""What an event says: the person-readable message, and the webhook body. Pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from localui.bundle import redact
from localui.delegation import delegate_words
from localui.notify import events as ev
from localui.notify.events import Event
from localui.words import age_words


@dataclass(frozen=True, slots=True)
class Links:
    """Absolute deep links into this server, built from its route names."""

    approval: Callable[[str], str]
    run: Callable[[str], str]
    #: A person's own decision page: ``decide(execution_id, link)``.
    decide: Callable[[str, str], str] | None = None


def link_of(event: Event, links: Links) -> str:
    """A pause's approval page while it waits, the run page otherwise."""
    if event.type in (ev.PAUSED, ev.OVERDUE, ev.ESCALATED, ev.NOTED):
        return links.approval(event.execution_id)
    return links.run(event.execution_id)


def _what(event: Event) -> str:
    if event.call:
        return event.call
    return f"node {event.node_id}" if event.node_id else "a run"


@dataclass(frozen=True, slots=True)
class PersonalLink:
    """A reader's own decision link for an event, and the away person they decide it
    for as that person's delegate (empty: in their own right)."""

    url: str
    for_name: str = ""


def line_of(
    event: Event, url: str, now: datetime, *, personal: bool = False, for_name: str = ""
) -> str:
    """One event in a sentence or two, ending with its link (``personal``: the reader's
    own decision link; ``for_name``: the away person they decide it for)."""
    since = age_words(event.at, now)
    who = f"{event.agent} ({event.runner})" if event.runner else event.agent
    standing = f" {delegate_words((for_name,))}," if for_name else ""
    deciders = (
        f"You may decide it{standing} at your own link below, which only opens the page:"
        " nothing is decided until you press Approve or Reject there."
        if personal
        else "Approvers and operators may decide."
    )
    if event.type == ev.PAUSED:
        why = f': "{event.reason}"' if event.reason else ""
        text = f"{_what(event)} waits for a person — {who}{why}; paused {since}. {deciders}"
    elif event.type == ev.OVERDUE:
        why = f': "{event.reason}"' if event.reason else ""
        text = (
            f"Reminder {event.reminder}: {_what(event)} still waits — {who}{why};"
            f" paused {since}. {deciders}"
        )
    elif event.type == ev.ESCALATED:
        why = f': "{event.reason}"' if event.reason else ""
        added = ", ".join(e.partition(":")[2] for e in event.escalate_to) or "nobody more"
        text = (
            f"Overdue: {_what(event)} waits past rule {event.rule!r}'s deadline — {who}{why};"
            f" paused {since}. {added} may now decide it too."
        )
        if personal:
            text += f" {deciders}"
    elif event.type == ev.TIMED_OUT:
        verb = "approved" if event.approved else "rejected"
        outcome = f" (outcome: {event.outcome})" if event.outcome else ""
        text = (
            f"Run {event.execution_id} of {event.agent or 'an agent'} was {verb} by rule"
            f" {event.rule!r}, nobody having decided in time: {event.reason}{outcome}."
        )
    elif event.type == ev.DECIDED:
        verb = "approved" if event.approved else "rejected"
        why = f": {event.reason}" if event.reason else ""
        text = (
            f"Run {event.execution_id} of {event.agent or 'an agent'} was {verb} by"
            f" {event.actor}{why} (outcome: {event.outcome})."
        )
    elif event.type == ev.NOTED:
        where = f" — {who}" if who else ""
        text = (
            f"{event.actor} left a note on {_what(event)} of run {event.execution_id}{where}:"
            f' "{event.text}"'
        )
        if personal:
            text += f" {deciders}"
    elif event.type == ev.FAILED:
        text = (
            f"Run {event.execution_id} of {event.agent} {_failed_verb(event)} at"
            f" {event.node_id} {since}."
        )
    else:
        text = (
            f"Run {event.execution_id} of {event.agent} has written nothing since {since}"
            f" (stopped at a {event.reason}, {event.node_id}): its process may have died."
        )
    return f"{text}\n{url}"


def _failed_verb(event: Event) -> str:
    """How a run ended ``failed``: on its own, or stopped on purpose (the SDK's reason)."""
    return {"cancelled": "was cancelled", "timeout": "timed out"}.get(event.reason, "failed")


def _title(batch: Sequence[Event]) -> str:
    waiting = sum(1 for e in batch if e.type in (ev.PAUSED, ev.OVERDUE, ev.ESCALATED))
    if len(batch) == 1:
        only = batch[0]
        return {
            ev.PAUSED: f"Waiting for approval: {_what(only)}",
            ev.OVERDUE: f"Still waiting: {_what(only)}",
            ev.DECIDED: f"Decided: run {only.execution_id}",
            ev.FAILED: f"Run {_failed_verb(only)}: {only.execution_id}",
            ev.STALLED: f"Run stalled: {only.execution_id}",
            ev.ESCALATED: f"Overdue, escalated: {_what(only)}",
            ev.TIMED_OUT: f"Decided by its rule at the deadline: run {only.execution_id}",
            ev.NOTED: f"Note from {only.actor}: {_what(only)}",
        }[only.type]
    if waiting == len(batch):
        return f"{waiting} runs wait for a person"
    return f"{len(batch)} run events" + (f", {waiting} waiting for a person" if waiting else "")


def message(
    batch: Sequence[Event],
    links: Links,
    now: datetime,
    personal: Callable[[Event], PersonalLink | None] | None = None,
) -> tuple[str, str]:
    """The title and body of one chat message about every event in ``batch``;
    ``personal`` gives the reader's own decision link of an event (None: the desk's)."""
    lines = []
    for event in batch:
        own = personal(event) if personal is not None else None
        if own is None:
            lines.append(line_of(event, link_of(event, links), now))
        else:
            lines.append(line_of(event, own.url, now, personal=True, for_name=own.for_name))
    return _title(batch), "\n\n".join(lines)


def webhook_body(event: Event, links: Links, redact_keys: frozenset[str]) -> dict[str, Any]:
    """``{"type", "timestamp", "data"}`` as the Standard Webhooks spec lays a body out."""
    data: dict[str, Any] = {
        "execution_id": event.execution_id,
        "agent": event.agent,
        "runner": event.runner,
        "reason": event.reason,
        "node_id": event.node_id,
        "checkpoint_id": event.checkpoint_id,
        # Redacted when recorded too; again here for rows an older setting recorded.
        "context": redact(event.context, redact_keys),
        "call": event.call,
        "url": link_of(event, links),
    }
    if event.type in (ev.DECIDED, ev.TIMED_OUT):
        data.update(actor=event.actor, approved=event.approved, outcome=event.outcome)
    if event.type == ev.ESCALATED:
        data.update(escalate_to=list(event.escalate_to), due_at=event.due_at)
    if event.type == ev.OVERDUE:
        data["reminder"] = event.reminder
    if event.type == ev.NOTED:
        data.update(note_id=event.row, author=event.actor, text=event.text)
    if event.rule:
        data["rule"] = event.rule
    return {"type": event.type, "timestamp": event.at, "data": data}
