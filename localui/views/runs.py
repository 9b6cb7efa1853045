"""``/`` and ``/runs``: every execution in the store, newest activity first."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response

from localui import runs
from localui.backends.base import STATES, DecisionLog, Store
from localui.errors import BadRequest
from localui.records import APPROVAL, Decision, IndexProgress, RunFacts, RunQuery, StoreTotals
from localui.views.common import (
    context,
    decode_cursor,
    encode_cursor,
    html_only,
    off_loop,
    respond,
)
from localui.views.urls import Urls, urls_of

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
    #: Who decided the pause the run answered, and why ("rejected by Ada: over budget").
    decided: str | None = None
    last_ago: str = html_only("")


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


def run_state(facts: RunFacts) -> str:
    return runs.run_state(facts.last_step_type, facts.last_status, facts.has_pending)


def run_row(facts: RunFacts, now: datetime, urls: Urls, decision: Decision | None = None) -> RunRow:
    state = run_state(facts)
    stopped_at = None
    if state == runs.UNFINISHED:
        stopped_at = runs.stopped_at(facts.last_node_id, facts.last_step_type)
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
        decided=runs.decision_line(state, decision),
        last_ago=runs.age_words(facts.last_at, now),
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
            label=state.capitalize(),
            count=counts[state] if known else None,
            url=urls.runs(filters.params(state=state)),
            active=filters.state == state,
        )
        for state in STATES
    )
    return RunsPage(
        runs=tuple(run_row(f, now, urls, decided.get(f.execution_id)) for f in page.runs),
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
    )


async def runs_list(request: Request) -> Response:
    ctx = context(request)
    filters, after = parse_filters(request)
    page = await off_loop(
        build_runs_page,
        ctx.store,
        ctx.actions.decisions,
        filters,
        after,
        ctx.settings.page_size,
        urls_of(request),
    )
    return await respond(request, "pages/runs.html", page, partial="partials/_runs_table.html")
