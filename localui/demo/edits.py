"""The demo's edited branches: time travel in the tour from the first minute.

Once the demo's runs are in, the served app edits two of them as a developer would,
through its own ``fork_edited`` (the decision record says "demo" edited them):

- the completed refund: its tool's result is edited to a partial refund, and the model
  goes on from there (its answer repeats the edited result);
- the paused chain: its state at the pause names another order, and the node after it
  runs on that order (the customer of that order is notified).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from localui.actions import ActionService
from localui.branching import Branching
from localui.demo.scenarios import SeedReport
from localui.errors import LocalUIError
from localui.offloop import off_loop
from localui.records import SeedFailure

#: Who the decision record says edited the demo's branches.
DEMO_EDITOR = "demo"
PARTIAL_REFUND = "refunded 15.00 (a partial refund: what if the tool had said so?)"
OTHER_ORDER = "B-8"


#: The scenarios whose runs the demo edits, each into one branch.
EDITED = ("completed", "chain-paused")


async def edit_demo_runs(
    actions: ActionService,
    report: SeedReport,
    landed: Callable[[str], None],
    failed: Callable[[SeedFailure], None],
) -> None:
    """Make the edited branches: ``landed`` with each branch's id, ``failed`` with why
    one was not made (the rest of the demo goes on)."""
    edits = {"completed": _edit_tool_result, "chain-paused": _edit_chain_state}
    for name in EDITED:
        label = f"edited branch of {name}"
        execution_id = report.runs.get(name)
        if execution_id is None:
            failed(SeedFailure(label, f"the scenario {name!r} did not land"))
            continue
        try:
            branch = await edits[name](actions, execution_id)
        except LocalUIError as exc:
            failed(SeedFailure(label, str(exc)))
            continue
        if branch is None:
            failed(SeedFailure(label, f"run {name!r} has no row to edit"))
        else:
            landed(branch)


async def _edit_tool_result(actions: ActionService, execution_id: str) -> str | None:
    for row in await off_loop(actions.store.list_rows, execution_id):
        detail = await off_loop(actions.store.get_row, row.checkpoint_id)
        snapshot = detail.state_snapshot if detail is not None else None
        messages: Any = snapshot.get("messages") if isinstance(snapshot, dict) else None
        if isinstance(messages, list) and messages and messages[-1].get("role") == "tool":
            edited = json.loads(json.dumps(messages))
            edited[-1]["content"] = PARTIAL_REFUND
            outcome = await Branching(actions).fork_edited(
                execution_id, checkpoint_id=row.checkpoint_id, messages=edited, actor=DEMO_EDITOR
            )
            return outcome.new_execution_id
    return None


async def _edit_chain_state(actions: ActionService, execution_id: str) -> str | None:
    for row in await off_loop(actions.store.list_rows, execution_id):
        if row.node_id != "step_3_refund":
            continue
        detail = await off_loop(actions.store.get_row, row.checkpoint_id)
        if detail is None or not isinstance(detail.state_snapshot, dict):
            return None
        state = {**detail.state_snapshot, "order_id": OTHER_ORDER}
        outcome = await Branching(actions).fork_edited(
            execution_id, checkpoint_id=row.checkpoint_id, state=state, actor=DEMO_EDITOR
        )
        return outcome.new_execution_id
    return None
