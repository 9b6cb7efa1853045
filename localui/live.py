"""One change feed per process, fanned out to the live pages' subscribers.

The feed asks a :class:`ChangeSource` what changed in the store, every
``Settings.poll_interval`` seconds, and hands the answer (:class:`Changes`:
which runs got rows, which pauses appeared or went, which runs got a
decision) to every subscriber's bounded queue. Nothing else polls the store:
a live page renders only when the feed says its data changed.

- With no subscribers the feed does not touch the store at all; the first
  subscriber takes a fresh baseline, so what happened meanwhile is in the
  state it renders, not in an event.
- A subscriber whose queue is full (a client that stopped reading) loses its
  queued changes and gets one :class:`Resync` instead: it re-renders
  everything it shows once it reads again. Others are never held up.
- Stopping the feed ends every subscription, so open streams close with the
  app's lifespan.

:class:`SQLiteChangeSource` watches ``PRAGMA data_version`` on a read-only
connection of its own and reads its cursors only when that moves; the
PostgreSQL source (``localui.live_pg``) implements the same protocol, and
:class:`StoreChangeSource` serves any other store, coarsely.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Protocol

from localui.store.base import Store
from localui.store.records import decode_text
from localui.store.sqlite_files import read_uri

logger = logging.getLogger(__name__)

#: Changes a subscriber may have queued before it must resync instead.
DEFAULT_QUEUE_SIZE = 32

#: The app's decision record (``localui.decisions``): a new or finished decision
#: changes what a run page says.
DECISIONS_TABLE = "localui_decisions"


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed in the store since the previous poll."""

    #: Runs that got new rows, or whose rows changed (outbox flags).
    runs: frozenset[str] = frozenset()
    #: Runs that paused on an interrupt (a new ``pending_interrupts`` row).
    pauses_added: frozenset[str] = frozenset()
    #: Runs whose pause was claimed, by an approval here or anywhere else.
    pauses_removed: frozenset[str] = frozenset()
    #: Runs with a new or finished decision in the app's own record.
    decided: frozenset[str] = frozenset()
    #: Something changed that cannot be pinned to runs (the schema): refresh all.
    everything: bool = False
    #: The feed's count of published changes; stamped by :class:`ChangeFeed`.
    seq: int = 0

    def __bool__(self) -> bool:
        return bool(
            self.everything or self.runs or self.pauses_added or self.pauses_removed or self.decided
        )

    @property
    def pauses_changed(self) -> bool:
        return self.everything or bool(self.pauses_added or self.pauses_removed)

    @property
    def runs_changed(self) -> bool:
        return self.everything or bool(self.runs or self.pauses_added or self.pauses_removed)

    def touches(self, execution_id: str) -> bool:
        """Whether a page about this one run must be rendered again."""
        return self.everything or any(
            execution_id in ids
            for ids in (self.runs, self.pauses_added, self.pauses_removed, self.decided)
        )

    def merge(self, other: Changes) -> Changes:
        """Both changes as one, for a subscriber that fell behind by a few."""
        return Changes(
            runs=self.runs | other.runs,
            pauses_added=self.pauses_added | other.pauses_added,
            pauses_removed=self.pauses_removed | other.pauses_removed,
            decided=self.decided | other.decided,
            everything=self.everything or other.everything,
            seq=max(self.seq, other.seq),
        )


@dataclass(frozen=True, slots=True)
class Resync:
    """The subscriber missed changes (its queue overflowed): render everything again."""

    seq: int


class ChangeSource(Protocol):
    """Tells the feed what changed in one store. Methods block: the feed runs them
    in a worker thread, one at a time."""

    def reset(self) -> None:
        """Take the store as it is now as the baseline for the next :meth:`poll`."""
        ...

    def poll(self) -> Changes | None:
        """What changed since the last poll or reset; None when nothing did."""
        ...

    def close(self) -> None: ...


# --- SQLite -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Cursor:
    """Where the store was at one poll: cheap positions to compare, not the data."""

    schema_version: int
    #: Newest checkpoint rowid: rows above it are new.
    max_rowid: int
    #: ``(created_at, rowid)`` of the newest row marked synced to the plane (the SDK
    #: drains oldest first, so this moves whenever rows sync or are quarantined).
    newest_synced: tuple[str, int] | None
    #: Pending interrupts: execution id -> the pause's ``created_at``.
    pending: Mapping[str, str]
    #: The decision record: ``(max id, count, newest finished_at)``.
    decisions: tuple[int, int, str]


@dataclass(frozen=True, slots=True)
class _Tables:
    checkpoints: bool
    synced: bool
    pending: bool
    decisions: bool


class SQLiteChangeSource:
    """A :class:`ChangeSource` over a SQLite store, on a read-only connection of its own.

    ``PRAGMA data_version`` changes on that connection whenever another
    connection commits, so an idle poll is one statement that reads no table.
    Only when it moves are the cursors read, each an index lookup: the newest
    rowid, the newest synced row, the (small) pending table and the decision
    record. Deletes are not seen unless they take the newest rows (SQLite keeps
    no cheap count): after a prune by another process, a page is right again at
    its next change or reload.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 5.0,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._busy_timeout = busy_timeout
        #: Called with every SQL statement the source runs (tests and the benchmark count them).
        self._trace = trace
        self._conn: sqlite3.Connection | None = None
        self._data_version: int | None = None
        self._tables: _Tables | None = None
        self._tables_version = -1
        self._cursor: _Cursor | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            uri = read_uri(self.path)
            # Used from one worker thread at a time (the feed serialises its calls).
            conn = sqlite3.connect(
                uri,
                uri=True,
                timeout=self._busy_timeout,
                check_same_thread=False,
                isolation_level=None,
            )
            conn.text_factory = decode_text
            conn.execute("PRAGMA query_only = 1")
            conn.set_trace_callback(self._trace)
            self._conn = conn
        return self._conn

    def reset(self) -> None:
        conn = self._connection()
        self._data_version = self._read_data_version(conn)
        self._cursor = self._read_cursor(conn)

    def poll(self) -> Changes | None:
        conn = self._connection()
        version = self._read_data_version(conn)
        if self._cursor is not None and version == self._data_version:
            return None
        self._data_version = version
        previous = self._cursor
        with self._snapshot(conn):
            current = self._read_cursor(conn)
            changes = self._compare(conn, previous, current) if previous else Changes()
        self._cursor = current
        return changes or None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- reading ---------------------------------------------------------

    @staticmethod
    def _read_data_version(conn: sqlite3.Connection) -> int:
        return int(conn.execute("PRAGMA data_version").fetchone()[0])

    @staticmethod
    @contextlib.contextmanager
    def _snapshot(conn: sqlite3.Connection) -> Iterator[None]:
        """One read transaction, so the cursors and what they point at agree."""
        conn.execute("BEGIN")
        try:
            yield
        finally:
            conn.execute("COMMIT")

    def _tables_for(self, conn: sqlite3.Connection, schema_version: int) -> _Tables:
        if self._tables is not None and self._tables_version == schema_version:
            return self._tables
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        columns: set[str] = set()
        if "checkpoints" in names:
            columns = {r[1] for r in conn.execute("PRAGMA table_info(checkpoints)")}
        self._tables = _Tables(
            checkpoints="checkpoints" in names,
            synced="synced" in columns,
            pending="pending_interrupts" in names,
            decisions=DECISIONS_TABLE in names,
        )
        self._tables_version = schema_version
        return self._tables

    def _read_cursor(self, conn: sqlite3.Connection) -> _Cursor:
        schema_version = int(conn.execute("PRAGMA schema_version").fetchone()[0])
        t = self._tables_for(conn, schema_version)
        max_rowid = 0
        newest_synced = None
        if t.checkpoints:
            max_rowid = int(conn.execute("SELECT max(rowid) FROM checkpoints").fetchone()[0] or 0)
        if t.synced:
            # The SDK's index on (synced, created_at) answers this without a scan.
            row = conn.execute(
                "SELECT created_at, rowid FROM checkpoints WHERE synced = 1"
                " ORDER BY created_at DESC, rowid DESC LIMIT 1"
            ).fetchone()
            newest_synced = (str(row[0] or ""), int(row[1])) if row else None
        pending: dict[str, str] = {}
        if t.pending:
            pending = {
                str(r[0]): str(r[1] or "")
                for r in conn.execute("SELECT execution_id, created_at FROM pending_interrupts")
            }
        decisions = (0, 0, "")
        if t.decisions:
            row = conn.execute(
                f"SELECT max(id), count(*), max(finished_at) FROM {DECISIONS_TABLE}"
            ).fetchone()
            decisions = (int(row[0] or 0), int(row[1] or 0), str(row[2] or ""))
        return _Cursor(
            schema_version=schema_version,
            max_rowid=max_rowid,
            newest_synced=newest_synced,
            pending=MappingProxyType(pending),
            decisions=decisions,
        )

    def _compare(self, conn: sqlite3.Connection, before: _Cursor, now: _Cursor) -> Changes:
        if now.schema_version != before.schema_version or now.max_rowid < before.max_rowid:
            # A migration, or the newest rows deleted: nothing to pin it to.
            return Changes(everything=True)
        runs: set[str] = set()
        if now.max_rowid > before.max_rowid:
            runs.update(
                str(r[0])
                for r in conn.execute(
                    "SELECT DISTINCT execution_id FROM checkpoints WHERE rowid > ?",
                    (before.max_rowid,),
                )
            )
        if now.newest_synced != before.newest_synced and now.newest_synced is not None:
            since = before.newest_synced or ("", 0)
            runs.update(
                str(r[0])
                for r in conn.execute(
                    "SELECT DISTINCT execution_id FROM checkpoints"
                    " WHERE synced = 1 AND created_at >= ? AND created_at <= ?",
                    (since[0], now.newest_synced[0]),
                )
            )
        added = {
            eid for eid, at in now.pending.items() if before.pending.get(eid) not in (None, at)
        } | (now.pending.keys() - before.pending.keys())
        removed = {
            eid for eid, at in before.pending.items() if now.pending.get(eid) not in (None, at)
        } | (before.pending.keys() - now.pending.keys())
        decided: set[str] = set()
        everything = False
        if now.decisions != before.decisions:
            if now.decisions[1] < before.decisions[1]:
                everything = True  # a claim released: we cannot tell whose
            else:
                decided.update(
                    str(r[0])
                    for r in conn.execute(
                        f"SELECT DISTINCT execution_id FROM {DECISIONS_TABLE}"
                        " WHERE id > ? OR COALESCE(finished_at, '') > ?",
                        (before.decisions[0], before.decisions[2]),
                    )
                )
        return Changes(
            runs=frozenset(runs),
            pauses_added=frozenset(added),
            pauses_removed=frozenset(removed),
            decided=frozenset(decided),
            everything=everything,
        )


class StoreChangeSource:
    """A coarse :class:`ChangeSource` for any :class:`Store`: it compares the store's
    totals and its pending pauses. New rows are not pinned to runs (``everything``);
    pauses are exact. For backends without a source of their own."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._state: tuple[int, int, int] | None = None
        self._pending: frozenset[str] = frozenset()

    def _read(self) -> tuple[tuple[int, int, int], frozenset[str]]:
        totals = self.store.totals()
        pending: set[str] = set()
        after: tuple[str, str] | None = None
        while True:
            page = self.store.list_pending(after=after, limit=500)
            pending.update(p.execution_id for p in page.items)
            if page.next_key is None:
                break
            after = page.next_key
        return (totals.rows, totals.rows_waiting, totals.rows_quarantined), frozenset(pending)

    def reset(self) -> None:
        self._state, self._pending = self._read()

    def poll(self) -> Changes | None:
        state, pending = self._read()
        before, before_pending = self._state, self._pending
        self._state, self._pending = state, pending
        if before is None:
            return None
        changes = Changes(
            pauses_added=pending - before_pending,
            pauses_removed=before_pending - pending,
            everything=state != before,
        )
        return changes or None

    def close(self) -> None:
        """The store belongs to the app, which closes it."""


def open_change_source(store: Store) -> ChangeSource:
    """The cheapest source for the app's store: the backend's own cursors where it has
    them, else the coarse :class:`StoreChangeSource`."""
    from localui.store.postgres import PostgresStore
    from localui.store.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return SQLiteChangeSource(store.path)
    if isinstance(store, PostgresStore):
        from localui.live_pg import PostgresChangeSource

        return PostgresChangeSource(store.dsn, schema=store.schema, app_schema=store.app_schema)
    return StoreChangeSource(store)


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
            await asyncio.to_thread(self.source.close)

    async def subscribe(self) -> Subscription:
        """A new subscription. The first one after an idle spell takes a fresh
        baseline first, so changes made while no one watched are not replayed."""
        async with self._source_lock:
            if self._stopped:
                raise RuntimeError("the change feed has stopped")
            if not self._baseline:
                await asyncio.to_thread(self.source.reset)
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

    async def poll_once(self) -> Changes | None:
        """One poll of the source, published when something changed."""
        async with self._source_lock:
            if not self._baseline:
                return None
            self.polls += 1
            changes = await asyncio.to_thread(self.source.poll)
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
