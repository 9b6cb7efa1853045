"""How far the watchers have looked, on PostgreSQL: ``localui_watch`` in the app schema
(``localui.backends.watch``)."""

from __future__ import annotations

from typing import Any

from psycopg import sql

from localui.backends.postgres.pool import Pool
from localui.backends.watch import ADVANCE_SQL, COLUMNS, SWEEP, TABLE, looked_at_of


class PostgresWatch:
    """``{schema}.localui_watch`` through the outbox's pool."""

    def __init__(self, pool: Pool, schema: str) -> None:
        self._pool = pool
        self._table = sql.Identifier(schema, TABLE)

    def create(self, conn: Any) -> None:
        """The table, on the connection that makes the outbox's."""
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ("
                " name TEXT PRIMARY KEY, looked_at DOUBLE PRECISION NOT NULL)"
            ).format(self._table)
        )

    def looked_at(self) -> float | None:
        from psycopg.rows import dict_row

        with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                sql.SQL(f"SELECT {COLUMNS} FROM {{}} WHERE name = %s").format(self._table),
                (SWEEP,),
            ).fetchone()
        return looked_at_of(row)

    def advance(self, to: float) -> None:
        with self._pool.connection() as conn:
            conn.execute(
                sql.SQL(ADVANCE_SQL.replace("{mark}", "%s")).format(table=self._table),
                (SWEEP, to),
            )
