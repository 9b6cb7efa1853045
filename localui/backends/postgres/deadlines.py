"""The pauses' deadlines on PostgreSQL: ``localui_deadlines`` in the app's own schema
(``localui.backends.deadlines``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import sql

from localui.backends.deadlines import COLUMNS, TABLE, Deadline, deadline_from_row
from localui.backends.postgres.pool import Pool, identifier


class PostgresDeadlines:
    """:class:`localui.backends.base.Deadlines` in ``{schema}.localui_deadlines``. A
    read-only one finds no rows until a writable process makes the table."""

    def __init__(self, dsn: str, *, schema: str = "localui", writable: bool) -> None:
        self.schema = identifier(schema, "--pg-app-schema")
        self.writable = writable
        self._table = sql.Identifier(self.schema, TABLE)
        self._pool = Pool(
            dsn,
            name="localui-deadlines",
            read_only=not writable,
            max_size=2,
            privileges=(
                f"localui keeps the pauses' deadlines in {self.schema}.{TABLE}: it needs"
                f" CREATE on the database or on schema {self.schema}, or that table made for"
                " it with SELECT, INSERT, UPDATE and DELETE"
            ),
        )
        self._made = False

    def _sql(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(t=self._table, columns=sql.SQL(COLUMNS))

    def _ready(self, conn: Any) -> bool:
        """Whether the table is there (a writable one makes it, once per process)."""
        if self._made:
            return True
        if not self.writable:
            found = conn.execute("SELECT to_regclass(%s)", (self._table.as_string(),)).fetchone()
            self._made = found[0] is not None
            return self._made
        # Two processes starting together would race on the catalog.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{self.schema}.{TABLE}",))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        conn.execute(
            self._sql(
                """CREATE TABLE IF NOT EXISTS {t} (
                execution_id  TEXT NOT NULL,
                checkpoint_id TEXT NOT NULL,
                rule          TEXT NOT NULL,
                paused_at     DOUBLE PRECISION NOT NULL,
                due_at        DOUBLE PRECISION NOT NULL,
                timeout_at    DOUBLE PRECISION,
                escalated_at  DOUBLE PRECISION,
                timed_out_at  DOUBLE PRECISION,
                PRIMARY KEY (execution_id, checkpoint_id)
            )"""
            )
        )
        conn.execute(
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (due_at, execution_id)").format(
                sql.Identifier(f"{TABLE}_due"), self._table
            )
        )
        # Committed before it is taken as made: another thread's connection must see
        # the table the moment this one stops checking for it.
        conn.commit()
        self._made = True
        return True

    def _rows(self, query: str, params: Sequence[Any]) -> tuple[Deadline, ...]:
        with self._pool.connection() as conn:
            if not self._ready(conn):
                return ()
            return tuple(deadline_from_row(r) for r in conn.execute(self._sql(query), params))

    def record(self, rows: Sequence[Deadline]) -> int:
        if not rows:
            return 0
        with self._pool.connection() as conn:
            self._ready(conn)
            added = 0
            for row in rows:
                cursor = conn.execute(
                    self._sql(
                        "INSERT INTO {t} ({columns}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                        " ON CONFLICT DO NOTHING"
                    ),
                    row.values(),
                )
                added += cursor.rowcount
            return added

    def list_keys(self) -> set[tuple[str, str]]:
        with self._pool.connection() as conn:
            if not self._ready(conn):
                return set()
            rows = conn.execute(self._sql("SELECT execution_id, checkpoint_id FROM {t}"))
            return {(str(e), str(c)) for e, c in rows}

    def list_work(self, now: float, limit: int) -> tuple[Deadline, ...]:
        return self._rows(
            "SELECT {columns} FROM {t} WHERE (due_at <= %s AND escalated_at IS NULL)"
            " OR (timeout_at <= %s AND timed_out_at IS NULL) ORDER BY due_at LIMIT %s",
            (now, now, limit),
        )

    def _mark(self, column: str, key: tuple[str, str], now: float) -> bool:
        with self._pool.connection() as conn:
            self._ready(conn)
            cursor = conn.execute(
                sql.SQL(
                    "UPDATE {t} SET {c} = %s"
                    " WHERE execution_id = %s AND checkpoint_id = %s AND {c} IS NULL"
                ).format(t=self._table, c=sql.Identifier(column)),
                (now, *key),
            )
            return bool(cursor.rowcount == 1)

    def mark_escalated(self, key: tuple[str, str], now: float) -> bool:
        return self._mark("escalated_at", key, now)

    def mark_timed_out(self, key: tuple[str, str], now: float) -> bool:
        return self._mark("timed_out_at", key, now)

    def forget(self, keys: Sequence[tuple[str, str]]) -> int:
        if not keys:
            return 0
        with self._pool.connection() as conn:
            self._ready(conn)
            cursor = conn.execute(
                self._sql(
                    "DELETE FROM {t} WHERE (execution_id, checkpoint_id) IN"
                    " (SELECT * FROM unnest(%s::text[], %s::text[]))"
                ),
                ([e for e, _ in keys], [c for _, c in keys]),
            )
            return int(cursor.rowcount)

    def by_due(self, after: tuple[float, str] | None, limit: int) -> tuple[Deadline, ...]:
        if after is None:
            return self._rows(
                "SELECT {columns} FROM {t} ORDER BY due_at, execution_id LIMIT %s", (limit,)
            )
        return self._rows(
            "SELECT {columns} FROM {t} WHERE (due_at, execution_id) > (%s, %s)"
            " ORDER BY due_at, execution_id LIMIT %s",
            (*after, limit),
        )

    def get_many(self, keys: Sequence[tuple[str, str]]) -> Mapping[tuple[str, str], Deadline]:
        if not keys:
            return {}
        found = self._rows(
            "SELECT {columns} FROM {t} WHERE (execution_id, checkpoint_id) IN"
            " (SELECT * FROM unnest(%s::text[], %s::text[]))",
            ([e for e, _ in keys], [c for _, c in keys]),
        )
        return {d.key: d for d in found}

    def list_overdue(self, now: float, limit: int) -> tuple[Deadline, ...]:
        return self._rows(
            "SELECT {columns} FROM {t} WHERE due_at <= %s ORDER BY due_at, execution_id LIMIT %s",
            (now, limit),
        )

    def close(self) -> None:
        self._pool.close()
