"""Keeping the runs index up to date with the store: the catch-up engine and the
build thread.

* nothing changed (``PRAGMA data_version``): nothing to do;
* rows were added: only the runs that got rows (``rowid`` above the high-water
  mark) and the runs whose pending row came or went are summarised again;
* rows were deleted (prune), or the file is another file now: the whole index
  is rebuilt;
* the outbox marked rows in place: the runs with rows marked since the last look
  are summarised again. The SDK's drain marks rows oldest first, so those are the
  rows marked at or after the newest marked row of the last look, a range of the
  SDK's ``(synced, created_at)`` index. Should the counts still disagree (rows
  marked out of that order), every run with rows waiting is summarised again.

A whole build reads every checkpoint (about 3 s at 400,000 rows). On a store that
large it runs in a thread of its own, and :meth:`IndexSync.refresh` says False
until it is done; the trigram index for text search is filled after that, by
another thread in short steps, while the runs list answers from the index. State
comes from ``localui.runs.run_state``, the one place the rules live.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localui import runs
from localui.backends.sqlite.connect import transaction
from localui.backends.sqlite.errors import is_busy, is_undecodable_text
from localui.backends.sqlite.files import decode_text
from localui.backends.sqlite.index import schema
from localui.errors import Unavailable
from localui.records import FORK_ORIGIN_NODE, IndexProgress, RunFacts

#: A store with at least this many checkpoint rows is indexed in the background;
#: a smaller one before the first answer (a few hundred ms at most).
BACKGROUND_FROM_ROWS = 20_000

#: Rows read between two progress reports (and checks for a shutdown) of a build.
_PROGRESS_EVERY = 8192

#: While rows are only being added (or marked by the outbox), the store's rows are
#: counted in full (to see rows deleted meanwhile, by a prune in another process) at
#: most this often: a count reads an index of every row (80 ms at 3.9M rows), and a
#: store an agent writes to, or the plane drains, changes several times a second. A
#: change that does neither is always counted.
RECOUNT_EVERY_S = 10.0

#: Once the trigram index is complete, the runs folded in since its last batch go in
#: it when there are this many, or when the oldest of them has waited this long (search
#: scans them meanwhile): see ``schema.extend_text_index``.
TEXT_BATCH_RUNS = 1000
TEXT_BATCH_EVERY_S = 1.0

#: How much of a run's tool arguments the index keeps for search.
MAX_TOOL_ARGS = 4000

#: What the fold reads of each checkpoint, in the order :class:`_Summary` unpacks it;
#: :class:`StoreColumns` maps each name to SQL for the store at hand.
FOLD_COLUMNS = (
    "rowid",
    "execution_id",
    "agent",
    "checkpoint_id",
    "node_id",
    "step_type",
    "status",
    "created_at",
    "parent_checkpoint_id",
    "synced",
    "sync_error",
    "tool_args",
    "agent_path",
    "run_reason",
)


@dataclass(frozen=True, slots=True)
class StoreColumns:
    """How to read the store's checkpoints: SQL for each of :data:`FOLD_COLUMNS`, and
    the outbox columns; a column an older SDK did not write reads as NULL."""

    #: Name in :data:`FOLD_COLUMNS` -> its SQL over ``s.checkpoints``.
    expressions: Mapping[str, str]
    synced: str
    sync_error: str
    #: The column holding checkpoint ids (``id`` in stores older than ``checkpoint_id``).
    checkpoint_key: str = "checkpoint_id"

    @property
    def select(self) -> str:
        """The fold's select list, in :data:`FOLD_COLUMNS` order."""
        return ", ".join(f"{self.expressions[name]} AS {name}" for name in FOLD_COLUMNS)


class _Summary:
    """One run folded from its rows (:data:`FOLD_COLUMNS` tuples), in any order.

    ``agent`` is the run's owner, as ``localui.runs.run_owner`` says: the one the
    shallowest ``agent_path`` names, the earliest of them on a tie (a Supervisor or
    Swarm, not the member whose row is newest; an agent used as a tool under its own
    id, not the agent above it that wrote no row here), else the first row's agent.
    """

    __slots__ = (
        "agent",
        "owner",
        "owner_depth",
        "owner_at",
        "owner_rowid",
        "first_rowid",
        "cid",
        "node",
        "step",
        "status",
        "at",
        "rowid",
        "count",
        "first",
        "fork_parent",
        "waiting",
        "quarantined",
        "args",
        "reason",
    )

    def __init__(self, row: tuple[Any, ...]) -> None:
        rowid, _eid, agent, cid, node, step, status, at, parent, synced, error, args, path, why = (
            row
        )
        self.agent, self.cid, self.node, self.step = agent or "", cid or "", node or "", step
        self.status, self.at, self.rowid = status or "completed", at or "", rowid
        self.reason = _reason(why)
        self.count, self.first, self.first_rowid = 1, at or "", rowid
        # The owner, and the row it was read from: the shallowest (then earliest) whose
        # path names one.
        owner = runs.path_owner_name(path)
        self.owner = owner or ""
        self.owner_depth = runs.path_depth(path) if path and owner is not None else 0
        self.owner_at: str = self.first if owner is not None else ""
        self.owner_rowid: int = rowid if owner is not None else -1  # -1: no owner yet
        self.fork_parent = parent if node == FORK_ORIGIN_NODE else None
        self.waiting = 1 if synced == 0 else 0
        self.quarantined = 1 if error is not None else 0
        self.args: set[str] = {args} if args else set()

    @property
    def run_agent(self) -> str:
        """Whose run this is, by name (the owner's, else the first row's agent)."""
        return self.owner if self.owner_rowid >= 0 else self.agent

    def add(self, row: tuple[Any, ...]) -> None:
        rowid, _eid, agent, cid, node, step, status, at, parent, synced, error, args, path, why = (
            row
        )
        at = at or ""
        self.count += 1
        # Rows come in insertion order within a run, mostly: the comparisons are plain
        # ones first, the tie-break on rowid only when the times are equal.
        if at < self.first or (at == self.first and rowid < self.first_rowid):
            self.first, self.first_rowid, self.agent = at, rowid, agent or ""
        if path and (
            self.owner_rowid < 0
            or (depth := runs.path_depth(path)) < self.owner_depth
            or (
                depth == self.owner_depth
                and (at < self.owner_at or (at == self.owner_at and rowid < self.owner_rowid))
            )
        ):
            owner = runs.path_owner_name(path)
            if owner is not None:
                self.owner, self.owner_at, self.owner_rowid = owner, at, rowid
                self.owner_depth = runs.path_depth(path)
        # The SDK's newest row: created_at, then insertion order (get_last).
        if at > self.at or (at == self.at and rowid > self.rowid):
            self.cid, self.node, self.step = cid or "", node or "", step
            self.status, self.at, self.rowid = status or "completed", at, rowid
            self.reason = _reason(why)
        if node == FORK_ORIGIN_NODE:
            self.fork_parent = parent
        if synced == 0:
            self.waiting += 1
        if error is not None:
            self.quarantined += 1
        if args:
            self.args.add(args)


def _reason(value: Any) -> str | None:
    """A run-end row's ``run_reason`` as the store gave it (only text is a reason)."""
    return value if isinstance(value, str) else None


#: Where the fold finds the run a row belongs to.
_RUN = FOLD_COLUMNS.index("execution_id")


def facts(eid: str, s: _Summary, pending: Mapping[str, str]) -> RunFacts:
    """A folded run as the records carry it."""
    return RunFacts(
        execution_id=eid,
        agent=s.run_agent,
        row_count=s.count,
        first_at=s.first,
        last_at=s.at,
        last_checkpoint_id=s.cid,
        last_node_id=s.node,
        last_step_type=s.step,
        last_status=s.status,
        has_pending=eid in pending,
        pending_reason=pending.get(eid),
        fork_parent_checkpoint_id=s.fork_parent,
        rows_waiting=s.waiting,
        rows_quarantined=s.quarantined,
        run_reason=s.reason,
    )


class _Rebuild(Exception):
    """Catching up is not enough (rows were deleted): the index must be built anew."""


class _Closing(Exception):
    """The app is shutting down: a background build stops where it is."""


def _fold_in_order(
    rows: Iterable[tuple[Any, ...]], batch: int = 1000
) -> Iterator[dict[str, _Summary]]:
    """Runs folded from rows that come grouped by run, ``batch`` complete runs at a
    time: a whole store is folded without holding every run in memory at once."""
    folded: dict[str, _Summary] = {}
    current: _Summary | None = None
    current_id = None
    run = _RUN  # a local: looked up once per row of the whole store
    for row in rows:
        if row[run] == current_id and current is not None:
            current.add(row)
            continue
        if len(folded) >= batch:
            yield folded
            folded = {}
        current_id, current = row[run], _Summary(row)
        folded[current_id] = current
    if folded:
        yield folded


def fold(rows: Iterable[tuple[Any, ...]]) -> dict[str, _Summary]:
    """Runs folded from their rows, which may come in any order."""
    folded: dict[str, _Summary] = {}
    for row in rows:
        summary = folded.get(row[_RUN])
        if summary is None:
            folded[row[_RUN]] = _Summary(row)
        else:
            summary.add(row)
    return folded


#: Where each column of ``runs`` is in a row made by :func:`_run_row`.
_UPDATED = {c: i for i, c in enumerate(schema.RUN_COLUMNS)}


def _run_row(eid: str, s: _Summary, pending: Mapping[str, str]) -> tuple[Any, ...]:
    """A run's row of ``runs``, in :data:`schema.RUN_COLUMNS` order."""
    return (
        eid,  # execution_id
        s.run_agent,  # agent
        s.count,  # row_count
        s.first,  # first_at
        s.at,  # last_at
        s.rowid,  # last_rowid
        s.cid,  # last_checkpoint_id
        s.node,  # last_node_id
        s.step,  # last_step_type
        s.status,  # last_status
        int(eid in pending),  # has_pending
        pending.get(eid),  # pending_reason
        s.fork_parent,  # fork_parent
        s.waiting,  # rows_waiting
        s.quarantined,  # rows_quarantined
        runs.run_state(s.step, s.status, eid in pending, s.reason),  # state
        "\n".join(sorted(s.args))[:MAX_TOOL_ARGS],  # tool_args
        s.reason,  # run_reason
    )


def _newest_marked(conn: sqlite3.Connection, columns: StoreColumns) -> str | None:
    """``created_at`` of the newest row the outbox marked (``synced = 1``), if any: one
    lookup in the SDK's ``(synced, created_at)`` index."""
    row = conn.execute(
        f"SELECT MAX({columns.expressions['created_at']}) FROM s.checkpoints"
        f" WHERE {columns.synced} = 1"
    ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


#: How much of the store ``read_ahead`` reads at a time.
READ_AHEAD_CHUNK = 4 << 20
#: How often ``read_ahead`` asks whether to stop.
READ_AHEAD_POLL_S = 0.1


def read_ahead(path: Path, stop: Callable[[], bool]) -> int:
    """Read the store's file once, in file order, so the kernel holds it in its cache
    for a build that reads every page of it anyway; how many bytes were read.

    The fold's columns (``created_at``, ``checkpoint_id`` …) come after the SDK's
    snapshots in each row, so the build reads every page of the table. It reads them in
    the table's order, mostly the file's (when it read them in run order, through the
    SDK's index, a cold cache made that 4 KB reads all over the file: 124-163 s at a
    million runs, a 5.2 GB file, where reading it in order takes a few seconds), but a
    table written beside others (the cache, spans) or pruned lies in pieces, which one
    read of the whole file in order brings into the cache at disk speed. ``posix_fadvise``'s
    WILLNEED would read without copying, but Linux reads only its readahead window
    (128 KB) per call. Skipped when the file would not fit in half the memory free now
    (the kernel would drop what it read first); stops when ``stop()`` says so.

    A child process (``dd``) reads it, never this one: closing a file descriptor of the
    store in this process drops every POSIX lock the process holds on it, SQLite's
    too. An agent's connection closing after that takes itself for the last one,
    deletes the write-ahead log and its ``-shm`` under this process's open
    connections, and their reads then find the store "malformed" (or a write of the
    decision record lands in a file SQLite thinks nobody else has open)."""
    try:
        size = path.stat().st_size
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
    if size > free // 2 or stop():
        return 0
    try:
        reader = subprocess.Popen(
            ["dd", f"if={path}", "of=/dev/null", f"bs={READ_AHEAD_CHUNK}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    except OSError:
        return 0  # only a warm-up: the build reads the file either way
    with reader:
        while reader.poll() is None:
            if stop():
                # SIGINT: dd says how far it got, then exits.
                reader.send_signal(signal.SIGINT)
            time.sleep(READ_AHEAD_POLL_S)
        said = reader.stderr.read().decode(errors="replace") if reader.stderr else ""
    copied = _DD_BYTES.search(said)
    return int(copied.group(1)) if copied else 0


#: How ``dd`` reports what it copied: ``5236457472 bytes (5.2 GB, 4.9 GiB) copied``.
_DD_BYTES = re.compile(r"^(\d+) bytes", re.MULTILINE)


def has_pending_table(conn: sqlite3.Connection) -> bool:
    """Whether the store has the SDK's ``pending_interrupts`` (older stores may not)."""
    return (
        conn.execute(
            "SELECT 1 FROM s.sqlite_master WHERE type = 'table' AND name = 'pending_interrupts'"
        ).fetchone()
        is not None
    )


def store_pending_count(conn: sqlite3.Connection) -> int:
    """How many pending interrupts the store holds."""
    if not has_pending_table(conn):
        return 0
    return int(conn.execute("SELECT COUNT(*) FROM s.pending_interrupts").fetchone()[0])


def store_pending(conn: sqlite3.Connection) -> dict[str, str]:
    """The store's pending interrupts: execution id -> reason."""
    if not has_pending_table(conn):
        return {}
    return {
        eid: reason or ""
        for eid, reason in conn.execute("SELECT execution_id, reason FROM s.pending_interrupts")
    }


class IndexSync:
    """One index file kept up to date with one store, on a connection of its own
    (``conn``, guarded by ``lock``) and, for a whole build of a large store, a
    thread with another."""

    def __init__(
        self,
        store_path: Path,
        *,
        columns: Callable[[], StoreColumns | None],
        index_dir: Path | None = None,
        busy_timeout: float = 10.0,
        background_from_rows: int = BACKGROUND_FROM_ROWS,
    ) -> None:
        """``columns`` says how to read the store's checkpoints, or None when it has none."""
        self.store_path = store_path.resolve()
        self.columns = columns
        self.path = schema.index_path(self.store_path, index_dir)
        self._busy_timeout = busy_timeout
        self._background_from_rows = background_from_rows
        self.lock = threading.Lock()
        self.conn = schema.connect(self.path, busy_timeout)
        self._seen_version: int | None = None
        # When (``time.monotonic_ns``) the last look that left the index up to date
        # began: whatever was committed before then is in the index.
        self._fresh_from = 0
        self._attached = ""
        self._attach()
        self.has_text_index = schema.create(self.conn)
        # The background build, when one runs; each build has a number, and the last
        # one that failed is kept with its number for whoever was waiting on it.
        self._builder: threading.Thread | None = None
        self._build_conn: sqlite3.Connection | None = None
        self._builds = itertools.count(1)
        self._build_number = 0
        self._failed: tuple[int, BaseException] | None = None
        self._progress = IndexProgress(0, 0)
        self._closing = False
        # When the store's rows were last counted in full (``_catch_up``), and whether a
        # catch-up since went without (then one is made once it is due, change or not).
        self._counted_at = float("-inf")
        # Since when (``time.monotonic``) runs have waited for the next batch into the
        # complete trigram index, if any do.
        self._text_waiting_since: float | None = None
        self._count_owed = False
        # The thread filling the trigram index after a background build, when one runs.
        self._filler: threading.Thread | None = None
        self._fill_conn: sqlite3.Connection | None = None
        if self.has_text_index and not schema.is_stale(self.conn, self._identity()):
            # A fill that an earlier process left unfinished.
            with self.lock:
                self._start_filling()

    def _identity(self) -> str:
        return schema.store_identity(self.store_path)

    def _attach(self) -> None:
        """Attach the store as it is on disk now; a replaced file is attached anew."""
        # Asked of SQLite, not remembered: an ATTACH that failed (junk where the store
        # was) leaves nothing to detach, and the next refresh must try again.
        if any(row[1] == "s" for row in self.conn.execute("PRAGMA database_list")):
            self.conn.execute("DETACH DATABASE s")
        self._attached = ""
        schema.attach_store(self.conn, self.store_path)
        self._attached = self._identity()
        self._seen_version, self._fresh_from = None, 0

    def close(self) -> None:
        """Close the index; a build running in the background is stopped first."""
        with self.lock:
            self._closing = True
            builder, build_conn = self._builder, self._build_conn
            filler, fill_conn = self._filler, self._fill_conn
        for conn in (build_conn, fill_conn):
            if conn is not None:
                conn.interrupt()
        for thread in (builder, filler):
            if thread is not None:
                thread.join()
        with self.lock:
            self.conn.close()

    # --- keeping up with the store -------------------------------------

    def refresh(self) -> bool:
        """Bring the index up to date with the store; cheap when nothing changed.

        False while the index is being built in the background: until then it holds
        what it held before (nothing, on a first start).

        A caller that waited for the lock while another brought the index up to date,
        in a look that began after this caller asked, has nothing left to do: all it
        could ask to see was committed before then. So while a store is written to
        many times a second, the requests that arrive during one catch-up share the
        next one instead of each taking their own in turn.
        """
        asked = time.monotonic_ns()
        with self.lock:
            if self._builder is not None:
                return False
            if asked < self._fresh_from:
                return True
            began = time.monotonic_ns()
            if self._identity() != self._attached:
                self._attach()
            version = int(self.conn.execute("PRAGMA s.data_version").fetchone()[0])
            if version == self._seen_version and not self._count_due():
                self._fresh_from = began
                return True
            try:
                complete = self._bring_up_to_date()
            except sqlite3.OperationalError as exc:
                if not is_undecodable_text(exc) or self.conn.text_factory is decode_text:
                    raise
                # Text that is not UTF-8 somewhere in the store: read it all through the
                # tolerant decoder (slower, so only once it is needed) and try again.
                self.conn.text_factory = decode_text
                complete = self._bring_up_to_date()
            if complete:
                self._seen_version, self._fresh_from = version, began
            return complete

    def _count_due(self) -> bool:
        """Whether a full count skipped while rows were being added is due now."""
        return self._count_owed and time.monotonic() - self._counted_at >= RECOUNT_EVERY_S

    def _bring_up_to_date(self) -> bool:
        """``refresh`` past its quick checks. Called with the lock held."""
        columns = self.columns()
        if columns is not None and schema.is_stale(self.conn, self._identity()):
            return self._build(columns)
        try:
            with transaction(self.conn) as conn:
                if columns is None:
                    schema.clear(
                        conn, has_text_index=self.has_text_index, identity=self._identity()
                    )
                    if self.has_text_index:
                        schema.fill_text_index(conn)
                elif not self._catch_up(conn, columns):
                    raise _Rebuild
                if self.has_text_index:
                    self._extend_text(conn)
            return True
        except _Rebuild:
            assert columns is not None
            return self._build(columns)

    def _build(self, columns: StoreColumns) -> bool:
        """Build the index anew: now on a small store (True), in the background on a
        large one (False). Called with the lock held."""
        rows = int(
            self.conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM s.checkpoints").fetchone()[0]
        )
        if rows < self._background_from_rows:
            with transaction(self.conn) as conn:
                self._rebuild(conn, columns, self._identity())
                if self.has_text_index:
                    schema.fill_text_index(conn)
            return True
        self._progress = IndexProgress(0, rows)
        self._build_number = next(self._builds)
        self._builder = threading.Thread(
            target=self._build_in_background,
            args=(columns, self._build_number),
            name="localui-runs-index",
            daemon=True,
        )
        self._builder.start()
        return False

    def _build_in_background(self, columns: StoreColumns, number: int) -> None:
        failure: BaseException | None = None
        try:
            conn = schema.connect(self.path, self._busy_timeout)
            try:
                with self.lock:
                    if self._closing:
                        raise _Closing
                    self._build_conn = conn
                schema.attach_store(conn, self.store_path)
                identity = self._identity()
                read_ahead(self.store_path, lambda: self._closing)
                try:
                    self._build_on(conn, columns, identity)
                except sqlite3.OperationalError as exc:
                    if not is_undecodable_text(exc):
                        raise
                    conn.text_factory = decode_text  # as in ``refresh``
                    self._build_on(conn, columns, identity)
            finally:
                conn.close()
        except Exception as exc:
            failure = exc
        with self.lock:
            self._builder = self._build_conn = None
            # The reading connection catches up from here.
            self._seen_version, self._fresh_from = None, 0
            if failure is not None and not isinstance(failure, _Closing):
                self._failed = (number, failure)
            elif failure is None and self.has_text_index:
                self._start_filling()

    # --- the trigram index, filled after a background build --------------

    def _extend_text(self, conn: sqlite3.Connection) -> None:
        """Put the runs folded in lately in the complete trigram index, once enough
        have come or they have waited long enough. Called in a catch-up's transaction."""
        if not schema.text_complete(conn):
            return  # the fill puts them in
        waiting = schema.text_waiting(conn)
        if not waiting:
            self._text_waiting_since = None
            return
        now = time.monotonic()
        if self._text_waiting_since is None:
            self._text_waiting_since = now
        if waiting >= TEXT_BATCH_RUNS or now - self._text_waiting_since >= TEXT_BATCH_EVERY_S:
            schema.extend_text_index(conn)
            self._text_waiting_since = None

    def text_complete(self) -> bool:
        """Whether text search can use the trigram index (else it scans ``runs``).
        Called with the lock held."""
        return self.has_text_index and schema.text_complete(self.conn)

    def _start_filling(self) -> None:
        """Fill the trigram index in a thread, unless it is complete or a thread of
        this process fills it already. Called with the lock held."""
        if self._filler is not None or self._closing or schema.text_complete(self.conn):
            return
        self._filler = threading.Thread(
            target=self._fill_text, name="localui-runs-text-index", daemon=True
        )
        self._filler.start()

    def _fill_text(self) -> None:
        """Steps of the fill, each its own short transaction, so that a catch-up (or
        another process filling the same index) waits for one step at most."""
        try:
            conn = schema.connect(self.path, self._busy_timeout)
        except sqlite3.Error:
            with self.lock:
                self._filler = None  # tried again on the next start
            return
        try:
            with self.lock:
                self._fill_conn = conn
            while not self._closing:
                try:
                    with transaction(conn):
                        complete = schema.fill_text_step(conn)
                except sqlite3.OperationalError as exc:
                    if is_busy(exc):
                        continue  # a build holds the file: the fill goes on after it
                    raise
                if complete:
                    with self.lock:
                        # A rebuild may have emptied it again since that step: go on.
                        if schema.text_complete(conn):
                            return
        except sqlite3.Error:
            # Interrupted by ``close``, or the file is unusable: search scans ``runs``
            # meanwhile, and the next start tries again.
            return
        finally:
            with self.lock:
                self._filler = self._fill_conn = None
            conn.close()

    def _build_on(self, conn: sqlite3.Connection, columns: StoreColumns, identity: str) -> None:
        with transaction(conn):
            # Another process may have built it while this one waited its turn.
            try:
                if schema.is_stale(conn, identity) or not self._catch_up(conn, columns):
                    raise _Rebuild
            except _Rebuild:
                self._rebuild(conn, columns, identity)

    def progress(self) -> IndexProgress | None:
        """How far a background build has got, or None when none runs."""
        with self.lock:
            return self._progress if self._builder is not None else None

    def complete(self) -> None:
        """Return once the index is complete, waiting for a background build."""
        while not self.refresh():
            with self.lock:
                builder, number = self._builder, self._build_number
            if builder is not None:
                builder.join()
            failed = self._failed
            if failed is not None and failed[0] == number:
                raise Unavailable(
                    f"the runs index for {self.store_path} could not be built: {failed[1]}"
                ) from failed[1]

    # --- folding rows in ------------------------------------------------

    def _rebuild(self, conn: sqlite3.Connection, columns: StoreColumns, identity: str) -> None:
        schema.drop_upkeep(conn)
        schema.clear(conn, has_text_index=self.has_text_index, identity=identity)
        high_water = int(
            conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM s.checkpoints").fetchone()[0]
        )
        pending = store_pending(conn)
        marked_at = _newest_marked(conn, columns)
        # In run order, so that each run is complete when the next begins and memory
        # holds one batch of runs, not the store's. Sorted by SQLite's own sorter from
        # one pass over the table in file order (NOT INDEXED), not read through the
        # SDK's index on execution_id: that visits the table's pages in random order,
        # which on a store too big for the page cache (a million runs beside their
        # spans, 16 GB) is a disk seek a row (84 s, against 13 s read and sorted). The
        # sorter keeps about 20 MB in memory and spills the rest to a temporary file.
        rows = conn.execute(
            f"SELECT {columns.select} FROM s.checkpoints NOT INDEXED WHERE rowid <= ?"
            " ORDER BY execution_id",
            (high_water,),
        )
        for folded in _fold_in_order(self._counted(rows, high_water)):
            self._insert(conn, folded, pending)
        # Every row is counted now, as by a full count.
        self._counted_at, self._count_owed = time.monotonic(), False
        conn.execute("INSERT INTO state_counts SELECT state, COUNT(*) FROM runs GROUP BY state")
        conn.execute(
            "UPDATE totals SET (rows, waiting, quarantined) = (SELECT COALESCE(SUM(row_count), 0),"
            " COALESCE(SUM(rows_waiting), 0), COALESCE(SUM(rows_quarantined), 0) FROM runs)"
        )
        for statement in schema.upkeep(self.has_text_index):
            conn.execute(statement)
        schema.set_meta(conn, high_water=high_water, identity=identity, marked_at=marked_at)

    def _counted(self, rows: Iterable[tuple[Any, ...]], total: int) -> Iterator[tuple[Any, ...]]:
        """``rows``, reporting progress (and stopping on shutdown) as they are read."""
        for n, row in enumerate(rows, 1):
            if n % _PROGRESS_EVERY == 0:
                if self._closing:
                    raise _Closing
                self._progress = IndexProgress(n, total)
            yield row
        self._progress = IndexProgress(total, total)

    def _catch_up(self, conn: sqlite3.Connection, columns: StoreColumns) -> bool:
        """Fold in what changed since the last look; False when rows were deleted,
        which only a rebuild gets right."""
        meta = schema.read_meta(conn)
        high_water = int(meta.get("high_water", "0"))
        if meta.get("tip", "") != schema.store_tip(conn, high_water):
            # The row the index last folded in is not what it was: the file was replaced
            # in place (same inode, maybe the same row count) or rows were deleted.
            return False
        # Separate statements, so each can use the SDK's own indexes.
        top = int(conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM s.checkpoints").fetchone()[0])
        added_rows = int(
            conn.execute(
                "SELECT COUNT(*) FROM s.checkpoints WHERE rowid > ? AND rowid <= ?",
                (high_water, top),
            ).fetchone()[0]
        )
        now = time.monotonic()
        # The outbox marked newer rows since the last look: a change that adds no row,
        # which a store connected to the plane has every moment. (A prune that deleted
        # marked rows moves the newest back, or away: that is counted.)
        newest_marked, marked_before = _newest_marked(conn, columns), meta.get("marked_at")
        marking = newest_marked is not None and (
            marked_before is None or newest_marked > marked_before
        )
        in_full = not (added_rows or marking) or now - self._counted_at >= RECOUNT_EVERY_S
        if not in_full:
            # Only added or marked rows since the last full count, most likely: what the
            # index held plus those added. A prune at the same moment is seen by the
            # next full count.
            total = int(conn.execute("SELECT rows FROM totals").fetchone()[0]) + added_rows
            self._count_owed = True
        else:
            total = int(conn.execute("SELECT COUNT(*) FROM s.checkpoints").fetchone()[0])
            self._counted_at, self._count_owed = now, False
        waiting = self._count_waiting(conn, columns, total)
        added = {
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT execution_id FROM s.checkpoints WHERE rowid > ? AND rowid <= ?",
                (high_water, top),
            )
        }
        self._refold(conn, columns, added, top)
        changed = added | self._pauses_changed(conn, columns, top, in_full=in_full)
        marked_at = _newest_marked(conn, columns)
        schema.set_meta(conn, high_water=top, identity=self._identity(), marked_at=marked_at)
        rows_now, waiting_now = conn.execute("SELECT rows, waiting FROM totals").fetchone()
        if rows_now != total:
            # Rows were deleted (prune, delete_execution).
            return False
        if waiting_now == waiting:
            return True
        # The outbox drain marked rows in place (synced, or quarantined: both set
        # ``synced = 1``). It drains oldest first, so the rows it marked since the last
        # look lie after the newest row marked then (one marked later with the very same
        # time is seen by the counts below).
        since = meta.get("marked_at", "")
        marked = {
            r[0]
            for r in conn.execute(
                f"SELECT DISTINCT execution_id FROM s.checkpoints WHERE {columns.synced} = 1"
                f" AND {columns.expressions['created_at']} > ? AND rowid <= ?",
                (since, top),
            )
        }
        self._refold(conn, columns, marked - changed, top)
        if conn.execute("SELECT waiting FROM totals").fetchone()[0] != waiting:
            # Rows marked out of that order (another drain, a hand-made mark): only rows
            # that were waiting can have been marked, so those runs are folded again.
            stale = {r[0] for r in conn.execute("SELECT execution_id FROM runs WHERE rows_waiting")}
            self._refold(conn, columns, stale, top)
        return True

    def _pauses_changed(
        self, conn: sqlite3.Connection, columns: StoreColumns, top: int, *, in_full: bool
    ) -> set[str]:
        """Fold again the runs whose pending row came, went or changed its reason
        (the runs that got rows are folded already); return them.

        The SDK writes a pending row only with the paused row itself, in one
        transaction (``record_interrupt``), so a pause that came is in a run that got
        rows. What else can change is a pending row deleted (a claim): then the store
        holds fewer than the index says. So the two sides, every pause each (a
        thousand or more), are compared only when those counts differ, or when the
        store is counted in full anyway (rows hand-made in the SDK's tables are seen
        then)."""
        if not in_full:
            store_count = store_pending_count(conn)
            indexed_count = conn.execute("SELECT COUNT(*) FROM runs WHERE has_pending").fetchone()
            if store_count == int(indexed_count[0]):
                return set()
        pending = store_pending(conn)
        indexed = {
            eid: reason or ""
            for eid, reason in conn.execute(
                "SELECT execution_id, pending_reason FROM runs WHERE has_pending"
            )
        }
        changed = pending.keys() ^ indexed.keys()
        changed.update(e for e in pending.keys() & indexed.keys() if pending[e] != indexed[e])
        self._refold(conn, columns, changed, top)
        return changed

    def _count_waiting(self, conn: sqlite3.Connection, columns: StoreColumns, total: int) -> int:
        """The store's rows waiting for the plane (``synced = 0``) out of ``total``.

        Each count is a range of the SDK's ``(synced, created_at)`` index, so the side
        the index last found smaller is counted: the rows waiting in a store connected
        to the plane, the few marked ones in a store nothing drains."""
        rows, waiting = conn.execute("SELECT rows, waiting FROM totals").fetchone()
        if 2 * int(waiting) < int(rows):
            query = f"SELECT COUNT(*) FROM s.checkpoints WHERE {columns.synced} = 0"
            return int(conn.execute(query).fetchone()[0])
        marked = sum(
            int(conn.execute(f"SELECT COUNT(*) FROM s.checkpoints WHERE {test}").fetchone()[0])
            for test in (
                f"{columns.synced} IS NULL",
                f"{columns.synced} < 0",
                f"{columns.synced} > 0",
            )
        )
        return total - marked

    def _refold(
        self,
        conn: sqlite3.Connection,
        columns: StoreColumns,
        execution_ids: set[str],
        top: int,
    ) -> None:
        """Summarise these runs again from their rows (up to rowid ``top``) and their
        pending rows."""
        folded: dict[str, _Summary] = {}
        pending: dict[str, str] = {}
        ids = sorted(execution_ids)
        has_pending = has_pending_table(conn) if ids else False
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            folded.update(
                fold(
                    conn.execute(
                        f"SELECT {columns.select} FROM s.checkpoints"
                        f" WHERE execution_id IN ({marks}) AND rowid <= ?",
                        (*chunk, top),
                    )
                )
            )
            if has_pending:
                pending.update(
                    (eid, reason or "")
                    for eid, reason in conn.execute(
                        "SELECT execution_id, reason FROM s.pending_interrupts"
                        f" WHERE execution_id IN ({marks})",
                        chunk,
                    )
                )
        gone = [(eid,) for eid in ids if eid not in folded]
        conn.executemany("DELETE FROM runs WHERE execution_id = ?", gone)
        rows = {eid: _run_row(eid, s, pending) for eid, s in folded.items()}
        # A run whose searched text is as it was (rows marked by the outbox, a run that
        # went on) is updated in place: deleting and inserting it again would rewrite
        # its trigrams twice, and give it a rowid the trigram fill must reach again.
        # At 1,000 marks a second that was most of a core.
        kept = self._same_text(conn, rows)
        assignments = ", ".join(f"{c} = ?" for c in schema.UPDATED_COLUMNS)
        conn.executemany(
            f"UPDATE runs SET {assignments} WHERE execution_id = ?",
            ((*(rows[eid][_UPDATED[c]] for c in schema.UPDATED_COLUMNS), eid) for eid in kept),
        )
        moved = [eid for eid in rows if eid not in kept]
        conn.executemany("DELETE FROM runs WHERE execution_id = ?", [(e,) for e in moved])
        self._insert_rows(conn, [rows[eid] for eid in moved])

    @staticmethod
    def _same_text(conn: sqlite3.Connection, rows: dict[str, tuple[Any, ...]]) -> set[str]:
        """The runs of ``rows`` the index holds with the same searched text."""
        same: set[str] = set()
        ids = list(rows)
        searched = ", ".join(schema.SEARCHED_COLUMNS)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for eid, *text in conn.execute(
                f"SELECT execution_id, {searched} FROM runs WHERE execution_id IN ({marks})",
                chunk,
            ):
                if tuple(text) == tuple(rows[eid][_UPDATED[c]] for c in schema.SEARCHED_COLUMNS):
                    same.add(eid)
        return same

    def _insert(
        self, conn: sqlite3.Connection, folded: dict[str, _Summary], pending: dict[str, str]
    ) -> None:
        # Tuples rather than a mapping per run: a build inserts 100,000 of them.
        self._insert_rows(conn, (_run_row(eid, s, pending) for eid, s in folded.items()))

    @staticmethod
    def _insert_rows(conn: sqlite3.Connection, rows: Iterable[tuple[Any, ...]]) -> None:
        marks = ",".join("?" * len(schema.RUN_COLUMNS))
        conn.executemany(f"INSERT INTO runs ({schema.COLUMNS}) VALUES ({marks})", rows)
