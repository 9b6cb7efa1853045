"""``/attention``: the runs that need a person, and why.

A run is here when it is stalled (unfinished, its newest row older than
``--stale-after``: its process most likely died), failed, orphaned (its pause was
claimed and it never went on), paused for longer than ``--remind-after``, or has rows
the plane quarantined; above them, the pauses past their policy rule's ``due``. The
list and its counts come from the runs index; each row of
the page then says what a resume would do, in the run page's words, read from that
run's own rows (found by its id, never by a scan): the rows of the page's runs, the rows
their resumes re-enter at and their cache are each read in one query for the page.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from localui import runs
from localui.actions import RECENT_SECONDS, ActionService
from localui.auth import OPERATOR, person_of
from localui.backends.base import Deadlines
from localui.offloop import off_loop
from localui.records import (
    APPROVAL,
    RESUME,
    AttentionQuery,
    CacheEntry,
    Decision,
    RowDetail,
    RowHeader,
    RunFacts,
)
from localui.shortids import shortest_unique
from localui.views.nav import Nav
from localui.views.params import decode_cursor, encode_cursor
from localui.views.respond import html_only, respond, wants_json
from localui.views.run_cache import writer_row
from localui.views.state import beside, context
from localui.views.urls import Urls, urls_of
from localui.words import age_words, decided_words, due_words, verdict

#: Runs on one page: each is read from its own rows for what a resume would do.
ATTENTION_PAGE = 25

#: What each reason means, for the page's legend and each row's "why".
REASON_WORDS = {
    runs.STALLED: "stalled: no end marker and no new row for longer than --stale-after",
    runs.FAILED: "failed: the run wrote a failed end marker (a run that ran out of time too;"
    " a cancelled one only while a pause of it still waits for an answer)",
    runs.ORPHANED: "orphaned: its pause was claimed and the run never went on",
    runs.OVERDUE: "overdue: waiting for a person for longer than --remind-after",
    runs.QUARANTINED: "quarantined: the plane refused some of its rows",
}


@dataclass(frozen=True, slots=True)
class AttentionRow:
    execution_id: str
    agent: str
    state: str
    #: Every reason the run is here (``stalled``, ``failed``, ``orphaned``,
    #: ``overdue``, ``quarantined``).
    why: tuple[str, ...]
    #: The newest row's time: since when the run has been like this.
    since: str
    url: str
    #: What a resume would do, as the run page's verdict says it.
    resume: str
    #: The run's error, or the newest decision localui recorded on it.
    detail: str | None
    #: The row a resume re-enters at: post it back as the pick, so nothing the page
    #: did not show is resumed. Null when the run cannot be resumed from here.
    checkpoint_id: str | None
    #: Why this process cannot resume it (no runner registered, refused by the SDK).
    resume_problem: str | None
    #: The tool a resume would run again with no cached result to answer it.
    repeats: str | None
    #: The newest row is recent: a resume must be confirmed.
    needs_confirm: bool
    rows_quarantined: int
    pick: str = html_only("")
    #: The run's id as this page shows it (``localui.shortids``); the title has it whole.
    short_id: str = html_only("")
    since_ago: str = html_only("")
    why_words: str = html_only("")
    card_url: str | None = html_only(None)


@dataclass(frozen=True, slots=True)
class OverduePause:
    """A pause past its policy rule's ``due`` (``localui_deadlines``)."""

    execution_id: str
    checkpoint_id: str
    rule: str
    due_at: str
    #: ``overdue by 20 min``.
    due: str = html_only("")
    #: ``escalated to managers`` once its rule's ``escalate_to`` may decide it; else "".
    escalated: str = html_only("")
    card_url: str = html_only("")


#: Overdue pauses the page lists, soonest due first.
OVERDUE_PAUSES = 50


def overdue_pauses(
    actions: ActionService, deadlines: Deadlines, now: datetime, urls: Urls
) -> tuple[OverduePause, ...]:
    """The pauses past their rule's ``due`` that still wait, soonest due first."""
    found: list[OverduePause] = []
    for row in deadlines.list_overdue(now.timestamp(), OVERDUE_PAUSES):
        pending = actions.store.get_pending(row.execution_id)
        if pending is None or pending.checkpoint_id != row.checkpoint_id:
            continue  # decided since: the deadlines' next poll forgets it
        rule = actions.preflight.rule_for(pending)
        due = datetime.fromtimestamp(row.due_at, UTC)
        found.append(
            OverduePause(
                execution_id=row.execution_id,
                checkpoint_id=row.checkpoint_id,
                rule=row.rule,
                due_at=due.isoformat(),
                due=due_words(due, now),
                escalated=f"escalated to {rule.escalated_who}"
                if rule is not None and rule.escalate_to
                else "",
                card_url=urls.approval(row.execution_id),
            )
        )
    return tuple(found)


@dataclass(frozen=True, slots=True)
class AttentionPage:
    runs: tuple[AttentionRow, ...]
    #: Runs per reason (a run may count under two) and ``total``, each run once.
    counts: Mapping[str, int]
    #: The cursor for the next page (``?after=``), or null on the last page.
    next: str | None
    next_url: str | None
    stale_after: float
    remind_after: float
    oldest_pause_at: str | None
    #: Pauses past their policy rule's ``due`` (on the first page; none without a rule
    #: that gives deadlines).
    overdue_pauses: tuple[OverduePause, ...] = ()
    #: Whether this person may tick runs and resume them here.
    can_resume: bool = html_only(False)
    legend: tuple[tuple[str, str], ...] = html_only(())


def _run_error(detail: RowDetail | None) -> str | None:
    if detail is None or not isinstance(detail.state_snapshot, dict):
        return None
    error = detail.state_snapshot.get("run_error")
    return str(error) if error else None


def repeats_uncached(
    actions: ActionService, plan: runs.ResumePlan, rows: Sequence[RowHeader], tool: str | None
) -> str | None:
    """The tool a resume re-invokes with no cached result written by the row it
    re-enters at: that call runs again, side effects and all."""
    if plan.shape != "tool" or tool is None:
        return None
    return uncached_tool(plan, rows, tool, actions.store.list_cache(rows[-1].execution_id))


def uncached_tool(
    plan: runs.ResumePlan, rows: Sequence[RowHeader], tool: str, cache: Sequence[CacheEntry]
) -> str | None:
    """:func:`repeats_uncached` over the run's cache entries, read already."""
    for entry in cache:
        writer = writer_row(entry, rows)
        if writer is not None and writer.checkpoint_id == plan.checkpoint_id:
            return None
    return tool


@dataclass(frozen=True, slots=True)
class _Planned:
    """One run of the page with its rows read and its resume planned: what the page
    reads next for all its runs at once."""

    facts: RunFacts
    state: str
    rows: tuple[RowHeader, ...]
    plan: runs.ResumePlan | runs.Refusal

    @property
    def resumable(self) -> bool:
        return isinstance(self.plan, runs.ResumePlan) and self.plan.shape != "approval"

    @property
    def reentry_id(self) -> str | None:
        """The row a tool resume re-enters at: its saved arguments and tool name."""
        plan = self.plan
        if isinstance(plan, runs.ResumePlan) and plan.tool is not None:
            return plan.checkpoint_id
        return None

    @property
    def error_id(self) -> str | None:
        """A failed run's end marker, which holds its error."""
        return self.rows[-1].checkpoint_id if self.state in runs.FAILURES and self.rows else None


def _plan(actions: ActionService, facts: RunFacts, rows: tuple[RowHeader, ...]) -> _Planned:
    state = runs.state_of(facts)
    return _Planned(facts, state, rows, actions.preflight.plan(state, rows))


def attention_row(
    actions: ActionService,
    planned: _Planned,
    details: Mapping[str, RowDetail],
    cache: Mapping[str, tuple[CacheEntry, ...]],
    decision: Decision | None,
    now: datetime,
    urls: Urls,
    short_id: str = "",
) -> AttentionRow:
    """One run of the page, with what a resume would do read from its own rows
    (``details`` and ``cache`` hold what the page read for all its runs)."""
    settings = actions.settings
    facts, state, rows, plan = planned.facts, planned.state, planned.rows, planned.plan
    why = runs.attention_reasons(
        state,
        facts.last_at,
        facts.rows_quarantined,
        now,
        stale_after=settings.stale_after,
        remind_after=settings.remind_after,
        has_pending=facts.has_pending,
    )
    saved_args: Any = None
    skipped: tuple[str, ...] = ()
    tool: str | None = None
    reentry: RowDetail | None = None
    if isinstance(plan, runs.ResumePlan) and plan.tool is not None:
        reentry = details.get(plan.checkpoint_id)
        tool = runs.parse_node(plan.node_id).tool
        if reentry is not None:
            saved_args = reentry.node_input
            skipped = runs.skipped_siblings(reentry.state_snapshot)
            # The tool the SDK re-invokes, read as ``Preflight.tool_of`` reads it,
            # from the row already at hand.
            snapshot = reentry.state_snapshot
            named = snapshot.get("tool_name") if isinstance(snapshot, dict) else None
            tool = named if isinstance(named, str) and named else tool
    error_id = planned.error_id
    error = _run_error(details.get(error_id)) if error_id is not None else None
    resume = (
        verdict(state, plan, last=rows[-1], now=now, saved_args=saved_args, skipped=skipped).resume
        if rows
        else "The run has no rows left."
    )
    resumable = planned.resumable
    problem = (
        actions.preflight.plan_problem(plan, reentry=reentry)
        if isinstance(plan, runs.ResumePlan) and resumable
        else None
    )
    checkpoint_id = plan.checkpoint_id if isinstance(plan, runs.ResumePlan) and resumable else None
    repeats = (
        uncached_tool(plan, rows, tool, cache.get(facts.execution_id, ()))
        if isinstance(plan, runs.ResumePlan)
        and resumable
        and plan.shape == "tool"
        and tool is not None
        else None
    )
    if error:
        detail: str | None = f"error: {error}"
    elif decision is not None:
        detail = decided_words(decision) + f" at {decision.decided_at}"
        if decision.outcome:
            detail += f": the run {decision.outcome}"
    else:
        detail = None
    age = runs.seconds_since(facts.last_at)
    return AttentionRow(
        execution_id=facts.execution_id,
        agent=facts.agent,
        state=state,
        why=why,
        since=facts.last_at,
        url=urls.run(facts.execution_id),
        resume=resume,
        detail=detail,
        checkpoint_id=checkpoint_id,
        resume_problem=problem,
        repeats=repeats,
        needs_confirm=age is not None and age < RECENT_SECONDS,
        rows_quarantined=facts.rows_quarantined,
        pick=json.dumps([facts.execution_id, checkpoint_id]) if checkpoint_id else "",
        short_id=short_id or facts.execution_id,
        since_ago=age_words(facts.last_at, now),
        why_words="; ".join(REASON_WORDS[w] for w in why),
        card_url=urls.approval(facts.execution_id) if state == runs.PAUSED else None,
    )


def attention_rows(
    actions: ActionService,
    page: Sequence[RunFacts],
    decided: Mapping[str, Decision],
    now: datetime,
    urls: Urls,
) -> tuple[AttentionRow, ...]:
    """The page's runs, each read from its own rows: three reads for the whole page
    (the runs' rows; the rows resumes re-enter at and failed runs' end markers; the
    cache of the runs a tool resume would re-invoke), not three per run."""
    store = actions.store
    ids = [f.execution_id for f in page]
    rows_of = store.list_rows_of(ids)
    planned = [_plan(actions, f, rows_of.get(f.execution_id, ())) for f in page]
    wanted = [cid for p in planned for cid in (p.reentry_id, p.error_id) if cid is not None]
    details = store.get_rows(wanted) if wanted else {}
    tool_runs = [
        p.facts.execution_id
        for p in planned
        if p.resumable and isinstance(p.plan, runs.ResumePlan) and p.plan.shape == "tool"
    ]
    cache = store.list_cache_of(tool_runs) if tool_runs else {}
    shown = shortest_unique(ids)
    return tuple(
        attention_row(
            actions,
            p,
            details,
            cache,
            decided.get(p.facts.execution_id),
            now,
            urls,
            shown[p.facts.execution_id],
        )
        for p in planned
    )


def _newest(*found: Mapping[str, Decision]) -> dict[str, Decision]:
    latest: dict[str, Decision] = {}
    for decisions in found:
        for execution_id, decision in decisions.items():
            known = latest.get(execution_id)
            if known is None or (decision.decided_at, decision.id) > (known.decided_at, known.id):
                latest[execution_id] = decision
    return latest


def build_attention_page(
    actions: ActionService,
    after: tuple[str, str] | None,
    urls: Urls,
    *,
    can_resume: bool,
    deadlines: Deadlines | None = None,
) -> AttentionPage:
    settings = actions.settings
    now = datetime.now(UTC)
    stale_before, overdue_before = settings.attention_cutoffs(now)
    page = actions.store.list_attention(
        AttentionQuery(
            stale_before=stale_before,
            overdue_before=overdue_before,
            after=after,
            limit=min(settings.page_size, ATTENTION_PAGE),
        )
    )
    ids = [f.execution_id for f in page.runs]
    decided = _newest(
        actions.decisions.latest_for_runs(APPROVAL, ids),
        actions.decisions.latest_for_runs(RESUME, ids),
    )
    next_cursor = encode_cursor(page.next_key) if page.next_key else None
    counts = {**page.counts.by_reason(), "total": page.counts.total}
    return AttentionPage(
        runs=attention_rows(actions, page.runs, decided, now, urls),
        counts=counts,
        next=next_cursor,
        next_url=urls.path("attention", {"after": next_cursor}) if next_cursor else None,
        stale_after=settings.stale_after,
        remind_after=settings.remind_after,
        oldest_pause_at=page.counts.oldest_pause_at,
        overdue_pauses=overdue_pauses(actions, deadlines, now, urls)
        if deadlines is not None and after is None
        else (),
        can_resume=can_resume and not settings.read_only,
        legend=tuple(REASON_WORDS.items()),
    )


async def attention_list(request: Request) -> Response:
    ctx = context(request)
    after_text = request.query_params.get("after")
    after = decode_cursor(after_text) if after_text else None
    person = person_of(request)
    # The nav's other badge, counted while the page is read (a full page only).
    pending = None if wants_json(request) else beside(ctx, ctx.store.count_pending)
    page = await off_loop(
        lambda: build_attention_page(
            ctx.actions,
            after,
            urls_of(request),
            can_resume=person.may(OPERATOR),
            deadlines=ctx.deadlines,
        )
    )
    nav = (
        Nav(pending=await pending, attention=page.counts["total"]) if pending is not None else None
    )
    return await respond(request, "pages/attention.html", page, nav=nav)
