"""The decision record on PostgreSQL: ``localui_decisions`` in a schema of the app's own.

The same record and the same lock as the SQLite log (``localui.backends.decisions``),
shared by every localui process on the database: a claim is the insert of a
row under the unique key ``(kind, execution_id, checkpoint_id)``, so one
request in one process wins, whichever process it reaches. The schema
(default ``localui``) and table are created on first use; the SDK's schema is
never touched. Times come from the server's clock, so processes on hosts whose
clocks disagree still agree on when a claim was abandoned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from localui.backends.decisions import (
    ABANDONED_AFTER_SECONDS,
    ADDED_COLUMNS,
    ADDED_VOTE_COLUMNS,
    AGENT_COLUMN,
    COLUMN_NAMES,
    COMPLETED_BY_DECISION,
    DECISION_SOURCE,
    PENDING_OUTCOME,
    TABLE,
    VOTE_COLUMN_NAMES,
    VOTE_OUTCOME,
    VOTE_SOURCE,
    VOTES_TABLE,
    agent_lookup,
    agent_sql,
    cursor_position,
    decision_from_row,
    export_select,
    keyset_sql,
    listing_sources,
    merged_export,
    merged_page,
    vote_as_decision,
    vote_from_row,
)
from localui.backends.postgres.index.schema import Tables
from localui.backends.postgres.pool import Pool, StaleConnection, identifier, iso, parse_instant
from localui.errors import BadRequest, Unavailable
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

#: How many times a claim starts over when the row that beat it vanished before it
#: could be read (taken over and released in between). Each round needs another
#: process to take over and release a claim within milliseconds: a few are plenty.
CLAIM_ATTEMPTS = 5

_COLUMNS = sql.SQL(", ").join(sql.Identifier(c) for c in COLUMN_NAMES)
_VOTE_COLUMNS = sql.SQL(", ").join(sql.Identifier(c) for c in VOTE_COLUMN_NAMES)


def _columns_of(present: set[str]) -> sql.Composable:
    """The select list on a table holding ``present``, which a read-only log may not
    migrate: the columns added since read as NULL."""
    return sql.SQL(", ").join(
        sql.Identifier(c)
        if c in present or c not in ADDED_COLUMNS
        else sql.SQL("NULL AS {}").format(sql.Identifier(c))
        for c in COLUMN_NAMES
    )


#: A claim's lease has run out: no outcome, and no word from its process for too long.
_ABANDONED = (
    "outcome IS NULL AND COALESCE(heartbeat_at, decided_at)"
    " < clock_timestamp() - make_interval(secs => %s)"
)


def _decision(row: dict[str, Any]) -> Decision:
    return decision_from_row(row, iso)


def _entry(row: dict[str, Any]) -> DecisionEntry:
    return DecisionEntry(decision=_decision(row), agent=str(row["agent"]))


def _vote_entry(row: dict[str, Any]) -> DecisionEntry:
    return DecisionEntry(decision=vote_as_decision(row, iso), agent=str(row["agent"]))


def _raw_at(row: dict[str, Any], column: str) -> Any:
    """The row's time as the driver reads it (a ``datetime``), which orders truly."""
    return row[column]


def _instant(name: str, value: str) -> Any:
    parsed = parse_instant(value)
    if parsed is None:
        raise BadRequest(f"{name}: {value!r} is not an instant this server understands")
    return parsed


class PostgresDecisionLog:
    """:class:`localui.backends.base.DecisionLog` in ``{schema}.localui_decisions``."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "localui",
        writable: bool = True,
        store_schema: str | None = None,
        lease_seconds: float = ABANDONED_AFTER_SECONDS,
    ) -> None:
        """``store_schema``: the SDK schema whose runs index (in ``schema``) names each
        decision's agent in the listing."""
        self.lease_seconds = lease_seconds
        self.schema = identifier(schema, "--pg-app-schema")
        self._runs = (
            Tables(app_schema=self.schema, store_schema=store_schema) if store_schema else None
        )
        #: The table's name as ``to_regclass`` and messages read it.
        self.table = f"{self.schema}.{TABLE}"
        self._table = sql.Identifier(self.schema, TABLE)
        self._votes = sql.Identifier(self.schema, VOTES_TABLE)
        self.writable = writable
        privileges = (
            f"localui keeps its decisions in {self.table}: it needs CREATE on the database"
            f" or on schema {self.schema}, or that table made for it with SELECT, INSERT,"
            " UPDATE and DELETE"
            if writable
            else f"a read-only localui shows decisions with USAGE on schema {self.schema}"
            f" and SELECT on {self.table} and {self.schema}.{VOTES_TABLE}"
        )
        #: Whether the table is known to exist (a writable log makes it now).
        self._has_table = writable
        self._has_votes = writable
        #: The select list the table can answer (see ``_table_exists``).
        self._columns: sql.Composable = _COLUMNS
        #: Whether each table records its entries' agents (an old one a read-only log
        #: may not migrate does not: the runs index names them all).
        self._agents_recorded = writable
        self._vote_agents_recorded = writable
        self._pool = Pool(
            dsn, name="localui-decisions", read_only=not writable, privileges=privileges
        )
        # Reads of a run's decisions come on every run page: one round trip each, on
        # connections not checked when borrowed (a read may simply be tried again).
        self._reads = Pool(
            dsn,
            name="localui-decisions-read",
            read_only=True,
            max_size=2,
            privileges=privileges,
            check_on_borrow=False,
            # The pool above has just reached the server.
            probe=False,
        )
        if writable:
            try:
                self._create()
            except BaseException:
                self._pool.close()
                self._reads.close()
                raise

    def _sql(self, text: str) -> sql.Composed:
        """``text`` with ``{table}``, ``{columns}``, ``{votes}`` and ``{vote_columns}``
        filled in as quoted identifiers."""
        return sql.SQL(text).format(
            table=self._table, columns=self._columns, votes=self._votes, vote_columns=_VOTE_COLUMNS
        )

    def _create_votes(self, conn: Any) -> None:
        conn.execute(
            self._sql(
                """CREATE TABLE IF NOT EXISTS {votes} (
                id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                execution_id  TEXT NOT NULL,
                checkpoint_id TEXT NOT NULL,
                actor         TEXT NOT NULL,
                reason        TEXT NOT NULL DEFAULT '',
                fields        TEXT NOT NULL DEFAULT '{{}}',
                voted_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                agent         TEXT,
                UNIQUE (execution_id, checkpoint_id, actor)
            )"""
            )
        )
        present = self._present_columns(conn, VOTES_TABLE)
        for column, (_, kind) in ADDED_VOTE_COLUMNS.items():
            if column not in present:
                # A votes table made before the column existed: old votes keep NULL.
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                        self._votes, sql.Identifier(column), sql.SQL(kind)
                    )
                )
        # The votes newest first, and one person's newest first, as the record lists them.
        for suffix, columns in (("time", "(voted_at, id)"), ("actor", "(actor, voted_at, id)")):
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} " + columns).format(
                    sql.Identifier(f"{VOTES_TABLE}_{suffix}"), self._votes
                )
            )

    def _create(self) -> None:
        """Schema, table and index, each only when missing: a role that was given an
        existing schema needs no CREATE on the database."""
        with self._pool.connection() as conn:
            # Two processes starting together would race on the catalog.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
            exists = conn.execute("SELECT to_regclass(%s)", (self._regclass(),)).fetchone()[0]
            if exists is not None:
                present = self._present_columns(conn)
                for column, (_, kind) in ADDED_COLUMNS.items():
                    if column not in present:
                        # A table made before the column existed: old records keep NULL.
                        conn.execute(
                            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                                self._table, sql.Identifier(column), sql.SQL(kind)
                            )
                        )
                self._create_open_index(conn)
                self._create_listing_indexes(conn)
                # The votes table came later than the decisions: made beside them now.
                self._create_votes(conn)
                return
            has_schema = conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)
            ).fetchone()
            if has_schema is None:
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
            conn.execute(
                self._sql(
                    """CREATE TABLE {table} (
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
                    metadata      JSONB,
                    heartbeat_at  TIMESTAMPTZ,
                    rearmed_checkpoint_id TEXT,
                    agent         TEXT,
                    UNIQUE (kind, execution_id, checkpoint_id)
                )"""
                )
            )
            conn.execute(
                sql.SQL("CREATE INDEX {} ON {} (execution_id, decided_at)").format(
                    sql.Identifier(f"{TABLE}_run"), self._table
                )
            )
            self._create_listing_indexes(conn)
            self._create_open_index(conn)

    def _create_listing_indexes(self, conn: Any) -> None:
        """The record newest first, one person's newest first, and the order decisions
        got their outcomes (what the metrics fold in); each only when missing."""
        for suffix, columns in (
            ("time", "(decided_at, id)"),
            ("actor", "(actor, decided_at, id)"),
            ("finished", "(finished_at, id) WHERE finished_at IS NOT NULL"),
        ):
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} " + columns).format(
                    sql.Identifier(f"{TABLE}_{suffix}"), self._table
                )
            )
        self._create_votes(conn)

    def _create_open_index(self, conn: Any) -> None:
        """The claims still being carried out, which the recovery sweep reads each poll."""
        conn.execute(
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS {} ON {} (decided_at) WHERE outcome IS NULL"
            ).format(sql.Identifier(f"{TABLE}_open"), self._table)
        )

    def _present_columns(self, conn: Any, table: str = TABLE) -> set[str]:
        rows = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s)"
            " AND attnum > 0 AND NOT attisdropped",
            (self._regclass(table),),
        ).fetchall()
        return {str(r["attname"] if isinstance(r, dict) else r[0]) for r in rows}

    def _regclass(self, table: str = TABLE) -> str:
        """The table as ``to_regclass`` parses it: quoted, so the name is taken as is."""
        return sql.Identifier(self.schema, table).as_string()

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
        from psycopg.rows import dict_row

        key = (kind, execution_id, checkpoint_id)
        for _ in range(CLAIM_ATTEMPTS):
            with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                existing = cur.execute(
                    self._sql(
                        "SELECT {columns}, " + _ABANDONED + " AS abandoned"
                        " FROM {table} WHERE kind = %s AND execution_id = %s"
                        " AND checkpoint_id = %s FOR UPDATE"
                    ),
                    (self.lease_seconds, *key),
                ).fetchone()
                if existing is not None:
                    if not existing["abandoned"] or not still_pending():
                        return Claim(won=False, decision=_decision(existing))
                    cur.execute(self._sql("DELETE FROM {table} WHERE id = %s"), (existing["id"],))
                # A concurrent claim that inserted first makes this one wait for its
                # commit and then insert nothing: it lost.
                row = cur.execute(
                    self._sql(
                        "INSERT INTO {table}"
                        " (kind, execution_id, checkpoint_id, approved, actor, reason, metadata,"
                        " agent) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                        " ON CONFLICT (kind, execution_id, checkpoint_id) DO NOTHING"
                        " RETURNING {columns}"
                    ),
                    (
                        *key,
                        approved,
                        actor,
                        reason,
                        None if metadata is None else Jsonb(dict(metadata)),
                        agent,
                    ),
                ).fetchone()
                if row is not None:
                    return Claim(won=True, decision=_decision(row))
                winner = cur.execute(
                    self._sql(
                        "SELECT {columns} FROM {table}"
                        " WHERE kind = %s AND execution_id = %s AND checkpoint_id = %s"
                    ),
                    key,
                ).fetchone()
            if winner is not None:
                return Claim(won=False, decision=_decision(winner))
            # The winner was itself taken over and released in between: try again.
        raise Unavailable(
            f"the claim on {execution_id} changed hands {CLAIM_ATTEMPTS} times while being"
            " made; try again"
        )

    def finish(self, decision_id: int, outcome: str, detail: str | None) -> Decision:
        from psycopg.rows import dict_row

        with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                self._sql(
                    "UPDATE {table} SET outcome = %s, detail = %s,"
                    " finished_at = clock_timestamp() WHERE id = %s RETURNING {columns}"
                ),
                (outcome, detail, decision_id),
            ).fetchone()
        if row is None:
            raise LookupError(f"decision {decision_id} is gone from {self.table}")
        return _decision(row)

    def heartbeat(self, decision_id: int) -> None:
        with self._pool.connection() as conn:
            conn.execute(
                self._sql(
                    "UPDATE {table} SET heartbeat_at = clock_timestamp()"
                    " WHERE id = %s AND outcome IS NULL"
                ),
                (decision_id,),
            )

    def set_rearmed(self, decision_id: int, checkpoint_id: str) -> None:
        with self._pool.connection() as conn:
            conn.execute(
                self._sql(
                    "UPDATE {table} SET rearmed_checkpoint_id = %s,"
                    " heartbeat_at = clock_timestamp() WHERE id = %s AND outcome IS NULL"
                ),
                (checkpoint_id, decision_id),
            )

    def list_abandoned(self) -> tuple[Decision, ...]:
        from psycopg.rows import dict_row

        with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                self._sql(
                    "SELECT {columns} FROM {table} WHERE "
                    + _ABANDONED
                    + " ORDER BY decided_at ASC, id ASC"
                ),
                (self.lease_seconds,),
            ).fetchall()
        return tuple(_decision(r) for r in rows)

    def take_over(self, decision_id: int) -> Decision | None:
        from psycopg.rows import dict_row

        # One UPDATE that only matches while the lease is out: of processes that try
        # together, the first to lock the row wins and the others match nothing.
        with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                self._sql(
                    "UPDATE {table} SET heartbeat_at = clock_timestamp()"
                    " WHERE id = %s AND " + _ABANDONED + " RETURNING {columns}"
                ),
                (decision_id, self.lease_seconds),
            ).fetchone()
        return None if row is None else _decision(row)

    def release(self, decision_id: int) -> None:
        with self._pool.connection() as conn:
            conn.execute(self._sql("DELETE FROM {table} WHERE id = %s"), (decision_id,))

    def _table_exists(self, cur: Any) -> bool:
        if not self._has_table:
            found = cur.execute("SELECT to_regclass(%s) AS t", (self._regclass(),)).fetchone()
            if found["t"] is not None:
                present = self._present_columns(cur)
                self._columns = _columns_of(present)
                self._agents_recorded = AGENT_COLUMN in present
            self._has_table = found["t"] is not None
        return self._has_table

    def list_for_run(self, execution_id: str) -> tuple[Decision, ...]:
        import psycopg

        try:
            return self._list_for_run(execution_id)
        except StaleConnection:
            # The pool has dropped its dead connections: once more on a fresh one.
            return self._list_for_run(execution_id)
        except psycopg.errors.UndefinedTable:
            # Dropped since it was seen: nothing decided here, until it is made again.
            self._has_table = False
            return ()

    def _list_for_run(self, execution_id: str) -> tuple[Decision, ...]:
        from psycopg.rows import dict_row

        with self._reads.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            if not self._table_exists(cur):
                return ()  # read-only and never written: nothing decided here yet
            rows = cur.execute(
                self._sql(
                    "SELECT {columns} FROM {table} WHERE execution_id = %s"
                    " ORDER BY decided_at ASC, id ASC"
                ),
                (execution_id,),
            ).fetchall()
        return tuple(_decision(r) for r in rows)

    def latest_for_runs(self, kind: str, execution_ids: Sequence[str]) -> Mapping[str, Decision]:
        wanted = list(dict.fromkeys(execution_ids))
        if not wanted:
            return {}
        try:
            return self._latest_for_runs(kind, wanted)
        except StaleConnection:
            # The pool has dropped its dead connections: once more on a fresh one.
            return self._latest_for_runs(kind, wanted)

    def _latest_for_runs(self, kind: str, wanted: list[str]) -> Mapping[str, Decision]:
        from psycopg.rows import dict_row

        # On the connections not checked when lent: a runs list asks on every page.
        with self._reads.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            if not self._table_exists(cur):
                return {}  # read-only and never written: nothing decided here yet
            rows = cur.execute(
                self._sql(
                    "SELECT DISTINCT ON (execution_id) {columns} FROM {table}"
                    " WHERE kind = %s AND execution_id = ANY(%s)"
                    " ORDER BY execution_id, decided_at DESC, id DESC"
                ),
                (kind, wanted),
            ).fetchall()
        return {str(r["execution_id"]): _decision(r) for r in rows}

    def _runs_table(self, cur: Any) -> str | None:
        """The runs index's table, when there is one to read agents from."""
        if self._runs is None:
            return None
        found = cur.execute("SELECT to_regclass(%s) AS t", (self._runs.runs,)).fetchone()
        return self._runs.runs if found["t"] is not None else None

    def list_decisions(self, query: DecisionQuery) -> DecisionPage:
        from psycopg.rows import dict_row

        with self._reads.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            if not self._table_exists(cur):
                return DecisionPage(entries=(), next_key=None)
            runs = self._runs_table(cur)
            if query.agent is not None and runs is None:
                raise Unavailable(
                    "decisions are found by agent through the runs index, which this "
                    "localui does not keep (it is read-only): serve without --read-only once"
                )
            with_decisions, with_votes = listing_sources(query.kind, query.outcome)
            decisions = (
                self._listing_rows(cur, query, DECISION_SOURCE, runs) if with_decisions else []
            )
            votes: list[dict[str, Any]] = []
            if with_votes and self._votes_exist(cur):
                votes = self._listing_rows(cur, query, VOTE_SOURCE, runs)
        return merged_page(decisions, votes, query.limit, _raw_at, _entry, _vote_entry)

    def _recorded(self, source: int) -> bool:
        """Whether the table of ``source`` records each entry's agent."""
        return self._vote_agents_recorded if source == VOTE_SOURCE else self._agents_recorded

    def _votes_exist(self, cur: Any) -> bool:
        if not self._has_votes:
            found = cur.execute("SELECT to_regclass(%s) AS t", (self._votes.as_string(),))
            self._has_votes = found.fetchone()["t"] is not None
            if self._has_votes:
                present = self._present_columns(cur, VOTES_TABLE)
                self._vote_agents_recorded = AGENT_COLUMN in present
        return self._has_votes

    def list_export(self, query: DecisionQuery) -> ExportPage:
        from psycopg.rows import dict_row

        with self._reads.connection() as conn:
            with conn.cursor(row_factory=dict_row) as named:
                if not self._table_exists(named):
                    return ExportPage(rows=(), next_key=None)
                runs = self._runs_table(named)
                with_decisions, with_votes = listing_sources(query.kind, query.outcome)
                with_votes = with_votes and self._votes_exist(named)
            if query.agent is not None and runs is None:
                raise Unavailable(
                    "decisions are found by agent through the runs index, which this "
                    "localui does not keep (it is read-only): serve without --read-only once"
                )
            # Tuples, not rows by name: the export's hot path.
            with conn.cursor() as cur:
                decisions = (
                    self._export_rows(cur, query, DECISION_SOURCE, runs) if with_decisions else []
                )
                votes = self._export_rows(cur, query, VOTE_SOURCE, runs) if with_votes else []
        return merged_export(decisions, votes, query.limit, iso)

    def _export_rows(
        self, cur: Any, query: DecisionQuery, source: int, runs: str | None
    ) -> list[tuple[Any, ...]]:
        """The first ``limit + 1`` entries of one table under the query, newest first,
        as plain tuples of ``EXPORT_FIELDS`` (times as the driver reads them)."""
        votes = source == VOTE_SOURCE
        alias, at = ("v", "voted_at") if votes else ("d", "decided_at")
        where, params = self._listing_where(query, source, runs)
        params["outcome_of"] = VOTE_OUTCOME if votes else PENDING_OUTCOME
        agent = agent_sql(alias, stored=self._recorded(source), runs=runs)
        cur.execute(
            self._sql(
                f"SELECT {export_select(source, alias, agent, '%(outcome_of)s')}"
                f" FROM {'{votes}' if votes else '{table}'} {alias}"
                f" WHERE {' AND '.join(where) or 'true'}"
                f" ORDER BY {alias}.{at} DESC, {alias}.id DESC LIMIT %(n)s"
            ),
            params,
        )
        return list(cur.fetchall())

    def _listing_where(
        self, query: DecisionQuery, source: int, runs: str | None
    ) -> tuple[list[str], dict[str, Any]]:
        """The listing's filters over the decisions as ``d`` or the votes as ``v``, with
        the parameters they name (``n``: one more than the page)."""
        votes = source == VOTE_SOURCE
        alias, at = ("v", "voted_at") if votes else ("d", "decided_at")
        where: list[str] = []
        params: dict[str, Any] = {"n": query.limit + 1}
        if query.actor is not None:
            where.append(f"{alias}.actor = %(actor)s")
            params["actor"] = query.actor
        if query.kind is not None and not votes:
            where.append("d.kind = %(kind)s")
            params["kind"] = query.kind
        if query.outcome is not None and not votes:
            # A claim the SDK has not finished yet has no outcome: it lists as pending.
            where.append("COALESCE(d.outcome, %(pending)s) = %(outcome)s")
            params.update(outcome=query.outcome, pending=PENDING_OUTCOME)
        if query.since is not None:
            where.append(f"{alias}.{at} >= %(since)s")
            params["since"] = _instant("since", query.since)
        if query.until is not None:
            where.append(f"{alias}.{at} < %(until)s")
            params["until"] = _instant("until", query.until)
        if query.after is not None:
            after_source, after_id = cursor_position(query.after[1])
            where.append(
                keyset_sql(
                    f"{alias}.{at}",
                    f"{alias}.id",
                    source,
                    after_source,
                    "%(after_at)s",
                    "%(after_id)s",
                )
            )
            params.update(after_at=_instant("after", query.after[0]), after_id=after_id)
        if query.agent is not None and runs is not None:
            # Entries that record no agent are found by the runs index's.
            lookup = agent_lookup(alias, stored=self._recorded(source), runs=runs)
            where.append(f"{lookup} = %(agent)s")
            params["agent"] = query.agent
        if votes:
            where.append(COMPLETED_BY_DECISION.format(table="{table}"))
        return where, params

    def _listing_rows(
        self, cur: Any, query: DecisionQuery, source: int, runs: str | None
    ) -> list[dict[str, Any]]:
        """The first ``limit + 1`` entries of one table under the query, newest first,
        each with its run's agent from the runs index when there is one."""
        votes = source == VOTE_SOURCE
        alias, at = ("v", "voted_at") if votes else ("d", "decided_at")
        where, params = self._listing_where(query, source, runs)
        agent = agent_sql(alias, stored=self._recorded(source), runs=runs)
        if votes:
            columns, table = "{vote_columns}", "{votes}"
        else:
            # The record's columns as this table has them (an old table has no
            # metadata column).
            columns, table = "{columns}", "{table}"
        cur.execute(
            self._sql(
                f"SELECT {columns}, {agent} AS agent"
                f" FROM {table} {alias} WHERE {' AND '.join(where) or 'true'}"
                f" ORDER BY {alias}.{at} DESC, {alias}.id DESC LIMIT %(n)s"
            ),
            params,
        )
        return list(cur.fetchall())

    def finished_since(self, after: tuple[str, int] | None, limit: int) -> tuple[Decision, ...]:
        from psycopg.rows import dict_row

        with self._reads.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            if not self._table_exists(cur):
                return ()
            where, params = "finished_at IS NOT NULL", [limit]
            if after is not None:
                where += " AND (finished_at, id) > (%s, %s)"
                params = [_instant("after", after[0]), after[1], limit]
            rows = cur.execute(
                self._sql(
                    f"SELECT {{columns}} FROM {{table}} WHERE {where}"
                    " ORDER BY finished_at, id LIMIT %s"
                ),
                params,
            ).fetchall()
        return tuple(_decision(r) for r in rows)

    # --- votes -------------------------------------------------------------------

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
        from psycopg.rows import dict_row

        key = (execution_id, checkpoint_id)
        select = self._sql(
            "SELECT {vote_columns} FROM {votes}"
            " WHERE execution_id = %s AND checkpoint_id = %s ORDER BY id"
        )
        with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            # One ballot at a time per pause, in every process: the count read is the
            # count the insert adds to, so exactly one vote completes it.
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))",
                (f"{self.schema}.{VOTES_TABLE}:{execution_id}:{checkpoint_id}",),
            )
            votes = tuple(vote_from_row(r, iso) for r in cur.execute(select, key).fetchall())
            if any(same_voter(v.actor, actor) for v in votes):
                return Ballot(AGAIN, votes)
            if len(votes) >= needed:
                return Ballot(FULL, votes)
            cur.execute(
                self._sql(
                    "INSERT INTO {votes}"
                    " (execution_id, checkpoint_id, actor, reason, fields, agent)"
                    " VALUES (%s, %s, %s, %s, %s, %s)"
                ),
                (*key, actor, reason, fields_json, agent),
            )
            votes = tuple(vote_from_row(r, iso) for r in cur.execute(select, key).fetchall())
        return Ballot(COUNTED, votes)

    def withdraw_vote(self, vote_id: int) -> None:
        with self._pool.connection() as conn:
            conn.execute(self._sql("DELETE FROM {votes} WHERE id = %s"), (vote_id,))

    def _read_votes(self, text: str, params: tuple[Any, ...]) -> list[Vote]:
        import psycopg
        from psycopg.rows import dict_row

        try:
            with self._reads.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                # Asked until the table is there (a read-only process never makes it);
                # then a run page or a queue page reads its votes in one statement.
                if not self._votes_exist(cur):
                    return []  # read-only and never voted on here
                rows = cur.execute(self._sql(text), params).fetchall()
        except psycopg.errors.UndefinedTable:
            # Dropped since it was seen: a read-only log asks again next time.
            self._has_votes = self.writable
            return []
        return [vote_from_row(r, iso) for r in rows]

    def votes_for(
        self, pauses: Sequence[tuple[str, str]]
    ) -> Mapping[tuple[str, str], tuple[Vote, ...]]:
        wanted = list(dict.fromkeys(pauses))
        if not wanted:
            return {}
        found: dict[tuple[str, str], list[Vote]] = {}
        votes = self._read_votes(
            "SELECT {vote_columns} FROM {votes} WHERE (execution_id, checkpoint_id) IN"
            " (SELECT * FROM unnest(%s::text[], %s::text[])) ORDER BY id",
            ([p[0] for p in wanted], [p[1] for p in wanted]),
        )
        for vote in votes:
            found.setdefault((vote.execution_id, vote.checkpoint_id), []).append(vote)
        return {k: tuple(v) for k, v in found.items()}

    def votes_for_run(self, execution_id: str) -> tuple[Vote, ...]:
        return tuple(
            self._read_votes(
                "SELECT {vote_columns} FROM {votes} WHERE execution_id = %s ORDER BY id",
                (execution_id,),
            )
        )

    def close(self) -> None:
        self._reads.close()
        self._pool.close()
