"""Approve, reject, resume, re-open and prune, through the SDK, in process (forks: ``branching``).

Every action checks, before it asks the SDK for anything, that it can finish:
the run's agent is registered here, it has the tool the run stopped in, and
the row the person saw is still the one the action would act on, and the run
context its tools need (``localui.contexts``) can be made. That order matters
because ``Agent.aresume`` claims the pending row *first* and looks the tool up
*after*: a resume that fails its lookup has already lost the pause.

Exactly-once comes from the decision record (``localui.backends.decisions``): a claim on
``(kind, execution_id, checkpoint_id)`` that one request in one process wins,
with the SDK's own atomic claim behind it as the second guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from localui import edits, freetext, names, runs, words
from localui.auth import Person
from localui.backends import is_busy
from localui.backends.base import DecisionLog, NoteLog, Store, UserDirectory
from localui.backends.decisions import ABANDONED_AFTER_SECONDS, HEARTBEATS_PER_LEASE
from localui.contexts import RunContexts
from localui.delegation import Standing
from localui.errors import (
    AlreadyDecided,
    BadRequest,
    Conflict,
    Forbidden,
    NeedsConfirmation,
    NotFound,
    Refused,
    StaleCard,
)
from localui.offloop import off_loop
from localui.pauses import PauseWriter
from localui.policy import Rule
from localui.preflight import Preflight
from localui.records import (
    AGAIN,
    ALREADY_RESUMED,
    APPROVAL,
    FULL,
    REOPEN,
    RESUME,
    STATE_EDIT,
    Decision,
    PrunePreview,
    RowHeader,
    Vote,
)
from localui.registry import Registry, project_scope
from localui.settings import Settings

#: A newest row younger than this may belong to a run that is still alive.
RECENT_SECONDS = 120.0
#: "database is locked" while the SDK claims is waited out for at most this long.
CLAIM_RETRY_SECONDS = 10.0
#: ``Resume.metadata``'s keys of a decision made for an away person: who acted, and for
#: whom (its ``approver`` says both: ``bob for ada``).
DELEGATE, FOR = "delegate", "for"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an action ended, for the person who clicked."""

    execution_id: str
    action: str
    #: ``completed``, ``paused``, ``failed`` or ``forked``.
    status: str
    output: str | None
    error: str | None
    decision: Decision | None
    #: For a fork: the new run.
    new_execution_id: str | None = None
    #: For an approval that is one of several a rule needs (status ``voted``): the
    #: votes so far, and how many the rule needs.
    votes: tuple[Vote, ...] = ()
    needed: int = 0


def decision_text(approver: str, reason: str, *, approved: bool) -> tuple[str, str]:
    """The approver's name and the reason as a decision records them, stripped, or a 400
    that says what is missing. A bulk decision asks once before its cards, and each
    card's decision asks again: the rule lives here alone."""
    approver = names.typed_name("approver", approver)
    reason = freetext.reason(reason)
    if not approver:
        raise BadRequest("say who you are: approver is required")
    if not approved and not reason:
        raise BadRequest("a reason is required to reject")
    return approver, reason


def result_text(output: Any) -> str | None:
    if output is None:
        return None
    return output if isinstance(output, str) else repr(output)


class ActionService:
    """Everything that changes a store, behind preflight checks and the decision record."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        store_kind: str,
        registry: Registry,
        decisions: DecisionLog,
        make_checkpointer: Callable[[], Any],
        contexts: RunContexts | None = None,
        users: UserDirectory | None = None,
        notes: NoteLog | None = None,
    ) -> None:
        self.settings = settings
        #: Notes on pauses (``localui.views.notes``): read with the cards, never decided
        #: on; None where no app opened them (cards then show none).
        self.notes = notes
        self.store = store
        self.registry = registry
        #: The ``RunContext`` factories (``--context``) resumes and forks hand the tools.
        self.contexts = contexts if contexts is not None else RunContexts()
        self.decisions = decisions
        #: Writes a pause again, for a re-open.
        self.pauses = PauseWriter(store, registry)
        #: The checks every action makes first, which the pages also show.
        self.preflight = Preflight(
            settings=settings, store=store, store_kind=store_kind, registry=registry, users=users
        )
        # An SDK checkpointer on the served store, for prune; made on first use, since
        # importing the SDK costs a viewer that never prunes memory and start-up time.
        self._make_checkpointer = make_checkpointer
        self._checkpointer: Any = None

    # --- approve / reject --------------------------------------------

    async def decide(
        self,
        execution_id: str,
        *,
        approved: bool,
        approver: str,
        reason: str,
        checkpoint_id: str,
        person: Person | None = None,
        fields: Mapping[str, Any] | None = None,
        state: dict[str, Any] | None = None,
    ) -> Outcome:
        """Approve or reject the pause at ``checkpoint_id``, exactly once; a chain's
        with its ``state`` edited (``Chain.aresume(modified_state=)``: merged into the
        paused row's state before its node runs again). Under a rule
        that needs several people, an approval that is not the last is recorded as a
        vote and the run keeps waiting; the one that completes the count decides, with
        every approver's name and the typed ``fields`` in the metadata the tool receives.

        Every check that can refuse comes before anything is recorded: who may decide
        (403), the reason and the fields (400), whether this process can resume (422).
        The metadata is recorded with the claim and handed to the SDK as recorded, so a
        recovery of a crashed approval carries out the same decision. The run context is
        made before any vote or claim: a factory that fails leaves the pause waiting.
        """
        self.preflight.ensure_writable()
        approver, reason = decision_text(approver, reason, approved=approved)
        if not checkpoint_id:
            raise BadRequest("checkpoint_id (the paused row you saw) is required")

        pending = await off_loop(self.store.get_pending, execution_id)
        if pending is None:
            await self._raise_decided(execution_id, checkpoint_id, APPROVAL)
            raise NotFound(f"run {execution_id!r} is not waiting for an approval")
        if pending.checkpoint_id != checkpoint_id:
            # The pause this card showed may have been decided, and the run paused again.
            await self._raise_decided(execution_id, checkpoint_id, APPROVAL)
            raise StaleCard(
                f"the run now waits at row {pending.checkpoint_id}, not the row "
                f"{checkpoint_id} you saw: look at the current pause before deciding",
                pending.checkpoint_id,
            )
        rule = self.preflight.rule_for(pending)
        typed: dict[str, Any] = {}
        if rule is None:
            if fields:
                raise BadRequest(
                    f"this pause has no fields (no rule governs it): {', '.join(sorted(fields))}"
                )
        else:
            standing = await off_loop(self.preflight.standing, rule, person, pending)
            if not standing.may:
                who = rule.who
                if rule.escalate_to:
                    who += f" (and, once it is overdue, {rule.escalated_who})"
                raise Forbidden(
                    f"Rule {rule.name!r}: only {who} may decide this pause,"
                    f" and {approver} is not one of them"
                )
            if rule.needs_reason(approved) and not reason:
                raise BadRequest(f"Rule {rule.name!r}: a reason is required to approve too")
            typed = rule.check_fields(fields or {}, pending.context)
            if not standing.own:
                # For an away person: recorded as "bob for ada", and the tool told both.
                away = await self._deciding_for(execution_id, checkpoint_id, rule, standing)
                typed = {**typed, DELEGATE: approver, FOR: away}
                approver = names.for_text(approver, away)
        # The run's rows, read once: the check below and the owner are both read from them.
        rows = await off_loop(self.store.list_rows, execution_id)
        problem = await off_loop(lambda: self.preflight.approval_problem(pending, rows=rows))
        if problem is not None:
            # Another approval may have claimed this pause since: its resume writes the
            # rows the check reads, so say who decided rather than what they now show.
            await self._raise_decided(execution_id, checkpoint_id, APPROVAL)
            raise Refused(problem)
        for taken in await off_loop(self.decisions.list_for_run, execution_id):
            if taken.kind == APPROVAL and taken.rearmed_checkpoint_id == checkpoint_id:
                # localui wrote this pause again to carry out a decision whose process
                # died: that decision is being carried out, and no other may be.
                raise AlreadyDecided(f"This pause was {words.being_or_already(taken)}.", taken)
        owner = runs.run_owner(rows)
        edit = None
        if state is not None:
            edit = await self._state_edit(execution_id, checkpoint_id, owner, state)
            if rule is not None and rule.approvals > 1:
                raise BadRequest(
                    f"Rule {rule.name!r} needs {rule.approvals} approvals of the pause as it"
                    " stands: a state edit would be one person's alone; approve it, then"
                    " edit the chain's state as a branch"
                )
        context = await self.context_of(owner, "aresume", execution_id)

        # Exactly what the tool receives, built once: recorded with the claim below.
        resume_metadata: dict[str, Any] = {"approver": approver, "reason": reason}
        mine: Vote | None = None
        if rule is not None:
            key = (execution_id, checkpoint_id)
            if approved and rule.approvals > 1:
                ballot = await off_loop(
                    lambda: self.decisions.cast_vote(
                        execution_id=execution_id,
                        checkpoint_id=checkpoint_id,
                        actor=approver,
                        reason=reason,
                        fields_json=json.dumps(typed),
                        needed=rule.approvals,
                        agent=owner.name,
                    )
                )
                completing = ballot.votes[: rule.approvals]
                if ballot.result in (AGAIN, FULL) and len(completing) == rule.approvals:
                    await self._raise_decided(execution_id, checkpoint_id, APPROVAL)
                    last = completing[-1]
                    age = runs.seconds_since(last.voted_at)
                    if age is None or age <= ABANDONED_AFTER_SECONDS:
                        raise AlreadyDecided(
                            f"This pause already has its {rule.approvals} approvals: the last"
                            f" was {last.actor}'s at {last.voted_at}, and it is being carried"
                            " out.",
                            None,
                        )
                    # The approval that completed the count was never claimed: its process
                    # died between the two. It is carried out as it was cast, by its name,
                    # with its reason and fields; this click adds nothing to it.
                    approver, reason = last.actor, last.reason
                    typed = json.loads(last.fields_json)
                elif ballot.result == AGAIN:
                    first = next(v for v in ballot.votes if names.same_voter(v.actor, approver))
                    alike = "" if first.actor == approver else f" ({approver} looks like them)"
                    raise Conflict(
                        f"{first.actor} already approved this pause at {first.voted_at}{alike}:"
                        f" rule {rule.name!r} needs {rule.approvals} different people"
                    )
                else:
                    mine = ballot.votes[-1]
                if len(ballot.votes) < rule.approvals:
                    return Outcome(
                        execution_id,
                        "approve",
                        "voted",
                        None,
                        None,
                        None,
                        votes=ballot.votes,
                        needed=rule.approvals,
                    )
                voters = [v.actor for v in completing]
            else:
                earlier = await off_loop(self.decisions.votes_for, [key])
                voters = [v.actor for v in earlier.get(key, ())]
            approvers = list(dict.fromkeys([*voters, approver]))
            resume_metadata = {
                "approver": approver,
                "approvers": approvers,
                "reason": reason,
                **typed,
            }

        recording = resume_metadata if edit is None else {**resume_metadata, STATE_EDIT: edit}
        return await self._claim_and_resume(
            execution_id,
            checkpoint_id,
            approved=approved,
            actor=approver,
            reason=reason,
            recording=recording,
            resume_metadata=resume_metadata,
            owner=owner,
            context=context,
            withdraw=mine,
        )

    async def _claim_and_resume(
        self,
        execution_id: str,
        checkpoint_id: str,
        *,
        approved: bool,
        actor: str,
        reason: str,
        recording: dict[str, Any],
        resume_metadata: dict[str, Any],
        owner: runs.Owner,
        context: Any,
        withdraw: Vote | None = None,
        claimed: Callable[[Decision], Awaitable[None]] | None = None,
    ) -> Outcome:
        """The decision recorded with its claim, then handed to the SDK as recorded: only
        one claim of a pause is ever won, by any process, so it is carried out once; a
        recovery of a crashed approval hands the tool the same. ``withdraw``: the vote
        this click cast, which counts for nothing if another decision came first;
        ``claimed``: called once the claim is won, before the SDK is asked."""
        claim = await off_loop(
            lambda: self.decisions.claim(
                kind=APPROVAL,
                execution_id=execution_id,
                checkpoint_id=checkpoint_id,
                approved=approved,
                actor=actor,
                reason=reason,
                still_pending=lambda: self.store.get_pending(execution_id) is not None,
                metadata=recording,
                agent=owner.name,
            )
        )
        if not claim.won:
            if withdraw is not None:
                await off_loop(self.decisions.withdraw_vote, withdraw.id)
            raise AlreadyDecided(
                f"This pause was {words.being_or_already(claim.decision)}.", claim.decision
            )
        if claimed is not None:
            await claimed(claim.decision)
        from fastaiagent import Resume

        # What the record now holds, as it holds it: a recovery hands the tool the same.
        recorded = claim.decision.resume_metadata
        resume_value = Resume(
            approved=approved, metadata=recorded if recorded is not None else resume_metadata
        )
        return await self.run_resume(
            execution_id,
            claim.decision,
            "approve" if approved else "reject",
            resume_value,
            owner,
            context=context,
            modified_state=claim.decision.edited_state,
        )

    async def decide_by_rule(
        self,
        execution_id: str,
        checkpoint_id: str,
        *,
        late: bool = False,
        claimed: Callable[[Decision], Awaitable[None]] | None = None,
    ) -> Outcome:
        """Decide the pause at ``checkpoint_id`` as its rule's ``on_timeout`` says, as
        the rule (actor ``policy:NAME``, reason the rule's ``timeout_reason``), through
        the same exactly-once claim and resume as :meth:`decide`, its checks first in
        the same order. An approval hands the tool each field's default; it decides
        alone, whatever votes the rule counts. ``late``: no localui ran at the deadline,
        and the recorded reason says so (the tool is handed the rule's reason alone).
        ``claimed`` is called once the claim is won, before the SDK is asked: whatever
        it announces is not lost to a process that dies while the tool runs."""
        self.preflight.ensure_writable()
        pending = await off_loop(self.store.get_pending, execution_id)
        if pending is None:
            await self._raise_decided(execution_id, checkpoint_id, APPROVAL)
            raise NotFound(f"run {execution_id!r} is not waiting for an approval")
        if pending.checkpoint_id != checkpoint_id:
            await self._raise_decided(execution_id, checkpoint_id, APPROVAL)
            raise StaleCard(
                f"the run now waits at row {pending.checkpoint_id}, not {checkpoint_id}",
                pending.checkpoint_id,
            )
        rule = self.preflight.rule_for(pending)
        if rule is None or rule.on_timeout is None:
            raise Refused("no rule with on_timeout governs this pause here")
        approved = rule.on_timeout == "approve"
        typed = rule.timeout_fields(pending.context) if approved else {}
        rows = await off_loop(self.store.list_rows, execution_id)
        problem = await off_loop(lambda: self.preflight.approval_problem(pending, rows=rows))
        if problem is not None:
            await self._raise_decided(execution_id, checkpoint_id, APPROVAL)
            raise Refused(problem)
        for taken in await off_loop(self.decisions.list_for_run, execution_id):
            if taken.kind == APPROVAL and taken.rearmed_checkpoint_id == checkpoint_id:
                raise AlreadyDecided(f"This pause was {words.being_or_already(taken)}.", taken)
        owner = runs.run_owner(rows)
        context = await self.context_of(owner, "aresume", execution_id)
        actor = rule.actor
        resume_metadata: dict[str, Any] = {
            "approver": actor,
            "approvers": [actor],
            "reason": rule.timeout_reason,
            **typed,
        }
        recorded_reason = rule.timeout_reason + (words.DECIDED_AT_START if late else "")
        return await self._claim_and_resume(
            execution_id,
            checkpoint_id,
            approved=approved,
            actor=actor,
            reason=recorded_reason,
            recording=resume_metadata,
            resume_metadata=resume_metadata,
            owner=owner,
            context=context,
            claimed=claimed,
        )

    async def _deciding_for(
        self, execution_id: str, checkpoint_id: str, rule: Rule, standing: Standing
    ) -> str:
        """Which away person a delegate decides for, of those they stand in for: under a
        rule of several approvals, the first not already counted (the others would be
        refused as a second vote of one person); else the first."""
        if len(standing.for_names) > 1 and rule.approvals > 1:
            key = (execution_id, checkpoint_id)
            votes = (await off_loop(self.decisions.votes_for, [key])).get(key, ())
            for away in standing.for_names:
                if not any(names.same_voter(v.actor, away) for v in votes):
                    return away
        return standing.for_names[0]

    async def _state_edit(
        self, execution_id: str, checkpoint_id: str, owner: runs.Owner, state: dict[str, Any]
    ) -> dict[str, Any]:
        """What the record keeps of a chain's state edited at ``checkpoint_id`` (the
        row the run re-enters at), or a :class:`BadRequest` saying why it cannot be."""
        if owner.kind != runs.CHAIN:
            raise BadRequest(
                "only a chain resumes with an edited state (the SDK's modified_state); "
                "an agent's conversation is edited as a branch: edit the row and go on"
            )
        reentry = await off_loop(self.store.get_row, checkpoint_id)
        source = dict(reentry.state_snapshot) if reentry is not None else {}
        found = edits.state_changes(source, state)
        if not found:
            raise BadRequest("the state is the row's own: nothing was edited")
        return {**edits.edit_record(execution_id, checkpoint_id, found), "state": state}

    async def _raise_decided(self, execution_id: str, checkpoint_id: str, kind: str) -> None:
        for decision in await off_loop(self.decisions.list_for_run, execution_id):
            if decision.kind == kind and decision.checkpoint_id == checkpoint_id:
                raise AlreadyDecided(
                    f"This pause was {words.being_or_already(decision)}.", decision
                )
        if await off_loop(self.store.get_run, execution_id) is None:
            raise NotFound(f"no run with execution id {execution_id!r} in this store")

    # --- resume a crashed or failed run ------------------------------

    def resume_target(self, execution_id: str) -> tuple[str, runs.ResumePlan, RowHeader]:
        """The run's state, its resume plan and newest row, or why it cannot resume."""
        facts = self.store.get_run(execution_id)
        if facts is None:
            raise NotFound(f"no run with execution id {execution_id!r} in this store")
        rows = self.store.list_rows(execution_id)
        state = runs.state_of(facts)
        plan = self.preflight.plan(state, rows)
        if isinstance(plan, runs.Refusal):
            raise Refused(plan.reason)
        if plan.shape == "approval":
            raise Refused("This run waits for a person: approve or reject it instead.")
        return state, plan, rows[-1]

    async def resume(
        self,
        execution_id: str,
        *,
        checkpoint_id: str,
        actor: str,
        confirm: bool,
        state: dict[str, Any] | None = None,
    ) -> Outcome:
        """Resume a crashed or failed run from the row the person saw; a chain's with its
        ``state`` edited (``Chain.aresume(modified_state=)``: merged into the row's state
        before the next node runs), recorded with the resume."""
        self.preflight.ensure_writable()
        actor = names.typed_name("actor", actor) or "someone"
        if not checkpoint_id:
            raise BadRequest("checkpoint_id (the row the resume re-enters at) is required")
        _, plan, last = await off_loop(self.resume_target, execution_id)
        if plan.checkpoint_id != checkpoint_id:
            raise StaleCard(
                f"the run would now re-enter at row {plan.checkpoint_id}, not the row "
                f"{checkpoint_id} you saw: reload the run first",
                plan.checkpoint_id,
            )
        age = runs.seconds_since(last.created_at)
        if not confirm and age is not None and age < RECENT_SECONDS:
            raise NeedsConfirmation(
                f"The newest row is only {int(age)} s old: the run may still be alive in another "
                "process, and resuming it here would run it twice. Confirm to resume anyway."
            )
        problem = await off_loop(self.preflight.plan_problem, plan)
        if problem is not None:
            raise Refused(problem)
        metadata = None
        if state is not None:
            metadata = await self._state_edit(execution_id, plan.checkpoint_id, plan.owner, state)
        context = await self.context_of(plan.owner, "aresume", execution_id)
        claim = await off_loop(
            lambda: self.decisions.claim(
                kind=RESUME,
                execution_id=execution_id,
                checkpoint_id=checkpoint_id,
                approved=None,
                actor=actor,
                reason="",
                still_pending=lambda: False,
                metadata=metadata,
                agent=plan.owner.name,
            )
        )
        if not claim.won:
            raise AlreadyDecided(
                f"This run was {words.being_or_already(claim.decision)}.", claim.decision
            )
        return await self.run_resume(
            execution_id,
            claim.decision,
            "resume",
            None,
            plan.owner,
            context=context,
            modified_state=state,
        )

    # --- the SDK call, shared ----------------------------------------

    async def context_of(self, owner: runs.Owner, method: str, execution_id: str) -> Any | None:
        """The ``RunContext`` for the owner's ``method`` (``aresume``/``afork``) on this
        run, made by its ``--context`` factory; None when there is none to pass.
        :class:`Refused` when the factory fails: call it before claiming anything."""
        runner = self.registry.get(owner.name)
        if runner is None:
            return None  # the preflight checks refuse this run on their own
        return await self.contexts.context_for(
            runner, method, execution_id=execution_id, name=owner.name
        )

    async def run_resume(
        self,
        execution_id: str,
        decision: Decision,
        action: str,
        resume_value: Any,
        owner: runs.Owner,
        *,
        context: Any | None = None,
        modified_state: dict[str, Any] | None = None,
    ) -> Outcome:
        """Carry out the claimed ``decision`` through the owner's ``aresume``, handing
        it ``context`` (from :meth:`context_of`, made before the claim) when there is one,
        and a chain's ``modified_state`` when the resume edits its state."""
        from fastaiagent.chain.interrupt import AlreadyResumed

        # The owner's resume, never its member's: a team resumes as a team.
        agent = self.registry.get(owner.name)
        if agent is None:
            await off_loop(self.decisions.release, decision.id)
            raise Refused(f"no agent is registered for run {execution_id!r}")
        project = await off_loop(self.store.get_project_id, execution_id)
        # Only a runner whose ``aresume`` takes a context gets one (``context_of``).
        given: dict[str, Any] = {"context": context} if context is not None else {}
        if modified_state is not None:
            given["modified_state"] = modified_state
        deadline = asyncio.get_running_loop().time() + CLAIM_RETRY_SECONDS
        delay = 0.05
        while True:
            try:
                with project_scope(project), self.keep_alive(decision.id):
                    result = await agent.aresume(execution_id, resume_value=resume_value, **given)
                break
            except AlreadyResumed as exc:
                finished = await off_loop(
                    self.decisions.finish, decision.id, ALREADY_RESUMED, str(exc)
                )
                raise AlreadyDecided(
                    f"This run was resumed outside this app before it could be: {exc}",
                    finished,
                ) from exc
            except Exception as exc:
                if is_busy(exc) and resume_value is not None:
                    # Only a claim that did not happen may be tried again.
                    still = await off_loop(self.store.get_pending, execution_id)
                    if still is not None and asyncio.get_running_loop().time() < deadline:
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 0.5)
                        continue
                error = f"{type(exc).__name__}: {exc}"
                finished = await off_loop(self.decisions.finish, decision.id, "failed", error)
                return Outcome(execution_id, action, "failed", None, error, finished)
        status = "paused" if result.status == "paused" else "completed"
        output = result_text(result.output)
        if status == "paused" and result.pending_interrupt:
            output = f"paused again for {result.pending_interrupt.get('reason')}"
        finished = await off_loop(self.decisions.finish, decision.id, status, output)
        return Outcome(execution_id, action, status, output, None, finished)

    @contextlib.contextmanager
    def keep_alive(self, decision_id: int) -> Iterator[None]:
        """Renew the claim's heartbeat while the SDK carries the decision out.

        A thread, not a task: a tool may hold the event loop (a blocking call in an
        ``async`` tool), and a claim that went quiet would be taken over and carried
        out a second time while this process still runs it.
        """
        stop = threading.Event()
        interval = self.decisions.lease_seconds / HEARTBEATS_PER_LEASE

        def beat() -> None:
            while not stop.wait(interval):
                with contextlib.suppress(Exception):
                    # A missed beat is retried at the next one; the lease has room for several.
                    self.decisions.heartbeat(decision_id)

        beater = threading.Thread(target=beat, name=f"localui-claim-{decision_id}", daemon=True)
        beater.start()
        try:
            yield
        finally:
            stop.set()
            beater.join()

    # --- re-open an orphaned pause ---------------------------------

    async def reopened(self, decision: Decision, rearmed: str) -> Outcome:
        output = f"re-opened as row {rearmed}: it waits in the approvals queue"
        finished = await off_loop(self.decisions.finish, decision.id, "reopened", output)
        return Outcome(decision.execution_id, "reopen", "paused", output, None, finished)

    async def reopen(self, execution_id: str, *, checkpoint_id: str, actor: str) -> Outcome:
        """Re-arm an orphaned pause that no decision of localui's explains, so it waits
        in the queue again; bound to the row the operator saw, and done once."""
        self.preflight.ensure_writable()
        actor = names.typed_name("actor", actor) or "someone"
        if not checkpoint_id:
            raise BadRequest("checkpoint_id (the paused row you saw) is required")
        rows = await off_loop(self.pauses.orphan_of, execution_id, checkpoint_id)
        for decision in await off_loop(self.decisions.list_for_run, execution_id):
            if decision.kind == APPROVAL and decision.bound_checkpoint_id == checkpoint_id:
                if decision.outcome is None:
                    raise AlreadyDecided(
                        f"This pause was {words.being_or_already(decision)}: localui carries that "
                        "decision out once its process is known to be gone.",
                        decision,
                    )
        owner = runs.run_owner(rows)
        problem = self.preflight.runner_problem(owner)
        if problem is not None:
            raise Refused(problem)
        claim = await off_loop(
            lambda: self.decisions.claim(
                kind=REOPEN,
                execution_id=execution_id,
                checkpoint_id=checkpoint_id,
                approved=None,
                actor=actor,
                reason="",
                still_pending=lambda: False,
                agent=owner.name,
            )
        )
        if not claim.won:
            raise AlreadyDecided(
                f"This pause was already re-opened by {claim.decision.actor} at "
                f"{claim.decision.decided_at}.",
                claim.decision,
            )
        try:
            # Checked again under the claim: another process may have acted in between.
            await off_loop(self.pauses.orphan_of, execution_id, checkpoint_id)
            rearmed = await off_loop(
                self.pauses.rearm, execution_id, checkpoint_id, owner, str(uuid.uuid4())
            )
        except BaseException:
            await off_loop(self.decisions.release, claim.decision.id)
            raise
        return await self.reopened(claim.decision, rearmed)

    # --- prune -------------------------------------------------------

    def prune_preview(self, older_than: timedelta) -> PrunePreview:
        cutoff = (datetime.now(UTC) - older_than).isoformat()
        return self.store.prune_preview(cutoff)

    def prune(self, cutoff: datetime) -> int:
        """Prune through the SDK, as of the cutoff the person previewed."""
        self.preflight.ensure_writable()
        older_than = datetime.now(UTC) - cutoff
        if older_than < timedelta(0):
            raise BadRequest("the cutoff is in the future")
        if self._checkpointer is None:
            self._checkpointer = self._make_checkpointer()
        deleted: int = self._checkpointer.prune(older_than)
        return deleted
