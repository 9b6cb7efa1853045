"""Decisions and votes as pages show them, and what a rule still needs."""

from __future__ import annotations

from dataclasses import dataclass

from localui.actions import ActionService
from localui.records import (
    ALREADY_RESUMED,
    APPROVAL,
    EDIT,
    RESUME,
    Decision,
    Vote,
)
from localui.shortids import shortest_unique
from localui.views.respond import html_only
from localui.words import edit_lines


@dataclass(frozen=True, slots=True)
class DecisionView:
    kind: str
    checkpoint_id: str
    approved: bool | None
    approver: str
    reason: str
    decided_at: str
    outcome: str | None
    detail: str | None
    finished_at: str | None
    words: str = html_only("")
    #: The row's id as the page's decisions show it (``localui.shortids``).
    short_checkpoint_id: str = html_only("")
    #: An edit's changes, a line each (``words.edit_lines``).
    changes: tuple[str, ...] = ()
    #: For an edit: the run and row it went on from.
    source_execution_id: str | None = None


def decision_view(d: Decision, short_checkpoint_id: str | None = None) -> DecisionView:
    source = None
    if d.kind == EDIT:
        source = str((d.metadata or {}).get("source_execution_id") or "") or None
        words = (
            f"{d.actor} edited row {d.checkpoint_id} of run {source} and went on from it "
            f"at {d.decided_at}"
        )
        words += (
            ": the branch is still going." if d.outcome is None else f": the branch {d.outcome}."
        )
    elif d.outcome is None:
        words = f"{d.actor} {d.verb} it at {d.decided_at}; the run is still going."
    elif d.outcome == ALREADY_RESUMED:
        words = f"{d.actor} {d.verb} it at {d.decided_at}, but it was resumed elsewhere first."
    else:
        words = f"{d.actor} {d.verb} it at {d.decided_at}: the run {d.outcome}."
    if d.state_edit is not None:
        words += " The chain's state was edited with the decision, as listed."
    if d.rearmed_checkpoint_id is not None:
        words += (
            " The process carrying it out died after the SDK took the pause: localui wrote"
            f" the pause again as row {d.rearmed_checkpoint_id} and carried the decision out"
            " from there, running the tool again from the top."
        )
    return DecisionView(
        kind=d.kind,
        checkpoint_id=d.checkpoint_id,
        approved=d.approved,
        approver=d.actor,
        reason=d.reason,
        decided_at=d.decided_at,
        outcome=d.outcome,
        detail=d.detail,
        finished_at=d.finished_at,
        words=words,
        short_checkpoint_id=short_checkpoint_id
        or shortest_unique([d.checkpoint_id])[d.checkpoint_id],
        changes=edit_lines(d.metadata if d.kind in (EDIT, RESUME) else d.state_edit),
        source_execution_id=source,
    )


@dataclass(frozen=True, slots=True)
class VoteView:
    actor: str
    voted_at: str
    age: str


def needed_words(remaining: int, *, more: bool = True) -> str:
    if remaining == 1:
        return "one more person needed" if more else "one person needed"
    return f"{remaining} more people needed" if more else f"{remaining} people needed"


def vote_view(vote: Vote, short_checkpoint_id: str | None = None) -> DecisionView:
    """A vote among a run's decisions: one approval a rule counted, not yet the last."""
    return DecisionView(
        kind="vote",
        checkpoint_id=vote.checkpoint_id,
        approved=True,
        approver=vote.actor,
        reason=vote.reason,
        decided_at=vote.voted_at,
        outcome="voted",
        detail=None,
        finished_at=vote.voted_at,
        words=f"{vote.actor} approved it at {vote.voted_at}, one of the approvals its rule needs.",
        short_checkpoint_id=short_checkpoint_id
        or shortest_unique([vote.checkpoint_id])[vote.checkpoint_id],
    )


def decision_views(
    actions: ActionService,
    execution_id: str,
    *,
    approvals_only: bool = False,
    recorded: tuple[Decision, ...] | None = None,
    votes: tuple[Vote, ...] | None = None,
) -> tuple[DecisionView, ...]:
    """A run's decisions and votes (``recorded`` and ``votes``, when the caller read
    them), oldest first, their rows' ids shortened to read apart from each other. The
    vote that completed a count is a decision as well, shown once, as that."""
    if recorded is None:
        recorded = actions.decisions.list_for_run(execution_id)
    if votes is None:
        votes = actions.decisions.votes_for_run(execution_id)
    decisions = [d for d in recorded if not approvals_only or d.kind == APPROVAL]
    decided = {(d.checkpoint_id, d.actor) for d in decisions if d.kind == APPROVAL}
    votes = tuple(v for v in votes if (v.checkpoint_id, v.actor) not in decided)
    ids = shortest_unique([d.checkpoint_id for d in decisions] + [v.checkpoint_id for v in votes])
    shown = [(d.decided_at, decision_view(d, ids[d.checkpoint_id])) for d in decisions]
    shown += [(v.voted_at, vote_view(v, ids[v.checkpoint_id])) for v in votes]
    return tuple(view for _, view in sorted(shown, key=lambda pair: pair[0]))
