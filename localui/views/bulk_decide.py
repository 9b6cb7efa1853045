"""``POST /approvals/bulk``: one decision, one name and reason, over the picked cards."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from localui.actions import decision_text
from localui.auth import APPROVER, require
from localui.errors import AlreadyDecided, BadRequest, LocalUIError, StaleCard
from localui.views.outcome import outcome_view
from localui.views.params import fields_of, picked_cards
from localui.views.respond import respond
from localui.views.state import actions_of, actor_of, remember_approver
from localui.views.urls import urls_of

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


async def bulk_decide(request: Request) -> Response:
    """Approve or reject the picked cards with one name and reason. Each card is its own
    exactly-once claim with its own stale-card guard, one after the other: every step
    awaits the store or the agent, so other requests are served in between."""
    person = require(request, APPROVER)
    form = await request.form()
    verb = str(form.get("verb") or "")
    if verb not in ("approve", "reject"):
        raise BadRequest("verb must be approve or reject (the button you pressed)")
    # Checked once here, before any card, as each card's decision checks it again.
    approver, reason = decision_text(
        actor_of(person, form, "approver"),
        str(form.get("reason") or ""),
        approved=verb == "approve",
    )
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
