"""``/approvals``: every run waiting for a person, oldest first; and the decisions.

A card shows the frozen context the run paused with, the row it paused at (the
form posts that ``checkpoint_id`` back, so a decision binds to what was seen),
and, before anyone clicks, whether this process can carry the decision out.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from jinja2 import pass_context
from jinja2.runtime import Context
from markupsafe import Markup
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from localui import runs
from localui.actions import ActionService, AlreadyDecided, Outcome, StaleCard
from localui.auth import APPROVER, require
from localui.errors import BadRequest, LocalUIError, NotFound
from localui.records import ALREADY_RESUMED, APPROVAL, Decision, PausedCall, Pending, Unreadable
from localui.views.common import (
    Nav,
    context,
    decode_cursor,
    encode_cursor,
    html_only,
    is_htmx,
    off_loop,
    respond,
    to_jsonable,
    wants_json,
)
from localui.views.urls import Urls, urls_of

APPROVER_COOKIE = "localui_approver"

#: Cards on one page of the queue (fewer when the app's page size is smaller). A person
#: reads a few cards at a time, and a page of 25 light cards answers in about the time
#: the SDK's UI takes for its bare JSON; the rest is a "More" link away.
QUEUE_PAGE = 25


def queue_page_size(page_size: int) -> int:
    return min(page_size, QUEUE_PAGE)


def approver_of(request: HTTPConnection) -> str:
    """The approver name this browser last decided as (see :func:`remember_approver`)."""
    return unquote(request.cookies.get(APPROVER_COOKIE, ""))


def remember_approver(response: Response, approver: str) -> None:
    """Keep the name for the next card. Percent-encoded: a cookie is a header, and
    headers carry Latin-1 at most, so ``王小明`` or ``Łukasz`` would not fit as they are."""
    response.set_cookie(
        APPROVER_COOKIE,
        quote(approver.strip(), safe=""),
        max_age=365 * 86400,
        httponly=True,
        samesite="strict",
    )


@dataclass(frozen=True, slots=True)
class ContextEntry:
    """One key of a frozen context: a leaf with its text, or a branch with children."""

    key: str
    text: str | None
    children: tuple[ContextEntry, ...] = ()


def _leaf_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return runs.short_json(value, limit=500)


#: Levels of a context the card draws as a tree; deeper parts show as compact JSON, so
#: the template's recursion stays shallow whatever the context holds.
MAX_CONTEXT_LEVELS = 12


def context_entries(value: Any, level: int = 1) -> tuple[ContextEntry, ...]:
    if isinstance(value, dict):
        items: list[tuple[str, Any]] = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(f"[{i}]", v) for i, v in enumerate(value)]
    else:
        return (ContextEntry(key="value", text=_leaf_text(value)),)
    if level >= MAX_CONTEXT_LEVELS:
        return tuple(
            ContextEntry(
                key=k,
                text=f"(nested deeper than {MAX_CONTEXT_LEVELS} levels) {_leaf_text(v)}"
                if isinstance(v, dict | list) and v
                else _leaf_text(v),
            )
            for k, v in items
        )
    return tuple(
        ContextEntry(key=k, text=None, children=context_entries(v, level + 1))
        if isinstance(v, dict | list) and v
        else ContextEntry(key=k, text=_leaf_text(v))
        for k, v in items
    )


@dataclass(frozen=True, slots=True)
class Effects:
    """What a decision on a card does, read from the paused row the SDK resumes."""

    #: The paused call as it is written: ``refund(order_id="A-1002", amount=250.0)``;
    #: null when what paused is a chain's node, not a tool call (``tool`` is then "").
    call: str | None
    tool: str
    #: Other tool calls of the same turn with no result yet: the SDK answers them
    #: "not run on resume" instead of running them.
    skipped: tuple[str, ...]
    #: Results of ``@idempotent`` functions this run already stored: reused on resume.
    reused: int


def _argument(value: Any) -> str:
    # JSON keeps each value's exact text (250.0 stays 250.0, strings stay quoted).
    return json.dumps(value, ensure_ascii=False, default=str)


def call_text(tool: str, arguments: Any) -> str:
    if isinstance(arguments, dict):
        inside = ", ".join(f"{k}={_argument(v)}" for k, v in arguments.items())
    elif arguments in (None, ""):
        inside = ""
    else:
        inside = _argument(arguments)
    return f"{tool}({inside})"


def effects_of(pending: Pending, paused: PausedCall | None) -> Effects | None:
    """The paused call, its unanswered siblings and the reused results; None when the
    paused row is missing or unreadable (the card then says only what it knows)."""
    if paused is None or not isinstance(paused.state_snapshot, dict):
        return None
    snapshot = paused.state_snapshot
    tool = str(snapshot.get("tool_name") or runs.parse_node(pending.node_id).tool or "")
    paused_call_id = snapshot.get("tool_call_id")
    arguments = paused.node_input if isinstance(paused.node_input, dict) else None
    skipped: list[str] = []
    messages = snapshot.get("messages")
    if isinstance(messages, list):
        answered = {m.get("tool_call_id") for m in messages if isinstance(m, dict)}
        turn = next(
            (
                m
                for m in reversed(messages)
                if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls")
            ),
            None,
        )
        for call in (turn or {}).get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            if call.get("id") == paused_call_id:
                if arguments is None:
                    arguments = call.get("arguments")
            elif call.get("id") not in answered:
                skipped.append(str(call.get("name")))
    return Effects(
        call=call_text(tool, arguments) if tool else None,
        tool=tool,
        skipped=tuple(skipped),
        reused=paused.cached_results,
    )


@dataclass(frozen=True, slots=True)
class DecisionView:
    kind: str
    checkpoint_id: str
    approved: bool | None
    approver: str
    reason: str
    decided_at: str
    outcome: str | None
    detail: str | None
    finished_at: str | None
    words: str = html_only("")


def decision_view(d: Decision) -> DecisionView:
    if d.outcome is None:
        words = f"{d.actor} {d.verb} it at {d.decided_at}; the run is still going."
    elif d.outcome == ALREADY_RESUMED:
        words = f"{d.actor} {d.verb} it at {d.decided_at}, but it was resumed elsewhere first."
    else:
        words = f"{d.actor} {d.verb} it at {d.decided_at}: the run {d.outcome}."
    if d.rearmed_checkpoint_id is not None:
        words += (
            " The process carrying it out died after the SDK took the pause: localui wrote"
            f" the pause again as row {d.rearmed_checkpoint_id} and carried the decision out"
            " from there, running the tool again from the top."
        )
    return DecisionView(
        kind=d.kind,
        checkpoint_id=d.checkpoint_id,
        approved=d.approved,
        approver=d.actor,
        reason=d.reason,
        decided_at=d.decided_at,
        outcome=d.outcome,
        detail=d.detail,
        finished_at=d.finished_at,
        words=words,
    )


@dataclass(frozen=True, slots=True)
class ApprovalItem:
    execution_id: str
    agent: str
    #: The runner whose resume answers this pause, e.g. ``Supervisor 'refund-desk'``.
    runner: str
    node_id: str
    #: The paused row; the decision form posts it back.
    checkpoint_id: str | None
    reason: str
    context: Any
    created_at: str
    run_url: str
    url: str
    #: Why this process cannot carry out a decision, or null when it can.
    problem: str | None
    age: str = html_only("")
    #: The context as a table; empty on a light card, whose context loads when opened.
    entries: tuple[ContextEntry, ...] = html_only(())
    #: First-level keys of the context, which a light card names in its disclosure.
    context_keys: int = html_only(0)
    effects: Effects | None = None
    #: What kind of runner resumes it (``agent``, ``chain``, ``supervisor``, ``swarm``):
    #: the card's sentences follow what each does on resume.
    runner_kind: str = html_only("")


def approval_item(
    actions: ActionService,
    pending: Pending,
    now: datetime,
    urls: Urls,
    *,
    exact: bool = True,
    paused: PausedCall | None = None,
    light: bool = False,
) -> ApprovalItem:
    """One card; ``paused`` is its paused call when the caller read a page of them at
    once, else it is read here. A ``light`` card (the queue's) leaves its context table
    to be loaded when opened: a page of fifty stays as quick as the bare JSON."""
    if paused is None and pending.checkpoint_id:
        paused = actions.store.paused_calls((pending,)).get(pending.checkpoint_id)
    context_value = pending.context
    if isinstance(context_value, Unreadable):
        context_value = {"unreadable": context_value.error}
    entries = () if light else context_entries(context_value)
    owner = runs.pause_owner(pending.agent_path, pending.agent, pending.node_id)
    return ApprovalItem(
        execution_id=pending.execution_id,
        agent=pending.agent,
        runner=owner.describe(),
        runner_kind=owner.kind,
        node_id=pending.node_id,
        checkpoint_id=pending.checkpoint_id,
        reason=pending.reason,
        context=context_value,
        created_at=pending.created_at,
        run_url=urls.run(pending.execution_id),
        url=urls.approval(pending.execution_id),
        problem=actions.approval_problem(pending, exact=exact),
        age=runs.age_words(pending.created_at, now),
        entries=entries,
        context_keys=len(context_value) if isinstance(context_value, dict | list) else 1,
        effects=effects_of(pending, paused),
    )


@dataclass(frozen=True, slots=True)
class ApprovalsPage:
    approvals: tuple[ApprovalItem, ...]
    next: str | None
    total: int
    order: str
    next_url: str | None = html_only(None)
    approver: str = html_only("")


def build_approvals_page(
    actions: ActionService,
    after: tuple[str, str] | None,
    newest_first: bool,
    limit: int,
    urls: Urls,
) -> ApprovalsPage:
    page = actions.store.list_pending(after=after, limit=limit, newest_first=newest_first)
    # The page's paused calls in one read, not one per card.
    calls = actions.store.paused_calls(page.items)
    now = datetime.now(UTC)
    cursor = encode_cursor(page.next_key) if page.next_key else None
    order = "newest" if newest_first else "oldest"
    next_url = None
    if cursor:
        next_url = urls.path(
            "approvals", {"after": cursor, "order": "newest" if newest_first else None}
        )
    return ApprovalsPage(
        approvals=tuple(
            approval_item(
                actions,
                p,
                now,
                urls,
                exact=False,
                paused=calls.get(p.checkpoint_id or ""),
                light=True,
            )
            for p in page.items
        ),
        next=cursor,
        total=page.total,
        order=order,
        next_url=next_url,
    )


class QueueCards:
    """The queue's light cards, each rendered once for what it shows.

    A card is a pure function of its item, the name it offers to fill in, who is
    looking and how (person, read-only, URL prefix): a pause's row never changes, and
    its age text changes only every so often once it is a minute old. Reloads and live
    updates of a queue draw the same cards again and again, so the rendered card is
    kept, by all of that, for the next draw. ``queue_card`` in the templates.
    """

    TEMPLATE = "partials/_approval_card.html"

    def __init__(self, size: int = 512) -> None:
        self._size = size
        self._cards: OrderedDict[Hashable, Markup] = OrderedDict()
        self._lock = threading.Lock()

    def key(self, ctx: Context, item: ApprovalItem, approver: str) -> Hashable:
        """Everything a light card shows or is drawn from (its context is not drawn)."""
        return (
            item.execution_id,
            item.checkpoint_id,
            item.agent,
            item.runner,
            item.runner_kind,
            item.node_id,
            item.reason,
            item.created_at,
            item.age,
            item.run_url,
            item.url,
            item.problem,
            item.context_keys,
            item.effects,
            approver,
            ctx["person"],
            ctx["settings"].read_only,
            ctx["urls"].prefix,
        )

    def render(self, ctx: Context, item: ApprovalItem, approver: str) -> Markup:
        key = self.key(ctx, item, approver)
        with self._lock:
            card = self._cards.get(key)
            if card is not None:
                self._cards.move_to_end(key)
                return card
        module: Any = ctx.environment.get_template(self.TEMPLATE).make_module(ctx.get_all())
        card = Markup(module.approval_card(item, approver, bulk=True, light=True))
        with self._lock:
            self._cards[key] = card
            while len(self._cards) > self._size:
                self._cards.popitem(last=False)
        return card

    def template_global(self) -> Any:
        """``queue_card(item, approver)`` for the templates."""

        @pass_context
        def queue_card(ctx: Context, item: ApprovalItem, approver: str) -> Markup:
            return self.render(ctx, item, approver)

        return queue_card


def actions_of(request: Request) -> ActionService:
    service = context(request).actions
    return service


async def approvals_list(request: Request) -> Response:
    ctx = context(request)
    order = request.query_params.get("order", "oldest")
    if order not in ("oldest", "newest"):
        raise BadRequest(f"order={order!r} is not oldest or newest")
    after_text = request.query_params.get("after")
    after = decode_cursor(after_text) if after_text else None
    page = await off_loop(
        build_approvals_page,
        actions_of(request),
        after,
        order == "newest",
        queue_page_size(ctx.settings.page_size),
        urls_of(request),
    )
    page = _with_approver(request, page)
    # The queue's total is the badge's count: no second count of the pauses.
    return await respond(
        request,
        "pages/approvals.html",
        page,
        partial="partials/_queue.html",
        nav=Nav(pending=page.total),
    )


def _with_approver(request: Request, page: ApprovalsPage) -> ApprovalsPage:
    return ApprovalsPage(
        approvals=page.approvals,
        next=page.next,
        total=page.total,
        order=page.order,
        next_url=page.next_url,
        approver=approver_of(request),
    )


@dataclass(frozen=True, slots=True)
class ApprovalPage:
    """One run's approval: the card while it waits, then the decisions taken on it."""

    execution_id: str
    pending: ApprovalItem | None
    decisions: tuple[DecisionView, ...]
    run_url: str
    approver: str = html_only("")


def build_approval_page(actions: ActionService, execution_id: str, urls: Urls) -> ApprovalPage:
    pending = actions.store.get_pending(execution_id)
    decisions = tuple(
        decision_view(d) for d in actions.decisions.list_for_run(execution_id) if d.kind == APPROVAL
    )
    if pending is None and not decisions and actions.store.get_run(execution_id) is None:
        raise NotFound(f"no run with execution id {execution_id!r} in this store")
    return ApprovalPage(
        execution_id=execution_id,
        pending=approval_item(actions, pending, datetime.now(UTC), urls) if pending else None,
        decisions=decisions,
        run_url=urls.run(execution_id),
    )


async def approval_detail(request: Request) -> Response:
    execution_id = request.path_params["execution_id"]
    page = await off_loop(build_approval_page, actions_of(request), execution_id, urls_of(request))
    page = ApprovalPage(
        execution_id=page.execution_id,
        pending=page.pending,
        decisions=page.decisions,
        run_url=page.run_url,
        approver=approver_of(request),
    )
    return await respond(request, "pages/approval.html", page)


@dataclass(frozen=True, slots=True)
class OutcomeView:
    execution_id: str
    action: str
    status: str
    output: str | None
    error: str | None
    decision: DecisionView | None
    new_execution_id: str | None
    run_url: str


def outcome_view(outcome: Outcome, urls: Urls) -> OutcomeView:
    return OutcomeView(
        execution_id=outcome.execution_id,
        action=outcome.action,
        status=outcome.status,
        output=outcome.output,
        error=outcome.error,
        decision=decision_view(outcome.decision) if outcome.decision else None,
        new_execution_id=outcome.new_execution_id,
        run_url=urls.run(outcome.new_execution_id or outcome.execution_id),
    )


async def answer_outcome(request: Request, outcome: Outcome, redirect_to: str) -> Response:
    """JSON for scripts, the outcome fragment for htmx, a 303 for a plain form."""
    urls = urls_of(request)
    view = outcome_view(outcome, urls)
    if wants_json(request):
        return JSONResponse(to_jsonable(view))
    if is_htmx(request):
        ctx = context(request)
        return ctx.templates.TemplateResponse(
            request,
            "partials/_outcome.html",
            {"page": view, "settings": ctx.settings, "urls": urls},
        )
    return RedirectResponse(redirect_to, status_code=303)


async def _decide(request: Request, approved: bool) -> Response:
    person = require(request, APPROVER)
    execution_id = request.path_params["execution_id"]
    form = await request.form()
    # A signed-in person decides as themselves; only with sign-in off is it typed.
    approver = person.name if person.signed_in else str(form.get("approver") or "")
    outcome = await actions_of(request).decide(
        execution_id,
        approved=approved,
        approver=approver,
        reason=str(form.get("reason") or ""),
        checkpoint_id=str(form.get("checkpoint_id") or ""),
    )
    response = await answer_outcome(request, outcome, urls_of(request).approval(execution_id))
    if not person.signed_in:
        # No accounts here: remember who this browser's approver is, for the next card.
        remember_approver(response, approver)
    return response


async def approve(request: Request) -> Response:
    return await _decide(request, True)


async def reject(request: Request) -> Response:
    return await _decide(request, False)


@dataclass(frozen=True, slots=True)
class GoneNote:
    """What the queue says in place of a card decided elsewhere: who, how, when."""

    execution_id: str
    words: str
    decided_at: str | None
    run_url: str


def gone_notes(actions: ActionService, gone: list[str], urls: Urls) -> tuple[GoneNote, ...]:
    """One note per pause that left the queue: the latest approval decision on its run,
    or a plain line when the pause ended some other way (resumed, pruned). One read of
    the decision record for all of them."""
    latest = actions.decisions.latest_for_runs(APPROVAL, gone)
    notes = []
    for execution_id in gone:
        last = latest.get(execution_id)
        if last is not None:
            words, when = runs.decided_words(last), last.decided_at
        else:
            words, when = "no longer waiting", None
        notes.append(GoneNote(execution_id, words, when, urls.run(execution_id)))
    return tuple(notes)


# --- bulk decisions -------------------------------------------------------------------

#: The most cards one bulk decision takes: a page of the queue is 25, "select all shown"
#: over a few pages stays under this.
BULK_LIMIT = 500


@dataclass(frozen=True, slots=True)
class BulkItem:
    """How one card of a bulk decision ended: ``won`` (the decision was ours and carried
    out), ``already_decided`` (someone else's claim was first), ``stale`` (the run waits
    at another row than the card showed), or ``refused`` (with why)."""

    execution_id: str
    checkpoint_id: str
    result: str
    words: str
    status: str | None
    run_url: str


@dataclass(frozen=True, slots=True)
class BulkPage:
    verb: str
    approver: str
    reason: str
    items: tuple[BulkItem, ...]
    won: int
    already_decided: int
    stale: int
    refused: int


def picked_cards(values: list[str]) -> list[tuple[str, str]]:
    """The ``pick`` checkboxes: each a JSON pair ``[execution_id, checkpoint_id]``, so
    each card's decision is bound to the paused row that card showed."""
    cards: list[tuple[str, str]] = []
    for value in values:
        try:
            pair = json.loads(value)
        except ValueError:
            raise BadRequest(f"pick={value!r} is not a card's [run, paused row] pair") from None
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
        ):
            raise BadRequest(f"pick={value!r} is not a card's [run, paused row] pair")
        if (pair[0], pair[1]) not in cards:
            cards.append((pair[0], pair[1]))
    return cards


async def bulk_decide(request: Request) -> Response:
    """Approve or reject the picked cards with one name and reason. Each card is its own
    exactly-once claim with its own stale-card guard, one after the other: every step
    awaits the store or the agent, so other requests are served in between."""
    person = require(request, APPROVER)
    form = await request.form()
    verb = str(form.get("verb") or "")
    if verb not in ("approve", "reject"):
        raise BadRequest("verb must be approve or reject (the button you pressed)")
    approver = person.name if person.signed_in else str(form.get("approver") or "").strip()
    reason = str(form.get("reason") or "").strip()
    if not approver:
        raise BadRequest("say who you are: approver is required")
    if verb == "reject" and not reason:
        raise BadRequest("a reason is required to reject")
    cards = picked_cards([str(v) for v in form.getlist("pick")])
    if not cards:
        raise BadRequest("pick at least one card (tick its box) to decide in bulk")
    if len(cards) > BULK_LIMIT:
        raise BadRequest(f"{len(cards)} cards picked; one bulk decision takes at most {BULK_LIMIT}")
    actions, urls = actions_of(request), urls_of(request)
    items: list[BulkItem] = []
    for execution_id, checkpoint_id in cards:
        status: str | None = None
        try:
            outcome = await actions.decide(
                execution_id,
                approved=verb == "approve",
                approver=approver,
                reason=reason,
                checkpoint_id=checkpoint_id,
            )
        except AlreadyDecided as exc:
            result, words = "already_decided", str(exc)
            if exc.decision is not None:
                words = f"already {exc.decision.verb} by {exc.decision.actor}"
        except StaleCard as exc:
            result, words = "stale", f"stale: {exc}"
        except LocalUIError as exc:
            result, words = "refused", f"refused: {exc}"
        else:
            status = outcome.status
            result = "won"
            verb_done = "approved" if verb == "approve" else "rejected"
            words = f"{approver} {verb_done} it: the run {outcome.status}"
            if outcome.error:
                words += f" ({outcome.error})"
        items.append(
            BulkItem(execution_id, checkpoint_id, result, words, status, urls.run(execution_id))
        )
    page = BulkPage(
        verb=verb,
        approver=approver,
        reason=reason,
        items=tuple(items),
        won=sum(i.result == "won" for i in items),
        already_decided=sum(i.result == "already_decided" for i in items),
        stale=sum(i.result == "stale" for i in items),
        refused=sum(i.result == "refused" for i in items),
    )
    response = await respond(request, "pages/bulk.html", page, partial="partials/_bulk_result.html")
    if not person.signed_in:
        remember_approver(response, approver)
    return response


async def approval_context(request: Request) -> Response:
    """A waiting card's frozen context, opened from the queue: the queue's cards are
    light and load it only when a person asks for it."""
    execution_id = request.path_params["execution_id"]
    pending = await off_loop(actions_of(request).store.get_pending, execution_id)
    if pending is None:
        raise NotFound(f"run {execution_id!r} is not waiting for a person")
    value = pending.context
    if isinstance(value, Unreadable):
        value = {"unreadable": value.error}
    ctx = context(request)
    return ctx.templates.TemplateResponse(
        request,
        "partials/_context.html",
        {"item": {"entries": context_entries(value)}, "settings": ctx.settings},
    )
