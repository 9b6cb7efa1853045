"""Reading the PostgreSQL runs index: pages of runs with counts per state, and totals.

Text search is ``search ILIKE '%text%'`` over each run's id, agent, pause reason
and tool arguments: with ``pg_trgm`` a trigram index answers it from 3
characters on; without, or for shorter text, it scans the index's rows (one
short row per run, not the SDK's checkpoints).
"""

from __future__ import annotations

from typing import Any

from localui.backends import shared
from localui.backends.base import STATES
from localui.backends.postgres.index import schema
from localui.backends.postgres.index.schema import Tables
from localui.backends.postgres.pool import iso, parse_instant
from localui.backends.shared import Page
from localui.errors import BadRequest
from localui.records import (
    AttentionCounts,
    AttentionPage,
    AttentionQuery,
    FleetCounts,
    RunFacts,
    RunFactsPage,
    RunQuery,
)


def run_facts(row: dict[str, Any]) -> RunFacts:
    """A row of the index (selected with :data:`schema.COLUMNS`) as its record."""
    return RunFacts(
        execution_id=row["execution_id"],
        agent=row["agent"],
        row_count=int(row["row_count"]),
        first_at=iso(row["first_at"]),
        last_at=iso(row["last_at"]),
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


def list_runs(cur: Any, t: Tables, query: RunQuery) -> RunFactsPage:
    """One page of runs, newest activity first, with counts per state (``cur`` reads
    rows as dicts)."""
    where: list[str] = []
    params: dict[str, Any] = {}
    if query.text:
        where.append("search ILIKE %(text)s")
        params["text"] = shared.like(query.text)
    if query.agent:
        where.append("agent = %(agent)s")
        params["agent"] = query.agent
    if query.outbox == "waiting":
        where.append("rows_waiting > 0")
    elif query.outbox == "quarantined":
        where.append("rows_quarantined > 0")
    matching = " AND ".join(where) or "true"
    page_where: list[str] = []
    if query.state:
        page_where.append("state = %(state)s")
        params["state"] = query.state
    if query.after is not None:
        after_at = parse_instant(query.after[0])
        if after_at is None:
            raise BadRequest(f"after: {query.after[0]!r} is not a cursor this server gave out")
        page_where.append(
            '(last_at, execution_id COLLATE "C") < (%(after_at)s, %(after_id)s COLLATE "C")'
        )
        params.update(after_at=after_at, after_id=query.after[1])
    params["limit"] = query.limit + 1
    if query.text:
        return _searched(cur, t, matching, page_where, params)
    if where:
        cur.execute(
            f"SELECT state, COUNT(*) AS n FROM {t.runs} WHERE {matching} GROUP BY state", params
        )
    else:
        cur.execute(f"SELECT state, n FROM {t.counts} WHERE n > 0")
    counts = {str(r["state"]): int(r["n"]) for r in cur.fetchall()}
    conditions = " AND ".join([*where, *page_where]) or "true"
    cur.execute(
        f"SELECT {schema.COLUMNS} FROM {t.runs} WHERE {conditions} {_NEWEST_FIRST} LIMIT %(limit)s",
        params,
    )
    page = Page.of(cur.fetchall(), query.limit, run_facts, shared.run_key)
    return RunFactsPage(runs=page.items, next_key=page.next_key, counts=counts)


_NEWEST_FIRST = 'ORDER BY last_at DESC, execution_id COLLATE "C" DESC'


def _searched(
    cur: Any, t: Tables, matching: str, page_where: list[str], params: dict[str, Any]
) -> RunFactsPage:
    """A text search's page and counts in one statement: the trigram index is asked once
    (about 5 ms at a million runs, and as much again to plan) for the runs that match,
    kept by their key, state and time, which both the counts and the page are read from.

    Planned for its text each time, never prepared: psycopg prepares a statement run
    five times, and PostgreSQL's generic plan for ``ILIKE $1`` cannot know the pattern,
    so it walks the whole table in ``last_at`` order instead of asking the index (0.8 s,
    not 7 ms, at a million runs)."""
    page_cond = " AND ".join(page_where) or "true"
    cur.execute(
        f"WITH m AS MATERIALIZED (SELECT execution_id, state, last_at FROM {t.runs}"
        f" WHERE {matching}),"
        " c AS (SELECT COALESCE(jsonb_object_agg(state, n), '{}') AS state_counts"
        " FROM (SELECT state, COUNT(*) AS n FROM m GROUP BY state) AS s),"
        f" p AS (SELECT execution_id FROM m WHERE {page_cond} {_NEWEST_FIRST} LIMIT %(limit)s)"
        f" SELECT c.state_counts, r.* FROM c LEFT JOIN (SELECT {schema.COLUMNS} FROM {t.runs}"
        " WHERE execution_id IN (SELECT execution_id FROM p)) AS r ON true"
        f" {_NEWEST_FIRST}",
        params,
        prepare=False,
    )
    rows = cur.fetchall()
    counts = {str(k): int(v) for k, v in rows[0]["state_counts"].items()}
    found = [r for r in rows if r["execution_id"] is not None]
    page = Page.of(found, params["limit"] - 1, run_facts, shared.run_key)
    return RunFactsPage(runs=page.items, next_key=page.next_key, counts=counts)


def totals(cur: Any, t: Tables) -> tuple[int, int, int]:
    """``(rows, rows waiting for the plane, rows quarantined)`` across the store."""
    row = cur.execute(f"SELECT rows, waiting, quarantined FROM {t.totals}").fetchone()
    return int(row["rows"]), int(row["waiting"]), int(row["quarantined"])


#: Each reason a run needs a person, as a condition on the runs table that one of its
#: indexes answers in order (``_state``, or ``_quarantined``).
_ATTENTION = (
    "state = 'unfinished' AND last_at < %(stale)s",
    # Failed, as runs.needs_a_person_as_failed says.
    "state = 'failed'",
    "state = 'timed_out'",
    "state = 'cancelled' AND has_pending",
    "state = 'orphaned'",
    "state = 'paused' AND last_at < %(overdue)s",
    "rows_quarantined > 0",
)


def _instant(name: str, value: str) -> Any:
    parsed = parse_instant(value)
    if parsed is None:
        raise BadRequest(f"{name}: {value!r} is not a cursor this server gave out")
    return parsed


def list_attention(cur: Any, t: Tables, query: AttentionQuery) -> AttentionPage:
    """One page of the runs that need a person, newest activity first: the newest
    ``limit + 1`` of each reason, each read in order from an index, merged."""
    params: dict[str, Any] = {
        "stale": _instant("stale_before", query.stale_before),
        "overdue": _instant("overdue_before", query.overdue_before),
        "n": query.limit + 1,
    }
    after = ""
    if query.after is not None:
        after = (
            ' AND (last_at, execution_id COLLATE "C") < (%(after_at)s, %(after_id)s COLLATE "C")'
        )
        params.update(after_at=_instant("after", query.after[0]), after_id=query.after[1])
    order = _NEWEST_FIRST
    parts = " UNION ".join(
        f"(SELECT {schema.COLUMNS} FROM {t.runs} WHERE {where}{after} {order} LIMIT %(n)s)"
        for where in _ATTENTION
    )
    cur.execute(f"SELECT * FROM ({parts}) AS a {order} LIMIT %(n)s", params)
    page = Page.of(cur.fetchall(), query.limit, run_facts, shared.run_key)
    counts = attention_counts(cur, t, query.stale_before, query.overdue_before)
    return AttentionPage(runs=page.items, next_key=page.next_key, counts=counts)


def _attention_counts_sql(t: Tables) -> str:
    """The attention counts as columns of one select (``%(stale)s``, ``%(overdue)s``).

    Stalled and overdue runs are most of their state in a large store, so each is the
    state's count, which the index keeps, less the few runs of that state that are not
    past the cutoff (a row since it, or no time at all): the same number, from the same
    snapshot, without counting a long range."""
    return (
        f"(SELECT COALESCE(SUM(n), 0) FROM {t.counts} WHERE state = 'unfinished')"
        f" - (SELECT COUNT(*) FROM {t.runs} WHERE state = 'unfinished' AND last_at >= %(stale)s)"
        f" - (SELECT COUNT(*) FROM {t.runs} WHERE state = 'unfinished' AND last_at IS NULL)"
        " AS stalled,"
        f" (SELECT COALESCE(SUM(n), 0) FROM {t.counts} WHERE state IN ('failed', 'timed_out'))"
        f" + (SELECT COUNT(*) FROM {t.runs} WHERE state = 'cancelled' AND has_pending) AS failed,"
        f" (SELECT COALESCE(SUM(n), 0) FROM {t.counts} WHERE state = 'orphaned') AS orphaned,"
        f" (SELECT COALESCE(SUM(n), 0) FROM {t.counts} WHERE state = 'paused')"
        f" - (SELECT COUNT(*) FROM {t.runs} WHERE state = 'paused' AND last_at >= %(overdue)s)"
        f" - (SELECT COUNT(*) FROM {t.runs} WHERE state = 'paused' AND last_at IS NULL)"
        " AS overdue,"
        f" (SELECT COUNT(*) FROM {t.runs} WHERE rows_quarantined > 0) AS quarantined,"
        f" (SELECT MIN(last_at) FROM {t.runs} WHERE state = 'paused') AS oldest,"
        # Quarantined runs that no other reason counted: the total counts each run once.
        f" (SELECT COUNT(*) FROM {t.runs} WHERE rows_quarantined > 0 AND NOT ("
        "   state IN ('failed', 'timed_out', 'orphaned') OR (state = 'cancelled' AND has_pending)"
        "   OR (state = 'unfinished' AND last_at < %(stale)s)"
        "   OR (state = 'paused' AND last_at < %(overdue)s))) AS only_quarantined"
    )


def _cutoffs(stale_before: str, overdue_before: str) -> dict[str, Any]:
    return {
        "stale": _instant("stale_before", stale_before),
        "overdue": _instant("overdue_before", overdue_before),
    }


def _attention_counts(row: dict[str, Any]) -> AttentionCounts:
    return AttentionCounts(
        stalled=int(row["stalled"]),
        failed=int(row["failed"]),
        orphaned=int(row["orphaned"]),
        overdue=int(row["overdue"]),
        quarantined=int(row["quarantined"]),
        oldest_pause_at=None if row["oldest"] is None else iso(row["oldest"]),
        total=sum(int(row[k]) for k in ("stalled", "failed", "orphaned", "overdue"))
        + int(row["only_quarantined"]),
    )


def attention_counts(
    cur: Any, t: Tables, stale_before: str, overdue_before: str
) -> AttentionCounts:
    """Runs per reason they need a person, each counted over a short index range."""
    cur.execute(f"SELECT {_attention_counts_sql(t)}", _cutoffs(stale_before, overdue_before))
    return _attention_counts(cur.fetchone())


def fleet_counts(
    cur: Any, t: Tables, stale_before: str, overdue_before: str, *, pending: str | None
) -> FleetCounts:
    """Runs per state, the attention counts, the outbox totals and the pending pauses
    (``pending``: the SDK's table, None when the store has none) in one statement: one
    snapshot, one round trip."""
    paused = f"(SELECT COUNT(*) FROM {pending})" if pending is not None else "0"
    states = ", ".join(
        f"(SELECT COALESCE(SUM(n), 0) FROM {t.counts} WHERE state = '{state}') AS state_{state}"
        for state in STATES
    )
    cur.execute(
        f"SELECT {_attention_counts_sql(t)}, {states}, x.waiting AS waiting,"
        f" x.quarantined AS rows_quarantined, {paused} AS pending FROM {t.totals} x",
        _cutoffs(stale_before, overdue_before),
    )
    row = cur.fetchone()
    return FleetCounts(
        states={state: int(row[f"state_{state}"]) for state in STATES},
        attention=_attention_counts(row),
        rows_waiting=int(row["waiting"]),
        rows_quarantined=int(row["rows_quarantined"]),
        pending=int(row["pending"]),
    )
