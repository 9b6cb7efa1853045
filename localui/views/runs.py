"""``/`` and ``/runs``: every execution in the store, newest activity first."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response

from localui import runs
from localui.backends.base import STATES, DecisionLog, Store
from localui.backends.traces import RunSummary, SpanIndex
from localui.errors import BadRequest
from localui.offloop import off_loop
from localui.records import (
    APPROVAL,
    Decision,
    IndexProgress,
    RunFacts,
    RunQuery,
    SeedFailure,
    SeedProgress,
    StoreTotals,
)
from localui.shortids import shortest_unique
from localui.views.params import decode_cursor, encode_cursor
from localui.views.respond import html_only, nav_ahead, respond
from localui.views.state import context
from localui.views.trace import duration_words
from localui.views.urls import Urls, urls_of
from localui.words import age_words, decision_line, state_label

OUTBOX_FILTERS = ("waiting", "quarantined")


@dataclass(frozen=True, slots=True)
class RunRow:
    execution_id: str
    state: str
    agent: str
    rows: int
    first_at: str
    last_at: str
    pending_reason: str | None
    #: For ``unfinished`` runs: ``tool`` or ``turn``, where it stopped.
    stopped_at: str | None
    last_node_id: str
    #: The checkpoint id this run was forked from, when it is a fork.
    fork_of: str | None
    rows_waiting: int
    rows_quarantined: int
    url: str
    #: The run's input, first line, shortened (from its trace; null without one).
    input: str | None = None
    #: How it ended, in words: the answer's first line, the error, the pause reason.
    outcome: str | None = None
    #: From the first row to the last, in milliseconds.
    duration_ms: int | None = None
    #: Who decided the pause the run answered, and why ("rejected by Ada: over budget").
    decided: str | None = None
    last_ago: str = html_only("")
    short_id: str = html_only("")
    first_local: str = html_only("")
    last_local: str = html_only("")
    duration: str = html_only("")
    #: A paused run's approval card.
    card_url: str | None = html_only(None)
    #: What the outcome says after ``decided`` (" — the answer"), shown beside it.
    outcome_after_decided: str = html_only("")


@dataclass(frozen=True, slots=True)
class RunFilters:
    state: str | None
    agent: str | None
    q: str | None
    outbox: str | None

    def params(self, **changes: str | None) -> dict[str, str]:
        """The query parameters that show these filters (``changes`` applied)."""
        values = {
            "state": self.state,
            "agent": self.agent,
            "q": self.q,
            "outbox": self.outbox,
            **changes,
        }
        return {k: v for k, v in values.items() if v}


@dataclass(frozen=True, slots=True)
class StateTab:
    state: str | None
    label: str
    #: None while the store is being indexed.
    count: int | None
    url: str
    active: bool


@dataclass(frozen=True, slots=True)
class RunsPage:
    runs: tuple[RunRow, ...]
    #: The cursor for the next page (``?after=``), or null on the last page.
    next: str | None
    next_url: str | None
    #: Runs per state under the current agent, text and outbox filters (empty, and
    #: ``totals`` null, while ``indexing``).
    counts: Mapping[str, int]
    totals: StoreTotals | None
    filters: RunFilters
    #: Set on a store's first look while its runs are being indexed: ``runs`` are
    #: then the runs written to most recently, and the page should be asked again.
    indexing: IndexProgress | None = None
    tabs: tuple[StateTab, ...] = html_only(())
    #: The stream that keeps this table live, under the same filters and page.
    live_url: str = html_only("")
    #: While ``localui demo`` writes its runs (or when some failed): how far it got.
    seeding: SeedingNote | None = None


@dataclass(frozen=True, slots=True)
class SeedingNote:
    """``seeding the demo: 12 of 19``, and each scenario that failed with its reason."""

    landed: int
    total: int
    finished: bool
    failures: tuple[SeedFailure, ...]
    words: str = html_only("")


def seeding_note(progress: SeedProgress | None) -> SeedingNote | None:
    """The line the runs list shows while seeding, or when a scenario failed."""
    if progress is None or (progress.finished and not progress.failures):
        return None
    if progress.finished:
        words = f"seeded the demo: {progress.landed} of {progress.total}"
    else:
        words = f"seeding the demo: {progress.landed} of {progress.total}"
    if progress.failures:
        words += f"; {len(progress.failures)} failed"
    return SeedingNote(
        landed=progress.landed,
        total=progress.total,
        finished=progress.finished,
        failures=progress.failures,
        words=words,
    )


#: The runs list shows this much of an input or an outcome; the run page has the rest.
LINE_CHARS = 72


def first_line(text: str | None) -> str | None:
    """The first non-empty line of ``text``, shortened to ``LINE_CHARS`` with an ellipsis."""
    if not text:
        return None
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    if not line:
        return None
    return line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 1].rstrip() + "…"


def local_time(value: str) -> str:
    """``Nov 30 19:44:01`` in this machine's time zone (localui runs where its user is)."""
    at = runs.parse_time(value)
    if at is None:
        return value
    return at.astimezone().strftime("%b %d %H:%M:%S")


def outcome_of(
    state: str, facts: RunFacts, summary: RunSummary | None, decided: str | None
) -> str | None:
    """The runs list's outcome: the pause reason, the error, or who decided the pause
    (from the decision record) followed by the answer's first line."""
    if state == runs.PAUSED and facts.pending_reason:
        return f"waiting for approval: {facts.pending_reason}"
    if summary is not None and state in runs.FAILURES and summary.error:
        return first_line(f"error: {summary.error}")
    answer = first_line(summary.answer) if summary is not None else None
    if state != runs.COMPLETED:
        answer = None
    if decided and answer:
        return f"{decided} — {answer}"
    return decided or answer


def run_state(facts: RunFacts) -> str:
    return runs.state_of(facts)


def run_row(
    facts: RunFacts,
    now: datetime,
    urls: Urls,
    summary: RunSummary | None = None,
    decision: Decision | None = None,
    short_id: str | None = None,
) -> RunRow:
    """One row of the list; ``short_id`` is the id as the page shows it (see
    ``localui.shortids``), by default as a page of this one run would."""
    state = run_state(facts)
    decided = decision_line(state, decision)
    stopped_at = None
    if state == runs.UNFINISHED:
        stopped_at = runs.stopped_at(facts.last_node_id, facts.last_step_type)
    outcome = outcome_of(state, facts, summary, decided)
    after_decided = outcome.removeprefix(decided) if decided and outcome else ""
    first, last = runs.parse_time(facts.first_at), runs.parse_time(facts.last_at)
    duration_ms = max(0, round((last - first).total_seconds() * 1000)) if first and last else None
    return RunRow(
        execution_id=facts.execution_id,
        state=state,
        agent=facts.agent,
        rows=facts.row_count,
        first_at=facts.first_at,
        last_at=facts.last_at,
        pending_reason=facts.pending_reason,
        stopped_at=stopped_at,
        last_node_id=facts.last_node_id,
        fork_of=facts.fork_parent_checkpoint_id,
        rows_waiting=facts.rows_waiting,
        rows_quarantined=facts.rows_quarantined,
        url=urls.run(facts.execution_id),
        input=first_line(summary.input) if summary is not None else None,
        outcome=outcome,
        duration_ms=duration_ms,
        decided=decided,
        last_ago=age_words(facts.last_at, now),
        short_id=short_id or shortest_unique([facts.execution_id])[facts.execution_id],
        first_local=local_time(facts.first_at),
        last_local=local_time(facts.last_at),
        duration=duration_words(duration_ms) if duration_ms is not None else "",
        card_url=urls.approval(facts.execution_id) if state == runs.PAUSED else None,
        outcome_after_decided=after_decided,
    )


def parse_filters(request: Request) -> tuple[RunFilters, tuple[str, str] | None]:
    params = request.query_params
    state = params.get("state") or None
    if state is not None and state not in STATES:
        raise BadRequest(f"state={state!r} is not one of {', '.join(STATES)}")
    outbox = params.get("outbox") or None
    if outbox is not None and outbox not in OUTBOX_FILTERS:
        raise BadRequest(f"outbox={outbox!r} is not one of {', '.join(OUTBOX_FILTERS)}")
    q = (params.get("q") or "").strip() or None
    if q is not None and len(q) > 200:
        raise BadRequest("q is longer than 200 characters")
    after_text = params.get("after")
    after = decode_cursor(after_text) if after_text else None
    filters = RunFilters(state=state, agent=params.get("agent") or None, q=q, outbox=outbox)
    return filters, after


def build_runs_page(
    store: Store,
    decisions: DecisionLog,
    filters: RunFilters,
    after: tuple[str, str] | None,
    limit: int,
    urls: Urls,
    traces: SpanIndex | None = None,
    seeding: SeedProgress | None = None,
) -> RunsPage:
    query = RunQuery(
        state=filters.state,
        agent=filters.agent,
        text=filters.q,
        after=after,
        limit=limit,
        outbox=filters.outbox,
    )
    page = store.list_runs(query)
    # The decisions of the page's runs in one read; a paused run names none.
    decided = decisions.latest_for_runs(
        APPROVAL, [f.execution_id for f in page.runs if run_state(f) != runs.PAUSED]
    )
    # Totals come from the index too: while it is built they would wait for it.
    totals = store.totals() if page.indexing is None else None
    now = datetime.now(UTC)
    next_cursor = encode_cursor(page.next_key) if page.next_key else None
    next_url = None
    if next_cursor:
        next_url = urls.runs(filters.params(after=next_cursor))
    counts = {state: page.counts.get(state, 0) for state in STATES}
    summaries = (
        (traces.summaries([f.execution_id for f in page.runs]) or {})
        if traces is not None and page.runs
        else {}
    )
    known = page.indexing is None
    tabs = [
        StateTab(
            state=None,
            label="All",
            count=sum(counts.values()) if known else None,
            url=urls.runs(filters.params(state=None)),
            active=filters.state is None,
        )
    ]
    tabs.extend(
        StateTab(
            state=state,
            label=state_label(state),
            count=counts[state] if known else None,
            url=urls.runs(filters.params(state=state)),
            active=filters.state == state,
        )
        for state in STATES
    )
    shown = shortest_unique(f.execution_id for f in page.runs)
    return RunsPage(
        runs=tuple(
            run_row(
                f,
                now,
                urls,
                summaries.get(f.execution_id),
                decided.get(f.execution_id),
                shown[f.execution_id],
            )
            for f in page.runs
        ),
        next=next_cursor,
        next_url=next_url,
        counts=counts if known else {},
        totals=totals,
        filters=filters,
        indexing=page.indexing,
        tabs=tuple(tabs),
        live_url=urls.path(
            "live_runs", filters.params(after=encode_cursor(after) if after else None)
        ),
        seeding=seeding_note(seeding),
    )


async def runs_list(request: Request) -> Response:
    ctx = context(request)
    filters, after = parse_filters(request)
    nav_ahead(request, partial=True)
    page = await off_loop(
        build_runs_page,
        ctx.store,
        ctx.actions.decisions,
        filters,
        after,
        ctx.settings.page_size,
        urls_of(request),
        ctx.traces,
        ctx.seeding.progress() if ctx.seeding is not None else None,
    )
    return await respond(request, "pages/runs.html", page, partial="partials/_runs_table.html")
