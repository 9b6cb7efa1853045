"""The PostgreSQL runs index's tables, in the app's schema (``--pg-app-schema``).

One set of tables per SDK schema it describes, so two stores on one database
can share an app schema:

- ``runs_<store>``: one row per run, the same facts the SQLite index keeps, and
  ``search``, the text the runs list searches (id, agent, pause reason and tool
  arguments, one per line), under a trigram index when ``pg_trgm`` is there;
- ``runs_<store>_counts`` and ``runs_<store>_totals``: runs per state and rows
  across the store, kept by statement triggers on ``runs_<store>`` (a page's
  counts are then one small read, not a count over a million runs);
- ``runs_<store>_seen``: the checkpoint ids already folded in among the newest
  rows (the catch-up's window, as the change feed keeps it);
- ``runs_<store>_meta``: the version, whether a build finished, and the
  cursors a catch-up starts from.

The SDK's own tables are only ever read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

#: Bump when the tables, or what a row holds, change: an index of another version is
#: built anew. 2: ``agent`` is the run's owner (a team), not its newest row's agent.
#: 3: a build in chunks walks the SDK table's blocks (its cursor is a block number).
#: 4: the owner of an agent-as-tool's own execution is that agent, not the one above it.
#: 5: an index of the runs with quarantined rows (the attention page).
#: 6: a run's end reason (``run_reason``: cancelled, timed out) and the states it makes.
VERSION = "6"

#: The columns of ``runs_<store>`` a fold fills, in the order a build inserts them.
RUN_COLUMNS = (
    "execution_id",
    "agent",
    "row_count",
    "first_at",
    "last_at",
    "last_checkpoint_id",
    "last_node_id",
    "last_step_type",
    "last_status",
    "has_pending",
    "pending_reason",
    "fork_parent",
    "rows_waiting",
    "rows_quarantined",
    "state",
    "tool_args",
    "run_reason",
)
COLUMNS = ", ".join(RUN_COLUMNS)

#: Each column as the store's facts CTE (``r``) names it.
FROM_FACTS = ", ".join(
    {
        "last_checkpoint_id": "COALESCE(last_cid, '')",
        "last_node_id": "COALESCE(last_node_id, '')",
        "agent": "COALESCE(agent, '')",
        "rows_waiting": "COALESCE(rows_waiting, 0)",
        "rows_quarantined": "COALESCE(rows_quarantined, 0)",
    }.get(c, c)
    for c in RUN_COLUMNS
)


def _quoted(name: str) -> str:
    from psycopg import sql

    return sql.Identifier(name).as_string()


@dataclass(frozen=True, slots=True)
class Tables:
    """The index's table names for one SDK schema, quoted for SQL."""

    app_schema: str
    store_schema: str

    @property
    def base(self) -> str:
        # Identifiers stop at 63 bytes: a long store name is shortened by a hash.
        name = f"runs_{self.store_schema}"
        if len(name) > 40:
            name = "runs_" + hashlib.sha256(self.store_schema.encode()).hexdigest()[:16]
        return name

    def name(self, suffix: str = "") -> str:
        return f"{_quoted(self.app_schema)}.{_quoted(self.base + suffix)}"

    @property
    def runs(self) -> str:
        return self.name()

    @property
    def counts(self) -> str:
        return self.name("_counts")

    @property
    def totals(self) -> str:
        return self.name("_totals")

    @property
    def seen(self) -> str:
        return self.name("_seen")

    @property
    def meta(self) -> str:
        return self.name("_meta")

    def index(self, suffix: str) -> str:
        """An index's bare name (indexes live in their table's schema)."""
        return _quoted(f"{self.base}_{suffix}")

    def qualified_index(self, suffix: str) -> str:
        """An index's name with its schema, as ``DROP INDEX`` takes it."""
        return f"{_quoted(self.app_schema)}.{self.index(suffix)}"

    @property
    def lock_key(self) -> str:
        """Named in ``pg_advisory_xact_lock(hashtext(...))``: one lock per index."""
        return f"localui runs index {self.app_schema}.{self.base}"


def ddl(t: Tables) -> list[str]:
    """Create the tables, triggers and indexes (each only when missing)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.runs} (
            execution_id       TEXT PRIMARY KEY,
            agent              TEXT NOT NULL,
            row_count          BIGINT NOT NULL,
            first_at           TIMESTAMPTZ,
            last_at            TIMESTAMPTZ,
            last_checkpoint_id TEXT NOT NULL,
            last_node_id       TEXT NOT NULL,
            last_step_type     TEXT,
            last_status        TEXT NOT NULL,
            has_pending        BOOLEAN NOT NULL,
            pending_reason     TEXT,
            fork_parent        TEXT,
            rows_waiting       BIGINT NOT NULL,
            rows_quarantined   BIGINT NOT NULL,
            state              TEXT NOT NULL,
            tool_args          TEXT NOT NULL,
            -- Why a run that ended failed was stopped on purpose (the SDK's run_reason).
            run_reason         TEXT,
            search             TEXT GENERATED ALWAYS AS (
                execution_id || E'\\n' || agent || E'\\n' || COALESCE(pending_reason, '')
                || E'\\n' || tool_args) STORED
        )""",
        f"CREATE TABLE IF NOT EXISTS {t.counts} (state TEXT PRIMARY KEY, n BIGINT NOT NULL)",
        f"""CREATE TABLE IF NOT EXISTS {t.totals} (
            id INT PRIMARY KEY CHECK (id = 1),
            rows BIGINT NOT NULL, waiting BIGINT NOT NULL, quarantined BIGINT NOT NULL)""",
        f"INSERT INTO {t.totals} VALUES (1, 0, 0, 0) ON CONFLICT DO NOTHING",
        f"""CREATE TABLE IF NOT EXISTS {t.seen} (
            checkpoint_id TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL,
            -- A row is new to the index when its id or its time is.
            PRIMARY KEY (checkpoint_id, created_at))""",
        f"CREATE TABLE IF NOT EXISTS {t.meta} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        *secondary_indexes(t),
        # Counts and totals follow every insert and delete, a statement at a time
        # (a build inserts a million runs in one statement: one update, not a million).
        *_upkeep(t, "ins", "INSERT", "changed_new", "+"),
        *_upkeep(t, "del", "DELETE", "changed_old", "-"),
    ]


#: The runs table's indexes besides its primary key (and the trigram index, made
#: apart), by name suffix: a first build in chunks drops them and makes each once at
#: the end, far faster than keeping them up row by row.
_SECONDARY = {
    "recent": '(last_at DESC, execution_id COLLATE "C" DESC)',
    "state": '(state, last_at DESC, execution_id COLLATE "C" DESC)',
    "agent": '(agent, last_at DESC, execution_id COLLATE "C" DESC)',
    "fork": "(fork_parent) WHERE fork_parent IS NOT NULL",
    "pending": "(execution_id) WHERE has_pending",
    "waiting": "(execution_id) WHERE rows_waiting > 0",
    "quarantined": '(last_at DESC, execution_id COLLATE "C" DESC) WHERE rows_quarantined > 0',
}


def secondary_indexes(t: Tables) -> list[str]:
    """Create the runs table's indexes besides its primary key (each only when missing)."""
    return [
        f"CREATE INDEX IF NOT EXISTS {t.index(suffix)} ON {t.runs} {columns}"
        for suffix, columns in _SECONDARY.items()
    ]


def drop_secondary_indexes(t: Tables) -> list[str]:
    return [f"DROP INDEX IF EXISTS {t.qualified_index(suffix)}" for suffix in _SECONDARY]


def _upkeep(t: Tables, name: str, event: str, rows: str, sign: str) -> list[str]:
    fn = t.name(f"_{name}")
    new_or_old = "NEW" if event == "INSERT" else "OLD"
    return [
        f"""CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {t.counts} AS c (state, n)
                SELECT state, {sign}COUNT(*) FROM {rows} GROUP BY state
                ON CONFLICT (state) DO UPDATE SET n = c.n + EXCLUDED.n;
            UPDATE {t.totals} SET rows = rows {sign} s.r, waiting = waiting {sign} s.w,
                    quarantined = quarantined {sign} s.q
                FROM (SELECT COALESCE(SUM(row_count), 0) AS r, COALESCE(SUM(rows_waiting), 0) AS w,
                             COALESCE(SUM(rows_quarantined), 0) AS q FROM {rows}) s;
            RETURN NULL;
        END $$""",
        f"DROP TRIGGER IF EXISTS {t.index(name)} ON {t.runs}",
        f"""CREATE TRIGGER {t.index(name)} AFTER {event} ON {t.runs}
            REFERENCING {new_or_old} TABLE AS {rows} FOR EACH STATEMENT
            EXECUTE FUNCTION {fn}()""",
    ]


def trigram_installed(cur: Any) -> str | None:
    """The schema ``pg_trgm`` is installed in, or None."""
    row = cur.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
        " WHERE e.extname = 'pg_trgm'"
    ).fetchone()
    return str(row[0]) if row is not None else None


def trigram_schema(cur: Any) -> str | None:
    """The schema ``pg_trgm`` is installed in, creating it when this role may; None
    when it is not there and cannot be (text search then scans the index's rows)."""
    import psycopg

    installed = trigram_installed(cur)
    if installed is not None:
        return installed
    try:
        with cur.connection.transaction():
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.FeatureNotSupported):
        return None
    except psycopg.errors.UndefinedFile:
        # The server has no contrib modules installed.
        return None
    return trigram_schema(cur)


def trigram_index(t: Tables, trgm_schema: str, *, concurrently: bool = False) -> str:
    """``concurrently``: built beside writes to the runs (outside any transaction), as
    the background build makes it, so catch-ups go on meanwhile."""
    how = "CONCURRENTLY " if concurrently else ""
    return (
        f"CREATE INDEX {how}IF NOT EXISTS {t.index('search')} ON {t.runs}"
        f" USING gin (search {_quoted(trgm_schema)}.gin_trgm_ops)"
    )
