"""The read model: one :class:`Store` protocol, a SQLite and a PostgreSQL store."""

from __future__ import annotations

from localui.pg import is_postgres_url
from localui.settings import Settings
from localui.store.base import STATES, Store
from localui.store.records import RunQuery


def open_store(settings: Settings) -> Store:
    """The store ``settings.store`` names; raises ``StoreMissing`` with a one-line reason."""
    if is_postgres_url(settings.store):
        from localui.store.postgres import PostgresStore

        return PostgresStore(
            settings.store, schema=settings.pg_schema, app_schema=settings.pg_app_schema
        )

    from localui.store.sqlite import SQLiteStore

    return SQLiteStore(settings.store)


__all__ = ["STATES", "RunQuery", "Store", "open_store"]
