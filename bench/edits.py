"""An edit's branch, timed: ``POST /runs/{id}/fork`` with a row's conversation, its last
tool result changed, until the branch's first row is in the store.

The app answers the POST once the branch has run (``Branching.fork_edited`` waits on
the SDK's ``aresume``), so the answer's time holds the whole branch. What a person waits
on before there is a new run to open is its first row: the ``__fork_origin__`` row the
app writes through the SDK's checkpointer, holding the edited conversation, before the
branch runs on. The figure is that row's ``created_at`` (the SDK stamps it as it writes
the row, in the same call that commits it) less the moment the POST was sent; each
answer must be a 200 naming the branch, and the row must be there once it came.

Every branch (and the edit the decision record keeps of it) is deleted afterwards by
:func:`take_out`: the stores are reused by later runs of the bench.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.latency import Timing, failed
from bench.pg import TABLES
from bench.servers import PgTarget
from bench.stores import BuiltStore
from localui.backends.decisions import TABLE as DECISIONS

#: What the edited tool result says instead.
EDITED_RESULT = "refunded 1.00 (edited by the bench)"


def edited_messages(store: BuiltStore) -> list[dict[str, Any]]:
    """The edit row's conversation with its last message (a tool's result) changed,
    read from the SQLite file the store was built as (a PostgreSQL store is its copy)."""
    with closing(sqlite3.connect(f"file:{store.path}?mode=ro", uri=True)) as conn:
        row = conn.execute(
            "SELECT state_snapshot FROM checkpoints WHERE checkpoint_id = ?", (store.edit_row,)
        ).fetchone()
    if row is None:
        raise RuntimeError(f"the store has no row {store.edit_row} to edit")
    messages: list[dict[str, Any]] = json.loads(row[0])["messages"]
    if messages[-1].get("role") != "tool":
        raise RuntimeError(f"row {store.edit_row}'s conversation does not end with a tool result")
    messages[-1]["content"] = EDITED_RESULT
    return messages


def _first_row_at(store: BuiltStore, pg: PgTarget | None, branch: str) -> datetime | None:
    """When the branch's first row was written, or None when it has none."""
    if pg is not None:
        import psycopg

        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            found = conn.execute(
                f"SELECT created_at FROM {pg.schema}.checkpoints WHERE execution_id = %s"
                " ORDER BY created_at LIMIT 1",
                (branch,),
            ).fetchone()
    else:
        with closing(sqlite3.connect(f"file:{store.path}?mode=ro", uri=True)) as conn:
            found = conn.execute(
                "SELECT created_at FROM checkpoints WHERE execution_id = ?"
                " ORDER BY created_at LIMIT 1",
                (branch,),
            ).fetchone()
    if found is None:
        return None
    value = found[0]
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def time_edits(
    client: httpx.Client,
    store: BuiltStore,
    pg: PgTarget | None,
    *,
    requests: int,
    warmup: int,
    branches: list[str],
) -> Timing:
    """``warmup`` untimed edits, then ``requests`` timed ones, one after another; every
    branch made is appended to ``branches`` (for :func:`take_out`), failed or not."""
    data = {
        "checkpoint_id": store.edit_row,
        "messages": json.dumps(edited_messages(store)),
        "actor": "bench",
    }
    url = f"/runs/{store.edit_run}/fork"
    samples: list[float] = []
    status = size = 0
    for n in range(warmup + requests):
        sent = datetime.now(UTC)
        started = time.perf_counter()
        try:
            answer = client.post(url, data=data, headers={"Accept": "application/json"})
        except httpx.HTTPError as exc:
            return failed(f"POST {url}: {type(exc).__name__}: {exc}")
        answered_ms = (time.perf_counter() - started) * 1000
        status, size = answer.status_code, len(answer.content)
        if status != 200:
            return failed(f"POST {url} answered {status}: {answer.content[:300]!r}")
        branch = str(answer.json().get("new_execution_id") or "")
        if not branch:
            return failed(f"POST {url} named no branch: {answer.content[:300]!r}")
        branches.append(branch)
        first = _first_row_at(store, pg, branch)
        if first is None:
            return failed(f"branch {branch} has no row once the POST answered")
        if n >= warmup:
            # Never later than the answer: the row was in the store when it came.
            samples.append(min(answered_ms, (first - sent).total_seconds() * 1000))
    return Timing(samples_ms=tuple(samples), status=status, bytes=size)


def take_out(store: BuiltStore, pg: PgTarget | None, branches: Sequence[str]) -> None:
    """Delete the branches' rows from the SDK's tables and their edits from the app's
    decision record: the store is left with the runs it was built with."""
    if not branches:
        return
    ids = list(branches)
    if pg is not None:
        import psycopg

        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            for table in TABLES:
                conn.execute(
                    f"DELETE FROM {pg.schema}.{table} WHERE execution_id = ANY(%s)", (ids,)
                )
            conn.execute(
                f"DELETE FROM {pg.app_schema}.{DECISIONS} WHERE execution_id = ANY(%s)", (ids,)
            )
        return
    _take_out_sqlite(store.path, ids)


def _take_out_sqlite(path: Path, ids: list[str]) -> None:
    marks = ", ".join("?" * len(ids))
    with closing(sqlite3.connect(path, timeout=60)) as conn, conn:
        for table in (*TABLES, DECISIONS):
            conn.execute(f"DELETE FROM {table} WHERE execution_id IN ({marks})", ids)
