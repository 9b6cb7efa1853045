"""The only writer: approve, reject, resume, fork and prune, through the SDK, in process.

Every action checks, before it asks the SDK for anything, that it can finish:
the run's agent is registered here, it has the tool the run stopped in, and
the row the person saw is still the one the action would act on. That order
matters because ``Agent.aresume`` claims the pending row *first* and looks the
tool up *after*: a resume that fails its lookup has already lost the pause.

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from localui import freetext, names, runs
from localui.auth import Person
from localui.backends import is_busy
from localui.backends.base import DecisionLog, Store
from localui.backends.decisions import ABANDONED_AFTER_SECONDS, HEARTBEATS_PER_LEASE
from localui.errors import BadRequest, Conflict, Forbidden, NotFound, ReadOnly, Refused
from localui.policy import Rule
from localui.records import (
    AGAIN,
    ALREADY_RESUMED,
    APPROVAL,
    FULL,
    REOPEN,
    RESUME,
    Decision,
    Pending,
    PrunePreview,
    RowDetail,
    RowHeader,
    Vote,
)
from localui.registry import Registry, registry_kind, run_tools
from localui.settings import Settings

#: A newest row younger than this may belong to a run that is still alive.
RECENT_SECONDS = 120.0
#: "database is locked" while the SDK claims is waited out for at most this long.
CLAIM_RETRY_SECONDS = 10.0


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


class AlreadyDecided(Conflict):
    """409 with who decided and when."""

    def __init__(self, message: str, decision: Decision | None) -> None:
        super().__init__(message)
        self.details = {"decision": decision} if decision is not None else None
        self.decision = decision


class StaleCard(Conflict):
    """409: the person saw another row than the one now waiting."""

    def __init__(self, message: str, current_checkpoint_id: str | None) -> None:
        super().__init__(message)
        self.details = {"current_checkpoint_id": current_checkpoint_id}
        self.current_checkpoint_id = current_checkpoint_id


class NeedsConfirmation(Conflict):
    """409: the run's newest row is recent, so it may still be running elsewhere."""


def _decided_words(decision: Decision) -> str:
    if decision.outcome is None:
        return f"being {decision.verb} by {decision.actor} since {decision.decided_at}"
    return f"already {decision.verb} by {decision.actor} at {decision.decided_at}"


@contextlib.contextmanager
def project_scope(project_id: str | None) -> Iterator[None]:
    """Stamp what the SDK writes with the run's own project, as the run's process did.

    Without it the SDK resolves a project from this process's working directory,
    creating ``.fastaiagent/config.toml`` there, and the resumed rows would carry
    another project than the run's, out of reach of that project's outbox drain.
    """
    from fastaiagent._internal.scope import scoped_project_id

    token = scoped_project_id.set(project_id) if project_id is not None else None
    try:
        yield
    finally:
        if token is not None:
            scoped_project_id.reset(token)


def _result_text(output: Any) -> str | None:
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
    ) -> None:
        self.settings = settings
        self.store = store
        #: The backend's kind (``runs.SQLITE`` or ``runs.POSTGRES``): the SDK orders a
        #: run's rows differently on each, and a resume follows that order.
        self.store_kind = store_kind
        self.registry = registry
        self.decisions = decisions
        # An SDK checkpointer on the served store, for prune; made on first use, since
        # importing the SDK costs a viewer that never prunes memory and start-up time.
        self._make_checkpointer = make_checkpointer
        self._checkpointer: Any = None

    # --- checks -------------------------------------------------------

    def ensure_writable(self) -> None:
        if self.settings.read_only:
            raise ReadOnly("this server is read-only: it shows runs and changes nothing")

    def plan(self, state: str, rows: Sequence[RowHeader]) -> runs.ResumePlan | runs.Refusal:
        """What the run's owner would do on resume, on this store's backend."""
        owner = runs.run_owner(rows)
        return runs.resume_plan(
            state, rows, backend=self.store_kind, chain_order=self.chain_order(owner)
        )

    def chain_order(self, owner: runs.Owner) -> tuple[str, ...] | None:
        """The registered Chain's node order, as ``Chain.resume`` walks it."""
        runner = self.registry.get(owner.name)
        if owner.kind != runs.CHAIN or runner is None or registry_kind(runner) != runs.CHAIN:
            return None
        from fastaiagent.chain.executor import _topological_sort

        return tuple(_topological_sort(runner.nodes, runner.edges))

    def runner_problem(
        self,
        owner: runs.Owner,
        *,
        member: str | None = None,
        tool: str | None = None,
        node: str | None = None,
    ) -> str | None:
        """Why this process cannot resume ``owner``'s run, or None when it can.

        ``member`` is the Supervisor's worker or the Swarm's agent that re-enters,
        ``tool`` the tool it re-invokes, ``node`` the Chain node that runs again.
        """
        runner = self.registry.get(owner.name)
        wanted = owner.describe()
        if runner is None:
            known = ", ".join(self.registry.names()) or "none"
            return (
                f"No {owner.kind} named {owner.name!r} is registered in this localui process "
                f"(registered: {known}). Restart it with --agents MODULE:ATTR (or FILE.py:ATTR) "
                f"naming the code that builds the {wanted}, bound to this store."
            )
        kind = registry_kind(runner)
        if kind != owner.kind:
            return (
                f"{owner.name!r} is registered here as a {kind}, but the run belongs to "
                f"{wanted}: register the {owner.kind} that wrote it."
            )
        agent = runner
        if owner.kind == runs.SUPERVISOR and member is not None:
            workers = {w.role: w.agent for w in runner.workers}
            if member not in workers:
                return (
                    f"{wanted} here has no worker {member!r} (it has: "
                    f"{', '.join(workers) or 'none'}). Register the team the run used."
                )
            agent = workers[member]
        elif owner.kind == runs.SWARM and member is not None:
            if member not in runner.agents:
                return (
                    f"{wanted} here has no agent {member!r} (it has: "
                    f"{', '.join(runner.agents) or 'none'}). Register the swarm the run used."
                )
            agent = runner.agents[member]
        if owner.kind == runs.CHAIN:
            nodes = [n.id for n in runner.nodes]
            if node is not None and node not in nodes:
                return (
                    f"{wanted} here has no node {node!r} (it has: {', '.join(nodes)}). "
                    "Register the chain built with the nodes the run used; resuming without "
                    "it would lose the pause."
                )
            return None
        if tool is not None:
            names = [t.name for t in run_tools(agent)]  # the tools a resume searches
            if tool not in names:
                whose = f"Agent {agent.name!r}" + (f" of {wanted}" if agent is not runner else "")
                return (
                    f"{whose} here has no tool {tool!r} (it has: {', '.join(names) or 'none'}). "
                    f"Register the {owner.kind} built with the same tool list the run used; "
                    "resuming without it would lose the pause."
                )
        return None

    def fork_problem(self, owner: runs.Owner) -> str | None:
        """Why this process cannot fork ``owner``'s runs, or None when it can."""
        if owner.kind in (runs.SUPERVISOR, runs.SWARM):
            return (
                f"The SDK offers no fork for a {owner.kind} run ({owner.describe()}): "
                "there is no afork to call."
            )
        return self.runner_problem(owner)

    def plan_problem(
        self, plan: runs.ResumePlan, *, reentry: RowDetail | None = None
    ) -> str | None:
        """Why this process cannot carry out ``plan``, read exactly as the SDK will.
        ``reentry`` is the row the plan re-enters at, when the caller has read it."""
        tool = None
        if plan.tool is not None and plan.owner.kind != runs.CHAIN:
            tool = self.tool_of(plan.checkpoint_id, plan.node_id, reentry)
        node = plan.start_node if plan.owner.kind == runs.CHAIN else None
        if plan.owner.kind == runs.SWARM and plan.shape != "approval":
            tool = None  # the active agent runs again from its input: no saved tool
        return self.runner_problem(plan.owner, member=plan.member, tool=tool, node=node)

    def tool_of(
        self, checkpoint_id: str, node_id: str, detail: RowDetail | None = None
    ) -> str | None:
        """The tool a resume re-invokes: ``state_snapshot.tool_name``, as the SDK reads it
        (from ``detail`` when it is that row, read already)."""
        if detail is None or detail.header.checkpoint_id != checkpoint_id:
            detail = self.store.get_row(checkpoint_id)
        if detail is not None and isinstance(detail.state_snapshot, dict):
            name = detail.state_snapshot.get("tool_name")
            if isinstance(name, str) and name:
                return name
        return runs.parse_node(node_id).tool

    def pause_owner(self, pending: Pending) -> runs.Owner:
        """Whose resume answers this pause: its row's path says, and for an agent under
        an agent the runs index's owner of the run does (``runs.pause_owner``)."""
        run_agent = None
        if runs.pause_owner_needs_run(pending.agent_path):
            facts = self.store.get_run(pending.execution_id)
            run_agent = facts.agent if facts is not None else None
        return runs.pause_owner(pending.agent_path, pending.agent, pending.node_id, run_agent)

    def approval_problem(self, pending: Pending, *, exact: bool = True) -> str | None:
        """The preflight refusal for a pending approval, shown before anyone clicks.

        ``exact`` reads the tool name from the paused row's snapshot, as the SDK does;
        a queue of cards reads it from the node id, which names the same tool, rather
        than parse every card's snapshot. The decision itself always checks exactly.
        """
        if pending.checkpoint_id is None:
            return (
                "The store has the pending row but not the paused row it belongs to: "
                "the SDK cannot resume this run."
            )
        if exact:
            plan = self.plan(runs.PAUSED, self.store.list_rows(pending.execution_id))
            if isinstance(plan, runs.Refusal):
                return plan.reason
            return self.plan_problem(plan)
        owner = self.pause_owner(pending)
        member = runs.pause_member(owner, pending.agent_path, pending.agent)
        tool = runs.parse_node(pending.node_id).tool if owner.kind != runs.CHAIN else None
        node = pending.node_id if owner.kind == runs.CHAIN else None
        return self.runner_problem(owner, member=member, tool=tool, node=node)

    # --- the approval policy ------------------------------------------

    def rule_for(self, pending: Pending) -> Rule | None:
        """The policy's rule for this pause: the first that matches its owner or agent,
        reason and tool; None without a policy or a match (any approver, alone)."""
        policy = self.settings.policy
        return policy.rule_for(pending) if policy is not None else None

    @staticmethod
    def may_decide(rule: Rule | None, person: Person | None) -> bool:
        """Whether the rule lets this person decide. With sign-in off nobody is
        identified, so the rule's count, reasons and fields apply, but not its "who"."""
        if rule is None or person is None or not person.signed_in:
            return True
        return rule.allows(person.name, person.role, person.groups)

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
    ) -> Outcome:
        """Approve or reject the pause at ``checkpoint_id``, exactly once. Under a rule
        that needs several people, an approval that is not the last is recorded as a
        vote and the run keeps waiting; the one that completes the count decides, with
        every approver's name and the typed ``fields`` in the metadata the tool receives.

        Every check that can refuse comes before anything is recorded: who may decide
        (403), the reason and the fields (400), whether this process can resume (422).
        The metadata is recorded with the claim and handed to the SDK as recorded, so a
        recovery of a crashed approval carries out the same decision.
        """
        self.ensure_writable()
        approver = names.typed_name("approver", approver)
        reason = freetext.reason(reason)
        if not approver:
            raise BadRequest("say who you are: approver is required")
        if not approved and not reason:
            raise BadRequest("a reason is required to reject")
        if not checkpoint_id:
            raise BadRequest("checkpoint_id (the paused row you saw) is required")

        pending = await asyncio.to_thread(self.store.get_pending, execution_id)
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
        rule = self.rule_for(pending)
        typed: dict[str, Any] = {}
        if rule is None:
            if fields:
                raise BadRequest(
                    f"this pause has no fields (no rule governs it): {', '.join(sorted(fields))}"
                )
        else:
            if not self.may_decide(rule, person):
                raise Forbidden(
                    f"Rule {rule.name!r}: only {rule.who} may decide this pause,"
                    f" and {approver} is not one of them"
                )
            if rule.needs_reason(approved) and not reason:
                raise BadRequest(f"Rule {rule.name!r}: a reason is required to approve too")
            typed = rule.check_fields(fields or {}, pending.context)
        problem = await asyncio.to_thread(self.approval_problem, pending)
        if problem is not None:
            # Another approval may have claimed this pause since: its resume writes the
            # rows the check reads, so say who decided rather than what they now show.
            await self._raise_decided(execution_id, checkpoint_id, APPROVAL)
            raise Refused(problem)
        for taken in await asyncio.to_thread(self.decisions.list_for_run, execution_id):
            if taken.kind == APPROVAL and taken.rearmed_checkpoint_id == checkpoint_id:
                # localui wrote this pause again to carry out a decision whose process
                # died: that decision is being carried out, and no other may be.
                raise AlreadyDecided(f"This pause was {_decided_words(taken)}.", taken)
        owner = runs.run_owner(await asyncio.to_thread(self.store.list_rows, execution_id))

        # Exactly what the tool receives, built once: recorded with the claim below.
        resume_metadata: dict[str, Any] = {"approver": approver, "reason": reason}
        mine: Vote | None = None
        if rule is not None:
            key = (execution_id, checkpoint_id)
            if approved and rule.approvals > 1:
                ballot = await asyncio.to_thread(
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
                    age = seconds_since(last.voted_at)
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
                    first = next(v for v in ballot.votes if names.one_person(v.actor, approver))
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
                earlier = await asyncio.to_thread(self.decisions.votes_for, [key])
                voters = [v.actor for v in earlier.get(key, ())]
            approvers = list(dict.fromkeys([*voters, approver]))
            resume_metadata = {
                "approver": approver,
                "approvers": approvers,
                "reason": reason,
                **typed,
            }

        claim = await asyncio.to_thread(
            lambda: self.decisions.claim(
                kind=APPROVAL,
                execution_id=execution_id,
                checkpoint_id=checkpoint_id,
                approved=approved,
                actor=approver,
                reason=reason,
                still_pending=lambda: self.store.get_pending(execution_id) is not None,
                metadata=resume_metadata,
                agent=owner.name,
            )
        )
        if not claim.won:
            if mine is not None:
                # Another decision came first: this approval counts for nothing.
                await asyncio.to_thread(self.decisions.withdraw_vote, mine.id)
            raise AlreadyDecided(
                f"This pause was {_decided_words(claim.decision)}.", claim.decision
            )
        from fastaiagent import Resume

        # What the record now holds, as it holds it: a recovery hands the tool the same.
        recorded = claim.decision.metadata
        resume_value = Resume(
            approved=approved, metadata=dict(recorded) if recorded is not None else resume_metadata
        )
        return await self._run_resume(
            execution_id, claim.decision, "approve" if approved else "reject", resume_value, owner
        )

    async def _raise_decided(self, execution_id: str, checkpoint_id: str, kind: str) -> None:
        for decision in await asyncio.to_thread(self.decisions.list_for_run, execution_id):
            if decision.kind == kind and decision.checkpoint_id == checkpoint_id:
                raise AlreadyDecided(f"This pause was {_decided_words(decision)}.", decision)
        if await asyncio.to_thread(self.store.get_run, execution_id) is None:
            raise NotFound(f"no run with execution id {execution_id!r} in this store")

    # --- resume a crashed or failed run ------------------------------

    def resume_target(self, execution_id: str) -> tuple[str, runs.ResumePlan, RowHeader]:
        """The run's state, its resume plan and newest row, or why it cannot resume."""
        facts = self.store.get_run(execution_id)
        if facts is None:
            raise NotFound(f"no run with execution id {execution_id!r} in this store")
        rows = self.store.list_rows(execution_id)
        state = runs.run_state(facts.last_step_type, facts.last_status, facts.has_pending)
        plan = self.plan(state, rows)
        if isinstance(plan, runs.Refusal):
            raise Refused(plan.reason)
        if plan.shape == "approval":
            raise Refused("This run waits for a person: approve or reject it instead.")
        return state, plan, rows[-1]

    async def resume(
        self, execution_id: str, *, checkpoint_id: str, actor: str, confirm: bool
    ) -> Outcome:
        self.ensure_writable()
        actor = names.typed_name("actor", actor) or "someone"
        if not checkpoint_id:
            raise BadRequest("checkpoint_id (the row the resume re-enters at) is required")
        _, plan, last = await asyncio.to_thread(self.resume_target, execution_id)
        if plan.checkpoint_id != checkpoint_id:
            raise StaleCard(
                f"the run would now re-enter at row {plan.checkpoint_id}, not the row "
                f"{checkpoint_id} you saw: reload the run first",
                plan.checkpoint_id,
            )
        age = seconds_since(last.created_at)
        if not confirm and age is not None and age < RECENT_SECONDS:
            raise NeedsConfirmation(
                f"The newest row is only {int(age)} s old: the run may still be alive in another "
                "process, and resuming it here would run it twice. Confirm to resume anyway."
            )
        problem = await asyncio.to_thread(self.plan_problem, plan)
        if problem is not None:
            raise Refused(problem)
        claim = await asyncio.to_thread(
            lambda: self.decisions.claim(
                kind=RESUME,
                execution_id=execution_id,
                checkpoint_id=checkpoint_id,
                approved=None,
                actor=actor,
                reason="",
                still_pending=lambda: False,
                agent=plan.owner.name,
            )
        )
        if not claim.won:
            raise AlreadyDecided(f"This run was {_decided_words(claim.decision)}.", claim.decision)
        return await self._run_resume(execution_id, claim.decision, "resume", None, plan.owner)

    # --- the SDK call, shared ----------------------------------------

    async def _run_resume(
        self,
        execution_id: str,
        decision: Decision,
        action: str,
        resume_value: Any,
        owner: runs.Owner,
    ) -> Outcome:
        from fastaiagent.chain.interrupt import AlreadyResumed

        # The owner's resume, never its member's: a team resumes as a team.
        agent = self.registry.get(owner.name)
        if agent is None:
            await asyncio.to_thread(self.decisions.release, decision.id)
            raise Refused(f"no agent is registered for run {execution_id!r}")
        project = await asyncio.to_thread(self.store.get_project_id, execution_id)
        deadline = asyncio.get_running_loop().time() + CLAIM_RETRY_SECONDS
        delay = 0.05
        while True:
            try:
                with project_scope(project), self.keep_alive(decision.id):
                    result = await agent.aresume(execution_id, resume_value=resume_value)
                break
            except AlreadyResumed as exc:
                finished = await asyncio.to_thread(
                    self.decisions.finish, decision.id, ALREADY_RESUMED, str(exc)
                )
                raise AlreadyDecided(
                    f"This run was resumed outside this app before it could be: {exc}",
                    finished,
                ) from exc
            except Exception as exc:
                if is_busy(exc) and resume_value is not None:
                    # Only a claim that did not happen may be tried again.
                    still = await asyncio.to_thread(self.store.get_pending, execution_id)
                    if still is not None and asyncio.get_running_loop().time() < deadline:
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 0.5)
                        continue
                error = f"{type(exc).__name__}: {exc}"
                finished = await asyncio.to_thread(
                    self.decisions.finish, decision.id, "failed", error
                )
                return Outcome(execution_id, action, "failed", None, error, finished)
        status = "paused" if result.status == "paused" else "completed"
        output = _result_text(result.output)
        if status == "paused" and result.pending_interrupt:
            output = f"paused again for {result.pending_interrupt.get('reason')}"
        finished = await asyncio.to_thread(self.decisions.finish, decision.id, status, output)
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

    # --- carrying out a decision whose process died ------------------

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
        rows = await asyncio.to_thread(self.store.list_rows, execution_id)
        pending = await asyncio.to_thread(self.store.get_pending, execution_id)
        bound = decision.checkpoint_id
        if any(r.checkpoint_id == decision.rearmed_checkpoint_id for r in rows):
            bound = decision.bound_checkpoint_id  # re-armed before: that row is its pause
        newest = rows[-1] if rows else None
        if newest is None or newest.checkpoint_id != bound:
            return await self._close_moved_on(decision, newest)
        owner = runs.run_owner(rows)
        if decision.kind == RESUME:
            return await self._run_resume(execution_id, decision, "resume", None, owner)
        if pending is not None and pending.checkpoint_id != bound:
            return await self._close_moved_on(decision, newest)
        plan = self.plan(runs.PAUSED, rows)
        problem = plan.reason if isinstance(plan, runs.Refusal) else self.plan_problem(plan)
        if problem is not None:
            # Left for a process that can: the lease runs out again and it takes over.
            raise Refused(problem)
        if pending is None:
            if newest.status != "interrupted":
                return await self._close_moved_on(decision, newest)
            # Recorded before the pending row exists: a person who sees the re-armed
            # pause in the queue is told it is decided, never given it to decide again.
            rearmed = str(uuid.uuid4())
            await asyncio.to_thread(self.decisions.set_rearmed, decision.id, rearmed)
            await asyncio.to_thread(self.rearm, execution_id, bound, owner, rearmed)
        metadata = decision.metadata
        if metadata is None:
            # Recorded before the metadata was kept: what ``decide`` handed the SDK then.
            metadata = {"approver": decision.actor, "reason": decision.reason}
        resume_value = Resume(approved=bool(decision.approved), metadata=dict(metadata))
        action = "approve" if decision.approved else "reject"
        return await self._run_resume(execution_id, decision, action, resume_value, owner)

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
        finished = await asyncio.to_thread(self.decisions.finish, decision.id, status, detail)
        return Outcome(decision.execution_id, "recover", status, None, detail, finished)

    async def _finish_reopen(self, decision: Decision) -> Outcome:
        """A re-open whose process died: re-arm the pause if it did not get to."""
        execution_id = decision.execution_id
        pending = await asyncio.to_thread(self.store.get_pending, execution_id)
        if pending is None:
            try:
                rows = await asyncio.to_thread(self.orphan_of, execution_id, decision.checkpoint_id)
            except (Conflict, NotFound):
                rows = ()
            if rows:
                owner = runs.run_owner(rows)
                rearmed = await asyncio.to_thread(
                    self.rearm, execution_id, decision.checkpoint_id, owner, str(uuid.uuid4())
                )
                return await self._reopened(decision, rearmed)
        if pending is not None:
            return await self._reopened(decision, str(pending.checkpoint_id))
        output = "the run moved on before the re-open was written: nothing was re-opened"
        finished = await asyncio.to_thread(self.decisions.finish, decision.id, "moved_on", output)
        return Outcome(execution_id, "reopen", "unfinished", output, None, finished)

    async def _reopened(self, decision: Decision, rearmed: str) -> Outcome:
        output = f"re-opened as row {rearmed}: it waits in the approvals queue"
        finished = await asyncio.to_thread(self.decisions.finish, decision.id, "reopened", output)
        return Outcome(decision.execution_id, "reopen", "paused", output, None, finished)

    async def reopen(self, execution_id: str, *, checkpoint_id: str, actor: str) -> Outcome:
        """Re-arm an orphaned pause that no decision of localui's explains, so it waits
        in the queue again; bound to the row the operator saw, and done once."""
        self.ensure_writable()
        actor = names.typed_name("actor", actor) or "someone"
        if not checkpoint_id:
            raise BadRequest("checkpoint_id (the paused row you saw) is required")
        rows = await asyncio.to_thread(self.orphan_of, execution_id, checkpoint_id)
        for decision in await asyncio.to_thread(self.decisions.list_for_run, execution_id):
            if decision.kind == APPROVAL and decision.bound_checkpoint_id == checkpoint_id:
                if decision.outcome is None:
                    raise AlreadyDecided(
                        f"This pause was {_decided_words(decision)}: localui carries that "
                        "decision out once its process is known to be gone.",
                        decision,
                    )
        owner = runs.run_owner(rows)
        problem = self.runner_problem(owner)
        if problem is not None:
            raise Refused(problem)
        claim = await asyncio.to_thread(
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
            await asyncio.to_thread(self.orphan_of, execution_id, checkpoint_id)
            rearmed = await asyncio.to_thread(
                self.rearm, execution_id, checkpoint_id, owner, str(uuid.uuid4())
            )
        except BaseException:
            await asyncio.to_thread(self.decisions.release, claim.decision.id)
            raise
        return await self._reopened(claim.decision, rearmed)

    # --- fork ----------------------------------------------------------

    async def fork(
        self, execution_id: str, *, checkpoint_id: str | None, new_input: str | None
    ) -> Outcome:
        self.ensure_writable()
        facts = await asyncio.to_thread(self.store.get_run, execution_id)
        if facts is None:
            raise NotFound(f"no run with execution id {execution_id!r} in this store")
        if checkpoint_id:
            detail = await asyncio.to_thread(self.store.get_row, checkpoint_id)
            if detail is None or detail.header.execution_id != execution_id:
                raise NotFound(f"run {execution_id!r} has no row {checkpoint_id!r}")
            refusal = runs.fork_refusal(detail.header)
            if refusal is not None:
                raise Refused(refusal.reason)
        owner = runs.run_owner(await asyncio.to_thread(self.store.list_rows, execution_id))
        problem = self.fork_problem(owner)
        if problem is not None:
            raise Refused(problem)
        agent = self.registry.get(owner.name)
        if agent is None:
            raise Refused(f"no runner named {owner.name!r} is registered here")
        project = await asyncio.to_thread(self.store.get_project_id, execution_id)
        try:
            with project_scope(project):
                result = await agent.afork(
                    execution_id, checkpoint_id=checkpoint_id or None, input=new_input or None
                )
        except Exception as exc:
            return Outcome(
                execution_id, "fork", "failed", None, f"{type(exc).__name__}: {exc}", None
            )
        return Outcome(
            execution_id,
            "fork",
            "forked",
            _result_text(result.output),
            None,
            None,
            new_execution_id=result.execution_id,
        )

    # --- prune -------------------------------------------------------

    def prune_preview(self, older_than: timedelta) -> PrunePreview:
        cutoff = (datetime.now(UTC) - older_than).isoformat()
        return self.store.prune_preview(cutoff)

    def prune(self, cutoff: datetime) -> int:
        """Prune through the SDK, as of the cutoff the person previewed."""
        self.ensure_writable()
        older_than = datetime.now(UTC) - cutoff
        if older_than < timedelta(0):
            raise BadRequest("the cutoff is in the future")
        if self._checkpointer is None:
            self._checkpointer = self._make_checkpointer()
        deleted: int = self._checkpointer.prune(older_than)
        return deleted


def seconds_since(value: str) -> float | None:
    then = runs.parse_time(value)
    if then is None:
        return None
    return (datetime.now(UTC) - then).total_seconds()
