"""The one way localui opens a SQLite file, and writes to it beside other processes.

Every connection, to a store, a runs index, a span index or a bundle being loaded,
comes from :func:`connect`, which names the file by its quoted ``file:`` URI
(:mod:`localui.backends.sqlite.files`): where a second way of building that URI left
the path unquoted, a store whose path holds ``?`` or ``#`` had localui's own tables
made in a new file at the path cut short there. The span index (read for a
PostgreSQL store too, since the SDK traces into SQLite) and the bundle loader open
their files here as well: the import contracts keep only the PostgreSQL backend out.

:func:`transaction` and :func:`with_retry` are how localui writes its own tables in a
file that agent processes write too: the write lock taken up front, and "database is
locked" waited out for a bounded time.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TypeVar

from localui.backends.sqlite.errors import is_busy
from localui.backends.sqlite.files import file_uri, read_uri
from localui.errors import Unavailable

T = TypeVar("T")

#: SQLite's open modes: read-only, read-write, read-write and create when missing.
Mode = Literal["ro", "rw", "rwc"]
#: How long a write waits out other processes' locks before it gives up, in seconds.
RETRY_BUDGET = 10.0


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


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on a connection in autocommit mode (``isolation_level=None``).

    ``BEGIN IMMEDIATE`` takes the write lock up front, so two processes never both
    read "no row" and then race to insert it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        # SQLite may have rolled back already (an I/O error does).
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    else:
        conn.execute("COMMIT")


def with_retry(fn: Callable[[], T], *, lock: threading.Lock, failure: str) -> T:
    """``fn()`` holding ``lock``, tried again while another process holds the file's
    lock, for up to :data:`RETRY_BUDGET`; then :class:`Unavailable`: ``failure``, and why."""
    deadline = time.monotonic() + RETRY_BUDGET
    delay = 0.02
    while True:
        try:
            with lock:
                return fn()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() > deadline:
                raise Unavailable(f"{failure}: {exc}") from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
