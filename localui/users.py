"""The people who may use a server: ``localui_users``, a table localui owns.

Each person has a name, a role (``viewer``, ``approver``, ``operator``) and a
personal token, of which only the SHA-256 is stored. A plain, fast hash is
enough because every token is 32 bytes from ``secrets``: 256 bits of chance
leave nothing to guess or look up in a dictionary, which is what slow password
hashes (bcrypt, argon2) defend against; and a fast hash lets each script
request with a Bearer token be checked in microseconds.

The table lives beside ``localui_decisions``: in the SQLite store's own file, and
in the app schema on PostgreSQL. So the people who may act on a store travel
with it, every localui process serving one PostgreSQL database knows the same
people, and there is no other file to keep or lose. The servers only read it;
``localui users`` writes it.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import threading
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from localui.errors import BadRequest, Conflict, Unavailable
from localui.settings import ROLES, Settings

TABLE = "localui_users"
#: The longest name accepted: enough for any real name or e-mail address.
MAX_NAME = 120


def new_token() -> str:
    """A fresh personal token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_name(name: str) -> str:
    """A person's name as stored: trimmed, printable, not too long; else a 400."""
    name = name.strip()
    if not name:
        raise BadRequest("a person needs a name")
    if len(name) > MAX_NAME:
        raise BadRequest(f"a name is at most {MAX_NAME} characters")
    if any(unicodedata.category(c).startswith("C") for c in name):
        raise BadRequest("a name cannot contain control or invisible format characters")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise BadRequest(f"role {role!r} is not one of {', '.join(ROLES)}")
    return role


@dataclass(frozen=True, slots=True)
class User:
    name: str
    role: str
    #: SHA-256 of the personal token, hex; a session remembers its first characters,
    #: so a reset token ends the sessions opened with the old one.
    token_sha256: str
    created_at: str

    @property
    def token_mark(self) -> str:
        return self.token_sha256[:16]


class UserDirectory(Protocol):
    """Reads for the server; writes for ``localui users``."""

    def by_token_hash(self, digest: str) -> User | None: ...

    def by_name(self, name: str) -> User | None: ...

    def list_users(self) -> tuple[User, ...]: ...

    def add(self, name: str, role: str, digest: str) -> User:
        """A new person; :class:`Conflict` when the name is taken."""
        ...

    def set_token(self, name: str, digest: str) -> User | None:
        """A new token for a person (the old one stops working); None if no such person."""
        ...

    def remove(self, name: str) -> bool: ...

    def close(self) -> None: ...


def _now() -> str:
    return datetime.now(UTC).isoformat()


_COLUMNS = "name, role, token_sha256, created_at"


def _user(row: Any) -> User:
    return User(
        name=str(row[0]),
        role=str(row[1]),
        token_sha256=str(row[2]),
        created_at=row[3] if isinstance(row[3], str) else row[3].isoformat(),
    )


class SQLiteUsers:
    """``localui_users`` in the SQLite store file. A read-only directory (the server's)
    answers "nobody" while the table does not exist yet."""

    SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        name         TEXT PRIMARY KEY,
        role         TEXT NOT NULL,
        token_sha256 TEXT NOT NULL UNIQUE,
        created_at   TEXT NOT NULL
    )"""

    def __init__(self, path: str | Path, *, writable: bool = False) -> None:
        mode = "rw" if writable else "ro"
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(
                f"file:{Path(path).resolve()}?mode={mode}",
                uri=True,
                timeout=10.0,
                check_same_thread=False,
                isolation_level=None,
            )
            if writable:
                self._conn.execute(self.SCHEMA)
        except sqlite3.Error as exc:
            raise Unavailable(f"localui's users table in {path} cannot be opened: {exc}") from exc

    def _one(self, sql: str, params: tuple[Any, ...]) -> User | None:
        with self._lock:
            try:
                row = self._conn.execute(sql, params).fetchone()
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorname == "SQLITE_ERROR":  # no such table: nobody yet
                    return None
                raise Unavailable(f"localui's users table cannot be read: {exc}") from exc
        return _user(row) if row is not None else None

    def by_token_hash(self, digest: str) -> User | None:
        return self._one(f"SELECT {_COLUMNS} FROM {TABLE} WHERE token_sha256 = ?", (digest,))

    def by_name(self, name: str) -> User | None:
        return self._one(f"SELECT {_COLUMNS} FROM {TABLE} WHERE name = ?", (name,))

    def list_users(self) -> tuple[User, ...]:
        with self._lock:
            try:
                sql = f"SELECT {_COLUMNS} FROM {TABLE} ORDER BY name"
                rows = self._conn.execute(sql).fetchall()
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorname == "SQLITE_ERROR":
                    return ()
                raise Unavailable(f"localui's users table cannot be read: {exc}") from exc
        return tuple(_user(r) for r in rows)

    def add(self, name: str, role: str, digest: str) -> User:
        with self._lock:
            try:
                self._conn.execute(
                    f"INSERT INTO {TABLE} ({_COLUMNS}) VALUES (?, ?, ?, ?)",
                    (name, role, digest, _now()),
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"{name!r} is already a user (reset or remove them)") from exc
        added = self.by_name(name)
        assert added is not None
        return added

    def set_token(self, name: str, digest: str) -> User | None:
        with self._lock:
            self._conn.execute(
                f"UPDATE {TABLE} SET token_sha256 = ? WHERE name = ?", (digest, name)
            )
        return self.by_name(name)

    def remove(self, name: str) -> bool:
        with self._lock:
            cursor = self._conn.execute(f"DELETE FROM {TABLE} WHERE name = ?", (name,))
        return cursor.rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class PostgresUsers:
    """``{schema}.localui_users`` on PostgreSQL, in localui's own schema."""

    def __init__(self, dsn: str, *, schema: str = "localui", writable: bool = False) -> None:
        from localui.pg import Pool, identifier

        self.schema = identifier(schema, "--pg-app-schema")
        self.table = f"{self.schema}.{TABLE}"
        self._pool = Pool(
            dsn,
            name="localui-users",
            read_only=not writable,
            privileges=(
                f"localui keeps its users in {self.table}: it needs CREATE on the database or"
                f" on schema {self.schema}, or that table made for it with SELECT, INSERT,"
                " UPDATE and DELETE"
                if writable
                else f"localui reads its users with USAGE on schema {self.schema} and SELECT"
                f" on {self.table}"
            ),
        )
        if writable:
            try:
                self._create()
            except BaseException:
                self._pool.close()
                raise

    def _create(self) -> None:
        with self._pool.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
            if conn.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()[0] is not None:
                return
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
            conn.execute(
                f"""CREATE TABLE {self.table} (
                    name         TEXT PRIMARY KEY,
                    role         TEXT NOT NULL,
                    token_sha256 TEXT NOT NULL UNIQUE,
                    created_at   TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
                )"""
            )

    def _rows(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        with self._pool.connection() as conn:
            if conn.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()[0] is None:
                return []  # nobody added yet
            return list(conn.execute(sql, params).fetchall())

    def by_token_hash(self, digest: str) -> User | None:
        rows = self._rows(f"SELECT {_COLUMNS} FROM {self.table} WHERE token_sha256 = %s", (digest,))
        return _user(rows[0]) if rows else None

    def by_name(self, name: str) -> User | None:
        rows = self._rows(f"SELECT {_COLUMNS} FROM {self.table} WHERE name = %s", (name,))
        return _user(rows[0]) if rows else None

    def list_users(self) -> tuple[User, ...]:
        return tuple(_user(r) for r in self._rows(f"SELECT {_COLUMNS} FROM {self.table}", ()))

    def add(self, name: str, role: str, digest: str) -> User:
        with self._pool.connection() as conn:
            row = conn.execute(
                f"INSERT INTO {self.table} (name, role, token_sha256) VALUES (%s, %s, %s)"
                f" ON CONFLICT (name) DO NOTHING RETURNING {_COLUMNS}",
                (name, role, digest),
            ).fetchone()
        if row is None:
            raise Conflict(f"{name!r} is already a user (reset or remove them)")
        return _user(row)

    def set_token(self, name: str, digest: str) -> User | None:
        with self._pool.connection() as conn:
            row = conn.execute(
                f"UPDATE {self.table} SET token_sha256 = %s WHERE name = %s RETURNING {_COLUMNS}",
                (digest, name),
            ).fetchone()
        return _user(row) if row is not None else None

    def remove(self, name: str) -> bool:
        with self._pool.connection() as conn:
            deleted: int = conn.execute(
                f"DELETE FROM {self.table} WHERE name = %s", (name,)
            ).rowcount
        return deleted > 0

    def close(self) -> None:
        self._pool.close()


def open_users(settings: Settings, *, writable: bool = False) -> UserDirectory:
    """The users table of the store ``settings`` names (servers read; the CLI writes)."""
    from localui.pg import is_postgres_url

    if is_postgres_url(settings.store):
        return PostgresUsers(settings.store, schema=settings.pg_app_schema, writable=writable)
    return SQLiteUsers(settings.store, writable=writable)
