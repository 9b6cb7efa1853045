"""The decision record: who approved, rejected or resumed what, and how it ended.

It lives in a table of the app's own (``localui_decisions``) inside the store's
database, never in the SDK's tables, so it travels with the store and outlives
pruned checkpoints and disabled traces. It is also the app's lock: a decision is
claimed by inserting its row, and the unique key ``(kind, execution_id,
checkpoint_id)`` lets exactly one claim win across threads and processes,
before the SDK is asked to do anything.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, TypeVar

from localui.errors import Unavailable

T = TypeVar("T")

APPROVAL = "approval"
RESUME = "resume"

#: A claim whose row has no outcome after this long, while the SDK's pending row
#: is still there, was left by a process that died before it reached the SDK:
#: the next person may take it over. The SDK's own claim follows ours within
#: milliseconds, so a live claim is never this old with its pending row intact.
ABANDONED_AFTER_SECONDS = 30.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS localui_decisions (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    kind          TEXT NOT NULL,
    execution_id  TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    approved      INTEGER,
    actor         TEXT NOT NULL,
    reason        TEXT NOT NULL DEFAULT '',
    decided_at    TEXT NOT NULL,
    outcome       TEXT,
    detail        TEXT,
    finished_at   TEXT,
    UNIQUE (kind, execution_id, checkpoint_id)
)
"""
INDEX = (
    "CREATE INDEX IF NOT EXISTS localui_decisions_run"
    " ON localui_decisions (execution_id, decided_at)"
)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True, slots=True)
class Decision:
    """One recorded decision. ``outcome`` is None while the SDK is still working on it."""

    id: int
    kind: str
    execution_id: str
    checkpoint_id: str
    approved: bool | None
    actor: str
    reason: str
    decided_at: str
    outcome: str | None
    detail: str | None
    finished_at: str | None

    @property
    def verb(self) -> str:
        if self.kind == RESUME:
            return "resumed"
        return "approved" if self.approved else "rejected"


@dataclass(frozen=True, slots=True)
class Claim:
    """The outcome of trying to claim: ``won`` with our row, or the row that beat us."""

    won: bool
    decision: Decision


class DecisionLog(Protocol):
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
    ) -> Claim: ...

    def finish(self, decision_id: int, outcome: str, detail: str | None) -> Decision: ...

    def release(self, decision_id: int) -> None:
        """Delete a claim that never reached the SDK, so the pause can be decided again."""
        ...

    def list_for_run(self, execution_id: str) -> tuple[Decision, ...]: ...

    def close(self) -> None: ...


_COLUMNS = (
    "id, kind, execution_id, checkpoint_id, approved, actor, reason, decided_at,"
    " outcome, detail, finished_at"
)


def _decision(row: tuple[object, ...]) -> Decision:
    approved = row[4]
    return Decision(
        id=int(str(row[0])),
        kind=str(row[1]),
        execution_id=str(row[2]),
        checkpoint_id=str(row[3]),
        approved=None if approved is None else bool(approved),
        actor=str(row[5]),
        reason=str(row[6] or ""),
        decided_at=str(row[7]),
        outcome=None if row[8] is None else str(row[8]),
        detail=None if row[9] is None else str(row[9]),
        finished_at=None if row[10] is None else str(row[10]),
    )


class SQLiteDecisionLog:
    """The decision table inside the SQLite store file, on a connection of its own."""

    def __init__(self, path: str | Path, *, writable: bool = True, busy_timeout: float = 10.0):
        self.path = Path(path)
        self.writable = writable
        self._lock = threading.Lock()
        mode = "rw" if writable else "ro"
        self._conn = sqlite3.connect(
            f"file:{self.path.resolve()}?mode={mode}",
            uri=True,
            timeout=busy_timeout,
            check_same_thread=False,
            isolation_level=None,
        )
        if writable:
            self._with_retry(self._create)

    def _create(self) -> None:
        self._conn.execute(SCHEMA)
        self._conn.execute(INDEX)

    def _with_retry(self, fn: Callable[[], T], *, budget: float = 10.0) -> T:
        """Run ``fn``, waiting out "database is locked" for a bounded time."""
        deadline = time.monotonic() + budget
        delay = 0.02
        while True:
            try:
                with self._lock:
                    return fn()
            except sqlite3.OperationalError as exc:
                busy = "locked" in str(exc) or "busy" in str(exc)
                if not busy or time.monotonic() > deadline:
                    raise Unavailable(f"the decision record cannot be written: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.25)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock up front, so two claimers never both read
        # "no row" and race to insert.
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            # SQLite may have rolled back already (an I/O error does).
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        else:
            self._conn.execute("COMMIT")

    def _get(self, kind: str, execution_id: str, checkpoint_id: str) -> Decision | None:
        row = self._conn.execute(
            f"SELECT {_COLUMNS} FROM localui_decisions"
            " WHERE kind = ? AND execution_id = ? AND checkpoint_id = ?",
            (kind, execution_id, checkpoint_id),
        ).fetchone()
        return _decision(row) if row is not None else None

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
        def attempt() -> Claim:
            with self._transaction() as conn:
                existing = self._get(kind, execution_id, checkpoint_id)
                if existing is not None:
                    if not _abandoned(existing) or not still_pending():
                        return Claim(won=False, decision=existing)
                    conn.execute("DELETE FROM localui_decisions WHERE id = ?", (existing.id,))
                cursor = conn.execute(
                    "INSERT INTO localui_decisions"
                    " (kind, execution_id, checkpoint_id, approved, actor, reason, decided_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        kind,
                        execution_id,
                        checkpoint_id,
                        None if approved is None else int(approved),
                        actor,
                        reason,
                        now_iso(),
                    ),
                )
                row = conn.execute(
                    f"SELECT {_COLUMNS} FROM localui_decisions WHERE id = ?",
                    (cursor.lastrowid,),
                ).fetchone()
                return Claim(won=True, decision=_decision(row))

        return self._with_retry(attempt)

    def finish(self, decision_id: int, outcome: str, detail: str | None) -> Decision:
        def attempt() -> Decision:
            with self._transaction() as conn:
                conn.execute(
                    "UPDATE localui_decisions SET outcome = ?, detail = ?, finished_at = ?"
                    " WHERE id = ?",
                    (outcome, detail, now_iso(), decision_id),
                )
                row = conn.execute(
                    f"SELECT {_COLUMNS} FROM localui_decisions WHERE id = ?", (decision_id,)
                ).fetchone()
            return _decision(row)

        return self._with_retry(attempt)

    def release(self, decision_id: int) -> None:
        def attempt() -> None:
            with self._transaction() as conn:
                conn.execute("DELETE FROM localui_decisions WHERE id = ?", (decision_id,))

        self._with_retry(attempt)

    def list_for_run(self, execution_id: str) -> tuple[Decision, ...]:
        def read() -> tuple[Decision, ...]:
            try:
                rows = self._conn.execute(
                    f"SELECT {_COLUMNS} FROM localui_decisions WHERE execution_id = ?"
                    " ORDER BY decided_at ASC, id ASC",
                    (execution_id,),
                ).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return ()
                raise
            return tuple(_decision(r) for r in rows)

        return self._with_retry(read)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _abandoned(decision: Decision) -> bool:
    if decision.outcome is not None:
        return False
    try:
        started = datetime.fromisoformat(decision.decided_at)
    except ValueError:
        return False
    return (datetime.now(UTC) - started).total_seconds() > ABANDONED_AFTER_SECONDS
