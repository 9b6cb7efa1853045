"""Reading the runs index: pages of runs, one run, totals, forks; rows by column name.

Every function takes the index's connection with its lock held. Text search goes
through the FTS5 trigram index over each run's id, agent, pause reason and tool
arguments, so a search of 3 characters or more is an index lookup; a shorter one
scans the index's own columns with ``LIKE``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from localui.backends import shared
from localui.backends.base import STATES
from localui.backends.shared import Page
from localui.backends.sqlite.index import schema
from localui.backends.sqlite.index.sync import StoreColumns, facts, fold, store_pending
from localui.records import (
    AttentionCounts,
    AttentionPage,
    AttentionQuery,
    FleetCounts,
    RunFacts,
    RunFactsPage,
    RunQuery,
)

#: Above this many runs matching a text search, its page is found by walking the runs
#: newest first rather than by sorting the matches.
_FEW_MATCHES = 2000


#: A text search by scanning the index's own columns, each ``?`` the ``LIKE`` pattern.
_SCANNED = (
    "(execution_id LIKE ? ESCAPE '\\' OR agent LIKE ? ESCAPE '\\'"
    " OR COALESCE(pending_reason, '') LIKE ? ESCAPE '\\' OR tool_args LIKE ? ESCAPE '\\')"
)


def _rows(
    conn: sqlite3.Connection, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
) -> list[sqlite3.Row]:
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row
    return cursor.execute(sql, params).fetchall()


def run_facts(row: sqlite3.Row) -> RunFacts:
    """A row of ``runs`` (selected with :data:`schema.COLUMNS`) as its record."""
    return RunFacts(
        execution_id=row["execution_id"],
        agent=row["agent"],
        row_count=int(row["row_count"]),
        first_at=row["first_at"],
        last_at=row["last_at"],
        last_checkpoint_id=row["last_checkpoint_id"],
        last_node_id=row["last_node_id"],
        last_step_type=row["last_step_type"],
        last_status=row["last_status"],
        has_pending=bool(row["has_pending"]),
        pending_reason=row["pending_reason"],
        fork_parent_checkpoint_id=row["fork_parent"],
        rows_waiting=int(row["rows_waiting"]),
        rows_quarantined=int(row["rows_quarantined"]),
        run_reason=row["run_reason"],
    )


def get_run(conn: sqlite3.Connection, execution_id: str) -> RunFacts | None:
    rows = _rows(conn, f"SELECT {schema.COLUMNS} FROM runs WHERE execution_id = ?", (execution_id,))
    return run_facts(rows[0]) if rows else None


def list_runs(conn: sqlite3.Connection, query: RunQuery, *, has_text_index: bool) -> RunFactsPage:
    """One page of runs, newest activity first, with counts per state."""
    where: list[str] = []
    params: list[Any] = []
    by_trigrams = bool(query.text) and has_text_index and len(query.text or "") >= 3
    if query.text and by_trigrams:
        # A substring of 3 characters or more, case-insensitively: the trigram index
        # answers it exactly (the text has one field per line and a search for text
        # without a line break cannot match across two), for the runs it holds; the
        # few folded in since its last batch are scanned.
        # One IN list of both (not an OR of the two, which SQLite answers by scanning
        # every run): the matches, then the runs past ``upto`` by their rowid range.
        where.append(
            "rowid IN (SELECT rowid FROM run_text WHERE run_text MATCH ?"
            f" UNION ALL SELECT rowid FROM runs WHERE rowid > ? AND {_SCANNED})"
        )
        params += [phrase(query.text), schema.text_upto(conn)]
        params += [shared.like(query.text)] * _SCANNED.count("?")
    elif query.text:
        # Shorter than a trigram: a scan of the index's own columns.
        where.append(_SCANNED)
        params += [shared.like(query.text)] * _SCANNED.count("?")
    if query.agent:
        where.append("agent = ?")
        params.append(query.agent)
    if query.outbox == "waiting":
        where.append("rows_waiting > 0")
    elif query.outbox == "quarantined":
        where.append("rows_quarantined > 0")
    if where:
        counts = {
            row["state"]: int(row["n"])
            for row in _rows(
                conn,
                f"SELECT state, COUNT(*) AS n FROM runs WHERE {' AND '.join(where)} GROUP BY state",
                params,
            )
        }
    else:
        counts = {
            row["state"]: int(row["n"])
            for row in _rows(conn, "SELECT state, n FROM state_counts")
            if row["n"]
        }
    page_where = list(where)
    page_params = list(params)
    if by_trigrams and sum(counts.values()) > _FEW_MATCHES:
        # Many runs match: walking the runs newest first and checking each against
        # the matches finds a page sooner than sorting every match (``+rowid``
        # keeps SQLite from looking the matches up one by one instead).
        page_where[0] = "+" + page_where[0]
    if query.state:
        page_where.append("state = ?")
        page_params.append(query.state)
    if query.after is not None:
        page_where.append("(last_at, execution_id) < (?, ?)")
        page_params.extend(query.after)
    rows = _rows(
        conn,
        f"SELECT {schema.COLUMNS} FROM runs WHERE {' AND '.join(page_where) or '1'}"
        " ORDER BY last_at DESC, execution_id DESC LIMIT ?",
        [*page_params, query.limit + 1],
    )
    page = Page.of(rows, query.limit, run_facts, shared.run_key)
    return RunFactsPage(runs=page.items, next_key=page.next_key, counts=counts)


#: Each reason a run needs a person, as a condition on ``runs`` that one of its
#: indexes answers in order (``runs_state``, or ``runs_quarantined``).
_ATTENTION = (
    "state = 'unfinished' AND last_at < :stale",
    # Failed, as runs.needs_a_person_as_failed says.
    "state = 'failed'",
    "state = 'timed_out'",
    "state = 'cancelled' AND has_pending",
    "state = 'orphaned'",
    "state = 'paused' AND last_at < :overdue",
    "rows_quarantined > 0",
)


def list_attention(conn: sqlite3.Connection, query: AttentionQuery) -> AttentionPage:
    """One page of the runs that need a person, newest activity first: the newest
    ``limit + 1`` of each reason, each read in order from an index, merged."""
    params: dict[str, Any] = {
        "stale": query.stale_before,
        "overdue": query.overdue_before,
        "n": query.limit + 1,
    }
    after = ""
    if query.after is not None:
        after = " AND (last_at, execution_id) < (:after_at, :after_id)"
        params.update(after_at=query.after[0], after_id=query.after[1])
    parts = " UNION ".join(
        f"SELECT * FROM (SELECT {schema.COLUMNS} FROM runs WHERE {where}{after}"
        " ORDER BY last_at DESC, execution_id DESC LIMIT :n)"
        for where in _ATTENTION
    )
    rows = _rows(
        conn,
        f"SELECT * FROM ({parts}) ORDER BY last_at DESC, execution_id DESC LIMIT :n",
        params,
    )
    page = Page.of(rows, query.limit, run_facts, shared.run_key)
    counts = attention_counts(conn, query.stale_before, query.overdue_before)
    return AttentionPage(runs=page.items, next_key=page.next_key, counts=counts)


#: The attention counts as columns of one select (``:stale``, ``:overdue``).
#: Stalled and overdue runs are most of their state in a large store (every run whose
#: process died long ago), so each is the state's count, which the index keeps, less
#: the few runs of that state with a row since the cutoff: the same number, read from
#: the same snapshot, without counting a long range.
_ATTENTION_COUNTS = (
    "(SELECT COALESCE(SUM(n), 0) FROM state_counts WHERE state = 'unfinished')"
    " - (SELECT COUNT(*) FROM runs WHERE state = 'unfinished' AND last_at >= :stale)"
    " AS stalled,"
    " (SELECT COALESCE(SUM(n), 0) FROM state_counts WHERE state IN ('failed', 'timed_out'))"
    " + (SELECT COUNT(*) FROM runs WHERE state = 'cancelled' AND has_pending) AS failed,"
    " (SELECT COALESCE(SUM(n), 0) FROM state_counts WHERE state = 'orphaned') AS orphaned,"
    " (SELECT COALESCE(SUM(n), 0) FROM state_counts WHERE state = 'paused')"
    " - (SELECT COUNT(*) FROM runs WHERE state = 'paused' AND last_at >= :overdue)"
    " AS overdue,"
    " (SELECT COUNT(*) FROM runs WHERE rows_quarantined > 0) AS quarantined,"
    " (SELECT MIN(last_at) FROM runs WHERE state = 'paused') AS oldest,"
    # Quarantined runs that no other reason counted: the total counts each run once.
    " (SELECT COUNT(*) FROM runs WHERE rows_quarantined > 0 AND NOT ("
    "   state IN ('failed', 'timed_out', 'orphaned') OR (state = 'cancelled' AND has_pending)"
    "   OR (state = 'unfinished' AND last_at < :stale)"
    "   OR (state = 'paused' AND last_at < :overdue))) AS only_quarantined"
)

#: Runs per state as columns of one select, from the counts the index keeps.
_STATE_COUNTS = ", ".join(
    f"(SELECT COALESCE(SUM(n), 0) FROM state_counts WHERE state = '{state}') AS state_{state}"
    for state in STATES
)


def _attention_counts(row: sqlite3.Row) -> AttentionCounts:
    return AttentionCounts(
        stalled=int(row["stalled"]),
        failed=int(row["failed"]),
        orphaned=int(row["orphaned"]),
        overdue=int(row["overdue"]),
        quarantined=int(row["quarantined"]),
        oldest_pause_at=row["oldest"],
        total=sum(int(row[k]) for k in ("stalled", "failed", "orphaned", "overdue"))
        + int(row["only_quarantined"]),
    )


def attention_counts(
    conn: sqlite3.Connection, stale_before: str, overdue_before: str
) -> AttentionCounts:
    """Runs per reason they need a person, each counted over a short index range."""
    params = {"stale": stale_before, "overdue": overdue_before}
    return _attention_counts(_rows(conn, f"SELECT {_ATTENTION_COUNTS}", params)[0])


def fleet_counts(
    conn: sqlite3.Connection, stale_before: str, overdue_before: str, *, pending: bool
) -> FleetCounts:
    """Runs per state, the attention counts, the outbox totals and (when the store has
    the table) the pending pauses in one statement: one snapshot of the index and the
    attached store, so the numbers agree with each other."""
    paused = "(SELECT COUNT(*) FROM s.pending_interrupts)" if pending else "0"
    row = _rows(
        conn,
        f"SELECT {_ATTENTION_COUNTS}, {_STATE_COUNTS}, t.waiting AS waiting,"
        f" t.quarantined AS rows_quarantined, {paused} AS pending FROM totals t",
        {"stale": stale_before, "overdue": overdue_before},
    )[0]
    return FleetCounts(
        states={state: int(row[f"state_{state}"]) for state in STATES},
        attention=_attention_counts(row),
        rows_waiting=int(row["waiting"]),
        rows_quarantined=int(row["rows_quarantined"]),
        pending=int(row["pending"]),
    )


def resumable_cache_before(conn: sqlite3.Connection, cutoff: str) -> dict[str, int]:
    """Cache entries older than ``cutoff`` of runs that can still resume, per run."""
    has_cache = conn.execute(
        "SELECT 1 FROM s.sqlite_master WHERE type = 'table' AND name = 'idempotency_cache'"
    ).fetchone()
    if has_cache is None:
        return {}
    return {
        row["execution_id"]: int(row["n"])
        for row in _rows(
            conn,
            "SELECT c.execution_id AS execution_id, COUNT(*) AS n FROM s.idempotency_cache c"
            " JOIN runs r ON r.execution_id = c.execution_id"
            " WHERE c.created_at < ?"
            " AND r.state IN ('paused', 'unfinished', 'failed', 'cancelled', 'timed_out')"
            " GROUP BY c.execution_id",
            (cutoff,),
        )
    }


def totals(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """``(rows, rows waiting for the plane, rows quarantined)`` across the store."""
    row = _rows(conn, "SELECT rows, waiting, quarantined FROM totals")[0]
    return int(row["rows"]), int(row["waiting"]), int(row["quarantined"])


def forks_of(
    conn: sqlite3.Connection, execution_id: str, columns: StoreColumns
) -> list[tuple[str, str, str, str]]:
    """``(fork id, parent checkpoint id, parent node id, fork's first row time)`` of
    the runs forked from any row of this run, oldest first."""
    rows = _rows(
        conn,
        "SELECT r.execution_id AS fork, r.fork_parent AS parent, c.node_id AS node,"
        " r.first_at AS first_at FROM runs r"
        f" JOIN s.checkpoints c ON c.{columns.checkpoint_key} = r.fork_parent"
        " WHERE r.fork_parent IS NOT NULL AND c.execution_id = ?"
        " ORDER BY r.first_at",
        (execution_id,),
    )
    return [(str(r["fork"]), str(r["parent"]), str(r["node"]), str(r["first_at"])) for r in rows]


def from_store(
    conn: sqlite3.Connection, columns: StoreColumns, execution_ids: Sequence[str]
) -> list[RunFacts]:
    """These runs summarised straight from their rows (the SDK's index on
    ``execution_id``), for answers that cannot wait for a build; newest first."""
    if not execution_ids:
        return []
    marks = ",".join("?" * len(execution_ids))
    folded = fold(
        conn.execute(
            f"SELECT {columns.select} FROM s.checkpoints WHERE execution_id IN ({marks})",
            tuple(execution_ids),
        )
    )
    pending = {eid: reason for eid, reason in store_pending(conn).items() if eid in folded}
    found = [facts(eid, summary, pending) for eid, summary in folded.items()]
    found.sort(key=lambda f: (f.last_at, f.execution_id), reverse=True)
    return found


def recently_written(conn: sqlite3.Connection, limit: int) -> list[str]:
    """The ``limit`` runs with the newest rows, by the order the rows were written."""
    found: dict[str, None] = {}
    cursor = conn.execute("SELECT execution_id FROM s.checkpoints ORDER BY rowid DESC")
    for (eid,) in cursor:
        found[eid] = None
        if len(found) == limit:
            break
    cursor.close()
    return list(found)


def phrase(text: str) -> str:
    """``text`` as one FTS5 phrase: trigrams match it anywhere, whatever its characters."""
    return '"' + text.replace('"', '""') + '"'
