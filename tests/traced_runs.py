"""Traced runs of chains and teams: ``python tests/traced_runs.py --store S --traces T``.

A child process writes them as a user's own process would, with the SDK's tracing on
(the tests' own process runs with it off, and the SDK reads that setting once), its
spans going to the SQLite file ``--traces`` names (the store itself, for a SQLite
store), its checkpoints to ``--store`` (a SQLite path, or a PostgreSQL DSN with
``--pg-schema``):

- ``chain-resumed``: the demo's refund-chain, paused at its refund node, then
  approved by ann: two attempts, the second a resume.
- ``chain-fork``: a fork of that chain, once it completed, from its plan node.
- ``chain-waiting``: the refund-chain paused at its refund node, left waiting.
- ``pipeline``: a chain whose first node is an agent (its own spans: the agent's, its
  model call) and whose second is a tool.
- ``supervisor-resumed``: the demo's refund-desk, paused in its worker's refund,
  then approved by ann.
- ``swarm-paused``: the demo's refund-swarm, whose triage agent handed the customer
  to the refunder, paused in the refund.

It prints the runs' execution ids as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

PIPELINE = "ticket-pipeline"
SUMMARISER = "summariser"
#: What the pipeline's agent answers, and so what its trace shows.
SUMMARY = "Customer wants a refund of 40.00 on A-1001."
RESOLVER = "ann"


def build_pipeline(checkpointer: Any) -> Any:
    """An agent node that sums a request up, then a tool node that files a ticket."""
    from fastaiagent import Agent, Chain, tool
    from fastaiagent.testing import FunctionModel

    @tool(name="file_ticket", register=False)
    def file_ticket(summary: str) -> str:
        """File a support ticket."""
        return f"ticket T-1 filed: {summary}"

    summariser = Agent(
        name=SUMMARISER,
        system_prompt="Sum the customer's request up in one line.",
        llm=FunctionModel(lambda messages: SUMMARY, model="summariser-demo"),
    )
    chain = Chain(PIPELINE, checkpointer=checkpointer)
    chain.add_node("step_1_summarise", agent=summariser, output_key="summary")
    chain.add_node("step_2_file", tool=file_ticket, input_mapping={"summary": "{{state.summary}}"})
    chain.connect("step_1_summarise", "step_2_file")
    return chain


async def write(checkpointer: Any) -> dict[str, str]:
    from fastaiagent import Resume

    from localui.demo.teams import build_chain, build_supervisor, build_swarm

    approved = Resume(approved=True, metadata={"resolver": RESOLVER, "reason": "within policy"})
    written: dict[str, str] = {}

    chain = build_chain(checkpointer)
    paused = await chain.aexecute({"order_id": "B-7"})
    assert paused.status == "paused", paused.status
    written["chain-resumed"] = paused.execution_id
    done = await chain.aresume(paused.execution_id, resume_value=approved)
    assert done.status == "completed", done.status
    plan_row = next(
        row.checkpoint_id
        for row in checkpointer.list(paused.execution_id)
        if row.node_id == "step_2_plan"
    )
    fork = await chain.afork(paused.execution_id, checkpoint_id=plan_row)
    written["chain-fork"] = fork.execution_id
    waiting = await chain.aexecute({"order_id": "B-8"})
    assert waiting.status == "paused", waiting.status
    written["chain-waiting"] = waiting.execution_id

    pipeline = await build_pipeline(checkpointer).aexecute({"request": "refund A-1001"})
    assert pipeline.status == "completed", pipeline.status
    written["pipeline"] = pipeline.execution_id

    supervisor = build_supervisor(checkpointer)
    first = await supervisor.arun("Refund order B-7")
    assert first.status == "paused", first.status
    assert first.execution_id is not None
    written["supervisor-resumed"] = first.execution_id
    resumed = await supervisor.aresume(first.execution_id, resume_value=approved)
    assert resumed.status == "completed", resumed.status

    swarm = await build_swarm(checkpointer).arun("Refund order B-7")
    assert swarm.status == "paused", swarm.status
    assert swarm.execution_id is not None
    written["swarm-paused"] = swarm.execution_id
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--pg-schema")
    parser.add_argument("--traces", required=True)
    args = parser.parse_args()
    # Read once by the SDK, on first use: set before anything imports it.
    os.environ["FASTAIAGENT_TRACE_ENABLED"] = "true"
    os.environ["FASTAIAGENT_LOCAL_DB"] = args.traces

    if args.pg_schema:
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        checkpointer: Any = PostgresCheckpointer(args.store, schema=args.pg_schema)
    else:
        from fastaiagent.checkpointers import SQLiteCheckpointer

        checkpointer = SQLiteCheckpointer(args.store)
    try:
        written = asyncio.run(write(checkpointer))
    finally:
        checkpointer.close()
    print(json.dumps(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
