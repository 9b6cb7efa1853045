"""Keeping the PostgreSQL runs index up to date with the SDK's tables.

A refresh first reads a gate in one round trip: the server's snapshot (it
moves whenever a transaction that wrote anything ends), the count of rows ever
deleted from ``checkpoints`` and which table that is. When the gate has not
moved, nothing is read. Otherwise, under a transaction-level advisory lock:

* no finished build of this version for this table, or rows deleted since
  (a prune): the index is built anew from the store's own facts query. A small
  store is folded in one ``INSERT … SELECT``; a large one in a thread, in chunks
  of the SDK table's blocks, each chunk its own short transaction (the app
  answers meanwhile, see below);
* otherwise the runs to fold again are those with rows the index has not seen
  among the newest (the change feed's window over ``created_at``), those whose
  pending interrupt came, went or changed, and those whose rows the outbox
  marked since the last look; each is deleted and inserted again from its rows.

Why an advisory lock: a catch-up reads cursors, then writes runs and moves the
cursors. Two processes doing that at once could each fold a run from a
different snapshot and the older could land last, or move the cursors past
rows the other had not folded. With the lock they take turns; a process that
finds the lock taken does not wait, it reads the index as it is (the other is
bringing it up to date) and looks again on its next read.

Why chunks: a single statement over a million runs reads the SDK's table for
minutes, and holds its lock on it all that time. That lock alone blocks no one,
but the SDK's ``PostgresCheckpointer.setup()`` (run once by each process that
writes, before its first write) issues ``ALTER TABLE … ADD COLUMN IF NOT
EXISTS``, which asks for an ACCESS EXCLUSIVE lock even when the columns exist:
it waits behind the long read, and every reader and writer that comes after
queues behind it. A chunk reads for a fraction of a second, so that queue lasts
no longer. The build's cursor (the first block not yet walked) moves in the
chunk's own transaction: a build cut short (the process killed) is finished by
the next process that looks, from there, and two processes building at once take
the chunks in turns.

Why blocks: a chunk is the runs with a row in a range of the SDK table's blocks
(a TID range scan, PostgreSQL 14 on), each folded from all its rows through the
SDK's ``execution_id`` index. The SDK only appends, so a run's rows lie close
together and a chunk reads its blocks about once. Chunks of runs by
``execution_id`` range read a block per row (ids are random): three times the
table over a build, 100 s at a million runs against about 35 s. A run with rows
on both sides of a chunk's edge is folded twice, the second time whole. Rows
written after the build began are the catch-up's (its cursors are set first);
a table rewritten meanwhile (``VACUUM FULL``: its blocks renumbered) starts the
build again, as the table's identity includes its file.

The facts (state included) come from the store's facts query, the SQL the
plain runs list runs over the SDK's rows, whose state rules are
``localui.backends.shared.STATE_SQL``: the same rules as
``localui.runs.run_state``, held together by a test on both backends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from localui.backends import looks
from localui.backends.postgres.index import schema
from localui.backends.postgres.index.schema import Tables
from localui.backends.postgres.pool import Pool, StaleConnection, one_line
from localui.errors import Unavailable
from localui.records import IndexProgress

T = TypeVar("T")

#: Earlier than any row's ``created_at``: where a catch-up of an empty index starts.
_BEFORE_ANY_ROW = datetime(1, 1, 2, tzinfo=UTC)

#: A store with at least this many checkpoint rows (the planner's estimate) is
#: indexed in the background; a smaller one before the first answer.
BACKGROUND_FROM_ROWS = 20_000

#: Rows of the SDK's table folded per transaction of a background build: a chunk
#: takes a fraction of a second, so whatever queues behind its read waits no longer.
BUILD_CHUNK_ROWS = 20_000

#: Meta keys of a build under way: the first block of the SDK's table not walked yet
#: ("" before the first chunk), the block it stops before (the table's end when it
#: began: later rows are the catch-up's), the blocks per chunk, whether it is a first
#: build (the index was empty) and whether runs left without rows are to be swept
#: out at the end (a rebuild, or rows deleted while building).
_BUILD_AFTER = "build_after"
_BUILD_UPTO = "build_upto"
_BUILD_STEP = "build_step"
_BUILD_FIRST = "build_first"
_BUILD_SWEEP = "build_sweep"
#: The last run of the index the sweep has looked at, once the walk is done.
_BUILD_SWEPT = "build_swept"
#: Every key of a build under way, cleared when it is done.
_BUILD_KEYS = (
    _BUILD_AFTER,
    _BUILD_UPTO,
    _BUILD_STEP,
    _BUILD_FIRST,
    _BUILD_SWEEP,
    _BUILD_SWEPT,
)
#: Rows waiting for the plane at or before the newest marked row's time, as the last
#: look counted them: a mark out of the drain's order makes them fewer.
_BEHIND = "behind"
#: Set when a first build in chunks has folded every run and the trigram index is
#: still to be made (text search scans the index's rows until it is).
_SEARCH_PENDING = "search_index_pending"

#: The SDK's rows per 8 kB block when the planner has no estimate yet (about 8.6 in
#: a store of the demo's runs, whose rows carry the conversation so far).
_ROWS_PER_BLOCK = 8.0

#: Rows are new when unseen within this many seconds of the newest row's time
#: (writers whose clocks lag, commits that land late), as in the change feed.
WINDOW = timedelta(seconds=5)


@dataclass(frozen=True, slots=True)
class StoreSql:
    """What the index reads of the SDK's tables, as the store knows their shape now."""

    #: The store's facts CTE (``r``) limited by a ``WHERE`` clause ("" for every run),
    #: with each run's tool arguments.
    facts: Callable[[str], str]
    checkpoints: str
    #: ``pending_interrupts``, or None when the store has none yet.
    pending: str | None
    has_synced: bool


class IndexSync:
    """One index (a set of tables in the app's schema) kept up to date with one store."""

    def __init__(
        self,
        dsn: str,
        tables: Tables,
        store_sql: Callable[[], StoreSql | None],
        *,
        background_from_rows: int = BACKGROUND_FROM_ROWS,
        chunk_rows: int = BUILD_CHUNK_ROWS,
    ) -> None:
        self.dsn = dsn
        self.t = tables
        self.store_sql = store_sql
        self._background_from_rows = background_from_rows
        self._chunk_rows = max(1, chunk_rows)
        self.pool = Pool(
            dsn,
            name="localui-runs-index",
            read_only=False,
            statement_timeout=30.0,
            max_size=4,
            privileges=f"localui keeps its runs index in schema {tables.app_schema}: it needs"
            f" CREATE on the database or on schema {tables.app_schema}",
            # The store that opens the index has just read from the server.
            probe=False,
            # Not a round trip per borrow (three on a run page): a connection that
            # outlived a server restart is found by its first statement instead, and
            # the work is done again on a fresh one (see :meth:`read`).
            check_on_borrow=False,
        )
        self.lock = threading.Lock()
        self._gate: tuple[Any, ...] | None = None
        self._builder: threading.Thread | None = None
        #: Whether reads may use the index while the builder runs: a rebuild (after a
        #: prune) leaves the index readable as it is, a first build does not.
        self._readable_while_building = False
        self._progress = IndexProgress(0, 0)
        self._failure: BaseException | None = None
        #: Set by :meth:`close`: a background build stops after the chunk it is folding
        #: (the next process to look goes on from its cursor).
        self._closing = False
        try:
            self.has_trigrams = self._create()
        except BaseException:
            self.pool.close()
            raise

    def _create(self) -> bool:
        """The tables, created when missing; whether text search has its trigram index."""
        from psycopg import sql

        with self.pool.connection() as conn, conn.cursor() as cur:
            if self._meta_if_any(cur).get("version") == schema.VERSION:
                # There already: nothing to create, and no lock to wait for (another
                # process may be building it, which can take a while).
                return schema.trigram_installed(cur) is not None
        with self.pool.connection() as conn, conn.cursor() as cur:
            # Two processes starting together would race on the catalog.
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.t.lock_key,))
            has_schema = cur.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.t.app_schema,)
            ).fetchone()
            if has_schema is None:
                cur.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.t.app_schema)))
            meta = self._meta_if_any(cur)
            if meta.get("version") not in (None, schema.VERSION):
                for suffix in ("", "_counts", "_totals", "_seen", "_meta"):
                    cur.execute(f"DROP TABLE IF EXISTS {self.t.name(suffix)} CASCADE")
            # One round trip for them all (no parameters: the simple query protocol
            # takes several statements), not two dozen on a first start's path.
            cur.execute(";\n".join(schema.ddl(self.t)))
            cur.execute(
                f"INSERT INTO {self.t.meta} VALUES ('version', %s) ON CONFLICT DO NOTHING",
                (schema.VERSION,),
            )
            trgm = schema.trigram_schema(cur)
            if trgm is not None:
                cur.execute(schema.trigram_index(self.t, trgm))
            return trgm is not None

    def _meta_if_any(self, cur: Any) -> dict[str, str]:
        exists = cur.execute("SELECT to_regclass(%s)", (self.t.meta,)).fetchone()[0]
        if exists is None:
            return {}
        return {str(k): str(v) for k, v in cur.execute(f"SELECT key, value FROM {self.t.meta}")}

    def close(self) -> None:
        with self.lock:
            self._closing = True
            builder = self._builder
        if builder is not None:
            builder.join()
        self.pool.close()

    # --- keeping up -----------------------------------------------------

    def progress(self) -> IndexProgress | None:
        with self.lock:
            return self._progress if self._builder is not None else None

    def read(self, work: Callable[[Any], T], *, by_name: bool = True) -> T:
        """``work(cursor)`` on a pooled connection (rows by name unless ``by_name`` is
        False); once more on a fresh connection when the one lent had outlived a server
        restart. Only work that can be done again goes here: reads, and a refresh
        (its transaction died with the connection)."""
        from psycopg.rows import dict_row, tuple_row

        factory = dict_row if by_name else tuple_row
        try:
            with self.pool.connection() as conn, conn.cursor(row_factory=factory) as cur:
                return work(cur)
        except StaleConnection:
            # The pool has dropped its dead connections: once more on a fresh one.
            with self.pool.connection() as conn, conn.cursor(row_factory=factory) as cur:
                return work(cur)

    def refresh(self) -> bool:
        """Bring the index up to date; False while it is first built in the background.
        Once per page (:mod:`localui.backends.looks`)."""
        if looks.up_to_date(self):
            return True
        with self.lock:
            if looks.up_to_date(self):
                # Another read of this page (the nav's, beside its own) looked meanwhile.
                return True
            if self._builder is not None and not self._readable_while_building:
                return False
            # A builder still at work on a readable index (its trigram index, its
            # vacuum, or a rebuild after a prune) leaves the catch-ups to this.
            failure, self._failure = self._failure, None
            if failure is not None:
                raise Unavailable(
                    f"the runs index in schema {self.t.app_schema} could not be built:"
                    f" {one_line(str(failure))}"
                ) from failure
            answer, gate = self.read(self._bring_up_to_date, by_name=False)
            if gate is not None:
                # Only once its transaction committed (on giving the connection back).
                self._gate = gate
            if answer:
                looks.brought_up_to_date(self)
            return answer

    def _bring_up_to_date(self, cur: Any) -> tuple[bool, tuple[Any, ...] | None]:
        """:meth:`refresh`'s work, under its lock, in the cursor's transaction: its
        answer, and the gate the index is now up to date with (None: unchanged)."""
        conn = cur.connection
        store = self.store_sql()
        gate = self._read_gate(cur, store)
        if gate == self._gate:
            return True, None
        locked = cur.execute(
            "SELECT pg_try_advisory_xact_lock(hashtext(%s))", (self.t.lock_key,)
        ).fetchone()[0]
        meta = self._meta(cur)
        building = self._builder is not None
        if not locked:
            # Another process is bringing the index up to date: read it as it is
            # when built, and look again next time.
            if meta.get("built") == "1":
                return True, None
            # A build under way elsewhere: take chunks in turns with it.
            if not building:
                self._start_builder(rows=self._store_rows(cur, store), readable=False)
            return False, None
        if store is None:
            self._clear(cur, gate)
        elif self._needs_build(meta, gate) and building and not self._readable_while_building:
            # This process's first build is at it: nothing to read until it is done.
            conn.rollback()
            return False, None
        elif self._needs_build(meta, gate) and building:
            # A rebuild after a prune, between two of its chunks (it holds the lock while
            # it folds one): the runs written since the last look are folded in now, as
            # on SQLite, rather than a minute later at a million runs when it is done.
            # Its chunks fold again whatever run they meet, and its sweep drops the runs
            # the prune emptied: folded here or there, a run is folded from its rows.
            self._catch_up(cur, store, meta)
        elif self._needs_build(meta, gate):
            rows = self._store_rows(cur, store)
            if rows >= self._background_from_rows:
                conn.rollback()
                readable = meta.get("built") == "1"
                self._start_builder(rows=rows, readable=readable)
                return readable, None
            self._build(cur, store, gate, first=meta.get("built") != "1")
        else:
            if _SEARCH_PENDING in meta and not building:
                # Left by a build in chunks (here or in a process since gone): made
                # concurrently by a builder, while the runs are kept up to date here.
                self._start_builder(rows=0, readable=True)
            self._catch_up(cur, store, meta)
        return True, gate

    def complete(self) -> None:
        """Return once the index is complete, waiting for a background build."""
        while not self.refresh():
            with self.lock:
                builder = self._builder
            if builder is not None:
                builder.join()

    @staticmethod
    def _store_rows(cur: Any, store: StoreSql | None) -> int:
        """The planner's estimate of the SDK's rows (no count of a million rows)."""
        if store is None:
            return 0
        row = cur.execute(
            "SELECT GREATEST(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            (store.checkpoints,),
        ).fetchone()
        return int(row[0] or 0) if row is not None else 0

    def _read_gate(self, cur: Any, store: StoreSql | None) -> tuple[Any, ...]:
        if store is None:
            return (cur.execute("SELECT pg_current_snapshot()::text").fetchone()[0], None, None)
        # The table's identity is its oid and its file: a rewrite renumbers its blocks.
        # Its deletes are pg_stat_user_tables's n_tup_del, read without the view's joins
        # over the catalogs: this is a round trip of every page.
        row = cur.execute(
            "SELECT pg_current_snapshot()::text, pg_stat_get_tuples_deleted(c.oid),"
            " c.oid::bigint || '/' || pg_relation_filenode(c.oid)"
            " FROM (SELECT to_regclass(%s) AS oid) AS c",
            (store.checkpoints,),
        ).fetchone()
        return (row[0], int(row[1] or 0), str(row[2] or ""))

    def _meta(self, cur: Any) -> dict[str, str]:
        return {str(k): str(v) for k, v in cur.execute(f"SELECT key, value FROM {self.t.meta}")}

    @staticmethod
    def _needs_build(meta: dict[str, str], gate: tuple[Any, ...]) -> bool:
        return (
            meta.get("version") != schema.VERSION
            or meta.get("built") != "1"
            or _BUILD_AFTER in meta
            or meta.get("table") != str(gate[2])
            or meta.get("deleted") != str(gate[1])
        )

    def _set_meta(self, cur: Any, values: dict[str, str | None]) -> None:
        for key, value in values.items():
            if value is None:
                cur.execute(f"DELETE FROM {self.t.meta} WHERE key = %s", (key,))
            else:
                cur.execute(
                    f"INSERT INTO {self.t.meta} VALUES (%s, %s)"
                    " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                    (key, value),
                )

    # --- the background build -------------------------------------------

    def _start_builder(self, *, rows: int, readable: bool) -> None:
        self._progress = IndexProgress(0, rows)
        self._readable_while_building = readable
        self._builder = threading.Thread(
            target=self._build_in_background, name="localui-pg-runs-index", daemon=True
        )
        self._builder.start()

    def _build_in_background(self) -> None:
        import psycopg

        failure: BaseException | None = None
        try:
            with (
                psycopg.connect(self.dsn, connect_timeout=3, autocommit=True) as conn,
                conn.cursor() as cur,
            ):
                cur.execute("SET TIME ZONE 'UTC'")
                # Chunks are short; the trigram index over a million runs, at the end, is not.
                cur.execute("SET statement_timeout = 0")
                # A chunk's sorts in memory, not spilled to disk.
                cur.execute("SET work_mem = '64MB'")
                # Compiling a chunk's plan took longer than the time it saved (17 ms
                # of the 150 a chunk takes).
                cur.execute("SET jit = off")
                # A chunk's commit does not wait for its WAL to reach the disk: a server
                # that crashes may lose the last chunks, each whole with its cursor, and
                # the build goes on from the cursor it kept.
                cur.execute("SET synchronous_commit = off")
                while not self._closing and not self._build_step(conn, cur):
                    pass
                if not self._closing:
                    self._vacuum(cur)
        except Exception as exc:
            failure = exc
        with self.lock:
            total = self._progress.rows_total
            self._progress = IndexProgress(total, total)
            self._builder = None
            self._gate = None
            self._failure = failure

    def _vacuum(self, cur: Any) -> None:
        """Outside any transaction, once every run is in: the visibility map (index-only
        scans) and hint bits now, rather than by autovacuum a minute later, in the
        middle of someone's pages. Autovacuum still does it when this cannot."""
        import psycopg

        try:
            cur.execute(f"VACUUM {self.t.runs}")
        except psycopg.Error:
            return

    def _build_step(self, conn: Any, cur: Any) -> bool:
        """One transaction of a background build: start it, fold a chunk, or (when
        the index needs no build any more) catch up. True when nothing is left."""
        with conn.transaction():
            # Waits at most for a chunk another process is folding.
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.t.lock_key,))
            store = self.store_sql()
            gate = self._read_gate(cur, store)
            meta = self._meta(cur)
            if meta.get("built") == "1":
                with self.lock:
                    # Every run is folded (committed): read the index while the rest,
                    # the trigram index, is made.
                    self._readable_while_building = True
            if store is None:
                self._clear(cur, gate)
                return True
            if not self._needs_build(meta, gate):
                if _SEARCH_PENDING not in meta:
                    self._catch_up(cur, store, meta)
                    return True
            else:
                return self._build_chunk(cur, store, gate, meta)
        # Outside the transaction and its lock: built concurrently, beside the catch-ups
        # that keep the runs list up to date meanwhile.
        self._make_search_index(conn, cur)
        return False

    def _build_chunk(
        self, cur: Any, store: StoreSql, gate: tuple[Any, ...], meta: dict[str, str]
    ) -> bool:
        """In the build step's transaction: start the build, or fold its next chunk."""
        if _BUILD_AFTER not in meta or meta.get("table") != str(gate[2]):
            self._start_build(cur, store, gate, first=meta.get("built") != "1")
            return False
        if meta.get("deleted") != str(gate[1]):
            # Rows were deleted (a prune) while building: the runs folded so far may
            # have lost rows, so the walk starts again, and runs left without any
            # are swept out at the end. The catch-up cursors stay: older cursors
            # only fold more again.
            self._set_meta(
                cur,
                {
                    _BUILD_AFTER: "",
                    _BUILD_SWEEP: "1",
                    _BUILD_SWEPT: None,
                    "deleted": str(gate[1]),
                },
            )
            meta = self._meta(cur)
        return self._fold_chunk(cur, store, meta)

    def _start_build(
        self, cur: Any, store: StoreSql, gate: tuple[Any, ...], *, first: bool
    ) -> None:
        """Begin a chunked build: the catch-up cursors, then the cursor of the build."""
        t = self.t
        # As in _build: cursors first, so whatever they count as folded is.
        newest = self._newest(cur, store)
        synced = self._newest_synced(cur, store)
        behind = self._behind(cur, store, synced[0] if synced else None)[1]
        if first:
            cur.execute(f"TRUNCATE {t.runs}, {t.counts}, {t.seen}")
            cur.execute(f"UPDATE {t.totals} SET rows = 0, waiting = 0, quarantined = 0")
            cur.execute(f"DROP INDEX IF EXISTS {t.qualified_index('search')}")
            # Nothing reads a first build before it is done: its indexes are made then.
            for statement in schema.drop_secondary_indexes(t):
                cur.execute(statement)
            # Nor is it vacuumed meanwhile: autovacuum, woken by the inserts, took a core
            # from the build for seconds at a time; the build vacuums once at its end.
            cur.execute(f"ALTER TABLE {t.runs} SET (autovacuum_enabled = false)")
        else:
            # A rebuild: the runs stay readable, each replaced as its blocks are walked.
            cur.execute(f"DELETE FROM {t.seen}")
        if newest is not None:
            self._see_window(cur, store, newest)
        blocks, rows = cur.execute(
            "SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint,"
            " GREATEST(c.reltuples, 0)::bigint FROM pg_class c WHERE c.oid = to_regclass(%s)",
            (store.checkpoints,),
        ).fetchone()
        if cur.connection.info.server_version < 140000:
            # No TID range scans before PostgreSQL 14: a range of blocks would scan the
            # whole table each time, so the walk is one chunk.
            step = max(1, blocks)
        else:
            # Never analyzed (no estimate): about as many as the SDK's rows fill a block.
            per_block = rows / blocks if blocks and rows else _ROWS_PER_BLOCK
            step = max(1, int(self._chunk_rows / per_block))
        self._set_meta(
            cur,
            {
                _BUILD_AFTER: "",
                _BUILD_UPTO: str(blocks),
                _BUILD_STEP: str(step),
                _BUILD_FIRST: "1" if first else "0",
                _BUILD_SWEEP: None if first else "1",
                "table": str(gate[2]),
                "deleted": str(gate[1]),
                "newest": newest.isoformat() if newest is not None else None,
                "synced_at": synced[0].isoformat() if synced else None,
                "synced_id": synced[1] if synced else None,
                _BEHIND: str(behind),
            },
        )

    def _fold_chunk(self, cur: Any, store: StoreSql, meta: dict[str, str]) -> bool:
        """Fold the runs with a row in the next ``build_step`` blocks and move the cursor;
        after the last chunk, finish. True when finished."""
        t = self.t
        after, upto = int(meta[_BUILD_AFTER] or 0), int(meta[_BUILD_UPTO])
        end = min(upto, after + int(meta[_BUILD_STEP]))
        first = meta.get(_BUILD_FIRST) == "1"
        if after < end:
            touched = [
                str(r[0])
                for r in cur.execute(
                    f"SELECT DISTINCT execution_id FROM {store.checkpoints}"
                    " WHERE ctid >= %s::tid AND ctid < %s::tid",
                    (f"({after},0)", f"({end},0)"),
                )
            ]
            if touched and first and meta.get(_BUILD_SWEEP) != "1":
                # A first build that saw no deletes: a run met in an earlier chunk was
                # folded whole then (rows written since are the catch-up's), so it
                # is kept, and nothing is deleted first.
                self._insert_runs(cur, store, touched, keep_folded=True)
            elif touched:
                # Each run met is folded again, replacing what the index held.
                self.refold(cur, store, touched)
            with self.lock:
                total = self._progress.rows_total
                self._progress = IndexProgress(total * end // max(upto, 1), total)
        if end < upto:
            self._set_meta(cur, {_BUILD_AFTER: str(end)})
            return False
        if meta.get(_BUILD_SWEEP) == "1" and not self._sweep_chunk(cur, store, meta):
            self._set_meta(cur, {_BUILD_AFTER: str(end)})
            return False
        if first:
            for statement in schema.secondary_indexes(t):
                cur.execute(statement)
            cur.execute(f"ALTER TABLE {t.runs} RESET (autovacuum_enabled)")
        self._analyze(cur)
        # Complete: the runs list, its filters and counts read the index from now on.
        # On a first build the trigram index comes next, in a transaction of its own
        # (far faster than kept up chunk by chunk, and a million runs take it tens of
        # seconds: text search scans the index's rows meanwhile).
        search_pending = first and self.has_trigrams
        self._set_meta(
            cur,
            {
                "built": "1",
                **dict.fromkeys(_BUILD_KEYS),
                _SEARCH_PENDING: "1" if search_pending else None,
            },
        )
        return not search_pending

    def _sweep_chunk(self, cur: Any, store: StoreSql, meta: dict[str, str]) -> bool:
        """Drop the runs left without rows (a prune) among the index's next
        ``chunk_rows`` runs: no walk of the SDK's blocks meets them. True when swept
        to the end. In chunks, as the walk: over a million runs, one statement would
        read the SDK's table for seconds."""
        after = meta.get(_BUILD_SWEPT, "")
        lower = "execution_id > %(after)s" if after else "true"
        params: dict[str, Any] = {"after": after, "rows": self._chunk_rows}
        found = cur.execute(
            f"SELECT execution_id FROM {self.t.runs} WHERE {lower}"
            " ORDER BY execution_id OFFSET %(rows)s LIMIT 1",
            params,
        ).fetchone()
        upper = ""
        if found is not None:
            params["upto"] = str(found[0])
            upper = " AND execution_id <= %(upto)s"
        cur.execute(
            f"DELETE FROM {self.t.runs} r WHERE {lower}{upper} AND NOT EXISTS"
            f" (SELECT 1 FROM {store.checkpoints} c WHERE c.execution_id = r.execution_id)",
            params,
        )
        if found is None:
            return True
        self._set_meta(cur, {_BUILD_SWEPT: str(found[0])})
        return False

    def _make_search_index(self, conn: Any, cur: Any) -> None:
        """The trigram index a first build in chunks left to make, built concurrently
        (in autocommit, outside the index's lock): a plain ``CREATE INDEX`` holds off
        every write to the runs for its whole length (16 s at a million runs), and so
        every catch-up: a run written meanwhile was missing from every runs list."""
        trgm = schema.trigram_schema(cur)
        if trgm is not None:
            name = self.t.qualified_index("search")
            # A concurrent build cut short (the process stopped) leaves an invalid index
            # that IF NOT EXISTS would keep for good: it is dropped and made again.
            invalid = cur.execute(
                "SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(%s) AND NOT indisvalid",
                (name,),
            ).fetchone()
            if invalid is not None:
                cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            cur.execute(schema.trigram_index(self.t, trgm, concurrently=True))
        with conn.transaction():
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.t.lock_key,))
            self._set_meta(cur, {_SEARCH_PENDING: None})

    # --- folding --------------------------------------------------------

    def _clear(self, cur: Any, gate: tuple[Any, ...]) -> None:
        for table in (self.t.runs, self.t.counts, self.t.seen):
            cur.execute(f"DELETE FROM {table}")
        cur.execute(f"UPDATE {self.t.totals} SET rows = 0, waiting = 0, quarantined = 0")
        self._set_meta(cur, {"built": None})

    def _newest(self, cur: Any, store: StoreSql) -> Any:
        cp = store.checkpoints
        # Each half is a lookup on the SDK's (synced, created_at) index; the max over
        # both would be a scan.
        sql = (
            f"SELECT GREATEST((SELECT max(created_at) FROM {cp} WHERE synced = false),"
            f" (SELECT max(created_at) FROM {cp} WHERE synced = true))"
            if store.has_synced
            else f"SELECT max(created_at) FROM {cp}"
        )
        return cur.execute(sql).fetchone()[0]

    def _newest_synced(self, cur: Any, store: StoreSql) -> tuple[Any, str] | None:
        if not store.has_synced:
            return None
        row = cur.execute(
            f"SELECT created_at, checkpoint_id FROM {store.checkpoints} WHERE synced = true"
            " ORDER BY created_at DESC LIMIT 1"
        ).fetchone()
        return (row[0], str(row[1])) if row else None

    def _build(self, cur: Any, store: StoreSql, gate: tuple[Any, ...], *, first: bool) -> None:
        """Fold every run anew, in this transaction. A first build empties the tables
        and puts the trigram index back after (fastest); a rebuild (after a prune)
        deletes and inserts, so other processes read the old index until it commits."""
        t = self.t
        # The cursors are read before the runs, each statement on a snapshot at least
        # as new as the one before: whatever the cursors count as folded is in the
        # runs, and what comes in between is folded (again) by the next catch-up.
        newest = self._newest(cur, store)
        synced = self._newest_synced(cur, store)
        behind = self._behind(cur, store, synced[0] if synced else None)[1]
        if first:
            cur.execute(f"TRUNCATE {t.runs}, {t.counts}, {t.seen}")
            cur.execute(f"UPDATE {t.totals} SET rows = 0, waiting = 0, quarantined = 0")
            # The trigram index is put back after the runs are in: far faster than
            # keeping it up run by run.
            cur.execute(f"DROP INDEX IF EXISTS {t.qualified_index('search')}")
        else:
            # Counts and totals follow the delete (the triggers).
            cur.execute(f"DELETE FROM {t.runs}")
            cur.execute(f"DELETE FROM {t.seen}")
        if newest is not None:
            self._see_window(cur, store, newest)
        cur.execute(
            f"INSERT INTO {t.runs} ({schema.COLUMNS}) {store.facts('')}"
            f" SELECT {schema.FROM_FACTS} FROM r"
        )
        if first and self.has_trigrams:
            trgm = schema.trigram_schema(cur)
            if trgm is not None:
                cur.execute(schema.trigram_index(t, trgm))
        self._analyze(cur)
        self._set_meta(
            cur,
            {
                "built": "1",
                **dict.fromkeys(_BUILD_KEYS),
                _SEARCH_PENDING: None,
                "table": str(gate[2]),
                "deleted": str(gate[1]),
                "newest": newest.isoformat() if newest is not None else None,
                "synced_at": synced[0].isoformat() if synced else None,
                "synced_id": synced[1] if synced else None,
                _BEHIND: str(behind),
            },
        )

    def _analyze(self, cur: Any) -> None:
        """The planner's statistics of the runs just built, in the build's transaction.

        Without them the planner guesses: a run page's lookup of its forks by
        ``fork_parent`` became a scan of every run (17 ms at 100,000 runs, on each
        run page) until autovacuum got round to the table, up to a minute later.
        """
        cur.execute(f"ANALYZE {self.t.runs}")

    def _window_rows(self, store: StoreSql) -> str:
        in_index = " AND synced IN (false, true)" if store.has_synced else ""
        waiting = "synced = false" if store.has_synced else "false"
        return (
            f"SELECT checkpoint_id, execution_id, created_at, {waiting} AS waiting"
            f" FROM {store.checkpoints} WHERE created_at > %(since)s{in_index}"
        )

    def _see_window(self, cur: Any, store: StoreSql, newest: Any) -> None:
        cur.execute(
            f"INSERT INTO {self.t.seen} SELECT checkpoint_id, created_at FROM"
            f" ({self._window_rows(store)}) w ON CONFLICT DO NOTHING",
            {"since": newest - WINDOW},
        )

    def _catch_up(self, cur: Any, store: StoreSql, meta: dict[str, str]) -> None:
        t = self.t
        changed: set[str] = set()
        previous = datetime.fromisoformat(meta["newest"]) if meta.get("newest") else None
        params = {"since": previous - WINDOW if previous is not None else _BEFORE_ANY_ROW}
        # The rows not seen before among the newest: (run, created_at, waiting).
        fresh_rows = cur.execute(
            f"WITH fresh AS ({self._window_rows(store)}),"
            f" added AS (INSERT INTO {t.seen} SELECT checkpoint_id, created_at FROM fresh"
            " ON CONFLICT DO NOTHING RETURNING checkpoint_id, created_at)"
            " SELECT f.execution_id, f.created_at, f.waiting FROM fresh f JOIN added a"
            " USING (checkpoint_id, created_at)",
            params,
        ).fetchall()
        changed.update(str(r[0]) for r in fresh_rows)
        updates: dict[str, str | None] = {}
        if changed:
            newest = self._newest(cur, store)
            if newest is not None:
                cur.execute(f"DELETE FROM {t.seen} WHERE created_at <= %s", (newest - WINDOW,))
                updates["newest"] = newest.isoformat()
        # Pauses that came, went or changed their reason.
        if store.pending is not None:
            changed.update(
                str(r[0])
                for r in cur.execute(
                    f"SELECT p.execution_id FROM {store.pending} p WHERE NOT EXISTS"
                    f" (SELECT 1 FROM {t.runs} r WHERE r.execution_id = p.execution_id"
                    " AND r.has_pending AND r.pending_reason IS NOT DISTINCT FROM p.reason)"
                    f" UNION SELECT r.execution_id FROM {t.runs} r WHERE r.has_pending"
                    f" AND NOT EXISTS (SELECT 1 FROM {store.pending} p"
                    " WHERE p.execution_id = r.execution_id)"
                ).fetchall()
            )
        else:
            changed.update(
                str(r[0])
                for r in cur.execute(f"SELECT execution_id FROM {t.runs} WHERE has_pending")
            )
        # Rows the outbox marked in place (synced, or quarantined: both set synced);
        # it drains oldest first, so they lie between the two newest marked rows.
        synced = self._newest_synced(cur, store)
        before = (meta.get("synced_at"), meta.get("synced_id"))
        now = (synced[0].isoformat(), synced[1]) if synced else (None, None)
        old_front = datetime.fromisoformat(before[0]) if before[0] is not None else None
        # Counted before the marks are read: a mark made after the count is found by
        # the next look, whichever side of the front it lands.
        behind_old, behind_now = self._behind(cur, store, synced[0] if synced else None, old_front)
        if synced is not None and now != before:
            sql = (
                f"SELECT DISTINCT execution_id FROM {store.checkpoints}"
                " WHERE synced = true AND created_at <= %(to)s"
            )
            marked: dict[str, Any] = {"to": synced[0]}
            if old_front is not None:
                sql += " AND created_at >= %(from)s"
                marked["from"] = old_front
            changed.update(str(r[0]) for r in cur.execute(sql, marked).fetchall())
            updates.update(synced_at=now[0], synced_id=now[1])
        if old_front is not None and meta.get(_BEHIND) is not None:
            # Rows marked out of the drain's order (another drain, a mark by hand) lie
            # before the front, outside the range above: the rows waiting there are
            # fewer than the last look counted, beside those written there since.
            late = sum(1 for _, at, waiting in fresh_rows if waiting and at <= old_front)
            if behind_old != int(meta[_BEHIND]) + late:
                changed.update(self._marked_behind(cur, store, old_front))
        if meta.get(_BEHIND) != str(behind_now):
            updates[_BEHIND] = str(behind_now)
        if changed:
            self.refold(cur, store, sorted(changed))
        if updates:
            self._set_meta(cur, updates)

    def _behind(
        self, cur: Any, store: StoreSql, front: Any, earlier: Any = None
    ) -> tuple[int, int]:
        """The rows waiting for the plane at or before ``earlier`` and at or before
        ``front`` (0 where either is None), in one statement, so both are of one
        snapshot. A range of the SDK's ``(synced, created_at)`` index: behind a drain
        that marks oldest first only the rows it has not reached yet (written late,
        or skipped) wait there, a handful."""
        if not store.has_synced or front is None:
            return 0, 0
        upto = front if earlier is None else max(front, earlier)
        row = cur.execute(
            "SELECT count(*) FILTER (WHERE created_at <= %(earlier)s), count(*)"
            f" FILTER (WHERE created_at <= %(front)s) FROM {store.checkpoints}"
            " WHERE synced = false AND created_at <= %(upto)s",
            {"earlier": earlier if earlier is not None else front, "front": front, "upto": upto},
        ).fetchone()
        return int(row[0]), int(row[1])

    def _marked_behind(self, cur: Any, store: StoreSql, front: Any) -> set[str]:
        """The runs whose rows waiting in the store are not what the index holds, among
        those with rows waiting at or before ``front``: the runs marked out of order.
        One lookup per such run in the SDK's ``execution_id`` index; a drain that marks
        oldest first never comes here."""
        return {
            str(r[0])
            for r in cur.execute(
                f"SELECT r.execution_id FROM {self.t.runs} r WHERE r.rows_waiting > 0"
                " AND r.first_at <= %(front)s AND r.rows_waiting <> (SELECT count(*)"
                f" FROM {store.checkpoints} c WHERE c.execution_id = r.execution_id"
                " AND c.synced = false)",
                {"front": front},
            ).fetchall()
        }

    def refold(self, cur: Any, store: StoreSql, execution_ids: list[str]) -> None:
        """Fold these runs again from their rows; a run with none left is dropped."""
        t = self.t
        cur.execute(
            f"DELETE FROM {t.runs} WHERE execution_id = ANY(%(ids)s)", {"ids": execution_ids}
        )
        self._insert_runs(cur, store, execution_ids)

    def _insert_runs(
        self, cur: Any, store: StoreSql, execution_ids: list[str], *, keep_folded: bool = False
    ) -> None:
        """Fold these runs from their rows; ``keep_folded``: leave those the index
        holds as they are (else there must be none)."""
        keep = " ON CONFLICT (execution_id) DO NOTHING" if keep_folded else ""
        cur.execute(
            f"INSERT INTO {self.t.runs} ({schema.COLUMNS})"
            f" {store.facts('WHERE execution_id = ANY(%(ids)s)')}"
            f" SELECT {schema.FROM_FACTS} FROM r{keep}",
            {"ids": execution_ids},
        )
