"""The SDK's outbox drain at a steady rate: ``python -m bench.outbox_drain``.

A store connected to the plane has a drain marking its rows synced as the plane
acknowledges them. This is that drain without the network: every ``1 / batches``
seconds it takes the oldest rows waiting through the SDK's own
``SQLiteCheckpointer.fetch_unsynced`` and marks them with ``mark_synced``, so that
``--rate`` rows a second are marked. It prints ``draining`` once it starts, then,
when the time is up, a JSON line: rows marked and seconds.
"""

from __future__ import annotations

import argparse
import json
import os
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
    batch = max(1, round(args.rate / args.batches))
    marked = 0
    print("draining", flush=True)
    started = time.monotonic()
    try:
        n = 0
        while time.monotonic() - started < args.seconds:
            # Paced by the clock, not by the previous batch (a slow one is not made up).
            time.sleep(max(0.0, started + n / args.batches - time.monotonic()))
            n += 1
            rows = sdk.fetch_unsynced(limit=batch)
            sdk.mark_synced([row["checkpoint_id"] for row in rows])
            marked += len(rows)
    finally:
        sdk.close()
    print(json.dumps({"marked": marked, "seconds": time.monotonic() - started}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
