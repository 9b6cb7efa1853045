"""Decisions whose process died, carried out by a process that is alive.

A decision is claimed in localui's record before the SDK is asked for anything,
and the process carrying it out renews the claim's heartbeat while it works
(``ActionService.keep_alive``). When a process dies mid-approval (``kill -9``,
a lost host) its claims go quiet. Each poll this sweep:

1. reads the unfinished claims whose lease ran out (``DecisionLog.list_abandoned``);
2. skips those whose runner is not registered here (a process that has it will
   take them);
3. takes each over, which one process wins (``DecisionLog.take_over``);
4. carries it out exactly as recorded (``ActionService.carry_out``): resumes a pause
   the SDK never claimed, re-arms through ``record_interrupt`` and resumes one it
   claimed before the tool wrote its next row, and only closes one whose run moved on.

It runs from the app's lifespan, first at start (a restart finds what the last
process left), then every fraction of the lease, and stops with the app: a carry-out
under way is allowed to finish for a moment, and otherwise resumes from its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from localui import runs
from localui.actions import ActionService, Outcome
from localui.backends.decisions import HEARTBEATS_PER_LEASE
from localui.errors import LocalUIError
from localui.records import Decision

log = logging.getLogger("localui.recovery")

#: How long stopping waits for a carry-out under way before it cancels it.
STOP_GRACE_SECONDS = 5.0


class RecoverySweep:
    """The background sweep of one app process (see the module's docstring)."""

    def __init__(self, actions: ActionService) -> None:
        self.actions = actions
        self.interval = actions.decisions.lease_seconds / HEARTBEATS_PER_LEASE
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="localui-recovery")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), STOP_GRACE_SECONDS)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.sweep()
            except Exception:
                # A store that cannot be read now is read again at the next poll.
                log.exception("the recovery sweep could not read the decision record")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval)

    async def sweep(self) -> tuple[Outcome, ...]:
        """One poll: every abandoned decision this process can carry out, carried out."""
        done: list[Outcome] = []
        for decision in await asyncio.to_thread(self.actions.decisions.list_abandoned):
            if self._stopping.is_set():
                break
            outcome = await self.recover(decision)
            if outcome is not None:
                done.append(outcome)
        return tuple(done)

    async def recover(self, decision: Decision) -> Outcome | None:
        """Take ``decision`` over and carry it out; None when this process cannot or
        another took it first."""
        actions = self.actions
        rows = await asyncio.to_thread(actions.store.list_rows, decision.execution_id)
        if rows and actions.runner_problem(runs.run_owner(rows)) is not None:
            return None
        taken = await asyncio.to_thread(actions.decisions.take_over, decision.id)
        if taken is None:
            return None
        try:
            outcome = await actions.carry_out(taken)
        except LocalUIError as exc:
            # Nothing was handed to the SDK: the lease runs out again and the next
            # poll (here or in another process) tries once more.
            log.warning(
                "decision %s on %s not carried out yet: %s", taken.id, taken.execution_id, exc
            )
            return None
        log.info(
            "carried out decision %s on %s, left by a process that died: %s",
            taken.id,
            taken.execution_id,
            outcome.status,
        )
        return outcome
