"""payout-bot for the crash tests and ``python -m bench --only kill9``: a real agent on
the SDK's offline ``FunctionModel`` that pauses for approval before it pays an order
out, and can be held at a chosen point of an approval so a test kills its process
exactly there.

A served localui loads it with ``--agents bench/crash_agent.py:payout_bot``; it reads
its settings from the environment:

- ``CRASH_STORE``: a SQLite file, or a ``postgresql://`` URL with ``CRASH_SCHEMA``;
- ``CRASH_LEDGER``: a file that gets one JSON line per real effect, appended by
  whichever process makes it (``pay_out``), and one per time the tool went on past
  its ``interrupt()`` (``tool_ran``), so a test counts both across processes;
- ``CRASH_HOLDS``: a folder; when a file named after a hold point is in it, the
  process that reaches that point writes ``<point>.reached`` there and sleeps,
  until the test kills it.

Hold points, in the order an approval reaches them: ``before-sdk-claim`` (localui
has claimed the decision, the SDK not yet its pending row), ``after-sdk-claim``
(the pending row is gone, the tool not yet called), ``after-interrupt`` (inside the
tool, ``interrupt()`` has returned the decision), ``after-effect`` (the payout is
made and cached, the tool has not returned).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

from fastaiagent import Agent, idempotent, interrupt, tool
from fastaiagent.llm.message import Message, MessageRole
from fastaiagent.testing import FunctionModel

AGENT_NAME = "payout-bot"
REASON = "payout_approval"
HOLD_POINTS = ("before-sdk-claim", "after-sdk-claim", "after-interrupt", "after-effect")


def hold(point: str) -> None:
    """Stop here for good when the test asked to (see the module's docstring)."""
    folder = os.environ.get("CRASH_HOLDS")
    if not folder or not (Path(folder) / point).exists():
        return
    (Path(folder) / f"{point}.reached").write_text(str(os.getpid()))
    while True:  # until the test kills this process
        time.sleep(3600)


def record(effect: str, **fields: Any) -> None:
    """One ledger line, appended in a single write so processes never interleave."""
    line = json.dumps({"effect": effect, "pid": os.getpid(), **fields}) + "\n"
    fd = os.open(os.environ["CRASH_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@idempotent
def make_payout(order_id: str, approver: str) -> str:
    record("pay_out", order_id=order_id, approver=approver)
    return f"po-{order_id}"


@tool(name="pay_out", register=False)
def pay_out(order_id: str) -> str:
    """Pay an order out, once a person approved it."""
    decision = interrupt(REASON, {"order_id": order_id})
    hold("after-interrupt")
    record("tool_ran", order_id=order_id, approved=decision.approved, metadata=decision.metadata)
    if not decision.approved:
        return f"payout of {order_id} declined: {decision.metadata.get('reason')}"
    reference = make_payout(order_id, str(decision.metadata.get("approver")))
    hold("after-effect")
    return f"paid out {order_id} as {reference}"


def _respond(messages: list[Message]) -> str | tuple[str, list[dict[str, Any]]]:
    if messages[-1].role == MessageRole.tool:
        return "Done: " + str(messages[-1].content)
    text = next(str(m.content) for m in reversed(messages) if m.role == MessageRole.user)
    match = re.search(r"order (\S+)", text)
    order = match.group(1) if match else "none"
    return "", [{"id": "call_0", "name": "pay_out", "arguments": {"order_id": order}}]


def _holding(base: type) -> type:
    """``base`` (an SDK checkpointer class) with the hold points around the SDK's claim."""

    class Holding(base):  # type: ignore[misc]
        def delete_pending_interrupt_atomic(self, execution_id: str) -> Any:
            hold("before-sdk-claim")
            claimed = super().delete_pending_interrupt_atomic(execution_id)
            hold("after-sdk-claim")
            return claimed

    return Holding


def checkpointer() -> Any:
    store = os.environ["CRASH_STORE"]
    if store.startswith(("postgresql://", "postgres://")):
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        return _holding(PostgresCheckpointer)(store, schema=os.environ["CRASH_SCHEMA"])
    from fastaiagent.checkpointers import SQLiteCheckpointer

    return _holding(SQLiteCheckpointer)(store)


def payout_bot() -> Agent:
    return Agent(
        name=AGENT_NAME,
        system_prompt="Pay out the order named, after approval.",
        llm=FunctionModel(_respond, model="payout-bot"),
        tools=[pay_out],
        checkpointer=checkpointer(),
    )


async def pause(agent: Agent, order: str) -> str:
    """A new run of ``agent`` that pauses for the payout of ``order``; its execution id."""
    execution_id = f"payout-{order}-{uuid.uuid4().hex[:8]}"
    result = await agent.arun(f"Pay out order {order}", execution_id=execution_id)
    if result.status != "paused":
        raise RuntimeError(f"the run for {order} did not pause: {result.status}")
    return execution_id
