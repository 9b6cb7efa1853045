"""Decisions whose process died, carried out by a process that is alive.

A decision is claimed in localui's record before the SDK is asked for anything,
and the process carrying it out renews the claim's heartbeat while it works
(``ActionService.keep_alive``). When a process dies mid-approval (``kill -9``,
a lost host) its claims go quiet. Each poll this sweep:

1. reads the unfinished claims whose lease ran out (``DecisionLog.list_abandoned``);
2. skips those whose runner is not registered here (a process that has it will
   take them);
3. takes each over, which one process wins (``DecisionLog.take_over``);
4. carries it out exactly as recorded (:meth:`RecoverySweep.carry_out`): resumes a pause
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
import uuid

from localui import runs
from localui.actions import ActionService, Outcome
from localui.backends.decisions import HEARTBEATS_PER_LEASE
from localui.errors import Conflict, LocalUIError, NotFound, Refused
from localui.offloop import off_loop
from localui.records import EDIT, REOPEN, RESUME, Decision, RowHeader

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
        for decision in await off_loop(self.actions.decisions.list_abandoned):
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
        rows = await off_loop(actions.store.list_rows, decision.execution_id)
        if rows and actions.preflight.runner_problem(runs.run_owner(rows)) is not None:
            return None
        taken = await off_loop(actions.decisions.take_over, decision.id)
        if taken is None:
            return None
        try:
            outcome = await self.carry_out(taken)
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

    async def carry_out(self, decision: Decision) -> Outcome:
        """Carry out ``decision``, which this process has just taken over from one that
        died (``DecisionLog.take_over``), exactly as it was recorded.

        Where the dead process stopped decides what is left to do: before the SDK's
        claim the pause still waits and is resumed; after it, before the tool wrote
        its next row, the pause is re-armed first; once the run moved on, the
        decision reached the tool and is only closed with where the run stands.
        """
        from fastaiagent import Resume

        if decision.kind == REOPEN:
            return await self._finish_reopen(decision)
        execution_id = decision.execution_id
        rows = await off_loop(self.actions.store.list_rows, execution_id)
        if decision.kind == EDIT:
            # A branch is never run a second time: its page says where it stands and
            # how to resume it, as for any run whose process died.
            return await self._close_moved_on(decision, rows[-1] if rows else None)
        pending = await off_loop(self.actions.store.get_pending, execution_id)
        bound = decision.checkpoint_id
        if any(r.checkpoint_id == decision.rearmed_checkpoint_id for r in rows):
            bound = decision.bound_checkpoint_id  # re-armed before: that row is its pause
        newest = rows[-1] if rows else None
        if newest is None or newest.checkpoint_id != bound:
            return await self._close_moved_on(decision, newest)
        owner = runs.run_owner(rows)
        if decision.kind == RESUME:
            context = await self.actions.context_of(owner, "aresume", execution_id)
            # A chain's resume with an edited state is carried out with that state.
            return await self.actions.run_resume(
                execution_id,
                decision,
                "resume",
                None,
                owner,
                context=context,
                modified_state=decision.edited_state,
            )
        if pending is not None and pending.checkpoint_id != bound:
            return await self._close_moved_on(decision, newest)
        plan = self.actions.preflight.plan(runs.PAUSED, rows)
        problem = (
            plan.reason
            if isinstance(plan, runs.Refusal)
            else self.actions.preflight.plan_problem(plan)
        )
        if problem is not None:
            # Left for a process that can: the lease runs out again and it takes over.
            raise Refused(problem)
        # Made before a pause is re-armed: a factory that fails leaves all as it was.
        context = await self.actions.context_of(owner, "aresume", execution_id)
        if pending is None:
            if newest.status != "interrupted":
                return await self._close_moved_on(decision, newest)
            # Recorded before the pending row exists: a person who sees the re-armed
            # pause in the queue is told it is decided, never given it to decide again.
            rearmed = str(uuid.uuid4())
            await off_loop(self.actions.decisions.set_rearmed, decision.id, rearmed)
            await off_loop(self.actions.pauses.rearm, execution_id, bound, owner, rearmed)
        metadata = decision.resume_metadata
        if metadata is None:
            # Recorded before the metadata was kept: what ``decide`` handed the SDK then.
            metadata = {"approver": decision.actor, "reason": decision.reason}
        resume_value = Resume(approved=bool(decision.approved), metadata=metadata)
        action = "approve" if decision.approved else "reject"
        return await self.actions.run_resume(
            execution_id,
            decision,
            action,
            resume_value,
            owner,
            context=context,
            modified_state=decision.edited_state,
        )

    async def _close_moved_on(self, decision: Decision, newest: RowHeader | None) -> Outcome:
        """Record how a decision ended whose run went on past its row before its process
        died: the SDK had it, so it is never carried out again."""
        if newest is None:
            status, detail = "failed", "the run's rows are gone from the store"
        elif runs.is_run_end(newest.step_type):
            status = "completed" if newest.status == "completed" else "failed"
            detail = f"the run ended ({newest.status}) before the process that decided it died"
        else:
            status = "unfinished"
            detail = (
                "the process carrying this decision out died after the run moved on to "
                f"{newest.node_id}: the run's page says where it stands and how to resume it"
            )
        finished = await off_loop(self.actions.decisions.finish, decision.id, status, detail)
        return Outcome(decision.execution_id, "recover", status, None, detail, finished)

    async def _finish_reopen(self, decision: Decision) -> Outcome:
        """A re-open whose process died: re-arm the pause if it did not get to."""
        execution_id = decision.execution_id
        pending = await off_loop(self.actions.store.get_pending, execution_id)
        if pending is None:
            try:
                rows = await off_loop(
                    self.actions.pauses.orphan_of, execution_id, decision.checkpoint_id
                )
            except (Conflict, NotFound):
                rows = ()
            if rows:
                owner = runs.run_owner(rows)
                rearmed = await off_loop(
                    self.actions.pauses.rearm,
                    execution_id,
                    decision.checkpoint_id,
                    owner,
                    str(uuid.uuid4()),
                )
                return await self.actions.reopened(decision, rearmed)
        if pending is not None:
            return await self.actions.reopened(decision, str(pending.checkpoint_id))
        output = "the run moved on before the re-open was written: nothing was re-opened"
        finished = await off_loop(self.actions.decisions.finish, decision.id, "moved_on", output)
        return Outcome(execution_id, "reopen", "unfinished", output, None, finished)
