"""The signing keys and sign-outs in the SQLite store file (``localui.backends.keys``)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from localui.backends.keys import KEYS_TABLE, SIGNOUTS_TABLE, Key, Shared, new_ring, new_secret
from localui.backends.sqlite.connect import connect, transaction, with_retry
from localui.errors import Unavailable

SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {KEYS_TABLE} (
    generation INTEGER PRIMARY KEY,
    secret     BLOB NOT NULL,
    created_at REAL NOT NULL,
    retires_at REAL,
    ring       TEXT NOT NULL
)""",
    f"""CREATE TABLE IF NOT EXISTS {SIGNOUTS_TABLE} (
    session_id TEXT PRIMARY KEY,
    ended_at   REAL NOT NULL,
    expires_at REAL NOT NULL
)""",
    f"CREATE INDEX IF NOT EXISTS {SIGNOUTS_TABLE}_ended ON {SIGNOUTS_TABLE} (ended_at)",
)
_KEYS = f"SELECT generation, secret, created_at, retires_at, ring FROM {KEYS_TABLE}"


class SQLiteKeys:
    """:class:`localui.backends.base.SessionKeys` in the store file. A read-only one
    (a ``--read-only`` server's) finds no tables until a writable process makes them."""

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
            raise Unavailable(f"localui's keys in {path} cannot be opened: {exc}") from exc
        self._made = False

    def _make(self) -> None:
        """The tables, and the first key when there is none (once per process)."""
        if self._made:
            return
        with transaction(self._conn) as conn:
            for statement in SCHEMA:
                conn.execute(statement)
            if conn.execute(f"SELECT 1 FROM {KEYS_TABLE} LIMIT 1").fetchone() is None:
                conn.execute(
                    f"INSERT INTO {KEYS_TABLE} VALUES (1, ?, ?, NULL, ?)",
                    (new_secret(), time.time(), new_ring()),
                )
        self._made = True

    def shared(self, ended_after: float) -> Shared | None:
        def read() -> Shared | None:
            if self.writable:
                self._make()
            elif not self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (KEYS_TABLE,)
            ).fetchone():
                return None
            now = time.time()
            keys = tuple(
                _key(row)
                for row in self._conn.execute(
                    f"{_KEYS} WHERE retires_at IS NULL OR retires_at > ? ORDER BY generation",
                    (now,),
                )
            )
            ended = tuple(
                (str(sid), float(at), float(until))
                for sid, at, until in self._conn.execute(
                    f"SELECT session_id, ended_at, expires_at FROM {SIGNOUTS_TABLE}"
                    " WHERE ended_at >= ? AND expires_at > ?",
                    (ended_after, now),
                )
            )
            return Shared(keys, ended) if keys else None

        return with_retry(read, lock=self._lock, failure="localui's signing keys cannot be read")

    def rotate(self, grace_seconds: float) -> tuple[Key, ...]:
        def rotate() -> tuple[Key, ...]:
            self._make()
            now = time.time()
            with transaction(self._conn) as conn:
                newest = conn.execute(
                    f"SELECT generation, ring FROM {KEYS_TABLE} ORDER BY generation DESC LIMIT 1"
                ).fetchone()
                conn.execute(
                    f"UPDATE {KEYS_TABLE} SET retires_at = ?"
                    " WHERE retires_at IS NULL OR retires_at > ?",
                    (now + grace_seconds, now + grace_seconds),
                )
                conn.execute(
                    f"INSERT INTO {KEYS_TABLE} VALUES (?, ?, ?, NULL, ?)",
                    (newest[0] + 1, new_secret(), now, newest[1]),
                )
                conn.execute(f"DELETE FROM {KEYS_TABLE} WHERE retires_at <= ?", (now,))
                rows = conn.execute(f"{_KEYS} ORDER BY generation").fetchall()
            return tuple(_key(row) for row in rows)

        return with_retry(
            rotate, lock=self._lock, failure="localui's signing keys cannot be rotated"
        )

    def end_session(self, session_id: str, expires_at: float) -> None:
        def end() -> None:
            self._make()
            now = time.time()
            with transaction(self._conn) as conn:
                conn.execute(
                    f"INSERT OR IGNORE INTO {SIGNOUTS_TABLE} VALUES (?, ?, ?)",
                    (session_id, now, expires_at),
                )
                conn.execute(f"DELETE FROM {SIGNOUTS_TABLE} WHERE expires_at <= ?", (now,))

        with_retry(end, lock=self._lock, failure="the sign-out cannot be recorded")

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _key(row: Any) -> Key:
    generation, secret, created_at, retires_at, ring = row
    return Key(
        generation=int(generation),
        secret=bytes(secret),
        created_at=float(created_at),
        retires_at=None if retires_at is None else float(retires_at),
        ring=str(ring),
    )
