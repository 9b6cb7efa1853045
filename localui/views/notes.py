"""Notes on a pause: what people who may decide it tell each other before deciding.

``POST /approvals/{execution_id}/notes`` leaves one (form: ``checkpoint_id``, ``text``),
bound to the paused row the person saw, as a decision is. A note is not a decision: it
never enters the decision record, never resumes anything and never counts as a vote.
It is kept in ``localui_notes`` (``localui.backends.notes``), shown wherever the pause
is (the queue's cards, the card's own page, the run page, the JSON of each, the bundle),
and announced as ``pause.noted`` to the targets that hear of the pause.

:func:`notes_view` builds what ``partials/pause_notes.html`` renders for one pause: any
page that shows a pause includes that partial with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from localui import freetext, names, runs
from localui.actions import ActionService
from localui.auth import APPROVER, OPEN, Person, require
from localui.backends.base import Changes
from localui.backends.notes import Note
from localui.errors import BadRequest, Conflict, Forbidden, NotFound, StaleCard, Unavailable
from localui.notify import events as ev
from localui.offloop import off_loop
from localui.policy import Rule
from localui.records import Pending
from localui.views.respond import html_only, is_htmx, to_jsonable, wants_json
from localui.views.state import actor_of, context, remember_approver
from localui.views.urls import Urls, dom_id, urls_of

#: The longest note taken, in characters.
MAX_NOTE = 2000


@dataclass(frozen=True, slots=True)
class NoteView:
    """One note as a page shows it."""

    id: int
    checkpoint_id: str
    author: str
    text: str
    created_at: str
    #: ``2026-12-07 00:31 UTC``: a fixed time, so a cached card stays right.
    when: str = html_only("")


@dataclass(frozen=True, slots=True)
class NotesView:
    """The notes on one pause (its paused row), and the form for someone who may write."""

    execution_id: str
    checkpoint_id: str
    notes: tuple[NoteView, ...]
    #: Whether the person looking may leave a note (may decide the pause), as the
    #: policy and their role say; a read-only server takes none all the same.
    may_write: bool
    #: Where the form posts (``add_note``); "" when no note can be left here.
    post_url: str = html_only("")
    #: The section's element id: the target of the form's htmx swap.
    dom: str = html_only("")
    #: Sign-in is off: the form asks the writer's name.
    ask_author: bool = html_only(False)
    #: What the section says while there are no notes.
    empty_words: str = html_only("No notes yet.")
    limit: int = html_only(MAX_NOTE)


def when_text(created_at: str) -> str:
    moment = runs.parse_time(created_at)
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment is not None else created_at


def note_view(note: Note) -> NoteView:
    return NoteView(
        id=note.id,
        checkpoint_id=note.checkpoint_id,
        author=note.author,
        text=note.text,
        created_at=note.created_at,
        when=when_text(note.created_at),
    )


def may_write(actions: ActionService, rule: Rule | None, person: Person) -> bool:
    """Whether ``person`` may leave a note on a pause under ``rule``: whoever may decide
    it (an approver or operator the rule allows)."""
    return person.can_decide and actions.preflight.may_decide(rule, person)


def notes_view(
    actions: ActionService,
    pending: Pending,
    urls: Urls,
    person: Person = OPEN,
    *,
    notes: Mapping[tuple[str, str], tuple[Note, ...]] | None = None,
    rule: Rule | None = None,
) -> NotesView | None:
    """The notes view model of the pause ``pending``, for ``person`` looking; None when
    the pause has no paused row to bind a note to. ``notes`` are the notes of a page of
    pauses read at once (else this pause's are read here); ``rule`` its policy rule when
    the caller has it (else it is looked up)."""
    checkpoint_id = pending.checkpoint_id
    if checkpoint_id is None:
        return None
    key = (pending.execution_id, checkpoint_id)
    if notes is None:
        notes = actions.notes.for_pauses([key]) if actions.notes is not None else {}
    if rule is None:
        rule = actions.preflight.rule_for(pending)
    allowed = may_write(actions, rule, person)
    writable = allowed and not actions.settings.read_only
    return NotesView(
        execution_id=pending.execution_id,
        checkpoint_id=checkpoint_id,
        notes=tuple(note_view(n) for n in notes.get(key, ())),
        may_write=allowed,
        post_url=urls.path("add_note", execution_id=pending.execution_id) if writable else "",
        dom=f"notes-{dom_id(pending.execution_id)}-{dom_id(checkpoint_id)}",
        ask_author=writable and not person.signed_in,
    )


def shown_only(view: NotesView) -> NotesView:
    """The same notes without the form: for a page that signs nobody in (a decision
    link's), where a note could not be posted."""
    return dataclasses.replace(view, may_write=False, post_url="", ask_author=False)


def earlier_notes(
    notes: Sequence[Note], execution_id: str, waiting_at: str | None
) -> tuple[NotesView, ...]:
    """The notes on a run's pauses other than the one it waits at now, one read-only
    view per paused row, in the order they were first noted (the run page's history)."""
    grouped: dict[str, list[Note]] = {}
    for note in notes:
        if note.checkpoint_id != waiting_at:
            grouped.setdefault(note.checkpoint_id, []).append(note)
    return tuple(
        NotesView(
            execution_id=execution_id,
            checkpoint_id=checkpoint_id,
            notes=tuple(note_view(n) for n in group),
            may_write=False,
            dom=f"notes-{dom_id(execution_id)}-{dom_id(checkpoint_id)}",
        )
        for checkpoint_id, group in grouped.items()
    )


@dataclass(frozen=True, slots=True)
class Written:
    """A note just kept, with the pause it is about and the pause's rule."""

    note: Note
    pending: Pending
    rule: Rule | None


def write_note(
    actions: ActionService,
    execution_id: str,
    checkpoint_id: str,
    author: str,
    text: str,
    person: Person,
) -> Written:
    """Keep the note, after the checks a decision makes of the same person on the same
    card: the run still waits at the row they saw (409 otherwise), and the pause's rule
    lets them decide it (403). Blocking: run off the event loop."""
    pending = actions.store.get_pending(execution_id)
    if pending is None:
        if actions.store.get_run(execution_id) is None:
            raise NotFound(f"no run with execution id {execution_id!r} in this store")
        raise Conflict(
            f"run {execution_id!r} is not waiting for a person now: a note is left on a"
            " pause while it waits"
        )
    if pending.checkpoint_id != checkpoint_id:
        raise StaleCard(
            f"the run now waits at row {pending.checkpoint_id}, not the row {checkpoint_id}"
            " you saw: look at the current pause before leaving a note on it",
            pending.checkpoint_id,
        )
    rule = actions.preflight.rule_for(pending)
    if not actions.preflight.may_decide(rule, person):
        assert rule is not None
        raise Forbidden(
            f"Rule {rule.name!r}: only {rule.who} may decide this pause, and so leave notes"
            f" on it; {author} is not one of them"
        )
    if actions.notes is None:
        raise Unavailable("notes on pauses are not open in this process")
    note = actions.notes.add(execution_id, checkpoint_id, author, text)
    return Written(note, pending, rule)


def _back(request: Request, fallback: str) -> str:
    """The page the form was on (the Referer, when it is this server's), else ``fallback``."""
    referer = request.headers.get("referer", "")
    parts = urlsplit(referer)
    here = urlsplit(str(request.base_url))
    if referer and (parts.scheme, parts.netloc) == (here.scheme, here.netloc) and parts.path:
        return referer
    return fallback


async def add_note(request: Request) -> Response:
    """Leave a note on a pause: a 303 back for a plain form, the pause's notes again for
    htmx, the note itself (201) for JSON."""
    person = require(request, APPROVER)
    ctx = context(request)
    actions = ctx.actions
    actions.preflight.ensure_writable()
    execution_id = request.path_params["execution_id"]
    form = await request.form()
    checkpoint_id = str(form.get("checkpoint_id") or "")
    if not checkpoint_id:
        raise BadRequest("checkpoint_id (the paused row you saw) is required")
    text = freetext.check("note", str(form.get("text") or ""), limit=MAX_NOTE)
    if not text:
        raise BadRequest("a note needs text: say what the others should know")
    author = names.typed_name("author", actor_of(person, form, "author"))
    if not author:
        raise BadRequest("say who you are: author is required")
    written = await off_loop(write_note, actions, execution_id, checkpoint_id, author, text, person)
    # Open pages of this run and the queue show it at once (``views.live``).
    ctx.feed.publish(Changes(noted=frozenset({execution_id})))
    if ctx.watcher is not None:
        rule = written.rule.name if written.rule is not None else ""
        await ctx.watcher.offer([ev.noted(written.note, written.pending, rule)])
    urls = urls_of(request)
    if wants_json(request):
        response: Response = JSONResponse(to_jsonable(note_view(written.note)), status_code=201)
    elif is_htmx(request):
        shown = await off_loop(notes_view, actions, written.pending, urls, person)
        response = ctx.templates.TemplateResponse(
            request,
            "partials/pause_notes.html",
            {
                "notes": shown,
                # Sign-in off: the name to offer for the next note is this one's.
                "approver": author,
                "settings": ctx.settings,
                "urls": urls,
            },
        )
    else:
        response = RedirectResponse(_back(request, urls.approval(execution_id)), status_code=303)
    if not person.signed_in:
        remember_approver(response, author)
    return response
