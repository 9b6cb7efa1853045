"""``/audit``: every change made through localui, newest first, for operators.

The hash-chained rows of ``localui_audit`` (:mod:`localui.audit`): who did what, how
they signed in, from which address, on which run, and how it ended; filtered by
person, action, run and time; a page at a time (``.json`` too), or all of it as CSV
(``/audit.csv``), its text made safe for spreadsheets. ``localui audit verify``
checks the chain; ``localui audit export`` writes it in chain order.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.concurrency import iterate_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from localui import csvsafe
from localui.audit import AuditEntry, AuditQuery, detail_text, instant
from localui.auth import OPERATOR, require
from localui.backends.audit import COLUMN_NAMES
from localui.backends.base import AuditLog
from localui.errors import Unavailable
from localui.offloop import off_loop
from localui.shortids import shortest_unique
from localui.views.params import filter_values, parse_count, parse_when
from localui.views.respond import html_only, nav_ahead, respond
from localui.views.state import AppState, context
from localui.views.urls import Urls, urls_of

#: Filters a person may give, each a query parameter of the same name.
FILTERS = ("person", "action", "run", "since", "until")
#: Rows a CSV export reads at a time: memory stays flat however long the log is.
EXPORT_CHUNK = 2000
#: The largest ``after`` taken: an id of a row, which a BIGINT holds.
MAX_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class AuditRow:
    id: int
    #: When, as UTC ISO text to the microsecond.
    at: str
    actor: str
    #: How they signed in: ``owner``, ``user``, ``proxy``, ``open``, ``none``, ``cli``.
    via: str
    address: str
    action: str
    method: str
    path: str
    execution_id: str | None
    #: Small JSON text: how a sign-in came (``by``), what a bad token was sent with.
    detail: str
    status: int
    #: ``ok``, ``refused`` or ``error``.
    outcome: str
    prev_hash: str
    hash: str
    #: The run's page; None for a row on no run.
    url: str | None
    short_id: str = html_only("")
    short_hash: str = html_only("")
    #: The detail, or nothing when there is none.
    shown_detail: str = html_only("")


@dataclass(frozen=True, slots=True)
class AuditFilters:
    person: str | None = None
    action: str | None = None
    run: str | None = None
    #: As given: an age (``7d``) or an ISO instant.
    since: str | None = None
    until: str | None = None

    def params(self, **changes: str | None) -> dict[str, str]:
        values = {name: getattr(self, name) for name in FILTERS} | changes
        return {k: v for k, v in values.items() if v}


@dataclass(frozen=True, slots=True)
class AuditLogPage:
    entries: tuple[AuditRow, ...]
    #: The ``after`` of the next page; None on the last.
    next: int | None
    next_url: str | None
    filters: AuditFilters
    csv_url: str = html_only("")


def parse_filters(request: Request) -> tuple[AuditFilters, AuditQuery]:
    """The filters as given, and the query they make (without a page position)."""
    filters = AuditFilters(**filter_values(request.query_params, FILTERS))
    now = datetime.now(UTC)
    since, until = parse_when("since", filters.since, now), parse_when("until", filters.until, now)
    query = AuditQuery(
        actor=filters.person,
        action=filters.action,
        execution_id=filters.run,
        # Written as the log writes its times, so SQLite's text compares as instants do.
        since=instant(since) if since is not None else None,
        until=instant(until) if until is not None else None,
    )
    return filters, query


def audit_row(entry: AuditEntry, urls: Urls, short_id: str = "") -> AuditRow:
    run = entry.execution_id
    return AuditRow(
        id=entry.id,
        at=entry.at,
        actor=entry.actor,
        via=entry.via,
        address=entry.address,
        action=entry.action,
        method=entry.method,
        path=entry.path,
        execution_id=run,
        detail=entry.detail,
        status=entry.status,
        outcome=entry.outcome,
        prev_hash=entry.prev_hash,
        hash=entry.hash,
        url=urls.run(run) if run else None,
        short_id=short_id or (run or ""),
        short_hash=entry.hash[:12],
        shown_detail="" if entry.detail == detail_text({}) else entry.detail,
    )


def build_audit_page(
    log: AuditLog,
    filters: AuditFilters,
    query: AuditQuery,
    after: int | None,
    limit: int,
    urls: Urls,
) -> AuditLogPage:
    page = log.list_entries(dataclasses.replace(query, after=after, limit=limit))
    shown = shortest_unique(e.execution_id for e in page.entries if e.execution_id)
    after_text = str(page.next_key) if page.next_key is not None else None
    return AuditLogPage(
        entries=tuple(
            audit_row(e, urls, shown.get(e.execution_id, "") if e.execution_id else "")
            for e in page.entries
        ),
        next=page.next_key,
        next_url=urls.path("audit", filters.params(after=after_text)) if after_text else None,
        filters=filters,
        csv_url=urls.path("audit_csv", filters.params()),
    )


def log_of(ctx: AppState) -> AuditLog:
    if ctx.audit is None:
        raise Unavailable("the audit log is not open")
    return ctx.audit


def filtered(log: AuditLog, query: AuditQuery) -> Iterator[AuditEntry]:
    """Every row the query matches, newest first, read :data:`EXPORT_CHUNK` at a time."""
    after: int | None = None
    while True:
        page = log.list_entries(dataclasses.replace(query, after=after, limit=EXPORT_CHUNK))
        yield from page.entries
        if page.next_key is None:
            return
        after = page.next_key


def export_lines(entries: Iterable[AuditEntry], format: str) -> Iterator[str]:
    """The rows as CSV with a header line (text a spreadsheet would run starts with
    ``'``), or as JSON lines; a chunk of :data:`EXPORT_CHUNK` lines at a time."""
    buffer = io.StringIO()
    writer = csvsafe.Writer(buffer)
    if format == "csv":
        writer.writerow(COLUMN_NAMES)
    for n, entry in enumerate(entries, 1):
        if format == "csv":
            writer.writerow(dataclasses.astuple(entry))
        else:
            buffer.write(json.dumps(dataclasses.asdict(entry), ensure_ascii=False) + "\n")
        if n % EXPORT_CHUNK == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


async def audit_list(request: Request) -> Response:
    require(request, OPERATOR)
    ctx = context(request)
    filters, query = parse_filters(request)
    after_text = request.query_params.get("after")
    after = parse_count("after", after_text, maximum=MAX_ID) if after_text else None
    nav_ahead(request)
    page = await off_loop(
        build_audit_page,
        log_of(ctx),
        filters,
        query,
        after,
        ctx.settings.page_size,
        urls_of(request),
    )
    return await respond(request, "pages/audit.html", page)


async def audit_csv(request: Request) -> Response:
    """The whole log under the filters, as CSV, streamed a chunk at a time."""
    require(request, OPERATOR)
    log = log_of(context(request))
    _, query = parse_filters(request)
    return StreamingResponse(
        iterate_in_threadpool(export_lines(filtered(log, query), "csv")),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="localui-audit.csv"'},
    )
