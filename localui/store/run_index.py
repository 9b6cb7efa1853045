"""The runs index: one row per run, kept by the app in a file of its own.

The runs list orders runs by their newest row and counts them by state. Over
the SDK's own tables that is a scan and a sort of every checkpoint on every
request (seconds at 100,000 runs), and the app may not add indexes to the SDK's
tables. So the app keeps this summary in a SQLite file beside its cache, with
the store ATTACHed read-only, and brings it up to date before answering:

* nothing changed (``PRAGMA data_version``): nothing to do;
* rows were added: only the runs that got rows (``rowid`` above the high-water
  mark) and the runs whose pending row came or went are summarised again;
* rows were deleted (prune), or the file is another file now: the whole index
  is rebuilt;
* the outbox marked rows in place: the runs that had rows waiting are summarised
  again.

A whole build reads every checkpoint (about 3 s at 400,000 rows). On a store that
large it runs in a thread of its own, so the app answers at once: the runs list
shows the runs written to most recently, read straight from the store, and says
how far the indexing has got; one run's facts are read straight from its rows;
everything that needs the whole index (filters, counts, totals) waits for it.

Text search goes through an FTS5 trigram index over each run's id, agent, pause
reason and tool arguments, so a search of 3 characters or more is an index
lookup; each hit is checked with the same ``LIKE`` a shorter search scans with.

State comes from ``localui.runs.run_state``, the one place the rules live.
Counts per state and the store totals are kept by triggers, so the first page
with its counts costs a few index lookups whatever the size of the store.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from localui import runs
from localui.errors import Unavailable
from localui.store.records import (
    FORK_ORIGIN_NODE,
    IndexProgress,
    RunFacts,
    RunFactsPage,
    RunQuery,
)

#: Bump when the index's tables change: an index of another version is rebuilt.
VERSION = "3"

#: A store with at least this many checkpoint rows is indexed in the background;
#: a smaller one before the first answer (a few hundred ms at most).
BACKGROUND_FROM_ROWS = 20_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    execution_id       TEXT PRIMARY KEY,
    agent              TEXT NOT NULL,
    row_count          INTEGER NOT NULL,
    first_at           TEXT NOT NULL,
    last_at            TEXT NOT NULL,
    last_rowid         INTEGER NOT NULL,
    last_checkpoint_id TEXT NOT NULL,
    last_node_id       TEXT NOT NULL,
    last_step_type     TEXT,
    last_status        TEXT NOT NULL,
    has_pending        INTEGER NOT NULL,
    pending_reason     TEXT,
    fork_parent        TEXT,
    rows_waiting       INTEGER NOT NULL,
    rows_quarantined   INTEGER NOT NULL,
    state              TEXT NOT NULL,
    -- The tools' arguments, for the runs list's text search.
    tool_args          TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS state_counts (state TEXT PRIMARY KEY, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    rows INTEGER NOT NULL, waiting INTEGER NOT NULL, quarantined INTEGER NOT NULL
);
INSERT OR IGNORE INTO totals VALUES (1, 0, 0, 0);
"""

#: What text search looks in: one line each for the id, agent, pause reason and
#: tool arguments of run ``{r}`` (``new`` or ``old`` in a trigger, ``runs`` in a select).
_SEARCHED = (
    "{r}.execution_id || char(10) || {r}.agent || char(10)"
    " || COALESCE({r}.pending_reason, '') || char(10) || {r}.tool_args"
)

#: Contentless: the text is in ``runs`` already; only the trigrams are stored.
_TEXT_TABLE = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS run_text USING fts5(body, content='', tokenize='trigram')"
)

#: Keeps ``run_text`` in step with ``runs`` (rows of ``runs`` are only ever
#: inserted and deleted, never updated).
_TEXT_UPKEEP = (
    f"""CREATE TRIGGER IF NOT EXISTS runs_text_ins AFTER INSERT ON runs BEGIN
        INSERT INTO run_text (rowid, body) VALUES (new.rowid, {_SEARCHED.format(r="new")});
    END""",
    f"""CREATE TRIGGER IF NOT EXISTS runs_text_del AFTER DELETE ON runs BEGIN
        INSERT INTO run_text (run_text, rowid, body)
            VALUES ('delete', old.rowid, {_SEARCHED.format(r="old")});
    END""",
)

#: Indexes and the triggers that keep the counts. A rebuild drops them, loads the
#: runs, and puts them back: much faster than keeping them up row by row.
_UPKEEP = (
    "CREATE INDEX IF NOT EXISTS runs_recent ON runs (last_at DESC, execution_id DESC)",
    "CREATE INDEX IF NOT EXISTS runs_state ON runs (state, last_at DESC, execution_id DESC)",
    "CREATE INDEX IF NOT EXISTS runs_agent ON runs (agent, last_at DESC, execution_id DESC)",
    "CREATE INDEX IF NOT EXISTS runs_fork ON runs (fork_parent) WHERE fork_parent IS NOT NULL",
    """CREATE TRIGGER IF NOT EXISTS runs_ins AFTER INSERT ON runs BEGIN
        INSERT INTO state_counts VALUES (new.state, 1)
            ON CONFLICT (state) DO UPDATE SET n = n + 1;
        UPDATE totals SET rows = rows + new.row_count, waiting = waiting + new.rows_waiting,
            quarantined = quarantined + new.rows_quarantined;
    END""",
    """CREATE TRIGGER IF NOT EXISTS runs_del AFTER DELETE ON runs BEGIN
        UPDATE state_counts SET n = n - 1 WHERE state = old.state;
        UPDATE totals SET rows = rows - old.row_count, waiting = waiting - old.rows_waiting,
            quarantined = quarantined - old.rows_quarantined;
    END""",
)

_DROP_UPKEEP = (
    "DROP INDEX IF EXISTS runs_recent",
    "DROP INDEX IF EXISTS runs_state",
    "DROP INDEX IF EXISTS runs_agent",
    "DROP INDEX IF EXISTS runs_fork",
    "DROP TRIGGER IF EXISTS runs_ins",
    "DROP TRIGGER IF EXISTS runs_del",
    "DROP TRIGGER IF EXISTS runs_text_ins",
    "DROP TRIGGER IF EXISTS runs_text_del",
)

#: Above this many runs matching a text search, its page is found by walking the runs
#: newest first rather than by sorting the matches.
_FEW_MATCHES = 2000

#: Rows read between two progress reports (and checks for a shutdown) of a build.
_PROGRESS_EVERY = 8192

#: How much of a run's tool arguments the index keeps for search.
MAX_TOOL_ARGS = 4000

_COLUMNS = (
    "execution_id, agent, row_count, first_at, last_at, last_rowid, last_checkpoint_id,"
    " last_node_id, last_step_type, last_status, has_pending, pending_reason, fork_parent,"
    " rows_waiting, rows_quarantined, state, tool_args"
)


def default_index_dir() -> Path:
    """Where index files live: ``$XDG_CACHE_HOME/localui``, else ``~/.cache/localui``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "localui"


def _writable_dir(preferred: Path | None) -> Path:
    for candidate in (preferred or default_index_dir(), Path(tempfile.gettempdir()) / "localui"):
        try:
            candidate.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            return candidate
    return Path(tempfile.mkdtemp(prefix="localui-index-"))


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class _Summary:
    """One run folded from its rows, in any order."""

    __slots__ = (
        "agent",
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
    )

    def __init__(self, row: tuple[Any, ...]) -> None:
        rowid, _eid, agent, cid, node, step, status, at, parent, synced, error, args = row
        self.agent, self.cid, self.node, self.step = agent or "", cid or "", node or "", step
        self.status, self.at, self.rowid = status or "completed", at or "", rowid
        self.count, self.first = 1, at or ""
        self.fork_parent = parent if node == FORK_ORIGIN_NODE else None
        self.waiting = 1 if synced == 0 else 0
        self.quarantined = 1 if error is not None else 0
        self.args: set[str] = {args} if args else set()

    def add(self, row: tuple[Any, ...]) -> None:
        rowid, _eid, agent, cid, node, step, status, at, parent, synced, error, args = row
        at = at or ""
        self.count += 1
        # The SDK's newest row: created_at, then insertion order (get_last).
        if (at, rowid) > (self.at, self.rowid):
            self.agent, self.cid, self.node, self.step = agent or "", cid or "", node or "", step
            self.status, self.at, self.rowid = status or "completed", at, rowid
        if at < self.first:
            self.first = at
        if node == FORK_ORIGIN_NODE:
            self.fork_parent = parent
        if synced == 0:
            self.waiting += 1
        if error is not None:
            self.quarantined += 1
        if args:
            self.args.add(args)


def _facts(eid: str, s: _Summary, pending: dict[str, str]) -> RunFacts:
    return RunFacts(
        execution_id=eid,
        agent=s.agent,
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
    for row in rows:
        if row[1] == current_id and current is not None:
            current.add(row)
            continue
        if len(folded) >= batch:
            yield folded
            folded = {}
        current_id, current = row[1], _Summary(row)
        folded[current_id] = current
    if folded:
        yield folded


def _fold(rows: Iterable[tuple[Any, ...]]) -> dict[str, _Summary]:
    folded: dict[str, _Summary] = {}
    for row in rows:
        summary = folded.get(row[1])
        if summary is None:
            folded[row[1]] = _Summary(row)
        else:
            summary.add(row)
    return folded


@dataclass(frozen=True, slots=True)
class StoreColumns:
    """How to read the store's checkpoints: the select list the fold expects, in its
    order, and the outbox columns; a column an older SDK did not write reads as NULL."""

    select: str
    synced: str
    sync_error: str
    #: The column holding checkpoint ids (``id`` in stores older than ``checkpoint_id``).
    checkpoint_key: str = "checkpoint_id"


class RunIndex:
    """The summary of one store's runs, brought up to date on each read."""

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
        self._columns = columns
        name = hashlib.sha256(str(self.store_path).encode()).hexdigest()[:24]
        self.path = _writable_dir(index_dir) / f"runs-{name}.sqlite"
        self._busy_timeout = busy_timeout
        self._background_from_rows = background_from_rows
        self._lock = threading.Lock()
        self._conn = self._open()
        self._seen_version: int | None = None
        self._attached = ""
        self._attach()
        self._create_schema()
        # The background build, when one runs; each build has a number, and the last
        # one that failed is kept with its number for whoever was waiting on it.
        self._builder: threading.Thread | None = None
        self._build_conn: sqlite3.Connection | None = None
        self._builds = itertools.count(1)
        self._build_number = 0
        self._failed: tuple[int, BaseException] | None = None
        self._progress = IndexProgress(0, 0)
        self._closing = False

    def _open(self) -> sqlite3.Connection:
        # Opened as a URI so that the store is attached read-only (``mode=ro``) whatever
        # this SQLite build's default for URI file names.
        conn = sqlite3.connect(
            f"file:{quote(str(self.path))}",
            uri=True,
            timeout=self._busy_timeout,
            check_same_thread=False,
            isolation_level=None,
        )
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    @staticmethod
    def _attach_store(conn: sqlite3.Connection, store_path: Path) -> None:
        conn.execute("ATTACH DATABASE ? AS s", (f"file:{quote(str(store_path))}?mode=ro",))

    def _attach(self) -> None:
        """Attach the store as it is on disk now; a replaced file is attached anew."""
        if self._attached:
            self._conn.execute("DETACH DATABASE s")
        self._attach_store(self._conn, self.store_path)
        self._attached = self._identity()
        self._seen_version = None

    def _create_schema(self) -> None:
        """Create the tables, or start over when the file holds another version's."""
        tables = {
            r[0]
            for r in self._conn.execute("SELECT name FROM main.sqlite_master WHERE type='table'")
        }
        if "meta" in tables:
            row = self._conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
            if row is not None and row[0] == VERSION:
                # Current: opening it writes nothing (another process may be building it).
                self.has_text_index = "run_text" in tables
                return
            self._conn.executescript(
                "DROP TABLE IF EXISTS run_text; DROP TABLE IF EXISTS runs;"
                " DROP TABLE IF EXISTS state_counts; DROP TABLE IF EXISTS totals;"
                " DROP TABLE IF EXISTS meta;"
            )
        with self._write(self._conn) as conn:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            try:
                conn.execute(_TEXT_TABLE)
            except sqlite3.OperationalError:
                # A SQLite built without FTS5: text search scans the index's columns.
                self.has_text_index = False
            else:
                self.has_text_index = True
            for statement in self._upkeep():
                conn.execute(statement)
            # Marked current only once a build has filled it (see ``_stale``).
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('version', ?)", (VERSION,))

    def _upkeep(self) -> tuple[str, ...]:
        return _UPKEEP + _TEXT_UPKEEP if self.has_text_index else _UPKEEP

    def close(self) -> None:
        """Close the index; a build running in the background is stopped first."""
        with self._lock:
            self._closing = True
            builder, build_conn = self._builder, self._build_conn
        if build_conn is not None:
            build_conn.interrupt()
        if builder is not None:
            builder.join()
        with self._lock:
            self._conn.close()

    @staticmethod
    @contextmanager
    def _write(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            # SQLite may have rolled back already (an I/O error does).
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    # --- keeping up with the store -------------------------------------

    def refresh(self) -> bool:
        """Bring the index up to date with the store; cheap when nothing changed.

        False while the index is being built in the background: until then it holds
        what it held before (nothing, on a first start).
        """
        with self._lock:
            if self._builder is not None:
                return False
            if self._identity() != self._attached:
                self._attach()
            version = int(self._conn.execute("PRAGMA s.data_version").fetchone()[0])
            if version == self._seen_version:
                return True
            columns = self._columns()
            if columns is not None and self._stale(self._conn):
                complete = self._build(columns)
            else:
                try:
                    with self._write(self._conn) as conn:
                        if columns is None:
                            self._clear(conn, self._identity())
                        elif not self._catch_up(conn, columns):
                            raise _Rebuild
                    complete = True
                except _Rebuild:
                    assert columns is not None
                    complete = self._build(columns)
            if complete:
                self._seen_version = version
            return complete

    def _build(self, columns: StoreColumns) -> bool:
        """Build the index anew: now on a small store (True), in the background on a
        large one (False). Called with the lock held."""
        rows = int(
            self._conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM s.checkpoints").fetchone()[0]
        )
        if rows < self._background_from_rows:
            with self._write(self._conn) as conn:
                self._rebuild(conn, columns, self._identity())
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
            conn = self._open()
            try:
                with self._lock:
                    if self._closing:
                        raise _Closing
                    self._build_conn = conn
                self._attach_store(conn, self.store_path)
                identity = self._identity()
                with self._write(conn):
                    # Another process may have built it while this one waited its turn.
                    try:
                        if self._stale(conn, identity) or not self._catch_up(conn, columns):
                            raise _Rebuild
                    except _Rebuild:
                        self._rebuild(conn, columns, identity)
            finally:
                conn.close()
        except Exception as exc:
            failure = exc
        with self._lock:
            self._builder = self._build_conn = None
            self._seen_version = None  # the reading connection catches up from here
            if failure is not None and not isinstance(failure, _Closing):
                self._failed = (number, failure)

    def progress(self) -> IndexProgress | None:
        """How far a background build has got, or None when none runs."""
        with self._lock:
            return self._progress if self._builder is not None else None

    def _complete(self) -> None:
        """Return once the index is complete, waiting for a background build."""
        while not self.refresh():
            with self._lock:
                builder, number = self._builder, self._build_number
            if builder is not None:
                builder.join()
            failed = self._failed
            if failed is not None and failed[0] == number:
                raise Unavailable(
                    f"the runs index for {self.store_path} could not be built: {failed[1]}"
                ) from failed[1]

    def _meta(self, conn: sqlite3.Connection) -> dict[str, str]:
        return {k: v for k, v in conn.execute("SELECT key, value FROM meta")}

    def _identity(self) -> str:
        try:
            st = os.stat(self.store_path)
        except FileNotFoundError as exc:
            raise Unavailable(f"the store {self.store_path} is gone: the file was deleted") from exc
        return f"{st.st_dev}:{st.st_ino}"

    def _stale(self, conn: sqlite3.Connection, identity: str | None = None) -> bool:
        meta = self._meta(conn)
        return meta.get("version") != VERSION or meta.get("identity") != (
            identity or self._identity()
        )

    def _clear(self, conn: sqlite3.Connection, identity: str) -> None:
        conn.execute("DELETE FROM runs")
        if self.has_text_index:
            conn.execute("INSERT INTO run_text (run_text) VALUES ('delete-all')")
        conn.execute("DELETE FROM state_counts")
        conn.execute("UPDATE totals SET rows = 0, waiting = 0, quarantined = 0")
        self._set_meta(conn, high_water=0, identity=identity)

    def _set_meta(
        self, conn: sqlite3.Connection, *, high_water: int, identity: str | None = None
    ) -> None:
        conn.executemany(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)",
            [
                ("version", VERSION),
                ("identity", identity or self._identity()),
                ("high_water", str(high_water)),
                ("tip", _tip(conn, high_water)),
            ],
        )

    def _pending(self, conn: sqlite3.Connection) -> dict[str, str]:
        has_table = conn.execute(
            "SELECT 1 FROM s.sqlite_master WHERE type = 'table' AND name = 'pending_interrupts'"
        ).fetchone()
        if has_table is None:
            return {}
        return {
            eid: reason or ""
            for eid, reason in conn.execute("SELECT execution_id, reason FROM s.pending_interrupts")
        }

    def _rebuild(self, conn: sqlite3.Connection, columns: StoreColumns, identity: str) -> None:
        for statement in _DROP_UPKEEP:
            conn.execute(statement)
        self._clear(conn, identity)
        high_water = int(
            conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM s.checkpoints").fetchone()[0]
        )
        pending = self._pending(conn)
        # In run order (the SDK's index on execution_id), so that each run is complete
        # when the next begins and memory holds one batch of runs, not the store's.
        rows = conn.execute(
            f"SELECT {columns.select} FROM s.checkpoints WHERE rowid <= ? ORDER BY execution_id",
            (high_water,),
        )
        for folded in _fold_in_order(self._counted(rows, high_water)):
            self._insert(conn, folded, pending)
        if self.has_text_index:
            conn.execute(
                f"INSERT INTO run_text (rowid, body) SELECT rowid, {_SEARCHED.format(r='runs')}"
                " FROM runs"
            )
        conn.execute("INSERT INTO state_counts SELECT state, COUNT(*) FROM runs GROUP BY state")
        conn.execute(
            "UPDATE totals SET (rows, waiting, quarantined) = (SELECT COALESCE(SUM(row_count), 0),"
            " COALESCE(SUM(rows_waiting), 0), COALESCE(SUM(rows_quarantined), 0) FROM runs)"
        )
        for statement in self._upkeep():
            conn.execute(statement)
        self._set_meta(conn, high_water=high_water, identity=identity)

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
        meta = self._meta(conn)
        high_water = int(meta.get("high_water", "0"))
        if meta.get("tip", "") != _tip(conn, high_water):
            # The row the index last folded in is not what it was: the file was replaced
            # in place (same inode, maybe the same row count) or rows were deleted.
            return False
        # Separate statements, so each can use the SDK's own indexes.
        top = int(conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM s.checkpoints").fetchone()[0])
        total = int(conn.execute("SELECT COUNT(*) FROM s.checkpoints").fetchone()[0])
        waiting = int(
            conn.execute(
                f"SELECT COUNT(*) FROM s.checkpoints WHERE {columns.synced} = 0"
            ).fetchone()[0]
        )
        added = {
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT execution_id FROM s.checkpoints WHERE rowid > ? AND rowid <= ?",
                (high_water, top),
            )
        }
        pending = self._pending(conn)
        indexed = {
            eid: reason or ""
            for eid, reason in conn.execute(
                "SELECT execution_id, pending_reason FROM runs WHERE has_pending"
            )
        }
        changed = added | (pending.keys() ^ indexed.keys())
        changed.update(e for e in pending.keys() & indexed.keys() if pending[e] != indexed[e])
        self._refold(conn, columns, changed, pending, top)
        self._set_meta(conn, high_water=top)
        rows_now, waiting_now = conn.execute("SELECT rows, waiting FROM totals").fetchone()
        if rows_now != total:
            # Rows were deleted (prune, delete_execution).
            return False
        if waiting_now != waiting:
            # The outbox drain marked rows in place (synced, or quarantined: both clear
            # ``synced = 0``), and only rows that were waiting can have been marked.
            stale = {r[0] for r in conn.execute("SELECT execution_id FROM runs WHERE rows_waiting")}
            self._refold(conn, columns, stale, pending, top)
        return True

    def _refold(
        self,
        conn: sqlite3.Connection,
        columns: StoreColumns,
        execution_ids: set[str],
        pending: dict[str, str],
        top: int,
    ) -> None:
        """Summarise these runs again from their rows (up to rowid ``top``)."""
        folded: dict[str, _Summary] = {}
        ids = sorted(execution_ids)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            folded.update(
                _fold(
                    conn.execute(
                        f"SELECT {columns.select} FROM s.checkpoints"
                        f" WHERE execution_id IN ({marks}) AND rowid <= ?",
                        (*chunk, top),
                    )
                )
            )
        gone = [(eid,) for eid in ids if eid not in folded]
        conn.executemany("DELETE FROM runs WHERE execution_id = ?", gone)
        self._upsert(conn, folded, pending)

    def _upsert(
        self, conn: sqlite3.Connection, folded: dict[str, _Summary], pending: dict[str, str]
    ) -> None:
        conn.executemany("DELETE FROM runs WHERE execution_id = ?", [(e,) for e in folded])
        self._insert(conn, folded, pending)

    def _insert(
        self, conn: sqlite3.Connection, folded: dict[str, _Summary], pending: dict[str, str]
    ) -> None:
        marks = ",".join("?" * 17)
        conn.executemany(
            f"INSERT INTO runs ({_COLUMNS}) VALUES ({marks})",
            (
                (
                    eid,
                    s.agent,
                    s.count,
                    s.first,
                    s.at,
                    s.rowid,
                    s.cid,
                    s.node,
                    s.step,
                    s.status,
                    int(eid in pending),
                    pending.get(eid),
                    s.fork_parent,
                    s.waiting,
                    s.quarantined,
                    runs.run_state(s.step, s.status, eid in pending),
                    "\n".join(sorted(s.args))[:MAX_TOOL_ARGS],
                )
                for eid, s in folded.items()
            ),
        )

    # --- reading ------------------------------------------------------

    @staticmethod
    def _row_facts(row: tuple[Any, ...]) -> RunFacts:
        return RunFacts(
            execution_id=row[0],
            agent=row[1],
            row_count=int(row[2]),
            first_at=row[3],
            last_at=row[4],
            last_checkpoint_id=row[6],
            last_node_id=row[7],
            last_step_type=row[8],
            last_status=row[9],
            has_pending=bool(row[10]),
            pending_reason=row[11],
            fork_parent_checkpoint_id=row[12],
            rows_waiting=int(row[13]),
            rows_quarantined=int(row[14]),
        )

    def _from_store(self, execution_ids: Sequence[str]) -> list[RunFacts]:
        """These runs summarised straight from their rows (the SDK's index on
        ``execution_id``), for answers that cannot wait for a build; newest first."""
        columns = self._columns()
        if columns is None or not execution_ids:
            return []
        marks = ",".join("?" * len(execution_ids))
        with self._lock:
            folded = _fold(
                self._conn.execute(
                    f"SELECT {columns.select} FROM s.checkpoints WHERE execution_id IN ({marks})",
                    tuple(execution_ids),
                )
            )
            pending = {
                eid: reason for eid, reason in self._pending(self._conn).items() if eid in folded
            }
        facts = [_facts(eid, summary, pending) for eid, summary in folded.items()]
        facts.sort(key=lambda f: (f.last_at, f.execution_id), reverse=True)
        return facts

    def _recently_written(self, limit: int) -> list[str]:
        """The ``limit`` runs with the newest rows, by the order the rows were written."""
        found: dict[str, None] = {}
        with self._lock:
            cursor = self._conn.execute(
                "SELECT execution_id FROM s.checkpoints ORDER BY rowid DESC"
            )
            for (eid,) in cursor:
                found[eid] = None
                if len(found) == limit:
                    break
            cursor.close()
        return list(found)

    def get_run(self, execution_id: str) -> RunFacts | None:
        if not self.refresh():
            facts = self._from_store([execution_id])
            return facts[0] if facts else None
        with self._lock:
            row = self._conn.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE execution_id = ?", (execution_id,)
            ).fetchone()
        return self._row_facts(row) if row is not None else None

    def list_runs(self, query: RunQuery) -> RunFactsPage:
        if not self.refresh():
            progress = self.progress()
            if progress is not None and query == RunQuery(limit=query.limit):
                # The first page, unfiltered: answered now, from the store itself.
                runs = self._from_store(self._recently_written(query.limit))
                return RunFactsPage(runs=tuple(runs), next_key=None, counts={}, indexing=progress)
            self._complete()
        where: list[str] = []
        params: list[Any] = []
        by_trigrams = bool(query.text) and self.has_text_index and len(query.text or "") >= 3
        if query.text and by_trigrams:
            # A substring of 3 characters or more, case-insensitively: the trigram index
            # answers it exactly (the text has one field per line and a search for text
            # without a line break cannot match across two).
            where.append("rowid IN (SELECT rowid FROM run_text WHERE run_text MATCH ?)")
            params.append(_phrase(query.text))
        elif query.text:
            # Shorter than a trigram: a scan of the index's own columns.
            where.append(
                "(execution_id LIKE ?1 ESCAPE '\\' OR agent LIKE ?1 ESCAPE '\\'"
                " OR COALESCE(pending_reason, '') LIKE ?1 ESCAPE '\\'"
                " OR tool_args LIKE ?1 ESCAPE '\\')"
            )
            params.append(_like(query.text))
        if query.agent:
            where.append("agent = ?")
            params.append(query.agent)
        if query.outbox == "waiting":
            where.append("rows_waiting > 0")
        elif query.outbox == "quarantined":
            where.append("rows_quarantined > 0")
        with self._lock:
            if where:
                counts = {
                    state: int(n)
                    for state, n in self._conn.execute(
                        f"SELECT state, COUNT(*) FROM runs WHERE {' AND '.join(where)}"
                        " GROUP BY state",
                        params,
                    )
                }
            else:
                counts = {
                    state: int(n)
                    for state, n in self._conn.execute("SELECT state, n FROM state_counts")
                    if n
                }
            page_where = list(where)
            page_params = list(params)
            if by_trigrams and sum(counts.values()) > _FEW_MATCHES:
                # Many runs match: walking the runs newest first and checking each against
                # the matches finds a page sooner than sorting every match (``+rowid``
                # keeps SQLite from looking the matches up one by one instead).
                page_where[0] = "+" + page_where[0]
            if query.state:
                page_where.append("state = ?")
                page_params.append(query.state)
            if query.after is not None:
                page_where.append("(last_at, execution_id) < (?, ?)")
                page_params.extend(query.after)
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE {' AND '.join(page_where) or '1'}"
                " ORDER BY last_at DESC, execution_id DESC LIMIT ?",
                [*page_params, query.limit + 1],
            ).fetchall()
        facts = tuple(self._row_facts(r) for r in rows[: query.limit])
        next_key = None
        if len(rows) > query.limit and facts:
            next_key = (facts[-1].last_at, facts[-1].execution_id)
        return RunFactsPage(runs=facts, next_key=next_key, counts=counts)

    def resumable_cache_before(self, cutoff: str) -> dict[str, int]:
        """Cache entries older than ``cutoff`` of runs that can still resume, per run."""
        self._complete()
        with self._lock:
            has_cache = self._conn.execute(
                "SELECT 1 FROM s.sqlite_master WHERE type = 'table' AND name = 'idempotency_cache'"
            ).fetchone()
            if has_cache is None:
                return {}
            return {
                eid: int(n)
                for eid, n in self._conn.execute(
                    "SELECT c.execution_id, COUNT(*) FROM s.idempotency_cache c"
                    " JOIN runs r ON r.execution_id = c.execution_id"
                    " WHERE c.created_at < ? AND r.state IN ('paused', 'unfinished', 'failed')"
                    " GROUP BY c.execution_id",
                    (cutoff,),
                )
            }

    def totals(self) -> tuple[int, int, int]:
        """``(rows, rows waiting for the plane, rows quarantined)`` across the store."""
        self._complete()
        with self._lock:
            rows, waiting, quarantined = self._conn.execute(
                "SELECT rows, waiting, quarantined FROM totals"
            ).fetchone()
        return int(rows), int(waiting), int(quarantined)

    def forks_of(self, execution_id: str) -> list[tuple[str, str, str, str]]:
        """``(fork id, parent checkpoint id, parent node id, fork's first row time)`` of
        the runs forked from any row of this run, oldest first."""
        self._complete()
        columns = self._columns()
        if columns is None:
            return []
        with self._lock:
            rows = self._conn.execute(
                "SELECT r.execution_id, r.fork_parent, c.node_id, r.first_at FROM runs r"
                f" JOIN s.checkpoints c ON c.{columns.checkpoint_key} = r.fork_parent"
                " WHERE r.fork_parent IS NOT NULL AND c.execution_id = ?"
                " ORDER BY r.first_at",
                (execution_id,),
            ).fetchall()
        return [(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]


def _phrase(text: str) -> str:
    """``text`` as one FTS5 phrase: trigrams match it anywhere, whatever its characters."""
    return '"' + text.replace('"', '""') + '"'


def _tip(conn: sqlite3.Connection, rowid: int) -> str:
    """What identifies the store's row at ``rowid`` by content: its run, node and time."""
    if rowid <= 0:
        return ""
    row = conn.execute(
        "SELECT execution_id, node_id, created_at FROM s.checkpoints WHERE rowid = ?", (rowid,)
    ).fetchone()
    return "" if row is None else "|".join(str(v) for v in row)
