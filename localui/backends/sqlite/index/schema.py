"""The runs index's file: where it lives, its tables, triggers and bookkeeping.

One row per run in ``runs`` (its facts, its derived state and the text search
looks in), counts per state and store totals kept by triggers, an FTS5 trigram
index for text search when SQLite has FTS5, and ``meta``: the version of these
tables, which store file the index describes, the store's rowid up to which
it is folded in, and the newest row the outbox had marked when it last looked.

A build of a large store loads ``runs`` first and fills the trigram index after,
in short steps (``fill_text_step``), so the runs list is complete sooner and a
catch-up never waits long for the file; ``text_filled`` says how far it has got,
and search scans ``runs`` until it is done.

Once it is, runs folded in later are put in the trigram index in batches
(``extend_text_index``) rather than one by one as they are inserted: FTS5 writes a
segment per transaction and merges them as they pile up, so a run put in by each
catch-up of a store written to hundreds of times a second cost about 2.5 ms (against
0.2 ms in a batch), most of the catch-up. Search looks up the trigram index for the
runs it holds and scans the few newer ones (``text_upto``).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
from pathlib import Path

from localui.backends.sqlite.connect import connect as connect_file
from localui.backends.sqlite.connect import transaction
from localui.backends.sqlite.files import SMALL_CACHE_KIB, read_uri
from localui.errors import Unavailable
from localui.paths import cache_dir

#: Bump when the index's tables change, or what a row holds: an index of another version
#: is rebuilt. 7: the owner of an agent-as-tool's own execution is that agent, not the
#: one above it; the trigram index is filled in batches.
#: 8: an index of the runs with quarantined rows (the attention page).
#: 9: a run folded again with its searched text unchanged is updated in place (the
#: counts kept by an update trigger).
#: 10: a run's end reason (``run_reason``: cancelled, timed out) and the states it makes.
VERSION = "10"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    execution_id       TEXT PRIMARY KEY,
    agent              TEXT NOT NULL,
    row_count          INTEGER NOT NULL,
    first_at           TEXT NOT NULL,
    last_at            TEXT NOT NULL,
    last_rowid         INTEGER NOT NULL,
    last_checkpoint_id TEXT NOT NULL,
    last_node_id       TEXT NOT NULL,
    last_step_type     TEXT,
    last_status        TEXT NOT NULL,
    has_pending        INTEGER NOT NULL,
    pending_reason     TEXT,
    fork_parent        TEXT,
    rows_waiting       INTEGER NOT NULL,
    rows_quarantined   INTEGER NOT NULL,
    state              TEXT NOT NULL,
    -- The tools' arguments, for the runs list's text search.
    tool_args          TEXT NOT NULL,
    -- Why a run that ended failed was stopped on purpose (the SDK's run_reason).
    run_reason         TEXT
);
CREATE TABLE IF NOT EXISTS state_counts (state TEXT PRIMARY KEY, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    rows INTEGER NOT NULL, waiting INTEGER NOT NULL, quarantined INTEGER NOT NULL
);
INSERT OR IGNORE INTO totals VALUES (1, 0, 0, 0);
-- The trigram index holds the runs whose rowid is at most upto, and merged is 1 once
-- its segments are merged after a fill (search uses it only then, and scans the runs
-- above upto).
CREATE TABLE IF NOT EXISTS text_filled (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    upto INTEGER NOT NULL, merged INTEGER NOT NULL
);
INSERT OR IGNORE INTO text_filled VALUES (1, 0, 0);
"""


#: What text search looks in: one line each for the id, agent, pause reason and
#: tool arguments of run ``{r}`` (``new`` or ``old`` in a trigger, ``runs`` in a select).
_SEARCHED = (
    "{r}.execution_id || char(10) || {r}.agent || char(10)"
    " || COALESCE({r}.pending_reason, '') || char(10) || {r}.tool_args"
)

#: Contentless: the text is in ``runs`` already; only the trigrams are stored.
_TEXT_TABLE = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS run_text USING fts5(body, content='', tokenize='trigram')"
)

#: Keeps ``run_text`` in step with ``runs`` (a row of ``runs`` is updated only where
#: its searched text stays as it is, else deleted and inserted again: see
#: :data:`SEARCHED_COLUMNS`), for the runs a fill has reached: a run above
#: ``upto`` (a run folded in again gets a new rowid) is put in by the fill, or by the
#: next batch, when it gets there.
_TEXT_UPKEEP = (
    f"""CREATE TRIGGER IF NOT EXISTS runs_text_ins AFTER INSERT ON runs
        WHEN new.rowid <= (SELECT upto FROM text_filled) BEGIN
        INSERT INTO run_text (rowid, body) VALUES (new.rowid, {_SEARCHED.format(r="new")});
    END""",
    f"""CREATE TRIGGER IF NOT EXISTS runs_text_del AFTER DELETE ON runs
        WHEN old.rowid <= (SELECT upto FROM text_filled) BEGIN
        INSERT INTO run_text (run_text, rowid, body)
            VALUES ('delete', old.rowid, {_SEARCHED.format(r="old")});
    END""",
)

#: Indexes and the triggers that keep the counts. A rebuild drops them, loads the
#: runs, and puts them back: much faster than keeping them up row by row.
_UPKEEP = (
    "CREATE INDEX IF NOT EXISTS runs_recent ON runs (last_at DESC, execution_id DESC)",
    "CREATE INDEX IF NOT EXISTS runs_state ON runs (state, last_at DESC, execution_id DESC)",
    "CREATE INDEX IF NOT EXISTS runs_agent ON runs (agent, last_at DESC, execution_id DESC)",
    "CREATE INDEX IF NOT EXISTS runs_fork ON runs (fork_parent) WHERE fork_parent IS NOT NULL",
    # The runs with a pause, which each catch-up compares with the store's.
    "CREATE INDEX IF NOT EXISTS runs_pending ON runs (execution_id) WHERE has_pending",
    # The runs with quarantined rows, newest first: the attention page's last reason.
    "CREATE INDEX IF NOT EXISTS runs_quarantined ON runs (last_at DESC, execution_id DESC)"
    " WHERE rows_quarantined > 0",
    """CREATE TRIGGER IF NOT EXISTS runs_ins AFTER INSERT ON runs BEGIN
        INSERT INTO state_counts VALUES (new.state, 1)
            ON CONFLICT (state) DO UPDATE SET n = n + 1;
        UPDATE totals SET rows = rows + new.row_count, waiting = waiting + new.rows_waiting,
            quarantined = quarantined + new.rows_quarantined;
    END""",
    """CREATE TRIGGER IF NOT EXISTS runs_del AFTER DELETE ON runs BEGIN
        UPDATE state_counts SET n = n - 1 WHERE state = old.state;
        UPDATE totals SET rows = rows - old.row_count, waiting = waiting - old.rows_waiting,
            quarantined = quarantined - old.rows_quarantined;
    END""",
    """CREATE TRIGGER IF NOT EXISTS runs_upd AFTER UPDATE ON runs BEGIN
        UPDATE state_counts SET n = n - 1 WHERE state = old.state;
        INSERT INTO state_counts VALUES (new.state, 1)
            ON CONFLICT (state) DO UPDATE SET n = n + 1;
        UPDATE totals SET rows = rows - old.row_count + new.row_count,
            waiting = waiting - old.rows_waiting + new.rows_waiting,
            quarantined = quarantined - old.rows_quarantined + new.rows_quarantined;
    END""",
)

_DROP_UPKEEP = (
    "DROP INDEX IF EXISTS runs_recent",
    "DROP INDEX IF EXISTS runs_state",
    "DROP INDEX IF EXISTS runs_agent",
    "DROP INDEX IF EXISTS runs_fork",
    "DROP INDEX IF EXISTS runs_pending",
    "DROP INDEX IF EXISTS runs_quarantined",
    "DROP TRIGGER IF EXISTS runs_ins",
    "DROP TRIGGER IF EXISTS runs_del",
    "DROP TRIGGER IF EXISTS runs_upd",
    "DROP TRIGGER IF EXISTS runs_text_ins",
    "DROP TRIGGER IF EXISTS runs_text_del",
)

#: The columns of ``runs``, in the order the index inserts them.
RUN_COLUMNS = (
    "execution_id",
    "agent",
    "row_count",
    "first_at",
    "last_at",
    "last_rowid",
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
#: What text search reads of a run (with its id): a run whose new fold leaves these as
#: they are is updated in place, and its trigrams stay as they are.
SEARCHED_COLUMNS = ("agent", "pending_reason", "tool_args")
#: The rest, set by such an update.
UPDATED_COLUMNS = tuple(c for c in RUN_COLUMNS if c != "execution_id" and c not in SEARCHED_COLUMNS)


def default_index_dir() -> Path:
    """Where index files live: ``$XDG_CACHE_HOME/localui``, else ``~/.cache/localui``."""
    return cache_dir()


def _writable_dir(preferred: Path | None) -> Path:
    for candidate in (preferred or default_index_dir(), Path(tempfile.gettempdir()) / "localui"):
        try:
            candidate.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            return candidate
    return Path(tempfile.mkdtemp(prefix="localui-index-"))


def index_path(store_path: Path, index_dir: Path | None) -> Path:
    """The index file of one store: named after its path, in a writable cache dir."""
    name = hashlib.sha256(str(store_path).encode()).hexdigest()[:24]
    return _writable_dir(index_dir) / f"runs-{name}.sqlite"


def connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """A connection to the index file, in WAL mode."""
    # Opened as a URI (as every file is) so that the store is attached read-only
    # (``mode=ro``) whatever this SQLite build's default for URI file names.
    conn = connect_file(
        path, "rwc", timeout=busy_timeout, check_same_thread=False, isolation_level=None
    )
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def attach_store(conn: sqlite3.Connection, store_path: Path) -> None:
    """The store, read-only, as schema ``s``."""
    conn.execute("ATTACH DATABASE ? AS s", (read_uri(store_path),))
    # Each attached file has a page cache of its own (2 MB by default); the index's
    # reads of the store are a few pages each catch-up, and a build reads it once.
    conn.execute(f"PRAGMA s.cache_size = {SMALL_CACHE_KIB}")


def store_identity(store_path: Path) -> str:
    """Which file is at ``store_path`` now (device and inode): a replaced store differs."""
    try:
        st = os.stat(store_path)
    except FileNotFoundError as exc:
        raise Unavailable(f"the store {store_path} is gone: the file was deleted") from exc
    return f"{st.st_dev}:{st.st_ino}"


def upkeep(has_text_index: bool) -> tuple[str, ...]:
    """The indexes and triggers a build drops and puts back."""
    return _UPKEEP + _TEXT_UPKEEP if has_text_index else _UPKEEP


def create(conn: sqlite3.Connection) -> bool:
    """Create the tables, or start over when the file holds another version's;
    whether text search has its trigram index."""
    tables = {r[0] for r in conn.execute("SELECT name FROM main.sqlite_master WHERE type='table'")}
    if "meta" in tables:
        row = conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        if row is not None and row[0] == VERSION:
            # Current: opening it writes nothing (another process may be building it).
            return "run_text" in tables
        conn.executescript(
            "DROP TABLE IF EXISTS run_text; DROP TABLE IF EXISTS runs;"
            " DROP TABLE IF EXISTS state_counts; DROP TABLE IF EXISTS totals;"
            " DROP TABLE IF EXISTS text_filled; DROP TABLE IF EXISTS meta;"
        )
    with transaction(conn):
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        try:
            conn.execute(_TEXT_TABLE)
        except sqlite3.OperationalError:
            # A SQLite built without FTS5: text search scans the index's columns.
            has_text_index = False
        else:
            has_text_index = True
        for statement in upkeep(has_text_index):
            conn.execute(statement)
        # Marked current only once a build has filled it (see ``is_stale``).
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('version', ?)", (VERSION,))
    return has_text_index


def drop_upkeep(conn: sqlite3.Connection) -> None:
    for statement in _DROP_UPKEEP:
        conn.execute(statement)


# FTS5 merges its segments while rows go in (``automerge``, ``crisismerge``). For a
# load of every run it is faster to write the segments unmerged and merge them after
# (14 s rather than 25 s at a million runs); the settings are put back for the
# row-by-row upkeep once the fill is merged.
_SETTING = "INSERT INTO run_text (run_text, rank) VALUES (?, ?)"
_LOADING = (("automerge", 0), ("crisismerge", 1_000_000))
_MERGE_AS_YOU_GO = (("automerge", 4), ("crisismerge", 16))

#: Runs put in the trigram index per step of a fill, and pages merged per step after
#: it: each step is a write transaction of well under a second at a million runs.
TEXT_STEP_RUNS = 50_000
TEXT_STEP_PAGES = 2000


def _fill_text(conn: sqlite3.Connection, above: int, upto: int | None) -> None:
    where = "WHERE rowid > ?" + (" AND rowid <= ?" if upto is not None else "")
    conn.execute(
        f"INSERT INTO run_text (rowid, body) SELECT rowid, {_SEARCHED.format(r='runs')}"
        f" FROM runs {where}",
        (above,) if upto is None else (above, upto),
    )


def _top(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM runs").fetchone()[0])


def fill_text_index(conn: sqlite3.Connection) -> None:
    """Put every run not yet in the trigram index in it now, merged (a small store's
    build, in the build's own transaction)."""
    _fill_text(conn, text_upto(conn), None)
    conn.execute("INSERT INTO run_text (run_text) VALUES ('optimize')")
    conn.executemany(_SETTING, _MERGE_AS_YOU_GO)
    conn.execute("UPDATE text_filled SET upto = ?, merged = 1", (_top(conn),))


def extend_text_index(conn: sqlite3.Connection) -> None:
    """Put the runs folded in since the last batch in the complete trigram index, in
    the caller's write transaction."""
    upto, top = text_upto(conn), _top(conn)
    if top > upto:
        _fill_text(conn, upto, top)
        conn.execute("UPDATE text_filled SET upto = ?", (top,))


def text_waiting(conn: sqlite3.Connection) -> int:
    """About how many runs are above ``upto`` (rowids, so at most that many)."""
    return max(0, _top(conn) - text_upto(conn))


def text_upto(conn: sqlite3.Connection) -> int:
    """The highest rowid of ``runs`` up to which the trigram index holds every run."""
    return int(conn.execute("SELECT upto FROM text_filled").fetchone()[0])


def fill_text_step(conn: sqlite3.Connection) -> bool:
    """One step of filling the trigram index after a build (in the caller's write
    transaction): the next runs put in, or once all are, a part of the merge. True
    when the index is complete."""
    upto, merged = conn.execute("SELECT upto, merged FROM text_filled").fetchone()
    if merged:
        return True
    top = _top(conn)
    if upto < top:
        reached = min(top, upto + TEXT_STEP_RUNS)
        _fill_text(conn, upto, reached)
        conn.execute("UPDATE text_filled SET upto = ?", (reached,))
        return False
    before = conn.total_changes
    conn.execute(_SETTING, ("merge", TEXT_STEP_PAGES))
    if conn.total_changes - before >= 2:
        return False  # FTS5's sign that there is more to merge
    conn.executemany(_SETTING, _MERGE_AS_YOU_GO)
    conn.execute("UPDATE text_filled SET merged = 1")
    return True


def text_complete(conn: sqlite3.Connection) -> bool:
    """Whether the trigram index holds every run, merged, so search can use it."""
    row = conn.execute("SELECT merged FROM text_filled").fetchone()
    return row is not None and bool(row[0])


def read_meta(conn: sqlite3.Connection) -> dict[str, str]:
    return {k: v for k, v in conn.execute("SELECT key, value FROM meta")}


def set_meta(
    conn: sqlite3.Connection, *, high_water: int, identity: str, marked_at: str | None
) -> None:
    """Record what the index holds: folded up to ``high_water``, and the outbox's marks
    seen up to the newest marked row's ``created_at`` (None: none seen)."""
    conn.executemany(
        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
        [
            ("version", VERSION),
            ("identity", identity),
            ("high_water", str(high_water)),
            ("tip", store_tip(conn, high_water)),
        ],
    )
    if marked_at is None:
        conn.execute("DELETE FROM meta WHERE key = 'marked_at'")
    else:
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('marked_at', ?)", (marked_at,))


def store_tip(conn: sqlite3.Connection, rowid: int) -> str:
    """What identifies the store's row at ``rowid`` by content: its run, node and time."""
    if rowid <= 0:
        return ""
    row = conn.execute(
        "SELECT execution_id, node_id, created_at FROM s.checkpoints WHERE rowid = ?", (rowid,)
    ).fetchone()
    return "" if row is None else "|".join(str(v) for v in row)


def is_stale(conn: sqlite3.Connection, identity: str) -> bool:
    """Whether the index was built by another version, or for another file."""
    meta = read_meta(conn)
    return meta.get("version") != VERSION or meta.get("identity") != identity


def clear(conn: sqlite3.Connection, *, has_text_index: bool, identity: str) -> None:
    """Empty the index, as for a store with no runs."""
    conn.execute("DELETE FROM runs")
    if has_text_index:
        conn.execute("INSERT INTO run_text (run_text) VALUES ('delete-all')")
        conn.executemany(_SETTING, _LOADING)
    conn.execute("UPDATE text_filled SET upto = 0, merged = 0")
    conn.execute("DELETE FROM state_counts")
    conn.execute("UPDATE totals SET rows = 0, waiting = 0, quarantined = 0")
    set_meta(conn, high_water=0, identity=identity, marked_at=None)
