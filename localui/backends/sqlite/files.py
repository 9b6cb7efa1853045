"""How a SQLite file is named to SQLite, how a store is opened for reading wherever
it lies, and how its text is decoded.

Every file is named by a ``file:`` URI (so a connection can say ``mode=ro``, and the
files it attaches can be URIs too). In a URI ``?`` starts the query, ``#`` the
fragment and ``%`` an escape: the path is percent-quoted, byte for byte, so a store
named with any of them, a space or a letter outside ASCII opens as any other.

A WAL-mode store is read through its ``-shm`` file, which a reader creates when it
is missing. In a directory this process cannot write, that fails ("unable to open
database file") though the store is fine. With nothing waiting in the ``-wal``
file the main file is the whole store and can be opened ``immutable=1`` (no
locks, no ``-shm``); nothing can change it meanwhile, since any writer needs that
directory too. With changes still in the ``-wal`` file, no reader can see them
without a ``-shm``, so the error says exactly that.

SQLite lets a writer store bytes that are not UTF-8 as text; Python's sqlite3
then fails the whole query. Read through :func:`decode_text`, such a value shows
as unreadable in its own place instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from localui.errors import StoreMissing


def file_uri(path: Path, mode: str) -> str:
    """The ``file:`` URI of ``path`` (made absolute) opened in SQLite's ``mode``
    (``ro``, ``rw`` or ``rwc``)."""
    return f"file:{quote(os.fsencode(path.resolve()))}?mode={mode}"


def read_uri(path: Path) -> str:
    """A ``file:`` URI that opens ``path`` read-only, ``immutable`` where it must be."""
    resolved = path.resolve()
    base = file_uri(resolved, "ro")
    if os.access(resolved.parent, os.W_OK | os.X_OK):
        return base
    shm = resolved.with_name(resolved.name + "-shm")
    wal = resolved.with_name(resolved.name + "-wal")
    if shm.exists():
        # SQLite reads a WAL store through an existing -shm even when it cannot write it.
        return base
    if wal.exists() and wal.stat().st_size > 0:
        raise StoreMissing(
            f"the store {path} cannot be read here: its write-ahead log {wal.name} holds "
            f"changes not yet in {path.name}, and reading them needs {shm.name}, which "
            f"cannot be created in the read-only directory {resolved.parent}. Checkpoint "
            "the store where it can be written, or copy the directory somewhere writable."
        )
    return base + "&immutable=1"


#: ``PRAGMA cache_size`` (negative: KiB) for a connection that reads a few pages at a
#: time and lives as long as the server (the change feed's, the outbox's, the runs
#: index's view of the store).
SMALL_CACHE_KIB = -256

#: What a text value that is not UTF-8 starts with.
UNREADABLE_TEXT = "(unreadable: not UTF-8)"


def decode_text(raw: bytes) -> str:
    """SQLite text as ``str`` (the connections' ``text_factory``): bytes that are not
    UTF-8 read as an unreadable value, with what can be read, instead of failing the
    whole query."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"{UNREADABLE_TEXT} {raw.decode('utf-8', 'replace')[:200]}"
