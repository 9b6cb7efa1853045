"""``/live/...``: Server-Sent Events that keep an open page's live parts current.

One stream per page: the nav badge plus that page's fragments (the runs table;
a run's state, actions, decisions and timeline; the approvals queue; a card's own
page: what it says of its rule, and its decisions). Each
fragment is rendered from the same partial file the page includes and sent as
an SSE event named after it; a hidden listener on the page (htmx's SSE
extension, ``sse-swap``) swaps it over the element with the same id.

- The first events of every stream carry the current state, so a page that
  lost its stream is right again as soon as the browser reconnects.
- Afterwards a fragment is rendered only when the change feed says its data
  changed, and sent only when its text differs from what this stream sent.
- Renders are shared (:class:`localui.live.LiveRenders`): every stream showing the same
  view gets the same text, so a hundred tabs cost one render per change.
- A stream that fell behind gets a ``resync`` event, then every fragment anew.
- A browser's tabs share one stream (``/live/mux``, opened by ``static/live-shared.js``
  in a SharedWorker): it carries the union of what the tabs watch, each fragment
  labelled with the watched URLs it belongs to. Browsers allow about six connections
  to one server, so a stream per tab would freeze a browser with six tabs open.
- The server still caps the streams one browser holds open (:data:`STREAMS_PER_BROWSER`):
  beyond it a stream is refused with 429, and the page says its live updates are
  paused, leaving the browser's other connections free for pages and actions.
- Streams end when the feed stops (the app's lifespan) and when uvicorn starts
  to shut down (sse-starlette watches for that), so open tabs never hold a
  stopping server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Match

from localui.auth import person_of
from localui.backends.base import Changes
from localui.errors import BadRequest, LocalUIError, NotFound
from localui.live import Browser, LiveView, Resync, Subscription
from localui.views.live_views import (
    approval_views,
    approvals_views,
    nav_views,
    run_views,
    runs_views,
)
from localui.views.state import AppState, context
from localui.views.urls import urls_of

logger = logging.getLogger(__name__)

#: How soon a browser reconnects after the server closed a stream (ms).
RECONNECT_MS = 1000

#: How long a stream may take to end itself once the server stops, before it is cancelled.
SHUTDOWN_GRACE_S = 1.0

#: Live streams one browser may hold open at once. Browsers open at most six HTTP/1.1
#: connections to one server; four leaves two for pages and actions.
STREAMS_PER_BROWSER = 4

#: URLs one shared stream may carry (one per distinct live page open in a browser).
MUX_MAX_WATCHED = 64


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


#: Labels one event of a stream: the view it came from (None: every view, as the store
#: status and resync are), its event name and data.
Label = Callable[[LiveView[AppState] | None, str, str], ServerSentEvent]


def plain_event(view: LiveView[AppState] | None, event: str, data: str) -> ServerSentEvent:
    return ServerSentEvent(data=data, event=event)


async def live_events(
    ctx: AppState,
    views: Sequence[LiveView[AppState]],
    stop: anyio.Event,
    label: Label = plain_event,
    end_when_gone: bool = True,
    still_allowed: Callable[[float], Awaitable[bool]] | None = None,
) -> AsyncIterator[ServerSentEvent]:
    """The events of one stream: the current fragments, then each change to them, until
    the feed stops or ``stop`` is set (the server is shutting down). ``label`` names
    each event; a shared stream leaves a pruned run out instead of ending
    (``end_when_gone=False``), as its other pages still watch. ``still_allowed(since)``
    is asked before each change is sent: once the person watching was removed, reset
    or given another role, the stream ends, and the browser's reconnect signs in anew."""
    feed = ctx.feed
    renders = ctx.live_renders
    subscription = await feed.subscribe()
    async with subscription:
        with renders.holding(views):
            # Sets the browser's reconnect delay and opens the stream at once.
            yield ServerSentEvent(comment="localui live", retry=RECONNECT_MS)
            yield label(None, "store-status", store_status_html(ctx, feed.problem))
            sent: dict[tuple[Hashable, str], str] = {}
            due: Sequence[LiveView[AppState]] = views
            at_least = subscription.seq
            while True:
                for view in due:
                    try:
                        rendered = await renders.current(ctx, view, at_least)
                    except NotFound:
                        if end_when_gone:
                            return  # the run was pruned: the browser's reconnect gets the 404
                        continue
                    except LocalUIError as exc:
                        logger.warning("live view %s not rendered: %s", view.key, exc)
                        continue
                    except Exception:
                        # One broken fragment must not end the stream of the others.
                        logger.exception("live view %s failed to render", view.key)
                        continue
                    for fragment in rendered.fragments:
                        if sent.get((view.key, fragment.event)) != fragment.html:
                            sent[(view.key, fragment.event)] = fragment.html
                            yield label(view, fragment.event, fragment.html)
                item = await _next_or_stop(subscription, stop)
                if item is None:
                    return
                if still_allowed is not None and not await still_allowed(time.monotonic()):
                    return
                if isinstance(item, Resync):
                    yield label(None, "resync", "missed changes: sending everything")
                    yield label(None, "store-status", store_status_html(ctx, feed.problem))
                    sent.clear()
                    due, at_least = views, feed.seq
                else:
                    due, at_least = [v for v in views if v.affected_by(item)], item.seq


def store_status_html(ctx: AppState, problem: str | None) -> str:
    """The banner every live page carries: empty while the store reads, else why not."""
    return ctx.templates.get_template("partials/_store_status.html").render(problem=problem)


def browser_of(request: Request) -> Browser | None:
    """The browser a live stream is for (:class:`localui.live.BrowserStreams`): its
    address, User-Agent and cookies. Only requests a browser's fetch machinery marks
    (``Sec-Fetch-Mode``) count: scripts and benchmarks hold what they ask for."""
    if "sec-fetch-mode" not in request.headers:
        return None
    host = request.client.host if request.client else ""
    return (host, request.headers.get("user-agent", ""), request.headers.get("cookie", ""))


def stream(
    request: Request,
    views: Sequence[LiveView[AppState]],
    label: Label = plain_event,
    end_when_gone: bool = True,
) -> Response:
    """The SSE response for ``views``. sse-starlette sets ``stop`` when uvicorn begins
    to shut down; ending the stream then, rather than being cancelled, completes the
    response cleanly and at once."""
    ctx = context(request)
    browser = browser_of(request)
    if browser is not None and ctx.browser_streams.open[browser] >= STREAMS_PER_BROWSER:
        # An EventSource answered with an error stays closed; the page says its live
        # updates are paused and tries again later.
        return PlainTextResponse(
            f"this browser already holds {STREAMS_PER_BROWSER} live streams",
            status_code=429,
            headers={"Retry-After": "5"},
        )
    stop = anyio.Event()
    watching = person_of(request)

    async def still_allowed(since: float) -> bool:
        try:
            return await ctx.auth.person_now(request.scope, since) == watching
        except LocalUIError:
            return False  # the users table cannot be read: the reconnect says so

    async def events() -> AsyncIterator[ServerSentEvent]:
        with ctx.browser_streams.holding(browser):
            async for event in live_events(ctx, views, stop, label, end_when_gone, still_allowed):
                yield event

    return EventSourceResponse(
        events(),
        shutdown_event=stop,
        shutdown_grace_period=SHUTDOWN_GRACE_S,
    )


async def live_nav(request: Request) -> Response:
    """The nav badge alone, for pages with nothing else live."""
    return stream(request, await nav_views(request))


async def live_runs(request: Request) -> Response:
    """The runs table under the page's own filters (the same query string as ``/``)."""
    return stream(request, await runs_views(request))


async def live_run(request: Request) -> Response:
    """One run's page; a 404 for a run not in the store, so the browser backs off."""
    return stream(request, await run_views(request))


async def live_approvals(request: Request) -> Response:
    """The queue as ``/approvals`` shows it (``?order=`` and ``?after=`` alike)."""
    return stream(request, await approvals_views(request))


async def live_approval(request: Request) -> Response:
    """One card's own page; a 404 for a run not in the store, so the browser backs off."""
    return stream(request, await approval_views(request))


#: The live routes a shared stream may carry, by route name.
WATCHABLE = {
    "live_nav": nav_views,
    "live_runs": runs_views,
    "live_run": run_views,
    "live_approvals": approvals_views,
    "live_approval": approval_views,
}


async def watched_views(request: Request, url: str) -> list[LiveView[AppState]]:
    """The views of one live URL as a page's ``sse-connect`` names it (with the prefix),
    read as if that URL had been requested with this request's cookies and sign-in."""
    urls = urls_of(request)
    path, _, query = url.partition("?")
    if not path.startswith(urls.prefix + "/live/"):
        raise BadRequest(f"{url!r} is not a live stream of this server")
    scope = {
        **request.scope,
        "path": path[len(urls.prefix) :],
        "raw_path": path[len(urls.prefix) :].encode(),
        "query_string": query.encode(),
    }
    for route in urls.router.routes:
        match, child = route.matches(scope)
        name = getattr(route, "name", "")
        if match is Match.FULL and name in WATCHABLE:
            return await WATCHABLE[name](Request({**scope, **child}))
    raise BadRequest(f"{url!r} is not a live stream of this server")


async def live_mux(request: Request) -> Response:
    """One stream for every live page a browser has open: ``?s=URL`` once per page's
    live URL. Each event is ``m``, its data the indexes of the URLs it belongs to
    (comma-separated, ``*`` for all), a space, the fragment's event name, a newline,
    then the fragment. A run that is gone is left out; the others stay live."""
    watched = request.query_params.getlist("s")
    if not watched or len(watched) > MUX_MAX_WATCHED:
        raise BadRequest(f"a shared stream watches 1 to {MUX_MAX_WATCHED} live URLs")
    owners: dict[Hashable, list[int]] = {}
    views: list[LiveView[AppState]] = []
    for index, url in enumerate(watched):
        try:
            found = await watched_views(request, url)
        except NotFound:
            continue
        for view in found:
            if view.key not in owners:
                owners[view.key] = []
                views.append(view)
            owners[view.key].append(index)
    labels = {key: ",".join(map(str, indexes)) for key, indexes in owners.items()}

    def label(view: LiveView[AppState] | None, event: str, data: str) -> ServerSentEvent:
        to = "*" if view is None else labels[view.key]
        return ServerSentEvent(data=f"{to} {event}\n{data}", event="m")

    return stream(request, views, label, end_when_gone=False)
