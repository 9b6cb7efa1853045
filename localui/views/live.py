"""``/live/...``: Server-Sent Events that keep an open page's live parts current.

One stream per page: the nav badge plus that page's fragments (the runs table;
a run's state, actions, decisions and timeline; the approvals queue). Each
fragment is rendered from the same partial file the page includes and sent as
an SSE event named after it; a hidden listener on the page (htmx's SSE
extension, ``sse-swap``) swaps it over the element with the same id.

- The first events of every stream carry the current state, so a page that
  lost its stream is right again as soon as the browser reconnects.
- Afterwards a fragment is rendered only when the change feed says its data
  changed, and sent only when its text differs from what this stream sent.
- Renders are shared (:class:`LiveRenders`): every stream showing the same
  view gets the same text, so a hundred tabs cost one render per change.
- A stream that fell behind gets a ``resync`` event, then every fragment anew.
- Streams end when the feed stops (the app's lifespan) and when uvicorn starts
  to shut down (sse-starlette watches for that), so open tabs never hold a
  stopping server.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from localui.auth import NOBODY, Person, person_of
from localui.backends.base import Changes
from localui.errors import BadRequest, LocalUIError, NotFound
from localui.live import ChangeFeed, Resync, Subscription
from localui.views.approvals import actions_of, approver_of, build_approvals_page, gone_notes
from localui.views.common import AppState, context, decode_cursor, nav_counts, off_loop
from localui.views.run import build_run_page
from localui.views.runs import RunFilters, build_runs_page, parse_filters
from localui.views.urls import Urls, urls_of

logger = logging.getLogger(__name__)

#: How soon a browser reconnects after the server closed a stream (ms).
RECONNECT_MS = 1000

#: How long a stream may take to end itself once the server stops, before it is cancelled.
SHUTDOWN_GRACE_S = 1.0

#: Claimed pauses the queue keeps a spot for (see ``_queue.html``): a person who
#: just decided one sees the outcome where its card was.
RECENTLY_GONE = 50


@dataclass(frozen=True, slots=True)
class Fragment:
    """One rendered partial and the SSE event that carries it."""

    event: str
    html: str


@dataclass(frozen=True, slots=True)
class Rendered:
    """A view's fragments, rendered from data at least as new as the feed's ``seq``."""

    fragments: tuple[Fragment, ...]
    #: What the view remembers between renders (the queue: which cards it showed).
    memo: Any = None
    #: Stamped by :class:`LiveRenders`, which knows the feed.
    seq: int = 0


class LiveView(Protocol):
    """One live part of a page: what it is keyed by, what touches it, how it renders."""

    @property
    def key(self) -> Hashable: ...

    def affected_by(self, changes: Changes) -> bool: ...

    def render(self, ctx: AppState, previous: Rendered | None) -> Rendered:
        """Read and render; blocking, so it runs off the event loop. ``previous`` is the
        render before this one, for views that remember something across renders."""
        ...


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
            nav=nav_counts(ctx.store)
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
        return changes.runs_changed

    def render(self, ctx: AppState, previous: Rendered | None) -> Rendered:
        page = build_runs_page(
            ctx.store, self.filters, self.after, ctx.settings.page_size, self.urls
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
        page = build_run_page(ctx.store, self.execution_id, self.urls, ctx.actions)
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
    newest_first: bool
    approver: str
    urls: Urls
    person: Person = NOBODY

    @property
    def key(self) -> Hashable:
        return ("queue", self.after, self.newest_first, self.approver, self.urls, self.person)

    def affected_by(self, changes: Changes) -> bool:
        return changes.pauses_changed

    def render(self, ctx: AppState, previous: Rendered | None) -> Rendered:
        actions = ctx.actions
        page = build_approvals_page(
            actions, self.after, self.newest_first, ctx.settings.page_size, self.urls
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


@dataclass
class LiveRenders:
    """The newest render of every view some stream shows, shared by those streams."""

    ctx: AppState
    feed: ChangeFeed
    _entries: dict[Hashable, Rendered] = field(default_factory=dict)
    _locks: dict[Hashable, asyncio.Lock] = field(default_factory=dict)
    _users: Counter[Hashable] = field(default_factory=Counter)
    #: Renders made, for tests and the benchmark.
    renders: int = 0

    @contextmanager
    def holding(self, views: Sequence[LiveView]) -> Iterator[None]:
        """Keep these views' renders while a stream shows them; forget them after."""
        for view in views:
            self._users[view.key] += 1
        try:
            yield
        finally:
            for view in views:
                self._users[view.key] -= 1
                if self._users[view.key] <= 0:
                    del self._users[view.key]
                    self._entries.pop(view.key, None)
                    self._locks.pop(view.key, None)

    async def current(self, view: LiveView, at_least: int) -> Rendered:
        """The view rendered from data no older than the feed's ``seq`` ``at_least``."""
        entry = self._entries.get(view.key)
        if entry is not None and entry.seq >= at_least:
            return entry
        lock = self._locks.setdefault(view.key, asyncio.Lock())
        async with lock:
            entry = self._entries.get(view.key)
            if entry is not None and entry.seq >= at_least:
                return entry
            # Read the seq first: the data read after it is at least that new.
            seq = self.feed.seq
            made = await off_loop(view.render, self.ctx, entry)
            self.renders += 1
            entry = replace(made, seq=seq)
            if view.key in self._users:
                self._entries[view.key] = entry
            return entry


def live_renders(ctx: AppState) -> LiveRenders:
    """The app's shared renders, made with its first stream."""
    if ctx.live_renders is None:
        ctx.live_renders = LiveRenders(ctx=ctx, feed=ctx.feed)
    return ctx.live_renders


async def _next_or_stop(subscription: Subscription, stop: anyio.Event) -> Changes | Resync | None:
    """The subscription's next item, or None once ``stop`` is set."""
    item: Changes | Resync | None = None
    async with anyio.create_task_group() as race:

        async def take() -> None:
            nonlocal item
            item = await subscription.next()
            race.cancel_scope.cancel()

        async def wait_for_stop() -> None:
            await stop.wait()
            race.cancel_scope.cancel()

        race.start_soon(take)
        race.start_soon(wait_for_stop)
    return item


async def live_events(
    ctx: AppState, views: Sequence[LiveView], stop: anyio.Event
) -> AsyncIterator[ServerSentEvent]:
    """The events of one stream: the current fragments, then each change to them, until
    the feed stops or ``stop`` is set (the server is shutting down)."""
    feed = ctx.feed
    renders = live_renders(ctx)
    subscription = await feed.subscribe()
    async with subscription:
        with renders.holding(views):
            # Sets the browser's reconnect delay and opens the stream at once.
            yield ServerSentEvent(comment="localui live", retry=RECONNECT_MS)
            yield store_status(ctx, feed.problem)
            sent: dict[str, str] = {}
            due: Sequence[LiveView] = views
            at_least = subscription.seq
            while True:
                for view in due:
                    try:
                        rendered = await renders.current(view, at_least)
                    except NotFound:
                        return  # the run was pruned: the browser's reconnect gets the 404
                    except LocalUIError as exc:
                        logger.warning("live view %s not rendered: %s", view.key, exc)
                        continue
                    except Exception:
                        # One broken fragment must not end the stream of the others.
                        logger.exception("live view %s failed to render", view.key)
                        continue
                    for fragment in rendered.fragments:
                        if sent.get(fragment.event) != fragment.html:
                            sent[fragment.event] = fragment.html
                            yield ServerSentEvent(data=fragment.html, event=fragment.event)
                item = await _next_or_stop(subscription, stop)
                if item is None:
                    return
                if isinstance(item, Resync):
                    yield ServerSentEvent(data="missed changes: sending everything", event="resync")
                    yield store_status(ctx, feed.problem)
                    sent.clear()
                    due, at_least = views, feed.seq
                else:
                    due, at_least = [v for v in views if v.affected_by(item)], item.seq


def store_status(ctx: AppState, problem: str | None) -> ServerSentEvent:
    """The banner every live page carries: empty while the store reads, else why not."""
    html = ctx.templates.get_template("partials/_store_status.html").render(problem=problem)
    return ServerSentEvent(data=html, event="store-status")


def stream(request: Request, views: Sequence[LiveView]) -> Response:
    """The SSE response for ``views``. sse-starlette sets ``stop`` when uvicorn begins
    to shut down; ending the stream then, rather than being cancelled, completes the
    response cleanly and at once."""
    stop = anyio.Event()
    return EventSourceResponse(
        live_events(context(request), views, stop),
        shutdown_event=stop,
        shutdown_grace_period=SHUTDOWN_GRACE_S,
    )


NAV = NavView()


async def live_nav(request: Request) -> Response:
    """The nav badge alone, for pages with nothing else live."""
    return stream(request, (NAV,))


async def live_runs(request: Request) -> Response:
    """The runs table under the page's own filters (the same query string as ``/``)."""
    filters, after = parse_filters(request)
    return stream(request, (NAV, RunsView(filters=filters, after=after, urls=urls_of(request))))


async def live_run(request: Request) -> Response:
    """One run's page; a 404 for a run not in the store, so the browser backs off."""
    execution_id = request.path_params["execution_id"]
    if await off_loop(context(request).store.get_run, execution_id) is None:
        raise NotFound(f"no run with execution id {execution_id!r} in this store")
    view = RunView(
        execution_id=execution_id,
        urls=urls_of(request),
        approver=approver_of(request),
        person=person_of(request),
    )
    return stream(request, (NAV, view))


async def live_approvals(request: Request) -> Response:
    """The queue as ``/approvals`` shows it (``?order=`` and ``?after=`` alike)."""
    actions_of(request)  # the queue needs the action service: fail now, not mid-stream
    order = request.query_params.get("order", "oldest")
    if order not in ("oldest", "newest"):
        raise BadRequest(f"order={order!r} is not oldest or newest")
    after_text = request.query_params.get("after")
    after = decode_cursor(after_text) if after_text else None
    view = QueueView(
        after=after,
        newest_first=order == "newest",
        approver=approver_of(request),
        urls=urls_of(request),
        person=person_of(request),
    )
    return stream(request, (NAV, view))
