"""An approval card's view model: the frozen context, its effects, its rule's fields.

The queue, a card's own page, a run's page and the live streams all draw cards from
:func:`approval_item`; :class:`QueueCards` keeps the queue's light cards rendered.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2 import pass_context
from jinja2.runtime import Context
from markupsafe import Markup

from localui import runs
from localui.actions import ActionService
from localui.auth import OPEN, Person
from localui.backends.notes import Note
from localui.delegation import delegate_words
from localui.errors import BadRequest
from localui.policy import Field, Rule
from localui.records import (
    PausedCall,
    Pending,
    Unreadable,
    Vote,
)
from localui.shortids import shortest_unique
from localui.views.decision_views import VoteView, needed_words
from localui.views.notes import NotesView, notes_view
from localui.views.respond import html_only
from localui.views.urls import Urls
from localui.words import age_words, call_text, due_words, short_json, timeout_words


@dataclass(frozen=True, slots=True)
class ContextEntry:
    """One key of a frozen context: a leaf with its text, or a branch with children."""

    key: str
    text: str | None
    children: tuple[ContextEntry, ...] = ()


def _leaf_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return short_json(value, limit=500)


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


@dataclass(frozen=True, slots=True)
class DecisionWords:
    """What Approve and Reject do to the run, as the card says it (code between
    backticks, for ``code_spans``): each runner kind resumes a pause its own way."""

    approve: str
    reject: str
    #: The calls of the same turn the resume will not run, or "" when there are none.
    skipped: str = ""


def decision_words(effects: Effects, runner: str, runner_kind: str, node_id: str) -> DecisionWords:
    """The card's sentences, after what the SDK's resume does for each runner kind (the
    run page's verdict says the same from the run's side)."""
    n = effects.reused
    reused = ""
    if n:
        reused = f"; {n} @idempotent result{' is' if n == 1 else 's are'} reused"
    tool = effects.tool
    if tool and runner_kind == runs.SUPERVISOR:
        # A Supervisor's resume runs its planner again first.
        approve = (
            f"{runner} runs its planner again from the original request (a new model call);"
            f" when it delegates to the worker, `{tool}` runs again with the answer"
            f" `approved=true`, then the team goes on{reused}."
        )
        reject = (
            f"the same, and `{tool}` gets `approved=false` and your reason; what it does then"
            " is the worker's code."
        )
    elif tool:
        team = "swarm" if runner_kind == runs.SWARM else "agent"
        approve = (
            f"`{tool}` runs again with the answer `approved=true`, then the {team} goes on{reused}."
        )
        reject = (
            f"`{tool}` gets `approved=false` and your reason; what it does then is the"
            " agent's code."
        )
    else:
        # A chain's node paused: the chain runs that node again from its start.
        approve = (
            f"the node `{node_id}` runs again from its start with the answer `approved=true`,"
            f" then the chain goes on{reused}."
        )
        reject = (
            f"the node `{node_id}` runs again from its start with `approved=false` and your"
            " reason; what it does then is the chain's code."
        )
    skipped = ""
    if effects.skipped:
        names = ", ".join(f"`{name}`" for name in effects.skipped)
        it = "it was" if len(effects.skipped) == 1 else "they were"
        skipped = f"{names}, called in the same turn; the SDK tells the agent {it} not run."
    return DecisionWords(approve, reject, skipped)


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
        call=call_text(tool, arguments) if tool else None,
        tool=tool,
        skipped=runs.skipped_siblings(snapshot),
        reused=paused.cached_results,
    )


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
    #: What Approve and Reject do, when the paused row says (``effects``).
    words: DecisionWords | None = html_only(None)
    #: ``3 keys``: what a light card's disclosure names.
    context_size: str = html_only("")
    #: What the reason box says is needed.
    reason_hint: str = html_only("required to reject")
    #: When its rule's deadline is (ISO), or null when no rule gives one.
    due_at: str | None = None
    #: ``due in 3 h`` or ``overdue by 20 min``; "" without a deadline.
    due: str = html_only("")
    #: Past its deadline, who the rule added: ``escalated to managers``; else "".
    escalated: str = html_only("")
    #: What its rule does at the deadline, in words; "" when it does nothing.
    on_timeout: str = html_only("")
    #: The notes people who may decide left on this pause (``views.notes``); null when
    #: there is no paused row to bind one to.
    notes: NotesView | None = None


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
    notes: Mapping[tuple[str, str], tuple[Note, ...]] | None = None,
) -> ApprovalItem:
    """One card; ``paused`` is its paused call when the caller read a page of them at
    once, else it is read here. A ``light`` card (the queue's) leaves its context table
    to be loaded when opened: a page of fifty stays as quick as the bare JSON. ``votes``
    and ``notes`` likewise: the page's, read at once, else this card's are read here."""
    if paused is None and pending.checkpoint_id:
        paused = actions.store.paused_calls((pending,)).get(pending.checkpoint_id)
    context_value = pending.context
    if isinstance(context_value, Unreadable):
        context_value = {"unreadable": context_value.error}
    entries = () if light else context_entries(context_value)
    owner = actions.preflight.pause_owner(pending)
    rule = actions.preflight.rule_for(pending)
    shown_rule = None
    if rule is not None:
        key = (pending.execution_id, pending.checkpoint_id or "")
        if votes is None:
            votes = actions.decisions.votes_for([key]) if rule.approvals > 1 else {}
        standing = actions.preflight.standing(rule, person, pending, now)
        shown_rule = rule_view(
            rule, votes.get(key, ()), context_value, standing.may, now, standing.for_names
        )
    due_at = rule.due_at(pending.created_at) if rule is not None else None
    escalated = ""
    on_timeout = ""
    if rule is not None and due_at is not None:
        if rule.escalate_to and now >= due_at:
            escalated = f"escalated to {rule.escalated_who}"
        timeout_at = rule.timeout_at(pending.created_at)
        if timeout_at is not None:
            on_timeout = timeout_words(rule.name, rule.on_timeout == "approve", timeout_at, now)
    effects = effects_of(pending, paused)
    runner = owner.describe()
    keys = len(context_value) if isinstance(context_value, dict | list) else 1
    return ApprovalItem(
        execution_id=pending.execution_id,
        agent=pending.agent,
        runner=runner,
        runner_kind=owner.kind,
        node_id=pending.node_id,
        checkpoint_id=pending.checkpoint_id,
        reason=pending.reason,
        context=context_value,
        created_at=pending.created_at,
        run_url=urls.run(pending.execution_id),
        url=urls.approval(pending.execution_id),
        problem=actions.preflight.approval_problem(
            pending, exact=exact or needs_exact_check(paused)
        ),
        age=age_words(pending.created_at, now),
        entries=entries,
        context_keys=keys,
        effects=effects,
        short_id=short_id or shortest_unique([pending.execution_id])[pending.execution_id],
        runner_missing=actions.registry.get(owner.name) is None,
        rule=shown_rule,
        words=decision_words(effects, runner, owner.kind, pending.node_id) if effects else None,
        context_size=f"{keys} {'key' if keys == 1 else 'keys'}",
        reason_hint="required"
        if shown_rule is not None and shown_rule.reason_required == "always"
        else "required to reject",
        due_at=due_at.isoformat() if due_at is not None else None,
        due=due_words(due_at, now) if due_at is not None else "",
        escalated=escalated,
        on_timeout=on_timeout,
        notes=notes_view(actions, pending, urls, person, notes=notes, rule=rule),
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
        its rule with the votes so far, its notes and whether the person looking may
        decide."""
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
            item.due,
            item.escalated,
            item.on_timeout,
            item.notes,
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
    #: The away people the person looking decides it for, as their delegate
    #: (``localui.delegation``); empty when they decide it in their own right.
    deciding_for: tuple[str, ...] = ()
    #: ``for ada, who is away``: said after "Deciding as bob".
    for_words: str = html_only("")


def rule_view(
    rule: Rule,
    votes: tuple[Vote, ...],
    context: Any,
    may_decide: bool,
    now: datetime,
    deciding_for: tuple[str, ...] = (),
) -> RuleView:
    shown = tuple(VoteView(v.actor, v.voted_at, age_words(v.voted_at, now)) for v in votes)
    plural = "approval" if rule.approvals == 1 else "approvals"
    words = f"Rule {rule.name!r}: {rule.approvals} {plural} from {rule.who}"
    if rule.approvals > 1:
        so_far = ", ".join(f"{v.actor} approved {v.age}" for v in shown) or "none yet"
        remaining = max(rule.approvals - len(shown), 0)
        words += f" — {so_far}; {needed_words(remaining, more=bool(shown))}"
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
        deciding_for=deciding_for,
        for_words=delegate_words(deciding_for),
    )
