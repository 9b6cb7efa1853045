"""A pause written again: the re-open action and the recovery of a crashed approval.

A process that claims a pause (the SDK's ``delete_pending_interrupt_atomic``) and dies
before the tool writes its next row leaves an orphaned pause the SDK cannot resume.
The checkpointer protocol's ``record_interrupt(checkpoint, pending)`` writes an
interrupted row and its pending row in one transaction: the only SDK way to re-arm it.
"""

from __future__ import annotations

from typing import Any

from localui import runs
from localui.backends.base import Store
from localui.errors import Conflict, NotFound, Refused, StaleCard
from localui.records import RowHeader
from localui.registry import Registry, project_scope


class PauseWriter:
    """Re-arms paused rows of this store through the runs' own SDK checkpointers."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry

    def checkpointer_of(self, owner: runs.Owner) -> Any:
        """The SDK checkpointer the run's owner writes through (``registry.bind`` made
        sure it is this store's)."""
        runner = self.registry.get(owner.name)
        if runner is None:
            raise Refused(f"no runner named {owner.name!r} is registered here")
        return runner._checkpointer  # the SDK keeps it here and offers no accessor

    def rearm(self, execution_id: str, checkpoint_id: str, owner: runs.Owner, new_id: str) -> str:
        """Write the paused row ``checkpoint_id`` again with its pending row, through the
        SDK's ``record_interrupt`` (one transaction): the same node, snapshot, context
        and agent path under the checkpoint id ``new_id``. Returns that id.

        The SDK's own restore from its plane re-creates a pause the same way; the
        caller has checked that the run has not moved on.
        """
        from fastaiagent.checkpointers.protocol import PendingInterrupt

        checkpointer = self.checkpointer_of(owner)
        paused = checkpointer.get_by_id(execution_id, checkpoint_id)
        if paused is None or paused.status != "interrupted":
            raise Conflict(f"row {checkpoint_id} of run {execution_id!r} is not a paused row")
        again = paused.model_copy(update={"checkpoint_id": new_id, "created_at": ""})
        pending = PendingInterrupt(
            execution_id=again.execution_id,
            chain_name=again.chain_name,
            node_id=again.node_id,
            reason=again.interrupt_reason or "",
            context=again.interrupt_context,
            agent_path=again.agent_path,
        )
        with project_scope(self.store.get_project_id(execution_id)):
            checkpointer.record_interrupt(again, pending)
        return str(again.checkpoint_id)

    def orphan_of(self, execution_id: str, checkpoint_id: str) -> tuple[RowHeader, ...]:
        """The run's rows when its newest row is the paused row ``checkpoint_id`` and no
        pending row exists (a pause the SDK can no longer resume), else why not."""
        rows = self.store.list_rows(execution_id)
        if not rows:
            raise NotFound(f"no run with execution id {execution_id!r} in this store")
        newest = rows[-1]
        if newest.checkpoint_id != checkpoint_id:
            raise StaleCard(
                f"the run has moved on past row {checkpoint_id}: its newest row is now "
                f"{newest.checkpoint_id}; nothing was re-opened",
                newest.checkpoint_id,
            )
        if self.store.get_pending(execution_id) is not None:
            raise Conflict("this pause is already waiting for a decision: nothing to re-open")
        if newest.status != "interrupted":
            raise Conflict(f"row {checkpoint_id} is not a paused row: nothing to re-open")
        return rows
