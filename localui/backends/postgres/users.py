"""The users table on PostgreSQL: ``localui_users`` in the app's own schema, beside
``localui_decisions`` (``localui.backends.users``). Every localui process serving
the database reads the same people."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from localui.backends.postgres.pool import Pool, identifier, iso
from localui.backends.users import (
    ADDED_COLUMNS,
    COLUMN_NAMES,
    TABLE,
    already_a_user,
    groups_text,
    user_from_row,
)
from localui.records import User

_COLUMNS = sql.SQL(", ").join(sql.Identifier(c) for c in COLUMN_NAMES)


def _select_list(present: set[str]) -> sql.Composable:
    """The SELECT list for a table with the columns ``present`` (an older localui's
    lacks the added ones until ``localui users`` next writes it): each missing one
    read as empty text, under its own name."""
    if present.issuperset(COLUMN_NAMES):
        return _COLUMNS
    return sql.SQL(", ").join(
        sql.Identifier(c) if c in present else sql.SQL("'' AS {}").format(sql.Identifier(c))
        for c in COLUMN_NAMES
    )


class PostgresUsers:
    """:class:`localui.backends.base.UserDirectory` in ``{schema}.localui_users``. A
    read-only directory (the server's) answers "nobody" while the table does not exist."""

    def __init__(self, dsn: str, *, schema: str = "localui", writable: bool = False) -> None:
        self.schema = identifier(schema, "--pg-app-schema")
        #: The table's name as messages read it.
        self.table = f"{self.schema}.{TABLE}"
        self._table = sql.Identifier(self.schema, TABLE)
        self._pool = Pool(
            dsn,
            name="localui-users",
            read_only=not writable,
            privileges=(
                f"localui keeps its users in {self.table}: it needs CREATE on the database or"
                f" on schema {self.schema}, or that table made for it with SELECT, INSERT,"
                " UPDATE and DELETE"
                if writable
                else f"localui reads its users with USAGE on schema {self.schema} and SELECT"
                f" on {self.table}"
            ),
        )
        if writable:
            try:
                self._create()
            except BaseException:
                self._pool.close()
                raise

    def _sql(self, text: str, columns: sql.Composable = _COLUMNS) -> sql.Composed:
        """``text`` with ``{table}`` and ``{columns}`` filled in as quoted identifiers."""
        return sql.SQL(text).format(table=self._table, columns=columns)

    def _regclass(self) -> str:
        """The table as ``to_regclass`` parses it: quoted, so the name is taken as is."""
        return self._table.as_string()

    def _create(self) -> None:
        with self._pool.connection() as conn:
            # Two processes starting together would race on the catalog.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
            if conn.execute("SELECT to_regclass(%s)", (self._regclass(),)).fetchone()[0]:
                # Made by an older localui: the columns added since come with this write.
                for column in ADDED_COLUMNS:
                    conn.execute(
                        sql.SQL(
                            "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column}"
                            " TEXT NOT NULL DEFAULT ''"
                        ).format(table=self._table, column=sql.Identifier(column))
                    )
                return
            has_schema = conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)
            ).fetchone()
            if has_schema is None:
                # Only when missing: a role given the schema needs no CREATE on the database.
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
            conn.execute(
                self._sql(
                    """CREATE TABLE {table} (
                    name         TEXT PRIMARY KEY,
                    role         TEXT NOT NULL,
                    token_sha256 TEXT NOT NULL UNIQUE,
                    created_at   TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                    user_groups  TEXT NOT NULL DEFAULT '',
                    address      TEXT NOT NULL DEFAULT '',
                    away_to      TEXT NOT NULL DEFAULT '',
                    away_until   TEXT NOT NULL DEFAULT ''
                )"""
                )
            )

    def _rows(self, text: str, params: tuple[Any, ...]) -> list[Any]:
        from psycopg.rows import dict_row

        with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            if not cur.execute("SELECT to_regclass(%s) AS t", (self._regclass(),)).fetchone()["t"]:
                return []  # nobody added yet
            present = {
                str(r["attname"])
                for r in cur.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s)"
                    " AND attnum > 0 AND NOT attisdropped",
                    (self._regclass(),),
                ).fetchall()
            }
            return list(cur.execute(self._sql(text, _select_list(present)), params).fetchall())

    def _changed(self, text: str, params: tuple[Any, ...]) -> Any:
        from psycopg.rows import dict_row

        with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(self._sql(text), params).fetchone()

    def by_token_hash(self, digest: str) -> User | None:
        rows = self._rows("SELECT {columns} FROM {table} WHERE token_sha256 = %s", (digest,))
        return user_from_row(rows[0], iso) if rows else None

    def by_name(self, name: str) -> User | None:
        rows = self._rows("SELECT {columns} FROM {table} WHERE name = %s", (name,))
        return user_from_row(rows[0], iso) if rows else None

    def list_users(self) -> tuple[User, ...]:
        rows = self._rows("SELECT {columns} FROM {table} ORDER BY name", ())
        return tuple(user_from_row(r, iso) for r in rows)

    def add(
        self,
        name: str,
        role: str,
        digest: str,
        groups: Sequence[str] = (),
        address: str = "",
    ) -> User:
        row = self._changed(
            "INSERT INTO {table} (name, role, token_sha256, user_groups, address)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING RETURNING {columns}",
            (name, role, digest, groups_text(groups), address),
        )
        if row is None:
            raise already_a_user(name)
        return user_from_row(row, iso)

    def set_token(self, name: str, digest: str) -> User | None:
        row = self._changed(
            "UPDATE {table} SET token_sha256 = %s WHERE name = %s RETURNING {columns}",
            (digest, name),
        )
        return user_from_row(row, iso) if row is not None else None

    def set_role(self, name: str, role: str) -> User | None:
        row = self._changed(
            "UPDATE {table} SET role = %s WHERE name = %s RETURNING {columns}", (role, name)
        )
        return user_from_row(row, iso) if row is not None else None

    def set_groups(self, name: str, groups: Sequence[str]) -> User | None:
        row = self._changed(
            "UPDATE {table} SET user_groups = %s WHERE name = %s RETURNING {columns}",
            (groups_text(groups), name),
        )
        return user_from_row(row, iso) if row is not None else None

    def set_address(self, name: str, address: str) -> User | None:
        row = self._changed(
            "UPDATE {table} SET address = %s WHERE name = %s RETURNING {columns}", (address, name)
        )
        return user_from_row(row, iso) if row is not None else None

    def set_away(self, name: str, to: str, until: str) -> User | None:
        row = self._changed(
            "UPDATE {table} SET away_to = %s, away_until = %s WHERE name = %s RETURNING {columns}",
            (to, until, name),
        )
        return user_from_row(row, iso) if row is not None else None

    def remove(self, name: str) -> bool:
        with self._pool.connection() as conn:
            deleted: int = conn.execute(
                self._sql("DELETE FROM {table} WHERE name = %s"), (name,)
            ).rowcount
        return deleted > 0

    def close(self) -> None:
        self._pool.close()
