"""The demo's other runners: a Chain, a Supervisor team and a Swarm, on the SDK's FunctionModel.

Each answers only from what it is shown, like the refund-bot, so the same runner
rebuilt in another process (the UI resuming a run a seeding child left behind)
does exactly what the first one would have. The switches seed the failure cases;
the runners registered for serving have them off.
"""

from __future__ import annotations

import os
from typing import Any

from fastaiagent import Agent, Chain, Supervisor, Swarm, interrupt, tool
from fastaiagent.agent.agent import AgentConfig
from fastaiagent.agent.team import Worker
from fastaiagent.checkpointers import Checkpointer
from fastaiagent.llm.message import Message, MessageRole
from fastaiagent.testing import FunctionModel

CHAIN_NAME = "refund-chain"
PARCEL_CHAIN_NAME = "parcel-chain"
COURIER_NAME = "courier"
SUPERVISOR_NAME = "refund-desk"
SWARM_NAME = "refund-swarm"
LONG_AGENT_NAME = "ledger-bot"

#: Exit code of the switch that kills the process inside a tool.
EXIT_DIED_IN_TEAM_TOOL = 19

APPROVAL_REASON = "manager_approval"

#: The supervisor's final answer once its worker reported.
SUPERVISOR_DONE = "Final report ready."


#: Where a runner notes what it does, in order (``model:AGENT``, ``tool:AGENT:TOOL``),
#: so tests can see what a resume did first; None notes nothing.
Events = list[str] | None


def record(events: Events, what: str) -> None:
    if events is not None:
        events.append(what)


def _last_role(messages: list[Message]) -> MessageRole | None:
    return messages[-1].role if messages else None


def _approved_refund(order_id: str, amount: float, *, die: bool) -> str:
    """The side of a refund every runner shares: die (a seeded crash) or ask a manager."""
    if die:
        os._exit(EXIT_DIED_IN_TEAM_TOOL)
    decision = interrupt(APPROVAL_REASON, {"order_id": order_id, "amount": amount})
    if not decision.approved:
        return f"refund of {amount:.2f} on {order_id} declined"
    return f"refunded {amount:.2f} on {order_id}"


def build_chain(
    checkpointer: Checkpointer, *, die_in_refund: bool = False, events: Events = None
) -> Chain:
    """Four tool nodes: look the order up, plan, refund (pauses for a manager), notify."""

    @tool(name="lookup_order", register=False)
    def lookup_order(order_id: str) -> str:
        """Find an order."""
        record(events, f"tool:{CHAIN_NAME}:lookup_order")
        return f"order {order_id}: 300.00 EUR"

    @tool(name="plan_refund", register=False)
    def plan_refund(order_id: str) -> str:
        """Decide what to refund."""
        record(events, f"tool:{CHAIN_NAME}:plan_refund")
        return f"refund 300.00 on {order_id}"

    @tool(name="refund", register=False)
    def refund(order_id: str) -> str:
        """Refund an order, with a manager's approval."""
        record(events, f"tool:{CHAIN_NAME}:refund")
        return _approved_refund(order_id, 300.0, die=die_in_refund)

    @tool(name="notify_customer", register=False)
    def notify_customer(order_id: str) -> str:
        """Tell the customer."""
        record(events, f"tool:{CHAIN_NAME}:notify_customer")
        return f"customer of {order_id} notified"

    chain = Chain(CHAIN_NAME, checkpointer=checkpointer)
    mapping = {"order_id": "{{state.order_id}}"}
    chain.add_node("step_1_lookup", tool=lookup_order, input_mapping=mapping)
    chain.add_node("step_2_plan", tool=plan_refund, input_mapping=mapping)
    chain.add_node("step_3_refund", tool=refund, input_mapping=mapping)
    chain.add_node("step_4_notify", tool=notify_customer, input_mapping=mapping)
    chain.connect("step_1_lookup", "step_2_plan")
    chain.connect("step_2_plan", "step_3_refund")
    chain.connect("step_3_refund", "step_4_notify")
    return chain


def build_parcel_chain(
    checkpointer: Checkpointer,
    *,
    courier_timeout_s: float | None = None,
    carrier_wait_s: float = 0.0,
    events: Events = None,
) -> Chain:
    """Two nodes: look a parcel up (a tool), then hand it to the carrier (an agent, the
    courier, whose tool waits ``carrier_wait_s`` on the carrier). With a
    ``courier_timeout_s`` shorter than that wait the courier runs out of its time, and
    the SDK (1.93 on) ends the chain's run ``failed`` with ``run_reason`` ``timeout``.
    The courier keeps no checkpoints of its own: the chain's are the run's."""
    import asyncio

    @tool(name="lookup_parcel", register=False)
    def lookup_parcel(parcel_id: str) -> str:
        """Find a parcel."""
        record(events, f"tool:{PARCEL_CHAIN_NAME}:lookup_parcel")
        return f"parcel {parcel_id}: at the depot"

    @tool(name="wait_for_carrier", register=False)
    async def wait_for_carrier(parcel_id: str) -> str:
        """Wait for the carrier to collect a parcel."""
        record(events, f"tool:{COURIER_NAME}:wait_for_carrier")
        await asyncio.sleep(carrier_wait_s)
        return f"parcel {parcel_id} collected"

    def respond(messages: list[Message]) -> str | tuple[str, list[dict[str, Any]]]:
        record(events, f"model:{COURIER_NAME}")
        if _last_role(messages) == MessageRole.tool:
            return "Collected."
        call = {"id": "call_wait", "name": "wait_for_carrier", "arguments": {"parcel_id": "P-9"}}
        return "", [call]

    courier = Agent(
        name=COURIER_NAME,
        system_prompt="You hand parcels to the carrier.",
        llm=FunctionModel(respond, model="courier-demo"),
        tools=[wait_for_carrier],
        config=AgentConfig(timeout_seconds=courier_timeout_s),
    )
    chain = Chain(PARCEL_CHAIN_NAME, checkpointer=checkpointer)
    chain.add_node(
        "step_1_lookup", tool=lookup_parcel, input_mapping={"parcel_id": "{{state.parcel_id}}"}
    )
    chain.add_node("step_2_collect", agent=courier)
    chain.connect("step_1_lookup", "step_2_collect")
    return chain


def _refunder(checkpointer: Checkpointer, *, die_in_refund: bool, events: Events) -> Agent:
    """An agent that refunds the order it is asked about, then says it is done."""

    @tool(name="refund", register=False)
    def refund(order_id: str, amount: float) -> str:
        """Refund an order, with a manager's approval."""
        record(events, "tool:refunder:refund")
        return _approved_refund(order_id, amount, die=die_in_refund)

    def respond(messages: list[Message]) -> str | tuple[str, list[dict[str, Any]]]:
        record(events, "model:refunder")
        if _last_role(messages) == MessageRole.tool:
            return f"Refund handled: {messages[-1].content}"
        return "", [
            {"id": "call_refund", "name": "refund", "arguments": {"order_id": "B-7", "amount": 250}}
        ]

    return Agent(
        name="refunder",
        system_prompt="You refund orders.",
        llm=FunctionModel(respond, model="refunder-demo"),
        tools=[refund],
        checkpointer=checkpointer,
    )


def build_supervisor(
    checkpointer: Checkpointer, *, die_in_refund: bool = False, events: Events = None
) -> Supervisor:
    """A planner that delegates the refund to its worker, then reports."""

    def plan(messages: list[Message]) -> str | tuple[str, list[dict[str, Any]]]:
        record(events, f"model:{SUPERVISOR_NAME}")
        if _last_role(messages) == MessageRole.tool:
            return SUPERVISOR_DONE
        return "", [
            {
                "id": "call_delegate",
                "name": "delegate_to_refunder",
                "arguments": {"task": "Refund order B-7 for 250.00"},
            }
        ]

    worker = Worker(
        agent=_refunder(checkpointer, die_in_refund=die_in_refund, events=events),
        role="refunder",
        description="Refunds orders",
    )
    return Supervisor(
        name=SUPERVISOR_NAME,
        llm=FunctionModel(plan, model="planner-demo"),
        workers=[worker],
        checkpointer=checkpointer,
    )


def build_swarm(
    checkpointer: Checkpointer, *, die_in_refund: bool = False, events: Events = None
) -> Swarm:
    """A triage agent hands the customer to the refunder, who refunds."""

    def triage(messages: list[Message]) -> str | tuple[str, list[dict[str, Any]]]:
        record(events, "model:triage")
        if _last_role(messages) == MessageRole.tool:
            return "Handed to the refunder."
        return "", [{"id": "call_handoff", "name": "handoff_to_refunder", "arguments": {}}]

    triage_agent = Agent(
        name="triage",
        system_prompt="You route customers.",
        llm=FunctionModel(triage, model="triage-demo"),
        checkpointer=checkpointer,
    )
    return Swarm(
        name=SWARM_NAME,
        agents=[triage_agent, _refunder(checkpointer, die_in_refund=die_in_refund, events=events)],
        entrypoint="triage",
        handoffs={"triage": ["refunder"], "refunder": []},
        checkpointer=checkpointer,
    )


#: A long run: turns of ten tool calls each write 11 rows a turn, so 50 turns pass
#: the 500 rows the SDK reads of a run.
LONG_TURNS = 50
LONG_CALLS_PER_TURN = 10


def build_long_agent(
    checkpointer: Checkpointer,
    *,
    fail_at_end: bool = False,
    pause_at_end: bool = False,
    events: Events = None,
) -> Agent:
    """An agent that books ledger lines, ten tool calls a turn for ``LONG_TURNS`` turns,
    then, as switched, fails on its last model call or pauses for a manager."""
    steps = LONG_TURNS * LONG_CALLS_PER_TURN

    @tool(name="step", register=False)
    def step(n: int) -> str:
        """Book one ledger line."""
        record(events, f"tool:{LONG_AGENT_NAME}:step")
        return f"booked line {n}"

    @tool(name="close_books", register=False)
    def close_books() -> str:
        """Close the books, with a manager's approval."""
        record(events, f"tool:{LONG_AGENT_NAME}:close_books")
        decision = interrupt(APPROVAL_REASON, {"lines": steps})
        return "books closed" if decision.approved else "books left open"

    state = {"failed": False}

    def respond(messages: list[Message]) -> str | tuple[str, list[dict[str, Any]]]:
        record(events, f"model:{LONG_AGENT_NAME}")
        done = sum(1 for m in messages if m.role == MessageRole.tool)
        if done < steps:
            return "", [
                {"id": f"call_{n}", "name": "step", "arguments": {"n": n}}
                for n in range(done, done + LONG_CALLS_PER_TURN)
            ]
        if done == steps and pause_at_end:
            return "", [{"id": "call_close", "name": "close_books", "arguments": {}}]
        if fail_at_end and not state["failed"]:
            state["failed"] = True
            raise RuntimeError("model provider returned 503")
        return f"Booked {steps} lines."

    return Agent(
        name=LONG_AGENT_NAME,
        system_prompt="You book ledger lines.",
        llm=FunctionModel(respond, model="ledger-demo"),
        tools=[step, close_books],
        checkpointer=checkpointer,
        config=AgentConfig(max_iterations=LONG_TURNS + 5),
    )
