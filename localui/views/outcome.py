"""The answer to any action's :class:`~localui.actions.Outcome`: JSON, a fragment, or a 303.

Approvals and run actions (resume, fork, re-open) answer through here alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from localui.actions import Outcome
from localui.views.decision_views import DecisionView, decision_view, needed_words
from localui.views.respond import is_htmx, to_jsonable, wants_json
from localui.views.state import context
from localui.views.urls import Urls, urls_of


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
        remaining = needed_words(outcome.needed - len(approvers))
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
