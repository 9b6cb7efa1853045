"""The checks an action makes before it asks the SDK for anything, which the pages
also show before anyone clicks.

``Agent.aresume`` claims the pending row *first* and looks the tool up *after*: a
resume that fails its lookup has already lost the pause. So every action, and every
card and run page that offers one, asks here whether this process can finish it: the
run's owner is registered, as the right kind of runner, with the member, tool or node
the resume needs, read exactly as the SDK will read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from localui import delegation, forks, runs
from localui.auth import Person
from localui.backends.base import Store, UserDirectory
from localui.backends.users import Everyone
from localui.errors import NotFound, ReadOnly, Refused, no_such_run
from localui.policy import Rule
from localui.records import Pending, RowDetail, RowHeader, User
from localui.registry import Registry, registry_kind, run_tools
from localui.settings import Settings


class Preflight:
    """What this process can carry out on this store, asked before any claim."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        store_kind: str,
        registry: Registry,
        users: UserDirectory | None = None,
    ) -> None:
        self.settings = settings
        #: Everyone in the users table, read at most two seconds ago: who is away, and
        #: who decides for them (``localui.delegation``).
        self.people = Everyone(users)
        self._known_stand_ins: tuple[tuple[User, ...], Mapping[str, tuple[User, ...]]] | None = None
        self.store = store
        #: The backend's kind (``runs.SQLITE`` or ``runs.POSTGRES``): the SDK orders a
        #: run's rows differently on each, and a resume follows that order.
        self.store_kind = store_kind
        self.registry = registry

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

    def approval_problem(
        self,
        pending: Pending,
        *,
        exact: bool = True,
        rows: Sequence[RowHeader] | None = None,
    ) -> str | None:
        """The preflight refusal for a pending approval, shown before anyone clicks.

        ``exact`` reads the tool name from the paused row's snapshot, as the SDK does;
        a queue of cards reads it from the node id, which names the same tool, rather
        than parse every card's snapshot. The decision itself always checks exactly,
        on the run's ``rows`` it has read already.
        """
        if pending.checkpoint_id is None:
            return (
                "The store has the pending row but not the paused row it belongs to: "
                "the SDK cannot resume this run."
            )
        if exact:
            if rows is None:
                rows = self.store.list_rows(pending.execution_id)
            plan = self.plan(runs.PAUSED, rows)
            if isinstance(plan, runs.Refusal):
                return plan.reason
            return self.plan_problem(plan)
        owner = self.pause_owner(pending)
        member = runs.pause_member(owner, pending.agent_path, pending.agent)
        tool = runs.parse_node(pending.node_id).tool if owner.kind != runs.CHAIN else None
        node = pending.node_id if owner.kind == runs.CHAIN else None
        return self.runner_problem(owner, member=member, tool=tool, node=node)

    def rule_for(self, pending: Pending) -> Rule | None:
        """The policy's rule for this pause: the first that matches its owner or agent,
        reason and tool; None without a policy or a match (any approver, alone)."""
        policy = self.settings.policy
        return policy.rule_for(pending) if policy is not None else None

    def may_decide(
        self,
        rule: Rule | None,
        person: Person | None,
        pending: Pending | None = None,
        now: datetime | None = None,
    ) -> bool:
        """Whether the rule lets this person decide, in their own right or for someone
        away whose delegate they are. With sign-in off nobody is identified, so the
        rule's count, reasons and fields apply, but not its "who". Once ``pending`` is
        past its rule's ``due`` at ``now`` (default: this moment), the rule's
        ``escalate_to`` people may decide it too; without ``pending``, only the rule's
        approvers (and their delegates)."""
        return self.standing(rule, person, pending, now).may

    def standing(
        self,
        rule: Rule | None,
        person: Person | None,
        pending: Pending | None = None,
        now: datetime | None = None,
    ) -> delegation.Standing:
        """What this person may do with a pause under ``rule``: decide it themselves
        (as one of its approvers, or of its ``escalate_to`` once ``pending`` is overdue),
        or for the away people they stand in for (``localui.delegation``). The users
        table is read (through its two-second cache) only when the rule does not let
        them decide themselves."""
        if rule is None or person is None or not person.identified:
            return delegation.Standing(own=True)
        if rule.allows(person.name, person.role, person.groups):
            return delegation.Standing(own=True)
        if (
            pending is not None
            and rule.escalate_to
            and rule.is_overdue(pending.created_at, now or datetime.now(UTC))
            and rule.allows_escalated(person.name, person.role, person.groups)
        ):
            return delegation.Standing(own=True)
        represented = self._stand_ins().get(person.name, ())
        return delegation.standing_among(rule, person.name, person.role, person.groups, represented)

    def _stand_ins(self) -> Mapping[str, tuple[User, ...]]:
        """Who stands in for whom, worked out once per read of everyone (two seconds),
        not once per card: an until that passes is seen with the next read."""
        people = self.people()
        known = self._known_stand_ins
        if known is None or known[0] is not people:
            known = (people, delegation.stand_ins(people, datetime.now(UTC)))
            self._known_stand_ins = known
        return known[1]

    def fork_plan(
        self,
        execution_id: str,
        checkpoint_id: str | None,
        new_input: str | None,
        messages: list[dict[str, Any]] | None = None,
    ) -> forks.ForkPlan:
        """What a fork of the run from ``checkpoint_id`` (else its newest step) would do,
        as the SDK does it; refused (422) where the fork would be. Reads the run's row
        headers, the chosen row, the tool rows the preview names and the run's cache.
        With ``messages``, an agent's branch from the row's conversation as edited."""
        return self.fork_plans(execution_id, checkpoint_id, (new_input,), messages)[0]

    def fork_plans(
        self,
        execution_id: str,
        checkpoint_id: str | None,
        inputs: Sequence[str | None],
        messages: list[dict[str, Any]] | None = None,
    ) -> tuple[forks.ForkPlan, ...]:
        """:meth:`fork_plan` for each of ``inputs`` (no input, a new one), the run read
        once for all of them: a preview that shows both choices of a 2,000-row run
        reads its rows, its cache and the tool rows either choice names one time."""
        rows = self.store.list_rows(execution_id)
        if not rows:
            raise no_such_run(execution_id, listed=self.store.listed(execution_id))
        if checkpoint_id:
            header = next((r for r in rows if r.checkpoint_id == checkpoint_id), None)
            if header is None:
                raise NotFound(f"run {execution_id!r} has no row {checkpoint_id!r}")
        else:
            header = next((r for r in reversed(rows) if runs.fork_refusal(r) is None), None)
            if header is None:
                raise Refused("The run holds no executed step to fork from.")
        refusal = runs.fork_refusal(header)
        if refusal is not None:
            raise Refused(refusal.reason)
        owner = runs.run_owner(rows)
        problem = self.fork_problem(owner)
        if problem is not None:
            raise Refused(problem)
        base = self.store.get_row(header.checkpoint_id)
        if base is None:
            raise NotFound(f"run {execution_id!r} has no row {header.checkpoint_id!r}")
        cache = self.store.list_cache(execution_id)
        if owner.kind == runs.CHAIN:
            runner = self.registry.get(owner.name)
            order = self.chain_order(owner) or ()
            nodes = runner.nodes if runner is not None else ()
            kinds = {n.id: str(getattr(n.type, "value", n.type)) for n in nodes}
            tools = {n.id: str(getattr(n.tool, "name", "") or n.id) for n in nodes}
            if header.node_id not in order or header.node_id == order[-1]:
                raise Refused(
                    f"Node `{header.node_id}` is the chain's last node (or not one of its "
                    "nodes): a fork runs the nodes after it, and there are none. Fork from "
                    "an earlier step."
                )
            # A chain's plan does not depend on the input (it is merged into the state).
            plan = forks.chain_plan(base, rows, cache, order, kinds, tools)
            return tuple(plan for _ in inputs)
        if messages is not None:
            snapshot = base.state_snapshot if isinstance(base.state_snapshot, dict) else {}
            base = dataclasses.replace(base, state_snapshot={**snapshot, "messages": messages})
        wanted: dict[str, None] = {}
        for new_input in inputs:
            to_read, _ = forks.calls_to_read(rows, header, fresh=bool(new_input))
            wanted.update(dict.fromkeys(r.checkpoint_id for r in to_read))
        calls = self.store.get_rows(list(wanted)) if wanted else {}
        return tuple(
            forks.agent_plan(base, rows, calls, cache, new_input=new_input) for new_input in inputs
        )
