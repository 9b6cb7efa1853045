"""``GET /runs/{id}/edit?checkpoint_id=``: a row's conversation or state, to edit and go on.

An agent's row opens as its conversation, a field per message (its text, a tool's
result, each tool call's arguments as JSON), with the last messages to drop and one to
add; a chain's row opens as its state, as JSON. The form posts to
``POST /runs/{id}/fork`` (``localui.views.actions``), which runs a branch from the
edit; a GET changes nothing. A Supervisor's or Swarm's row says why it cannot be
edited: the SDK has no fork for them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from localui import edits, runs
from localui.actions import ActionService
from localui.errors import BadRequest, LocalUIError, NotFound
from localui.offloop import off_loop
from localui.views.fork import build_fork_preview
from localui.views.respond import html_only, is_htmx, nav_ahead, respond
from localui.views.state import actions_of
from localui.views.urls import Urls, urls_of


@dataclass(frozen=True, slots=True)
class CallField:
    tool: str
    #: The arguments as the editor shows them (indented JSON).
    arguments: str


@dataclass(frozen=True, slots=True)
class MessageField:
    #: 0-based: the form's field names count from 0 (``content.N``).
    index: int
    role: str
    #: Its text (or a tool's result); None when it is not text (multimodal parts),
    #: which the editor then shows and keeps as it is.
    text: str | None
    calls: tuple[CallField, ...]
    tool_call_id: str | None


@dataclass(frozen=True, slots=True)
class EditPage:
    execution_id: str
    checkpoint_id: str
    node_id: str
    #: ``agent`` or ``chain``.
    runner: str
    #: An agent's row: its conversation, message by message.
    messages: tuple[MessageField, ...]
    #: A chain's row: its state, as JSON.
    state: str | None
    #: Why this row cannot be edited and gone on from here, or None.
    problem: str | None = None
    #: A chain's row its crashed or failed run would re-enter at: the run itself can be
    #: resumed from it with the state edited (``POST /runs/{id}/resume`` with ``state``).
    resumable: bool = False
    #: A chain's row its pause waits at: the pause can be approved or rejected with
    #: the state edited (``POST /approvals/{id}/approve`` with ``state``).
    decidable: bool = False
    run_url: str = html_only("")
    approve_url: str = html_only("")
    reject_url: str = html_only("")
    fork_url: str = html_only("")
    row_url: str = html_only("")
    preview_url: str = html_only("")
    resume_url: str = html_only("")
    edit_preview_url: str = html_only("")


def _message_field(index: int, message: Any) -> MessageField:
    message = message if isinstance(message, dict) else {}
    content = message.get("content")
    calls = tuple(
        CallField(str(c.get("name")), json.dumps(c.get("arguments", {}), indent=2))
        for c in message.get("tool_calls") or ()
        if isinstance(c, dict)
    )
    return MessageField(
        index=index,
        role=str(message.get("role")),
        text=content if isinstance(content, str) else "" if content is None else None,
        calls=calls,
        tool_call_id=message.get("tool_call_id"),
    )


def build_edit_page(
    actions: ActionService, execution_id: str, checkpoint_id: str, urls: Urls
) -> EditPage:
    if not checkpoint_id:
        raise BadRequest("checkpoint_id (the row to edit) is required")
    store = actions.store
    detail = store.get_row(checkpoint_id)
    if detail is None or detail.header.execution_id != execution_id:
        raise NotFound(f"run {execution_id!r} has no row {checkpoint_id!r}")
    owner = runs.run_owner(store.list_rows(execution_id))
    refusal = runs.fork_refusal(detail.header)
    problem = refusal.reason if refusal is not None else actions.preflight.fork_problem(owner)
    snapshot = detail.state_snapshot if isinstance(detail.state_snapshot, dict) else {}
    chain = owner.kind == runs.CHAIN
    resumable = decidable = False
    if chain:
        pending = store.get_pending(execution_id)
        decidable = pending is not None and pending.checkpoint_id == checkpoint_id
        try:
            _, plan, _ = actions.resume_target(execution_id)
        except LocalUIError:
            pass  # not resumable: the editor offers the fork alone
        else:
            resumable = plan.checkpoint_id == checkpoint_id
    messages = (
        ()
        if chain
        else tuple(_message_field(i, m) for i, m in enumerate(snapshot.get("messages") or ()))
    )
    return EditPage(
        execution_id=execution_id,
        checkpoint_id=checkpoint_id,
        node_id=detail.header.node_id,
        runner=runs.CHAIN if chain else runs.AGENT,
        messages=messages,
        state=json.dumps(snapshot, indent=2, sort_keys=True, default=str) if chain else None,
        problem=problem,
        resumable=resumable,
        decidable=decidable,
        run_url=urls.run(execution_id),
        approve_url=urls.path("approve", execution_id=execution_id),
        reject_url=urls.path("reject", execution_id=execution_id),
        resume_url=urls.path("resume_run", execution_id=execution_id),
        edit_preview_url=urls.path("edit_preview", execution_id=execution_id),
        fork_url=urls.path("fork_run", execution_id=execution_id),
        row_url=urls.row(execution_id, checkpoint_id),
        preview_url=urls.path("fork_preview", execution_id=execution_id),
    )


async def edited_messages(
    actions: ActionService, execution_id: str, checkpoint_id: str, fields: dict[str, str]
) -> list[dict[str, Any]]:
    """The edited conversation a form sends: ``messages`` (JSON, from a script), or the
    editor's fields applied to the row's own conversation."""
    if "messages" in fields:
        return edits.parse_messages(fields["messages"])
    detail = await off_loop(actions.store.get_row, checkpoint_id)
    if detail is None or detail.header.execution_id != execution_id:
        raise NotFound(f"run {execution_id!r} has no row {checkpoint_id!r}")
    snapshot = detail.state_snapshot if isinstance(detail.state_snapshot, dict) else {}
    return edits.apply_fields(list(snapshot.get("messages") or ()), fields)


async def edit_preview(request: Request) -> Response:
    """``POST /runs/{id}/edit/preview``: what a branch from the edited conversation would
    do, before it runs (the editor's "What would it do?"). It writes nothing; a POST
    only because an edited conversation is too long for a URL."""
    execution_id = request.path_params["execution_id"]
    form = await request.form(max_fields=edits.MAX_MESSAGES * 2 + 16)
    fields = {k: str(v) for k, v in form.items()}
    checkpoint_id = fields.get("checkpoint_id") or ""
    actions = actions_of(request)
    messages = await edited_messages(actions, execution_id, checkpoint_id, fields)
    nav_ahead(request, partial=True)
    page = await off_loop(
        build_fork_preview,
        actions.preflight,
        execution_id,
        checkpoint_id or None,
        None,
        urls_of(request),
        messages,
    )
    return await respond(request, "pages/fork.html", page, partial="partials/_fork_preview.html")


async def edit_page(request: Request) -> Response:
    if is_htmx(request):
        # Asked for from the run page's fork form: the editor is a page of its own (a
        # live push re-renders that form, and would take an editor inside it away).
        here = urls_of(request).path("edit_row", execution_id=request.path_params["execution_id"])
        return Response(status_code=204, headers={"HX-Redirect": f"{here}?{request.url.query}"})
    execution_id = request.path_params["execution_id"]
    checkpoint_id = request.query_params.get("checkpoint_id") or ""
    nav_ahead(request)
    page = await off_loop(
        build_edit_page, actions_of(request), execution_id, checkpoint_id, urls_of(request)
    )
    return await respond(request, "pages/edit.html", page)
