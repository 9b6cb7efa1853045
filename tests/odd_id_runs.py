"""Write refund-bot runs under execution ids a caller chose: ``python tests/odd_id_runs.py``.

The SDK lets the caller of ``Agent.arun`` pick ``execution_id``, so an id may hold
``/ ? # % \\`` or text outside Latin-1. The URL tests need such runs written by the
real SDK, in a process of its own as an agent's would be. Each ``--paused ID`` run
asks for a refund that waits for a manager; each ``--failed ID`` run fails at its
first model call, so it can be resumed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any


async def write(args: argparse.Namespace) -> None:
    from localui.demo.agent import build_agent

    checkpointer: Any
    if args.store.startswith("postgresql://"):
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        checkpointer = PostgresCheckpointer(args.store, schema=args.pg_schema)
        checkpointer.setup()
    else:
        from fastaiagent import SQLiteCheckpointer

        checkpointer = SQLiteCheckpointer(args.store)
    try:
        for execution_id in args.paused:
            result = await build_agent(checkpointer).arun(
                "Refund order A-1002 for 250.00", execution_id=execution_id
            )
            assert result.status == "paused", (execution_id, result.status)
        for execution_id in args.failed:
            agent = build_agent(checkpointer, model_fails_once=True)
            try:
                await agent.arun("Refund order A-1008 for 20.00", execution_id=execution_id)
            except RuntimeError:
                continue  # the SDK wrote the failed run-end row
            raise AssertionError(f"{execution_id} did not fail")
    finally:
        checkpointer.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--pg-schema", default="fastaiagent")
    parser.add_argument("--paused", action="append", default=[])
    parser.add_argument("--failed", action="append", default=[])
    args = parser.parse_args()
    os.environ["FASTAIAGENT_TRACE_ENABLED"] = "false"
    if not args.store.startswith("postgresql://"):
        os.environ["FASTAIAGENT_LOCAL_DB"] = args.store
    asyncio.run(write(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
