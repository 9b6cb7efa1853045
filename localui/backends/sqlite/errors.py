"""SQLite failures told apart by their result code, never by their message text."""

from __future__ import annotations

import sqlite3

#: Another connection holds a lock this one needs: waiting may help.
_BUSY = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
#: The file cannot be opened or read from the disk.
_UNREACHABLE = frozenset({sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR})


def primary_code(exc: sqlite3.Error) -> int | None:
    """The primary result code (extended codes carry it in their low byte)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def is_busy(exc: sqlite3.Error) -> bool:
    """``SQLITE_BUSY`` or ``SQLITE_LOCKED``: another process is writing."""
    return primary_code(exc) in _BUSY


def is_unreachable(exc: sqlite3.Error) -> bool:
    """``SQLITE_CANTOPEN`` or ``SQLITE_IOERR``: the file cannot be opened or read."""
    return primary_code(exc) in _UNREACHABLE
