"""Deadlines: the pauses a policy rule gives a ``due``, escalated and decided on time.

It runs from the app's lifespan on a writable server whose policy has a rule with
``due``: first at start (which catches up with what fell due while no localui ran),
then every :data:`POLL_SECONDS`, and stops with the app. Each poll:

1. reads the pauses recorded in ``localui_deadlines``, then every waiting pause (the
   pending rows, page by page); records a row for each waiting pause that a rule with
   ``due`` governs and that has none (any process may: the key is unique), and forgets
   the rows read first whose pause no longer waits (read before the pauses, so a pause
   that came meanwhile is never forgotten);
2. for each row past its ``due_at`` not escalated yet: offers ``pause.escalated`` when
   the rule has ``escalate_to`` (the outbox keeps it once, whichever processes offer
   it), then sets ``escalated_at``, which one process wins; from ``due_at`` on those
   people may decide it (``Preflight.may_decide`` reads the pause's own time, so every
   process agrees without this table);
3. for each row past its ``timeout_at`` not timed out yet: decides the pause as its
   rule says (``ActionService.decide_by_rule``): the decision record's claim makes
   that exactly once across processes, ``kill -9`` and restarts (a claim whose process
   died is carried out by ``localui.recovery``). The process whose claim won records
   ``pause.timed_out`` at once, before the tool runs; whichever process finds the pause
   decided (won or lost) sets ``timed_out_at``, so nobody tries again. A deadline
   that passed before this process started (no localui ran then) is decided with a
   recorded reason saying so.

Events go through the watcher (its outbox keeps each once per target, and sends them
to the server's targets and the rule's ``notify`` URLs); with no target, none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localui import runs
from localui.actions import ActionService
from localui.backends.base import Deadlines
from localui.backends.deadlines import Deadline, iso
from localui.errors import AlreadyDecided, LocalUIError
from localui.notify import events as ev
from localui.notify.events import Event
from localui.offloop import off_loop
from localui.policy import Rule
from localui.records import Decision, Pending

log = logging.getLogger("localui.deadlines")

#: How often a poll runs, in seconds: escalation and timeout land this soon after
#: their time (the budget is a minute).
POLL_SECONDS = 2.0
#: Pending rows read per query, and deadline rows handled per query.
PAGE = 500
#: How long stopping waits for a decision under way before it cancels it.
STOP_GRACE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class PollReport:
    """What one poll did, for the tests and the log."""

    recorded: int = 0
    forgotten: int = 0
    escalated: tuple[str, ...] = ()
    timed_out: tuple[str, ...] = ()


def deadline_of(pending: Pending, rule: Rule | None) -> Deadline | None:
    """The row for ``pending`` under its rule, or None when no rule gives it a ``due``
    (or the pause's time cannot be read)."""
    if rule is None or pending.checkpoint_id is None:
        return None
    paused = runs.parse_time(pending.created_at)
    due = rule.due_at(pending.created_at)
    if paused is None or due is None:
        return None
    timeout = rule.timeout_at(pending.created_at)
    return Deadline(
        execution_id=pending.execution_id,
        checkpoint_id=pending.checkpoint_id,
        rule=rule.name,
        paused_at=paused.timestamp(),
        due_at=due.timestamp(),
        timeout_at=None if timeout is None else timeout.timestamp(),
    )


class DeadlineSweep:
    """The background poll of one app process (see the module's docstring)."""

    def __init__(
        self,
        actions: ActionService,
        deadlines: Deadlines,
        *,
        record: Callable[[Sequence[Event]], int] | None = None,
        interval: float = POLL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.actions = actions
        self.deadlines = deadlines
        self._record = record
        self.interval = interval
        self._clock = clock
        #: Deadlines that passed before this moment passed while this process was not
        #: running: a decision made for one says so.
        self.started_at = clock()
        self._redact = frozenset(actions.settings.notifications.redact)
        #: Pauses whose timeout could not be carried out here, said once each.
        self._warned: set[tuple[str, str]] = set()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="localui-deadlines")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), STOP_GRACE_SECONDS)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.poll()
            except Exception:
                # A store that cannot be read now is read again at the next poll.
                log.exception("the deadlines of pauses could not be read")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval)

    def track(self) -> tuple[int, int]:
        """Step 1 (blocking): rows for new pauses, and forget those gone; how many each."""
        known = self.deadlines.list_keys()
        waiting: set[tuple[str, str]] = set()
        new: list[Deadline] = []
        after: tuple[str, str] | None = None
        while True:
            page = self.actions.store.list_pending(after=after, limit=PAGE)
            for pending in page.items:
                key = (pending.execution_id, pending.checkpoint_id or "")
                waiting.add(key)
                if key not in known:
                    row = deadline_of(pending, self.actions.preflight.rule_for(pending))
                    if row is not None:
                        new.append(row)
            if page.next_key is None:
                break
            after = page.next_key
        gone = sorted(known - waiting)
        return self.deadlines.record(new), self.deadlines.forget(gone)

    async def poll(self) -> PollReport:
        """One poll (see the module's docstring)."""
        recorded, forgotten = await off_loop(self.track)
        escalated: list[str] = []
        timed_out: list[str] = []
        now = self._clock()
        for row in await off_loop(self.deadlines.list_work, now, PAGE):
            if self._stopping.is_set():
                break
            if row.escalated_at is None and row.due_at <= now:
                if await self._escalate(row, now):
                    escalated.append(row.execution_id)
            if row.timed_out_at is None and row.timeout_at is not None and row.timeout_at <= now:
                if await self._time_out(row):
                    timed_out.append(row.execution_id)
        return PollReport(recorded, forgotten, tuple(escalated), tuple(timed_out))

    async def _escalate(self, row: Deadline, now: float) -> bool:
        """Tell ``escalate_to`` the pause is overdue, then mark the row escalated; True
        for the one process whose mark won. The event is offered before the mark, so a
        process that dies in between leaves it to the next poll, here or elsewhere (the
        outbox keeps each event once, whoever offers it)."""
        store = self.actions.store
        pending = await off_loop(store.get_pending, row.execution_id)
        if pending is None or pending.checkpoint_id != row.checkpoint_id:
            return False  # no longer waits: the next poll forgets its row
        rule = self.actions.preflight.rule_for(pending)
        if rule is not None and rule.escalate_to:
            calls = await off_loop(store.paused_calls, (pending,))
            event = ev.escalated(
                pending,
                calls.get(row.checkpoint_id),
                rule.name,
                rule.escalate_to,
                iso(row.due_at),
                self._redact,
            )
            await self._announce(event)
        if not await off_loop(self.deadlines.mark_escalated, row.key, now):
            return False  # another process did
        if rule is not None and rule.escalate_to:
            log.info(
                "pause of %s is overdue under rule %r: escalated to %s",
                row.execution_id,
                rule.name,
                ", ".join(rule.escalate_to),
            )
        return True

    async def _time_out(self, row: Deadline) -> bool:
        """Decide the row's pause as its rule says; True when this process did."""
        assert row.timeout_at is not None
        store = self.actions.store
        pending = await off_loop(store.get_pending, row.execution_id)
        if pending is None or pending.checkpoint_id != row.checkpoint_id:
            return False  # no longer waits: the next poll forgets its row
        late = row.timeout_at < self.started_at
        waiting = pending

        async def announce(decision: Decision) -> None:
            # Once the claim is won, before the tool runs: a process that dies while it
            # runs has told people all the same (``localui.recovery`` finishes the rest).
            await off_loop(self.deadlines.mark_timed_out, row.key, self._clock())
            calls = await off_loop(store.paused_calls, (waiting,))
            await self._announce(
                ev.timed_out(waiting, calls.get(row.checkpoint_id), decision, self._redact)
            )

        try:
            outcome = await self.actions.decide_by_rule(
                row.execution_id, row.checkpoint_id, late=late, claimed=announce
            )
        except AlreadyDecided:
            # A person, or another process, decided it first: nothing is left to do.
            await off_loop(self.deadlines.mark_timed_out, row.key, self._clock())
            return False
        except LocalUIError as exc:
            # Nothing was claimed: a process that can carry it out will; said once.
            if row.key not in self._warned:
                self._warned.add(row.key)
                log.warning(
                    "pause of %s is past rule %r's timeout, but cannot be decided here: %s",
                    row.execution_id,
                    row.rule,
                    exc,
                )
            return False
        log.info(
            "pause of %s decided by rule %r at its deadline%s: %s",
            row.execution_id,
            row.rule,
            " (past it when this server started)" if late else "",
            outcome.status,
        )
        return True

    async def _announce(self, event: Event) -> None:
        if self._record is None:
            return
        record = self._record
        try:
            await off_loop(record, [event])
        except Exception:
            # The outbox is written again by nobody: the event is lost, the deadline's
            # work is not (it is recorded in the table and the decision record).
            log.exception("the %s event of %s could not be recorded", event.type, event.row)
