"""``/decide/{run}/{link}``: one pause's decision page, for the person a link names.

The page a personal link opens (``localui.links``). It shows that person the card, the
rule and its fields, and Approve and Reject; nothing else of the desk, and it signs
nobody in: no cookie is set, and every other page still asks for sign-in.

A GET (or HEAD) only ever shows: a chat app unfurling the link, a mail gateway fetching
it, a scanner running the page's scripts (it has none) decide nothing. The decision is a
POST to ``/decide/{run}`` (the link travels in the form, so it is in no path the audit
log or a proxy's log keeps) that carries the form key only the rendered page holds, and
passes the same-origin guard every POST passes. It goes through
:meth:`ActionService.decide`, so the rule's count, reasons and fields, and the
exactly-once claim, hold as on the desk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from localui import audit, names
from localui.actions import ActionService
from localui.auth import SCOPE_KEY, VIEWER, Person
from localui.errors import AlreadyDecided, LocalUIError
from localui.links import DecisionLink, LinkExpired, LinkInvalid, rule_print
from localui.offloop import off_loop
from localui.records import APPROVAL, Decision, Pending, Vote
from localui.views.cards import ApprovalItem, approval_item
from localui.views.decision_views import decision_view
from localui.views.notes import shown_only
from localui.views.params import fields_of
from localui.views.state import AppState, context
from localui.views.urls import Urls, urls_of
from localui.words import age_words

#: How the decision record and the audit log name a person who came by their link.
VIA_LINK = "link"

#: What a page says, by the state of its link.
DECIDE = "decide"  # the form
DECIDED = "decided"  # the pause is decided (by this person or another): nothing to do
VOTED = "voted"  # this person's approval is counted; the rule needs more people
REFUSED = "refused"  # the link cannot be used, and the page says why


@dataclass(frozen=True, slots=True)
class DecisionLinkPage:
    """What the page shows: the card and form, or what became of the pause, or why not."""

    state: str
    #: The heading: what this page is, in a few words.
    title: str
    #: Why the link cannot be used, or what was decided; empty on a form.
    words: str
    #: Whose link it is.
    person: str
    #: The pause, while it can be decided here.
    item: ApprovalItem | None = None
    #: The link itself and the key only this render holds, posted back with the form.
    link: str = ""
    form_key: str = ""
    #: Where the form posts, and the pause on the desk (which asks for sign-in).
    post_url: str = ""
    desk_url: str = ""
    #: A refusal of the last press of a button (its message), with the form again.
    error: str = ""


class Refusal(Exception):
    """A link that cannot be used: the page says why, with its status."""

    def __init__(
        self, status: int, title: str, words: str, person: str = "", state: str = REFUSED
    ) -> None:
        super().__init__(words)
        self.status, self.title, self.words, self.person = status, title, words, person
        self.state = state


@dataclass(frozen=True, slots=True)
class Ready:
    """A link that may decide its pause: whose, which, under which rule."""

    link: DecisionLink
    person: Person
    pending: Pending


async def read_link(request: Request, ctx: AppState, token: str, execution_id: str) -> Ready:
    """The pause ``token`` lets its person decide now, or a :class:`Refusal` saying why
    not. Nothing here writes: a GET ends here and renders."""
    try:
        link = await ctx.links.read(token)
    except LinkInvalid:
        raise Refusal(
            404,
            "This link does not open anything",
            "It is not a link this localui sent, or it was cut short or changed in a message,"
            " or the keys it was signed with were retired. Open the pause on the desk instead.",
        ) from None
    except LinkExpired as exc:
        raise Refusal(
            410,
            "This link has expired",
            f"It was {exc.link.person}'s link to decide this pause, and it expired at"
            f" {exc.link.expires_text}. The pause can still be decided on the desk.",
            exc.link.person,
        ) from None
    if link.execution_id != execution_id:
        raise Refusal(
            403,
            "This link is for another pause",
            f"It was sent for run {link.execution_id}, not run {execution_id}: a link opens"
            " only the pause it was sent for.",
            link.person,
        )
    desk = await ctx.auth.session_person(request.scope)
    if desk is not None and not names.one_person(desk.name, link.person):
        raise Refusal(
            403,
            f"This link is {link.person}'s",
            f"You are signed in to this desk as {desk.name}. A decision link decides as the"
            f" person it was sent to: {link.person} must open it, or decide as yourself on"
            " the desk.",
            link.person,
        )
    user = await ctx.auth.user_named(link.person)
    if user is None:
        raise Refusal(
            403,
            f"{link.person} can no longer decide here",
            f"No one named {link.person} may use this server any more.",
            link.person,
        )
    person = Person(name=user.name, role=user.role, via=VIA_LINK, groups=user.groups)
    if not person.can_decide:
        raise Refusal(
            403,
            f"{link.person} can no longer decide here",
            f"{user.name} is now a {user.role}: viewers decide nothing.",
            link.person,
        )
    if ctx.settings.read_only:
        raise Refusal(
            403,
            "Decisions are made elsewhere",
            "This server is read-only: open the link on the server that sent it.",
            link.person,
        )
    actions = ctx.actions
    pending = await off_loop(actions.store.get_pending, execution_id)
    if pending is None or pending.checkpoint_id != link.checkpoint_id:
        decision = await off_loop(_decision_on, actions, link)
        if decision is not None:
            raise _decided(decision, link)
        raise Refusal(
            409,
            "This pause is no longer waiting",
            f"Run {execution_id} no longer waits at the row this link was sent for"
            f" ({link.checkpoint_id})"
            + (": it waits for a new decision now, on the desk." if pending else "."),
            link.person,
        )
    rule = actions.preflight.rule_for(pending)
    if rule_print(rule) != link.rule_print:
        raise Refusal(
            403,
            "The rule for this pause has changed",
            "The approval policy that governs this pause is not what it was when this link"
            " was sent, so the link no longer decides it. Open the pause on the desk.",
            link.person,
        )
    if not actions.preflight.may_decide(rule, person, pending):
        assert rule is not None
        raise Refusal(
            403,
            f"{link.person} may not decide this pause",
            f"Rule {rule.name!r}: only {rule.who} may decide it.",
            link.person,
        )
    if rule is not None and rule.approvals > 1:
        key = (execution_id, link.checkpoint_id)
        votes: tuple[Vote, ...] = (await off_loop(actions.decisions.votes_for, [key])).get(key, ())
        mine = next((v for v in votes if names.one_person(v.actor, person.name)), None)
        if mine is not None:
            remaining = max(rule.approvals - len(votes), 0)
            raise Refusal(
                200,
                "Your approval is counted",
                f"{mine.actor} approved at {mine.voted_at}. Rule {rule.name!r} needs"
                f" {remaining} more {'person' if remaining == 1 else 'people'}; this link has"
                " done its part.",
                link.person,
                VOTED,
            )
    return Ready(link=link, person=person, pending=pending)


def _decision_on(actions: ActionService, link: DecisionLink) -> Decision | None:
    """The approval decision taken on the link's paused row, if any (the newest)."""
    taken = [
        d
        for d in actions.decisions.list_for_run(link.execution_id)
        if d.kind == APPROVAL and link.checkpoint_id in (d.checkpoint_id, d.rearmed_checkpoint_id)
    ]
    return taken[-1] if taken else None


def _decided(decision: Decision, link: DecisionLink) -> Refusal:
    """What the page says once the pause is decided: 200 to the person who decided it
    (what they see after pressing), 409 to anyone else's link."""
    mine = names.one_person(decision.actor, link.person)
    said = decision_view(decision).words
    if decision.reason:
        said += f" Reason: “{decision.reason}”."
    if decision.detail:
        what = "What went wrong" if decision.outcome == "failed" else "The run's answer"
        said += f" {what}: {decision.detail}"
    return Refusal(
        200 if mine else 409,
        "Decided" if mine else "Already decided",
        said + ("" if mine else " This link has nothing more to do."),
        link.person,
        DECIDED,
    )


def _card(actions: ActionService, ready: Ready, urls: Urls) -> ApprovalItem:
    item = approval_item(actions, ready.pending, datetime.now(UTC), urls, person=ready.person)
    # The notes others left show here; a note is left on the desk, where one signs in.
    return replace(item, notes=shown_only(item.notes)) if item.notes is not None else item


async def _form_page(
    request: Request, ctx: AppState, ready: Ready, token: str, error: str = ""
) -> DecisionLinkPage:
    urls = urls_of(request)
    item = await off_loop(_card, ctx.actions, ready, urls)
    since = age_words(ready.pending.created_at, datetime.now(UTC))
    return DecisionLinkPage(
        state=DECIDE,
        title=f"A decision for {ready.person.name}",
        words=f"Run {ready.link.execution_id} paused {since} and waits for a person.",
        person=ready.person.name,
        item=item,
        link=token,
        form_key=ctx.links.form_key(token),
        post_url=urls.path("decide_by_link", execution_id=ready.link.execution_id),
        desk_url=urls.approval(ready.link.execution_id),
        error=error,
    )


def _render(request: Request, page: DecisionLinkPage, status: int) -> Response:
    ctx = context(request)
    response = ctx.templates.TemplateResponse(
        request,
        "pages/decide.html",
        {"page": page, "settings": ctx.settings, "urls": urls_of(request)},
        status_code=status,
    )
    # The page is one person's: no cache or proxy keeps it, and it links out to nowhere
    # that should learn its address.
    response.headers["Cache-Control"] = "no-store"
    return response


def _refused(request: Request, refusal: Refusal, execution_id: str) -> Response:
    page = DecisionLinkPage(
        state=refusal.state,
        title=refusal.title,
        words=refusal.words,
        person=refusal.person,
        desk_url=urls_of(request).approval(execution_id),
    )
    return _render(request, page, refusal.status)


async def decision_link(request: Request) -> Response:
    """GET (and HEAD): the page a link opens. It never changes anything."""
    ctx = context(request)
    execution_id = request.path_params["execution_id"]
    token = request.path_params["link"]
    try:
        ready = await read_link(request, ctx, token, execution_id)
    except Refusal as refusal:
        return _refused(request, refusal, execution_id)
    return _render(request, await _form_page(request, ctx, ready, token), 200)


async def decide_by_link(request: Request) -> Response:
    """POST: the person pressed Approve or Reject on the page their link opened."""
    ctx = context(request)
    execution_id = request.path_params["execution_id"]
    form = await request.form()
    token = str(form.get("link") or "")
    try:
        ready = await read_link(request, ctx, token, execution_id)
    except Refusal as refusal:
        if refusal.person:
            # The audit log names whose link was pressed, though it decided nothing.
            request.scope[SCOPE_KEY] = Person(refusal.person, VIEWER, VIA_LINK)
        return _refused(request, refusal, execution_id)
    # The audit log names the person the link is, as it names a signed-in one.
    request.scope[SCOPE_KEY] = ready.person
    if not await ctx.links.check_form_key(token, str(form.get("form_key") or "")):
        unpressed = Refusal(
            403,
            "Open the link to decide",
            "This decision did not come from the page this link opens (its form key is"
            " missing, or from another link or an old page). Nothing was decided: open the"
            " link and press Approve or Reject there.",
            ready.person.name,
        )
        return _refused(request, unpressed, execution_id)
    choice = str(form.get("decision") or "")
    if choice not in ("approve", "reject"):
        page = await _form_page(request, ctx, ready, token, "Press Approve or Reject.")
        return _render(request, page, 400)
    try:
        outcome = await ctx.actions.decide(
            execution_id,
            approved=choice == "approve",
            approver=ready.person.name,
            reason=str(form.get("reason") or ""),
            checkpoint_id=ready.link.checkpoint_id,
            person=ready.person,
            fields=fields_of(form),
        )
    except AlreadyDecided as exc:
        if exc.decision is None:
            page = await _form_page(request, ctx, ready, token, str(exc))
            return _render(request, page, exc.status_code)
        # Another press (or another person) came first: say what was decided.
        return _refused(request, _decided(exc.decision, ready.link), execution_id)
    except LocalUIError as exc:
        try:
            ready = await read_link(request, ctx, token, execution_id)
        except Refusal as refusal:
            return _refused(request, refusal, execution_id)
        page = await _form_page(request, ctx, ready, token, str(exc))
        return _render(request, page, exc.status_code)
    if outcome.status == "voted":
        audit.note_action(request.scope, audit.VOTE)
    # What was decided is the link's page now: the same URL, which shows it.
    target = urls_of(request).path("decision_link", execution_id=execution_id, link=token)
    return RedirectResponse(target, status_code=303)
