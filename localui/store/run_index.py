"""The runs index: one row per run, kept by the app in a file of its own.

The runs list orders runs by their newest row and counts them by state. Over
the SDK's own tables that is a scan and a sort of every checkpoint on every
request (seconds at 100,000 runs), and the app may not add indexes to the SDK's
tables. So the app keeps this summary in a SQLite file beside its cache, with
the store ATTACHed read-only, and brings it up to date before answering:

* nothing changed (``PRAGMA data_version``): nothing to do;
* rows were added: only the runs that got rows (``rowid`` above the high-water
  mark) and the runs whose pending row came or went are summarised again;
* rows were deleted (prune), marks changed in place (the outbox), or the file is
  another file now: the whole index is rebuilt.

State comes from ``localui.runs.run_state``, the one place the rules live.
Counts per state and the store totals are kept by triggers, so the first page
with its counts costs a few index lookups whatever the size of the store.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from localui import runs
from localui.errors import Unavailable
from localui.store.records import FORK_ORIGIN_NODE, RunFacts, RunFactsPage, RunQuery

#: Bump when the index's tables change: an index of another version is rebuilt.
VERSION = "2"

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
)

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
    ) -> None:
        """``columns`` says how to read the store's checkpoints, or None when it has none."""
        self.store_path = store_path.resolve()
        self._columns = columns
        name = hashlib.sha256(str(self.store_path).encode()).hexdigest()[:24]
        self.path = _writable_dir(index_dir) / f"runs-{name}.sqlite"
        self._lock = threading.Lock()
        # Opened as a URI so that the store is attached read-only (``mode=ro``) whatever
        # this SQLite build's default for URI file names.
        self._conn = sqlite3.connect(
            f"file:{quote(str(self.path))}",
            uri=True,
            timeout=busy_timeout,
            check_same_thread=False,
            isolation_level=None,
        )
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._seen_version: int | None = None
        self._attached = ""
        self._attach()
        self._create_schema()

    def _attach(self) -> None:
        """Attach the store as it is on disk now; a replaced file is attached anew."""
        if self._attached:
            self._conn.execute("DETACH DATABASE s")
        self._conn.execute(
            "ATTACH DATABASE ? AS s", (f"file:{quote(str(self.store_path))}?mode=ro",)
        )
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
            if row is None or row[0] != VERSION:
                self._conn.executescript(
                    "DROP TABLE IF EXISTS runs; DROP TABLE IF EXISTS state_counts;"
                    " DROP TABLE IF EXISTS totals; DROP TABLE IF EXISTS meta;"
                )
        self._conn.executescript(_SCHEMA)
        for statement in _UPKEEP:
            self._conn.execute(statement)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            # SQLite may have rolled back already (an I/O error does).
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        else:
            self._conn.execute("COMMIT")

    # --- keeping up with the store -------------------------------------

    def refresh(self) -> None:
        """Bring the index up to date with the store; cheap when nothing changed."""
        with self._lock:
            if self._identity() != self._attached:
                self._attach()
            version = int(self._conn.execute("PRAGMA s.data_version").fetchone()[0])
            if version == self._seen_version:
                return
            columns = self._columns()
            with self._write() as conn:
                if columns is None:
                    self._clear(conn)
                elif self._stale(conn):
                    self._rebuild(conn, columns)
                else:
                    self._catch_up(conn, columns)
            self._seen_version = version

    def _meta(self, conn: sqlite3.Connection) -> dict[str, str]:
        return {k: v for k, v in conn.execute("SELECT key, value FROM meta")}

    def _identity(self) -> str:
        try:
            st = os.stat(self.store_path)
        except FileNotFoundError as exc:
            raise Unavailable(f"the store {self.store_path} is gone: the file was deleted") from exc
        return f"{st.st_dev}:{st.st_ino}"

    def _stale(self, conn: sqlite3.Connection) -> bool:
        meta = self._meta(conn)
        return meta.get("version") != VERSION or meta.get("identity") != self._identity()

    def _clear(self, conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM runs")
        conn.execute("DELETE FROM state_counts")
        conn.execute("UPDATE totals SET rows = 0, waiting = 0, quarantined = 0")
        self._set_meta(conn, high_water=0)

    def _set_meta(self, conn: sqlite3.Connection, *, high_water: int) -> None:
        conn.executemany(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)",
            [("version", VERSION), ("identity", self._identity()), ("high_water", str(high_water))],
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

    def _rebuild(self, conn: sqlite3.Connection, columns: StoreColumns) -> None:
        for statement in _DROP_UPKEEP:
            conn.execute(statement)
        self._clear(conn)
        high_water = int(
            conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM s.checkpoints").fetchone()[0]
        )
        folded = _fold(
            conn.execute(
                f"SELECT {columns.select} FROM s.checkpoints WHERE rowid <= ?", (high_water,)
            )
        )
        self._upsert(conn, folded, self._pending(conn))
        conn.execute("INSERT INTO state_counts SELECT state, COUNT(*) FROM runs GROUP BY state")
        conn.execute(
            "UPDATE totals SET (rows, waiting, quarantined) = (SELECT COALESCE(SUM(row_count), 0),"
            " COALESCE(SUM(rows_waiting), 0), COALESCE(SUM(rows_quarantined), 0) FROM runs)"
        )
        for statement in _UPKEEP:
            conn.execute(statement)
        self._set_meta(conn, high_water=high_water)

    def _catch_up(self, conn: sqlite3.Connection, columns: StoreColumns) -> None:
        high_water = int(self._meta(conn).get("high_water", "0"))
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
            # Rows were deleted (prune, delete_execution): only a rebuild is right.
            self._rebuild(conn, columns)
        elif waiting_now != waiting:
            # The outbox drain marked rows in place (synced, or quarantined: both clear
            # ``synced = 0``), and only rows that were waiting can have been marked.
            stale = {r[0] for r in conn.execute("SELECT execution_id FROM runs WHERE rows_waiting")}
            self._refold(conn, columns, stale, pending, top)

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
        marks = ",".join("?" * 17)
        conn.executemany("DELETE FROM runs WHERE execution_id = ?", [(e,) for e in folded])
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
    def _facts(row: tuple[Any, ...]) -> RunFacts:
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

    def get_run(self, execution_id: str) -> RunFacts | None:
        self.refresh()
        with self._lock:
            row = self._conn.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE execution_id = ?", (execution_id,)
            ).fetchone()
        return self._facts(row) if row is not None else None

    def list_runs(self, query: RunQuery) -> RunFactsPage:
        self.refresh()
        where: list[str] = []
        params: list[Any] = []
        if query.agent:
            where.append("agent = ?")
            params.append(query.agent)
        if query.outbox == "waiting":
            where.append("rows_waiting > 0")
        elif query.outbox == "quarantined":
            where.append("rows_quarantined > 0")
        if query.text:
            # First, so that its ``?1`` is the first parameter (see _number).
            where.insert(
                0,
                "(execution_id LIKE ?1 ESCAPE '\\' OR agent LIKE ?1 ESCAPE '\\'"
                " OR COALESCE(pending_reason, '') LIKE ?1 ESCAPE '\\'"
                " OR tool_args LIKE ?1 ESCAPE '\\')",
            )
        with self._lock:
            if where:
                numbered, values = _number(where, params, query.text)
                counts = {
                    state: int(n)
                    for state, n in self._conn.execute(
                        f"SELECT state, COUNT(*) FROM runs WHERE {numbered} GROUP BY state", values
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
            if query.state:
                page_where.append("state = ?")
                page_params.append(query.state)
            if query.after is not None:
                page_where.append("(last_at, execution_id) < (?, ?)")
                page_params.extend(query.after)
            numbered, values = _number(page_where, page_params, query.text)
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE {numbered or '1'}"
                " ORDER BY last_at DESC, execution_id DESC LIMIT ?",
                [*values, query.limit + 1],
            ).fetchall()
        facts = tuple(self._facts(r) for r in rows[: query.limit])
        next_key = None
        if len(rows) > query.limit and facts:
            next_key = (facts[-1].last_at, facts[-1].execution_id)
        return RunFactsPage(runs=facts, next_key=next_key, counts=counts)

    def resumable_cache_before(self, cutoff: str) -> dict[str, int]:
        """Cache entries older than ``cutoff`` of runs that can still resume, per run."""
        self.refresh()
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
        self.refresh()
        with self._lock:
            rows, waiting, quarantined = self._conn.execute(
                "SELECT rows, waiting, quarantined FROM totals"
            ).fetchone()
        return int(rows), int(waiting), int(quarantined)

    def forks_of(self, execution_id: str) -> list[tuple[str, str, str, str]]:
        """``(fork id, parent checkpoint id, parent node id, fork's first row time)`` of
        the runs forked from any row of this run, oldest first."""
        self.refresh()
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


def _number(clauses: list[str], params: list[Any], text: str | None) -> tuple[str, list[Any]]:
    """Join clauses and bind the text pattern as ``?1`` once, the rest positionally.

    The text clause comes first, and SQLite numbers a bare ``?`` after the highest
    one used so far, so every other parameter follows from ``?2`` on.
    """
    sql = " AND ".join(clauses)
    if text is None:
        return sql, params
    return sql, [_like(text), *params]
