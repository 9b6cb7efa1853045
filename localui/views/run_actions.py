"""What a run's page offers to do, and what each would do as the SDK does it:
resume (where it re-enters, what it runs again), the pause, re-open, fork.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from localui import runs
from localui.actions import ActionService
from localui.auth import OPEN, Person
from localui.records import (
    APPROVAL,
    Decision,
    Pending,
    RowHeader,
    Vote,
)
from localui.views.cards import ApprovalItem, approval_item
from localui.views.decision_views import DecisionView, decision_views
from localui.views.respond import html_only, pretty_json
from localui.views.row import jsonable
from localui.views.urls import Urls


@dataclass(frozen=True, slots=True)
class ResumeView:
    shape: str
    node_id: str
    checkpoint_id: str
    tool: str | None
    turn: int | None
    reason: str | None
    saved_args: Any
    #: A Chain's node that runs next; the team member that re-enters.
    start_node: str | None = None
    member: str | None = None


@dataclass(frozen=True, slots=True)
class PendingView:
    node_id: str
    reason: str
    context: Any
    created_at: str
    context_json: str = html_only("")


#: What re-arming a pause does to its tool, on every page that offers or reports it.
RERUN_NOTE = (
    "A re-armed pause's tool runs again from the top with the decision: whatever it did"
    " after interrupt() returned and before its process died happens again, unless that"
    " step is @idempotent."
)


@dataclass(frozen=True, slots=True)
class OrphanView:
    """A paused row whose pending row is gone: the SDK can no longer resume it."""

    checkpoint_id: str
    node_id: str
    #: The unfinished decision of localui's that explains it, in words: localui carries
    #: that decision out itself once its process is known to be gone.
    carried_by: str | None
    #: Why this process cannot re-open the pause (its runner is not registered).
    problem: str | None
    rerun: str = RERUN_NOTE


def orphan_view(
    actions: ActionService, last: RowHeader, owner: runs.Owner, recorded: Sequence[Decision]
) -> OrphanView:
    carried_by = None
    for d in recorded:
        if d.kind == APPROVAL and d.outcome is None and d.bound_checkpoint_id == last.checkpoint_id:
            carried_by = (
                f"{d.actor} {d.verb} this pause at {d.decided_at}, and the process carrying"
                " that out stopped before the tool wrote its next row. Once that process has"
                f" been silent for {actions.decisions.lease_seconds:g} s, localui re-arms the"
                " pause and carries the same decision out, once."
            )
    return OrphanView(
        checkpoint_id=last.checkpoint_id,
        node_id=last.node_id,
        carried_by=carried_by,
        problem=actions.preflight.runner_problem(owner),
    )


def resume_view(plan: runs.ResumePlan | runs.Refusal, saved_args: Any) -> ResumeView | None:
    if not isinstance(plan, runs.ResumePlan):
        return None
    return ResumeView(
        shape=plan.shape,
        node_id=plan.node_id,
        checkpoint_id=plan.checkpoint_id,
        tool=plan.tool,
        turn=plan.turn,
        reason=plan.reason,
        saved_args=jsonable(saved_args),
        start_node=plan.start_node,
        member=plan.member,
    )


def pending_view(pending: Pending | None) -> PendingView | None:
    if pending is None:
        return None
    return PendingView(
        node_id=pending.node_id,
        reason=pending.reason,
        context=jsonable(pending.context),
        created_at=pending.created_at,
        context_json=pretty_json(pending.context),
    )


@dataclass(frozen=True, slots=True)
class ActionsSection:
    """What this process can do with the run (its runner and tool registered or not), the
    pause's card, and what localui already did with the run."""

    decisions: tuple[DecisionView, ...] = ()
    #: The run's decisions as the record holds them, oldest first.
    recorded: tuple[Decision, ...] = ()
    #: The newest approval or rejection recorded for the run.
    last_approval: Decision | None = None
    resume_problem: str | None = None
    fork_problem: str | None = None
    approval: ApprovalItem | None = None
    #: No runner of the run's owner is registered here: said once, above the panels,
    #: which then are read-only without saying it again.
    runner_missing: str | None = None


def actions_section(
    actions: ActionService,
    execution_id: str,
    owner: runs.Owner,
    plan: runs.ResumePlan | runs.Refusal,
    pending: Pending | None,
    now: datetime,
    urls: Urls,
    person: Person = OPEN,
    *,
    recorded: tuple[Decision, ...] | None = None,
    votes: tuple[Vote, ...] | None = None,
) -> ActionsSection:
    """``recorded`` and ``votes``: the run's decisions and votes, when the caller read
    them (else read here)."""
    resume_problem = None
    if isinstance(plan, runs.ResumePlan) and plan.shape != "approval":
        resume_problem = actions.preflight.plan_problem(plan)
    fork_problem = actions.preflight.fork_problem(owner)
    missing = (
        actions.preflight.runner_problem(owner)
        if actions.registry.get(owner.name) is None
        else None
    )
    if recorded is None:
        recorded = actions.decisions.list_for_run(execution_id)
    return ActionsSection(
        decisions=decision_views(actions, execution_id, recorded=recorded, votes=votes),
        recorded=recorded,
        last_approval=next((d for d in reversed(recorded) if d.kind == APPROVAL), None),
        # What the missing runner explains is not said again in a panel of its own.
        resume_problem=None
        if missing is not None and resume_problem == missing
        else resume_problem,
        fork_problem=None if missing is not None and fork_problem == missing else fork_problem,
        approval=approval_item(actions, pending, now, urls, person=person)
        if pending is not None
        else None,
        runner_missing=missing,
    )
