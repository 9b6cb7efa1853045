"""``/runs/{execution_id}/diff?a=&b=`` and ``/diff?a=&b=``: two rows compared.

The run-scoped URL is what the timeline's A/B pickers and "diff with previous"
links open; ``/diff`` compares rows of any runs (a fork against its source,
two attempts at a task), since checkpoint ids are unique across a store.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from localui.backends.base import Store
from localui.diff import SectionDiff, diff_rows
from localui.errors import BadRequest, NotFound
from localui.offloop import off_loop
from localui.records import RowDetail, RowHeader
from localui.views.respond import html_only, nav_ahead, respond
from localui.views.state import context
from localui.views.transcript import with_turns
from localui.views.urls import Urls, dom_id, urls_of


@dataclass(frozen=True, slots=True)
class SideView:
    """One of the two rows, A (the before) or B (the after)."""

    checkpoint_id: str
    execution_id: str
    node_id: str
    step_type: str | None
    status: str
    created_at: str
    agent_path: str | None
    interrupt_reason: str | None
    #: The row opened on its own page, and the row in its run's timeline.
    url: str
    run_url: str


@dataclass(frozen=True, slots=True)
class FieldLine:
    """A row attribute side by side, flagged when A and B differ."""

    label: str
    a: str
    b: str
    differs: bool


@dataclass(frozen=True, slots=True)
class DiffPage:
    #: The run both rows belong to (``/runs/{id}/diff``), or null for ``/diff``.
    execution_id: str | None
    a: SideView
    b: SideView
    #: True when every payload column is the same on both rows.
    same: bool
    sections: tuple[SectionDiff, ...]
    summary: str = html_only("")
    fields: tuple[FieldLine, ...] = html_only(())
    #: This diff's shareable URL, the same with A and B swapped, and the run's page.
    url: str = html_only("")
    swap_url: str = html_only("")
    run_url: str | None = html_only(None)


def side_view(header: RowHeader, urls: Urls) -> SideView:
    return SideView(
        checkpoint_id=header.checkpoint_id,
        execution_id=header.execution_id,
        node_id=header.node_id,
        step_type=header.step_type,
        status=header.status,
        created_at=header.created_at,
        agent_path=header.agent_path,
        interrupt_reason=header.interrupt_reason,
        url=urls.row(header.execution_id, header.checkpoint_id),
        run_url=urls.run(header.execution_id, fragment=f"row-{dom_id(header.checkpoint_id)}"),
    )


def diff_url(urls: Urls, a: str, b: str, execution_id: str | None = None) -> str:
    if execution_id is None:
        return urls.path("diff", {"a": a, "b": b})
    return urls.path("run_diff", {"a": a, "b": b}, execution_id=execution_id)


def _fields(a: SideView, b: SideView) -> tuple[FieldLine, ...]:
    pairs = (
        ("Node", a.node_id, b.node_id),
        ("Step", a.step_type or "step", b.step_type or "step"),
        ("Status", a.status, b.status),
        ("Interrupt", a.interrupt_reason or "", b.interrupt_reason or ""),
        ("Agent path", a.agent_path or "", b.agent_path or ""),
        ("Run", a.execution_id, b.execution_id),
        ("Written", a.created_at, b.created_at),
    )
    return tuple(
        FieldLine(label=label, a=x, b=y, differs=x != y) for label, x, y in pairs if x or y
    )


def _load(store: Store, param: str, checkpoint_id: str, execution_id: str | None) -> RowDetail:
    detail = store.get_row(checkpoint_id)
    if detail is None:
        raise NotFound(f"{param}: no row with checkpoint id {checkpoint_id!r} in this store")
    if execution_id is not None and detail.header.execution_id != execution_id:
        raise NotFound(
            f"{param}: run {execution_id!r} has no row {checkpoint_id!r}"
            " (/diff?a=…&b=… compares rows of different runs)"
        )
    return detail


def build_diff_page(
    store: Store, urls: Urls, a_id: str, b_id: str, execution_id: str | None = None
) -> DiffPage:
    a_row = _load(store, "a", a_id, execution_id)
    b_row = _load(store, "b", b_id, execution_id)
    result = diff_rows(a_row, b_row)
    a, b = side_view(a_row.header, urls), side_view(b_row.header, urls)
    summary = result.summary
    if a.checkpoint_id == b.checkpoint_id:
        summary = "A and B are the same row. " + summary
    return DiffPage(
        execution_id=execution_id,
        a=a,
        b=b,
        same=result.same,
        sections=tuple(with_turns(s) for s in result.sections),
        summary=summary,
        fields=_fields(a, b),
        url=diff_url(urls, a_id, b_id, execution_id),
        swap_url=diff_url(urls, b_id, a_id, execution_id),
        run_url=urls.run(execution_id) if execution_id is not None else None,
    )


def _pair(request: Request) -> tuple[str, str]:
    """``a`` and ``b`` from the query; a 400 that says which is missing otherwise."""
    a = request.query_params.get("a", "").strip()
    b = request.query_params.get("b", "").strip()
    missing = [name for name, value in (("a", a), ("b", b)) if not value]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise BadRequest(
            f"Pick two rows to compare: {' and '.join(missing)} {verb} missing."
            " Use ?a=CHECKPOINT_ID&b=CHECKPOINT_ID, or the A and B pickers on a run's timeline."
        )
    return a, b


async def run_diff(request: Request) -> Response:
    """Two rows of one run."""
    ctx = context(request)
    a, b = _pair(request)
    execution_id = request.path_params["execution_id"]
    nav_ahead(request, partial=True)
    page = await off_loop(build_diff_page, ctx.store, urls_of(request), a, b, execution_id)
    return await respond(request, "pages/diff.html", page, partial="partials/_diff.html")


async def rows_diff(request: Request) -> Response:
    """Two rows of any runs."""
    ctx = context(request)
    a, b = _pair(request)
    nav_ahead(request, partial=True)
    page = await off_loop(build_diff_page, ctx.store, urls_of(request), a, b)
    return await respond(request, "pages/diff.html", page, partial="partials/_diff.html")
