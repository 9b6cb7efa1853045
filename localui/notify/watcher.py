"""The watcher: records every event once in the outbox, and keeps the sender going.

It runs for the app's whole life whenever a target is configured, whether or not
a page is open. What it does:

- **Each change the feed publishes** (one poll loop per process: it subscribes to
  the app's :class:`~localui.live.ChangeFeed`, which so keeps polling): a new
  pause is ``run.paused``, a finished approval ``run.decided``, a run whose newest
  row is a failed end ``run.failed``.
- **Shortly after start (``first_sweep_after``), after a missed change (a resync),
  and every ``sweep_interval``**:
  every waiting pause is offered as ``run.paused`` (so pauses already waiting
  when notifications are first turned on are announced, once each), those waiting
  longer than ``remind_after`` as ``pause.overdue``, and the newest unfinished
  runs silent for longer than ``stale_after`` as ``run.stalled`` — read from the
  pending rows and the runs index, never from a scan of ``checkpoints``. The
  pending rows are read again only when the feed has said they changed, or when a
  reminder comes due: an idle sweep of a thousand waiting pauses reads none of them.
- **Each sweep, too**: the runs that failed and the approvals decided since the
  store's last look (``localui_watch``, :mod:`localui.backends.watch`: up to when a
  sweep of any localui on the store offered them all and recorded them), which the
  feed announces as they come, are offered again; once recorded, the sweep moves
  that look forward to when its reads began, less :data:`LOOK_BACK_S`. The feed
  cannot name them all: it starts watching ``first_sweep_after`` after the server (a
  run failing in between leaves no change behind), a prune or a released claim is a
  change it cannot pin to runs, a read that failed is not read again, and while no
  localui runs nothing watches: what came meanwhile is announced at the next start,
  once, however long ago, and nothing from before the look is offered again. A first
  start ever (no look yet) offers what comes after it, as turning notifications on
  should not announce a store's whole past. What is recorded already costs one
  outbox query.
- **Notes on pauses** (``pause.noted``): at once when written in this process
  (:meth:`Watcher.offer`), when the feed says a run got one (written by any process),
  and each sweep the notes written since the store's last look, read from the notes
  table by time, like the decisions.
- **Every poll interval, and at once after recording**: a round of the
  :class:`~localui.notify.sender.Sender`.

Every event goes to the server's own targets (``--notify``, ``--webhook``); a pause
an approval policy's rule governs, and its reminders, go to that rule's ``notify``
URLs too.

The outbox records each event's key once per target, so offering the same event
again, from this process or another, announces nothing twice; a restart announces
nothing again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from localui import runs
from localui.backends.base import Backend, Changes, DecisionLog, NoteLog, Outbox, Store
from localui.backends.notes import Note
from localui.links import LinkSigner
from localui.live import ChangeFeed, Resync, to_the_end
from localui.notify import events as ev
from localui.notify.events import Event
from localui.notify.formats import Links
from localui.notify.outbox import notices_of
from localui.notify.people import People, person_of_target
from localui.notify.sender import ROUND_SIZE, Deliverer, Sender
from localui.notify.targets import Target, routes_of, targets_of
from localui.policy import Rule
from localui.records import Decision, IndexProgress, Pending, RunQuery
from localui.settings import Settings

logger = logging.getLogger(__name__)

#: Pending rows read per query while sweeping.
PENDING_PAGE = 500
#: How often a sweep postponed by a first build of the runs index asks again (s).
INDEX_RECHECK_S = 1.0
#: Stalled runs looked at per sweep: the newest ones (a store with thousands of
#: long-dead runs announces the most recent, not all of them at once).
STALLED_PAGE = 100
#: Failed runs read per query, newest first, while a sweep reads those since the last look.
FAILED_PAGE = 100
#: Decisions read per query while a sweep catches up with the decision record.
DECIDED_PAGE = 200
#: Notes read per query while a sweep catches up with the notes table.
NOTES_PAGE = 200
#: How far before its reads began a sweep puts the store's look: a row stamped before
#: them may be committed after (a write waiting for SQLite's lock, PostgreSQL stamping a
#: decision with its own clock), and servers' clocks differ a little. What it offers
#: again is recorded already: one outbox query.
LOOK_BACK_S = 30.0


class Watcher:
    """Events from the feed and the sweeps, into the outbox; and the sender's rounds."""

    def __init__(
        self,
        *,
        settings: Settings,
        feed: ChangeFeed,
        store: Store,
        decisions: DecisionLog,
        outbox: Outbox,
        targets: Sequence[Target],
        sender: Sender,
        routes: Mapping[str, Sequence[Target]] | None = None,
        people: People | None = None,
        clock: Callable[[], float] = time.time,
        notes: NoteLog | None = None,
    ) -> None:
        self.settings = settings
        self.notifications = settings.notifications
        self.feed = feed
        self.store = store
        self.decisions = decisions
        self.outbox = outbox
        self.notes = notes
        routes = routes or {}
        #: Every target this process delivers to: its own, then the policy rules'.
        self.targets = tuple(
            {t.id: t for t in [*targets, *(t for ts in routes.values() for t in ts)]}.values()
        )
        #: The targets that get every event, and those a policy rule adds for its pauses.
        self._everyone = tuple(t.id for t in targets)
        self._routes = {rule: tuple(t.id for t in ts) for rule, ts in routes.items()}
        #: People with an address: each told of the pauses they may decide.
        self.people = people
        self.sender = sender
        self._clock = clock
        self._wanted = frozenset(self.notifications.events)
        self._redact = frozenset(self.notifications.redact)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        #: Why the watcher could not read or record, or None: said once per outage.
        self.problem: str | None = None
        #: Events newly recorded by this process, for the page and the tests.
        self.recorded = 0
        #: Keys of the events the last sweep offered to the outbox (all recorded).
        self._offered: set[str] = set()
        #: The waiting pauses as a sweep last read them (without their context: the
        #: keys need only their run, row and time), and how many changes to the pauses
        #: the feed had published when that read began.
        self._waiting: tuple[Pending, ...] | None = None
        self._waiting_as_of = -1
        #: Changes to the pauses the feed has published (and resyncs), counted.
        self._pause_changes = 0
        #: When a sweep last looked at every waiting pause (None: not yet).
        self.swept_at: float | None = None
        #: How far the runs index's first build has got, while it postpones the sweeps.
        self.index_building: IndexProgress | None = None
        #: When this watcher began.
        self.watching_since = clock()
        #: Since when a first start ever offers failures and decisions (read once).
        self._first_since: float | None = None
        #: How far before its reads began a sweep puts the store's look (s).
        self.look_back = LOOK_BACK_S
        #: Since when the last sweep read failures and decisions.
        self._read_since: datetime | None = None
        #: Whether this process has moved the rows of the targets' former ids.
        self._adopted = False

    # --- what each poll does (blocking; run in a worker thread) ----------------

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    def _target_ids(self, rule: str, *, personal: bool = False) -> tuple[str, ...]:
        """Where an event goes: every event to the server's own targets, a pause under a
        policy rule to that rule's too, and a pause (``personal``) to each person with an
        address who may decide it."""
        people = self.people.target_ids(rule, self._now()) if personal and self.people else ()
        return tuple(dict.fromkeys([*self._everyone, *self._routes.get(rule, ()), *people]))

    def _targets_of(self, event: Event) -> tuple[str, ...]:
        """Where ``event`` goes: the server's own targets, its rule's, and the people told
        of it at their own address (``localui.notify.people``)."""
        people = self.people.target_ids_of(event, self._now()) if self.people else ()
        return tuple(dict.fromkeys([*self._target_ids(event.rule), *people]))

    def gets(self, target_id: str) -> str:
        """What a target is told, as the notifications page says it."""
        person = person_of_target(target_id)
        if person is not None:
            return f"the pauses {person} may decide, with their own decision links"
        if target_id in self._everyone:
            return "every event"
        rules = [rule for rule, ids in self._routes.items() if target_id in ids]
        names = ", ".join(repr(rule) for rule in rules)
        return f"the pauses (and reminders) of rule{'s' if len(rules) > 1 else ''} {names}"

    def _rule(self, pending: Pending) -> Rule | None:
        policy = self.settings.policy
        return policy.rule_for(pending) if policy is not None else None

    def _rule_of(self, pending: Pending) -> str:
        rule = self._rule(pending)
        return rule.name if rule is not None else ""

    def _rhythm(self, pending: Pending) -> tuple[float, float | None]:
        """When a pause's first reminder comes and how often the next: a rule with
        ``due`` and ``remind_every`` gives its own, else ``--remind-after``."""
        rule = self._rule(pending)
        if rule is not None and rule.due is not None and rule.remind_every is not None:
            return rule.due, rule.remind_every
        return self.settings.remind_after, None

    def record(self, found: Sequence[Event]) -> int:
        """Record the wanted events for each of their targets; how many rows are new."""
        by_targets: dict[tuple[str, ...], list[Event]] = {}
        for event in found:
            if ev.wanted(event, self._wanted):
                by_targets.setdefault(self._targets_of(event), []).append(event)
        now = self._clock()
        added = 0
        for target_ids, events in by_targets.items():
            if target_ids:
                added += self.outbox.record(
                    notices_of(events),
                    target_ids,
                    now=now,
                    give_up_at=now + self.notifications.retry_for,
                )
        self.recorded += added
        return added

    def events_of_changes(self, changes: Changes) -> list[Event]:
        """The events one published change gives."""
        # Only what is announced is read: a change of many runs costs reads per run.
        found: list[Event] = []
        added = sorted(changes.pauses_added) if ev.PAUSED in self._wanted else []
        pendings = [p for p in (self.store.get_pending(i) for i in added) if p is not None]
        found.extend(self._pause_events(pendings, overdue=False))
        for execution_id in sorted(changes.decided) if ev.DECIDED in self._wanted else []:
            facts = self.store.get_run(execution_id)
            agent = facts.agent if facts is not None else ""
            for decision in self.decisions.list_for_run(execution_id):
                event = ev.decided(decision, agent)
                if event is not None:
                    found.append(event)
        for execution_id in sorted(changes.runs) if ev.announces_failures(self._wanted) else []:
            facts = self.store.get_run(execution_id)
            event = ev.failed(facts) if facts is not None else None
            if event is not None:
                found.append(event)
        if ev.NOTED in self._wanted and self.notes is not None and changes.noted:
            since = self._since_last_look().isoformat()
            for execution_id in sorted(changes.noted):
                fresh = [n for n in self.notes.for_run(execution_id) if n.created_at >= since]
                found.extend(self._note_events(fresh))
        return found

    def _pause_events(self, pendings: Sequence[Pending], *, overdue: bool) -> list[Event]:
        calls = self.store.paused_calls(pendings) if pendings else {}
        now = self._now()
        found: list[Event] = []
        for pending in pendings:
            call = calls.get(pending.checkpoint_id or "")
            rule = self._rule_of(pending)
            found.append(ev.paused(pending, call, self._redact, rule))
            if overdue:
                first, every = self._rhythm(pending)
                reminder = ev.overdue(
                    pending,
                    call,
                    now,
                    first,
                    self.notifications.remind_times,
                    self._redact,
                    rule,
                    every,
                )
                if reminder is not None:
                    found.append(reminder)
        return found

    def _wanted_keys(self, pending: Pending, now: datetime) -> list[str]:
        first, every = self._rhythm(pending)
        return [
            key
            for key in ev.pause_keys(pending, now, first, self.notifications.remind_times, every)
            if key.partition("\x1f")[0] in self._wanted
        ]

    def saw(self, item: Changes | Resync) -> None:
        """Note what the feed published: waiting pauses it says came or went, or a
        change it cannot pin down, are read again by the next sweep."""
        if isinstance(item, Resync) or item.pauses_changed:
            self._pause_changes += 1

    def _waiting_keys(self, now: datetime) -> set[str] | None:
        """The keys of the waiting pauses from the last read, when that read is still
        what the store holds (the feed has published no change to the pauses since it
        began) and every key is offered already; else None: read them again."""
        if self._waiting is None or self._waiting_as_of != self._pause_changes:
            return None
        keys = {key for pending in self._waiting for key in self._wanted_keys(pending, now)}
        return keys if keys <= self._offered else None

    def _read_waiting(self, now: datetime, keys: set[str]) -> list[Event]:
        """Every waiting pause, read page by page: the keys of each into ``keys``, and
        the events of those not offered before and not in the outbox already."""
        as_of = self._pause_changes
        found: list[Event] = []
        waiting: list[Pending] = []
        after: tuple[str, str] | None = None
        while True:
            page = self.store.list_pending(after=after, limit=PENDING_PAGE)
            unoffered: list[tuple[Pending, list[str]]] = []
            by_rule: dict[str, set[str]] = {}
            for pending in page.items:
                wanted = self._wanted_keys(pending, now)
                keys.update(wanted)
                waiting.append(dataclasses.replace(pending, context=None))
                new = [key for key in wanted if key not in self._offered]
                unoffered.append((pending, new))
                by_rule.setdefault(self._rule_of(pending), set()).update(new)
            # What an earlier process (or another one) recorded is not read again: after a
            # restart, a thousand waiting pauses cost one query, not their paused calls.
            known = {
                key
                for rule, ks in by_rule.items()
                for key in self._recorded(ks, rule, personal=True)
            }
            fresh = [p for p, ks in unoffered if any(key not in known for key in ks)]
            found.extend(e for e in self._pause_events(fresh, overdue=True) if e.key not in known)
            if page.next_key is None:
                break
            after = page.next_key
        self._waiting, self._waiting_as_of = tuple(waiting), as_of
        return found

    def sweep_events(self) -> tuple[list[Event], set[str]]:
        """Every waiting pause (and its reminder when overdue), the newest stalled runs,
        and the failures and decisions since the store's last look: the events not yet
        offered by an earlier sweep of this process (nor recorded), and the keys of the
        pauses, stalls and failures. A pause already offered, whose reminder is not
        due, costs nothing while the feed says the pauses are as the last sweep read
        them, and only its pending row otherwise: its paused call is not read and
        nothing is written."""
        found: list[Event] = []
        now = self._now()
        keys = self._waiting_keys(now)
        if keys is None:
            keys = set()
            found.extend(self._read_waiting(now, keys))
        if ev.STALLED in self._wanted:
            cutoff = datetime.fromtimestamp(
                now.timestamp() - self.settings.stale_after, UTC
            ).isoformat()
            # The runs index, newest activity first, from the cutoff down: only runs
            # already silent long enough, and one page of them.
            quiet = self.store.list_runs(
                RunQuery(state="unfinished", after=(cutoff, ""), limit=STALLED_PAGE)
            )
            stalled = [
                e
                for e in (ev.stalled(facts, now, self.settings.stale_after) for facts in quiet.runs)
                if e is not None
            ]
            keys.update(e.key for e in stalled)
            known = self._recorded({e.key for e in stalled if e.key not in self._offered})
            found.extend(e for e in stalled if e.key not in known)
        failures, decisions = ev.announces_failures(self._wanted), ev.DECIDED in self._wanted
        since = self._since_last_look() if failures or decisions else None
        self._read_since = since
        if failures and since is not None:
            failed = self._failed_since(since)
            keys.update(e.key for e in failed)
            known = self._recorded({e.key for e in failed if e.key not in self._offered})
            found.extend(e for e in failed if e.key not in known)
        if decisions and since is not None:
            found.extend(self._decided_since(since))
        if ev.NOTED in self._wanted and self.notes is not None:
            # Since the look the failures and decisions are read from (the notes ride
            # on it: a note is announced once, whoever sweeps).
            found.extend(self._noted_since(self.notes, since or self._since_last_look()))
        return [e for e in found if e.key not in self._offered], keys

    def _since_last_look(self) -> datetime:
        """Since when failures and decisions are offered: the store's last look, which
        every localui on the store moves forward once a sweep recorded what it read.
        Every failure and decision after it that the outbox lacks came while no
        watcher saw it (a restart, an upgrade, a change the feed could not pin down):
        it is announced now, however long ago. Times are this server's clock, as the
        SDK stamps rows.

        With no look yet (a first start ever), what the watcher did before there was
        one: since its start, or since the newest event the outbox holds when that is
        earlier (a localui without the look watched this store), at most
        ``retry_for`` back. With an empty outbox (notifications turned on for the first
        time), only what comes after the start: turning them on announces the pauses
        that wait and the runs that went silent, not old failures."""
        looked = self.outbox.looked_at()
        if looked is not None:
            return datetime.fromtimestamp(looked, UTC)
        if self._first_since is None:
            since = self.watching_since
            newest = self.outbox.list_recent(1)
            if newest:
                oldest_wanted = since - self.notifications.retry_for
                since = max(min(since, newest[0].created_at), oldest_wanted)
            self._first_since = since
        return datetime.fromtimestamp(self._first_since, UTC)

    def _failed_since(self, since: datetime) -> list[Event]:
        """The runs that failed since ``since``, newest first, page by page: from the
        runs index's failed runs, never a scan of ``checkpoints``."""
        found: list[Event] = []
        # Each state that ended failed (a cancelled or timed-out run too).
        for state in runs.FAILURES:
            after: tuple[str, str] | None = None
            while True:
                page = self.store.list_runs(RunQuery(state=state, after=after, limit=FAILED_PAGE))
                older = False
                for facts in page.runs:
                    at = runs.parse_time(facts.last_at)
                    if at is None:
                        continue
                    if at < since:
                        older = True  # newest first: the rest failed before
                        break
                    event = ev.failed(facts)
                    if event is not None and ev.wanted(event, self._wanted):
                        found.append(event)
                if older or page.next_key is None:
                    break
                after = page.next_key
        return found

    def _decided_since(self, since: datetime) -> list[Event]:
        """The approvals decided since ``since`` that the outbox does not hold yet; the
        run's agent is read only for those."""
        after = (since.isoformat(), 0)
        decisions: list[Decision] = []
        while True:
            page = self.decisions.finished_since(after, DECIDED_PAGE)
            decisions.extend(page)
            if page:
                after = (page[-1].finished_at or "", page[-1].id)
            if len(page) < DECIDED_PAGE:
                break
        keyed = {
            ev.event_key(ev.DECIDED, d.execution_id, str(d.id)): d
            for d in decisions
            if ev.decided(d) is not None
        }
        known = self._recorded(set(keyed))
        found: list[Event] = []
        for key, decision in keyed.items():
            if key not in known:
                facts = self.store.get_run(decision.execution_id)
                event = ev.decided(decision, facts.agent if facts is not None else "")
                if event is not None:
                    found.append(event)
        return found

    def _noted_since(self, notes: NoteLog, since: datetime) -> list[Event]:
        """The notes written since ``since`` whose event the outbox does not hold yet: a
        note another process wrote while no feed here saw it, or one whose offer at
        once failed."""
        after = (since.isoformat(), 0)
        written: list[Note] = []
        while True:
            page = notes.written_since(after, NOTES_PAGE)
            written.extend(page)
            if page:
                after = (page[-1].created_at, page[-1].id)
            if len(page) < NOTES_PAGE:
                break
        return self._note_events(written)

    def _note_events(self, notes: Sequence[Note]) -> list[Event]:
        """The ``pause.noted`` of each note the outbox does not hold yet, with its
        pause's rule while the run still waits at the note's row."""
        found: list[Event] = []
        for note in notes:
            pending = self.store.get_pending(note.execution_id)
            waiting = None
            if pending is not None and pending.checkpoint_id == note.checkpoint_id:
                waiting = pending
            rule = self._rule_of(waiting) if waiting is not None else ""
            event = ev.noted(note, waiting, rule)
            if event.key not in self._recorded({event.key}, rule):
                found.append(event)
        return found

    async def offer(self, found: Sequence[Event]) -> None:
        """Record events that happened in this process (a note just written) at once,
        and wake the sender; a failure is said as the sweeps' are, and the next sweep
        offers them again."""
        await self._guarded(functools.partial(self.record, found))

    def _recorded(self, keys: set[str], rule: str = "", *, personal: bool = False) -> set[str]:
        """Those of ``keys`` the outbox holds already for every target they go to (a
        person given an address since is told of the pauses that still wait)."""
        if not keys:
            return set()
        return self.outbox.recorded(keys, self._target_ids(rule, personal=personal))

    def on_changes(self, changes: Changes) -> int:
        return self.record(self.events_of_changes(changes))

    def adopt_former_ids(self) -> int:
        """Move the rows recorded under each target's former id (which showed its URL's
        path) to its id, once, before anything is recorded: then they are sent, shown
        masked, and no event already announced is recorded anew. How many moved."""
        moved = 0
        for target in self.targets:
            if target.former_id and target.former_id != target.id:
                moved += self.outbox.rename_target(target.former_id, target.id)
        self._adopted = True
        return moved

    def _looks_at_everything(self) -> bool:
        """Whether this process's sweeps offer both kinds the store's look stands for:
        one that announces no failures (or no decisions) has not offered them, so it
        leaves the look where it is for the processes that do."""
        return ev.DECIDED in self._wanted and ev.announces_failures(self._wanted)

    def sweep(self) -> int:
        if not self._adopted:
            self.adopt_former_ids()
        began = self._clock()
        found, keys = self.sweep_events()
        added = self.record(found)
        # Recorded (here, or before by any process: the outbox keeps each key once), so
        # the next sweep need not offer them again; what no longer waits is forgotten.
        self._offered = keys
        if self._looks_at_everything() and self._read_since is not None:
            # Never past what was read: what this sweep's reads could not see yet is
            # after ``began`` (less what a late commit or another clock may hide);
            # never before what it read from (a first start's look is its start).
            self.outbox.advance_looked_at(max(self._read_since.timestamp(), began - self.look_back))
        self.swept_at = self._clock()
        return added

    # --- the loops ---------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name="localui-notify-watch"),
            asyncio.create_task(self._send(), name="localui-notify-send"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def _said(self, problem: str | None) -> None:
        if problem is not None and self.problem is None:
            logger.warning("notifications: %s", problem)
        elif problem is None and self.problem is not None:
            logger.warning("notifications work again")
        self.problem = problem

    async def _guarded(self, call: Callable[[], int]) -> None:
        try:
            added = await to_the_end(call)
        except Exception as exc:
            # A locked or unreachable store must not end the watcher: the next poll
            # or sweep offers the same events again.
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self._said(text)
        else:
            self._said(None)
            if added:
                self._wake.set()

    async def _sweep_once_indexed(self) -> float:
        """A sweep, unless the runs index is first being built; how long until the
        next one. A first start on a big store builds the index for half a minute or
        more, and announcing the pauses that waited before (a thousand of them, with
        their reminders, to each target) beside it takes as long again; they are
        announced as soon as it is complete. Changes the feed publishes meanwhile are
        announced as they come."""
        try:
            self.index_building = await to_the_end(self.store.indexing)
        except Exception:
            self.index_building = None  # the sweep says what is wrong
        if self.index_building is not None:
            return INDEX_RECHECK_S
        await self._guarded(self.sweep)
        return self.notifications.sweep_interval

    async def _watch(self) -> None:
        # The pages first: a server starting on a big store serves at once, and
        # watches a moment later. Subscribing starts the feed, whose first read counts
        # the store's rows (a fifth of a second at a million runs); the first sweep
        # then announces what waits.
        await asyncio.sleep(self.notifications.first_sweep_after)
        async with await self.feed.subscribe() as subscription:
            next_sweep = time.monotonic() + await self._sweep_once_indexed()
            while True:
                wait = max(0.0, next_sweep - time.monotonic())
                try:
                    item = await asyncio.wait_for(subscription.next(), wait)
                except TimeoutError:
                    item = Resync(seq=self.feed.seq)
                if item is None:
                    return  # the feed has stopped
                self.saw(item)
                if isinstance(item, Resync) or item.everything:
                    next_sweep = time.monotonic() + await self._sweep_once_indexed()
                else:
                    await self._guarded(functools.partial(self.on_changes, item))

    async def _send(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval)
            self._wake.clear()
            try:
                done = await to_the_end(self.sender.send_round)
            except Exception as exc:
                text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                self._said(text)
                continue
            if done.claimed >= ROUND_SIZE or done.abandoned >= ROUND_SIZE:
                self._wake.set()  # more are due: the next round at once


def make_watcher(
    settings: Settings,
    *,
    feed: ChangeFeed,
    backend: Backend,
    decisions: DecisionLog,
    links: Links,
    people: People | None = None,
    link_signer: LinkSigner | None = None,
    notes: NoteLog | None = None,
) -> Watcher:
    """The watcher for ``settings``' targets and ``people``'s addresses, with its own
    outbox on ``backend`` (the caller closes it: ``watcher.outbox``). Raises
    ``TargetError`` for a bad target."""
    targets = targets_of(settings.notifications)
    routes = routes_of(settings.policy)
    outbox = backend.outbox()
    deliverer = Deliverer(
        settings.notifications,
        links,
        now=lambda: datetime.now(UTC),
        people=people,
        link_signer=link_signer,
    )
    return Watcher(
        settings=settings,
        feed=feed,
        store=backend.store,
        decisions=decisions,
        outbox=outbox,
        targets=targets,
        routes=routes,
        people=people,
        notes=notes,
        sender=Sender(
            outbox,
            [*targets, *(t for ts in routes.values() for t in ts)],
            deliverer,
            settings.notifications,
            people=people,
        ),
    )
