"""The notifications outbox in the SQLite store file (``localui.backends.notifications``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TypeVar

from localui.backends.notifications import (
    COLUMNS,
    FAILED,
    PENDING,
    RENAME_SQL,
    SENT,
    SUMMARY_SQL,
    TABLE,
    Notice,
    Notification,
    TargetStatus,
    notification_from_row,
    shown_part,
    status_from_row,
)
from localui.backends.sqlite.connect import connect, transaction, with_retry
from localui.backends.sqlite.files import SMALL_CACHE_KIB
from localui.backends.sqlite.watch import SQLiteWatch
from localui.errors import Unavailable

T = TypeVar("T")

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    event_key    TEXT NOT NULL,
    target       TEXT NOT NULL,
    event_type   TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    payload      TEXT NOT NULL,
    created_at   REAL NOT NULL,
    state        TEXT NOT NULL DEFAULT '{PENDING}',
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_at      REAL NOT NULL,
    give_up_at   REAL NOT NULL,
    lease_until  REAL,
    last_error   TEXT,
    sent_at      REAL,
    UNIQUE (event_key, target)
)
"""
#: Event keys asked about in one statement by :meth:`SQLiteOutbox.recorded`.
RECORDED_SLICE = 500

INDEX = f"CREATE INDEX IF NOT EXISTS {TABLE}_due ON {TABLE} (state, next_at)"
#: The due rows of each target: a process claims only its own targets' rows.
TARGET_INDEX = (
    f"CREATE INDEX IF NOT EXISTS {TABLE}_due_by_target ON {TABLE} (state, target, next_at)"
)
#: The rows past their last try: those of targets no longer configured are given up on.
GIVE_UP_INDEX = f"CREATE INDEX IF NOT EXISTS {TABLE}_give_up ON {TABLE} (state, give_up_at)"


class SQLiteOutbox:
    """:class:`localui.backends.base.Outbox` in the store file, on a connection of its own.
    Every write takes SQLite's write lock first (``BEGIN IMMEDIATE``), so two processes
    never claim the same row."""

    def __init__(self, path: str | Path, *, busy_timeout: float = 10.0) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self._conn = connect(
                self.path,
                "rw",
                timeout=busy_timeout,
                check_same_thread=False,
                isolation_level=None,
            )
        except sqlite3.Error as exc:
            raise Unavailable(
                f"the notifications outbox in {path} cannot be opened: {exc}"
            ) from exc
        self._conn.row_factory = sqlite3.Row
        # Its reads are lookups in its own small table: a page cache of SQLite's
        # default 2 MB, filled by the sender's rounds, was memory the server kept.
        self._conn.execute(f"PRAGMA cache_size = {SMALL_CACHE_KIB}")
        self._watch = SQLiteWatch(self._conn, self._lock)
        self._with_retry(self._create)

    def _create(self) -> None:
        self._conn.execute(SCHEMA)
        self._conn.execute(INDEX)
        self._conn.execute(TARGET_INDEX)
        self._conn.execute(GIVE_UP_INDEX)
        self._watch.create()

    def _with_retry(self, fn: Callable[[], T]) -> T:
        return with_retry(fn, lock=self._lock, failure="the notifications outbox cannot be used")

    def record(
        self, notices: Sequence[Notice], targets: Sequence[str], *, now: float, give_up_at: float
    ) -> int:
        rows = [
            (n.event_key, t, n.event_type, n.execution_id, n.payload, now, now, give_up_at)
            for n in notices
            for t in targets
        ]
        if not rows:
            return 0

        def attempt() -> int:
            with transaction(self._conn) as conn:
                before = conn.total_changes
                conn.executemany(
                    f"INSERT INTO {TABLE} (event_key, target, event_type, execution_id,"
                    " payload, created_at, next_at, give_up_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (event_key, target) DO NOTHING",
                    rows,
                )
                return conn.total_changes - before

        return self._with_retry(attempt)

    def recorded(self, keys: Collection[str], targets: Sequence[str]) -> set[str]:
        wanted, kinds = sorted(set(keys)), sorted(set(targets))
        if not wanted or not kinds:
            return set(wanted)  # with no target, every key is recorded for all of them

        def attempt() -> set[str]:
            found: set[str] = set()
            # In slices: SQLite takes at most 32,766 parameters in one statement.
            for start in range(0, len(wanted), RECORDED_SLICE):
                part = wanted[start : start + RECORDED_SLICE]
                rows = self._conn.execute(
                    f"SELECT event_key FROM {TABLE} WHERE event_key IN"
                    f" ({', '.join('?' * len(part))}) AND target IN ({', '.join('?' * len(kinds))})"
                    " GROUP BY event_key HAVING count(DISTINCT target) = ?",
                    [*part, *kinds, len(kinds)],
                ).fetchall()
                found.update(str(r[0]) for r in rows)
            return found

        return self._with_retry(attempt)

    def claim_due(
        self, *, now: float, lease: float, limit: int, targets: Sequence[str]
    ) -> tuple[Notification, ...]:
        if not targets:
            return ()
        marks = ", ".join("?" * len(targets))

        def attempt() -> tuple[Notification, ...]:
            with transaction(self._conn) as conn:
                rows = conn.execute(
                    f"UPDATE {TABLE} SET lease_until = ? WHERE id IN ("
                    f" SELECT id FROM {TABLE} WHERE state = ? AND target IN ({marks})"
                    " AND next_at <= ? AND (lease_until IS NULL OR lease_until < ?)"
                    f" ORDER BY id LIMIT ?) RETURNING {COLUMNS}",
                    (now + lease, PENDING, *targets, now, now, limit),
                ).fetchall()
            return tuple(sorted((notification_from_row(r) for r in rows), key=lambda n: n.id))

        return self._with_retry(attempt)

    def _update(self, sql: str, params: Sequence[object], ids: Sequence[int]) -> None:
        if not ids:
            return

        def attempt() -> None:
            with transaction(self._conn) as conn:
                for start in range(0, len(ids), 500):
                    chunk = list(ids[start : start + 500])
                    marks = ", ".join("?" * len(chunk))
                    conn.execute(f"{sql} WHERE id IN ({marks})", (*params, *chunk))

        self._with_retry(attempt)

    def mark_sent(self, ids: Sequence[int], *, now: float) -> None:
        self._update(
            f"UPDATE {TABLE} SET state = ?, sent_at = ?, attempts = attempts + 1,"
            " lease_until = NULL",
            (SENT, now),
            ids,
        )

    def mark_attempt_failed(
        self, ids: Sequence[int], error: str, *, next_at: float | None, now: float
    ) -> None:
        self._update(
            f"UPDATE {TABLE} SET state = ?, next_at = ?, last_error = ?,"
            " attempts = attempts + 1, lease_until = NULL",
            (FAILED if next_at is None else PENDING, now if next_at is None else next_at, error),
            ids,
        )

    def release(self, ids: Sequence[int]) -> None:
        self._update(f"UPDATE {TABLE} SET lease_until = NULL", (), ids)

    def list_recent(self, limit: int) -> tuple[Notification, ...]:
        def read() -> tuple[Notification, ...]:
            rows = self._conn.execute(
                f"SELECT {COLUMNS} FROM {TABLE} ORDER BY id DESC LIMIT ?", (limit,)
            ).fetchall()
            return tuple(notification_from_row(r) for r in rows)

        return self._with_retry(read)

    def target_statuses(self) -> tuple[TargetStatus, ...]:
        def read() -> tuple[TargetStatus, ...]:
            rows = self._conn.execute(SUMMARY_SQL.format(table=TABLE)).fetchall()
            return tuple(status_from_row(r) for r in rows)

        return self._with_retry(read)

    def retry_failed(self, *, now: float, give_up_at: float, target: str | None = None) -> int:
        def attempt() -> int:
            with transaction(self._conn) as conn:
                cursor = conn.execute(
                    f"UPDATE {TABLE} SET state = ?, next_at = ?, give_up_at = ?, attempts = 0,"
                    " lease_until = NULL WHERE state = ? AND (? IS NULL OR target = ?)",
                    (PENDING, now, give_up_at, FAILED, target, target),
                )
                return cursor.rowcount

        return self._with_retry(attempt)

    def give_up_unconfigured(
        self, *, targets: Sequence[str], now: float, detail: str, limit: int
    ) -> int:
        if not targets:
            return 0
        marks = ", ".join("?" * len(targets))

        def attempt() -> int:
            with transaction(self._conn) as conn:
                cursor = conn.execute(
                    f"UPDATE {TABLE} SET state = ?, next_at = ?, last_error = ?,"
                    " lease_until = NULL WHERE id IN ("
                    f" SELECT id FROM {TABLE} WHERE state = ? AND give_up_at < ?"
                    f" AND target NOT IN ({marks})"
                    " AND (lease_until IS NULL OR lease_until < ?)"
                    " ORDER BY give_up_at LIMIT ?)",
                    (FAILED, now, detail, PENDING, now, *targets, now, limit),
                )
                return cursor.rowcount

        return self._with_retry(attempt)

    def looked_at(self) -> float | None:
        return self._watch.looked_at()

    def advance_looked_at(self, to: float) -> None:
        self._watch.advance(to)

    def rename_target(self, old: str, new: str) -> int:
        def attempt() -> int:
            with transaction(self._conn) as conn:
                cursor = conn.execute(
                    RENAME_SQL.format(table=TABLE, mark="?"),
                    (new, shown_part(old), shown_part(new), old, new),
                )
                return cursor.rowcount

        return self._with_retry(attempt)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
