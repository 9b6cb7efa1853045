"""``/approvals``: every run waiting for a person, oldest first; and the decisions.

A card shows the frozen context the run paused with, the row it paused at (the
form posts that ``checkpoint_id`` back, so a decision binds to what was seen),
and, before anyone clicks, whether this process can carry the decision out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response

from localui import audit, edits
from localui.actions import ActionService
from localui.auth import APPROVER, OPEN, OPERATOR, Person, person_of, require
from localui.backends.base import Deadlines
from localui.backends.shared import pending_key
from localui.errors import BadRequest, NotFound
from localui.offloop import off_loop
from localui.records import (
    APPROVAL,
    Pending,
    PendingPage,
    Unreadable,
)
from localui.shortids import shortest_unique
from localui.views.cards import ApprovalItem, approval_item, context_entries, missing_runners_words
from localui.views.decision_views import DecisionView, decision_views
from localui.views.nav import Nav, attention_total
from localui.views.outcome import answer_outcome
from localui.views.params import decode_cursor, encode_cursor, fields_of
from localui.views.respond import html_only, is_htmx, nav_ahead, respond, wants_json
from localui.views.state import (
    actions_of,
    actor_of,
    approver_of,
    beside,
    context,
    remember_approver,
)
from localui.views.urls import Urls, urls_of
from localui.words import decided_words

#: Cards on one page of the queue (fewer when the app's page size is smaller). A person
#: reads a few cards at a time, and a page of 25 light cards answers in about the time
#: the SDK's UI takes for its bare JSON; the rest is a "More" link away.
QUEUE_PAGE = 25


def queue_page_size(page_size: int) -> int:
    return min(page_size, QUEUE_PAGE)


# --- the rule a card is decided under (localui.policy) --------------------------------


@dataclass(frozen=True, slots=True)
class ApprovalsPage:
    approvals: tuple[ApprovalItem, ...]
    next: str | None
    total: int
    order: str
    #: Only the cards the person looking may decide (``?mine=1``).
    mine: bool = False
    next_url: str | None = html_only(None)
    approver: str = html_only("")
    #: Said once above the cards: the runners to register before these can be decided.
    missing_runners: str | None = html_only(None)
    #: The queue with the other filter: all cards, or only those one may decide.
    mine_url: str = html_only("")
    #: Whether any rule governs pauses here (the queue then offers ``mine_url``).
    has_policy: bool = html_only(False)
    #: Whether any rule gives deadlines (the queue then offers to sort by them).
    has_deadlines: bool = html_only(False)


#: Pages of the queue a "cards I can decide" page reads at most to fill itself; past
#: that it ends early and its "More" link goes on from where it stopped.
MINE_SCAN_PAGES = 20


def pending_page(
    actions: ActionService,
    after: tuple[str, str] | None,
    newest_first: bool,
    limit: int,
    keep: Callable[[Pending], bool] | None,
) -> PendingPage:
    """A page of the queue; with ``keep``, only the pauses it keeps, read page by page
    until the page is full (the policy is Python, not SQL, so the filter runs here)."""
    if keep is None:
        return actions.store.list_pending(after=after, limit=limit, newest_first=newest_first)
    kept: list[Pending] = []
    cursor = after
    total = 0
    for _ in range(MINE_SCAN_PAGES):
        page = actions.store.list_pending(after=cursor, limit=limit, newest_first=newest_first)
        total = page.total
        for index, item in enumerate(page.items):
            if not keep(item):
                continue
            kept.append(item)
            if len(kept) == limit:
                last = index == len(page.items) - 1 and page.next_key is None
                return PendingPage(tuple(kept), None if last else pending_key(item), total)
        if page.next_key is None:
            return PendingPage(tuple(kept), None, total)
        cursor = page.next_key
    return PendingPage(tuple(kept), cursor, total)


#: The queue's orders: ``due`` (soonest deadline first, pauses without one after) is
#: the default where a policy rule gives a ``due``, ``oldest`` elsewhere.
ORDERS = ("oldest", "newest", "due")
#: A ``due`` cursor's first element starts with one of these: still among the pauses
#: with a deadline (and the deadline's time), or among those without (their time).
_WITH_DUE, _WITHOUT_DUE = "d", "p"


def order_of(request: Request, deadlines: Deadlines | None) -> str:
    """``?order=``: ``oldest``, ``newest`` or ``due``; by default ``due`` when a rule
    gives deadlines, else ``oldest``."""
    order = request.query_params.get("order", "due" if deadlines is not None else "oldest")
    if order not in ORDERS:
        raise BadRequest(f"order={order!r} is not one of {', '.join(ORDERS)}")
    return order


def due_page(
    actions: ActionService,
    deadlines: Deadlines | None,
    after: tuple[str, str] | None,
    limit: int,
    keep: Callable[[Pending], bool] | None,
) -> PendingPage:
    """A page of the queue soonest deadline first (``localui_deadlines``), then the
    pauses with no deadline recorded, oldest first; ``keep`` filters as
    :func:`pending_page`'s does."""
    store = actions.store
    kept: list[Pending] = []
    total = store.count_pending()
    tag, point = (after[0][:1], after[0][1:]) if after is not None else (_WITH_DUE, "")
    # The deadlines this request read, and where it began reading them: the pauses
    # without one follow all of them, and a pause whose deadline was recorded after its
    # place in the order went by is shown among those, not lost between the two.
    shown: set[tuple[str, str]] | None = None
    start: tuple[float, str] | None = None
    if tag == _WITH_DUE and deadlines is not None:
        shown = set()
        if after is not None:
            try:
                start = (float(point), after[1])
            except ValueError:
                raise BadRequest("after= is not a cursor this server gave out") from None
        cursor = start
        for _ in range(MINE_SCAN_PAGES):
            rows = deadlines.by_due(cursor, limit)
            for row in rows:
                cursor = (row.due_at, row.execution_id)
                shown.add(row.key)
                pending = store.get_pending(row.execution_id)
                if pending is None or pending.checkpoint_id != row.checkpoint_id:
                    continue  # decided since: its row goes at the sweep's next poll
                if keep is not None and not keep(pending):
                    continue
                kept.append(pending)
                if len(kept) == limit:
                    return PendingPage(
                        tuple(kept), (f"{_WITH_DUE}{row.due_at!r}", row.execution_id), total
                    )
            if len(rows) < limit:
                break
        else:
            assert cursor is not None
            return PendingPage(tuple(kept), (f"{_WITH_DUE}{cursor[0]!r}", cursor[1]), total)
        after = None
    elif tag == _WITH_DUE:
        after = None
    else:
        after = (point, after[1]) if after is not None else None
    for _ in range(MINE_SCAN_PAGES):
        page = store.list_pending(after=after, limit=limit)
        keys = [(p.execution_id, p.checkpoint_id or "") for p in page.items]
        known: set[tuple[str, str]] = set(shown or ())
        if deadlines is not None and (shown is None or start is not None):
            # Those an earlier page showed among the pauses with a deadline.
            known.update(
                key
                for key, row in deadlines.get_many(keys).items()
                if start is None or (row.due_at, row.execution_id) <= start
            )
        for index, item in enumerate(page.items):
            if (item.execution_id, item.checkpoint_id or "") in known:
                continue  # shown with the pauses that have a deadline
            if keep is not None and not keep(item):
                continue
            kept.append(item)
            if len(kept) == limit:
                last = index == len(page.items) - 1 and page.next_key is None
                created, execution_id = pending_key(item)
                return PendingPage(
                    tuple(kept), None if last else (f"{_WITHOUT_DUE}{created}", execution_id), total
                )
        if page.next_key is None:
            return PendingPage(tuple(kept), None, total)
        after = page.next_key
    assert after is not None
    return PendingPage(tuple(kept), (f"{_WITHOUT_DUE}{after[0]}", after[1]), total)


def build_approvals_page(
    actions: ActionService,
    after: tuple[str, str] | None,
    order: str,
    limit: int,
    urls: Urls,
    person: Person = OPEN,
    mine: bool = False,
    deadlines: Deadlines | None = None,
) -> ApprovalsPage:
    """A page of the queue in ``order`` (:data:`ORDERS`); ``deadlines`` is the table
    ``due`` sorts by."""
    keep = None
    if mine:

        def keep(pending: Pending) -> bool:
            return person.can_decide and actions.preflight.may_decide(
                actions.preflight.rule_for(pending), person, pending
            )

    if order == "due":
        page = due_page(actions, deadlines, after, limit, keep)
    else:
        page = pending_page(actions, after, order == "newest", limit, keep)
    # The page's paused calls in one read, not one per card; its votes too.
    calls = actions.store.paused_calls(page.items)
    policy = actions.settings.policy
    votes = (
        actions.decisions.votes_for([(p.execution_id, p.checkpoint_id or "") for p in page.items])
        if policy is not None and any(r.approvals > 1 for r in policy.rules)
        else {}
    )
    notes = (
        actions.notes.for_pauses([(p.execution_id, p.checkpoint_id or "") for p in page.items])
        if actions.notes is not None
        else {}
    )
    now = datetime.now(UTC)
    cursor = encode_cursor(page.next_key) if page.next_key else None
    # The order the URL names, left out where it is the default.
    named = None if order == ("due" if deadlines is not None else "oldest") else order
    next_url = None
    if cursor:
        next_url = urls.path(
            "approvals", {"after": cursor, "order": named, "mine": "1" if mine else None}
        )
    shown = shortest_unique(p.execution_id for p in page.items)
    items = tuple(
        approval_item(
            actions,
            p,
            now,
            urls,
            exact=False,
            paused=calls.get(p.checkpoint_id or ""),
            light=True,
            short_id=shown[p.execution_id],
            person=person,
            votes=votes,
            notes=notes,
        )
        for p in page.items
    )
    return ApprovalsPage(
        approvals=items,
        next=cursor,
        total=page.total,
        order=order,
        mine=mine,
        next_url=next_url,
        missing_runners=missing_runners_words(actions, items),
        mine_url=urls.path("approvals", {"order": named, "mine": None if mine else "1"}),
        has_policy=policy is not None,
        has_deadlines=deadlines is not None,
    )


async def approvals_list(request: Request) -> Response:
    ctx = context(request)
    order = order_of(request, ctx.deadlines)
    after_text = request.query_params.get("after")
    after = decode_cursor(after_text) if after_text else None
    attention = (
        None
        if wants_json(request) or is_htmx(request)
        else beside(ctx, attention_total, ctx.store, ctx.settings)
    )
    page = await off_loop(
        build_approvals_page,
        actions_of(request),
        after,
        order,
        queue_page_size(ctx.settings.page_size),
        urls_of(request),
        person_of(request),
        mine_of(request),
        ctx.deadlines,
    )
    page = replace(page, approver=approver_of(request))
    # The queue's total is the badge's count: no second count of the pauses.
    return await respond(
        request,
        "pages/approvals.html",
        page,
        partial="partials/_queue.html",
        nav=Nav(pending=page.total, attention=await attention) if attention is not None else None,
    )


def mine_of(request: Request) -> bool:
    """``?mine=1``: only the cards the person looking may decide."""
    mine = request.query_params.get("mine", "")
    if mine not in ("", "0", "1"):
        raise BadRequest(f"mine={mine!r} is not 1 (only cards you may decide) or 0")
    return mine == "1"


@dataclass(frozen=True, slots=True)
class ApprovalPage:
    """One run's approval: the card while it waits, then the decisions taken on it."""

    execution_id: str
    pending: ApprovalItem | None
    decisions: tuple[DecisionView, ...]
    run_url: str
    approver: str = html_only("")


def build_approval_page(
    actions: ActionService, execution_id: str, urls: Urls, person: Person = OPEN
) -> ApprovalPage:
    pending = actions.store.get_pending(execution_id)
    decisions = decision_views(actions, execution_id, approvals_only=True)
    if pending is None and not decisions and actions.store.get_run(execution_id) is None:
        raise NotFound(f"no run with execution id {execution_id!r} in this store")
    return ApprovalPage(
        execution_id=execution_id,
        pending=approval_item(actions, pending, datetime.now(UTC), urls, person=person)
        if pending
        else None,
        decisions=decisions,
        run_url=urls.run(execution_id),
    )


async def approval_detail(request: Request) -> Response:
    execution_id = request.path_params["execution_id"]
    nav_ahead(request)
    page = await off_loop(
        build_approval_page, actions_of(request), execution_id, urls_of(request), person_of(request)
    )
    page = ApprovalPage(
        execution_id=page.execution_id,
        pending=page.pending,
        decisions=page.decisions,
        run_url=page.run_url,
        approver=approver_of(request),
    )
    return await respond(request, "pages/approval.html", page)


async def _decide(request: Request, approved: bool) -> Response:
    person = require(request, APPROVER)
    execution_id = request.path_params["execution_id"]
    form = await request.form()
    state = form.get("state")
    if state is not None:
        # A chain's state edited with the decision (the editor's form, whose name field
        # is ``actor``): operators edit runs.
        person = require(request, OPERATOR)
    approver = actor_of(person, form, "approver", fallback=str(form.get("actor") or ""))
    outcome = await actions_of(request).decide(
        execution_id,
        approved=approved,
        approver=approver,
        reason=str(form.get("reason") or ""),
        checkpoint_id=str(form.get("checkpoint_id") or ""),
        person=person,
        fields=fields_of(form),
        state=edits.parse_state(str(state)) if state is not None else None,
    )
    if outcome.status == "voted":
        audit.note_action(request.scope, audit.VOTE)  # one vote of a two-person rule
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
            words, when = decided_words(last), last.decided_at
        else:
            words, when = "no longer waiting", None
        notes.append(GoneNote(execution_id, words, when, urls.run(execution_id)))
    return tuple(notes)


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
