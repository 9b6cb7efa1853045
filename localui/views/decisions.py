"""``/decisions``: the decision record as data, newest first, for people and auditors.

Every approval, rejection and resume localui recorded (``localui_decisions``), and
every vote a two-person rule counted (``localui_votes``, kind ``vote``), each with its
run's agent and a link to the run, in one order newest first; with ``kind=outside``,
the pauses the SDK recorded as decided elsewhere (:mod:`localui.views.outside`);
filtered by person, agent, outcome, kind and time; a page at a time (``.json`` too),
or all of it as CSV streamed a page at a time (``/decisions.csv``, and ``localui
decisions export`` on the command line, which writes the same columns as CSV or JSON
lines).
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.concurrency import iterate_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from localui import csvsafe
from localui.backends.base import DecisionLog
from localui.backends.decisions import EXPORT_FIELDS
from localui.offloop import off_loop
from localui.records import DecisionEntry, DecisionPage, DecisionQuery
from localui.shortids import shortest_unique
from localui.views.outside import OUTSIDE, outside_page
from localui.views.params import (
    decode_cursor,
    encode_cursor,
    filter_values,
    iso_or_none,
    parse_when,
)
from localui.views.respond import html_only, nav_ahead, respond
from localui.views.state import context
from localui.views.urls import Urls, tilde_encode, urls_of

#: Entries a CSV or JSON-lines export reads at a time: memory stays flat however long
#: the record is (a CSV of 100,000 entries peaks about 10 MB above the server's
#: resting size; 5,000 at a time, twice that), and each read (a query per table, a hop
#: to a worker thread and back) still carries a couple of thousand lines.
EXPORT_CHUNK = 2000

#: The columns of an export, in order; each entry's ``url`` is its run's page. An
#: entry is named by ``kind`` and ``id`` together: a vote's id counts votes, the other
#: kinds' count decisions.
EXPORT_COLUMNS = (*EXPORT_FIELDS, "url")
_APPROVED = EXPORT_COLUMNS.index("approved")
_EXECUTION_ID = EXPORT_COLUMNS.index("execution_id")

#: Filters a person may give, each a query parameter of the same name.
FILTERS = ("approver", "agent", "outcome", "kind", "since", "until")


@dataclass(frozen=True, slots=True)
class DecisionRow:
    #: Unique with ``kind``: a vote's id counts votes, the other kinds' count decisions.
    id: int
    #: ``approval``, ``resume``, ``reopen``, ``edit`` (on the branch an edit made), or ``vote``.
    kind: str
    execution_id: str
    checkpoint_id: str
    agent: str
    #: True or false for an approval (a vote is true), null for a resume.
    approved: bool | None
    #: Who decided (the signed-in name, or the name typed with sign-in off).
    approver: str
    reason: str
    decided_at: str
    #: How the SDK's resume ended (``completed``, ``paused``, ``failed``,
    #: ``already_resumed``), ``pending`` while it is still going, ``voted`` for a vote.
    outcome: str
    detail: str | None
    finished_at: str | None
    url: str
    verb: str = html_only("")
    #: The run's id as this page shows it (``localui.shortids``); the title has it whole.
    short_id: str = html_only("")


@dataclass(frozen=True, slots=True)
class DecisionFilters:
    approver: str | None = None
    agent: str | None = None
    outcome: str | None = None
    kind: str | None = None
    #: As given: an age (``7d``) or an ISO instant.
    since: str | None = None
    until: str | None = None

    def params(self, **changes: str | None) -> dict[str, str]:
        values = {name: getattr(self, name) for name in FILTERS} | changes
        return {k: v for k, v in values.items() if v}


@dataclass(frozen=True, slots=True)
class DecisionsPage:
    decisions: tuple[DecisionRow, ...]
    next: str | None
    next_url: str | None
    filters: DecisionFilters
    csv_url: str = html_only("")


def parse_filters(request: Request) -> tuple[DecisionFilters, DecisionQuery]:
    """The filters as given, and the query they make (without a page position)."""
    filters = DecisionFilters(**filter_values(request.query_params, FILTERS))
    now = datetime.now(UTC)
    query = DecisionQuery(
        actor=filters.approver,
        agent=filters.agent,
        outcome=filters.outcome,
        kind=filters.kind,
        since=iso_or_none(parse_when("since", filters.since, now)),
        until=iso_or_none(parse_when("until", filters.until, now)),
    )
    return filters, query


def decision_row(entry: DecisionEntry, urls: Urls, short_id: str = "") -> DecisionRow:
    d = entry.decision
    return DecisionRow(
        id=d.id,
        kind=d.kind,
        execution_id=d.execution_id,
        checkpoint_id=d.checkpoint_id,
        agent=entry.agent,
        approved=d.approved,
        approver=d.actor,
        reason=d.reason,
        decided_at=d.decided_at,
        outcome=d.outcome or "pending",
        detail=d.detail,
        finished_at=d.finished_at,
        url=urls.run(d.execution_id),
        verb=d.verb,
        short_id=short_id or d.execution_id,
    )


def build_decisions_page(
    log: DecisionLog,
    filters: DecisionFilters,
    query: DecisionQuery,
    after: tuple[str, str] | None,
    limit: int,
    urls: Urls,
    outside: Callable[[DecisionQuery], DecisionPage] | None = None,
) -> DecisionsPage:
    """A page of the record; with ``kind=outside``, of the pauses decided outside
    localui (``outside`` reads them: :func:`localui.views.outside.outside_page`)."""
    paged = dataclasses.replace(query, after=after, limit=limit)
    if query.kind == OUTSIDE:
        page = outside(paged) if outside is not None else DecisionPage(entries=(), next_key=None)
    else:
        page = log.list_decisions(paged)
    next_cursor = encode_cursor(page.next_key) if page.next_key else None
    shown = shortest_unique(e.decision.execution_id for e in page.entries)
    return DecisionsPage(
        decisions=tuple(
            decision_row(e, urls, shown[e.decision.execution_id]) for e in page.entries
        ),
        next=next_cursor,
        next_url=urls.path("decisions", filters.params(after=next_cursor)) if next_cursor else None,
        filters=filters,
        csv_url=urls.path("decisions_csv", filters.params()),
    )


def run_links(urls: Urls) -> Callable[[str], str]:
    """Each run's page from its id, as ``urls.run`` builds it, without the router's
    work per call: an export links a hundred thousand runs, each once."""
    sample = "x"
    head, tail = urls.run(sample).rsplit(tilde_encode(sample), 1)
    return lambda execution_id: f"{head}{tilde_encode(execution_id)}{tail}"


def _export_row(entry: DecisionEntry) -> tuple[Any, ...]:
    d = entry.decision
    fields = {"agent": entry.agent, "approver": d.actor}
    return tuple(fields[name] if name in fields else getattr(d, name) for name in EXPORT_FIELDS)


def export_chunks(
    log: DecisionLog,
    query: DecisionQuery,
    urls: Urls,
    outside: Callable[[DecisionQuery], DecisionPage] | None = None,
) -> Iterator[list[tuple[Any, ...]]]:
    """Every entry the query matches, newest first, as the export's columns (the
    log's fields and the run's link), read :data:`EXPORT_CHUNK` at a time; with
    ``kind=outside``, the pauses decided outside localui, read by ``outside``."""
    after: tuple[str, str] | None = None
    link = run_links(urls)
    while True:
        paged = dataclasses.replace(query, after=after, limit=EXPORT_CHUNK)
        if query.kind == OUTSIDE:
            found = outside(paged) if outside is not None else DecisionPage((), None)
            rows: tuple[tuple[Any, ...], ...] = tuple(_export_row(e) for e in found.entries)
            next_key = found.next_key
        else:
            page = log.list_export(paged)
            rows, next_key = page.rows, page.next_key
        yield [(*row, link(row[_EXECUTION_ID])) for row in rows]
        if next_key is None:
            return
        after = next_key


def csv_chunks(chunks: Iterator[list[tuple[Any, ...]]]) -> Iterator[str]:
    """The rows as CSV with a header line, a chunk of lines per chunk read. ``approved``
    is ``true``/``false`` (empty for a resume) and a missing value an empty field (the
    csv module writes None so); text that a spreadsheet would run starts with ``'``."""
    buffer = io.StringIO()
    writer = csvsafe.Writer(buffer)
    writer.writerow(EXPORT_COLUMNS)
    # False and True are 0 and 1 as keys: SQLite's flags and PostgreSQL's read alike.
    flags = {None: "", 0: "false", 1: "true"}
    at = _APPROVED
    for rows in chunks:
        writer.writerows((*row[:at], flags[row[at]], *row[at + 1 :]) for row in rows)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue()


def jsonl_chunks(chunks: Iterator[list[tuple[Any, ...]]]) -> Iterator[str]:
    """The rows as JSON lines, ``approved`` true, false or null."""
    at = _APPROVED
    for rows in chunks:
        lines = []
        for row in rows:
            entry = dict(zip(EXPORT_COLUMNS, row, strict=True))
            flag = row[at]
            entry["approved"] = None if flag is None else bool(flag)
            lines.append(json.dumps(entry, ensure_ascii=False) + "\n")
        yield "".join(lines)


async def decisions_list(request: Request) -> Response:
    ctx = context(request)
    filters, query = parse_filters(request)
    after_text = request.query_params.get("after")
    after = decode_cursor(after_text) if after_text else None
    nav_ahead(request)
    page = await off_loop(
        build_decisions_page,
        ctx.actions.decisions,
        filters,
        query,
        after,
        ctx.settings.page_size,
        urls_of(request),
        lambda paged: outside_page(ctx.traces, ctx.actions.decisions, ctx.store, paged),
    )
    return await respond(request, "pages/decisions.html", page)


async def decisions_csv(request: Request) -> Response:
    """The whole record under the filters, as CSV, streamed: read and written a chunk
    at a time in a worker thread."""
    ctx = context(request)
    _, query = parse_filters(request)
    chunks = export_chunks(
        ctx.actions.decisions,
        query,
        urls_of(request),
        lambda paged: outside_page(ctx.traces, ctx.actions.decisions, ctx.store, paged),
    )
    return StreamingResponse(
        iterate_in_threadpool(csv_chunks(chunks)),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="localui-decisions.csv"'},
    )
