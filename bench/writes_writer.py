"""A process writing runs into a SQLite store at a steady rate: ``python -m bench.writes_writer``.

The throughput-under-writes figure is the runs list answering many readers while
agents elsewhere write to its store. This is those agents, at the rate of a busy
fleet (hundreds of runs a second), which agents on the offline model cannot reach
from one process on a shared machine (the SDK commits each row with its own
fsync: about 30 runs a second here). So each run is a copy of a completed run or
a paused run already in the store (rows the SDK wrote, every column kept) under a
new execution id, new checkpoint ids and the current time, written in one
transaction of its own, a pause with its pending row as the SDK's
``record_interrupt`` writes them. One run in ``--pause-every`` is a pause.

It prints ``writing`` once it has its templates, then, when the time is up, a
JSON line: runs written, pauses written, seconds, and the file listing the
paused runs' execution ids (so the bench can check each one is in the queue).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def _rows(conn: sqlite3.Connection, sql: str, *params: Any) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def _templates(
    conn: sqlite3.Connection,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """A completed run's rows, a paused run's rows and its pending row, from the store."""
    completed = conn.execute(
        "SELECT execution_id FROM checkpoints WHERE node_id = 'run_end'"
        " AND status = 'completed' LIMIT 1"
    ).fetchone()
    paused = conn.execute("SELECT execution_id FROM pending_interrupts LIMIT 1").fetchone()
    if completed is None or paused is None:
        raise SystemExit("the store has no completed run or no pause to copy")
    rows = "SELECT * FROM checkpoints WHERE execution_id = ? ORDER BY rowid"
    [pending] = _rows(conn, "SELECT * FROM pending_interrupts WHERE execution_id = ?", paused[0])
    return _rows(conn, rows, completed[0]), _rows(conn, rows, paused[0]), pending


def _insert(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    marks = ", ".join("?" * len(row))
    conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({marks})", tuple(row.values()))


def _write_run(
    conn: sqlite3.Connection,
    rows: list[dict[str, Any]],
    pending: dict[str, Any] | None,
    execution_id: str,
) -> None:
    """One copy of ``rows`` (and ``pending``) under ``execution_id``, in one transaction."""
    ids = {r["checkpoint_id"]: str(uuid.uuid4()) for r in rows}
    now = datetime.now(UTC).isoformat()
    conn.execute("BEGIN IMMEDIATE")
    for row in rows:
        copy = dict(row)
        copy.update(
            id=ids[row["checkpoint_id"]],
            checkpoint_id=ids[row["checkpoint_id"]],
            execution_id=execution_id,
            parent_checkpoint_id=ids.get(row["parent_checkpoint_id"] or ""),
            created_at=now,
        )
        _insert(conn, "checkpoints", copy)
    if pending is not None:
        _insert(
            conn, "pending_interrupts", {**pending, "execution_id": execution_id, "created_at": now}
        )
    conn.execute("COMMIT")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.writes_writer")
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--rate", type=float, default=300.0, help="runs written per second")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--pause-every", type=int, default=10, help="one run in N pauses")
    parser.add_argument("--pauses", type=Path, required=True, help="where the paused ids go")
    args = parser.parse_args()
    conn = sqlite3.connect(args.store, isolation_level=None, timeout=30.0)
    # As the SDK's own connections: WAL, and a writer waits for the file.
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    completed, paused, pending = _templates(conn)
    paused_ids: list[str] = []
    written = 0
    print("writing", flush=True)
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.seconds:
            # Paced by the clock, not by the previous run: a slow write does not slow the rate.
            due = started + written / args.rate
            time.sleep(max(0.0, due - time.monotonic()))
            execution_id = str(uuid.uuid4())
            written += 1
            if written % args.pause_every:
                _write_run(conn, completed, None, execution_id)
            else:
                _write_run(conn, paused, pending, execution_id)
                paused_ids.append(execution_id)
    finally:
        conn.close()
    seconds = time.monotonic() - started
    args.pauses.write_text("\n".join(paused_ids))
    summary = {
        "written": written,
        "paused": len(paused_ids),
        "seconds": seconds,
        "pauses": str(args.pauses),
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
