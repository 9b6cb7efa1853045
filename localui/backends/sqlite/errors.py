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


def is_not_a_database(exc: sqlite3.Error) -> bool:
    """``SQLITE_NOTADB``: the file is there but is not a SQLite database."""
    return primary_code(exc) == sqlite3.SQLITE_NOTADB


def cannot_open(exc: sqlite3.Error) -> bool:
    """``SQLITE_CANTOPEN``: the file, its directory or its ``-wal``/``-shm`` cannot be opened."""
    return primary_code(exc) == sqlite3.SQLITE_CANTOPEN


def is_undecodable_text(exc: sqlite3.Error) -> bool:
    """A stored text that is not UTF-8: Python's sqlite3 raises this itself while it
    converts a value, so unlike SQLite's own errors it carries no result code."""
    return isinstance(exc, sqlite3.OperationalError) and primary_code(exc) is None
