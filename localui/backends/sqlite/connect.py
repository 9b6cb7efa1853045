"""The one way localui opens a SQLite file.

Every connection, to a store, a runs index, a span index or a bundle being loaded,
comes from :func:`connect`, which names the file by its quoted ``file:`` URI
(:mod:`localui.backends.sqlite.files`): where a second way of building that URI left
the path unquoted, a store whose path holds ``?`` or ``#`` had localui's own tables
made in a new file at the path cut short there. The span index (read for a
PostgreSQL store too, since the SDK traces into SQLite) and the bundle loader open
their files here as well: the import contracts keep only the PostgreSQL backend out.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal

from localui.backends.sqlite.files import file_uri, read_uri

#: SQLite's open modes: read-only, read-write, read-write and create when missing.
Mode = Literal["ro", "rw", "rwc"]


def connect(
    path: Path,
    mode: Mode,
    *,
    timeout: float = 5.0,
    isolation_level: Literal["DEFERRED", "EXCLUSIVE", "IMMEDIATE"] | None = "DEFERRED",
    check_same_thread: bool = True,
) -> sqlite3.Connection:
    """A connection to the file at ``path``; the keywords are ``sqlite3.connect``'s,
    with its defaults. Read-only opens ``immutable`` where it must
    (:func:`localui.backends.sqlite.files.read_uri`)."""
    uri = read_uri(path) if mode == "ro" else file_uri(path, mode)
    return sqlite3.connect(
        uri,
        uri=True,
        timeout=timeout,
        isolation_level=isolation_level,
        check_same_thread=check_same_thread,
    )
