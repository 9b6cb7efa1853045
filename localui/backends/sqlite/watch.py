"""How far the watchers have looked, in the SQLite store file (``localui.backends.watch``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import TypeVar

from localui.backends.sqlite.connect import transaction, with_retry
from localui.backends.watch import ADVANCE_SQL, COLUMNS, SWEEP, TABLE, looked_at_of

T = TypeVar("T")

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    name      TEXT PRIMARY KEY,
    looked_at REAL NOT NULL
)
"""


class SQLiteWatch:
    """``localui_watch`` on the outbox's connection, under the outbox's lock."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.Lock) -> None:
        self._conn = conn
        self._lock = lock

    def _with_retry(self, fn: Callable[[], T]) -> T:
        return with_retry(fn, lock=self._lock, failure="localui_watch cannot be used")

    def create(self) -> None:
        """The table (the caller holds the lock)."""
        self._conn.execute(SCHEMA)

    def looked_at(self) -> float | None:
        def read() -> float | None:
            row = self._conn.execute(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE name = ?", (SWEEP,)
            ).fetchone()
            return looked_at_of(row)

        return self._with_retry(read)

    def advance(self, to: float) -> None:
        def attempt() -> None:
            with transaction(self._conn) as conn:
                conn.execute(ADVANCE_SQL.format(table=TABLE, mark="?"), (SWEEP, to))

        self._with_retry(attempt)
