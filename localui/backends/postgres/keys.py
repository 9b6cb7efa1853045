"""The signing keys and sign-outs on PostgreSQL: ``localui_keys`` and
``localui_signouts`` in the app's own schema (``localui.backends.keys``)."""

from __future__ import annotations

from typing import Any

from psycopg import sql

from localui.backends.keys import KEYS_TABLE, SIGNOUTS_TABLE, Key, Shared, new_ring, new_secret
from localui.backends.postgres.pool import Pool, identifier

#: The database's clock as Unix seconds: every process on the store reads one clock.
_NOW = "extract(epoch FROM clock_timestamp())"


class PostgresKeys:
    """:class:`localui.backends.base.SessionKeys` in ``{schema}.localui_keys`` and
    ``{schema}.localui_signouts``. A read-only one (a ``--read-only`` server's) finds
    nothing until a writable process makes the tables."""

    def __init__(self, dsn: str, *, schema: str = "localui", writable: bool) -> None:
        self.schema = identifier(schema, "--pg-app-schema")
        self.writable = writable
        self._keys = sql.Identifier(self.schema, KEYS_TABLE)
        self._signouts = sql.Identifier(self.schema, SIGNOUTS_TABLE)
        self._pool = Pool(
            dsn,
            name="localui-keys",
            read_only=not writable,
            max_size=2,
            privileges=(
                f"localui keeps its signing keys in {self.schema}.{KEYS_TABLE} and"
                f" {self.schema}.{SIGNOUTS_TABLE}: it needs CREATE on the database or on"
                f" schema {self.schema}, or those tables made for it with SELECT, INSERT,"
                " UPDATE and DELETE"
            ),
        )
        self._made = False

    def _sql(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(keys=self._keys, signouts=self._signouts, now=sql.SQL(_NOW))

    def _make(self, conn: Any) -> None:
        """The tables and the first key when there are none (once per process)."""
        if self._made:
            return
        # Two processes starting together would race on the catalog and the first key.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{self.schema}.keys",))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        conn.execute(
            self._sql(
                """CREATE TABLE IF NOT EXISTS {keys} (
                generation INTEGER PRIMARY KEY,
                secret     BYTEA NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                retires_at DOUBLE PRECISION,
                ring       TEXT NOT NULL
            )"""
            )
        )
        conn.execute(
            self._sql(
                """CREATE TABLE IF NOT EXISTS {signouts} (
                session_id TEXT PRIMARY KEY,
                ended_at   DOUBLE PRECISION NOT NULL,
                expires_at DOUBLE PRECISION NOT NULL
            )"""
            )
        )
        conn.execute(
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (ended_at)").format(
                sql.Identifier(f"{SIGNOUTS_TABLE}_ended"), self._signouts
            )
        )
        conn.execute(
            self._sql(
                "INSERT INTO {keys} SELECT 1, %s, {now}, NULL, %s"
                " WHERE NOT EXISTS (SELECT 1 FROM {keys})"
            ),
            (new_secret(), new_ring()),
        )
        # Committed before it is taken as made: another thread's connection must see
        # the tables and the first key the moment this one stops checking for them.
        conn.commit()
        self._made = True

    def shared(self, ended_after: float) -> Shared | None:
        with self._pool.connection() as conn:
            if self.writable:
                self._make(conn)
            elif not conn.execute("SELECT to_regclass(%s)", (self._keys.as_string(),)).fetchone()[
                0
            ]:
                return None
            with conn.transaction():
                keys = tuple(
                    _key(row)
                    for row in conn.execute(
                        self._sql(
                            "SELECT generation, secret, created_at, retires_at, ring FROM {keys}"
                            " WHERE retires_at IS NULL OR retires_at > {now} ORDER BY generation"
                        )
                    )
                )
                ended = tuple(
                    (str(sid), float(at), float(until))
                    for sid, at, until in conn.execute(
                        self._sql(
                            "SELECT session_id, ended_at, expires_at FROM {signouts}"
                            " WHERE ended_at >= %s AND expires_at > {now}"
                        ),
                        (ended_after,),
                    )
                )
        return Shared(keys, ended) if keys else None

    def rotate(self, grace_seconds: float) -> tuple[Key, ...]:
        with self._pool.connection() as conn:
            self._make(conn)
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{self.schema}.keys",))
            conn.execute(
                self._sql(
                    "UPDATE {keys} SET retires_at = {now} + %s"
                    " WHERE retires_at IS NULL OR retires_at > {now} + %s"
                ),
                (grace_seconds, grace_seconds),
            )
            conn.execute(
                self._sql(
                    "INSERT INTO {keys} SELECT generation + 1, %s, {now}, NULL, ring FROM {keys}"
                    " ORDER BY generation DESC LIMIT 1"
                ),
                (new_secret(),),
            )
            conn.execute(self._sql("DELETE FROM {keys} WHERE retires_at <= {now}"))
            rows = conn.execute(
                self._sql(
                    "SELECT generation, secret, created_at, retires_at, ring FROM {keys}"
                    " ORDER BY generation"
                )
            ).fetchall()
        return tuple(_key(row) for row in rows)

    def end_session(self, session_id: str, expires_at: float) -> None:
        with self._pool.connection() as conn:
            self._make(conn)
            conn.execute(
                self._sql("INSERT INTO {signouts} VALUES (%s, {now}, %s) ON CONFLICT DO NOTHING"),
                (session_id, expires_at),
            )
            conn.execute(self._sql("DELETE FROM {signouts} WHERE expires_at <= {now}"))

    def close(self) -> None:
        self._pool.close()


def _key(row: Any) -> Key:
    generation, secret, created_at, retires_at, ring = row
    return Key(
        generation=int(generation),
        secret=bytes(secret),
        created_at=float(created_at),
        retires_at=None if retires_at is None else float(retires_at),
        ring=str(ring),
    )
