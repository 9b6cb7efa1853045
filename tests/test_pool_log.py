"""psycopg's pool lines of an outage: one per pool and outage reaches the log."""

from __future__ import annotations

import logging

from localui.backends.postgres.pool import PoolLogQuieter


def record(message: str) -> logging.LogRecord:
    return logging.LogRecord("psycopg.pool", logging.WARNING, __file__, 1, message, (), None)


def test_one_error_line_per_pool_and_outage() -> None:
    quieter = PoolLogQuieter()
    refused = "error connecting in 'localui-notifications': connection refused"
    other = "error connecting in 'localui-read': connection refused"
    passed = [quieter.filter(record(m)) for m in (refused, refused, other, refused, other)]
    assert passed == [True, False, True, False, False]
    # Dead connections dropped after a restart say nothing the outage line did not.
    assert not quieter.filter(record("discarding closed connection: <psycopg.Connection [BAD]>"))
    # Anything else psycopg says is kept.
    assert quieter.filter(record("pool 'localui-read' is closed"))
    # Once the pool has worked again, its next outage is said again.
    quieter.worked("localui-notifications")
    assert quieter.filter(record(refused))
    assert not quieter.filter(record(other))
