"""What every endpoint shares: the app state, HTML-or-JSON responses, errors.

A view builds one view model (a frozen dataclass) and hands it to
:func:`respond`, which renders it into the page template, into the partial
for an htmx request, or into JSON for ``.json`` URLs and
``Accept: application/json``. Fields marked ``hidden_from_json`` are
presentation only (grouping, pre-formatted text) and stay out of the JSON.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import math
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localui import runs
from localui.actions import ActionService
from localui.auth import Authenticator
from localui.backends import looks
from localui.backends.base import Backend, Store
from localui.backends.traces import SpanIndex
from localui.errors import LifespanNotRun, LocalUIError
from localui.live import ChangeFeed
from localui.notify.watcher import Watcher
from localui.records import SeedProgress, Unreadable
from localui.registry import Registry
from localui.settings import Settings
from localui.signing import Signer
from localui.views.params import parse_cursor
from localui.views.urls import urls_of

if TYPE_CHECKING:
    from localui.views.live import LiveRenders

T = TypeVar("T")

#: ``field(metadata=HIDDEN)`` keeps a view-model field out of the JSON.
HIDDEN: Mapping[str, bool] = {"hidden_from_json": True}


def html_only(default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that the HTML needs and the JSON leaves out."""
    if default is dataclasses.MISSING:
        return field(metadata=HIDDEN)
    return field(default=default, metadata=HIDDEN)


class Seeding(Protocol):
    """Runs written into the served store while it is served (``localui demo``).

    The app's lifespan runs it beside the server and cancels it on shutdown; it calls
    ``landed`` with each run's execution id as that run is in the store, and the runs
    list shows ``progress`` until it is finished.
    """

    def progress(self) -> SeedProgress: ...

    async def run(self, landed: Callable[[str], None]) -> object: ...


@dataclass(slots=True)
class AppState:
    """What one app process owns; built by ``create_app``'s lifespan, on
    ``app.state.localui``, and reached from requests with :func:`context`."""

    settings: Settings
    backend: Backend
    templates: Jinja2Templates
    registry: Registry
    actions: ActionService
    feed: ChangeFeed
    #: Who may use the server: tokens, sessions, the proxy header, and the users
    #: table it reads (the auth middleware holds the same one).
    auth: Authenticator
    #: Signs the values a page hands out to be posted back unchanged (the prune cutoff).
    signer: Signer
    #: Where the run pages find the SDK's trace spans; None for a PostgreSQL
    #: store served without ``--traces``.
    traces: SpanIndex | None = None
    #: The live pages' shared renders, made with the first stream (``views.live``).
    live_renders: LiveRenders | None = None
    #: Work a request started that outlives it (a bulk resume's runs): the lifespan
    #: waits for it before the store closes.
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    #: The ``/metrics`` registry and its collectors (``views.metrics``).
    metrics: Any = None
    #: What ``localui demo`` is still writing into the store, or None.
    seeding: Seeding | None = None
    #: Records and sends notifications; None when no target is configured.
    watcher: Watcher | None = None

    @property
    def store(self) -> Store:
        return self.backend.store


def context(request: Request) -> AppState:
    ctx: AppState | None = getattr(request.app.state, "localui", None)
    if ctx is None:
        raise LifespanNotRun()
    return ctx


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run blocking store work in the thread pool, never on the event loop."""
    return await run_in_threadpool(fn, *args)


class OneLookPerRead:
    """Each read request (GET or HEAD) is one look at the runs index until its answer
    starts (:mod:`localui.backends.looks`): its questions bring the index up to date
    once between them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        with looks.one_look() as look:

            async def answering(message: Message) -> None:
                if message["type"] == "http.response.start":
                    # A stream goes on after this: each of its reads looks afresh.
                    look.open = False
                await send(message)

            await self.app(scope, receive, answering)


def to_jsonable(value: Any) -> Any:
    """A view model as plain JSON data, leaving out presentation-only fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if isinstance(value, Unreadable):
            return {"unreadable": value.error}
        return {
            f.name: to_jsonable(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not f.metadata.get("hidden_from_json")
        }
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        # The SDK stores NaN and Infinity as Python's json writes them; strict JSON has
        # no such numbers, so they travel as the words.
        return str(value)
    return value


def wants_json(request: Request) -> bool:
    """``.json`` routes set ``format``; otherwise the Accept header decides."""
    if request.scope.get("localui.format") == "json":
        return True
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "text/html" not in accept


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


async def respond(
    request: Request,
    template: str,
    page: Any,
    *,
    partial: str | None = None,
    status_code: int = 200,
    nav: Nav | None = None,
) -> Response:
    """Render ``page`` as JSON, as the htmx partial, or as the full page with its nav
    (``nav`` when the caller has just counted it, else counted here)."""
    if wants_json(request):
        return JSONResponse(to_jsonable(page), status_code=status_code)
    ctx = context(request)
    fragment = partial is not None and is_htmx(request)
    name = partial if fragment and partial is not None else template
    values: dict[str, Any] = {"page": page, "settings": ctx.settings, "urls": urls_of(request)}
    if not fragment:
        values["nav"] = nav if nav is not None else await _nav(request, ctx)
    response = ctx.templates.TemplateResponse(request, name, values, status_code=status_code)
    # One URL answers a full page or a fragment, so caches must key on the header.
    response.headers["Vary"] = "HX-Request, Accept"
    return response


def nav_ahead(request: Request, *, partial: bool = False) -> None:
    """Start counting the nav's badges beside the page's own reads, when the answer will
    be a full page: not JSON, nor the htmx fragment of a page that has one (``partial``).

    On PostgreSQL the nav is a statement of every page; read on a pooled connection of
    its own, it is answered while the page's reads are, not after them. :func:`respond`
    (or the error page) takes it; a page that fails otherwise leaves it to finish."""
    if wants_json(request) or (partial and is_htmx(request)):
        return
    ctx = context(request)
    request.state.nav_ahead = beside(ctx, nav_counts, ctx.store, ctx.settings)


def beside(ctx: AppState, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
    """``fn(*args)``, a read to await later. On PostgreSQL it starts now, in the thread
    pool, and goes on while the caller makes its own reads: each is a round trip, and
    the server answers them at once on pooled connections of their own. A SQLite read
    runs in this process, where a second thread only adds a handoff (0.3-0.5 ms a page,
    measured): it is made when awaited. One nobody awaits (the page failed first)
    finishes on its own, its error no error of the page's."""
    if ctx.backend.kind != runs.POSTGRES:
        return _Later(fn, args)
    future = asyncio.ensure_future(off_loop(fn, *args))
    future.add_done_callback(_leave_unawaited)
    return future


class _Later(Generic[T]):
    """A read made when awaited (and not at all when never awaited)."""

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        self._fn = fn
        self._args = args

    def __await__(self) -> Generator[Any, None, T]:
        return off_loop(self._fn, *self._args).__await__()


def _leave_unawaited(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _nav(request: Request, ctx: AppState) -> Nav:
    """The nav's counts: those :func:`nav_ahead` started for this request, else read now."""
    ahead: Awaitable[Nav] | None = getattr(request.state, "nav_ahead", None)
    if ahead is not None:
        request.state.nav_ahead = None
        return await ahead
    return await off_loop(nav_counts, ctx.store, ctx.settings)


@dataclass(frozen=True, slots=True)
class Nav:
    """What the navigation bar shows on every page: the approvals badge, and how many
    runs need a person (None when the runs index cannot say yet)."""

    pending: int
    attention: int | None = None


def attention_cutoffs(settings: Settings, now: datetime) -> tuple[str, str]:
    """``(stale_before, overdue_before)``: the instants before which an unfinished run
    is stalled and a pause overdue, as of ``now``."""
    return runs.cutoff(now, settings.stale_after), runs.cutoff(now, settings.remind_after)


def attention_total(store: Store, settings: Settings) -> int | None:
    """The runs that need a person, each once; None when the runs index cannot say."""
    stale_before, overdue_before = attention_cutoffs(settings, datetime.now(UTC))
    try:
        return store.attention_counts(stale_before, overdue_before).total
    except LocalUIError:
        return None


def nav_counts(store: Store, settings: Settings | None = None) -> Nav:
    """The nav's badges; the attention badge only when ``settings`` says its cutoffs.
    Both from the fleet's counts when the runs index has them (one statement on
    PostgreSQL, where the nav is a round trip of every page)."""
    if settings is not None:
        stale_before, overdue_before = attention_cutoffs(settings, datetime.now(UTC))
        try:
            fleet = store.fleet_counts(stale_before, overdue_before)
        except LocalUIError:
            fleet = None
        if fleet is not None:
            return Nav(pending=fleet.pending, attention=fleet.attention.total)
    attention = attention_total(store, settings) if settings is not None else None
    try:
        return Nav(pending=store.count_pending(), attention=attention)
    except LocalUIError:
        return Nav(pending=0, attention=attention)


async def error_response(request: Request, exc: LocalUIError) -> Response:
    """The one place typed errors become responses: JSON, an htmx fragment, or a page."""
    body = {"status": exc.status_code, "title": exc.title, "message": str(exc)}
    extra = getattr(exc, "details", None)
    if extra:
        body["details"] = to_jsonable(extra)
    if wants_json(request):
        return JSONResponse({"error": body}, status_code=exc.status_code)
    ctx: AppState | None = getattr(request.app.state, "localui", None)
    if ctx is None:
        return HTMLResponse(str(exc), status_code=exc.status_code)
    fragment = is_htmx(request)
    name = "partials/_error.html" if fragment else "pages/error.html"
    # A refused action is no reason to lose the badge; a store that is down is.
    nav = None if fragment else await _nav(request, ctx)
    return ctx.templates.TemplateResponse(
        request,
        name,
        {"error": body, "settings": ctx.settings, "nav": nav, "urls": urls_of(request)},
        status_code=exc.status_code,
    )


def encode_cursor(key: tuple[str, str]) -> str:
    raw = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str, name: str = "after") -> tuple[str, str]:
    """A cursor from ``next``; anything else is a 400 that says what was wrong."""
    return parse_cursor(text, name)


def pretty_json(value: Any) -> str:
    """Indented JSON for a ``<pre>``; the template escapes it."""
    if isinstance(value, Unreadable):
        return value.raw
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)
