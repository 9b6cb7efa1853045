"""One change feed per process, fanned out to the live pages' subscribers.

The feed asks a :class:`ChangeSource` what changed in the store, every
``Settings.poll_interval`` seconds, and hands the answer (:class:`Changes`:
which runs got rows, which pauses appeared or went, which runs got a
decision) to every subscriber's bounded queue. Nothing else polls the store:
a live page renders only when the feed says its data changed.

- With no subscribers the feed does not touch the store at all; the first
  subscriber takes a fresh baseline, so what happened meanwhile is in the
  state it renders, not in an event. With a notification target configured,
  the watcher (``localui.notify.watcher``) is a subscriber for the app's whole
  life, so the feed polls whether or not a page is open.
- A subscriber whose queue is full (a client that stopped reading) loses its
  queued changes and gets one :class:`Resync` instead: it re-renders
  everything it shows once it reads again. Others are never held up.
- Stopping the feed ends every subscription, so open streams close with the
  app's lifespan.
- :class:`LiveRenders` keeps the newest render of every live view some stream shows:
  streams showing the same view share one render per change.

Each backend brings its own :class:`~localui.backends.base.ChangeSource`
(``localui.backends.sqlite.changes``, ``localui.backends.postgres.changes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from localui.backends.base import Changes, ChangeSource
from localui.offloop import off_loop

logger = logging.getLogger(__name__)

T = TypeVar("T")
#: What a live view renders from: the app state, handed to each render.
C = TypeVar("C")
C_in = TypeVar("C_in", contravariant=True)

#: Changes a subscriber may have queued before it must resync instead.
DEFAULT_QUEUE_SIZE = 32


@dataclass(frozen=True, slots=True)
class Resync:
    """The subscriber missed changes (its queue overflowed): render everything again."""

    seq: int


async def to_the_end(call: Callable[[], T]) -> T:
    """``call()`` in a worker thread, holding on until it returns even when the
    awaiting task is cancelled: whoever closes what the thread reads must wait for it
    (SQLite answers a connection closed under a read with a segmentation fault, not
    an exception). A task cancelled again while it waits keeps waiting; the
    cancellation is passed on once the thread has returned."""
    running = asyncio.ensure_future(off_loop(call))
    cancelled = False
    while not running.done():
        try:
            # ``wait`` never cancels what it waits for, unlike awaiting it.
            await asyncio.wait({running})
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return running.result()


# --- the feed -----------------------------------------------------------------


class _Closed:
    """Put in a queue when the feed stops."""


_CLOSED = _Closed()


def _combine(
    first: Changes | Resync | _Closed, then: Changes | Resync | _Closed
) -> Changes | Resync | _Closed:
    """Two queued items as one: closing wins, then a resync, else the merged changes."""
    if isinstance(first, _Closed) or isinstance(then, _Closed):
        return _CLOSED
    if isinstance(first, Resync) or isinstance(then, Resync):
        return Resync(seq=max(first.seq, then.seq))
    return first.merge(then)


@dataclass(eq=False)
class Subscription:
    """One subscriber's bounded queue of changes. ``async with`` it, or close it."""

    feed: ChangeFeed
    queue: asyncio.Queue[Changes | Resync | _Closed]
    #: The feed's ``seq`` when this subscription began: render state at least this new.
    seq: int
    #: How many times this subscriber overflowed and was told to resync.
    overflows: int = 0
    closed: bool = False

    async def next(self) -> Changes | Resync | None:
        """Everything queued, merged into one; None once the feed has stopped."""
        if self.closed:
            return None
        item = await self.queue.get()
        while not isinstance(item, _Closed) and not self.queue.empty():
            item = _combine(item, self.queue.get_nowait())
        if isinstance(item, _Closed):
            self.closed = True
            return None
        return item

    def deliver(self, item: Changes | Resync | _Closed) -> None:
        """Queue ``item``; on overflow drop what is queued and ask for a resync."""
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            while not self.queue.empty():
                self.queue.get_nowait()
            if isinstance(item, _Closed):
                self.queue.put_nowait(item)
            else:
                self.overflows += 1
                self.queue.put_nowait(Resync(seq=item.seq))

    def close(self) -> None:
        self.feed.unsubscribe(self)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ChangeFeed:
    """Polls one :class:`ChangeSource` and fans its changes out to subscribers."""

    def __init__(
        self,
        source: ChangeSource,
        *,
        interval: float = 0.5,
        queue_size: int = DEFAULT_QUEUE_SIZE,
    ) -> None:
        if interval <= 0:
            raise ValueError("the poll interval must be positive")
        if queue_size < 1:
            raise ValueError("a subscriber's queue holds at least one change")
        self.source = source
        self.interval = interval
        self.queue_size = queue_size
        self._subscribers: set[Subscription] = set()
        self._seq = 0
        #: Whether the source's baseline is current: someone has watched since it was taken.
        self._baseline = False
        self._someone = asyncio.Event()
        self._source_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        #: Polls made, for tests and the benchmark: zero while no one watches.
        self.polls = 0
        #: Why the store cannot be read right now, or None while it can: every stream
        #: shows it, and a Resync when it comes and goes re-renders every page.
        self.problem: str | None = None

    @property
    def seq(self) -> int:
        """How many changes were published; also moved by a fresh baseline."""
        return self._seq

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="localui-change-feed")

    async def stop(self) -> None:
        """End every subscription and the polling, and close the source."""
        if self._stopped:
            return
        self._stopped = True
        for subscription in list(self._subscribers):
            subscription.deliver(_CLOSED)
        self._subscribers.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        async with self._source_lock:
            await self._in_thread(self.source.close)

    async def subscribe(self) -> Subscription:
        """A new subscription. The first one after an idle spell takes a fresh
        baseline first, so changes made while no one watched are not replayed."""
        async with self._source_lock:
            if self._stopped:
                raise RuntimeError("the change feed has stopped")
            if not self._baseline:
                await self._in_thread(self.source.reset)
                self._baseline = True
                # Whatever was rendered before the idle spell may be stale now.
                self._seq += 1
            subscription = Subscription(
                feed=self, queue=asyncio.Queue(maxsize=self.queue_size), seq=self._seq
            )
            self._subscribers.add(subscription)
            self._someone.set()
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        subscription.closed = True
        self._subscribers.discard(subscription)
        if not self._subscribers:
            # No one hears about changes from now on: the next subscriber re-baselines.
            self._baseline = False
            self._someone.clear()

    def publish(self, changes: Changes) -> Changes:
        """Stamp ``changes`` with the next ``seq`` and queue them for every subscriber."""
        self._seq += 1
        stamped = replace(changes, seq=self._seq)
        for subscription in list(self._subscribers):
            subscription.deliver(stamped)
        return stamped

    async def _in_thread(self, call: Callable[[], T]) -> T:
        """``call()`` in a worker thread (see :func:`to_the_end`): the caller's lock on
        the source must not be let go while a thread still reads it, or ``stop`` would
        close the connection under that read."""
        return await to_the_end(call)

    async def poll_once(self) -> Changes | None:
        """One poll of the source, published when something changed."""
        async with self._source_lock:
            if not self._baseline:
                return None
            self.polls += 1
            changes = await self._in_thread(self.source.poll)
        if changes is None:
            return None
        return self.publish(changes)

    async def _run(self) -> None:
        while not self._stopped:
            if not self._subscribers:
                await self._someone.wait()
                continue
            await asyncio.sleep(self.interval)
            try:
                await self.poll_once()
            except Exception as exc:
                # A locked, vanished or unreachable store must not end the feed; the next
                # poll retries. Said once per outage, not once per poll.
                problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if self.problem is None:
                    logger.warning("the store cannot be read: %s", problem)
                self.set_problem(problem)
            else:
                if self.problem is not None:
                    logger.warning("the store can be read again")
                self.set_problem(None)

    def set_problem(self, problem: str | None) -> None:
        """Record whether the store can be read; tell every stream when that changes."""
        if problem == self.problem:
            return
        self.problem = problem
        self._seq += 1
        for subscription in list(self._subscribers):
            subscription.deliver(Resync(seq=self._seq))


@dataclass(frozen=True, slots=True)
class Fragment:
    """One rendered partial and the SSE event that carries it."""

    event: str
    html: str


@dataclass(frozen=True, slots=True)
class Rendered:
    """A view's fragments, rendered from data at least as new as the feed's ``seq``."""

    fragments: tuple[Fragment, ...]
    #: What the view remembers between renders (the queue: which cards it showed).
    memo: Any = None
    #: Stamped by :class:`LiveRenders`, which knows the feed.
    seq: int = 0


class LiveView(Protocol[C_in]):
    """One live part of a page: what it is keyed by, what touches it, how it renders."""

    @property
    def key(self) -> Hashable: ...

    def affected_by(self, changes: Changes) -> bool: ...

    def render(self, ctx: C_in, previous: Rendered | None) -> Rendered:
        """Read and render; blocking, so it runs off the event loop. ``previous`` is the
        render before this one, for views that remember something across renders."""
        ...


@dataclass
class LiveRenders(Generic[C]):
    """The newest render of every view some stream shows, shared by those streams.

    Built by the app's lifespan beside the feed; the app state each view renders from
    is handed in per call, so this module knows nothing of the app's views."""

    feed: ChangeFeed
    _entries: dict[Hashable, Rendered] = field(default_factory=dict)
    _locks: dict[Hashable, asyncio.Lock] = field(default_factory=dict)
    _users: Counter[Hashable] = field(default_factory=Counter)
    #: Renders made, for tests and the benchmark.
    renders: int = 0

    @contextlib.contextmanager
    def holding(self, views: Sequence[LiveView[C]]) -> Iterator[None]:
        """Keep these views' renders while a stream shows them; forget them after."""
        for view in views:
            self._users[view.key] += 1
        try:
            yield
        finally:
            for view in views:
                self._users[view.key] -= 1
                if self._users[view.key] <= 0:
                    del self._users[view.key]
                    self._entries.pop(view.key, None)
                    self._locks.pop(view.key, None)

    async def current(self, ctx: C, view: LiveView[C], at_least: int) -> Rendered:
        """The view rendered from data no older than the feed's ``seq`` ``at_least``."""
        entry = self._entries.get(view.key)
        if entry is not None and entry.seq >= at_least:
            return entry
        lock = self._locks.setdefault(view.key, asyncio.Lock())
        async with lock:
            entry = self._entries.get(view.key)
            if entry is not None and entry.seq >= at_least:
                return entry
            # Read the seq first: the data read after it is at least that new.
            seq = self.feed.seq
            made = await off_loop(view.render, ctx, entry)
            self.renders += 1
            entry = replace(made, seq=seq)
            if view.key in self._users:
                self._entries[view.key] = entry
            return entry


#: A browser, as the live streams tell one from another: address, User-Agent, cookies.
Browser = tuple[str, str, str]


@dataclass
class BrowserStreams:
    """Live streams open per browser, so the views can refuse those beyond a cap: a
    browser has only a few connections to a server, and streams must not take them all.
    One per app (on its state), like the feed."""

    open: Counter[Browser] = field(default_factory=Counter)

    @contextlib.contextmanager
    def holding(self, browser: Browser | None) -> Iterator[None]:
        if browser is not None:
            self.open[browser] += 1
        try:
            yield
        finally:
            if browser is not None:
                self.open[browser] -= 1
                if self.open[browser] <= 0:
                    del self.open[browser]
