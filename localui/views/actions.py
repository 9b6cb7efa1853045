"""The run actions: ``POST /runs/{id}/resume``, ``POST /runs/{id}/fork``, and prune.

Each answers a plain form with a 303 to the page that shows the result, htmx
with a redirect header to it, and ``Accept: application/json`` with the outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from localui import audit, edits, freetext
from localui.auth import OPERATOR, require
from localui.branching import Branching
from localui.errors import BadRequest, Forbidden, Refused
from localui.offloop import off_loop
from localui.records import PruneRun
from localui.signing import Signer
from localui.views.edit import edited_messages
from localui.views.fork import MAX_FORK_INPUT
from localui.views.outcome import outcome_view
from localui.views.params import parse_age, parse_instant
from localui.views.respond import html_only, is_htmx, respond, to_jsonable, wants_json
from localui.views.state import actions_of, actor_of, approver_of, context
from localui.views.urls import urls_of


def _answer(request: Request, payload: object, location: str) -> Response:
    if wants_json(request):
        return JSONResponse(to_jsonable(payload))
    if is_htmx(request):
        return Response(status_code=204, headers={"HX-Redirect": location})
    return RedirectResponse(location, status_code=303)


async def resume_run(request: Request) -> Response:
    person = require(request, OPERATOR)
    execution_id = request.path_params["execution_id"]
    form = await request.form()
    state = form.get("state")
    outcome = await actions_of(request).resume(
        execution_id,
        checkpoint_id=str(form.get("checkpoint_id") or ""),
        actor=actor_of(person, form, "actor", fallback=approver_of(request)),
        confirm=str(form.get("confirm") or "") in ("yes", "on", "true", "1"),
        state=edits.parse_state(str(state)) if state is not None else None,
    )
    urls = urls_of(request)
    return _answer(request, outcome_view(outcome, urls), urls.run(execution_id, fragment="outcome"))


async def reopen_pause(request: Request) -> Response:
    """Re-arm an orphaned pause no decision of localui's explains, so a person can
    decide it in the queue; bound to the paused row the operator saw."""
    person = require(request, OPERATOR)
    execution_id = request.path_params["execution_id"]
    form = await request.form()
    outcome = await actions_of(request).reopen(
        execution_id,
        checkpoint_id=str(form.get("checkpoint_id") or ""),
        actor=actor_of(person, form, "actor", fallback=approver_of(request)),
    )
    urls = urls_of(request)
    return _answer(request, outcome_view(outcome, urls), urls.run(execution_id, fragment="outcome"))


async def fork_run(request: Request) -> Response:
    """A fork; with ``messages`` (an agent's) or ``state`` (a chain's), or the editor's
    fields, a branch that goes on from the row as edited."""
    person = require(request, OPERATOR)
    execution_id = request.path_params["execution_id"]
    form = await request.form(max_fields=edits.MAX_MESSAGES * 2 + 16)
    checkpoint_id = str(form.get("checkpoint_id") or "")
    fields = {k: str(v) for k, v in form.items()}
    actions = actions_of(request)
    if "messages" in form or "state" in form or fields.get("edit") == "fields":
        if "messages" in form and "state" in form:
            raise BadRequest("send messages (an agent's row) or state (a chain's), not both")
        messages = state = None
        if "state" in form:
            state = edits.parse_state(fields["state"])
        else:
            messages = await edited_messages(actions, execution_id, checkpoint_id, fields)
        audit.note_action(request.scope, audit.EDIT)
        outcome = await Branching(actions).fork_edited(
            execution_id,
            checkpoint_id=checkpoint_id,
            messages=messages,
            state=state,
            actor=actor_of(person, form, "actor", fallback=approver_of(request)),
        )
    else:
        new_input = freetext.check("input", str(form.get("input") or ""), limit=MAX_FORK_INPUT)
        outcome = await Branching(actions).fork(
            execution_id, checkpoint_id=checkpoint_id or None, new_input=new_input or None
        )
    urls = urls_of(request)
    view = outcome_view(outcome, urls)
    if outcome.new_execution_id is None:
        # The SDK refused or failed before a branch existed: said through the one error
        # mapping, with the outcome for scripts.
        raise Refused(f"the fork failed: {outcome.error}", details={"outcome": view})
    return _answer(request, view, urls.run(outcome.new_execution_id))


@dataclass(frozen=True, slots=True)
class PrunePage:
    older_than: str
    #: Rows older than this instant are pruned; POST it back to prune what was previewed.
    cutoff: str
    would_delete: int
    checkpoint_rows: int
    cache_rows: int
    runs: tuple[PruneRun, ...]
    pauses_kept: int
    #: Runs that can still resume whose cached side effects the prune deletes, and how
    #: many of each: a resume after the prune runs those calls again.
    resumable_cache: Mapping[str, int] = field(default_factory=dict)
    deleted: int | None = None
    #: The server's signature of ``cutoff``: POST it with the cutoff, or the prune is refused.
    prune_token: str = ""
    read_only: bool = html_only(False)
    #: Why the age typed in could not be read; the form shows it again, filled in.
    error: str | None = html_only(None)


#: What a prune token signs: the cutoff instant the preview counted.
PRUNE_PURPOSE = "prune-cutoff"


def _older_than(text: str | None) -> str:
    return (text or "7d").strip()


async def _signer(request: Request) -> Signer:
    """The signer, with the store's keys as they are now (another process may have
    rotated them)."""
    signer = context(request).signer
    await signer.keys.fresh()
    return signer


async def prune_preview(request: Request) -> Response:
    actions = actions_of(request)
    older_than = _older_than(request.query_params.get("older_than"))
    try:
        age = parse_age(older_than)
    except BadRequest as exc:
        if wants_json(request):
            raise
        # A person typed it: the form comes back filled in, saying what it accepts.
        bad = PrunePage(older_than, "", 0, 0, 0, (), 0, error=str(exc))
        return await respond(request, "pages/prune.html", bad, status_code=400)
    preview = await off_loop(actions.prune_preview, age)
    page = PrunePage(
        older_than=older_than,
        cutoff=preview.cutoff,
        would_delete=preview.would_delete,
        checkpoint_rows=preview.checkpoint_rows,
        cache_rows=preview.cache_rows,
        runs=preview.runs,
        pauses_kept=preview.pauses_kept,
        resumable_cache=preview.resumable_cache,
        prune_token=(await _signer(request)).sign(PRUNE_PURPOSE, preview.cutoff),
        read_only=actions.settings.read_only,
    )
    return await respond(request, "pages/prune.html", page)


async def prune_now(request: Request) -> Response:
    """Prune as of the cutoff a preview showed, and only that: the cutoff comes back with
    the preview's signature, so no other instant (and nothing no one saw) is pruned."""
    require(request, OPERATOR)
    actions = actions_of(request)
    actions.preflight.ensure_writable()
    form = await request.form()
    older_than = _older_than(str(form.get("older_than") or "") or None)
    cutoff_text = str(form.get("cutoff") or "")
    token = str(form.get("prune_token") or "")
    if not cutoff_text or not token:
        raise BadRequest(
            "prune needs the cutoff and prune_token of a preview: "
            "GET /prune.json?older_than=7d, then POST both back"
        )
    cutoff = parse_instant("cutoff", cutoff_text)
    if not await (await _signer(request)).check(PRUNE_PURPOSE, cutoff_text, token):
        raise Forbidden(
            "this cutoff is not one a preview of this server showed: preview again, "
            "then prune what it shows"
        )
    deleted = await off_loop(actions.prune, cutoff)
    page = PrunePage(
        older_than=older_than,
        cutoff=cutoff_text,
        would_delete=0,
        checkpoint_rows=0,
        cache_rows=0,
        runs=(),
        pauses_kept=0,
        deleted=deleted,
    )
    if wants_json(request):
        return JSONResponse({"deleted": deleted, "cutoff": page.cutoff, "older_than": older_than})
    return await respond(request, "pages/prune.html", page)
