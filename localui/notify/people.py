"""People told at their own address: who hears of a pause, and where.

A person with an address (``localui users add|set NAME --notify URL``) is told of each
pause they may decide, and of its reminders, in a message of their own whose link is
theirs alone (``localui.links``): it opens that pause's decision page for them. Their
target in the outbox is ``person:NAME``: secret-free, the same in every process, and
delivered to whatever address the users table holds for them when it is sent (a
changed address is used from the next delivery on).

The people are read from the users table at most every :data:`CACHE_SECONDS`, so an
address set, changed or cleared reaches every server on the store within that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from localui import names
from localui.backends.base import UserDirectory
from localui.delegation import deciders
from localui.notify import events as ev
from localui.notify.events import Event
from localui.notify.targets import CHAT, Target
from localui.policy import Policy, Rule
from localui.records import User

PERSON_PREFIX = "person:"
#: The events a person is told of at their own address, with their own decision link:
#: the pauses they may decide, their reminders, an escalation that adds them, and a
#: note another of them left.
PERSONAL_EVENTS = frozenset({ev.PAUSED, ev.OVERDUE, ev.ESCALATED, ev.NOTED})
#: How long what the users table said is believed (as sign-in believes it).
CACHE_SECONDS = 2.0


def person_target_id(name: str) -> str:
    return PERSON_PREFIX + name


def person_of_target(target_id: str) -> str | None:
    """The person a target id names, or None for a server's or a rule's target."""
    return target_id[len(PERSON_PREFIX) :] if target_id.startswith(PERSON_PREFIX) else None


def told_of(rule: Rule | None, people: Sequence[User], now: datetime) -> tuple[str, ...]:
    """The names of the people with an address who are told of a pause under ``rule``
    (None: no rule governs it), each once: each person away at ``now`` replaced by whoever
    decides for them (``localui.delegation.deciders``), whose own link then decides it
    for them."""
    return tuple(d.name for d in deciders(rule, people, now) if d.address)


class People:
    """The users table's people as the watcher and the sender need them: who is told of
    what, and each one's target. Blocking reads, from the watcher's worker threads."""

    def __init__(
        self,
        directory: UserDirectory | None,
        policy: Policy | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._people: tuple[User, ...] = ()

    def everyone(self) -> tuple[User, ...]:
        """Everyone in the users table, as it was at most :data:`CACHE_SECONDS` ago."""
        if self.directory is None:
            return ()
        with self._lock:
            if self._clock() - self._read_at >= CACHE_SECONDS:
                self._people = self.directory.list_users()
                self._read_at = self._clock()
            return self._people

    def any_address(self) -> bool:
        return any(u.address for u in self.everyone())

    def rule_named(self, name: str) -> Rule | None:
        if not name or self.policy is None:
            return None
        return next((r for r in self.policy.rules if r.name == name), None)

    def target_ids(self, rule_name: str, now: datetime) -> tuple[str, ...]:
        """The outbox targets of the people told of a pause under the rule named."""
        told = told_of(self.rule_named(rule_name), self.everyone(), now)
        return tuple(person_target_id(n) for n in told)

    def target_ids_of(self, event: Event, now: datetime) -> tuple[str, ...]:
        """The outbox targets of the people told of ``event`` at their own address: for a
        pause and its reminders, those who may decide it; for an escalation, the people
        it adds (``escalate_to``, each away one's delegate in their place)."""
        if event.type == ev.ESCALATED:
            if not event.escalate_to:
                return ()
            added = Rule(name=event.rule, approvers=event.escalate_to)
            return tuple(person_target_id(n) for n in told_of(added, self.everyone(), now))
        if event.type == ev.NOTED:
            # The others who may decide: not its author (nor, for a note a delegate
            # wrote, the person they stand in for).
            readers = told_of(self.rule_named(event.rule), self.everyone(), now)
            return tuple(
                person_target_id(n) for n in readers if not names.same_voter(n, event.actor)
            )
        if event.type in PERSONAL_EVENTS:
            return self.target_ids(event.rule, now)
        return ()

    def deciding_for(self, person: str, event: Event, now: datetime) -> str:
        """The away person ``person`` is told of ``event`` for, as their delegate (empty:
        told in their own right, or not told at all): chosen as :meth:`target_ids_of`
        chooses who is told."""
        if event.type == ev.ESCALATED:
            rule: Rule | None = Rule(name=event.rule, approvers=event.escalate_to)
        else:
            rule = self.rule_named(event.rule)
        told = deciders(rule, self.everyone(), now)
        return next((d.for_name for d in told if names.one_person(d.name, person)), "")

    def targets(self) -> dict[str, Target]:
        """Each person with an address as a target, by id: a chat target (Apprise) whose
        label is the id, so no page or log shows the address."""
        return {
            person_target_id(u.name): Target(
                kind=CHAT, url=u.address, label=person_target_id(u.name)
            )
            for u in self.everyone()
            if u.address
        }
