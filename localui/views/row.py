"""``/runs/{execution_id}/rows/{checkpoint_id}``: one row opened in full, on its own page
or loaded into the timeline when a person opens the row there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from localui.backends.base import Store
from localui.errors import NotFound
from localui.offloop import off_loop
from localui.records import Unreadable
from localui.views.respond import html_only, nav_ahead, pretty_json, respond
from localui.views.state import context
from localui.views.transcript import MessageView, transcript
from localui.views.urls import Urls, dom_id, urls_of


@dataclass(frozen=True, slots=True)
class RowPage:
    execution_id: str
    checkpoint_id: str
    node_id: str
    step_type: str | None
    status: str
    created_at: str
    agent_path: str | None
    #: Columns whose JSON could not be parsed; their raw text is still shown.
    unreadable: tuple[str, ...]
    transcript: tuple[MessageView, ...] | None
    node_input: Any
    node_output: Any
    interrupt_reason: str | None
    interrupt_context: Any
    state_snapshot: Any
    raw: dict[str, str | None] = html_only()
    node_input_json: str = html_only("")
    node_output_json: str = html_only("")
    interrupt_context_json: str = html_only("")
    snapshot_extra_json: str = html_only("")
    #: The row in its run's timeline.
    run_url: str = html_only("")


def jsonable(value: Any) -> Any:
    """A stored value for the JSON twin: an unreadable one says so instead."""
    if isinstance(value, Unreadable):
        return {"unreadable": value.error}
    return value


def build_row_page(store: Store, execution_id: str, checkpoint_id: str, urls: Urls) -> RowPage:
    detail = store.get_row(checkpoint_id)
    if detail is None or detail.header.execution_id != execution_id:
        raise NotFound(f"run {execution_id!r} has no row {checkpoint_id!r}")
    h = detail.header
    snapshot = detail.state_snapshot
    extra: Any = snapshot
    if isinstance(snapshot, dict):
        extra = {k: v for k, v in snapshot.items() if k != "messages"}
    return RowPage(
        execution_id=execution_id,
        checkpoint_id=h.checkpoint_id,
        node_id=h.node_id,
        step_type=h.step_type,
        status=h.status,
        created_at=h.created_at,
        agent_path=h.agent_path,
        unreadable=detail.unreadable,
        transcript=transcript(snapshot),
        node_input=jsonable(detail.node_input),
        node_output=jsonable(detail.node_output),
        interrupt_reason=h.interrupt_reason,
        interrupt_context=jsonable(detail.interrupt_context),
        state_snapshot=jsonable(snapshot),
        raw=dict(detail.raw),
        node_input_json=pretty_json(detail.node_input),
        node_output_json=pretty_json(detail.node_output),
        interrupt_context_json=pretty_json(detail.interrupt_context),
        snapshot_extra_json=pretty_json(extra),
        run_url=urls.run(execution_id, fragment=f"row-{dom_id(h.checkpoint_id)}"),
    )


async def row_detail(request: Request) -> Response:
    ctx = context(request)
    nav_ahead(request, partial=True)
    page = await off_loop(
        build_row_page,
        ctx.store,
        request.path_params["execution_id"],
        request.path_params["checkpoint_id"],
        urls_of(request),
    )
    return await respond(request, "pages/row.html", page, partial="partials/_row_detail.html")
