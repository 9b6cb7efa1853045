"""The audit log on PostgreSQL: ``localui_audit`` in the app's own schema, beside
``localui_decisions`` (``localui.backends.audit``). Every localui process serving the
database appends to the one chain."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from localui.audit import GENESIS, AuditEntry, AuditEvent, AuditPage, AuditQuery, chained, instant
from localui.backends.audit import (
    COLUMN_NAMES,
    COLUMNS,
    INDEXES,
    TABLE,
    WALK_BATCH,
    entry_from_values,
    entry_values,
    filters,
)
from localui.backends.postgres.pool import Pool, identifier

#: The SELECT list: ``at`` as the text that was hashed (:func:`localui.audit.instant`),
#: written by the server, which at a million rows is seconds of ``localui audit
#: verify`` less than converting each value in Python.
_AT = """to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"') AS at"""
_SELECT = ", ".join(_AT if name == "at" else name for name in COLUMN_NAMES)


class PostgresAuditLog:
    """:class:`localui.backends.base.AuditLog` in ``{schema}.localui_audit``. A read-only
    log reads an empty log while the table does not exist, and makes nothing."""

    def __init__(self, dsn: str, *, schema: str = "localui", writable: bool) -> None:
        self.schema = identifier(schema, "--pg-app-schema")
        #: The table's name as messages read it.
        self.table = f"{self.schema}.{TABLE}"
        self._table = sql.Identifier(self.schema, TABLE)
        self.writable = writable
        self._pool = Pool(
            dsn,
            name="localui-audit",
            read_only=not writable,
            privileges=(
                f"localui keeps its audit log in {self.table}: it needs CREATE on the database"
                f" or on schema {self.schema}, or that table made for it with SELECT and INSERT"
                if writable
                else f"localui reads its audit log with USAGE on schema {self.schema} and"
                f" SELECT on {self.table}"
            ),
        )
        if writable:
            try:
                self._create()
            except BaseException:
                self._pool.close()
                raise

    def _sql(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(table=self._table)

    def _create(self) -> None:
        with self._pool.connection() as conn:
            # Two processes starting together would race on the catalog.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
            if conn.execute("SELECT to_regclass(%s)", (self._table.as_string(),)).fetchone()[0]:
                return
            has_schema = conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)
            ).fetchone()
            if has_schema is None:
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
            conn.execute(
                self._sql(
                    """CREATE TABLE {table} (
                    id           BIGINT PRIMARY KEY,
                    at           TIMESTAMPTZ NOT NULL,
                    actor        TEXT NOT NULL,
                    via          TEXT NOT NULL,
                    address      TEXT NOT NULL,
                    action       TEXT NOT NULL,
                    method       TEXT NOT NULL,
                    path         TEXT NOT NULL,
                    execution_id TEXT,
                    detail       TEXT NOT NULL,
                    status       INTEGER NOT NULL,
                    outcome      TEXT NOT NULL,
                    prev_hash    TEXT NOT NULL,
                    hash         TEXT NOT NULL
                )"""
                )
            )
            for suffix, columns in INDEXES:
                conn.execute(
                    sql.SQL("CREATE INDEX {} ON {} ({})").format(
                        sql.Identifier(f"{TABLE}_{suffix}"), self._table, sql.SQL(columns)
                    )
                )

    def append(self, event: AuditEvent) -> AuditEntry:
        with self._pool.connection() as conn:
            # Held to the commit: the last row read is still the last when this one
            # goes in, so appends from every process make one chain.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table + ":append",))
            last = conn.execute(
                self._sql("SELECT id, hash FROM {table} ORDER BY id DESC LIMIT 1")
            ).fetchone()
            id, prev = (last[0] + 1, last[1]) if last is not None else (1, GENESIS)
            entry = chained(event, id, instant(datetime.now(UTC)), prev)
            conn.execute(
                self._sql(f"INSERT INTO {{table}} ({COLUMNS}) VALUES ({', '.join(['%s'] * 14)})"),
                entry_values(entry),
            )
        return entry

    def _rows(self, text: str, params: tuple[Any, ...]) -> list[Any]:
        with self._pool.connection() as conn:
            exists = conn.execute("SELECT to_regclass(%s)", (self._table.as_string(),)).fetchone()
            if not exists[0]:
                return []
            return list(conn.execute(self._sql(text), params).fetchall())

    def list_entries(self, query: AuditQuery) -> AuditPage:
        where, params = filters(query, "%s")
        rows = self._rows(
            f"SELECT {_SELECT} FROM {{table}} WHERE {where} ORDER BY id DESC LIMIT %s",
            (*params, query.limit + 1),
        )
        entries = tuple(entry_from_values(r) for r in rows[: query.limit])
        more = len(rows) > query.limit
        return AuditPage(entries=entries, next_key=entries[-1].id if more else None)

    def walk(self) -> Iterator[AuditEntry]:
        after = 0
        while True:
            rows = self._rows(
                f"SELECT {_SELECT} FROM {{table}} WHERE id > %s ORDER BY id LIMIT %s",
                (after, WALK_BATCH),
            )
            if not rows:
                return
            yield from map(entry_from_values, rows)
            after = rows[-1][0]

    def close(self) -> None:
        self._pool.close()
