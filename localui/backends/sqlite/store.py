"""The SQLite store: the SDK's unified ``local.db``, opened read-only.

Connections are opened with ``mode=ro`` and ``query_only`` so nothing here can
write, one per thread because views run queries in a thread pool, each with a
busy timeout so an agent process writing at the same moment delays a read
instead of failing it. Stores written by older SDKs lack columns; the schema is
read on open (and again whenever SQLite says it changed) and a missing column
reads as NULL.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localui.backends import shared
from localui.backends.shared import Page
from localui.backends.sqlite.connect import connect
from localui.backends.sqlite.errors import (
    cannot_open,
    is_busy,
    is_not_a_database,
    is_unreachable,
)
from localui.backends.sqlite.files import decode_text
from localui.backends.sqlite.index import BACKGROUND_FROM_ROWS, RunIndex, StoreColumns
from localui.errors import LocalUIError, StoreMissing, Unavailable
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

#: Read connections open at once, and the page cache of each (SQLite's default is 2 MiB).
POOL_SIZE = 4
CACHE_KIB = 1024
#: Ids bound in one ``IN (...)`` list (SQLite allows 32,766 variables; a page asks for
#: a few dozen).
CHUNK = 500


@dataclass(frozen=True, slots=True)
class _Schema:
    """What this store's tables look like: which exist and which columns they have."""

    version: int
    checkpoint_columns: frozenset[str]
    has_pending: bool
    has_cache: bool

    @property
    def has_checkpoints(self) -> bool:
        return bool(self.checkpoint_columns)

    def col(self, name: str, alias: str = "") -> str:
        """A checkpoint column as SQL, or NULL when this store predates it."""
        prefix = f"{alias}." if alias else ""
        if name == "checkpoint_id":
            if "checkpoint_id" in self.checkpoint_columns:
                return f"COALESCE({prefix}checkpoint_id, {prefix}id)"
            return f"{prefix}id"
        if name in self.checkpoint_columns:
            return f"{prefix}{name}"
        return "NULL"


class SQLiteStore:
    """:class:`localui.backends.base.Store` over a SQLite file."""

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 5.0,
        index_dir: Path | None = None,
        background_index_from_rows: int = BACKGROUND_FROM_ROWS,
    ) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        try:
            is_file = self.path.is_file()
        except OSError as exc:
            raise StoreMissing(f"the store {self.path} cannot be read: {exc.strerror}") from exc
        if not is_file:
            raise StoreMissing(f"no store at {self.path} (check --store or FASTAIAGENT_LOCAL_DB)")
        if not os.access(self.path, os.R_OK):
            raise StoreMissing(
                f"the store {self.path} cannot be read: permission denied for this user"
            )
        self._busy_timeout = busy_timeout
        self._identity = self._file_identity()
        self._lock = threading.Lock()
        # A few connections, lent out one request at a time: one per pool thread
        # would hold as many page caches as the thread pool has threads.
        self._idle: queue.LifoQueue[tuple[int, sqlite3.Connection]] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(POOL_SIZE)
        self._open: set[sqlite3.Connection] = set()
        self._schema: _Schema | None = None
        self._generation = 0
        self._check_is_sqlite()
        self._index = RunIndex(
            self.path,
            columns=self._index_columns,
            index_dir=index_dir,
            background_from_rows=background_index_from_rows,
        )
        # Start indexing now rather than on the first request, beside the rest of the
        # start-up: a store indexed before is caught up with first, which counts its
        # rows (60 ms at a million runs); a request that comes sooner waits for it.
        self._opening = threading.Thread(
            target=self._first_refresh, name="localui-index-open", daemon=True
        )
        self._opening.start()

    def _first_refresh(self) -> None:
        # What fails here fails again, with its reason, on the request that needs it.
        try:
            self._index.refresh()
        except (LocalUIError, sqlite3.Error):
            pass

    # --- connections --------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = connect(self.path, "ro", timeout=self._busy_timeout, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.text_factory = decode_text
        conn.execute("PRAGMA query_only = 1")
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        with self._lock:
            self._open.add(conn)
        return conn

    def _discard(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            self._open.discard(conn)
        conn.close()

    def _file_identity(self) -> tuple[int, int]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError as exc:
            raise Unavailable(f"the store {self.path} is gone: the file was deleted") from exc
        return st.st_dev, st.st_ino

    def _check_file(self) -> None:
        """An open connection keeps reading a deleted or replaced file; notice both."""
        identity = self._file_identity()
        if identity != self._identity:
            # Connections reopen as they come back; a query running now finishes first.
            with self._lock:
                self._identity = identity
                self._generation += 1

    @contextmanager
    def _borrow(self) -> Iterator[sqlite3.Connection]:
        """A read connection to the file as it is now, returned to the pool after."""
        self._slots.acquire()
        conn: sqlite3.Connection | None = None
        try:
            while conn is None:
                try:
                    generation, idle = self._idle.get_nowait()
                except queue.Empty:
                    generation, conn = self._generation, self._connect()
                    break
                if generation == self._generation:
                    conn = idle
                else:
                    self._discard(idle)
            yield conn
        finally:
            if conn is not None:
                if generation == self._generation and conn in self._open:
                    self._idle.put((generation, conn))
                else:
                    self._discard(conn)
            self._slots.release()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        self._check_file()
        try:
            with self._borrow() as conn:
                yield conn
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                raise Unavailable(
                    f"the store {self.path} is locked by another process; try again"
                ) from exc
            if is_unreachable(exc):
                raise Unavailable(f"the store {self.path} cannot be opened: {exc}") from exc
            raise
        except sqlite3.DatabaseError as exc:
            raise Unavailable(f"the store {self.path} cannot be read: {exc}") from exc

    def _check_is_sqlite(self) -> None:
        try:
            with self._borrow() as conn:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            if is_busy(exc):
                raise Unavailable(f"the store {self.path} is locked by another process") from exc
            if is_not_a_database(exc):
                raise StoreMissing(f"{self.path} is not a SQLite store: {exc}") from exc
            if cannot_open(exc):
                raise StoreMissing(
                    f"the store {self.path} cannot be opened: {exc} (is its directory "
                    "readable, and its -wal and -shm files too?)"
                ) from exc
            raise StoreMissing(f"the store {self.path} cannot be read: {exc}") from exc

    def _schema_for(self, conn: sqlite3.Connection) -> _Schema:
        version = int(conn.execute("PRAGMA schema_version").fetchone()[0])
        schema = self._schema
        if schema is not None and schema.version == version:
            return schema
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        columns: frozenset[str] = frozenset()
        if "checkpoints" in tables:
            columns = frozenset(r[1] for r in conn.execute("PRAGMA table_info(checkpoints)"))
        schema = _Schema(
            version=version,
            checkpoint_columns=columns,
            has_pending="pending_interrupts" in tables,
            has_cache="idempotency_cache" in tables,
        )
        self._schema = schema
        return schema

    def close(self) -> None:
        self._opening.join()
        self._index.close()
        with self._lock:
            for conn in self._open:
                conn.close()
            self._open.clear()

    # --- runs ---------------------------------------------------------

    def _index_columns(self) -> StoreColumns | None:
        """How the runs index reads this store's checkpoints (None: it has none)."""
        with self._read() as conn:
            s = self._schema_for(conn)
        if not s.has_checkpoints:
            return None
        return StoreColumns(
            expressions={
                "rowid": "rowid",
                "execution_id": "execution_id",
                "agent": "chain_name",
                "checkpoint_id": s.col("checkpoint_id"),
                "node_id": "node_id",
                "step_type": s.col("step_type"),
                "status": "status",
                "created_at": "created_at",
                "parent_checkpoint_id": s.col("parent_checkpoint_id"),
                "synced": s.col("synced"),
                "sync_error": s.col("sync_error"),
                # A tool's arguments, which the runs list searches (turn rows have none).
                "tool_args": "CASE WHEN node_id LIKE '%/tool:%' THEN node_input END",
                # Who owns the run (a team's rows nest their members' under it).
                "agent_path": s.col("agent_path"),
                # Why a run was stopped on purpose: read from run-end rows only (one a
                # run), and only from a snapshot that parses.
                "run_reason": f"CASE WHEN {s.col('step_type')} = '{RUN_END_STEP}'"
                " AND json_valid(state_snapshot)"
                " THEN json_extract(state_snapshot, '$.run_reason') END",
            },
            synced=s.col("synced"),
            sync_error=s.col("sync_error"),
            checkpoint_key="checkpoint_id" if "checkpoint_id" in s.checkpoint_columns else "id",
        )

    @contextmanager
    def _index_errors(self) -> Iterator[None]:
        """Any failure of the runs index to read the store is the store being unavailable
        (a locked, replaced or damaged file); the next call attaches it again."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                raise Unavailable(
                    f"the runs index for {self.path} is locked by another process; try again"
                ) from exc
            raise Unavailable(f"the store {self.path} cannot be read: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise Unavailable(f"the store {self.path} cannot be read: {exc}") from exc

    def list_runs(self, query: RunQuery) -> RunFactsPage:
        with self._index_errors():
            return self._index.list_runs(query)

    def get_run(self, execution_id: str) -> RunFacts | None:
        with self._index_errors():
            return self._index.get_run(execution_id)

    def listed(self, execution_id: str) -> bool:
        with self._index_errors():
            return self._index.listed(execution_id)

    def list_attention(self, query: AttentionQuery) -> AttentionPage:
        with self._index_errors():
            return self._index.list_attention(query)

    def attention_counts(self, stale_before: str, overdue_before: str) -> AttentionCounts:
        with self._index_errors():
            return self._index.attention_counts(stale_before, overdue_before)

    def fleet_counts(self, stale_before: str, overdue_before: str) -> FleetCounts | None:
        with self._read() as conn:
            pending = self._schema_for(conn).has_pending
        with self._index_errors():
            return self._index.fleet_counts(stale_before, overdue_before, pending=pending)

    def indexing(self) -> IndexProgress | None:
        with self._index_errors():
            return None if self._index.refresh() else self._index.progress()

    @property
    def index_path(self) -> Path:
        """The runs index's file, which the decision record reads runs' agents from."""
        return self._index.path

    # --- rows ---------------------------------------------------------

    @staticmethod
    def _header_columns(s: _Schema) -> str:
        return shared.header_select(s.col)

    def list_rows(self, execution_id: str) -> tuple[RowHeader, ...]:
        with self._read() as conn:
            s = self._schema_for(conn)
            if not s.has_checkpoints:
                return ()
            # Plain tuples in the header columns' order: a long run has thousands of rows,
            # and sqlite3.Row's lookups by name cost more than the query.
            cursor = conn.cursor()
            cursor.row_factory = None
            rows = cursor.execute(
                f"SELECT {self._header_columns(s)} FROM checkpoints WHERE execution_id = ?"
                " ORDER BY created_at ASC, rowid ASC",
                (execution_id,),
            ).fetchall()
        return tuple(shared.row_header_values(r) for r in rows)

    def get_row(self, checkpoint_id: str) -> RowDetail | None:
        with self._read() as conn:
            s = self._schema_for(conn)
            if not s.has_checkpoints:
                return None
            match = (
                "checkpoint_id = ? OR id = ?"
                if "checkpoint_id" in s.checkpoint_columns
                else "id = ? OR id = ?"
            )
            row = conn.execute(
                f"SELECT {self._header_columns(s)}, state_snapshot, node_input, node_output,"
                f" {s.col('interrupt_context')} AS interrupt_context, iteration"
                f" FROM checkpoints WHERE {match} LIMIT 1",
                (checkpoint_id, checkpoint_id),
            ).fetchone()
        if row is None:
            return None
        return row_detail(shared.row_header(row), row)

    def list_rows_of(self, execution_ids: Sequence[str]) -> dict[str, tuple[RowHeader, ...]]:
        wanted = list(dict.fromkeys(execution_ids))
        grouped: dict[str, list[RowHeader]] = {}
        with self._read() as conn:
            s = self._schema_for(conn)
            if not s.has_checkpoints or not wanted:
                return {}
            cursor = conn.cursor()
            cursor.row_factory = None
            for start in range(0, len(wanted), CHUNK):
                chunk = wanted[start : start + CHUNK]
                marks = ",".join("?" * len(chunk))
                for r in cursor.execute(
                    f"SELECT {self._header_columns(s)} FROM checkpoints"
                    f" WHERE execution_id IN ({marks})"
                    " ORDER BY execution_id, created_at ASC, rowid ASC",
                    chunk,
                ):
                    header = shared.row_header_values(r)
                    grouped.setdefault(header.execution_id, []).append(header)
        return {eid: tuple(rows) for eid, rows in grouped.items()}

    def get_rows(self, checkpoint_ids: Sequence[str]) -> dict[str, RowDetail]:
        wanted = list(dict.fromkeys(checkpoint_ids))
        found: dict[str, RowDetail] = {}
        by_id: dict[str, RowDetail] = {}
        with self._read() as conn:
            s = self._schema_for(conn)
            if not s.has_checkpoints or not wanted:
                return found
            has_key = "checkpoint_id" in s.checkpoint_columns
            for start in range(0, len(wanted), CHUNK):
                chunk = wanted[start : start + CHUNK]
                marks = ",".join("?" * len(chunk))
                match = (
                    f"checkpoint_id IN ({marks}) OR id IN ({marks})"
                    if has_key
                    else (f"id IN ({marks})")
                )
                rows = conn.execute(
                    f"SELECT {self._header_columns(s)}, state_snapshot, node_input, node_output,"
                    f" {s.col('interrupt_context')} AS interrupt_context, iteration,"
                    f" id AS row_id FROM checkpoints WHERE {match}",
                    [*chunk, *chunk] if has_key else chunk,
                ).fetchall()
                for row in rows:
                    detail = row_detail(shared.row_header(row), row)
                    found.setdefault(detail.header.checkpoint_id, detail)
                    by_id.setdefault(str(row["row_id"]), detail)
        # As get_row matches, a row's own checkpoint id before another row's plain id.
        return {
            cid: found[cid] if cid in found else by_id[cid]
            for cid in wanted
            if cid in found or cid in by_id
        }

    def same_payloads(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        wanted = list(dict.fromkeys(pairs))
        same: set[tuple[str, str]] = set()
        with self._read() as conn:
            s = self._schema_for(conn)
            if not s.has_checkpoints or "checkpoint_id" not in s.checkpoint_columns:
                return same  # rows named by their plain ids: read them to tell
            alike = " AND ".join(
                f"{s.col(name, 'x')} IS {s.col(name, 'y')}"
                for name in ("state_snapshot", "node_input", "node_output", "interrupt_context")
            )
            # The text as written, compared in place: no payload leaves the file.
            for start in range(0, len(wanted), CHUNK // 2):
                chunk = wanted[start : start + CHUNK // 2]
                values = ",".join("(?, ?)" for _ in chunk)
                for row in conn.execute(
                    f"WITH p(a, b) AS (VALUES {values})"
                    " SELECT p.a, p.b FROM p"
                    " JOIN checkpoints x ON x.checkpoint_id = p.a"
                    f" JOIN checkpoints y ON y.checkpoint_id = p.b WHERE {alike}",
                    [v for pair in chunk for v in pair],
                ):
                    same.add((row[0], row[1]))
        return same

    def row_times(self, checkpoint_ids: Sequence[str]) -> dict[str, str]:
        wanted = list(dict.fromkeys(checkpoint_ids))
        found: dict[str, str] = {}
        with self._read() as conn:
            s = self._schema_for(conn)
            if not s.has_checkpoints or not wanted:
                return found
            key = "checkpoint_id" if "checkpoint_id" in s.checkpoint_columns else "id"
            for start in range(0, len(wanted), CHUNK):
                chunk = wanted[start : start + CHUNK]
                marks = ",".join("?" * len(chunk))
                for cid, at in conn.execute(
                    f"SELECT {key}, created_at FROM checkpoints WHERE {key} IN ({marks})", chunk
                ):
                    found[str(cid)] = str(at)
        return found

    # --- pauses -------------------------------------------------------

    def _pending_columns(self, s: _Schema) -> str:
        # The interrupted row a resume would answer: newest first, as Agent.aresume picks it.
        cid = s.col("checkpoint_id", "i")
        return f"""p.execution_id, p.chain_name, p.node_id, p.reason, p.context, p.agent_path,
            p.created_at,
            (SELECT {cid} FROM checkpoints i
              WHERE i.execution_id = p.execution_id AND i.status = 'interrupted'
              ORDER BY i.created_at DESC, i.rowid DESC LIMIT 1) AS checkpoint_id"""

    def get_pending(self, execution_id: str) -> Pending | None:
        with self._read() as conn:
            s = self._schema_for(conn)
            if not s.has_pending or not s.has_checkpoints:
                return None
            row = conn.execute(
                f"SELECT {self._pending_columns(s)} FROM pending_interrupts p"
                " WHERE p.execution_id = ?",
                (execution_id,),
            ).fetchone()
        return shared.pending(row) if row is not None else None

    def list_pending(
        self, *, after: tuple[str, str] | None = None, limit: int = 50, newest_first: bool = False
    ) -> PendingPage:
        with self._read() as conn:
            s = self._schema_for(conn)
            if not s.has_pending or not s.has_checkpoints:
                return PendingPage(items=(), next_key=None, total=0)
            total = int(conn.execute("SELECT COUNT(*) FROM pending_interrupts").fetchone()[0])
            order = "DESC" if newest_first else "ASC"
            where = "1"
            params: list[Any] = []
            if after is not None:
                where = f"(p.created_at, p.execution_id) {'<' if newest_first else '>'} (?, ?)"
                params.extend(after)
            rows = conn.execute(
                f"SELECT {self._pending_columns(s)} FROM pending_interrupts p WHERE {where}"
                f" ORDER BY p.created_at {order}, p.execution_id {order} LIMIT ?",
                [*params, limit + 1],
            ).fetchall()
        page = Page.of(rows, limit, shared.pending, shared.pending_key)
        return PendingPage(items=page.items, next_key=page.next_key, total=total)

    # --- idempotency cache -------------------------------------------

    def paused_calls(self, pending: Sequence[Pending]) -> dict[str, PausedCall]:
        checkpoint_ids = [p.checkpoint_id for p in pending if p.checkpoint_id]
        execution_ids = sorted({p.execution_id for p in pending})
        if not checkpoint_ids:
            return {}
        with self._read() as conn:
            s = self._schema_for(conn)
            if not s.has_checkpoints:
                return {}
            marks = ",".join("?" * len(checkpoint_ids))
            key = "checkpoint_id" if "checkpoint_id" in s.checkpoint_columns else "id"
            rows = conn.execute(
                f"SELECT {key} AS checkpoint_id, execution_id, state_snapshot, node_input"
                f" FROM checkpoints WHERE {key} IN ({marks})",
                checkpoint_ids,
            ).fetchall()
            # Each run's rows and paused rows: a run past the SDK's 500-row read, or
            # with an earlier pause, is one whose approval needs the exact check.
            marks = ",".join("?" * len(execution_ids))
            shape = {
                r[0]: (int(r[1]), int(r[2] or 0))
                for r in conn.execute(
                    "SELECT execution_id, COUNT(*), SUM(status = 'interrupted')"
                    f" FROM checkpoints WHERE execution_id IN ({marks}) GROUP BY execution_id",
                    execution_ids,
                ).fetchall()
            }
            cached: dict[str, int] = {}
            if s.has_cache:
                marks = ",".join("?" * len(execution_ids))
                cached = dict(
                    conn.execute(
                        "SELECT execution_id, COUNT(*) FROM idempotency_cache"
                        f" WHERE execution_id IN ({marks}) GROUP BY execution_id",
                        execution_ids,
                    ).fetchall()
                )
        return {
            r["checkpoint_id"]: PausedCall(
                checkpoint_id=r["checkpoint_id"],
                state_snapshot=parse_json(r["state_snapshot"], {}),
                node_input=parse_json(r["node_input"], {}),
                cached_results=int(cached.get(r["execution_id"], 0)),
                run_rows=shape.get(r["execution_id"], (0, 0))[0],
                run_pauses=shape.get(r["execution_id"], (0, 0))[1],
            )
            for r in rows
        }

    def list_cache(self, execution_id: str) -> tuple[CacheEntry, ...]:
        with self._read() as conn:
            if not self._schema_for(conn).has_cache:
                return ()
            rows = conn.execute(
                "SELECT execution_id, function_key, result, created_at FROM idempotency_cache"
                " WHERE execution_id = ? ORDER BY created_at ASC",
                (execution_id,),
            ).fetchall()
        return tuple(shared.cache_entry(r) for r in rows)

    def list_cache_of(self, execution_ids: Sequence[str]) -> dict[str, tuple[CacheEntry, ...]]:
        wanted = list(dict.fromkeys(execution_ids))
        grouped: dict[str, list[CacheEntry]] = {}
        with self._read() as conn:
            if not self._schema_for(conn).has_cache or not wanted:
                return {}
            for start in range(0, len(wanted), CHUNK):
                chunk = wanted[start : start + CHUNK]
                marks = ",".join("?" * len(chunk))
                for r in conn.execute(
                    "SELECT execution_id, function_key, result, created_at FROM idempotency_cache"
                    f" WHERE execution_id IN ({marks}) ORDER BY execution_id, created_at ASC",
                    chunk,
                ):
                    entry = shared.cache_entry(r)
                    grouped.setdefault(entry.execution_id, []).append(entry)
        return {eid: tuple(entries) for eid, entries in grouped.items()}

    def list_cache_before(
        self, cutoff: str, *, after: tuple[str, str] | None = None, limit: int = 50
    ) -> CachePage:
        with self._read() as conn:
            if not self._schema_for(conn).has_cache:
                return CachePage(entries=(), next_key=None, total=0)
            total = int(
                conn.execute(
                    "SELECT COUNT(*) FROM idempotency_cache WHERE created_at < ?", (cutoff,)
                ).fetchone()[0]
            )
            where = "created_at < ?"
            params: list[Any] = [cutoff]
            if after is not None:
                where += " AND (created_at, execution_id || ':' || function_key) > (?, ?)"
                params.extend(after)
            rows = conn.execute(
                "SELECT execution_id, function_key, result, created_at FROM idempotency_cache"
                f" WHERE {where} ORDER BY created_at ASC, execution_id || ':' || function_key ASC"
                " LIMIT ?",
                [*params, limit + 1],
            ).fetchall()
        page = Page.of(rows, limit, shared.cache_entry, shared.cache_key)
        return CachePage(entries=page.items, next_key=page.next_key, total=total)

    # --- lineage ------------------------------------------------------

    def _fork_links(
        self, conn: sqlite3.Connection, where: str, params: Sequence[Any]
    ) -> tuple[ForkLink, ...]:
        s = self._schema_for(conn)
        if "parent_checkpoint_id" not in s.checkpoint_columns:
            return ()
        # The bare column, not the COALESCE, so the lookup uses the SDK's index.
        cid = "checkpoint_id" if "checkpoint_id" in s.checkpoint_columns else "id"
        rows = conn.execute(
            f"""SELECT f.execution_id AS execution_id, f.parent_checkpoint_id AS parent,
                       f.created_at AS created_at, src.execution_id AS source_execution_id,
                       src.node_id AS source_node_id
                FROM checkpoints f
                LEFT JOIN checkpoints src ON src.{cid} = f.parent_checkpoint_id
                WHERE f.node_id = '{FORK_ORIGIN_NODE}' AND {where}
                ORDER BY f.created_at ASC""",
            tuple(params),
        ).fetchall()
        return tuple(shared.fork_link(r) for r in rows)

    def get_fork_origin(self, execution_id: str) -> ForkLink | None:
        with self._read() as conn:
            if not self._schema_for(conn).has_checkpoints:
                return None
            links = self._fork_links(conn, "f.execution_id = ?", (execution_id,))
        return links[0] if links else None

    def list_forks(self, execution_id: str) -> tuple[ForkLink, ...]:
        if self._index.progress() is not None:
            # While the index is built, a scan of the SDK's table (160 ms at 400,000 rows)
            # rather than a wait for the whole build.
            with self._read() as conn:
                if not self._schema_for(conn).has_checkpoints:
                    return ()
                return self._fork_links(conn, "src.execution_id = ?", (execution_id,))
        # The runs index knows each fork's parent row, so no scan of the SDK's table.
        with self._index_errors():
            forks = self._index.forks_of(execution_id)
        return tuple(
            ForkLink(
                execution_id=fork_id,
                source_execution_id=execution_id,
                source_checkpoint_id=parent,
                source_node_id=node_id,
                created_at=first_at,
            )
            for fork_id, parent, node_id, first_at in forks
        )

    def fork_family(self, execution_id: str) -> tuple[ForkLink | None, tuple[ForkLink, ...]]:
        # Two reads in process: each costs microseconds here, unlike a round trip.
        return self.get_fork_origin(execution_id), self.list_forks(execution_id)

    def run_reads(
        self, execution_id: str
    ) -> tuple[RunFacts | None, tuple[RowHeader, ...], tuple[CacheEntry, ...]]:
        # Three reads in process, as for fork_family.
        return (
            self.get_run(execution_id),
            self.list_rows(execution_id),
            self.list_cache(execution_id),
        )

    def compare_reads(
        self, execution_ids: Sequence[str]
    ) -> dict[str, tuple[RunFacts | None, tuple[RowHeader, ...], ForkLink | None]]:
        # In process, one read after another: no round trip to save.
        return {
            eid: (self.get_run(eid), self.list_rows(eid), self.get_fork_origin(eid))
            for eid in dict.fromkeys(execution_ids)
        }

    # --- actions' helpers ---------------------------------------------

    def get_project_id(self, execution_id: str) -> str | None:
        """The SDK project the run's rows are stamped with, so a resume stamps the same."""
        with self._read() as conn:
            s = self._schema_for(conn)
            if "project_id" not in s.checkpoint_columns:
                return None
            row = conn.execute(
                "SELECT project_id FROM checkpoints WHERE execution_id = ?"
                " ORDER BY created_at DESC, rowid DESC LIMIT 1",
                (execution_id,),
            ).fetchone()
        return str(row[0]) if row is not None and row[0] is not None else None

    def prune_preview(self, cutoff: str) -> PrunePreview:
        """Count what ``SQLiteCheckpointer.prune`` deletes, with its own predicate."""
        with self._read() as conn:
            s = self._schema_for(conn)
            if not s.has_checkpoints:
                return PrunePreview(cutoff, 0, 0, (), 0)
            rows = conn.execute(
                """SELECT execution_id, MAX(chain_name) AS agent,
                          SUM(CASE WHEN created_at < ? AND status IN ('completed', 'failed')
                              THEN 1 ELSE 0 END) AS gone,
                          COUNT(*) AS total
                   FROM checkpoints GROUP BY execution_id HAVING gone > 0
                   ORDER BY MAX(created_at) ASC""",
                (cutoff,),
            ).fetchall()
            pauses = int(
                conn.execute(
                    "SELECT COUNT(*) FROM checkpoints WHERE created_at < ?"
                    " AND status = 'interrupted'",
                    (cutoff,),
                ).fetchone()[0]
            )
            cache = 0
            if s.has_cache:
                cache = int(
                    conn.execute(
                        "SELECT COUNT(*) FROM idempotency_cache WHERE created_at < ?", (cutoff,)
                    ).fetchone()[0]
                )
        runs = tuple(shared.prune_run(r) for r in rows)
        with self._index_errors():
            resumable_cache = self._index.resumable_cache_before(cutoff)
        return PrunePreview(
            cutoff=cutoff,
            checkpoint_rows=sum(r.rows_deleted for r in runs),
            cache_rows=cache,
            runs=runs,
            pauses_kept=pauses,
            resumable_cache=resumable_cache,
        )

    # --- totals -------------------------------------------------------

    def count_pending(self) -> int:
        with self._read() as conn:
            if not self._schema_for(conn).has_pending:
                return 0
            return int(conn.execute("SELECT COUNT(*) FROM pending_interrupts").fetchone()[0])

    def totals(self) -> StoreTotals:
        # Kept by the runs index: counting the outbox marks in the SDK's table is a scan.
        with self._index_errors():
            rows, waiting, quarantined = self._index.totals()
        return StoreTotals(
            rows=rows,
            rows_waiting=waiting,
            rows_quarantined=quarantined,
            pending=self.count_pending(),
        )
