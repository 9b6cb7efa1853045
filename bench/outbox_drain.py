"""The SDK's outbox drain at a steady rate: ``python -m bench.outbox_drain``.

A store connected to the plane has a drain marking its rows synced as the plane
acknowledges them. This is that drain without the network: every ``1 / batches``
seconds it takes the oldest rows waiting and marks them with the SDK's own
``SQLiteCheckpointer.mark_synced``, so that ``--rate`` rows a second are marked. It
prints ``draining`` once it starts, then, when the time is up, a JSON line: rows
marked and seconds.

The rows are those the SDK's ``fetch_unsynced`` would give, in its order (the oldest
waiting, by rowid), read from where the last batch stopped: ``fetch_unsynced`` finds
them by sorting every waiting row, 3.5 s a batch on a million-run store none of whose
rows has synced yet, which held the drain to a few hundred rows a second at best. What
localui sees is the marks, and those are the SDK's.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.outbox_drain")
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--rate", type=float, default=1000.0, help="rows marked per second")
    parser.add_argument("--batches", type=float, default=10.0, help="marks per second")
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    # Before the SDK reads its configuration: no traces, no ./.fastaiagent.
    os.environ["FASTAIAGENT_TRACE_ENABLED"] = "false"
    os.environ["FASTAIAGENT_LOCAL_DB"] = str(Path(tempfile.mkdtemp()) / "local.db")

    from fastaiagent.checkpointers import SQLiteCheckpointer

    sdk = SQLiteCheckpointer(str(args.store))
    waiting = sqlite3.connect(f"file:{args.store}?mode=ro", uri=True)
    batch = max(1, round(args.rate / args.batches))
    marked = 0
    after = 0
    print("draining", flush=True)
    started = time.monotonic()
    try:
        n = 0
        while time.monotonic() - started < args.seconds:
            # Paced by the clock, not by the previous batch (a slow one is not made up).
            time.sleep(max(0.0, started + n / args.batches - time.monotonic()))
            n += 1
            # ``+synced``: walked by rowid, not through the SDK's index on synced, which
            # is as slow as fetch_unsynced while most rows wait.
            rows = waiting.execute(
                "SELECT rowid, checkpoint_id FROM checkpoints WHERE rowid > ? AND +synced = 0"
                " ORDER BY rowid LIMIT ?",
                (after, batch),
            ).fetchall()
            if rows:
                after = rows[-1][0]
            sdk.mark_synced([checkpoint_id for _, checkpoint_id in rows])
            marked += len(rows)
    finally:
        waiting.close()
        sdk.close()
    print(json.dumps({"marked": marked, "seconds": time.monotonic() - started}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
