"""The notifications outbox on PostgreSQL: ``localui_notifications`` in the app schema.

The same outbox as the SQLite one (``localui.backends.notifications``), shared by
every localui process on the database: recording is an ``INSERT … ON CONFLICT DO
NOTHING`` on the unique key, and a claim takes due rows ``FOR UPDATE SKIP
LOCKED``, so processes claiming at the same moment each get other rows and none
is sent twice.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from psycopg import sql

from localui.backends.notifications import (
    COLUMN_NAMES,
    FAILED,
    PENDING,
    RENAME_SQL,
    SENT,
    SUMMARY_SQL,
    TABLE,
    Notice,
    Notification,
    TargetStatus,
    notification_from_row,
    shown_part,
    status_from_row,
)
from localui.backends.postgres.pool import Pool, identifier
from localui.backends.postgres.watch import PostgresWatch
from localui.backends.watch import TABLE as WATCH_TABLE

_COLUMNS = sql.SQL(", ").join(sql.Identifier(c) for c in COLUMN_NAMES)
#: Indexes later localuis added, by name (after the table's) and columns.
LATER_INDEXES = (
    ("due_by_target", ("state", "target", "next_at")),
    ("give_up", ("state", "give_up_at")),
)


class PostgresOutbox:
    """:class:`localui.backends.base.Outbox` in ``{schema}.localui_notifications``."""

    def __init__(self, dsn: str, *, schema: str = "localui") -> None:
        self.schema = identifier(schema, "--pg-app-schema")
        self.table = f"{self.schema}.{TABLE}"
        self._table = sql.Identifier(self.schema, TABLE)
        self._pool = Pool(
            dsn,
            name="localui-notifications",
            read_only=False,
            privileges=f"localui keeps its notifications in {self.table} and"
            f" {self.schema}.{WATCH_TABLE}: it needs CREATE on the database or on schema"
            f" {self.schema}, or those tables made for it with SELECT, INSERT and UPDATE",
        )
        self._watch = PostgresWatch(self._pool, self.schema)
        try:
            self._create()
        except BaseException:
            self._pool.close()
            raise

    def _sql(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(table=self._table, columns=_COLUMNS)

    def _create(self) -> None:
        with self._pool.connection() as conn:
            # Two processes starting together would race on the catalog.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
            regclass = sql.Identifier(self.schema, TABLE).as_string()
            if conn.execute("SELECT to_regclass(%s)", (regclass,)).fetchone()[0] is not None:
                self._create_later_parts(conn)
                return
            conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
            )
            conn.execute(
                self._sql(
                    f"""CREATE TABLE {{table}} (
                    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    event_key    TEXT NOT NULL,
                    target       TEXT NOT NULL,
                    event_type   TEXT NOT NULL,
                    execution_id TEXT NOT NULL,
                    payload      TEXT NOT NULL,
                    created_at   DOUBLE PRECISION NOT NULL,
                    state        TEXT NOT NULL DEFAULT '{PENDING}',
                    attempts     INTEGER NOT NULL DEFAULT 0,
                    next_at      DOUBLE PRECISION NOT NULL,
                    give_up_at   DOUBLE PRECISION NOT NULL,
                    lease_until  DOUBLE PRECISION,
                    last_error   TEXT,
                    sent_at      DOUBLE PRECISION,
                    UNIQUE (event_key, target)
                )"""
                )
            )
            conn.execute(
                sql.SQL("CREATE INDEX {} ON {} (state, next_at)").format(
                    sql.Identifier(f"{TABLE}_due"), self._table
                )
            )
            self._create_later_parts(conn)

    def _create_later_parts(self, conn: Any) -> None:
        """What later localuis added (made here too for a table an earlier one made):
        the due rows of each target, as a process claims only its own targets' rows;
        the rows past their last try, as those of targets no longer configured are
        given up on; and how far the watchers have looked."""
        for name, columns in LATER_INDEXES:
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
                    sql.Identifier(f"{TABLE}_{name}"),
                    self._table,
                    sql.SQL(", ").join(sql.Identifier(c) for c in columns),
                )
            )
        self._watch.create(conn)

    def record(
        self, notices: Sequence[Notice], targets: Sequence[str], *, now: float, give_up_at: float
    ) -> int:
        rows = [
            (n.event_key, t, n.event_type, n.execution_id, n.payload, now, now, give_up_at)
            for n in notices
            for t in targets
        ]
        if not rows:
            return 0
        added = 0
        with self._pool.connection() as conn, conn.cursor() as cur:
            for row in rows:
                cur.execute(
                    self._sql(
                        "INSERT INTO {table} (event_key, target, event_type, execution_id,"
                        " payload, created_at, next_at, give_up_at)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                        " ON CONFLICT (event_key, target) DO NOTHING"
                    ),
                    row,
                )
                added += cur.rowcount
        return added

    def recorded(self, keys: Collection[str], targets: Sequence[str]) -> set[str]:
        wanted, kinds = sorted(set(keys)), sorted(set(targets))
        if not wanted or not kinds:
            return set(wanted)  # with no target, every key is recorded for all of them
        with self._pool.connection() as conn, conn.cursor() as cur:
            rows = cur.execute(
                self._sql(
                    "SELECT event_key FROM {table} WHERE event_key = ANY(%s)"
                    " AND target = ANY(%s) GROUP BY event_key"
                    " HAVING count(DISTINCT target) = %s"
                ),
                (wanted, kinds, len(kinds)),
            ).fetchall()
        return {str(r[0]) for r in rows}

    def claim_due(
        self, *, now: float, lease: float, limit: int, targets: Sequence[str]
    ) -> tuple[Notification, ...]:
        from psycopg.rows import dict_row

        if not targets:
            return ()
        with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                self._sql(
                    "UPDATE {table} SET lease_until = %s WHERE id IN ("
                    " SELECT id FROM {table} WHERE state = %s AND target = ANY(%s)"
                    " AND next_at <= %s AND (lease_until IS NULL OR lease_until < %s)"
                    " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
                    " RETURNING {columns}"
                ),
                (now + lease, PENDING, list(targets), now, now, limit),
            ).fetchall()
        return tuple(sorted((notification_from_row(r) for r in rows), key=lambda n: n.id))

    def _update(self, text: str, params: Sequence[Any], ids: Sequence[int]) -> None:
        if not ids:
            return
        with self._pool.connection() as conn:
            conn.execute(self._sql(f"{text} WHERE id = ANY(%s)"), (*params, list(ids)))

    def mark_sent(self, ids: Sequence[int], *, now: float) -> None:
        self._update(
            "UPDATE {table} SET state = %s, sent_at = %s, attempts = attempts + 1,"
            " lease_until = NULL",
            (SENT, now),
            ids,
        )

    def mark_attempt_failed(
        self, ids: Sequence[int], error: str, *, next_at: float | None, now: float
    ) -> None:
        self._update(
            "UPDATE {table} SET state = %s, next_at = %s, last_error = %s,"
            " attempts = attempts + 1, lease_until = NULL",
            (FAILED if next_at is None else PENDING, now if next_at is None else next_at, error),
            ids,
        )

    def release(self, ids: Sequence[int]) -> None:
        self._update("UPDATE {table} SET lease_until = NULL", (), ids)

    def list_recent(self, limit: int) -> tuple[Notification, ...]:
        from psycopg.rows import dict_row

        with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                self._sql("SELECT {columns} FROM {table} ORDER BY id DESC LIMIT %s"), (limit,)
            ).fetchall()
        return tuple(notification_from_row(r) for r in rows)

    def target_statuses(self) -> tuple[TargetStatus, ...]:
        from psycopg.rows import dict_row

        with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(sql.SQL(SUMMARY_SQL).format(table=self._table)).fetchall()
        return tuple(status_from_row(r) for r in rows)

    def retry_failed(self, *, now: float, give_up_at: float, target: str | None = None) -> int:
        with self._pool.connection() as conn, conn.cursor() as cur:
            cur.execute(
                self._sql(
                    "UPDATE {table} SET state = %s, next_at = %s, give_up_at = %s, attempts = 0,"
                    " lease_until = NULL WHERE state = %s AND (%s::text IS NULL OR target = %s)"
                ),
                (PENDING, now, give_up_at, FAILED, target, target),
            )
            return int(cur.rowcount)

    def give_up_unconfigured(
        self, *, targets: Sequence[str], now: float, detail: str, limit: int
    ) -> int:
        if not targets:
            return 0
        with self._pool.connection() as conn, conn.cursor() as cur:
            cur.execute(
                self._sql(
                    "UPDATE {table} SET state = %s, next_at = %s, last_error = %s,"
                    " lease_until = NULL WHERE id IN ("
                    " SELECT id FROM {table} WHERE state = %s AND give_up_at < %s"
                    " AND target <> ALL(%s) AND (lease_until IS NULL OR lease_until < %s)"
                    " ORDER BY give_up_at LIMIT %s FOR UPDATE SKIP LOCKED)"
                ),
                (FAILED, now, detail, PENDING, now, list(targets), now, limit),
            )
            return int(cur.rowcount)

    def looked_at(self) -> float | None:
        return self._watch.looked_at()

    def advance_looked_at(self, to: float) -> None:
        self._watch.advance(to)

    def rename_target(self, old: str, new: str) -> int:
        with self._pool.connection() as conn, conn.cursor() as cur:
            cur.execute(
                sql.SQL(RENAME_SQL.replace("{mark}", "%s")).format(table=self._table),
                (new, shown_part(old), shown_part(new), old, new),
            )
            return int(cur.rowcount)

    def close(self) -> None:
        self._pool.close()
