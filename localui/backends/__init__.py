"""The backends: one per kind of store, chosen once, here.

:func:`target_of` is the only place that reads the store string, and
:func:`open_backend` opens what it names. The rest of the app holds a
:class:`~localui.backends.base.Backend` and asks it for the store, the change
source, the decision log, the SDK checkpointer and the agents' target.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from localui.backends.base import (
    STATES,
    AuditLog,
    Backend,
    Outbox,
    SessionKeys,
    Store,
    StoreTarget,
    UserDirectory,
)
from localui.backends.urls import is_postgres_url
from localui.settings import Settings

__all__ = [
    "STATES",
    "Backend",
    "Store",
    "StoreTarget",
    "UserDirectory",
    "is_busy",
    "open_audit",
    "is_postgres_url",
    "open_backend",
    "open_outbox",
    "open_users",
    "target_of",
]


def target_of(settings: Settings) -> StoreTarget:
    """What ``settings.store`` names (a SQLite file, or a PostgreSQL schema), without
    opening it: the CLI must know before it imports the agents it serves."""
    if is_postgres_url(settings.store):
        return StoreTarget(pg_dsn=settings.store, pg_schema=settings.pg_schema)
    return StoreTarget(sqlite_path=Path(settings.store))


def open_backend(settings: Settings) -> Backend:
    """The backend ``settings.store`` names, its store open; raises ``StoreMissing``
    with a one-line reason."""
    target = target_of(settings)
    if target.pg_dsn is not None:
        from localui.backends.postgres import PostgresBackend

        return PostgresBackend(
            target.pg_dsn,
            schema=target.pg_schema,
            app_schema=settings.pg_app_schema,
            runs_index=not settings.read_only,
        )
    from localui.backends.sqlite import SQLiteBackend

    assert target.sqlite_path is not None
    return SQLiteBackend(target.sqlite_path)


def open_users(settings: Settings, *, writable: bool) -> UserDirectory:
    """The users table of the store ``settings`` names, without opening the store
    (``localui users``: a large SQLite store would start indexing for nothing). A
    server asks its backend instead (``Backend.users``)."""
    target = target_of(settings)
    if target.pg_dsn is not None:
        from localui.backends.postgres.users import PostgresUsers

        return PostgresUsers(target.pg_dsn, schema=settings.pg_app_schema, writable=writable)
    from localui.backends.sqlite.users import SQLiteUsers

    assert target.sqlite_path is not None
    return SQLiteUsers(target.sqlite_path, writable=writable)


def open_session_keys(settings: Settings, *, writable: bool) -> SessionKeys:
    """The signing keys of the store ``settings`` names, without opening the store
    (``localui keys``). A server asks its backend (``Backend.session_keys``)."""
    target = target_of(settings)
    if target.pg_dsn is not None:
        from localui.backends.postgres.keys import PostgresKeys

        return PostgresKeys(target.pg_dsn, schema=settings.pg_app_schema, writable=writable)
    from localui.backends.sqlite.keys import SQLiteKeys

    assert target.sqlite_path is not None
    return SQLiteKeys(target.sqlite_path, writable=writable)


def open_outbox(settings: Settings) -> Outbox:
    """The notifications outbox of the store ``settings`` names, without opening the
    store (``localui notifications``). A server asks its backend (``Backend.outbox``)."""
    target = target_of(settings)
    if target.pg_dsn is not None:
        from localui.backends.postgres.notifications import PostgresOutbox

        return PostgresOutbox(target.pg_dsn, schema=settings.pg_app_schema)
    from localui.backends.sqlite.notifications import SQLiteOutbox

    assert target.sqlite_path is not None
    return SQLiteOutbox(target.sqlite_path)


def open_audit(settings: Settings, *, writable: bool) -> AuditLog:
    """The audit log of the store ``settings`` names, without opening the store
    (``localui audit``, and the command line's own changes). A server asks its backend."""
    target = target_of(settings)
    if target.pg_dsn is not None:
        from localui.backends.postgres.audit import PostgresAuditLog

        return PostgresAuditLog(target.pg_dsn, schema=settings.pg_app_schema, writable=writable)
    from localui.backends.sqlite.audit import SQLiteAuditLog

    assert target.sqlite_path is not None
    return SQLiteAuditLog(target.sqlite_path, writable=writable)


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the store saying another process holds
    the lock a write needs: trying again shortly may work."""
    from localui.backends.sqlite.errors import is_busy as sqlite_busy

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlite3.Error) and sqlite_busy(current):
            return True
        current = current.__cause__ or current.__context__
    return False
