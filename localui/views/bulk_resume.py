"""``POST /runs/bulk-resume``: resume the runs an operator ticked, a few at a time.

Each pick is ``["<execution id>", "<checkpoint id the page showed>"]``. Every run goes
through :meth:`ActionService.resume` — the same preflight, stale-row guard,
recent-row confirmation and exactly-once claim as a single resume — so a second
identical request, in this process or another, resumes nothing again. Before any
resume starts the answer lists what each would do, and which would run a tool again
that no cached result answers. Then at most ``BULK_CONCURRENCY`` run at once, and a
browser sees each run's outcome as it finishes (the page is streamed); a script
(``Accept: application/json``) gets every outcome in one answer.

The resumes are tasks of the app, not of the request: a browser that goes away
mid-way stops reading, never a resume half-done; the lifespan waits for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localui import names, runs
from localui.actions import RECENT_SECONDS, ActionService
from localui.auth import OPERATOR, require, template_values
from localui.errors import AlreadyDecided, BadRequest, LocalUIError, NeedsConfirmation, StaleCard
from localui.offloop import off_loop
from localui.views.attention import repeats_uncached
from localui.views.me import me_values
from localui.views.nav import nav_counts
from localui.views.params import picked_cards
from localui.views.respond import to_jsonable, wants_json
from localui.views.state import AppState, actor_of, approver_of, context
from localui.views.urls import Urls, urls_of
from localui.words import verdict

#: Resumes running at once: each drives an agent on this process's event loop, and a
#: few at a time leave the pages responsive while they run.
BULK_CONCURRENCY = 2
#: The most runs one request resumes: an outage's worth, in one go.
BULK_RESUME_LIMIT = 1000
#: Fields a bulk resume form may carry beside its picks (``confirm``, ``actor``), with room.
FORM_FIELDS_BESIDE_PICKS = 10

#: Where the streamed page puts each outcome as it comes (see ``pages/bulk_resume.html``).
STREAM_MARK = "<!-- outcomes -->"


@dataclass(frozen=True, slots=True)
class PreflightItem:
    """What a pick's resume would do, said before anything starts."""

    execution_id: str
    checkpoint_id: str
    #: The verdict's words, or why it cannot be resumed.
    resume: str
    #: The tool a resume runs again with no cached result to answer it.
    repeats: str | None
    #: The newest row is recent: without ``confirm=yes`` it is refused.
    needs_confirm: bool
    run_url: str


@dataclass(frozen=True, slots=True)
class ResumeItem:
    """How one pick ended: ``resumed`` (``status`` says how the run went on),
    ``already_resumed`` (a claim was first, here or elsewhere), ``stale`` (it would
    re-enter at another row than the page showed), ``needs_confirmation`` (its newest
    row is recent), or ``refused`` (with why)."""

    execution_id: str
    checkpoint_id: str
    result: str
    status: str | None
    words: str
    run_url: str


@dataclass(frozen=True, slots=True)
class BulkResumePage:
    preflight: tuple[PreflightItem, ...]
    items: tuple[ResumeItem, ...]
    counts: dict[str, int]
    repeating: int


RESULTS = ("resumed", "already_resumed", "stale", "needs_confirmation", "refused")


def preflight_items(
    actions: ActionService, picks: list[tuple[str, str]], urls: Urls
) -> tuple[PreflightItem, ...]:
    """Each pick's plan in words, read from its rows before any resume starts."""
    found = []
    for execution_id, checkpoint_id in picks:
        repeats = None
        needs_confirm = False
        try:
            state, plan, last = actions.resume_target(execution_id)
        except LocalUIError as exc:
            words = f"cannot resume: {exc}"
        else:
            rows = actions.store.list_rows(execution_id)
            saved = None
            tool = None
            skipped: tuple[str, ...] = ()
            if plan.tool is not None:
                reentry = actions.store.get_row(plan.checkpoint_id)
                if reentry is not None:
                    saved = reentry.node_input
                    skipped = runs.skipped_siblings(reentry.state_snapshot)
                tool = actions.preflight.tool_of(plan.checkpoint_id, plan.node_id)
            words = verdict(
                state, plan, last=last, now=datetime.now(UTC), saved_args=saved, skipped=skipped
            ).resume
            repeats = repeats_uncached(actions, plan, rows, tool)
            age = runs.seconds_since(last.created_at)
            needs_confirm = age is not None and age < RECENT_SECONDS
        found.append(
            PreflightItem(
                execution_id, checkpoint_id, words, repeats, needs_confirm, urls.run(execution_id)
            )
        )
    return tuple(found)


async def resume_one(
    actions: ActionService,
    execution_id: str,
    checkpoint_id: str,
    *,
    actor: str,
    confirm: bool,
    urls: Urls,
) -> ResumeItem:
    status: str | None = None
    try:
        outcome = await actions.resume(
            execution_id, checkpoint_id=checkpoint_id, actor=actor, confirm=confirm
        )
    except AlreadyDecided as exc:
        result, words = "already_resumed", str(exc)
        if exc.decision is not None:
            words = f"already {exc.decision.verb} by {exc.decision.actor}"
    except StaleCard as exc:
        result, words = "stale", f"stale: {exc}"
    except NeedsConfirmation as exc:
        result, words = "needs_confirmation", str(exc)
    except LocalUIError as exc:
        result, words = "refused", f"refused: {exc}"
    else:
        result, status = "resumed", outcome.status
        words = f"resumed: the run {outcome.status}"
        if outcome.error:
            words += f" ({outcome.error})"
    return ResumeItem(execution_id, checkpoint_id, result, status, words, urls.run(execution_id))


def start_resumes(
    ctx: AppState,
    picks: list[tuple[str, str]],
    *,
    actor: str,
    confirm: bool,
    urls: Urls,
) -> list[asyncio.Task[ResumeItem]]:
    """One task per pick, at most :data:`BULK_CONCURRENCY` running at once, kept by
    the app (not the request) until it ends."""
    gate = asyncio.Semaphore(BULK_CONCURRENCY)

    async def gated(execution_id: str, checkpoint_id: str) -> ResumeItem:
        async with gate:
            return await resume_one(
                ctx.actions, execution_id, checkpoint_id, actor=actor, confirm=confirm, urls=urls
            )

    tasks = [asyncio.create_task(gated(eid, cid)) for eid, cid in picks]
    for task in tasks:
        ctx.background.add(task)
        task.add_done_callback(ctx.background.discard)
    return tasks


def tally(items: list[ResumeItem]) -> dict[str, int]:
    return {result: sum(i.result == result for i in items) for result in RESULTS}


async def bulk_resume(request: Request) -> Response:
    person = require(request, OPERATOR)
    ctx = context(request)
    ctx.actions.preflight.ensure_writable()
    # Starlette refuses a form of more than 1,000 fields by default: the limit's worth
    # of picks, with ``confirm`` and ``actor`` beside them, must get through to be judged.
    form = await request.form(max_fields=BULK_RESUME_LIMIT + FORM_FIELDS_BESIDE_PICKS)
    picks = picked_cards([str(v) for v in form.getlist("pick")])
    if not picks:
        raise BadRequest("pick at least one run (tick its box) to resume in bulk")
    if len(picks) > BULK_RESUME_LIMIT:
        raise BadRequest(
            f"{len(picks)} runs picked; one bulk resume takes at most {BULK_RESUME_LIMIT}"
        )
    confirm = str(form.get("confirm") or "") in ("yes", "on", "true", "1")
    actor = actor_of(person, form, "actor", fallback=approver_of(request))
    actor = names.typed_name("actor", actor) or "someone"
    urls = urls_of(request)
    checked = await off_loop(preflight_items, ctx.actions, picks, urls)
    tasks = start_resumes(ctx, picks, actor=actor, confirm=confirm, urls=urls)
    repeating = sum(p.repeats is not None for p in checked)
    if wants_json(request):
        items = list(await asyncio.gather(*tasks))
        page = BulkResumePage(checked, tuple(items), tally(items), repeating)
        return JSONResponse(to_jsonable(page))
    return StreamingResponse(
        _stream(ctx, request, checked, tasks, repeating), media_type="text/html; charset=utf-8"
    )


async def _stream(
    ctx: AppState,
    request: Request,
    checked: tuple[PreflightItem, ...],
    tasks: list[asyncio.Task[ResumeItem]],
    repeating: int,
) -> AsyncIterator[str]:
    """The page up to its outcomes, each outcome as its run finishes, then the tally."""
    urls = urls_of(request)
    page = BulkResumePage(checked, (), {}, repeating)
    # The badges as the page starts (runs resumed by then no longer count).
    nav = await off_loop(nav_counts, ctx.store, ctx.settings)
    values = {
        "page": page,
        "settings": ctx.settings,
        "urls": urls,
        "nav": nav,
        "request": request,
        "stream_mark": Markup(STREAM_MARK),
    }
    # What the context processors give a page rendered by a TemplateResponse.
    values.update(template_values(request))
    values.update(me_values(request))
    html = ctx.templates.get_template("pages/bulk_resume.html").render(values)
    head, _, tail = html.partition(STREAM_MARK)
    yield head
    item_template = ctx.templates.get_template("partials/_bulk_resume_item.html")
    done: list[ResumeItem] = []
    for next_done in asyncio.as_completed(tasks):
        item = await next_done
        done.append(item)
        yield item_template.render(item=item)
    done_page = BulkResumePage(checked, tuple(done), tally(done), repeating)
    yield ctx.templates.get_template("partials/_bulk_resume_tally.html").render(page=done_page)
    yield tail
