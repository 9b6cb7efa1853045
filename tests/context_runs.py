"""An agent whose tool needs its ``RunContext``, and runs of it: ``python tests/context_runs.py``.

The "payout-desk" pays an order through its ``pay`` tool, which reads the desk it
acts for (the clerk, and the ledger it writes each payment to) from ``ctx.state``:
without a context the tool cannot run. Payouts over 100.00 wait for a person
(``interrupt``). A child process writes runs of it as an agent's own process would:
``--paused ID`` pauses, ``--crashed ID`` dies inside ``pay`` before it pays (the
process exits with ``EXIT_DIED_IN_TOOL``).

``make_context`` and the attributes beside it are what the CLI tests name with
``--context tests/context_runs.py:ATTR``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastaiagent import Agent, RunContext, interrupt, tool
from fastaiagent.llm.message import Message, MessageRole
from fastaiagent.testing import FunctionModel

AGENT_NAME = "payout-desk"
EXIT_DIED_IN_TOOL = 23
APPROVAL_LIMIT = 100.0
_REQUEST = re.compile(r"pay order (\S+) (\d+(?:\.\d+)?)", re.IGNORECASE)


@dataclass(frozen=True)
class Desk:
    """The dependencies the tool is given: who pays, and the ledger it writes to."""

    clerk: str
    ledger: str


def build_agent(checkpointer: Any = None, *, die_in_tool: bool = False) -> Agent:
    @tool(name="pay", register=False)
    def pay(order_id: str, amount: float, ctx: RunContext[Desk]) -> str:
        """Pay out an order. Payouts over 100.00 wait for a person's approval."""
        if die_in_tool:
            os._exit(EXIT_DIED_IN_TOOL)
        desk = ctx.state
        if amount > APPROVAL_LIMIT:
            decision = interrupt("payout_approval", {"order_id": order_id, "amount": amount})
            if not decision.approved:
                return f"payout of {amount:.2f} on {order_id} declined"
        run = ctx.run
        line = {
            "order_id": order_id,
            "amount": amount,
            "clerk": desk.clerk,
            "execution_id": run.execution_id if run is not None else None,
        }
        with open(desk.ledger, "a", encoding="utf-8") as ledger:
            ledger.write(json.dumps(line) + "\n")
        return f"paid {amount:.2f} on {order_id} by {desk.clerk}"

    return Agent(
        name=AGENT_NAME,
        system_prompt="Pay the order the customer names with the pay tool.",
        llm=FunctionModel(_respond, model="payout-desk-test"),
        tools=[pay],
        checkpointer=checkpointer,
    )


def _respond(messages: list[Message]) -> str | tuple[str, list[dict[str, Any]]]:
    """The model: a payout for the order the user names, then what the tool said."""
    if messages and messages[-1].role == MessageRole.tool:
        return f"Done: {messages[-1].content}."
    text = next((str(m.content) for m in reversed(messages) if m.role == MessageRole.user), "")
    match = _REQUEST.search(text)
    if match is None:
        return "Say: pay order ID AMOUNT."
    order_id, amount = match.group(1), float(match.group(2))
    return "", [
        {"id": "call_pay", "name": "pay", "arguments": {"order_id": order_id, "amount": amount}}
    ]


def ledger_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- what the CLI tests name with --agents and --context ---------------------------


def served_agent() -> Agent:
    """The agent for ``--agents``: no checkpointer, so localui binds it to its store."""
    return build_agent()


def make_context(*, execution_id: str, runner: str) -> RunContext[Desk]:
    return RunContext(Desk(clerk=f"cli:{runner}", ledger=os.environ.get("PAYOUT_LEDGER", "")))


NOT_CALLABLE = "a desk"


def takes_no_keywords() -> RunContext[Desk]:
    raise AssertionError("never called")


# --- a process of the agent's own -------------------------------------------------


async def write(args: argparse.Namespace) -> None:
    checkpointer: Any
    if args.store.startswith("postgresql://"):
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        checkpointer = PostgresCheckpointer(args.store, schema=args.pg_schema)
    else:
        from fastaiagent import SQLiteCheckpointer

        checkpointer = SQLiteCheckpointer(args.store)
    checkpointer.setup()
    context = RunContext(Desk(clerk="the run's own process", ledger=args.ledger))
    try:
        for execution_id in args.paused:
            result = await build_agent(checkpointer).arun(
                "pay order P-250 250", execution_id=execution_id, context=context
            )
            assert result.status == "paused", (execution_id, result.status)
        for execution_id in args.crashed:
            await build_agent(checkpointer, die_in_tool=True).arun(
                "pay order C-40 40", execution_id=execution_id, context=context
            )
            raise AssertionError(f"{execution_id} did not die in its tool")
    finally:
        checkpointer.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--pg-schema", default="fastaiagent")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--paused", action="append", default=[])
    parser.add_argument("--crashed", action="append", default=[])
    args = parser.parse_args()
    os.environ["FASTAIAGENT_TRACE_ENABLED"] = "false"
    if not args.store.startswith("postgresql://"):
        os.environ["FASTAIAGENT_LOCAL_DB"] = args.store
    asyncio.run(write(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
