"""``/approvals``: every run waiting for a person, oldest first; and the decisions.

A card shows the frozen context the run paused with, the row it paused at (the
form posts that ``checkpoint_id`` back, so a decision binds to what was seen),
and, before anyone clicks, whether this process can carry the decision out.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from jinja2 import pass_context
from jinja2.runtime import Context
from markupsafe import Markup
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from localui import freetext, names, runs
from localui.actions import ActionService, AlreadyDecided, Outcome, StaleCard
from localui.auth import APPROVER, OPEN, Person, person_of, require
from localui.backends.shared import pending_key
from localui.errors import BadRequest, LocalUIError, NotFound
from localui.policy import Field, Rule
from localui.records import (
    ALREADY_RESUMED,
    APPROVAL,
    Decision,
    PausedCall,
    Pending,
    PendingPage,
    Unreadable,
    Vote,
)
from localui.shortids import shortest_unique
from localui.views.common import (
    Nav,
    attention_total,
    beside,
    context,
    decode_cursor,
    encode_cursor,
    html_only,
    is_htmx,
    nav_ahead,
    off_loop,
    respond,
    to_jsonable,
    wants_json,
)
from localui.views.params import parse_pair
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


def effects_of(pending: Pending, paused: PausedCall | None) -> Effects | None:
    """The paused call, its unanswered siblings and the reused results; None when the
    paused row is missing or unreadable (the card then says only what it knows)."""
    if paused is None or not isinstance(paused.state_snapshot, dict):
        return None
    snapshot = paused.state_snapshot
    tool = str(snapshot.get("tool_name") or runs.parse_node(pending.node_id).tool or "")
    paused_call_id = snapshot.get("tool_call_id")
    arguments = paused.node_input if isinstance(paused.node_input, dict) else None
    if arguments is None and isinstance(snapshot.get("messages"), list):
        # An older row without the call's input: its arguments as the model gave them.
        for message in reversed(snapshot["messages"]):
            calls = message.get("tool_calls") if isinstance(message, dict) else None
            found = [
                c for c in calls or [] if isinstance(c, dict) and c.get("id") == paused_call_id
            ]
            if found:
                arguments = found[0].get("arguments")
                break
    return Effects(
        call=runs.call_text(tool, arguments) if tool else None,
        tool=tool,
        skipped=runs.skipped_siblings(snapshot),
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
    #: The row's id as the page's decisions show it (``localui.shortids``).
    short_checkpoint_id: str = html_only("")


def decision_view(d: Decision, short_checkpoint_id: str | None = None) -> DecisionView:
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
        short_checkpoint_id=short_checkpoint_id
        or shortest_unique([d.checkpoint_id])[d.checkpoint_id],
    )


# --- the rule a card is decided under (localui.policy) --------------------------------


@dataclass(frozen=True, slots=True)
class FieldView:
    """One input of a rule's field, filled in from the pause's context."""

    #: The form's name for it: ``field.<name>``.
    input_name: str
    name: str
    label: str
    #: ``text``, ``number``, ``checkbox`` or ``select``.
    input: str
    value: str
    checked: bool
    required: bool
    min: str | None
    max: str | None
    step: str | None
    choices: tuple[str, ...]
    #: What it accepts, in words: ``a number from 1 to 250``.
    hint: str


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


def field_view(field: Field, context: Any) -> FieldView:
    value = field.default_for(context)
    low: float | None = None
    high: float | None = None
    hint = {"text": "text", "number": "a number", "integer": "a whole number"}.get(field.type, "")
    if field.type in ("number", "integer"):
        try:
            low, high = field.bounds(context)
        except BadRequest as exc:
            hint = f"cannot be checked: {exc}"
        else:
            if low is not None and high is not None:
                hint += f" from {_shown(low)} to {_shown(high)}"
            elif low is not None:
                hint += f" of at least {_shown(low)}"
            elif high is not None:
                hint += f" of at most {_shown(high)}"
    if field.type == "choice":
        hint = "one of " + ", ".join(field.choices)
    return FieldView(
        input_name=f"field.{field.name}",
        name=field.name,
        label=field.label,
        input={"boolean": "checkbox", "choice": "select", "text": "text"}.get(field.type, "number"),
        value=_shown(value),
        checked=value is True,
        required=field.required,
        min=None if low is None else _shown(low),
        max=None if high is None else _shown(high),
        step={"number": "any", "integer": "1"}.get(field.type),
        choices=field.choices,
        hint=hint + (" (required)" if field.required else ""),
    )


@dataclass(frozen=True, slots=True)
class VoteView:
    actor: str
    voted_at: str
    age: str


@dataclass(frozen=True, slots=True)
class RuleView:
    """The policy's rule for a card: who decides, how many, and who approved so far."""

    name: str
    who: str
    approvals: int
    votes: tuple[VoteView, ...]
    #: ``Rule 'large refunds': 2 approvals from finance — Ada approved 4 min ago; one
    #: more person needed``.
    words: str
    #: Whether the person looking may decide it (else the card is read-only for them).
    may_decide: bool
    reason_required: str
    fields: tuple[FieldView, ...] = html_only(())


def _needed_words(remaining: int, *, more: bool = True) -> str:
    if remaining == 1:
        return "one more person needed" if more else "one person needed"
    return f"{remaining} more people needed" if more else f"{remaining} people needed"


def rule_view(
    rule: Rule, votes: tuple[Vote, ...], context: Any, may_decide: bool, now: datetime
) -> RuleView:
    shown = tuple(VoteView(v.actor, v.voted_at, runs.age_words(v.voted_at, now)) for v in votes)
    plural = "approval" if rule.approvals == 1 else "approvals"
    words = f"Rule {rule.name!r}: {rule.approvals} {plural} from {rule.who}"
    if rule.approvals > 1:
        so_far = ", ".join(f"{v.actor} approved {v.age}" for v in shown) or "none yet"
        remaining = max(rule.approvals - len(shown), 0)
        words += f" — {so_far}; {_needed_words(remaining, more=bool(shown))}"
    if rule.reason_required == "always":
        words += "; a reason is required to approve too"
    return RuleView(
        name=rule.name,
        who=rule.who,
        approvals=rule.approvals,
        votes=shown,
        words=words,
        may_decide=may_decide,
        reason_required=rule.reason_required,
        fields=tuple(field_view(f, context) for f in rule.fields),
    )


def vote_view(vote: Vote, short_checkpoint_id: str | None = None) -> DecisionView:
    """A vote among a run's decisions: one approval a rule counted, not yet the last."""
    return DecisionView(
        kind="vote",
        checkpoint_id=vote.checkpoint_id,
        approved=True,
        approver=vote.actor,
        reason=vote.reason,
        decided_at=vote.voted_at,
        outcome="voted",
        detail=None,
        finished_at=vote.voted_at,
        words=f"{vote.actor} approved it at {vote.voted_at}, one of the approvals its rule needs.",
        short_checkpoint_id=short_checkpoint_id
        or shortest_unique([vote.checkpoint_id])[vote.checkpoint_id],
    )


def decision_views(
    actions: ActionService,
    execution_id: str,
    *,
    approvals_only: bool = False,
    recorded: tuple[Decision, ...] | None = None,
) -> tuple[DecisionView, ...]:
    """A run's decisions (``recorded``, when the caller read them) and votes, oldest
    first, their rows' ids shortened to read apart from each other. The vote that
    completed a count is a decision as well, shown once, as that."""
    if recorded is None:
        recorded = actions.decisions.list_for_run(execution_id)
    decisions = [d for d in recorded if not approvals_only or d.kind == APPROVAL]
    decided = {(d.checkpoint_id, d.actor) for d in decisions if d.kind == APPROVAL}
    votes = [
        v
        for v in actions.decisions.votes_for_run(execution_id)
        if (v.checkpoint_id, v.actor) not in decided
    ]
    ids = shortest_unique([d.checkpoint_id for d in decisions] + [v.checkpoint_id for v in votes])
    shown = [(d.decided_at, decision_view(d, ids[d.checkpoint_id])) for d in decisions]
    shown += [(v.voted_at, vote_view(v, ids[v.checkpoint_id])) for v in votes]
    return tuple(view for _, view in sorted(shown, key=lambda pair: pair[0]))


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
    #: The run's id as this page shows it (``localui.shortids``); the title has it whole.
    short_id: str = html_only("")
    #: No runner of the run's owner is registered here: the queue says so once, above
    #: its cards, and the card is read-only.
    runner_missing: bool = html_only(False)
    #: The policy's rule for this pause; null when none governs it (any approver, alone).
    rule: RuleView | None = None


def needs_exact_check(paused: PausedCall | None) -> bool:
    """Whether a queue card must read its whole run to say if it can be approved: the
    SDK finds the row it resumes among the first 500 rows it reads of the run, in its
    own order, so past 500 rows, or with an earlier pause in the run, it may find
    another row than this pause's (the approval is then refused, and the card says so
    before anyone clicks)."""
    return paused is not None and (paused.run_rows > runs.SDK_LIST_LIMIT or paused.run_pauses > 1)


def approval_item(
    actions: ActionService,
    pending: Pending,
    now: datetime,
    urls: Urls,
    *,
    exact: bool = True,
    paused: PausedCall | None = None,
    light: bool = False,
    short_id: str | None = None,
    person: Person = OPEN,
    votes: Mapping[tuple[str, str], tuple[Vote, ...]] | None = None,
) -> ApprovalItem:
    """One card; ``paused`` is its paused call when the caller read a page of them at
    once, else it is read here. A ``light`` card (the queue's) leaves its context table
    to be loaded when opened: a page of fifty stays as quick as the bare JSON. ``votes``
    likewise: the page's votes, read at once, else this card's are read here."""
    if paused is None and pending.checkpoint_id:
        paused = actions.store.paused_calls((pending,)).get(pending.checkpoint_id)
    context_value = pending.context
    if isinstance(context_value, Unreadable):
        context_value = {"unreadable": context_value.error}
    entries = () if light else context_entries(context_value)
    owner = actions.pause_owner(pending)
    rule = actions.rule_for(pending)
    shown_rule = None
    if rule is not None:
        key = (pending.execution_id, pending.checkpoint_id or "")
        if votes is None:
            votes = actions.decisions.votes_for([key]) if rule.approvals > 1 else {}
        shown_rule = rule_view(
            rule, votes.get(key, ()), context_value, actions.may_decide(rule, person), now
        )
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
        problem=actions.approval_problem(pending, exact=exact or needs_exact_check(paused)),
        age=runs.age_words(pending.created_at, now),
        entries=entries,
        context_keys=len(context_value) if isinstance(context_value, dict | list) else 1,
        effects=effects_of(pending, paused),
        short_id=short_id or shortest_unique([pending.execution_id])[pending.execution_id],
        runner_missing=actions.registry.get(owner.name) is None,
        rule=shown_rule,
    )


def missing_runners_words(actions: ActionService, items: Sequence[ApprovalItem]) -> str | None:
    """The one sentence a page of cards says when runs on it have no runner here."""
    missing = sorted({item.runner for item in items if item.runner_missing})
    if not missing:
        return None
    registered = ", ".join(actions.registry.names()) or "none"
    return (
        f"Cannot decide here: no runner is registered in this localui process for "
        f"{', '.join(missing)} (registered: {registered}). Restart it with --agents "
        "MODULE:ATTR (or FILE.py:ATTR) naming the code that builds each, bound to this "
        "store; until then their cards below are read-only."
    )


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


def build_approvals_page(
    actions: ActionService,
    after: tuple[str, str] | None,
    newest_first: bool,
    limit: int,
    urls: Urls,
    person: Person = OPEN,
    mine: bool = False,
) -> ApprovalsPage:
    keep = None
    if mine:

        def keep(pending: Pending) -> bool:
            return person.can_decide and actions.may_decide(actions.rule_for(pending), person)

    page = pending_page(actions, after, newest_first, limit, keep)
    # The page's paused calls in one read, not one per card; its votes too.
    calls = actions.store.paused_calls(page.items)
    policy = actions.settings.policy
    votes = (
        actions.decisions.votes_for([(p.execution_id, p.checkpoint_id or "") for p in page.items])
        if policy is not None and any(r.approvals > 1 for r in policy.rules)
        else {}
    )
    now = datetime.now(UTC)
    cursor = encode_cursor(page.next_key) if page.next_key else None
    order = "newest" if newest_first else "oldest"
    newest = "newest" if newest_first else None
    next_url = None
    if cursor:
        next_url = urls.path(
            "approvals", {"after": cursor, "order": newest, "mine": "1" if mine else None}
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
        mine_url=urls.path("approvals", {"order": newest, "mine": None if mine else "1"}),
        has_policy=policy is not None,
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
        """Everything a light card shows or is drawn from (its context is not drawn),
        its rule with the votes so far and whether the person looking may decide."""
        return (
            item.rule,
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
            item.short_id,
            item.runner_missing,
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
        # The queue says once, above its cards, what a card without a runner lacks.
        card = Markup(module.approval_card(item, approver, bulk=True, light=True, said_above=True))
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
    attention = (
        None
        if wants_json(request) or is_htmx(request)
        else beside(ctx, attention_total, ctx.store, ctx.settings)
    )
    page = await off_loop(
        build_approvals_page,
        actions_of(request),
        after,
        order == "newest",
        queue_page_size(ctx.settings.page_size),
        urls_of(request),
        person_of(request),
        mine_of(request),
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


def _with_approver(request: Request, page: ApprovalsPage) -> ApprovalsPage:
    return dataclasses.replace(page, approver=approver_of(request))


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
    #: For a vote (status ``voted``): who approved so far, in order, and how many the
    #: rule needs.
    approvers: tuple[str, ...] = ()
    needed: int = 0


def outcome_view(outcome: Outcome, urls: Urls) -> OutcomeView:
    output = outcome.output
    approvers = tuple(v.actor for v in outcome.votes)
    if outcome.status == "voted":
        remaining = _needed_words(outcome.needed - len(approvers))
        output = (
            f"approval {len(approvers)} of {outcome.needed} recorded ({', '.join(approvers)});"
            f" {remaining}: the run keeps waiting"
        )
    return OutcomeView(
        execution_id=outcome.execution_id,
        action=outcome.action,
        status=outcome.status,
        output=output,
        error=outcome.error,
        decision=decision_view(outcome.decision) if outcome.decision else None,
        new_execution_id=outcome.new_execution_id,
        run_url=urls.run(outcome.new_execution_id or outcome.execution_id),
        approvers=approvers,
        needed=outcome.needed,
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


FIELD_PREFIX = "field."


def fields_of(form: Any) -> dict[str, str]:
    """The rule's fields a form sent, ``field.<name>``, by name (the rule checks them)."""
    return {
        str(k)[len(FIELD_PREFIX) :]: str(v)
        for k, v in form.multi_items()
        if str(k).startswith(FIELD_PREFIX)
    }


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
        person=person,
        fields=fields_of(form),
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
        pair = parse_pair("pick", value, "a card's [run, paused row] pair")
        if pair not in cards:
            cards.append(pair)
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
    typed = str(form.get("approver") or "")
    approver = person.name if person.signed_in else names.typed_name("approver", typed)
    reason = freetext.reason(str(form.get("reason") or ""))
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
    fields = fields_of(form)
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
                person=person,
                fields=fields,
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
            if outcome.status == "voted":
                words = f"{approver} approved it: {outcome_view(outcome, urls).output}"
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
