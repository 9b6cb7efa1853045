"""The change feed's source on SQLite: ``PRAGMA data_version`` and cheap cursors.

``PRAGMA data_version`` changes on the source's own read-only connection
whenever another connection commits, so an idle poll is one statement that
reads no table; only when it moves are the cursors read.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from localui.backends.base import Changes
from localui.backends.changes import pause_changes
from localui.backends.decisions import TABLE, VOTES_TABLE
from localui.backends.notes import TABLE as NOTES_TABLE
from localui.backends.sqlite.connect import connect
from localui.backends.sqlite.files import SMALL_CACHE_KIB, decode_text


@dataclass(frozen=True, slots=True)
class _Cursor:
    """Where the store was at one poll: cheap positions to compare, not the data."""

    schema_version: int
    #: Newest checkpoint rowid: rows above it are new.
    max_rowid: int
    #: How many checkpoint rows there are: fewer than before plus the new ones is a delete.
    rows: int
    #: ``(created_at, rowid)`` of the newest row marked synced to the plane (the SDK
    #: drains oldest first, so this moves whenever rows sync or are quarantined).
    newest_synced: tuple[str, int] | None
    #: Pending interrupts: execution id -> the pause's ``created_at``.
    pending: Mapping[str, str]
    #: The decision record: ``(max id, count, newest finished_at)``.
    decisions: tuple[int, int, str]
    #: The votes of rules that need several people: ``(max id, count)``.
    votes: tuple[int, int]
    #: Notes on pauses: ``(max id, count)``.
    notes: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class _Tables:
    checkpoints: bool
    synced: bool
    pending: bool
    decisions: bool
    votes: bool
    notes: bool = False


class SQLiteChangeSource:
    """A :class:`~localui.backends.base.ChangeSource` over a SQLite store, on a read-only
    connection of its own.

    ``PRAGMA data_version`` changes on that connection whenever another
    connection commits, so an idle poll is one statement that reads no table.
    Only when it moves are the cursors read, each an index lookup: the newest
    rowid, the newest synced row, the (small) pending table, the decision
    record, the votes of rules that need several people, the notes on pauses, and a
    count of the
    checkpoints, which shows rows deleted (a prune by any process) at the next poll.
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
        # Closing a connection while another thread reads it crashes the process (SQLite
        # answers with a segmentation fault, not an exception). The feed serialises its
        # calls, but a task cancelled twice (anyio cancels until the task yields) can let
        # go of the feed's lock while its thread still reads: this lock is the guard.
        self._lock = threading.Lock()
        self._closed = False

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            # Used from one worker thread at a time (the feed serialises its calls).
            conn = connect(
                self.path,
                "ro",
                timeout=self._busy_timeout,
                check_same_thread=False,
                isolation_level=None,
            )
            conn.text_factory = decode_text
            conn.execute("PRAGMA query_only = 1")
            # Cheap cursors on the SDK's indexes: SQLite's default 2 MB page cache was
            # memory the server kept for a few pages read each poll.
            conn.execute(f"PRAGMA cache_size = {SMALL_CACHE_KIB}")
            conn.set_trace_callback(self._trace)
            self._conn = conn
        return self._conn

    def reset(self) -> None:
        with self._lock:
            if self._closed:
                return
            conn = self._connection()
            self._data_version = self._read_data_version(conn)
            self._cursor = self._read_cursor(conn)

    def poll(self) -> Changes | None:
        with self._lock:
            if self._closed:
                return None
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
        with self._lock:
            self._closed = True
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
            decisions=TABLE in names,
            votes=VOTES_TABLE in names,
            notes=NOTES_TABLE in names,
        )
        self._tables_version = schema_version
        return self._tables

    def _read_cursor(self, conn: sqlite3.Connection) -> _Cursor:
        schema_version = int(conn.execute("PRAGMA schema_version").fetchone()[0])
        t = self._tables_for(conn, schema_version)
        max_rowid = rows = 0
        newest_synced = None
        if t.checkpoints:
            max_rowid = int(conn.execute("SELECT max(rowid) FROM checkpoints").fetchone()[0] or 0)
            # A count over the smallest index: read only when a commit moved the store,
            # it is how a prune of old rows shows up at once.
            rows = int(conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0])
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
                f"SELECT max(id), count(*), max(finished_at) FROM {TABLE}"
            ).fetchone()
            decisions = (int(row[0] or 0), int(row[1] or 0), str(row[2] or ""))
        votes = (0, 0)
        if t.votes:
            # The votes of pauses being decided: a small table, read through its rowid.
            row = conn.execute(f"SELECT max(id), count(*) FROM {VOTES_TABLE}").fetchone()
            votes = (int(row[0] or 0), int(row[1] or 0))
        notes = (0, 0)
        if t.notes:
            row = conn.execute(f"SELECT max(id), count(*) FROM {NOTES_TABLE}").fetchone()
            notes = (int(row[0] or 0), int(row[1] or 0))
        return _Cursor(
            schema_version=schema_version,
            max_rowid=max_rowid,
            rows=rows,
            newest_synced=newest_synced,
            pending=MappingProxyType(pending),
            decisions=decisions,
            votes=votes,
            notes=notes,
        )

    def _compare(self, conn: sqlite3.Connection, before: _Cursor, now: _Cursor) -> Changes:
        if now.schema_version != before.schema_version or now.max_rowid < before.max_rowid:
            # A migration, or the newest rows deleted: nothing to pin it to.
            return Changes(everything=True)
        runs: set[str] = set()
        added = 0
        if now.max_rowid > before.max_rowid:
            new_rows = conn.execute(
                "SELECT execution_id FROM checkpoints WHERE rowid > ?", (before.max_rowid,)
            ).fetchall()
            added = len(new_rows)
            runs.update(str(r[0]) for r in new_rows)
        if now.rows < before.rows + added:
            # Rows deleted (a prune, a run deleted): not pinned to runs, every view refreshes.
            return Changes(everything=True)
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
        pauses_added, pauses_removed = pause_changes(before.pending, now.pending)
        decided: set[str] = set()
        everything = False
        if now.decisions != before.decisions:
            if now.decisions[1] < before.decisions[1]:
                everything = True  # a claim released: we cannot tell whose
            else:
                decided.update(
                    str(r[0])
                    for r in conn.execute(
                        f"SELECT DISTINCT execution_id FROM {TABLE}"
                        " WHERE id > ? OR COALESCE(finished_at, '') > ?",
                        (before.decisions[0], before.decisions[2]),
                    )
                )
        voted: set[str] = set()
        if now.votes != before.votes:
            cast = dict(
                conn.execute(
                    f"SELECT execution_id, count(*) FROM {VOTES_TABLE} WHERE id > ?"
                    " GROUP BY execution_id",
                    (before.votes[0],),
                ).fetchall()
            )
            voted.update(str(e) for e in cast)
            if now.votes[1] != before.votes[1] + sum(cast.values()):
                everything = True  # a vote withdrawn: we cannot tell whose
        noted: set[str] = set()
        if now.notes != before.notes:
            # Notes are only added: a count other than the new ones is a note written
            # beside this read that no id pins (every view refreshes).
            written = dict(
                conn.execute(
                    f"SELECT execution_id, count(*) FROM {NOTES_TABLE} WHERE id > ?"
                    " GROUP BY execution_id",
                    (before.notes[0],),
                ).fetchall()
            )
            noted.update(str(e) for e in written)
            if now.notes[1] != before.notes[1] + sum(written.values()):
                everything = True
        return Changes(
            runs=frozenset(runs),
            pauses_added=pauses_added,
            pauses_removed=pauses_removed,
            decided=frozenset(decided),
            voted=frozenset(voted),
            noted=frozenset(noted),
            everything=everything,
        )
