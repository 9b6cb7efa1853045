"""Notes on a pause on PostgreSQL: ``localui_notes`` in the app's own schema, beside
``localui_decisions`` (``localui.backends.notes``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import sql

from localui.backends.notes import (
    COLUMN_NAMES,
    INDEXES,
    MAX_NOTES,
    TABLE,
    Note,
    by_pause,
    note_from_values,
)
from localui.backends.postgres.pool import Pool, identifier, iso, parse_instant
from localui.errors import BadRequest

_SELECT = ", ".join(COLUMN_NAMES)


def _note(row: Sequence[Any]) -> Note:
    return note_from_values((*row[:5], iso(row[5])))


class PostgresNotes:
    """:class:`localui.backends.base.NoteLog` in ``{schema}.localui_notes``. A read-only
    log reads no notes while the table does not exist, and makes nothing."""

    def __init__(self, dsn: str, *, schema: str = "localui", writable: bool) -> None:
        self.schema = identifier(schema, "--pg-app-schema")
        #: The table's name as messages read it.
        self.table = f"{self.schema}.{TABLE}"
        self._table = sql.Identifier(self.schema, TABLE)
        self.writable = writable
        self._pool = Pool(
            dsn,
            name="localui-notes",
            read_only=not writable,
            max_size=2,
            privileges=(
                f"localui keeps notes on pauses in {self.table}: it needs CREATE on the"
                f" database or on schema {self.schema}, or that table made for it with SELECT"
                " and INSERT (and USAGE on its id sequence)"
                if writable
                else f"localui reads notes with USAGE on schema {self.schema} and SELECT on"
                f" {self.table}"
            ),
        )
        #: Whether the table is known to exist (a writable log makes it now): once it
        #: does, a read is one round trip, not two.
        self._has_table = writable
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
            conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
            )
            conn.execute(
                self._sql(
                    """CREATE TABLE {table} (
                    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    execution_id  TEXT NOT NULL,
                    checkpoint_id TEXT NOT NULL,
                    author        TEXT NOT NULL,
                    text          TEXT NOT NULL,
                    created_at    TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
                )"""
                )
            )
            for suffix, columns in INDEXES:
                conn.execute(
                    sql.SQL("CREATE INDEX {} ON {} ({})").format(
                        sql.Identifier(f"{TABLE}_{suffix}"), self._table, sql.SQL(columns)
                    )
                )

    def add(self, execution_id: str, checkpoint_id: str, author: str, text: str) -> Note:
        with self._pool.connection() as conn:
            row = conn.execute(
                self._sql(
                    "INSERT INTO {table} (execution_id, checkpoint_id, author, text)"
                    f" VALUES (%s, %s, %s, %s) RETURNING {_SELECT}"
                ),
                (execution_id, checkpoint_id, author, text),
            ).fetchone()
        return _note(row)

    def _rows(self, text: str, params: tuple[Any, ...]) -> tuple[Note, ...]:
        with self._pool.connection() as conn:
            if not self._has_table:
                exists = conn.execute(
                    "SELECT to_regclass(%s)", (self._table.as_string(),)
                ).fetchone()
                if not exists[0]:
                    return ()
                self._has_table = True
            return tuple(_note(row) for row in conn.execute(self._sql(text), params))

    def for_pauses(
        self, pauses: Sequence[tuple[str, str]]
    ) -> Mapping[tuple[str, str], tuple[Note, ...]]:
        wanted = set(pauses)
        runs = sorted({execution_id for execution_id, _ in wanted})
        if not runs:
            return {}
        notes = self._rows(
            f"SELECT {_SELECT} FROM {{table}} WHERE execution_id = ANY(%s) ORDER BY id LIMIT %s",
            (runs, MAX_NOTES * len(runs)),
        )
        return {key: group for key, group in by_pause(notes).items() if key in wanted}

    def for_run(self, execution_id: str) -> tuple[Note, ...]:
        return self._rows(
            f"SELECT {_SELECT} FROM {{table}} WHERE execution_id = %s ORDER BY id LIMIT %s",
            (execution_id, MAX_NOTES),
        )

    def written_since(self, after: tuple[str, int], limit: int) -> tuple[Note, ...]:
        at = parse_instant(after[0])
        if at is None:
            raise BadRequest(f"{after[0]!r} is not an instant with a time zone")
        return self._rows(
            f"SELECT {_SELECT} FROM {{table}} WHERE (created_at, id) > (%s, %s)"
            " ORDER BY created_at, id LIMIT %s",
            (at, after[1], limit),
        )

    def close(self) -> None:
        self._pool.close()
