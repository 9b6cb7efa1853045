"""Notes on a pause in the SQLite store file (``localui.backends.notes``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from localui.backends.notes import (
    COLUMNS,
    INDEXES,
    MAX_NOTES,
    TABLE,
    Note,
    by_pause,
    note_from_values,
)
from localui.backends.sqlite.connect import connect, transaction, with_retry
from localui.errors import Unavailable

T = TypeVar("T")

SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    execution_id  TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    author        TEXT NOT NULL,
    text          TEXT NOT NULL,
    created_at    TEXT NOT NULL
)"""


class SQLiteNotes:
    """:class:`localui.backends.base.NoteLog` in ``localui_notes`` of the store file. A
    read-only log (``--read-only``, ``localui export``) reads no notes while the table
    does not exist, and makes nothing."""

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
            raise Unavailable(f"localui's notes in {path} cannot be opened: {exc}") from exc
        #: Whether the table is known to exist (a writable log makes it now).
        self._has_table = writable
        if writable:
            with_retry(self._create, lock=self._lock, failure="localui's notes cannot be made")

    def _create(self) -> None:
        with transaction(self._conn):
            self._conn.execute(SCHEMA)
            for suffix, columns in INDEXES:
                self._conn.execute(
                    f"CREATE INDEX IF NOT EXISTS {TABLE}_{suffix} ON {TABLE} ({columns})"
                )

    def add(self, execution_id: str, checkpoint_id: str, author: str, text: str) -> Note:
        def write() -> Note:
            at = datetime.now(UTC).isoformat()
            with transaction(self._conn):
                cursor = self._conn.execute(
                    f"INSERT INTO {TABLE} (execution_id, checkpoint_id, author, text, created_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (execution_id, checkpoint_id, author, text, at),
                )
            return Note(int(cursor.lastrowid or 0), execution_id, checkpoint_id, author, text, at)

        return with_retry(write, lock=self._lock, failure="the note cannot be written")

    def _read(self, read: Callable[[sqlite3.Connection], list[Any]]) -> tuple[Note, ...]:
        """The notes ``read`` finds, or none while there is no table yet."""
        with self._lock:
            try:
                if not self._has_table:
                    exists = self._conn.execute(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
                    ).fetchone()
                    if exists is None:
                        return ()
                    self._has_table = True
                return tuple(note_from_values(row) for row in read(self._conn))
            except sqlite3.Error as exc:
                raise Unavailable(f"localui's notes cannot be read: {exc}") from exc

    def for_pauses(
        self, pauses: Sequence[tuple[str, str]]
    ) -> Mapping[tuple[str, str], tuple[Note, ...]]:
        wanted = set(pauses)
        runs = sorted({execution_id for execution_id, _ in wanted})
        if not runs:
            return {}
        marks = ", ".join("?" * len(runs))
        notes = self._read(
            lambda conn: conn.execute(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE execution_id IN ({marks})"
                " ORDER BY id LIMIT ?",
                (*runs, MAX_NOTES * len(runs)),
            ).fetchall()
        )
        return {key: group for key, group in by_pause(notes).items() if key in wanted}

    def for_run(self, execution_id: str) -> tuple[Note, ...]:
        return self._read(
            lambda conn: conn.execute(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE execution_id = ? ORDER BY id LIMIT ?",
                (execution_id, MAX_NOTES),
            ).fetchall()
        )

    def written_since(self, after: tuple[str, int], limit: int) -> tuple[Note, ...]:
        at, id = after
        return self._read(
            lambda conn: conn.execute(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE created_at > ? OR (created_at = ? AND id > ?)"
                " ORDER BY created_at, id LIMIT ?",
                (at, at, id, limit),
            ).fetchall()
        )

    def close(self) -> None:
        with self._lock:
            self._conn.close()
