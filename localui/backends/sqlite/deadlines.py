"""The pauses' deadlines in the SQLite store file (``localui.backends.deadlines``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from localui.backends.deadlines import COLUMNS, TABLE, Deadline, deadline_from_row
from localui.backends.sqlite.connect import connect, transaction, with_retry
from localui.errors import Unavailable

T = TypeVar("T")

SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    execution_id TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    rule         TEXT NOT NULL,
    paused_at    REAL NOT NULL,
    due_at       REAL NOT NULL,
    timeout_at   REAL,
    escalated_at REAL,
    timed_out_at REAL,
    PRIMARY KEY (execution_id, checkpoint_id)
)""",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_due ON {TABLE} (due_at, execution_id)",
)
_SELECT = f"SELECT {COLUMNS} FROM {TABLE}"
_INSERT = f"INSERT OR IGNORE INTO {TABLE} ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
#: Keys per ``IN (...)`` list, well under SQLite's variable limit.
_CHUNK = 400


class SQLiteDeadlines:
    """:class:`localui.backends.base.Deadlines` in the store file. A read-only one finds
    no rows until a writable process makes the table."""

    def __init__(self, path: str | Path, *, writable: bool) -> None:
        self.path = Path(path)
        self.writable = writable
        self._lock = threading.Lock()
        try:
            self._conn = connect(
                self.path,
                "rw" if writable else "ro",
                timeout=10.0,
                check_same_thread=False,
                isolation_level=None,
            )
        except sqlite3.Error as exc:
            raise Unavailable(f"localui's deadlines in {path} cannot be opened: {exc}") from exc
        self._made = False

    def _ready(self) -> bool:
        """Whether the table is there to read (a writable log makes it, once)."""
        if self._made:
            return True
        if self.writable:
            with transaction(self._conn) as conn:
                for statement in SCHEMA:
                    conn.execute(statement)
            self._made = True
            return True
        found = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
        ).fetchone()
        self._made = found is not None
        return self._made

    def _do(self, fn: Callable[[], T], empty: T, failure: str) -> T:
        def run() -> T:
            return fn() if self._ready() else empty

        return with_retry(run, lock=self._lock, failure=failure)

    def record(self, rows: Sequence[Deadline]) -> int:
        def write() -> int:
            with transaction(self._conn) as conn:
                return sum(conn.execute(_INSERT, row.values()).rowcount for row in rows)

        return self._do(write, 0, "the pauses' deadlines cannot be recorded") if rows else 0

    def list_keys(self) -> set[tuple[str, str]]:
        def read() -> set[tuple[str, str]]:
            rows = self._conn.execute(f"SELECT execution_id, checkpoint_id FROM {TABLE}")
            return {(str(e), str(c)) for e, c in rows}

        return self._do(read, set(), "the pauses' deadlines cannot be read")

    def list_work(self, now: float, limit: int) -> tuple[Deadline, ...]:
        def read() -> tuple[Deadline, ...]:
            rows = self._conn.execute(
                f"{_SELECT} WHERE (due_at <= ? AND escalated_at IS NULL)"
                " OR (timeout_at <= ? AND timed_out_at IS NULL) ORDER BY due_at LIMIT ?",
                (now, now, limit),
            )
            return tuple(deadline_from_row(r) for r in rows)

        return self._do(read, (), "the pauses' deadlines cannot be read")

    def _mark(self, column: str, key: tuple[str, str], now: float) -> bool:
        def write() -> bool:
            with transaction(self._conn) as conn:
                cursor = conn.execute(
                    f"UPDATE {TABLE} SET {column} = ?"
                    f" WHERE execution_id = ? AND checkpoint_id = ? AND {column} IS NULL",
                    (now, *key),
                )
                return cursor.rowcount == 1

        return self._do(write, False, "the pause's deadline cannot be updated")

    def mark_escalated(self, key: tuple[str, str], now: float) -> bool:
        return self._mark("escalated_at", key, now)

    def mark_timed_out(self, key: tuple[str, str], now: float) -> bool:
        return self._mark("timed_out_at", key, now)

    def forget(self, keys: Sequence[tuple[str, str]]) -> int:
        def write() -> int:
            with transaction(self._conn) as conn:
                return sum(
                    conn.execute(
                        f"DELETE FROM {TABLE} WHERE execution_id = ? AND checkpoint_id = ?", key
                    ).rowcount
                    for key in keys
                )

        return self._do(write, 0, "the pauses' deadlines cannot be updated") if keys else 0

    def by_due(self, after: tuple[float, str] | None, limit: int) -> tuple[Deadline, ...]:
        def read() -> tuple[Deadline, ...]:
            if after is None:
                rows = self._conn.execute(
                    f"{_SELECT} ORDER BY due_at, execution_id LIMIT ?", (limit,)
                )
            else:
                rows = self._conn.execute(
                    f"{_SELECT} WHERE (due_at, execution_id) > (?, ?)"
                    " ORDER BY due_at, execution_id LIMIT ?",
                    (*after, limit),
                )
            return tuple(deadline_from_row(r) for r in rows)

        return self._do(read, (), "the pauses' deadlines cannot be read")

    def get_many(self, keys: Sequence[tuple[str, str]]) -> Mapping[tuple[str, str], Deadline]:
        def read() -> dict[tuple[str, str], Deadline]:
            found: dict[tuple[str, str], Deadline] = {}
            ids = sorted({e for e, _ in keys})
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                marks = ", ".join("?" for _ in chunk)
                for row in self._conn.execute(f"{_SELECT} WHERE execution_id IN ({marks})", chunk):
                    deadline = deadline_from_row(row)
                    found[deadline.key] = deadline
            wanted = set(keys)
            return {k: v for k, v in found.items() if k in wanted}

        return self._do(read, {}, "the pauses' deadlines cannot be read") if keys else {}

    def list_overdue(self, now: float, limit: int) -> tuple[Deadline, ...]:
        def read() -> tuple[Deadline, ...]:
            rows = self._conn.execute(
                f"{_SELECT} WHERE due_at <= ? ORDER BY due_at, execution_id LIMIT ?",
                (now, limit),
            )
            return tuple(deadline_from_row(r) for r in rows)

        return self._do(read, (), "the pauses' deadlines cannot be read")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
