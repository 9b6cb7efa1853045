"""The demo "refund-bot": a deterministic, offline agent on the SDK's FunctionModel.

Everything it decides comes from the conversation it is shown, so the same agent
rebuilt in another process (the UI resuming a run a seeding child left behind)
answers exactly as the first one would have. The only state is the three switches
that exist to seed failure cases; the agent registered for serving has them off.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastaiagent import Agent, idempotent, interrupt, tool
from fastaiagent.agent.agent import AgentConfig
from fastaiagent.checkpointers import Checkpointer
from fastaiagent.llm.message import Message, MessageRole
from fastaiagent.testing import FunctionModel

from localui.demo.teams import record

AGENT_NAME = "refund-bot"

#: Refunds above this need a manager's approval (an ``interrupt``).
APPROVAL_LIMIT = 100.0
APPROVAL_REASON = "manager_approval"

#: Exit codes of the switches that kill the process, so a seeder can tell the
#: crash it asked for from any other death.
EXIT_DIED_IN_TOOL = 17
EXIT_DIED_WAITING_ON_MODEL = 18

#: Who placed each demo order; the approval context shows it to the approver.
CUSTOMERS: Mapping[str, str] = {
    "A-1001": "Ada Lovelace",
    "A-1002": "Grace Hopper",
    "A-1003": "Alan Turing",
    "A-1004": "Katherine Johnson",
    "A-1005": "Edsger Dijkstra",
    "A-1006": "Barbara Liskov",
    "A-1007": "Donald Knuth",
    "A-1008": "Frances Allen",
    "A-1009": "Margaret Hamilton",
    "A-1011": "John Backus",
    "A-1012": "Ada Yonath",
}

#: How long a held refund waits on the payment provider: far past anything that stops
#: it (a cancel, a ``timeout_seconds``), which comes within a second.
HELD_REFUND_S = 60.0


def _policy() -> dict[str, Any]:
    """The refund policy frozen into each approval request (a fresh copy each time)."""
    return {
        "name": "refunds-over-limit",
        "auto_approve_up_to": APPROVAL_LIMIT,
        "currency": "EUR",
        "requires": {"role": "manager", "approvals": 1},
        "escalation": {"after_hours": 24, "to": "finance-lead"},
    }


_REQUEST = re.compile(r"order\s+([A-Z]-\d+)\s+for\s+(\d+(?:\.\d+)?)", re.IGNORECASE)

SYSTEM_PROMPT = (
    "You are refund-bot. Refund the order the customer names with the refund tool; "
    "refunds over 100.00 wait for a manager. Notify the customer when asked to."
)


def build_agent(
    checkpointer: Checkpointer,
    *,
    ledger: Path | None = None,
    model_fails_once: bool = False,
    die_in_tool: bool = False,
    die_waiting_on_model: bool = False,
    events: list[str] | None = None,
    hold_refund: threading.Event | None = None,
    timeout_seconds: float | None = None,
) -> Agent:
    """The refund-bot, checkpointing into ``checkpointer``.

    ``ledger``: a file that gets one JSON line per real side effect, so tests
    can count them across processes. The switches seed failure cases:
    ``model_fails_once`` makes the first model call of this instance raise,
    ``die_in_tool`` kills the process as ``refund`` starts, and
    ``die_waiting_on_model`` kills it when the model is asked for the turn
    after a tool result. ``hold_refund``: ``refund`` sets it, then waits on a slow
    payment provider (``HELD_REFUND_S``, an await the SDK can stop), so a seeder can
    cancel the run from another thread, or let ``timeout_seconds`` stop it.
    """

    # Defined per agent for the ledger path, but the cache key is built from the
    # qualified name and the arguments only, so every process agrees on it.
    @idempotent
    def charge_back(order_id: str, amount: float) -> str:
        _record_effect(ledger, "charge_back", order_id=order_id, amount=amount)
        return f"cb-{order_id}-{amount:.2f}"

    # ``register=False``: the SDK's tool registry is process-global and
    # last-write-wins; several agents built in one process must not collide.
    def refund_now(order_id: str, amount: float) -> str:
        if die_in_tool:
            os._exit(EXIT_DIED_IN_TOOL)
        charge_back(order_id, amount)
        if amount > APPROVAL_LIMIT:
            decision = interrupt(
                APPROVAL_REASON,
                {
                    "order_id": order_id,
                    "amount": amount,
                    "customer": CUSTOMERS.get(order_id, "unknown customer"),
                    "policy": _policy(),
                },
            )
            if not decision.approved:
                reason = decision.metadata.get("reason") or "no reason given"
                return f"refund of {amount:.2f} on {order_id} declined: {reason}"
            # Under an approval policy the approver may set the amount (a field, in
            # Resume.metadata), and the metadata names everyone who approved.
            approved_amount = decision.metadata.get("amount")
            if isinstance(approved_amount, int | float) and not isinstance(approved_amount, bool):
                amount = float(approved_amount)
            approvers = decision.metadata.get("approvers")
            if isinstance(approvers, list) and approvers:
                names = ", ".join(str(a) for a in approvers)
                return f"refunded {amount:.2f} on {order_id}, approved by {names}"
        return f"refunded {amount:.2f} on {order_id}"

    @tool(name="refund", register=False)
    def refund(order_id: str, amount: float) -> str:
        """Refund an order. Refunds over 100.00 wait for a manager's approval."""
        record(events, f"tool:{AGENT_NAME}:refund")
        return refund_now(order_id, amount)

    @tool(name="refund", register=False)
    async def held_refund(order_id: str, amount: float) -> str:
        """Refund an order. Refunds over 100.00 wait for a manager's approval."""
        record(events, f"tool:{AGENT_NAME}:refund")
        assert hold_refund is not None
        hold_refund.set()
        await asyncio.sleep(HELD_REFUND_S)
        return refund_now(order_id, amount)

    @tool(name="notify_customer", register=False)
    def notify_customer(order_id: str, message: str) -> str:
        """Send the customer of an order a message."""
        record(events, f"tool:{AGENT_NAME}:notify_customer")
        _record_effect(ledger, "notify_customer", order_id=order_id, message=message)
        return "sent"

    responder = _Responder(
        fails_once=model_fails_once, die_waiting_on_model=die_waiting_on_model, events=events
    )
    return Agent(
        name=AGENT_NAME,
        system_prompt=SYSTEM_PROMPT,
        llm=FunctionModel(responder, model="refund-bot-demo"),
        tools=[held_refund if hold_refund is not None else refund, notify_customer],
        checkpointer=checkpointer,
        config=AgentConfig(timeout_seconds=timeout_seconds),
    )


class _Responder:
    """The model: reads the conversation and answers, keeping no memory of it."""

    __slots__ = ("_fail_next", "_die_waiting_on_model", "_events")

    def __init__(
        self, *, fails_once: bool, die_waiting_on_model: bool, events: list[str] | None
    ) -> None:
        self._fail_next = fails_once
        self._die_waiting_on_model = die_waiting_on_model
        self._events = events

    def __call__(self, messages: list[Message]) -> str | tuple[str, list[dict[str, Any]]]:
        record(self._events, f"model:{AGENT_NAME}")
        if self._fail_next:
            self._fail_next = False
            raise RuntimeError("model provider returned 503")
        if messages and messages[-1].role == MessageRole.tool:
            if self._die_waiting_on_model:
                os._exit(EXIT_DIED_WAITING_ON_MODEL)
            return _summary(messages)
        request = _last_user_text(messages)
        match = _REQUEST.search(request)
        if match is None:
            return "I can refund an order: say, for example, 'Refund order A-1001 for 40.00'."
        order_id, amount = match.group(1).upper(), float(match.group(2))
        calls: list[dict[str, Any]] = [
            {
                "id": "call_0_refund",
                "name": "refund",
                "arguments": {"order_id": order_id, "amount": amount},
            }
        ]
        if "and notify" in request.lower():
            calls.append(
                {
                    "id": "call_1_notify_customer",
                    "name": "notify_customer",
                    "arguments": {
                        "order_id": order_id,
                        "message": f"Your refund of {amount:.2f} on {order_id} is on its way.",
                    },
                }
            )
        return "", calls


def _summary(messages: list[Message]) -> str:
    """The final answer: what each tool of the last turn reported."""
    results: list[str] = []
    for message in reversed(messages):
        if message.role != MessageRole.tool:
            break
        results.append(_text(message))
    return "Done: " + "; ".join(reversed(results)) + "."


def _last_user_text(messages: list[Message]) -> str:
    for message in reversed(messages):
        if message.role == MessageRole.user:
            return _text(message)
    return ""


def _text(message: Message) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return " ".join(str(getattr(part, "text", part)) for part in content)


def _record_effect(ledger: Path | None, effect: str, **fields: Any) -> None:
    """Append one JSON line to the ledger.

    One ``os.write`` of the whole line on an ``O_APPEND`` descriptor: several
    seeding processes append at once, and buffered writes could interleave.
    """
    if ledger is None:
        return
    line = json.dumps({"effect": effect, **fields, "pid": os.getpid()}) + "\n"
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
