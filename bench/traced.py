"""Write traced template runs: ``python -m bench.traced STORE``.

The demo agent and the bench's audit chain run in this process with tracing on, so
the SDK writes their spans into ``STORE`` beside the checkpoints, as it does in a
user's project. Run it from a scratch working directory: the SDK also writes
``.fastaiagent/config.toml`` there. Prints one JSON line per run:
``{"kind": ..., "execution_id": ..., "order_id": ...}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastaiagent import Chain
    from fastaiagent.checkpointers import Checkpointer

#: One traced agent run per shape the benchmark copies spans for, and its order.
PROMPTS = {
    "completed": ("A-1001", "Refund order A-1001 for 40.00"),
    "paused": ("A-1002", "Refund order A-1002 for 250.00"),
}
#: The traced chain's kind, name, order and tool nodes (the run-page budget's chain).
CHAIN = "chain"
CHAIN_NAME = "ledger-audit"
CHAIN_ORDER = "A-1050"
CHAIN_NODES = 50
#: What the chain does with each of the order's ledger entries, in turn.
_STEPS = ("read_entry", "match_entry", "check_amount", "post_entry", "note_entry")


def build_audit_chain(checkpointer: Checkpointer) -> Chain:
    """A chain of :data:`CHAIN_NODES` tool nodes, one after another: each of the order's
    ten ledger entries read, matched, checked, posted and noted, each node's answer kept
    in the chain's state under its own key."""
    from fastaiagent import Chain, tool

    @tool(name="read_entry", register=False)
    def read_entry(order_id: str, entry: int) -> str:
        """Read one ledger entry of an order."""
        return f"{order_id} entry {entry}: refund 4.00 EUR"

    @tool(name="match_entry", register=False)
    def match_entry(order_id: str, entry: int) -> str:
        """Match a ledger entry to the order's payment."""
        return f"{order_id} entry {entry} matches payment P-{entry}"

    @tool(name="check_amount", register=False)
    def check_amount(order_id: str, entry: int) -> str:
        """Check the entry's amount against the refund policy."""
        return f"{order_id} entry {entry}: 4.00 within policy"

    @tool(name="post_entry", register=False)
    def post_entry(order_id: str, entry: int) -> str:
        """Post the checked entry to the refunds ledger."""
        return f"{order_id} entry {entry} posted"

    @tool(name="note_entry", register=False)
    def note_entry(order_id: str, entry: int) -> str:
        """Note the posted entry on the order."""
        return f"{order_id} entry {entry} noted"

    tools = {t.name: t for t in (read_entry, match_entry, check_amount, post_entry, note_entry)}
    chain = Chain(CHAIN_NAME, checkpointer=checkpointer)
    previous = ""
    for n in range(CHAIN_NODES):
        step = _STEPS[n % len(_STEPS)]
        node = f"step_{n + 1:02d}_{step}"
        chain.add_node(
            node,
            tool=tools[step],
            input_mapping={"order_id": "{{state.order_id}}", "entry": n // len(_STEPS) + 1},
            output_key=node,
        )
        if previous:
            chain.connect(previous, node)
        previous = node
    return chain


async def _run(store: Path) -> None:
    from fastaiagent import SQLiteCheckpointer

    from localui.demo.agent import build_agent

    checkpointer = SQLiteCheckpointer(str(store))
    agent = build_agent(checkpointer)
    try:
        for kind, (order_id, prompt) in PROMPTS.items():
            execution_id = str(uuid.uuid4())
            result = await agent.arun(prompt, execution_id=execution_id)
            if result.status != kind:
                raise SystemExit(f"traced {kind} run ended {result.status}")
            _say(kind, execution_id, order_id)
        done = await build_audit_chain(checkpointer).aexecute({"order_id": CHAIN_ORDER})
        if done.status != "completed":
            raise SystemExit(f"traced chain run ended {done.status}")
        _say(CHAIN, done.execution_id, CHAIN_ORDER)
    finally:
        checkpointer.close()


def _say(kind: str, execution_id: str, order_id: str) -> None:
    line = {"kind": kind, "execution_id": execution_id, "order_id": order_id}
    print(json.dumps(line), flush=True)


def main() -> int:
    store = Path(sys.argv[1]).resolve()
    # The SDK reads these once, on first use: set them before importing it.
    os.environ["FASTAIAGENT_TRACE_ENABLED"] = "true"
    os.environ["FASTAIAGENT_LOCAL_DB"] = str(store)
    asyncio.run(_run(store))
    from fastaiagent.trace import otel

    # Spans are exported in batches: make sure the last ones are in the file.
    provider = getattr(otel, "_provider", None)
    if provider is not None:
        provider.force_flush()
        provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
