"""localui's own PostgreSQL tables that a process makes on first use (deadlines, keys)
are committed before the process takes them as made: a request on another pooled
connection reads them at once. Before, a queue request racing the first deadline sweep
read ``localui_deadlines`` before the sweep's transaction had committed it."""

from __future__ import annotations

from conftest import pg_name

from localui.backends.postgres.deadlines import PostgresDeadlines
from localui.backends.postgres.keys import PostgresKeys


def test_the_deadlines_table_is_there_for_another_connection_once_made(pg_dsn: str) -> None:
    deadlines = PostgresDeadlines(pg_dsn, schema=pg_name("made"), writable=True)
    try:
        # The sweep's connection makes the table and goes on with its work ...
        with deadlines._pool.connection() as sweeping:
            assert deadlines._ready(sweeping)
            # ... while a request reads the queue's deadlines on the pool's other one.
            assert deadlines.list_keys() == set()
            assert deadlines.by_due(None, 10) == ()
    finally:
        deadlines.close()


def test_the_keys_are_there_for_another_connection_once_made(pg_dsn: str) -> None:
    keys = PostgresKeys(pg_dsn, schema=pg_name("made"), writable=True)
    try:
        with keys._pool.connection() as first:
            keys._make(first)
            shared = keys.shared(0.0)
            assert shared is not None and len(shared.keys) == 1
    finally:
        keys.close()
