"""The backends: one per kind of store, chosen once, here.

:func:`open_backend` is the only place that looks at the store string. The rest
of the app holds a :class:`~localui.backends.base.Backend` and asks it for the
store, the change source, the decision log and the SDK checkpointer.
"""

from __future__ import annotations

import sqlite3

from localui.backends.base import STATES, Backend, Store
from localui.backends.urls import is_postgres_url
from localui.settings import Settings

__all__ = ["STATES", "Backend", "Store", "is_busy", "is_postgres_url", "open_backend"]


def open_backend(settings: Settings) -> Backend:
    """The backend ``settings.store`` names, its store open; raises ``StoreMissing``
    with a one-line reason."""
    if is_postgres_url(settings.store):
        from localui.backends.postgres import PostgresBackend

        return PostgresBackend(
            settings.store, schema=settings.pg_schema, app_schema=settings.pg_app_schema
        )
    from localui.backends.sqlite import SQLiteBackend

    return SQLiteBackend(settings.store)


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
