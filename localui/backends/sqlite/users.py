"""The users table in the SQLite store file (``localui.backends.users``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from localui.backends.sqlite.connect import connect
from localui.backends.users import (
    ADDED_COLUMNS,
    COLUMNS,
    GROUPS_COLUMN,
    TABLE,
    already_a_user,
    groups_text,
    select_list,
    user_from_row,
)
from localui.errors import Unavailable
from localui.records import User

T = TypeVar("T")

SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    name         TEXT PRIMARY KEY,
    role         TEXT NOT NULL,
    token_sha256 TEXT NOT NULL UNIQUE,
    created_at   TEXT NOT NULL,
    user_groups  TEXT NOT NULL DEFAULT '',
    address      TEXT NOT NULL DEFAULT '',
    away_to      TEXT NOT NULL DEFAULT '',
    away_until   TEXT NOT NULL DEFAULT ''
)"""


class SQLiteUsers:
    """:class:`localui.backends.base.UserDirectory` in ``localui_users`` of the store
    file. A read-only directory (the server's) answers "nobody" while the table does
    not exist yet, and finds it once ``localui users add`` makes it."""

    def __init__(self, path: str | Path, *, writable: bool = False) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self._conn = connect(
                self.path,
                "rw" if writable else "ro",
                timeout=10.0,
                check_same_thread=False,
                isolation_level=None,
            )
            self._conn.row_factory = sqlite3.Row
            if writable:
                self._conn.execute(SCHEMA)
                present = self._present_columns()
                for column in ADDED_COLUMNS:
                    if column not in present:
                        # Made by an older localui: the columns since come with this write.
                        self._conn.execute(
                            f"ALTER TABLE {TABLE} ADD COLUMN {column} TEXT NOT NULL DEFAULT ''"
                        )
        except sqlite3.Error as exc:
            raise Unavailable(f"localui's users table in {path} cannot be opened: {exc}") from exc
        #: Whether the table is known to exist (a writable directory makes it now).
        self._has_table = writable
        #: The SELECT list: a table an older localui made lacks the added columns until
        #: ``localui users`` next writes it.
        self._columns = COLUMNS

    def _present_columns(self) -> set[str]:
        return {r[1] for r in self._conn.execute(f"PRAGMA table_info({TABLE})")}

    def _read(self, read: Callable[[sqlite3.Connection], T], nobody: T) -> T:
        """``read`` on the connection, or ``nobody`` while there is no table yet."""
        with self._lock:
            try:
                if not self._has_table:
                    exists = self._conn.execute(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
                    ).fetchone()
                    if exists is None:
                        return nobody  # nobody added yet
                    self._has_table = True
                    self._columns = select_list(self._present_columns())
                elif self._columns != COLUMNS:
                    # Asked again until ``localui users`` has added them: an away set on
                    # a table it has just brought up to date reaches this server too.
                    self._columns = select_list(self._present_columns())
                return read(self._conn)
            except sqlite3.Error as exc:
                raise Unavailable(f"localui's users table cannot be read: {exc}") from exc

    def _one(self, where: str, params: tuple[Any, ...]) -> User | None:
        row = self._read(
            lambda conn: conn.execute(
                f"SELECT {self._columns} FROM {TABLE} WHERE {where}", params
            ).fetchone(),
            None,
        )
        return user_from_row(row) if row is not None else None

    def by_token_hash(self, digest: str) -> User | None:
        return self._one("token_sha256 = ?", (digest,))

    def by_name(self, name: str) -> User | None:
        return self._one("name = ?", (name,))

    def list_users(self) -> tuple[User, ...]:
        nobody: list[sqlite3.Row] = []
        rows = self._read(
            lambda conn: conn.execute(
                f"SELECT {self._columns} FROM {TABLE} ORDER BY name"
            ).fetchall(),
            nobody,
        )
        return tuple(user_from_row(r) for r in rows)

    def add(
        self,
        name: str,
        role: str,
        digest: str,
        groups: Sequence[str] = (),
        address: str = "",
    ) -> User:
        with self._lock:
            try:
                self._conn.execute(
                    f"INSERT INTO {TABLE} (name, role, token_sha256, created_at, {GROUPS_COLUMN},"
                    " address) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        name,
                        role,
                        digest,
                        datetime.now(UTC).isoformat(),
                        groups_text(groups),
                        address,
                    ),
                )
            except sqlite3.IntegrityError as exc:
                raise already_a_user(name) from exc
        added = self.by_name(name)
        assert added is not None
        return added

    def set_token(self, name: str, digest: str) -> User | None:
        with self._lock:
            self._conn.execute(
                f"UPDATE {TABLE} SET token_sha256 = ? WHERE name = ?", (digest, name)
            )
        return self.by_name(name)

    def set_role(self, name: str, role: str) -> User | None:
        with self._lock:
            self._conn.execute(f"UPDATE {TABLE} SET role = ? WHERE name = ?", (role, name))
        return self.by_name(name)

    def set_groups(self, name: str, groups: Sequence[str]) -> User | None:
        with self._lock:
            self._conn.execute(
                f"UPDATE {TABLE} SET {GROUPS_COLUMN} = ? WHERE name = ?",
                (groups_text(groups), name),
            )
        return self.by_name(name)

    def set_address(self, name: str, address: str) -> User | None:
        with self._lock:
            self._conn.execute(f"UPDATE {TABLE} SET address = ? WHERE name = ?", (address, name))
        return self.by_name(name)

    def set_away(self, name: str, to: str, until: str) -> User | None:
        with self._lock:
            self._conn.execute(
                f"UPDATE {TABLE} SET away_to = ?, away_until = ? WHERE name = ?", (to, until, name)
            )
        return self.by_name(name)

    def remove(self, name: str) -> bool:
        with self._lock:
            cursor = self._conn.execute(f"DELETE FROM {TABLE} WHERE name = ?", (name,))
        return cursor.rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._conn.close()
