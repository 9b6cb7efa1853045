"""What one app process owns, and how a request reaches it.

:class:`AppState` is built by ``create_app``'s lifespan and hangs on ``app.state.localui``;
:func:`context` finds it from a request. The helpers here are the ones every endpoint
needs to reach the app's services: the actions, the approver's name, reads started beside
a page's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar
from urllib.parse import quote, unquote

from starlette.datastructures import FormData
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from localui import runs
from localui.actions import ActionService
from localui.auth import Authenticator, Person
from localui.backends.base import AuditLog, Backend, Deadlines, Store
from localui.backends.traces import SpanIndex
from localui.errors import LifespanNotRun
from localui.keyring import KeyRing
from localui.links import LinkSigner
from localui.live import BrowserStreams, ChangeFeed, LiveRenders
from localui.metrics import AppMetrics
from localui.notify.watcher import Watcher
from localui.offloop import off_loop
from localui.records import SeedProgress
from localui.registry import Registry
from localui.settings import Settings
from localui.signing import Signer

if TYPE_CHECKING:
    # Loaded by the app only when it signs in at an OpenID Provider (its libraries).
    from localui.oidc import OpenIDSignIn

T = TypeVar("T")


class Seeding(Protocol):
    """Runs written into the served store while it is served (``localui demo``).

    The app's lifespan runs it beside the server and cancels it on shutdown; it calls
    ``landed`` with each run's execution id as that run is in the store, and the runs
    list shows ``progress`` until it is finished. ``actions`` is the app's own, for
    what the seeding does through the app once the runs are in (the demo's edits).
    """

    def progress(self) -> SeedProgress: ...

    async def run(self, landed: Callable[[str], None], actions: ActionService) -> object: ...


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
    #: The live pages' shared renders (``views.live``): one render per change for all tabs.
    live_renders: LiveRenders[AppState]
    #: The ``/metrics`` registry and its collectors (:mod:`localui.metrics`).
    metrics: AppMetrics
    #: Where the run pages find the SDK's trace spans; None for a PostgreSQL
    #: store served without ``--traces``.
    traces: SpanIndex | None = None
    #: Work a request started that outlives it (a bulk resume's runs): the lifespan
    #: waits for it before the store closes.
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    #: The live streams each browser holds open (``views.live`` caps them).
    browser_streams: BrowserStreams = field(default_factory=BrowserStreams)
    #: What ``localui demo`` is still writing into the store, or None.
    seeding: Seeding | None = None
    #: Records and sends notifications; None when no target is configured.
    watcher: Watcher | None = None
    #: Sign-in at the team's OpenID Provider; None without ``--oidc-issuer``.
    oidc: OpenIDSignIn | None = None
    #: Mints and reads personal decision links (``localui.links``).
    links: LinkSigner = field(default_factory=lambda: LinkSigner(KeyRing()))
    #: Every change made through localui (``/audit``); None only in an app state
    #: built without the lifespan.
    audit: AuditLog | None = None
    #: The pauses' deadlines (``localui.backends.deadlines``); None when no policy rule
    #: gives a ``due``.
    deadlines: Deadlines | None = None

    @property
    def store(self) -> Store:
        return self.backend.store


def context(request: Request) -> AppState:
    ctx: AppState | None = getattr(request.app.state, "localui", None)
    if ctx is None:
        raise LifespanNotRun()
    return ctx


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


APPROVER_COOKIE = "localui_approver"


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


def actor_of(person: Person, form: FormData, name: str, *, fallback: str = "") -> str:
    """Who acts: a signed-in person as themselves; only with sign-in off is the name
    typed, in the form's field ``name`` (else ``fallback``)."""
    if person.signed_in:
        return person.name
    return str(form.get(name) or fallback)


def actions_of(request: Request) -> ActionService:
    service = context(request).actions
    return service
