"""The decision record in the SQLite store file (``localui.backends.decisions``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from localui.backends.decisions import (
    ABANDONED_AFTER_SECONDS,
    ADDED_COLUMNS,
    ADDED_VOTE_COLUMNS,
    AGENT_COLUMN,
    COLUMNS,
    COMPLETED_BY_DECISION,
    DECISION_SOURCE,
    PENDING_OUTCOME,
    TABLE,
    VOTE_COLUMNS,
    VOTE_OUTCOME,
    VOTE_SOURCE,
    VOTES_TABLE,
    abandoned,
    agent_lookup,
    agent_sql,
    columns_of,
    cursor_position,
    decision_from_row,
    export_select,
    keyset_sql,
    listing_sources,
    merged_export,
    merged_page,
    metadata_to_text,
    now_iso,
    vote_as_decision,
    vote_from_row,
)
from localui.backends.sqlite.connect import connect, transaction, with_retry
from localui.backends.sqlite.files import file_uri
from localui.errors import Unavailable
from localui.names import same_voter
from localui.records import (
    AGAIN,
    COUNTED,
    FULL,
    Ballot,
    Claim,
    Decision,
    DecisionEntry,
    DecisionPage,
    DecisionQuery,
    ExportPage,
    Vote,
)

T = TypeVar("T")

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
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
    metadata      TEXT,
    heartbeat_at  TEXT,
    rearmed_checkpoint_id TEXT,
    agent         TEXT,
    UNIQUE (kind, execution_id, checkpoint_id)
)
"""
INDEX = f"CREATE INDEX IF NOT EXISTS {TABLE}_run ON {TABLE} (execution_id, decided_at)"
#: The record newest first, one person's record newest first, and the order decisions
#: got their outcomes (what the metrics fold in).
LISTING_INDEXES = (
    f"CREATE INDEX IF NOT EXISTS {TABLE}_time ON {TABLE} (decided_at, id)",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_actor ON {TABLE} (actor, decided_at, id)",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_finished ON {TABLE} (finished_at, id)"
    " WHERE finished_at IS NOT NULL",
)
#: The claims still being carried out, which the recovery sweep reads each poll.
OPEN_INDEX = (
    f"CREATE INDEX IF NOT EXISTS {TABLE}_open ON {TABLE} (decided_at) WHERE outcome IS NULL"
)
VOTES_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {VOTES_TABLE} (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    execution_id  TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    actor         TEXT NOT NULL,
    reason        TEXT NOT NULL DEFAULT '',
    fields        TEXT NOT NULL DEFAULT '{{}}',
    voted_at      TEXT NOT NULL,
    agent         TEXT,
    UNIQUE (execution_id, checkpoint_id, actor)
)
"""
#: The votes newest first, and one person's newest first, as the record lists them.
VOTE_LISTING_INDEXES = (
    f"CREATE INDEX IF NOT EXISTS {VOTES_TABLE}_time ON {VOTES_TABLE} (voted_at, id)",
    f"CREATE INDEX IF NOT EXISTS {VOTES_TABLE}_actor ON {VOTES_TABLE} (actor, voted_at, id)",
)


def _decision(row: sqlite3.Row) -> Decision:
    return decision_from_row(row)


def _entry(row: sqlite3.Row) -> DecisionEntry:
    return DecisionEntry(decision=_decision(row), agent=str(row["agent"]))


def _vote_entry(row: sqlite3.Row) -> DecisionEntry:
    return DecisionEntry(decision=vote_as_decision(row), agent=str(row["agent"]))


def _text_at(row: sqlite3.Row, column: str) -> Any:
    return row[column]


def listing_where(
    query: DecisionQuery, source: int = DECISION_SOURCE
) -> tuple[list[str], list[Any]]:
    """The listing's filters other than the agent, over the record as ``d`` (or the
    votes as ``v``, for ``VOTE_SOURCE``)."""
    votes = source == VOTE_SOURCE
    alias, at = ("v", "v.voted_at") if votes else ("d", "d.decided_at")
    where: list[str] = []
    params: list[Any] = []
    if query.actor is not None:
        where.append(f"{alias}.actor = ?")
        params.append(query.actor)
    if query.kind is not None and not votes:
        where.append("d.kind = ?")
        params.append(query.kind)
    if query.outcome is not None and not votes:
        # A claim the SDK has not finished yet has no outcome: it lists as pending.
        where.append("COALESCE(d.outcome, 'pending') = ?")
        params.append(query.outcome)
    if query.since is not None:
        where.append(f"{at} >= ?")
        params.append(query.since)
    if query.until is not None:
        where.append(f"{at} < ?")
        params.append(query.until)
    if query.after is not None:
        after_source, after_id = cursor_position(query.after[1])
        where.append(keyset_sql(at, f"{alias}.id", source, after_source, "?", "?"))
        params.append(query.after[0])
        if after_source == source:
            params.append(after_id)
    return where, params


class SQLiteDecisionLog:
    """The decision table inside the SQLite store file, on a connection of its own."""

    def __init__(
        self,
        path: str | Path,
        *,
        writable: bool = True,
        busy_timeout: float = 10.0,
        runs_index: Path | None = None,
        lease_seconds: float = ABANDONED_AFTER_SECONDS,
    ):
        """``runs_index``: the runs index's file, where the listing finds each run's agent."""
        self.path = Path(path)
        self._runs_index = runs_index
        self._index_attached = False
        self.writable = writable
        self.lease_seconds = lease_seconds
        self._lock = threading.Lock()
        # Read-only, it opens as the store does: immutable in a directory it cannot
        # write, where a WAL store's -shm cannot be made.
        self._conn = connect(
            self.path,
            "rw" if writable else "ro",
            timeout=busy_timeout,
            check_same_thread=False,
            isolation_level=None,
        )
        self._conn.row_factory = sqlite3.Row
        #: Whether the table is known to exist (a writable log makes it now).
        self._has_table = writable
        self._has_votes = writable
        #: The select list the table can answer: an old table a read-only log may
        #: not migrate lacks the columns added since.
        self._columns = COLUMNS
        #: Whether each table records its entries' agents (an old one a read-only log
        #: may not migrate does not: the runs index names them all).
        self._agents_recorded = writable
        self._vote_agents_recorded = writable
        if writable:
            self._with_retry(self._create)

    def _create(self) -> None:
        self._conn.execute(SCHEMA)
        present = self._present_columns()
        for column, (kind, _) in ADDED_COLUMNS.items():
            if column not in present:
                # A table made before the column existed: its old records keep NULL.
                self._conn.execute(f"ALTER TABLE {TABLE} ADD COLUMN {column} {kind}")
        self._conn.execute(INDEX)
        self._conn.execute(OPEN_INDEX)
        for statement in LISTING_INDEXES:
            self._conn.execute(statement)
        self._conn.execute(VOTES_SCHEMA)
        present = self._present_columns(VOTES_TABLE)
        for column, (kind, _) in ADDED_VOTE_COLUMNS.items():
            if column not in present:
                self._conn.execute(f"ALTER TABLE {VOTES_TABLE} ADD COLUMN {column} {kind}")
        for statement in VOTE_LISTING_INDEXES:
            self._conn.execute(statement)

    def _present_columns(self, table: str = TABLE) -> set[str]:
        return {str(r["name"]) for r in self._conn.execute(f"PRAGMA table_info({table})")}

    def _with_retry(self, fn: Callable[[], T]) -> T:
        return with_retry(fn, lock=self._lock, failure="the decision record cannot be written")

    def _get(self, kind: str, execution_id: str, checkpoint_id: str) -> Decision | None:
        row = self._conn.execute(
            f"SELECT {COLUMNS} FROM {TABLE}"
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
        metadata: Mapping[str, Any] | None = None,
        agent: str | None = None,
    ) -> Claim:
        def attempt() -> Claim:
            with transaction(self._conn) as conn:
                existing = self._get(kind, execution_id, checkpoint_id)
                if existing is not None:
                    if not abandoned(existing, self.lease_seconds) or not still_pending():
                        return Claim(won=False, decision=existing)
                    conn.execute(f"DELETE FROM {TABLE} WHERE id = ?", (existing.id,))
                cursor = conn.execute(
                    f"INSERT INTO {TABLE}"
                    " (kind, execution_id, checkpoint_id, approved, actor, reason, decided_at,"
                    " metadata, agent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        kind,
                        execution_id,
                        checkpoint_id,
                        None if approved is None else int(approved),
                        actor,
                        reason,
                        now_iso(),
                        metadata_to_text(metadata),
                        agent,
                    ),
                )
                row = conn.execute(
                    f"SELECT {COLUMNS} FROM {TABLE} WHERE id = ?",
                    (cursor.lastrowid,),
                ).fetchone()
                return Claim(won=True, decision=_decision(row))

        return self._with_retry(attempt)

    def finish(self, decision_id: int, outcome: str, detail: str | None) -> Decision:
        def attempt() -> Decision:
            with transaction(self._conn) as conn:
                conn.execute(
                    f"UPDATE {TABLE} SET outcome = ?, detail = ?, finished_at = ? WHERE id = ?",
                    (outcome, detail, now_iso(), decision_id),
                )
                row = conn.execute(
                    f"SELECT {COLUMNS} FROM {TABLE} WHERE id = ?", (decision_id,)
                ).fetchone()
            return _decision(row)

        return self._with_retry(attempt)

    def _set(self, decision_id: int, assignments: str, params: Sequence[object]) -> None:
        def attempt() -> None:
            with transaction(self._conn) as conn:
                conn.execute(
                    f"UPDATE {TABLE} SET {assignments} WHERE id = ? AND outcome IS NULL",
                    (*params, decision_id),
                )

        self._with_retry(attempt)

    def heartbeat(self, decision_id: int) -> None:
        self._set(decision_id, "heartbeat_at = ?", (now_iso(),))

    def set_rearmed(self, decision_id: int, checkpoint_id: str) -> None:
        self._set(
            decision_id, "rearmed_checkpoint_id = ?, heartbeat_at = ?", (checkpoint_id, now_iso())
        )

    def list_abandoned(self) -> tuple[Decision, ...]:
        def read() -> tuple[Decision, ...]:
            rows = self._conn.execute(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE outcome IS NULL"
                " ORDER BY decided_at ASC, id ASC"
            ).fetchall()
            found = (_decision(r) for r in rows)
            return tuple(d for d in found if abandoned(d, self.lease_seconds))

        return self._with_retry(read)

    def take_over(self, decision_id: int) -> Decision | None:
        def attempt() -> Decision | None:
            with transaction(self._conn) as conn:
                row = conn.execute(
                    f"SELECT {COLUMNS} FROM {TABLE} WHERE id = ?", (decision_id,)
                ).fetchone()
                if row is None or not abandoned(_decision(row), self.lease_seconds):
                    return None
                conn.execute(
                    f"UPDATE {TABLE} SET heartbeat_at = ? WHERE id = ?", (now_iso(), decision_id)
                )
                row = conn.execute(
                    f"SELECT {COLUMNS} FROM {TABLE} WHERE id = ?", (decision_id,)
                ).fetchone()
            return _decision(row)

        return self._with_retry(attempt)

    def release(self, decision_id: int) -> None:
        def attempt() -> None:
            with transaction(self._conn) as conn:
                conn.execute(f"DELETE FROM {TABLE} WHERE id = ?", (decision_id,))

        self._with_retry(attempt)

    def _table_exists(self) -> bool:
        if not self._has_table:
            exists = self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
            ).fetchone()
            if exists is None:
                return False  # read-only and never written: nothing decided here yet
            present = self._present_columns()
            self._columns = columns_of(present)
            self._agents_recorded = AGENT_COLUMN in present
            self._has_table = True
        return True

    def list_for_run(self, execution_id: str) -> tuple[Decision, ...]:
        def read() -> tuple[Decision, ...]:
            if not self._table_exists():
                return ()
            rows = self._conn.execute(
                f"SELECT {self._columns} FROM {TABLE} WHERE execution_id = ?"
                " ORDER BY decided_at ASC, id ASC",
                (execution_id,),
            ).fetchall()
            return tuple(_decision(r) for r in rows)

        return self._with_retry(read)

    def latest_for_runs(self, kind: str, execution_ids: Sequence[str]) -> Mapping[str, Decision]:
        wanted = list(dict.fromkeys(execution_ids))
        if not wanted:
            return {}

        def read() -> dict[str, Decision]:
            if not self._table_exists():
                return {}
            latest: dict[str, Decision] = {}
            # SQLite takes up to 32,766 parameters; a page of runs is far below that.
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                rows = self._conn.execute(
                    f"SELECT {self._columns} FROM {TABLE} WHERE kind = ?"
                    f" AND execution_id IN ({marks}) ORDER BY decided_at ASC, id ASC",
                    (kind, *chunk),
                ).fetchall()
                for row in rows:
                    latest[str(row["execution_id"])] = _decision(row)
            return latest

        return self._with_retry(read)

    def _attach_index(self) -> bool:
        """Whether the runs index is attached (as ``ix``) to read runs' agents from."""
        if self._index_attached:
            return True
        path = self._runs_index
        if path is None or not path.is_file():
            return False
        self._conn.execute("ATTACH DATABASE ? AS ix", (file_uri(path, "ro"),))
        has_runs = self._conn.execute(
            "SELECT 1 FROM ix.sqlite_master WHERE type = 'table' AND name = 'runs'"
        ).fetchone()
        if has_runs is None:
            self._conn.execute("DETACH DATABASE ix")
            return False
        self._index_attached = True
        return True

    def list_decisions(self, query: DecisionQuery) -> DecisionPage:
        def read() -> DecisionPage:
            if not self._table_exists():
                return DecisionPage(entries=(), next_key=None)
            with_agents = self._attach_index()
            if query.agent is not None and not with_agents:
                raise Unavailable(
                    "decisions are found by agent through the runs index, which is not "
                    "built yet: try again in a moment"
                )
            with_decisions, with_votes = listing_sources(query.kind, query.outcome)
            decisions = self._listing_rows(query, DECISION_SOURCE) if with_decisions else []
            votes = (
                self._listing_rows(query, VOTE_SOURCE) if with_votes and self._votes_exist() else []
            )
            return merged_page(decisions, votes, query.limit, _text_at, _entry, _vote_entry)

        return self._with_retry(read)

    def list_export(self, query: DecisionQuery) -> ExportPage:
        def read() -> ExportPage:
            if not self._table_exists():
                return ExportPage(rows=(), next_key=None)
            if not self._attach_index() and query.agent is not None:
                raise Unavailable(
                    "decisions are found by agent through the runs index, which is not "
                    "built yet: try again in a moment"
                )
            with_decisions, with_votes = listing_sources(query.kind, query.outcome)
            decisions = self._export_rows(query, DECISION_SOURCE) if with_decisions else []
            votes = (
                self._export_rows(query, VOTE_SOURCE) if with_votes and self._votes_exist() else []
            )
            return merged_export(decisions, votes, query.limit)

        return self._with_retry(read)

    def _export_rows(self, query: DecisionQuery, source: int) -> list[tuple[Any, ...]]:
        """The first ``limit + 1`` entries of one table under the query, newest first,
        as plain tuples of ``EXPORT_FIELDS``."""
        votes = source == VOTE_SOURCE
        alias, at = ("v", "voted_at") if votes else ("d", "decided_at")
        where, params = self._agent_where(query, source)
        agent = agent_sql(alias, stored=self._recorded(source), runs=self._runs())
        outcome = f"'{VOTE_OUTCOME}'" if votes else f"'{PENDING_OUTCOME}'"
        cursor = self._conn.cursor()
        # Tuples, not rows by name: the export's hot path.
        cursor.row_factory = None
        return cursor.execute(
            f"SELECT {export_select(source, alias, agent, outcome)}"
            f" FROM {VOTES_TABLE if votes else TABLE} {alias}"
            f" WHERE {' AND '.join(where) or '1'}"
            f" ORDER BY {alias}.{at} DESC, {alias}.id DESC LIMIT ?",
            (*params, query.limit + 1),
        ).fetchall()

    def _runs(self) -> str | None:
        """The runs index's table, where entries that record no agent find theirs."""
        return "ix.runs" if self._index_attached else None

    def _recorded(self, source: int) -> bool:
        """Whether the table of ``source`` records each entry's agent."""
        return self._vote_agents_recorded if source == VOTE_SOURCE else self._agents_recorded

    def _agent_where(self, query: DecisionQuery, source: int) -> tuple[list[str], list[Any]]:
        """:func:`listing_where`, with the agent's filter and (for the votes) those
        left out because their approval is listed."""
        alias = "v" if source == VOTE_SOURCE else "d"
        where, params = listing_where(query, source)
        if query.agent is not None:
            # The caller has made sure the runs index is there: entries that record no
            # agent are found by theirs.
            where.append(
                f"{agent_lookup(alias, stored=self._recorded(source), runs='ix.runs')} = ?"
            )
            params.append(query.agent)
        if source == VOTE_SOURCE:
            where.append(COMPLETED_BY_DECISION.format(table=TABLE))
        return where, params

    def _listing_rows(self, query: DecisionQuery, source: int) -> list[sqlite3.Row]:
        """The first ``limit + 1`` entries of one table under the query, newest first,
        each with its run's agent (the runs index is attached when it exists)."""
        votes = source == VOTE_SOURCE
        alias, at = ("v", "voted_at") if votes else ("d", "decided_at")
        where, params = self._agent_where(query, source)
        agent = agent_sql(alias, stored=self._recorded(source), runs=self._runs())
        if votes:
            columns, table = VOTE_COLUMNS, VOTES_TABLE
        else:
            # The record's columns as this table has them (an old table has no
            # metadata column).
            columns, table = self._columns, TABLE
        return self._conn.execute(
            f"SELECT {columns}, {agent} AS agent"
            f" FROM {table} {alias} WHERE {' AND '.join(where) or '1'}"
            f" ORDER BY {alias}.{at} DESC, {alias}.id DESC LIMIT ?",
            (*params, query.limit + 1),
        ).fetchall()

    def finished_since(self, after: tuple[str, int] | None, limit: int) -> tuple[Decision, ...]:
        def read() -> tuple[Decision, ...]:
            if not self._table_exists():
                return ()
            where, params = "finished_at IS NOT NULL", []
            if after is not None:
                where += " AND (finished_at, id) > (?, ?)"
                params = [after[0], after[1]]
            rows = self._conn.execute(
                f"SELECT {self._columns} FROM {TABLE} WHERE {where}"
                " ORDER BY finished_at, id LIMIT ?",
                (*params, limit),
            ).fetchall()
            return tuple(_decision(r) for r in rows)

        return self._with_retry(read)

    # --- votes -------------------------------------------------------------------

    def _votes(self, execution_id: str, checkpoint_id: str) -> tuple[Vote, ...]:
        rows = self._conn.execute(
            f"SELECT {VOTE_COLUMNS} FROM {VOTES_TABLE}"
            " WHERE execution_id = ? AND checkpoint_id = ? ORDER BY id",
            (execution_id, checkpoint_id),
        ).fetchall()
        return tuple(vote_from_row(r) for r in rows)

    def cast_vote(
        self,
        *,
        execution_id: str,
        checkpoint_id: str,
        actor: str,
        reason: str,
        fields_json: str,
        needed: int,
        agent: str | None = None,
    ) -> Ballot:
        def attempt() -> Ballot:
            # IMMEDIATE: one ballot at a time on the file, so the count read is the
            # count the insert adds to.
            with transaction(self._conn) as conn:
                votes = self._votes(execution_id, checkpoint_id)
                if any(same_voter(v.actor, actor) for v in votes):
                    return Ballot(AGAIN, votes)
                if len(votes) >= needed:
                    return Ballot(FULL, votes)
                conn.execute(
                    f"INSERT INTO {VOTES_TABLE}"
                    " (execution_id, checkpoint_id, actor, reason, fields, voted_at, agent)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (execution_id, checkpoint_id, actor, reason, fields_json, now_iso(), agent),
                )
                return Ballot(COUNTED, self._votes(execution_id, checkpoint_id))

        return self._with_retry(attempt)

    def withdraw_vote(self, vote_id: int) -> None:
        def attempt() -> None:
            with transaction(self._conn) as conn:
                conn.execute(f"DELETE FROM {VOTES_TABLE} WHERE id = ?", (vote_id,))

        self._with_retry(attempt)

    def _votes_exist(self) -> bool:
        if not self._has_votes:
            exists = self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (VOTES_TABLE,)
            ).fetchone()
            if exists is None:
                return False  # read-only and never voted on here
            self._vote_agents_recorded = AGENT_COLUMN in self._present_columns(VOTES_TABLE)
            self._has_votes = True
        return True

    def votes_for(
        self, pauses: Sequence[tuple[str, str]]
    ) -> Mapping[tuple[str, str], tuple[Vote, ...]]:
        wanted = list(dict.fromkeys(pauses))
        if not wanted:
            return {}

        def read() -> dict[tuple[str, str], tuple[Vote, ...]]:
            if not self._votes_exist():
                return {}
            found: dict[tuple[str, str], list[Vote]] = {}
            for start in range(0, len(wanted), 400):
                chunk = wanted[start : start + 400]
                marks = ", ".join("(?, ?)" for _ in chunk)
                rows = self._conn.execute(
                    f"SELECT {VOTE_COLUMNS} FROM {VOTES_TABLE}"
                    f" WHERE (execution_id, checkpoint_id) IN (VALUES {marks}) ORDER BY id",
                    [x for pair in chunk for x in pair],
                ).fetchall()
                for row in rows:
                    vote = vote_from_row(row)
                    found.setdefault((vote.execution_id, vote.checkpoint_id), []).append(vote)
            return {k: tuple(v) for k, v in found.items()}

        return self._with_retry(read)

    def votes_for_run(self, execution_id: str) -> tuple[Vote, ...]:
        def read() -> tuple[Vote, ...]:
            if not self._votes_exist():
                return ()
            rows = self._conn.execute(
                f"SELECT {VOTE_COLUMNS} FROM {VOTES_TABLE} WHERE execution_id = ? ORDER BY id",
                (execution_id,),
            ).fetchall()
            return tuple(vote_from_row(r) for r in rows)

        return self._with_retry(read)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
