"""The change feed's source on PostgreSQL: cheap cursors over the SDK's tables.

The SDK's tables may not be altered, so there are no triggers to NOTIFY from,
and PostgreSQL has no rowid. What there is:

- ``pg_current_snapshot()``: it changes whenever any transaction that wrote
  something starts or ends. An idle poll is one statement reading it and a
  statistics counter (below), no table; only when they move are the cursors read.
- ``created_at``, through the SDK's ``(synced, created_at)`` index: the rows
  written in the last ``window`` seconds of the newest row's time, by id. A row
  with an id not seen at the previous poll is new. The window absorbs writers
  whose clocks lag the others (a fleet's hosts) and commits that land late.
- The newest row marked synced (the SDK drains oldest first): when it moves,
  the runs whose rows were marked between are touched.
- ``pg_stat_user_tables.n_tup_del`` of ``checkpoints``: deletes (a prune) are
  not pinned to runs, so every view refreshes. The statistics reach other
  sessions when the deleting session goes idle (within seconds) or exits.
- The pending table (small: one row per paused run), the app's own decision
  record, its votes of rules that need several people and the notes on pauses,
  as the SQLite source reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from localui.backends.base import Changes
from localui.backends.changes import pause_changes
from localui.backends.decisions import TABLE, VOTES_TABLE
from localui.backends.notes import TABLE as NOTES_TABLE
from localui.backends.postgres.pool import identifier, iso, one_line, server_of, table
from localui.errors import Unavailable

#: Rows are new when unseen within this many seconds of the newest row's time.
DEFAULT_WINDOW_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class _Shape:
    """Which of the SDK's tables and columns exist, and whether the decision record does."""

    checkpoints: bool
    synced: bool
    pending: bool
    decisions: bool
    votes: bool
    notes: bool = False


@dataclass(frozen=True, slots=True)
class _Cursor:
    shape: _Shape
    #: The newest ``created_at`` among the rows.
    newest_at: datetime | None
    #: Rows written within the window before ``newest_at``: checkpoint id -> run.
    recent: Mapping[str, str]
    #: ``(created_at, checkpoint_id)`` of the newest row marked synced.
    newest_synced: tuple[datetime, str] | None
    #: Rows ever deleted from ``checkpoints``, by the server's statistics.
    deleted: int
    #: Pending interrupts: execution id -> the pause's ``created_at``.
    pending: Mapping[str, str]
    #: The decision record: ``(max id, count, newest finished_at)``.
    decisions: tuple[int, int, datetime | None]
    #: The votes of rules that need several people: ``(max id, count)``.
    votes: tuple[int, int]
    #: Notes on pauses: ``(max id, count)``.
    notes: tuple[int, int] = (0, 0)


class PostgresChangeSource:
    """A :class:`localui.backends.base.ChangeSource` over one schema of a PostgreSQL database,
    on a read-only connection of its own (reopened after the server comes back)."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "fastaiagent",
        app_schema: str = "localui",
        window: float = DEFAULT_WINDOW_SECONDS,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self._dsn = dsn
        self.server = server_of(dsn)
        self.schema = identifier(schema, "--pg-schema")
        self.app_schema = identifier(app_schema, "--pg-app-schema")
        self._checkpoints = table(self.schema, "checkpoints")
        self._pending = table(self.schema, "pending_interrupts")
        self._decisions = table(self.app_schema, TABLE)
        self._votes = table(self.app_schema, VOTES_TABLE)
        self._notes = table(self.app_schema, NOTES_TABLE)
        self._window = timedelta(seconds=window)
        #: Called with every SQL statement the source runs (tests count them).
        self._trace = trace
        self._conn: Any = None
        self._gate: str | None = None
        self._cursor: _Cursor | None = None

    # --- the connection -----------------------------------------------

    def _connection(self) -> Any:
        import psycopg

        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=3)
            conn.execute("SET TIME ZONE 'UTC'")
            conn.execute("SET statement_timeout = 5000")
            conn.execute("SET default_transaction_read_only = on")
            # A poll's cursors are read in one snapshot, so they agree with each other.
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            self._conn = conn
        return self._conn

    def _execute(self, sql: str, params: Any = ()) -> Any:
        if self._trace is not None:
            self._trace(sql)
        return self._connection().execute(sql, params)

    def _guarded(self, work: Callable[[], Any]) -> Any:
        """Run ``work``; a lost server is :class:`Unavailable`, and the next call reconnects."""
        import psycopg

        try:
            return work()
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self.close()
            raise Unavailable(
                f"PostgreSQL at {self.server} is not answering: {one_line(str(exc))}"
            ) from exc

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    # --- the protocol ---------------------------------------------------

    def reset(self) -> None:
        def work() -> None:
            self._gate = self._read_gate()
            with self._connection().transaction():
                self._cursor = self._read_cursor(None)

        self._guarded(work)

    def poll(self) -> Changes | None:
        def work() -> Changes | None:
            gate = self._read_gate()
            if self._cursor is not None and gate == self._gate:
                return None
            previous = self._cursor
            with self._connection().transaction():
                current = self._read_cursor(previous)
                changes = self._compare(previous, current) if previous is not None else None
            self._gate, self._cursor = gate, current
            return changes or None

        result: Changes | None = self._guarded(work)
        return result

    # --- reading ----------------------------------------------------------

    def _read_gate(self) -> str:
        # The deletes counter is in the gate too: the server publishes it when the
        # deleting session goes idle or ends, which may be after its commit moved
        # the snapshot (and after the poll that saw that).
        # pg_stat_get_tuples_deleted is the view pg_stat_user_tables's n_tup_del, without
        # the view's joins over the catalogs (0.2 ms, not 1 ms).
        row = self._execute(
            "SELECT pg_current_snapshot()::text, pg_stat_get_tuples_deleted(to_regclass(%s))",
            (self._checkpoints,),
        ).fetchone()
        return f"{row[0]} {row[1]}"

    def _read_shape(self) -> _Shape:
        rows = self._execute(
            "SELECT n.nspname, c.relname, a.attname, has_table_privilege(c.oid, 'SELECT')"
            " FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'synced'"
            " AND NOT a.attisdropped"
            " WHERE (n.nspname = %s AND c.relname IN ('checkpoints', 'pending_interrupts'))"
            " OR (n.nspname = %s AND c.relname IN (%s, %s, %s))",
            (self.schema, self.app_schema, TABLE, VOTES_TABLE, NOTES_TABLE),
        ).fetchall()
        found = {(r[0], r[1]) for r in rows}
        return _Shape(
            checkpoints=(self.schema, "checkpoints") in found,
            synced=any(r[1] == "checkpoints" and r[2] == "synced" for r in rows),
            pending=(self.schema, "pending_interrupts") in found,
            decisions=(self.app_schema, TABLE) in found,
            # A reader not granted the votes (they came after the decisions) still
            # follows everything else.
            votes=any(r[0] == self.app_schema and r[1] == VOTES_TABLE and r[3] for r in rows),
            notes=any(r[0] == self.app_schema and r[1] == NOTES_TABLE and r[3] for r in rows),
        )

    def _read_cursor(self, previous: _Cursor | None) -> _Cursor:
        shape = self._read_shape()
        cp = self._checkpoints
        newest_at: datetime | None = None
        recent: dict[str, str] = {}
        newest_synced: tuple[datetime, str] | None = None
        deleted = 0
        if shape.checkpoints:
            # Each half is an index lookup on (synced, created_at); the max over
            # both would be a scan.
            newest_sql = (
                f"SELECT GREATEST((SELECT max(created_at) FROM {cp} WHERE synced = false),"
                f" (SELECT max(created_at) FROM {cp} WHERE synced = true))"
                if shape.synced
                else f"SELECT max(created_at) FROM {cp}"
            )
            newest_at = self._execute(newest_sql).fetchone()[0]
            if newest_at is not None:
                since = newest_at
                if previous is not None and previous.newest_at is not None:
                    since = min(since, previous.newest_at)
                in_index = " AND synced IN (false, true)" if shape.synced else ""
                recent = {
                    str(r[0]): str(r[1])
                    for r in self._execute(
                        f"SELECT checkpoint_id, execution_id FROM {cp}"
                        f" WHERE created_at > %s{in_index}",
                        (since - self._window,),
                    )
                }
            if shape.synced:
                row = self._execute(
                    f"SELECT created_at, checkpoint_id FROM {cp} WHERE synced = true"
                    " ORDER BY created_at DESC LIMIT 1"
                ).fetchone()
                newest_synced = (row[0], str(row[1])) if row else None
            row = self._execute(
                "SELECT n_tup_del FROM pg_stat_user_tables WHERE relid = to_regclass(%s)",
                (cp,),
            ).fetchone()
            deleted = int(row[0] or 0) if row else 0
        pending: dict[str, str] = {}
        if shape.pending:
            pending = {
                str(r[0]): iso(r[1])
                for r in self._execute(f"SELECT execution_id, created_at FROM {self._pending}")
            }
        decisions: tuple[int, int, datetime | None] = (0, 0, None)
        if shape.decisions:
            row = self._execute(
                f"SELECT max(id), count(*), max(finished_at) FROM {self._decisions}"
            ).fetchone()
            decisions = (int(row[0] or 0), int(row[1] or 0), row[2])
        votes = (0, 0)
        if shape.votes:
            row = self._execute(f"SELECT max(id), count(*) FROM {self._votes}").fetchone()
            votes = (int(row[0] or 0), int(row[1] or 0))
        notes = (0, 0)
        if shape.notes:
            row = self._execute(f"SELECT max(id), count(*) FROM {self._notes}").fetchone()
            notes = (int(row[0] or 0), int(row[1] or 0))
        return _Cursor(
            shape=shape,
            newest_at=newest_at,
            recent=MappingProxyType(recent),
            newest_synced=newest_synced,
            deleted=deleted,
            pending=MappingProxyType(pending),
            decisions=decisions,
            votes=votes,
            notes=notes,
        )

    def _compare(self, before: _Cursor, now: _Cursor) -> Changes:
        if now.shape != before.shape or now.deleted != before.deleted:
            # A migration, or rows deleted (a prune): nothing to pin it to.
            return Changes(everything=True)
        runs = {run for cid, run in now.recent.items() if cid not in before.recent}
        if now.newest_synced != before.newest_synced and now.newest_synced is not None:
            since = before.newest_synced[0] if before.newest_synced else None
            sql = (
                f"SELECT DISTINCT execution_id FROM {self._checkpoints}"
                " WHERE synced = true AND created_at <= %s"
            )
            params: list[Any] = [now.newest_synced[0]]
            if since is not None:
                sql += " AND created_at >= %s"
                params.append(since)
            runs.update(str(r[0]) for r in self._execute(sql, params))
        added, removed = pause_changes(before.pending, now.pending)
        decided: set[str] = set()
        everything = False
        if now.decisions != before.decisions:
            if now.decisions[1] < before.decisions[1]:
                everything = True  # a claim released: we cannot tell whose
            else:
                sql = f"SELECT DISTINCT execution_id FROM {self._decisions} WHERE id > %s"
                params = [before.decisions[0]]
                if before.decisions[2] is not None:
                    sql += " OR finished_at > %s"
                    params.append(before.decisions[2])
                else:
                    sql += " OR finished_at IS NOT NULL"
                decided.update(str(r[0]) for r in self._execute(sql, params))
        voted: set[str] = set()
        if now.votes != before.votes:
            cast = dict(
                self._execute(
                    f"SELECT execution_id, count(*) FROM {self._votes} WHERE id > %s"
                    " GROUP BY execution_id",
                    (before.votes[0],),
                ).fetchall()
            )
            voted.update(str(e) for e in cast)
            # Fewer than counted: a vote withdrawn. More: one whose id was handed out
            # before the last poll committed after it. Either way, not pinned to a run.
            if now.votes[1] != before.votes[1] + sum(cast.values()):
                everything = True
        noted: set[str] = set()
        if now.notes != before.notes:
            written = dict(
                self._execute(
                    f"SELECT execution_id, count(*) FROM {self._notes} WHERE id > %s"
                    " GROUP BY execution_id",
                    (before.notes[0],),
                ).fetchall()
            )
            noted.update(str(e) for e in written)
            # Notes are only added: more than the new ids is one whose id was handed out
            # before the last poll committed after it, not pinned to a run.
            if now.notes[1] != before.notes[1] + sum(written.values()):
                everything = True
        return Changes(
            runs=frozenset(runs),
            pauses_added=added,
            pauses_removed=removed,
            decided=frozenset(decided),
            voted=frozenset(voted),
            noted=frozenset(noted),
            everything=everything,
        )
