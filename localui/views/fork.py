"""``GET /runs/{id}/fork``: what a fork from a row would do, before anyone forks.

The SDK's rules (``localui.forks``) read on this run's rows: which conversation the
branch starts from, whether the model is called again, which tools run again with which
arguments, that no ``@idempotent`` result is reused, and which pauses the branch meets.
For an agent the page says both choices side by side (no input, a new input); the
``.json`` twin says the one asked for. A GET changes nothing; the form on the page posts
to ``POST /runs/{id}/fork``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from localui import forks, freetext, runs
from localui.offloop import off_loop
from localui.preflight import Preflight
from localui.views.respond import html_only, nav_ahead, respond
from localui.views.state import actions_of
from localui.views.urls import Urls, urls_of
from localui.words import call_text, fork_words

#: The longest new input a fork takes (the fork form says the same).
MAX_FORK_INPUT = 20_000


@dataclass(frozen=True, slots=True)
class ToolAgainView:
    tool: str
    arguments: Any
    idempotent: bool
    cached_in_source: bool
    node_id: str
    checkpoint_id: str
    #: ``refund(order_id="A-1009", amount=450.0)``.
    call: str = html_only("")


@dataclass(frozen=True, slots=True)
class ForkChoice:
    """What one choice (no input, or a new input) would do."""

    conversation: str
    model_called_again: bool
    tools_again: tuple[ToolAgainView, ...]
    #: Source tool calls past those named, not read.
    more_tools: int
    #: Calls the row declares without a result: the SDK answers them and does not run them.
    not_run: tuple[str, ...]
    pauses_ahead: tuple[str, ...]
    #: ``@idempotent`` results the source run holds; the branch reuses none.
    cached_results: int
    cached_reused: int
    nodes_again: tuple[str, ...]
    #: The preview in sentences (code between backticks).
    words: tuple[str, ...] = html_only(())
    title: str = html_only("")


@dataclass(frozen=True, slots=True)
class ForkPreviewPage:
    execution_id: str
    checkpoint_id: str
    node_id: str
    #: ``agent`` or ``chain``.
    runner: str
    input: str | None
    conversation: str
    model_called_again: bool
    tools_again: tuple[ToolAgainView, ...]
    not_run: tuple[str, ...]
    pauses_ahead: tuple[str, ...]
    cached_results: int
    #: Always 0: a branch is a new execution (the cache is keyed by execution id).
    cached_reused: int
    nodes_again: tuple[str, ...]
    #: What the page shows: the choice asked for, and for an agent the other one too.
    choices: tuple[ForkChoice, ...] = html_only(())
    run_url: str = html_only("")
    fork_url: str = html_only("")
    row_url: str = html_only("")
    #: A preview of an edited conversation (the editor's): its own form goes on from it.
    edited: bool = html_only(False)


def choice_of(plan: forks.ForkPlan, new_input: str | None, title: str) -> ForkChoice:
    return ForkChoice(
        conversation=plan.conversation,
        model_called_again=plan.model_called_again,
        tools_again=tuple(
            ToolAgainView(
                tool=c.tool,
                arguments=c.arguments,
                idempotent=c.idempotent,
                cached_in_source=c.cached_in_source,
                node_id=c.node_id,
                checkpoint_id=c.checkpoint_id,
                call=call_text(c.tool, c.arguments) if c.arguments is not None else c.tool,
            )
            for c in plan.tools_again
        ),
        more_tools=plan.more_tools,
        not_run=tuple(call_text(c.tool, c.arguments) for c in plan.not_run),
        pauses_ahead=tuple(p.node_id for p in plan.pauses_ahead),
        cached_results=plan.cached_results,
        cached_reused=0,
        nodes_again=plan.nodes_again,
        words=fork_words(plan, new_input),
        title=title,
    )


def build_fork_preview(
    preflight: Preflight,
    execution_id: str,
    checkpoint_id: str | None,
    new_input: str | None,
    urls: Urls,
    messages: list[dict[str, Any]] | None = None,
) -> ForkPreviewPage:
    """The preview; with ``messages``, of a branch from the row's conversation as edited
    (the editor's preview), that one choice alone."""
    # For an agent the page shows the other choice too, so it says what an input
    # changes; both plans come from one read of the run.
    other_input = None if new_input else "a new request"
    inputs = (new_input,) if messages is not None else (new_input, other_input)
    plans = preflight.fork_plans(execution_id, checkpoint_id, inputs, messages)
    asked = plans[0]
    title = "With the new input" if new_input else "Without a new input"
    if messages is not None:
        title = "From the edited conversation"
    choice = choice_of(asked, new_input, title)
    choices = [choice]
    if asked.kind == runs.AGENT and messages is None:
        title = "With a new input" if other_input else "Without a new input"
        choices.append(choice_of(plans[1], other_input, title))
    return ForkPreviewPage(
        execution_id=execution_id,
        checkpoint_id=asked.checkpoint_id,
        node_id=asked.node_id,
        runner=asked.kind,
        input=new_input,
        conversation=choice.conversation,
        model_called_again=choice.model_called_again,
        tools_again=choice.tools_again,
        not_run=choice.not_run,
        pauses_ahead=choice.pauses_ahead,
        cached_results=choice.cached_results,
        cached_reused=0,
        nodes_again=choice.nodes_again,
        choices=tuple(choices),
        run_url=urls.run(execution_id),
        fork_url=urls.path("fork_run", execution_id=execution_id),
        row_url=urls.row(execution_id, asked.checkpoint_id),
        edited=messages is not None,
    )


async def fork_preview(request: Request) -> Response:
    execution_id = request.path_params["execution_id"]
    checkpoint_id = request.query_params.get("checkpoint_id") or None
    typed = request.query_params.get("input") or ""
    new_input = freetext.check("input", typed, limit=MAX_FORK_INPUT) or None
    nav_ahead(request, partial=True)
    page = await off_loop(
        build_fork_preview,
        actions_of(request).preflight,
        execution_id,
        checkpoint_id,
        new_input,
        urls_of(request),
    )
    return await respond(request, "pages/fork.html", page, partial="partials/_fork_preview.html")
