"""The audit log in the SQLite store file (``localui.backends.audit``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from localui.audit import GENESIS, AuditEntry, AuditEvent, AuditPage, AuditQuery, chained, instant
from localui.backends.audit import (
    COLUMNS,
    INDEXES,
    TABLE,
    WALK_BATCH,
    entry_from_values,
    entry_values,
    filters,
)
from localui.backends.sqlite.connect import connect, transaction, with_retry
from localui.errors import Unavailable

T = TypeVar("T")

SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    id           INTEGER PRIMARY KEY,
    at           TEXT NOT NULL,
    actor        TEXT NOT NULL,
    via          TEXT NOT NULL,
    address      TEXT NOT NULL,
    action       TEXT NOT NULL,
    method       TEXT NOT NULL,
    path         TEXT NOT NULL,
    execution_id TEXT,
    detail       TEXT NOT NULL,
    status       INTEGER NOT NULL,
    outcome      TEXT NOT NULL,
    prev_hash    TEXT NOT NULL,
    hash         TEXT NOT NULL
)"""


class SQLiteAuditLog:
    """:class:`localui.backends.base.AuditLog` in ``localui_audit`` of the store file.
    A read-only log (``--read-only``, ``localui audit verify``) reads an empty log
    while the table does not exist, and makes nothing."""

    def __init__(self, path: str | Path, *, writable: bool, busy_timeout: float = 10.0) -> None:
        self.path = Path(path)
        self.writable = writable
        self._lock = threading.Lock()
        try:
            self._conn = connect(
                self.path,
                "rw" if writable else "ro",
                timeout=busy_timeout,
                check_same_thread=False,
                isolation_level=None,
            )
        except sqlite3.Error as exc:
            raise Unavailable(f"localui's audit log in {path} cannot be opened: {exc}") from exc
        #: Whether the table is known to exist (a writable log makes it now).
        self._has_table = writable
        if writable:
            self._write(self._create)

    def _create(self) -> None:
        with transaction(self._conn):
            self._conn.execute(SCHEMA)
            for suffix, columns in INDEXES:
                self._conn.execute(
                    f"CREATE INDEX IF NOT EXISTS {TABLE}_{suffix} ON {TABLE} ({columns})"
                )

    def _write(self, fn: Callable[[], T]) -> T:
        return with_retry(fn, lock=self._lock, failure="the audit log cannot be written")

    def append(self, event: AuditEvent) -> AuditEntry:
        def write() -> AuditEntry:
            # The write lock comes first, so the last row read is still the last when
            # this one goes in: one chain, however many processes append.
            with transaction(self._conn):
                last = self._conn.execute(
                    f"SELECT id, hash FROM {TABLE} ORDER BY id DESC LIMIT 1"
                ).fetchone()
                id, prev = (last[0] + 1, last[1]) if last is not None else (1, GENESIS)
                entry = chained(event, id, instant(datetime.now(UTC)), prev)
                self._conn.execute(
                    f"INSERT INTO {TABLE} ({COLUMNS}) VALUES ({', '.join('?' * 14)})",
                    entry_values(entry),
                )
            return entry

        return self._write(write)

    def _read(self, read: Callable[[sqlite3.Connection], T], empty: T) -> T:
        """``read`` on the connection, or ``empty`` while there is no table yet."""
        with self._lock:
            try:
                if not self._has_table:
                    exists = self._conn.execute(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
                    ).fetchone()
                    if exists is None:
                        return empty
                    self._has_table = True
                return read(self._conn)
            except sqlite3.Error as exc:
                raise Unavailable(f"localui's audit log cannot be read: {exc}") from exc

    def list_entries(self, query: AuditQuery) -> AuditPage:
        where, params = filters(query, "?")
        none: list[tuple[Any, ...]] = []
        rows = self._read(
            lambda conn: conn.execute(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE {where} ORDER BY id DESC LIMIT ?",
                (*params, query.limit + 1),
            ).fetchall(),
            none,
        )
        entries = tuple(entry_from_values(r) for r in rows[: query.limit])
        more = len(rows) > query.limit
        return AuditPage(entries=entries, next_key=entries[-1].id if more else None)

    def _batch(self, after: int) -> list[tuple[Any, ...]]:
        none: list[tuple[Any, ...]] = []
        return self._read(
            lambda conn: conn.execute(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE id > ? ORDER BY id LIMIT ?",
                (after, WALK_BATCH),
            ).fetchall(),
            none,
        )

    def walk(self) -> Iterator[AuditEntry]:
        after = 0
        while True:
            rows = self._batch(after)
            if not rows:
                return
            yield from map(entry_from_values, rows)
            after = rows[-1][0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()
