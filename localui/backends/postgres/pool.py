"""PostgreSQL connections, shared by the store and the decision record.

A fleet's database is reached through a small pool per purpose. Every failure
to reach the server becomes one :class:`~localui.errors.Unavailable` whose
message names the server and the cause; the pool replaces dead connections on
its own, so the app recovers when the server comes back without a restart.
Passwords never leave this module: :func:`redact` is what a person sees.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from localui.backends.urls import redact
from localui.errors import BadRequest, StoreMissing, Unavailable

#: The SDK's own rule for its ``schema=``: a plain identifier.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def identifier(name: str, what: str) -> str:
    """``name`` as PostgreSQL folds an unquoted name (the SDK splices it in unquoted),
    when it is a plain identifier; a one-line refusal otherwise. It reaches SQL only
    through ``psycopg.sql.Identifier``."""
    if not _IDENTIFIER.fullmatch(name) or len(name) > 63:
        raise StoreMissing(
            f"{what} {name!r} is not a plain PostgreSQL name (letters, digits, underscore)"
        )
    return name.lower()


def table(schema: str, name: str) -> str:
    """``schema.name`` quoted by ``psycopg.sql.Identifier``: the one way a schema name
    reaches this app's SQL."""
    from psycopg import sql

    return sql.Identifier(schema, name).as_string()


def server_of(dsn: str) -> str:
    """``host:port`` of the server a DSN names, as libpq would resolve the defaults."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        return redact(dsn)
    host = str(params.get("host") or "localhost")
    port = str(params.get("port") or "5432")
    return f"{host}:{port}"


def same_database(a: str, b: str) -> bool:
    """Whether two DSNs name one database: same host (loopback names agree), port, dbname."""
    from psycopg.conninfo import conninfo_to_dict

    loopback = {"", "localhost", "127.0.0.1", "::1"}

    def key(dsn: str) -> tuple[str, str, str]:
        params = conninfo_to_dict(dsn)
        host = str(params.get("host") or "")
        if host in loopback or host.startswith("/"):
            host = "localhost"
        user = str(params.get("user") or "")
        return host, str(params.get("port") or "5432"), str(params.get("dbname") or user)

    try:
        return key(a) == key(b)
    except Exception:
        return a == b


def one_line(text: str) -> str:
    """libpq's messages span lines (a cause, then a hint); a person reads them as one."""
    return " ".join(str(text).split())


def iso(value: Any) -> str:
    """A ``TIMESTAMPTZ`` as the SDK's SQLite store writes it: ISO 8601 in UTC."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def parse_instant(text: str) -> datetime | None:
    """An ISO timestamp from a cursor or a cutoff; None when it is not one."""
    try:
        parsed = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    if parsed.tzinfo is None:
        return None
    return parsed


#: How long the pool keeps retrying one connection before it lets the next borrow start a
#: fresh attempt (its own back-off would grow with the outage and delay recovery).
RECONNECT_TIMEOUT = 2.0
#: How long after an outage a borrow also waits out a reconnect attempt's back-off.
REFILL_WINDOW = 10.0


class PoolLogQuieter(logging.Filter):
    """psycopg's pool logs each failed reconnect attempt and each dead connection it
    drops: during an outage, a line a second per pool. localui says the outage itself
    ("not answering", then "can be read again"), so of psycopg's lines one per pool
    and outage is kept: the first "error connecting", with its cause. The next is let
    through once that pool has worked again (:meth:`worked`), or after
    :data:`QUIET_FOR` seconds, so a long outage is still said now and then."""

    def __init__(self) -> None:
        super().__init__("psycopg.pool")
        self._said: dict[str, float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("discarding closed connection"):
            return False
        match = _POOL_NAMED.match(message)
        if match is None:
            return True
        name, now = match.group(1), time.monotonic()
        with self._lock:
            said = self._said.get(name)
            if said is not None and now - said < QUIET_FOR:
                return False
            self._said[name] = now
        return True

    def worked(self, name: str) -> None:
        with self._lock:
            self._said.pop(name, None)


#: How long psycopg's pool lines of one outage stay quiet after the first.
QUIET_FOR = 300.0
_POOL_NAMED = re.compile(r"error connecting in '([^']*)'")
#: The one filter on psycopg's pool logger, shared by every pool of the process.
QUIETER = PoolLogQuieter()
logging.getLogger("psycopg.pool").addFilter(QUIETER)


class StaleConnection(Unavailable):
    """A pooled connection was dead (the server restarted) though the server answers:
    the same work on a fresh connection may well succeed."""


class Pool:
    """A small ``psycopg_pool.ConnectionPool`` that says what went wrong in one line.

    ``read_only`` connections run every statement ``READ ONLY`` (autocommit, so a
    single read costs one round trip; group reads with ``conn.transaction()``). Each
    connection works in UTC (so timestamps read back in the SDK's SQLite shape)
    under a statement timeout. Opening checks the server once, directly, so a
    server that cannot be reached at start-up is a one-line :class:`StoreMissing`
    rather than a pool retrying in the background; ``probe=False`` skips that for a
    second pool on a server the caller has just reached (a connection less on the
    way to a first page).
    """

    def __init__(
        self,
        dsn: str,
        *,
        name: str,
        read_only: bool,
        statement_timeout: float = 5.0,
        connect_timeout: float = 3.0,
        wait_timeout: float = 2.0,
        max_size: int = 4,
        privileges: str = "",
        check_on_borrow: bool = True,
        probe: bool = True,
    ) -> None:
        from psycopg.conninfo import conninfo_to_dict
        from psycopg_pool import ConnectionPool

        self.server = server_of(dsn)
        self._name = name
        self._dsn = dsn
        self._read_only = read_only
        self._statement_timeout_ms = int(statement_timeout * 1000)
        self._wait_timeout = wait_timeout
        #: What to grant when the server refuses: said with a permission error.
        self._privileges = privileges
        self._kwargs: dict[str, Any] = {}
        #: Set when the server stopped answering; cleared when it answers again.
        self._down = False
        #: When (monotonic seconds) the server answered again after an outage.
        self._back_at: float | None = None
        try:
            params = conninfo_to_dict(dsn)
        except Exception as exc:
            raise StoreMissing(
                f"{redact(dsn)} is not a PostgreSQL URL libpq accepts: {one_line(str(exc))}"
            ) from exc
        if "connect_timeout" not in params:
            self._kwargs["connect_timeout"] = max(2, int(connect_timeout))
        if probe:
            self.probe()
        self._pool: Any = ConnectionPool(
            dsn,
            kwargs=self._kwargs,
            min_size=1,
            max_size=max_size,
            name=name,
            open=False,
            configure=self._configure,
            # A connection that died while idle (a server restart) is noticed and
            # replaced when borrowed, at one round trip per borrow. Without it the
            # caller retries on StaleConnection instead (reads, which may repeat).
            check=ConnectionPool.check_connection if check_on_borrow else None,
            timeout=wait_timeout,
            # Back off briefly, then let the next request start a fresh attempt:
            # the pool's own backoff would grow with the outage and delay recovery.
            reconnect_timeout=RECONNECT_TIMEOUT,
        )
        self._pool.open(wait=False)

    def _configure(self, conn: Any) -> None:
        conn.autocommit = True
        conn.execute("SET TIME ZONE 'UTC'")
        conn.execute(f"SET statement_timeout = {self._statement_timeout_ms}")
        if self._read_only:
            # Every statement is then a READ ONLY transaction of its own, enforced by
            # the server, at one round trip; several that must agree share one
            # (``with conn.transaction()``), read-only all the same.
            conn.execute("SET default_transaction_read_only = on")
            conn.read_only = True
        else:
            conn.autocommit = False

    def probe(self) -> None:
        """Connect once, directly; a one-line :class:`StoreMissing` when that fails."""
        cause = self._cause()
        if cause is not None:
            raise StoreMissing(self.not_answering(cause))

    def not_answering(self, cause: BaseException | str) -> str:
        return f"PostgreSQL at {self.server} is not answering: {one_line(str(cause))}"

    def _cause(self) -> str | None:
        """Why the server cannot be reached, asked of it directly; None when it answers."""
        import psycopg

        try:
            psycopg.connect(self._dsn, **self._kwargs).close()
        except psycopg.Error as exc:
            return one_line(str(exc))
        return None

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A pooled connection; a read-write one inside a transaction committed on the way
        out, a read-only one in autocommit."""
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        if self._down:
            # While the server is away, a direct connect says so at once (refused
            # connections fail in a millisecond) instead of each request waiting
            # out the pool; once it answers, the pool takes over again.
            cause = self._cause()
            if cause is not None:
                raise Unavailable(self.not_answering(cause))
            self._down = False
            self._back_at = time.monotonic()
            QUIETER.worked(self._name)
        wait = self._borrow_timeout()
        lent = False
        try:
            try:
                with self._pool.connection(timeout=wait) as conn:
                    lent = True
                    yield conn
            except PoolTimeout:
                if lent or self._cause() is not None:
                    raise
                # No connection came, yet the server answers: the pool is refilling
                # (its connections died in a restart or an outage this process never
                # saw, and a reconnect attempt is in its back-off) or it is busy. One
                # more wait covers that back-off, so a refill is not said as an outage.
                wait += RECONNECT_TIMEOUT
                with self._pool.connection(timeout=RECONNECT_TIMEOUT) as conn:
                    QUIETER.worked(self._name)
                    yield conn
        except psycopg.errors.InsufficientPrivilege as exc:
            hint = f" ({self._privileges})" if self._privileges else ""
            raise Unavailable(
                f"PostgreSQL at {self.server} refused: {one_line(str(exc))}{hint}"
            ) from exc
        except PoolTimeout as exc:
            cause = self._cause()
            self._down = cause is not None
            raise Unavailable(
                self.not_answering(cause or f"no connection became free within {wait:g} s")
            ) from exc
        except PoolClosed as exc:
            raise Unavailable(f"the connection to PostgreSQL at {self.server} is closed") from exc
        except psycopg.DataError as exc:
            if "NUL" not in str(exc):
                raise
            # psycopg refuses to send one, as PostgreSQL text never holds it: an id or a
            # filter with a NUL is the asker's mistake, not the server's.
            raise BadRequest(
                "a value given holds a NUL character, which no id or text in PostgreSQL has"
            ) from exc
        except psycopg.errors.QueryCanceled as exc:
            raise Unavailable(
                f"PostgreSQL at {self.server} did not answer within "
                f"{self._statement_timeout_ms / 1000:g} s: {one_line(str(exc))}"
            ) from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if not _server_lost(exc):
                raise
            cause = self._cause()
            if cause is None:
                # The server answers: this connection outlived a restart. Drop the
                # pool's other idle ones like it, and let the caller try again.
                self._pool.check()
                raise StaleConnection(self.not_answering(exc)) from exc
            self._down = True
            raise Unavailable(self.not_answering(cause)) from exc

    def _borrow_timeout(self) -> float:
        """How long to wait for a pooled connection. Just after an outage the pool may
        still be waiting out the back-off of a reconnect attempt begun while the server
        was away (up to :data:`RECONNECT_TIMEOUT`); a borrow then waits that out too,
        so a pool that is refilling is not reported as a second outage."""
        if self._back_at is not None and time.monotonic() - self._back_at < REFILL_WINDOW:
            return self._wait_timeout + RECONNECT_TIMEOUT
        return self._wait_timeout

    def close(self) -> None:
        self._pool.close()


def _server_lost(exc: BaseException) -> bool:
    """A connection-level failure (no SQLSTATE, or classes 08, 53, 57P), not a SQL error."""
    sqlstate = getattr(exc, "sqlstate", None)
    return sqlstate is None or sqlstate.startswith(("08", "53", "57P"))


def cutoff_instant(cutoff: str) -> datetime:
    """A prune or cache cutoff as an aware datetime (they are made by this app)."""
    parsed = parse_instant(cutoff)
    if parsed is None:
        raise ValueError(f"cutoff {cutoff!r} is not an ISO timestamp with a time zone")
    return parsed
