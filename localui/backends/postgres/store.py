"""The PostgreSQL store: the SDK's ``PostgresCheckpointer`` tables, read through a pool.

Same protocol and the same answers as the SQLite store on the same runs. What
differs is the SQL: ``created_at`` is ``TIMESTAMPTZ`` (read back in UTC and
handed on as the ISO text the SQLite store holds, so cursors round-trip), the
JSON columns are ``JSONB`` (read as text and parsed by the same function, so
the raw view shows what the server returns), ``synced`` is a boolean. There is
no rowid: rows written in the same microsecond are ordered by ``node_index``,
which is how the SDK's ``PostgresCheckpointer.list`` orders them, and then by
checkpoint id, so every page is deterministic.

Every read runs in a ``READ ONLY`` transaction under a statement timeout, and
the tables are named with the schema, never through ``search_path``. The
schema's shape is read on open and again when it changes under us (an older
SDK's store gains columns when a newer SDK connects).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from localui import runs
from localui.backends import shared
from localui.backends.postgres.index import (
    BACKGROUND_FROM_ROWS,
    BUILD_CHUNK_ROWS,
    PgRunIndex,
    StoreSql,
)
from localui.backends.postgres.pool import (
    Pool,
    StaleConnection,
    cutoff_instant,
    identifier,
    iso,
    parse_instant,
    table,
)
from localui.backends.shared import STATE_SQL, Page, like
from localui.backends.urls import redact
from localui.errors import BadRequest, StoreMissing, Unavailable
from localui.records import (
    FORK_ORIGIN_NODE,
    RUN_END_STEP,
    AttentionCounts,
    AttentionPage,
    AttentionQuery,
    CacheEntry,
    CachePage,
    FleetCounts,
    ForkLink,
    IndexProgress,
    PausedCall,
    Pending,
    PendingPage,
    PrunePreview,
    RowDetail,
    RowHeader,
    RunFacts,
    RunFactsPage,
    RunQuery,
    StoreTotals,
    parse_json,
    row_detail,
)

T = TypeVar("T")

#: Newest first, as ``PostgresCheckpointer.get_last`` and ``list`` agree on it.
NEWEST_FIRST = "created_at DESC, node_index DESC, checkpoint_id DESC"
OLDEST_FIRST = "created_at ASC, node_index ASC, checkpoint_id ASC"

#: How long a store without the SDK's tables (or columns) waits before looking again.
SCHEMA_RECHECK_SECONDS = 5.0

#: How much of a run's tool arguments the runs index keeps for search (as on SQLite).
MAX_TOOL_ARGS = 4000

_OPTIONAL_COLUMNS = ("parent_checkpoint_id", "agent_path", "synced", "sync_error", "step_type")


@dataclass(frozen=True, slots=True)
class _Schema:
    checkpoint_columns: frozenset[str]
    has_pending: bool
    has_cache: bool
    read_at: float

    @property
    def has_checkpoints(self) -> bool:
        return bool(self.checkpoint_columns)

    @property
    def complete(self) -> bool:
        return (
            self.has_pending
            and self.has_cache
            and all(c in self.checkpoint_columns for c in _OPTIONAL_COLUMNS)
        )

    def col(self, name: str, alias: str = "") -> str:
        """A checkpoint column as SQL, or NULL when this store predates it."""
        prefix = f"{alias}." if alias else ""
        return f"{prefix}{name}" if name in self.checkpoint_columns else "NULL"


def _run_reason_sql(s: _Schema) -> str:
    """A row's ``run_reason``: read from run-end rows only (one a run)."""
    if "step_type" not in s.checkpoint_columns:
        return "NULL::text"
    return (
        f"CASE WHEN step_type = '{RUN_END_STEP}' AND jsonb_typeof(state_snapshot) = 'object'"
        " THEN state_snapshot->>'run_reason' END"
    )


def _key_instant(key: tuple[str, str], what: str) -> Any:
    """The timestamp half of a keyset cursor; a forged one is a 400, not a server error."""
    instant = parse_instant(key[0])
    if instant is None:
        raise BadRequest(f"{what}: {key[0]!r} is not a cursor this server gave out")
    return instant


class PostgresStore:
    """:class:`localui.backends.base.Store` over one schema of a PostgreSQL database."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "fastaiagent",
        app_schema: str = "localui",
        statement_timeout: float = 5.0,
        wait_timeout: float = 2.0,
        runs_index: bool = True,
        index_background_from_rows: int = BACKGROUND_FROM_ROWS,
        index_chunk_rows: int = BUILD_CHUNK_ROWS,
    ) -> None:
        """``runs_index``: keep the runs index in ``app_schema`` (the runs list reads
        the SDK's tables directly when False, or when the role may not create it)."""
        #: The URL as given, password included: for connections, never for showing.
        self.dsn = dsn
        self.schema = identifier(schema, "--pg-schema")
        #: Where the app keeps its own table; this store never reads it, the change
        #: source (``localui.backends.postgres.changes``) watches it.
        self.app_schema = identifier(app_schema, "--pg-app-schema")
        self.location = f"{redact(dsn)} (schema {self.schema})"
        self._t = {
            "checkpoints": table(self.schema, "checkpoints"),
            "pending": table(self.schema, "pending_interrupts"),
            "cache": table(self.schema, "idempotency_cache"),
        }
        self._pool = Pool(
            dsn,
            name="localui-store",
            read_only=True,
            statement_timeout=statement_timeout,
            wait_timeout=wait_timeout,
            privileges=f"localui reads with USAGE on schema {self.schema} and SELECT on its"
            " checkpoints, pending_interrupts and idempotency_cache",
            # Reads may repeat: _run retries on a connection that outlived a restart.
            check_on_borrow=False,
        )
        self._lock = threading.Lock()
        self._schema: _Schema | None = None
        try:
            with self._read() as cur:
                cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,))
                if cur.fetchone() is None:
                    raise StoreMissing(
                        f"no schema {self.schema!r} in {redact(dsn)}: check --pg-schema "
                        "(the SDK's default is fastaiagent)"
                    )
        except Unavailable as exc:
            self._pool.close()
            raise StoreMissing(str(exc)) from exc
        except BaseException:
            self._pool.close()
            raise
        self._index: PgRunIndex | None = None
        if runs_index:
            try:
                self._index = PgRunIndex(
                    dsn,
                    store_schema=self.schema,
                    app_schema=self.app_schema,
                    store_sql=self._index_sql,
                    background_from_rows=index_background_from_rows,
                    chunk_rows=index_chunk_rows,
                )
            except Unavailable:
                # No privilege to create it: every read goes to the SDK's tables.
                self._index = None

    @property
    def runs_index(self) -> PgRunIndex | None:
        """The runs index, or None when the runs list reads the SDK's tables."""
        return self._index

    # --- connections --------------------------------------------------

    @contextmanager
    def _read(self) -> Iterator[Any]:
        """A cursor (rows as dicts) whose statements share one read-only transaction."""
        from psycopg.rows import dict_row

        with (
            self._pool.connection() as conn,
            conn.transaction(),
            conn.cursor(row_factory=dict_row) as cur,
        ):
            yield cur

    @contextmanager
    def _read_one(self) -> Iterator[Any]:
        """A cursor for a single statement: read-only by the session's default, one
        round trip instead of three."""
        from psycopg.rows import dict_row

        with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            yield cur

    def _schema_for(self, cur: Any) -> _Schema:
        schema = self._schema
        if schema is not None and (
            schema.complete or time.monotonic() - schema.read_at < SCHEMA_RECHECK_SECONDS
        ):
            return schema
        cur.execute(
            "SELECT c.relname AS table_name, a.attname AS column_name"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
            " WHERE n.nspname = %s AND c.relkind IN ('r', 'p')"
            " AND c.relname IN ('checkpoints', 'pending_interrupts', 'idempotency_cache')",
            (self.schema,),
        )
        tables: dict[str, set[str]] = {}
        for row in cur.fetchall():
            tables.setdefault(row["table_name"], set()).add(row["column_name"])
        schema = _Schema(
            checkpoint_columns=frozenset(tables.get("checkpoints", ())),
            has_pending="pending_interrupts" in tables,
            has_cache="idempotency_cache" in tables,
            read_at=time.monotonic(),
        )
        with self._lock:
            self._schema = schema
        return schema

    def _run(self, work: Callable[[Any, _Schema], T], *, statements: int = 1) -> T:
        """``work(cursor, schema)``, its ``statements`` in one read-only transaction when
        there are several; once more if the tables changed shape under it."""
        import psycopg

        reshaped = stale = 0
        while True:
            try:
                with self._read() if statements > 1 else self._read_one() as cur:
                    return work(cur, self._schema_for(cur))
            except StaleConnection:
                # The pool has dropped its dead connections: once more on a fresh one.
                stale += 1
                if stale > 1:
                    raise
            except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
                with self._lock:
                    self._schema = None
                reshaped += 1
                if reshaped > 1:
                    raise Unavailable(
                        f"the tables of schema {self.schema} at {self._pool.server} changed "
                        f"while being read: {' '.join(str(exc).split())}"
                    ) from exc

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
        self._pool.close()

    # --- runs ---------------------------------------------------------

    def _runs_sql(
        self, s: _Schema, *, one_run: bool = False, runs_where: str = "", tool_args: bool = False
    ) -> str:
        """The ``r`` CTE: one row per run with its facts; ``one_run`` binds ``%(run)s``,
        ``runs_where`` limits the runs otherwise (the runs index refolds a few), and
        ``tool_args`` adds each run's distinct tool arguments, for text search."""
        cp = self._t["checkpoints"]
        # One run's pause is looked up by its key (joined on the run's rows' key alone,
        # the planner hashes the whole pending table: 1,000 rows for one).
        one_pause = " AND p.execution_id = %(run)s" if one_run else ""
        pending_join = (
            f"LEFT JOIN {self._t['pending']} p ON p.execution_id = l.execution_id{one_pause}"
            if s.has_pending
            else "LEFT JOIN (SELECT NULL::text AS execution_id, NULL::text AS reason) p ON false"
        )
        waiting = (
            "COUNT(*) FILTER (WHERE synced = false)" if "synced" in s.checkpoint_columns else "0"
        )
        quarantined = (
            "COUNT(*) FILTER (WHERE sync_error IS NOT NULL)"
            if "sync_error" in s.checkpoint_columns
            else "0"
        )
        fork_parent = (
            f"MAX(parent_checkpoint_id) FILTER (WHERE node_id = '{FORK_ORIGIN_NODE}')"
            if "parent_checkpoint_id" in s.checkpoint_columns
            else "NULL"
        )
        # Whose run it is, as ``localui.runs.run_owner`` says: the owner the shallowest
        # ``agent_path`` names, the earliest on a tie (a team, not the member of its
        # newest row; an agent-as-tool, not the agents above it that wrote no row
        # here: ``runs.execution_owner`` strips them), else the first row's agent.
        owner = "NULL"
        # Each row's path without the agents above an agent-as-tool, made once per row
        # (``OFFSET 0`` keeps the planner from copying the expression into each of the
        # six places that read it: a regular expression each, over every row of a build).
        top_of_path = ""
        if "agent_path" in s.checkpoint_columns:
            top_of_path = (
                " CROSS JOIN LATERAL (SELECT split_part(regexp_replace(agent_path,"
                f" '{runs.ENCLOSING_AGENTS}', ''), '/', 1) AS top OFFSET 0) o"
            )
            top = "o.top"
            name = f"substr({top}, strpos({top}, ':') + 1)"
            depth = "length(agent_path) - length(replace(agent_path, '/', ''))"
            owner = (
                f"(array_agg({name} ORDER BY {depth}, {OLDEST_FIRST}) FILTER (WHERE"
                f" split_part({top}, ':', 1) IN ('agent', 'supervisor', 'swarm')"
                f" AND strpos({top}, ':') > 0 AND {name} <> ''))[1]"
            )
        where = "WHERE execution_id = %(run)s" if one_run else runs_where
        # What the SQLite index keeps of a run's tool arguments: each distinct one, in
        # order, at most MAX_TOOL_ARGS characters in all.
        args = (
            "LEFT(COALESCE(string_agg(DISTINCT node_input::text, E'\\n' ORDER BY node_input::text)"
            " FILTER (WHERE node_id LIKE '%%/tool:%%' AND node_input IS NOT NULL), ''),"
            f" {MAX_TOOL_ARGS}) AS tool_args,"
            if tool_args
            else ""
        )

        reason = _run_reason_sql(s)

        # The newest row's fields in the same pass as the counts: a second pass over
        # the same rows (``DISTINCT ON``) cost a third of a build's facts.
        def newest(column: str) -> str:
            return f"(array_agg({column} ORDER BY {NEWEST_FIRST}))[1]"

        return f"""
            WITH a AS (
                SELECT execution_id,
                       COUNT(*) AS row_count,
                       MIN(created_at) AS first_at,
                       MAX(created_at) AS last_at,
                       {fork_parent} AS fork_parent,
                       COALESCE({owner},
                                (array_agg(chain_name ORDER BY {OLDEST_FIRST}))[1]) AS agent,
                       {waiting} AS rows_waiting,
                       {args}
                       {quarantined} AS rows_quarantined,
                       {newest("checkpoint_id")} AS last_cid,
                       {newest("node_id")} AS last_node_id,
                       {
            newest(s.col("step_type")) if "step_type" in s.checkpoint_columns else "NULL::text"
        } AS step_type,
                       {newest("status")} AS status,
                       {newest(reason)} AS run_reason
                FROM {cp}{top_of_path} {where}
                GROUP BY execution_id
            ),
            r AS (
                SELECT l.execution_id, l.row_count, l.first_at, l.last_at, l.fork_parent,
                       l.agent, l.rows_waiting, {"l.tool_args," if tool_args else ""}
                       l.rows_quarantined, l.last_cid, l.last_node_id,
                       l.step_type AS last_step_type,
                       COALESCE(l.status, 'completed') AS last_status,
                       p.execution_id IS NOT NULL AS has_pending, p.reason AS pending_reason,
                       l.run_reason,
                       {STATE_SQL} AS state
                FROM a l
                {pending_join}
            )
        """

    @staticmethod
    def _facts(row: dict[str, Any]) -> RunFacts:
        return RunFacts(
            execution_id=row["execution_id"],
            agent=row["agent"] or "",
            row_count=int(row["row_count"]),
            first_at=iso(row["first_at"]),
            last_at=iso(row["last_at"]),
            last_checkpoint_id=row["last_cid"] or "",
            last_node_id=row["last_node_id"] or "",
            last_step_type=row["last_step_type"],
            last_status=row["last_status"],
            has_pending=bool(row["has_pending"]),
            pending_reason=row["pending_reason"],
            fork_parent_checkpoint_id=row["fork_parent"],
            rows_waiting=int(row["rows_waiting"] or 0),
            rows_quarantined=int(row["rows_quarantined"] or 0),
            run_reason=row["run_reason"],
        )

    def _index_sql(self) -> StoreSql | None:
        """How the runs index reads the SDK's tables as they are now (None: no checkpoints)."""
        s = self._run(lambda cur, s: s)
        if not s.has_checkpoints:
            return None
        return StoreSql(
            facts=lambda where: self._runs_sql(s, runs_where=where, tool_args=True),
            checkpoints=self._t["checkpoints"],
            pending=self._t["pending"] if s.has_pending else None,
            has_synced="synced" in s.checkpoint_columns,
        )

    def listed(self, execution_id: str) -> bool:
        index = self._index
        return index.listed(execution_id) if index is not None else False

    def list_runs(self, query: RunQuery) -> RunFactsPage:
        index = self._index
        if index is None:
            return self._list_runs_from_rows(query)
        if not index.refresh():
            progress = index.progress()
            if progress is not None and query == RunQuery(limit=query.limit):
                # The first page, unfiltered: answered now, from the store itself.
                return RunFactsPage(
                    runs=self._recently_written(query.limit),
                    next_key=None,
                    counts={},
                    indexing=progress,
                )
            index.complete()
        return index.list_runs(query)

    def _complete_index(self) -> PgRunIndex:
        """The runs index, up to date; attention and metrics read nothing else."""
        index = self._index
        if index is None:
            raise Unavailable(
                "what needs attention is read from the runs index, which a read-only "
                f"localui does not keep: serve {self.location} without --read-only once "
                "(or give this role CREATE on the app schema) so it is built"
            )
        return index

    def indexing(self) -> IndexProgress | None:
        index = self._index
        if index is None:
            return None
        # While a first build runs, refresh may answer True (the partial index can be
        # read): the build's progress is what tells.
        index.refresh()
        return index.progress()

    def list_attention(self, query: AttentionQuery) -> AttentionPage:
        return self._complete_index().list_attention(query)

    def attention_counts(self, stale_before: str, overdue_before: str) -> AttentionCounts:
        return self._complete_index().attention_counts(stale_before, overdue_before)

    def fleet_counts(self, stale_before: str, overdue_before: str) -> FleetCounts | None:
        return self._complete_index().fleet_counts(stale_before, overdue_before)

    def _recently_written(self, limit: int) -> tuple[RunFacts, ...]:
        """The ``limit`` runs with the newest rows, from the SDK's tables: a lookup on
        its ``(synced, created_at)`` index, then those runs' facts."""

        def work(cur: Any, s: _Schema) -> list[dict[str, Any]]:
            if not s.has_checkpoints:
                return []
            cp = self._t["checkpoints"]
            halves = (
                ["synced = false", "synced = true"]
                if "synced" in s.checkpoint_columns
                else ["true"]
            )
            # A run writes a few rows a step: this many of the newest rows hold the
            # newest ``limit`` runs unless a few runs wrote all of them.
            rows = limit * 50
            union = " UNION ALL ".join(
                f"(SELECT execution_id, created_at FROM {cp} WHERE {half}"
                f" ORDER BY created_at DESC LIMIT {rows})"
                for half in halves
            )
            cur.execute(f"SELECT execution_id FROM ({union}) n ORDER BY created_at DESC")
            recent: dict[str, None] = {}
            for row in cur.fetchall():
                recent[row["execution_id"]] = None
                if len(recent) == limit:
                    break
            if not recent:
                return []
            cur.execute(
                f"{self._runs_sql(s, runs_where='WHERE execution_id = ANY(%(ids)s)')}"
                ' SELECT * FROM r ORDER BY last_at DESC, execution_id COLLATE "C" DESC',
                {"ids": list(recent)},
            )
            found: list[dict[str, Any]] = cur.fetchall()
            return found

        return tuple(self._facts(r) for r in self._run(work, statements=2))

    def _list_runs_from_rows(self, query: RunQuery) -> RunFactsPage:
        """The runs list straight from the SDK's rows (no runs index)."""
        after_at = _key_instant(query.after, "after") if query.after is not None else None

        def work(cur: Any, s: _Schema) -> tuple[list[dict[str, Any]], dict[str, int]]:
            if not s.has_checkpoints:
                return [], {}
            where: list[str] = []
            params: dict[str, Any] = {}
            if query.agent:
                where.append("agent = %(agent)s")
                params["agent"] = query.agent
            if query.text:
                params["text"] = like(query.text)
                where.append(
                    "(execution_id ILIKE %(text)s OR agent ILIKE %(text)s"
                    " OR COALESCE(pending_reason, '') ILIKE %(text)s"
                    f" OR EXISTS (SELECT 1 FROM {self._t['checkpoints']} t"
                    " WHERE t.execution_id = r.execution_id"
                    " AND t.node_input::text ILIKE %(text)s))"
                )
            if query.outbox == "waiting":
                where.append("rows_waiting > 0")
            elif query.outbox == "quarantined":
                where.append("rows_quarantined > 0")
            base_where = " AND ".join(where) or "true"
            cur.execute(
                f"{self._runs_sql(s)} SELECT state, COUNT(*) AS n FROM r"
                f" WHERE {base_where} GROUP BY state",
                params,
            )
            counts = {row["state"]: int(row["n"]) for row in cur.fetchall()}
            page_where = list(where)
            if query.state:
                page_where.append("state = %(state)s")
                params["state"] = query.state
            if query.after is not None:
                page_where.append(
                    "(last_at < %(after_at)s OR (last_at = %(after_at)s"
                    ' AND execution_id COLLATE "C" < %(after_id)s))'
                )
                params["after_at"] = after_at
                params["after_id"] = query.after[1]
            params["limit"] = query.limit + 1
            cur.execute(
                f"{self._runs_sql(s)} SELECT * FROM r WHERE {' AND '.join(page_where) or 'true'}"
                ' ORDER BY last_at DESC, execution_id COLLATE "C" DESC LIMIT %(limit)s',
                params,
            )
            return cur.fetchall(), counts

        rows, counts = self._run(work, statements=2)
        page = Page.of(rows, query.limit, self._facts, shared.run_key)
        return RunFactsPage(runs=page.items, next_key=page.next_key, counts=counts)

    def get_run(self, execution_id: str) -> RunFacts | None:
        def work(cur: Any, s: _Schema) -> dict[str, Any] | None:
            if not s.has_checkpoints:
                return None
            cur.execute(f"{self._runs_sql(s, one_run=True)} SELECT * FROM r", {"run": execution_id})
            row: dict[str, Any] | None = cur.fetchone()
            return row

        row = self._run(work)
        return self._facts(row) if row is not None else None

    def run_reads(
        self, execution_id: str
    ) -> tuple[RunFacts | None, tuple[RowHeader, ...], tuple[CacheEntry, ...]]:
        from psycopg.rows import dict_row

        def work(cur: Any, s: _Schema) -> tuple[Any, list[Any], list[Any]]:
            if not s.has_checkpoints:
                return None, [], []
            conn = cur.connection
            # Sent together and answered together: one round trip for the three.
            with conn.pipeline():
                facts = conn.cursor(row_factory=dict_row)
                facts.execute(
                    f"{self._runs_sql(s, one_run=True)} SELECT * FROM r", {"run": execution_id}
                )
                rows = conn.cursor(row_factory=dict_row)
                rows.execute(self._rows_sql(s), (execution_id,))
                cache = None
                if s.has_cache:
                    cache = conn.cursor(row_factory=dict_row)
                    cache.execute(self._cache_sql(), (execution_id,))
            return facts.fetchone(), rows.fetchall(), cache.fetchall() if cache else []

        facts, rows, cache = self._run(work)
        return (
            self._facts(facts) if facts is not None else None,
            tuple(self._header(r) for r in rows),
            tuple(_cache_entry(r) for r in cache),
        )

    def compare_reads(
        self, execution_ids: Sequence[str]
    ) -> dict[str, tuple[RunFacts | None, tuple[RowHeader, ...], ForkLink | None]]:
        from psycopg.rows import dict_row

        wanted = list(dict.fromkeys(execution_ids))

        def work(cur: Any, s: _Schema) -> tuple[list[Any], list[Any], list[Any]]:
            if not s.has_checkpoints or not wanted:
                return [], [], []
            conn = cur.connection
            # Sent together and answered together: one round trip for every run's
            # facts, rows and fork origin (six, one after another).
            with conn.pipeline():
                facts = []
                for eid in wanted:
                    one = conn.cursor(row_factory=dict_row)
                    one.execute(f"{self._runs_sql(s, one_run=True)} SELECT * FROM r", {"run": eid})
                    facts.append(one)
                rows = conn.cursor(row_factory=dict_row)
                rows.execute(self._rows_of_sql(s), (wanted,))
                origins = None
                if "parent_checkpoint_id" in s.checkpoint_columns:
                    origins = conn.cursor(row_factory=dict_row)
                    origins.execute(self._fork_links_sql("f.execution_id = ANY(%s)"), (wanted,))
            return (
                [f.fetchone() for f in facts],
                rows.fetchall(),
                origins.fetchall() if origins is not None else [],
            )

        facts, rows, origins = self._run(work)
        by_run: dict[str, list[RowHeader]] = {eid: [] for eid in wanted}
        for r in rows:
            header = self._header(r)
            by_run[header.execution_id].append(header)
        origin_of: dict[str, ForkLink] = {}
        for r in origins:
            link = shared.fork_link(r, iso)
            origin_of.setdefault(link.execution_id, link)
        return {
            eid: (
                self._facts(facts[i]) if i < len(facts) and facts[i] is not None else None,
                tuple(by_run[eid]),
                origin_of.get(eid),
            )
            for i, eid in enumerate(wanted)
        }

    # --- rows ---------------------------------------------------------

    @staticmethod
    def _header_columns(s: _Schema) -> str:
        return shared.header_select(s.col)

    @staticmethod
    def _header(row: dict[str, Any]) -> RowHeader:
        return shared.row_header(row, iso)

    def _rows_sql(self, s: _Schema) -> str:
        """A run's rows (``%s``) in the order written, without payloads."""
        return (
            f"SELECT {self._header_columns(s)} FROM {self._t['checkpoints']}"
            f" WHERE execution_id = %s ORDER BY {OLDEST_FIRST}"
        )

    def list_rows(self, execution_id: str) -> tuple[RowHeader, ...]:
        def work(cur: Any, s: _Schema) -> list[dict[str, Any]]:
            if not s.has_checkpoints:
                return []
            cur.execute(self._rows_sql(s), (execution_id,))
            rows: list[dict[str, Any]] = cur.fetchall()
            return rows

        return tuple(self._header(r) for r in self._run(work))

    def _rows_of_sql(self, s: _Schema) -> str:
        """The rows of the runs in ``%s`` (an array), each run's in the order written."""
        return (
            f"SELECT {self._header_columns(s)} FROM {self._t['checkpoints']}"
            f" WHERE execution_id = ANY(%s) ORDER BY execution_id, {OLDEST_FIRST}"
        )

    def list_rows_of(self, execution_ids: Sequence[str]) -> dict[str, tuple[RowHeader, ...]]:
        wanted = list(dict.fromkeys(execution_ids))

        def work(cur: Any, s: _Schema) -> list[dict[str, Any]]:
            if not s.has_checkpoints or not wanted:
                return []
            cur.execute(self._rows_of_sql(s), (wanted,))
            rows: list[dict[str, Any]] = cur.fetchall()
            return rows

        grouped: dict[str, list[RowHeader]] = {}
        for r in self._run(work):
            header = self._header(r)
            grouped.setdefault(header.execution_id, []).append(header)
        return {eid: tuple(rows) for eid, rows in grouped.items()}

    def get_rows(self, checkpoint_ids: Sequence[str]) -> dict[str, RowDetail]:
        wanted = list(dict.fromkeys(checkpoint_ids))

        def work(cur: Any, s: _Schema) -> list[dict[str, Any]]:
            if not s.has_checkpoints or not wanted:
                return []
            cur.execute(
                f"SELECT {self._row_columns(s)} FROM {self._t['checkpoints']}"
                " WHERE checkpoint_id = ANY(%s)",
                (wanted,),
            )
            rows: list[dict[str, Any]] = cur.fetchall()
            return rows

        found: dict[str, RowDetail] = {}
        for row in self._run(work):
            detail = row_detail(self._header(row), row)
            found[detail.header.checkpoint_id] = detail
        return found

    def same_payloads(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        wanted = list(dict.fromkeys(pairs))

        def work(cur: Any, s: _Schema) -> set[tuple[str, str]]:
            if not s.has_checkpoints or not wanted:
                return set()
            names = ["state_snapshot", "node_input", "node_output"]
            if "interrupt_context" in s.checkpoint_columns:
                names.append("interrupt_context")
            alike = " AND ".join(f"x.{n} IS NOT DISTINCT FROM y.{n}" for n in names)
            # Compared in the server (jsonb compares by value): no payload is sent.
            cur.execute(
                "SELECT p.a, p.b FROM unnest(%s::text[], %s::text[]) AS p(a, b)"
                f" JOIN {self._t['checkpoints']} x ON x.checkpoint_id = p.a"
                f" JOIN {self._t['checkpoints']} y ON y.checkpoint_id = p.b WHERE {alike}",
                ([a for a, _ in wanted], [b for _, b in wanted]),
            )
            return {(row["a"], row["b"]) for row in cur.fetchall()}

        return self._run(work)

    def row_times(self, checkpoint_ids: Sequence[str]) -> dict[str, str]:
        wanted = list(dict.fromkeys(checkpoint_ids))

        def work(cur: Any, s: _Schema) -> dict[str, str]:
            if not s.has_checkpoints or not wanted:
                return {}
            cur.execute(
                "SELECT checkpoint_id, created_at"
                f" FROM {self._t['checkpoints']} WHERE checkpoint_id = ANY(%s)",
                (wanted,),
            )
            return {str(r["checkpoint_id"]): iso(r["created_at"]) for r in cur.fetchall()}

        return self._run(work)

    @classmethod
    def _row_columns(cls, s: _Schema) -> str:
        """A row's header and payloads, as :func:`row_detail` reads them."""
        context = (
            "interrupt_context::text" if "interrupt_context" in s.checkpoint_columns else "NULL"
        )
        return (
            f"{cls._header_columns(s)}, state_snapshot::text AS state_snapshot,"
            " node_input::text AS node_input, node_output::text AS node_output,"
            f" {context} AS interrupt_context, iteration"
        )

    def get_row(self, checkpoint_id: str) -> RowDetail | None:
        def work(cur: Any, s: _Schema) -> dict[str, Any] | None:
            if not s.has_checkpoints:
                return None
            cur.execute(
                f"SELECT {self._row_columns(s)} FROM {self._t['checkpoints']}"
                " WHERE checkpoint_id = %s",
                (checkpoint_id,),
            )
            row: dict[str, Any] | None = cur.fetchone()
            return row

        row = self._run(work)
        if row is None:
            return None
        return row_detail(self._header(row), row)

    # --- pauses -------------------------------------------------------

    def _pending_columns(self) -> str:
        # The interrupted row a resume would answer: newest first, as Agent.aresume picks it.
        return f"""p.execution_id, p.chain_name, p.node_id, p.reason, p.context::text AS context,
            p.agent_path, p.created_at,
            (SELECT i.checkpoint_id FROM {self._t["checkpoints"]} i
              WHERE i.execution_id = p.execution_id AND i.status = 'interrupted'
              ORDER BY i.created_at DESC, i.node_index DESC, i.checkpoint_id DESC
              LIMIT 1) AS checkpoint_id"""

    def get_pending(self, execution_id: str) -> Pending | None:
        def work(cur: Any, s: _Schema) -> dict[str, Any] | None:
            if not s.has_pending or not s.has_checkpoints:
                return None
            cur.execute(
                f"SELECT {self._pending_columns()} FROM {self._t['pending']} p"
                " WHERE p.execution_id = %s",
                (execution_id,),
            )
            row: dict[str, Any] | None = cur.fetchone()
            return row

        row = self._run(work)
        return shared.pending(row, iso) if row is not None else None

    def list_pending(
        self, *, after: tuple[str, str] | None = None, limit: int = 50, newest_first: bool = False
    ) -> PendingPage:
        after_at = _key_instant(after, "after") if after is not None else None

        def work(cur: Any, s: _Schema) -> tuple[list[dict[str, Any]], int]:
            if not s.has_pending or not s.has_checkpoints:
                return [], 0
            order = "DESC" if newest_first else "ASC"
            where = "true"
            params: dict[str, Any] = {"limit": limit + 1}
            if after is not None:
                op = "<" if newest_first else ">"
                where = (
                    f"(p.created_at {op} %(at)s OR (p.created_at = %(at)s"
                    f' AND p.execution_id COLLATE "C" {op} %(id)s))'
                )
                params.update(at=after_at, id=after[1])
            # The page and the queue's count in one statement (one snapshot, one round
            # trip: the queue is the page a person reloads most).
            cur.execute(
                f"SELECT {self._pending_columns()},"
                f" (SELECT COUNT(*) FROM {self._t['pending']}) AS queue_total"
                f" FROM {self._t['pending']} p WHERE {where}"
                f' ORDER BY p.created_at {order}, p.execution_id COLLATE "C" {order}'
                " LIMIT %(limit)s",
                params,
            )
            rows: list[dict[str, Any]] = cur.fetchall()
            if rows:
                return rows, int(rows[0]["queue_total"])
            cur.execute(f"SELECT COUNT(*) AS n FROM {self._t['pending']}")
            return rows, int(cur.fetchone()["n"])

        rows, total = self._run(work)
        page = Page.of(rows, limit, _pending, shared.pending_key)
        return PendingPage(items=page.items, next_key=page.next_key, total=total)

    # --- idempotency cache -------------------------------------------

    def paused_calls(self, pending: Sequence[Pending]) -> dict[str, PausedCall]:
        checkpoint_ids = [p.checkpoint_id for p in pending if p.checkpoint_id]
        if not checkpoint_ids:
            return {}

        def work(cur: Any, s: _Schema) -> list[dict[str, Any]]:
            if not s.has_checkpoints:
                return []
            # Each paused row with its run's count of cached results, in one statement.
            cached = (
                f"(SELECT COUNT(*) FROM {self._t['cache']} c"
                " WHERE c.execution_id = cp.execution_id)"
                if s.has_cache
                else "0"
            )
            # And its run's rows and paused rows: a run past the SDK's 500-row read, or
            # with an earlier pause, is one whose approval needs the exact check.
            shape = (
                "(SELECT COUNT(*) AS n, COUNT(*) FILTER (WHERE r.status = 'interrupted') AS p"
                f" FROM {self._t['checkpoints']} r WHERE r.execution_id = cp.execution_id)"
            )
            cur.execute(
                "SELECT checkpoint_id, execution_id, state_snapshot::text AS state_snapshot,"
                f" node_input::text AS node_input, {cached} AS cached,"
                " shape.n AS run_rows, shape.p AS run_pauses"
                f" FROM {self._t['checkpoints']} cp, LATERAL {shape} shape"
                " WHERE checkpoint_id = ANY(%s)",
                (checkpoint_ids,),
            )
            rows: list[dict[str, Any]] = cur.fetchall()
            return rows

        rows = self._run(work)
        return {
            r["checkpoint_id"]: PausedCall(
                checkpoint_id=r["checkpoint_id"],
                state_snapshot=parse_json(r["state_snapshot"], {}),
                node_input=parse_json(r["node_input"], {}),
                cached_results=int(r["cached"]),
                run_rows=int(r["run_rows"]),
                run_pauses=int(r["run_pauses"]),
            )
            for r in rows
        }

    def _cache_sql(self) -> str:
        """A run's (``%s``) cached results, oldest first."""
        return (
            "SELECT execution_id, function_key, result::text AS result, created_at"
            f" FROM {self._t['cache']} WHERE execution_id = %s"
            ' ORDER BY created_at ASC, function_key COLLATE "C" ASC'
        )

    def list_cache(self, execution_id: str) -> tuple[CacheEntry, ...]:
        def work(cur: Any, s: _Schema) -> list[dict[str, Any]]:
            if not s.has_cache:
                return []
            cur.execute(self._cache_sql(), (execution_id,))
            rows: list[dict[str, Any]] = cur.fetchall()
            return rows

        return tuple(_cache_entry(r) for r in self._run(work))

    def list_cache_of(self, execution_ids: Sequence[str]) -> dict[str, tuple[CacheEntry, ...]]:
        wanted = list(dict.fromkeys(execution_ids))

        def work(cur: Any, s: _Schema) -> list[dict[str, Any]]:
            if not s.has_cache or not wanted:
                return []
            cur.execute(
                "SELECT execution_id, function_key, result::text AS result, created_at"
                f" FROM {self._t['cache']} WHERE execution_id = ANY(%s)"
                ' ORDER BY execution_id, created_at ASC, function_key COLLATE "C" ASC',
                (wanted,),
            )
            rows: list[dict[str, Any]] = cur.fetchall()
            return rows

        grouped: dict[str, list[CacheEntry]] = {}
        for r in self._run(work):
            entry = _cache_entry(r)
            grouped.setdefault(entry.execution_id, []).append(entry)
        return {eid: tuple(entries) for eid, entries in grouped.items()}

    def list_cache_before(
        self, cutoff: str, *, after: tuple[str, str] | None = None, limit: int = 50
    ) -> CachePage:
        instant = cutoff_instant(cutoff)
        after_at = _key_instant(after, "after") if after is not None else None
        key = "execution_id || ':' || function_key"

        def work(cur: Any, s: _Schema) -> tuple[list[dict[str, Any]], int]:
            if not s.has_cache:
                return [], 0
            cur.execute(
                f"SELECT COUNT(*) AS n FROM {self._t['cache']} WHERE created_at < %s", (instant,)
            )
            total = int(cur.fetchone()["n"])
            where = "created_at < %(cutoff)s"
            params: dict[str, Any] = {"cutoff": instant, "limit": limit + 1}
            if after is not None:
                where += (
                    " AND (created_at > %(at)s OR (created_at = %(at)s"
                    f' AND ({key}) COLLATE "C" > %(key)s))'
                )
                params.update(at=after_at, key=after[1])
            cur.execute(
                "SELECT execution_id, function_key, result::text AS result, created_at"
                f" FROM {self._t['cache']} WHERE {where}"
                f' ORDER BY created_at ASC, ({key}) COLLATE "C" ASC LIMIT %(limit)s',
                params,
            )
            return cur.fetchall(), total

        rows, total = self._run(work, statements=2)
        page = Page.of(rows, limit, _cache_entry, shared.cache_key)
        return CachePage(entries=page.items, next_key=page.next_key, total=total)

    # --- lineage ------------------------------------------------------

    def _fork_links_sql(self, where: str) -> str:
        """The fork origin rows ``where`` says, each with the source row it names."""
        cp = self._t["checkpoints"]
        return f"""SELECT f.execution_id AS execution_id, f.parent_checkpoint_id AS parent,
                          f.created_at AS created_at, src.execution_id AS source_execution_id,
                          src.node_id AS source_node_id
                   FROM {cp} f
                   LEFT JOIN {cp} src ON src.checkpoint_id = f.parent_checkpoint_id
                   WHERE f.node_id = '{FORK_ORIGIN_NODE}' AND {where}
                   ORDER BY f.created_at ASC, f.execution_id COLLATE "C" ASC"""

    def _fork_links(self, where: str, params: Sequence[Any]) -> tuple[ForkLink, ...]:
        def work(cur: Any, s: _Schema) -> list[dict[str, Any]]:
            if "parent_checkpoint_id" not in s.checkpoint_columns:
                return []
            cur.execute(self._fork_links_sql(where), tuple(params))
            rows: list[dict[str, Any]] = cur.fetchall()
            return rows

        return tuple(shared.fork_link(r, iso) for r in self._run(work))

    def get_fork_origin(self, execution_id: str) -> ForkLink | None:
        links = self._fork_links("f.execution_id = %s", (execution_id,))
        return links[0] if links else None

    def list_forks(self, execution_id: str) -> tuple[ForkLink, ...]:
        forks = self._forks_of(execution_id)
        if forks is None:
            # A scan of every fork origin row: no index of the SDK's finds them by parent.
            return self._fork_links("src.execution_id = %s", (execution_id,))
        return self._fork_links(f"f.execution_id IN ({forks})", (execution_id,))

    def _forks_of(self, execution_id: str) -> str | None:
        """A query of the ids of the runs forked from run ``%s``, from the runs index;
        None while there is none to ask."""
        index = self._index
        if index is None or not index.refresh():
            return None
        # The runs index knows each fork's parent row: this run's rows, then their forks.
        return (
            f"SELECT r.execution_id FROM {index.tables.runs} r"
            f" JOIN {self._t['checkpoints']} p ON p.checkpoint_id = r.fork_parent"
            " WHERE p.execution_id = %s"
        )

    def fork_family(self, execution_id: str) -> tuple[ForkLink | None, tuple[ForkLink, ...]]:
        forks = self._forks_of(execution_id)
        if forks is None:
            return self.get_fork_origin(execution_id), self.list_forks(execution_id)
        # One statement for both, each id looked up in the SDK's index (an OR of the two
        # conditions would read every row). A run is never its own fork: a fork is new.
        links = self._fork_links(
            f"f.execution_id = ANY(ARRAY[%s::text] || ARRAY({forks}))",
            (execution_id, execution_id),
        )
        origin = next((link for link in links if link.execution_id == execution_id), None)
        return origin, tuple(link for link in links if link.execution_id != execution_id)

    # --- actions' helpers ---------------------------------------------

    def get_project_id(self, execution_id: str) -> str | None:
        """The SDK's PostgreSQL tables are not project-scoped (``fetch_unsynced`` says so)."""

        def work(cur: Any, s: _Schema) -> str | None:
            if "project_id" not in s.checkpoint_columns:
                return None
            cur.execute(
                f"SELECT project_id FROM {self._t['checkpoints']} WHERE execution_id = %s"
                f" ORDER BY {NEWEST_FIRST} LIMIT 1",
                (execution_id,),
            )
            row = cur.fetchone()
            return str(row["project_id"]) if row and row["project_id"] is not None else None

        return self._run(work)

    def prune_preview(self, cutoff: str) -> PrunePreview:
        """Count what ``PostgresCheckpointer.prune`` deletes, with its own predicate."""
        instant = cutoff_instant(cutoff)

        def work(cur: Any, s: _Schema) -> tuple[list[dict[str, Any]], int, int, dict[str, int]]:
            if not s.has_checkpoints:
                return [], 0, 0, {}
            cur.execute(
                f"""SELECT execution_id, MAX(chain_name) AS agent,
                           COUNT(*) FILTER (WHERE created_at < %(cutoff)s
                                            AND status IN ('completed', 'failed')) AS gone,
                           COUNT(*) AS total
                    FROM {self._t["checkpoints"]} GROUP BY execution_id
                    HAVING COUNT(*) FILTER (WHERE created_at < %(cutoff)s
                                            AND status IN ('completed', 'failed')) > 0
                    ORDER BY MAX(created_at) ASC, execution_id COLLATE "C" ASC""",
                {"cutoff": instant},
            )
            rows = cur.fetchall()
            cur.execute(
                f"SELECT COUNT(*) AS n FROM {self._t['checkpoints']}"
                " WHERE created_at < %s AND status = 'interrupted'",
                (instant,),
            )
            pauses = int(cur.fetchone()["n"])
            cache = 0
            if s.has_cache:
                cur.execute(
                    f"SELECT COUNT(*) AS n FROM {self._t['cache']} WHERE created_at < %s",
                    (instant,),
                )
                cache = int(cur.fetchone()["n"])
            return rows, pauses, cache, self._resumable_cache(cur, s, instant)

        rows, pauses, cache, resumable = self._run(work, statements=4)
        runs = tuple(shared.prune_run(r) for r in rows)
        return PrunePreview(
            cutoff=cutoff,
            checkpoint_rows=sum(r.rows_deleted for r in runs),
            cache_rows=cache,
            runs=runs,
            pauses_kept=pauses,
            resumable_cache=resumable,
        )

    def _resumable_cache(self, cur: Any, s: _Schema, instant: Any) -> dict[str, int]:
        """Cache entries older than the cutoff of runs that can still resume, per run:
        the state of only the runs that have such entries, each by its newest row."""
        if not s.has_cache:
            return {}
        pending = (
            f"LEFT JOIN {self._t['pending']} p ON p.execution_id = k.execution_id"
            if s.has_pending
            else "LEFT JOIN (SELECT NULL::text AS execution_id) p ON false"
        )
        cur.execute(
            f"""WITH k AS (
                    SELECT execution_id, COUNT(*) AS n FROM {self._t["cache"]}
                    WHERE created_at < %s GROUP BY execution_id
                )
                SELECT k.execution_id, k.n FROM k
                JOIN LATERAL (
                    SELECT {s.col("step_type")} AS step_type, status,
                           {_run_reason_sql(s)} AS run_reason
                    FROM {self._t["checkpoints"]} c WHERE c.execution_id = k.execution_id
                    ORDER BY {NEWEST_FIRST} LIMIT 1
                ) l ON true
                {pending}
                WHERE ({STATE_SQL})
                    IN ('paused', 'unfinished', 'failed', 'cancelled', 'timed_out')""",
            (instant,),
        )
        return {str(r["execution_id"]): int(r["n"]) for r in cur.fetchall()}

    # --- totals -------------------------------------------------------

    def count_pending(self) -> int:
        def work(cur: Any, s: _Schema) -> int:
            if not s.has_pending:
                return 0
            cur.execute(f"SELECT COUNT(*) AS n FROM {self._t['pending']}")
            return int(cur.fetchone()["n"])

        return self._run(work)

    def totals(self) -> StoreTotals:
        if self._index is not None:
            rows, waiting, quarantined = self._index.totals()
            return StoreTotals(
                rows=rows,
                rows_waiting=waiting,
                rows_quarantined=quarantined,
                pending=self.count_pending(),
            )

        def work(cur: Any, s: _Schema) -> StoreTotals:
            if not s.has_checkpoints:
                return StoreTotals(rows=0, rows_waiting=0, rows_quarantined=0, pending=0)
            waiting = (
                "COUNT(*) FILTER (WHERE synced = false)"
                if "synced" in s.checkpoint_columns
                else "0"
            )
            quarantined = (
                "COUNT(*) FILTER (WHERE sync_error IS NOT NULL)"
                if "sync_error" in s.checkpoint_columns
                else "0"
            )
            pending = f"(SELECT COUNT(*) FROM {self._t['pending']})" if s.has_pending else "0"
            cur.execute(
                f"SELECT COUNT(*) AS n, {waiting} AS waiting, {quarantined} AS quarantined,"
                f" {pending} AS pending FROM {self._t['checkpoints']}"
            )
            row = cur.fetchone()
            return StoreTotals(
                rows=int(row["n"]),
                rows_waiting=int(row["waiting"]),
                rows_quarantined=int(row["quarantined"]),
                pending=int(row["pending"]),
            )

        return self._run(work)


def _pending(row: dict[str, Any]) -> Pending:
    return shared.pending(row, iso)


def _cache_entry(row: dict[str, Any]) -> CacheEntry:
    return shared.cache_entry(row, iso)
