"""The decision record on PostgreSQL: ``localui_decisions`` in a schema of the app's own.

The same record and the same lock as :class:`localui.decisions.SQLiteDecisionLog`,
shared by every localui process on the database: a claim is the insert of a
row under the unique key ``(kind, execution_id, checkpoint_id)``, so one
request in one process wins, whichever process it reaches. The schema
(default ``localui``) and table are created on first use; the SDK's schema is
never touched. Times come from the server's clock, so processes on hosts whose
clocks disagree still agree on when a claim was abandoned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localui.decisions import ABANDONED_AFTER_SECONDS, Claim, Decision
from localui.pg import Pool, identifier, iso

TABLE = "localui_decisions"

_COLUMNS = (
    "id, kind, execution_id, checkpoint_id, approved, actor, reason, decided_at,"
    " outcome, detail, finished_at"
)


def _decision(row: tuple[Any, ...]) -> Decision:
    return Decision(
        id=int(row[0]),
        kind=str(row[1]),
        execution_id=str(row[2]),
        checkpoint_id=str(row[3]),
        approved=None if row[4] is None else bool(row[4]),
        actor=str(row[5]),
        reason=str(row[6] or ""),
        decided_at=iso(row[7]),
        outcome=None if row[8] is None else str(row[8]),
        detail=None if row[9] is None else str(row[9]),
        finished_at=None if row[10] is None else iso(row[10]),
    )


class PostgresDecisionLog:
    """:class:`localui.decisions.DecisionLog` in ``{schema}.localui_decisions``."""

    def __init__(self, dsn: str, *, schema: str = "localui", writable: bool = True) -> None:
        self.schema = identifier(schema, "--pg-app-schema")
        self.table = f"{self.schema}.{TABLE}"
        self.writable = writable
        self._pool = Pool(
            dsn,
            name="localui-decisions",
            read_only=not writable,
            privileges=(
                f"localui keeps its decisions in {self.table}: it needs CREATE on the database"
                f" or on schema {self.schema}, or that table made for it with SELECT, INSERT,"
                " UPDATE and DELETE"
                if writable
                else f"a read-only localui shows decisions with USAGE on schema {self.schema}"
                f" and SELECT on {self.table}"
            ),
        )
        if writable:
            try:
                self._create()
            except BaseException:
                self._pool.close()
                raise

    def _create(self) -> None:
        """Schema, table and index, each only when missing: a role that was given an
        existing schema needs no CREATE on the database."""
        with self._pool.connection() as conn:
            # Two processes starting together would race on the catalog.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
            exists = conn.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()[0]
            if exists is not None:
                return
            has_schema = conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)
            ).fetchone()
            if has_schema is None:
                conn.execute(f"CREATE SCHEMA {self.schema}")
            conn.execute(
                f"""CREATE TABLE {self.table} (
                    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    kind          TEXT NOT NULL,
                    execution_id  TEXT NOT NULL,
                    checkpoint_id TEXT NOT NULL,
                    approved      BOOLEAN,
                    actor         TEXT NOT NULL,
                    reason        TEXT NOT NULL DEFAULT '',
                    decided_at    TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                    outcome       TEXT,
                    detail        TEXT,
                    finished_at   TIMESTAMPTZ,
                    UNIQUE (kind, execution_id, checkpoint_id)
                )"""
            )
            conn.execute(f"CREATE INDEX {TABLE}_run ON {self.table} (execution_id, decided_at)")

    def claim(
        self,
        *,
        kind: str,
        execution_id: str,
        checkpoint_id: str,
        approved: bool | None,
        actor: str,
        reason: str,
        still_pending: Callable[[], bool],
    ) -> Claim:
        key = (kind, execution_id, checkpoint_id)
        with self._pool.connection() as conn:
            existing = conn.execute(
                f"SELECT {_COLUMNS}, outcome IS NULL AND decided_at < clock_timestamp()"
                " - make_interval(secs => %s) AS abandoned"
                f" FROM {self.table} WHERE kind = %s AND execution_id = %s"
                " AND checkpoint_id = %s FOR UPDATE",
                (ABANDONED_AFTER_SECONDS, *key),
            ).fetchone()
            if existing is not None:
                if not existing[-1] or not still_pending():
                    return Claim(won=False, decision=_decision(existing))
                conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (existing[0],))
            # A concurrent claim that inserted first makes this one wait for its
            # commit and then insert nothing: it lost.
            row = conn.execute(
                f"INSERT INTO {self.table}"
                " (kind, execution_id, checkpoint_id, approved, actor, reason)"
                " VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (kind, execution_id, checkpoint_id) DO NOTHING"
                f" RETURNING {_COLUMNS}",
                (*key, approved, actor, reason),
            ).fetchone()
            if row is not None:
                return Claim(won=True, decision=_decision(row))
            winner = conn.execute(
                f"SELECT {_COLUMNS} FROM {self.table}"
                " WHERE kind = %s AND execution_id = %s AND checkpoint_id = %s",
                key,
            ).fetchone()
        if winner is None:
            # The winner was itself taken over and released in between: try again.
            return self.claim(
                kind=kind,
                execution_id=execution_id,
                checkpoint_id=checkpoint_id,
                approved=approved,
                actor=actor,
                reason=reason,
                still_pending=still_pending,
            )
        return Claim(won=False, decision=_decision(winner))

    def finish(self, decision_id: int, outcome: str, detail: str | None) -> Decision:
        with self._pool.connection() as conn:
            row = conn.execute(
                f"UPDATE {self.table} SET outcome = %s, detail = %s,"
                f" finished_at = clock_timestamp() WHERE id = %s RETURNING {_COLUMNS}",
                (outcome, detail, decision_id),
            ).fetchone()
        if row is None:
            raise LookupError(f"decision {decision_id} is gone from {self.table}")
        return _decision(row)

    def release(self, decision_id: int) -> None:
        with self._pool.connection() as conn:
            conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (decision_id,))

    def list_for_run(self, execution_id: str) -> tuple[Decision, ...]:
        with self._pool.connection() as conn:
            if conn.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()[0] is None:
                return ()  # read-only and never written: nothing decided here yet
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM {self.table} WHERE execution_id = %s"
                " ORDER BY decided_at ASC, id ASC",
                (execution_id,),
            ).fetchall()
        return tuple(_decision(r) for r in rows)

    def close(self) -> None:
        self._pool.close()
