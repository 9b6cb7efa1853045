"""A process writing runs through the SDK at a steady rate: ``python -m bench.fleet_writer``.

The fleet figure is the runs list of two localui processes on one PostgreSQL
store while agents elsewhere keep writing to it. This is those agents: the demo's
refund-bot on the SDK's ``PostgresCheckpointer``, run on its offline model, one
run started every ``1 / rate`` seconds (each a completed refund of four rows),
all in one event loop. It prints ``writing`` once its first run can start, then,
when the time is up and every run has ended, a JSON line: runs started, runs
completed, seconds, and the file listing their execution ids (so the bench can
take them out of the store it reuses).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


async def _write(agent: Any, prompt: str, rate: float, seconds: float) -> tuple[list[str], int]:
    ids: list[str] = []
    tasks: list[asyncio.Task[Any]] = []
    started = time.monotonic()
    print("writing", flush=True)
    while time.monotonic() - started < seconds:
        # Paced by the clock, not by the previous run: a slow run does not slow the rate.
        due = started + len(ids) / rate
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        execution_id = str(uuid.uuid4())
        ids.append(execution_id)
        tasks.append(asyncio.create_task(agent.arun(prompt, execution_id=execution_id)))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    completed = sum(1 for r in results if getattr(r, "status", None) == "completed")
    return ids, completed


async def _on_demand(agent: Any, prompt: str) -> list[str]:
    """One run for each line read from standard input, each ended before the next; once
    written, ``written ID SECONDS`` (the Unix time its last row was in the store)."""
    ids: list[str] = []
    loop = asyncio.get_running_loop()
    print("writing", flush=True)
    while await loop.run_in_executor(None, sys.stdin.readline):
        execution_id = str(uuid.uuid4())
        ids.append(execution_id)
        await agent.arun(prompt, execution_id=execution_id)
        print(f"written {execution_id} {time.time():.6f}", flush=True)
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_writer")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--rate", type=float, default=50.0, help="runs started per second")
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument(
        "--on-demand",
        action="store_true",
        help="one run per line of standard input, each reported once written (not --rate)",
    )
    parser.add_argument("--ids", type=Path, required=True, help="where the run ids go")
    args = parser.parse_args()
    # Before the SDK reads its configuration: no traces, no ./.fastaiagent.
    os.environ["FASTAIAGENT_TRACE_ENABLED"] = "false"
    os.environ["FASTAIAGENT_LOCAL_DB"] = str(Path(tempfile.mkdtemp()) / "local.db")

    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    from localui.demo.agent import build_agent
    from localui.demo.scenarios import get_scenario

    checkpointer = PostgresCheckpointer(args.dsn, schema=args.schema, max_pool_size=4)
    checkpointer.setup()
    prompt = get_scenario("completed").prompt
    assert prompt is not None
    agent = build_agent(checkpointer)
    started = time.monotonic()
    try:
        if args.on_demand:
            ids = asyncio.run(_on_demand(agent, prompt))
            completed = len(ids)
        else:
            ids, completed = asyncio.run(_write(agent, prompt, args.rate, args.seconds))
    finally:
        checkpointer.close()
    args.ids.write_text("\n".join(ids))
    print(
        json.dumps(
            {
                "started": len(ids),
                "completed": completed,
                "seconds": time.monotonic() - started,
                "ids": str(args.ids),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
