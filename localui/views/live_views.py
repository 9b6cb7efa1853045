"""The live parts of each page: what each is keyed by, which changes touch it, and how
it renders from the same partial file the page includes (:mod:`localui.views.live`
streams them).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request

from localui.auth import NOBODY, Person, person_of
from localui.backends.base import Changes
from localui.errors import NotFound
from localui.live import Fragment, LiveView, Rendered
from localui.offloop import off_loop
from localui.views.approvals import (
    build_approval_page,
    build_approvals_page,
    gone_notes,
    mine_of,
    order_of,
    queue_page_size,
)
from localui.views.nav import nav_counts
from localui.views.params import decode_cursor
from localui.views.run import build_run_page
from localui.views.runs import RunFilters, build_runs_page, parse_filters
from localui.views.state import AppState, actions_of, approver_of, context
from localui.views.urls import Urls, urls_of

#: Claimed pauses the queue keeps a spot for (see ``_queue.html``): a person who
#: just decided one sees the outcome where its card was.
RECENTLY_GONE = 50


def render_partial(ctx: AppState, name: str, urls: Urls, **values: Any) -> str:
    values.setdefault("settings", ctx.settings)
    return ctx.templates.get_template(name).render(urls=urls, **values)


@dataclass(frozen=True, slots=True)
class NavView:
    """The approvals badge in the nav, on every page."""

    @property
    def key(self) -> Hashable:
        return ("nav",)

    def affected_by(self, changes: Changes) -> bool:
        return changes.pauses_changed

    def render(self, ctx: AppState, previous: Rendered | None) -> Rendered:
        html = ctx.templates.get_template("partials/_nav_badge.html").render(
            nav=nav_counts(ctx.store, ctx.settings)
        )
        return Rendered(fragments=(Fragment("nav-badge", html),))


@dataclass(frozen=True, slots=True)
class RunsView:
    """The runs table under one set of filters: rows, state tabs and totals together,
    since a new row changes all three."""

    filters: RunFilters
    after: tuple[str, str] | None
    #: Links are rendered once for every stream of this key, so the prefix is part of it.
    urls: Urls

    @property
    def key(self) -> Hashable:
        return ("runs", self.filters, self.after, self.urls)

    def affected_by(self, changes: Changes) -> bool:
        # A decision finishing changes a row's "rejected by …" after its state moved.
        return changes.runs_changed or bool(changes.decided)

    def render(self, ctx: AppState, previous: Rendered | None) -> Rendered:
        page = build_runs_page(
            ctx.store,
            ctx.actions.decisions,
            self.filters,
            self.after,
            ctx.settings.page_size,
            self.urls,
            ctx.traces,
            ctx.seeding.progress() if ctx.seeding is not None else None,
        )
        html = render_partial(ctx, "partials/_runs_table.html", self.urls, page=page, live=True)
        return Rendered(fragments=(Fragment("runs-table", html),))


@dataclass(frozen=True, slots=True)
class RunView:
    """One run's page: its state (verdict and pause), actions, decisions, timeline."""

    execution_id: str
    urls: Urls
    #: This browser's approver name, prefilled in the card of a paused run.
    approver: str = ""
    #: Who watches: the actions shown depend on their role.
    person: Person = NOBODY

    @property
    def key(self) -> Hashable:
        return ("run", self.execution_id, self.approver, self.urls, self.person)

    def affected_by(self, changes: Changes) -> bool:
        return changes.touches(self.execution_id)

    def render(self, ctx: AppState, previous: Rendered | None) -> Rendered:
        page = build_run_page(
            ctx.store,
            self.execution_id,
            self.urls,
            ctx.actions,
            traces=ctx.traces,
            person=self.person,
        )
        page = replace(page, approver=self.approver)
        parts = (
            ("run-state", "partials/_verdict.html"),
            ("run-actions", "partials/_run_actions.html"),
            ("decisions", "partials/_decisions.html"),
            ("timeline", "partials/_timeline.html"),
        )
        return Rendered(
            fragments=tuple(
                Fragment(
                    event,
                    render_partial(ctx, name, self.urls, page=page, live=True, person=self.person),
                )
                for event, name in parts
            ),
        )


@dataclass(frozen=True, slots=True)
class QueueView:
    """The approvals queue, one page of it, with this browser's approver name."""

    after: tuple[str, str] | None
    #: ``oldest``, ``newest`` or ``due`` (``views.approvals.ORDERS``).
    order: str
    approver: str
    urls: Urls
    person: Person = NOBODY
    #: Only the cards the person may decide (``?mine=1``).
    mine: bool = False

    @property
    def key(self) -> Hashable:
        return (
            "queue",
            self.after,
            self.order,
            self.approver,
            self.urls,
            self.person,
            self.mine,
        )

    def affected_by(self, changes: Changes) -> bool:
        # A vote leaves its pause in the queue and changes what the card says of its rule;
        # a note leaves it too, and the card shows one note more.
        return changes.pauses_changed or bool(changes.voted) or bool(changes.noted)

    def render(self, ctx: AppState, previous: Rendered | None) -> Rendered:
        actions = ctx.actions
        page = build_approvals_page(
            actions,
            self.after,
            self.order,
            queue_page_size(ctx.settings.page_size),
            self.urls,
            self.person,
            self.mine,
            ctx.deadlines,
        )
        page = replace(page, approver=self.approver)
        shown = tuple(item.execution_id for item in page.approvals)
        before_shown, before_gone = previous.memo if previous is not None else ((), ())
        gone = [eid for eid in (*before_gone, *before_shown) if eid not in shown]
        gone = list(dict.fromkeys(gone))[-RECENTLY_GONE:]
        html = render_partial(
            ctx,
            "partials/_queue.html",
            self.urls,
            page=page,
            live=True,
            gone=gone_notes(actions, gone, self.urls),
            person=self.person,
        )
        return Rendered(fragments=(Fragment("queue", html),), memo=(shown, tuple(gone)))


@dataclass(frozen=True, slots=True)
class ApprovalView:
    """One card's own page: what the card says of its rule, its notes, and the decisions
    on it. The card itself stays as drawn, with whatever the person typed in it."""

    execution_id: str
    urls: Urls
    person: Person = NOBODY

    @property
    def key(self) -> Hashable:
        return ("approval", self.execution_id, self.urls, self.person)

    def affected_by(self, changes: Changes) -> bool:
        return changes.touches(self.execution_id)

    def render(self, ctx: AppState, previous: Rendered | None) -> Rendered:
        page = build_approval_page(ctx.actions, self.execution_id, self.urls, self.person)
        fragments = tuple(
            Fragment(event, render_partial(ctx, name, self.urls, page=page, live=True))
            for event, name in (
                ("approval-rule", "partials/_approval_rule.html"),
                ("decisions", "partials/_decisions.html"),
            )
        )
        notes = page.pending.notes if page.pending is not None else None
        if notes is not None:
            # Its notes while it waits: desk.js takes the notes from it, and leaves the
            # note being typed as it is.
            html = render_partial(ctx, "partials/pause_notes.html", self.urls, notes=notes)
            fragments += (Fragment("pause-notes", html),)
        return Rendered(fragments=fragments)


NAV = NavView()


async def nav_views(request: Request) -> list[LiveView[AppState]]:
    return [NAV]


async def runs_views(request: Request) -> list[LiveView[AppState]]:
    filters, after = parse_filters(request)
    return [NAV, RunsView(filters=filters, after=after, urls=urls_of(request))]


async def run_views(request: Request) -> list[LiveView[AppState]]:
    execution_id = request.path_params["execution_id"]
    if await off_loop(context(request).store.get_run, execution_id) is None:
        raise NotFound(f"no run with execution id {execution_id!r} in this store")
    view = RunView(
        execution_id=execution_id,
        urls=urls_of(request),
        approver=approver_of(request),
        person=person_of(request),
    )
    return [NAV, view]


async def approvals_views(request: Request) -> list[LiveView[AppState]]:
    actions_of(request)  # the queue needs the action service: fail now, not mid-stream
    order = order_of(request, context(request).deadlines)
    after_text = request.query_params.get("after")
    after = decode_cursor(after_text) if after_text else None
    view = QueueView(
        after=after,
        order=order,
        approver=approver_of(request),
        urls=urls_of(request),
        person=person_of(request),
        mine=mine_of(request),
    )
    return [NAV, view]


async def approval_views(request: Request) -> list[LiveView[AppState]]:
    execution_id = request.path_params["execution_id"]
    actions_of(request)  # the card needs the action service: fail now, not mid-stream
    if await off_loop(context(request).store.get_run, execution_id) is None:
        raise NotFound(f"no run with execution id {execution_id!r} in this store")
    view = ApprovalView(execution_id=execution_id, urls=urls_of(request), person=person_of(request))
    return [NAV, view]
