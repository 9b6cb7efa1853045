"""The read model: one :class:`Store` protocol, a SQLite and a PostgreSQL store."""

from __future__ import annotations

from localui.settings import Settings
from localui.store.base import STATES, Store
from localui.store.records import RunQuery


def open_store(settings: Settings) -> Store:
    """The store ``settings.store`` names; raises ``StoreMissing`` with a one-line reason."""
    from localui.store.sqlite import SQLiteStore

    return SQLiteStore(settings.store)


__all__ = ["STATES", "RunQuery", "Store", "open_store"]
