"""``create_app``: the Starlette app, built from routes, middleware and a lifespan."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from jinja2.bccache import Bucket, FileSystemBytecodeCache
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp

from localui.actions import ActionService
from localui.auditing import AuditMiddleware, AuditRecorder
from localui.auth import Authenticator, AuthMiddleware, template_values
from localui.backends import open_backend
from localui.backends.base import Backend, Changes
from localui.backends.traces import SpanIndex
from localui.backends.users import new_token
from localui.contexts import RunContexts
from localui.deadlines import DeadlineSweep
from localui.errors import LocalUIError, NotFound, Unavailable
from localui.links import LinkSigner
from localui.live import ChangeFeed, LiveRenders
from localui.metrics import RequestTiming, app_metrics
from localui.notify.events import Event
from localui.notify.people import People
from localui.notify.watcher import Watcher, make_watcher
from localui.offloop import off_loop
from localui.paths import cache_dir, static_dir, templates_dir
from localui.recovery import RecoverySweep
from localui.registry import Registry
from localui.security import BodyLimitMiddleware, GuardMiddleware, SecurityHeadersMiddleware
from localui.settings import Settings
from localui.signing import Signer
from localui.views import actions as action_views
from localui.views import approvals as approval_views
from localui.views import attention as attention_views
from localui.views import audit as audit_views
from localui.views import bulk_decide as bulk_decide_views
from localui.views import bulk_resume as bulk_resume_views
from localui.views import bundle as bundle_views
from localui.views import cache as cache_views
from localui.views import compare as compare_views
from localui.views import decide as decide_views
from localui.views import decisions as decision_views
from localui.views import diff as diff_views
from localui.views import edit as edit_views
from localui.views import fork as fork_views
from localui.views import live as live_views
from localui.views import me as me_views
from localui.views import metrics as metrics_views
from localui.views import notes as note_views
from localui.views import notifications as notification_views
from localui.views import row as row_views
from localui.views import run as run_views
from localui.views import runs as runs_views
from localui.views import signin as signin_views
from localui.views.cards import QueueCards
from localui.views.looks import OneLookPerRead
from localui.views.markup import code_spans
from localui.views.respond import error_response
from localui.views.state import AppState, Seeding
from localui.views.statics import PageCompression, PrecompressedStatics
from localui.views.urls import deep_links, dom_id, link_base

Endpoint = Callable[[Request], Awaitable[Response]]


def as_json(endpoint: Endpoint) -> Endpoint:
    """The same endpoint, answering JSON: serves the ``.json`` twin of a page URL."""

    async def json_endpoint(request: Request) -> Response:
        request.scope["localui.format"] = "json"
        return await endpoint(request)

    json_endpoint.__name__ = f"{endpoint.__name__}_json"
    return json_endpoint


def page_routes(path: str, endpoint: Endpoint, name: str) -> list[Route]:
    """A page and its ``.json`` twin; the twin comes first so ``x.json`` is not an id."""
    return [
        Route(f"{path}.json", as_json(endpoint), name=f"{name}_json"),
        Route(path, endpoint, name=name),
    ]


def build_routes() -> list[Route | Mount]:
    return [
        Route("/", runs_views.runs_list, name="runs"),
        Route("/runs.json", as_json(runs_views.runs_list), name="runs_json"),
        Route("/runs", runs_views.runs_list, name="runs_alias"),
        *page_routes(
            "/runs/{execution_id:localui_id}/rows/{checkpoint_id:localui_id}",
            row_views.row_detail,
            "row_detail",
        ),
        *page_routes("/runs/{execution_id:localui_id}/diff", diff_views.run_diff, "run_diff"),
        *page_routes("/diff", diff_views.rows_diff, "diff"),
        *page_routes("/compare", compare_views.compare_runs, "compare"),
        Route("/compare/pair", compare_views.compare_pair, name="compare_pair"),
        Route("/runs/{execution_id:localui_id}/bundle", bundle_views.run_bundle, name="run_bundle"),
        *page_routes(
            "/runs/{execution_id:localui_id}/fork", fork_views.fork_preview, "fork_preview"
        ),
        *page_routes("/runs/{execution_id:localui_id}/edit", edit_views.edit_page, "edit_row"),
        *page_routes("/runs/{execution_id:localui_id}", run_views.run_page, "run"),
        Route(
            "/runs/bulk-resume",
            bulk_resume_views.bulk_resume,
            methods=["POST"],
            name="bulk_resume",
        ),
        Route(
            "/runs/{execution_id:localui_id}/resume",
            action_views.resume_run,
            methods=["POST"],
            name="resume_run",
        ),
        Route(
            "/runs/{execution_id:localui_id}/reopen",
            action_views.reopen_pause,
            methods=["POST"],
            name="reopen_pause",
        ),
        Route(
            "/runs/{execution_id:localui_id}/edit/preview",
            edit_views.edit_preview,
            methods=["POST"],
            name="edit_preview",
        ),
        Route(
            "/runs/{execution_id:localui_id}/fork",
            action_views.fork_run,
            methods=["POST"],
            name="fork_run",
        ),
        *page_routes("/approvals", approval_views.approvals_list, "approvals"),
        Route(
            "/approvals/bulk", bulk_decide_views.bulk_decide, methods=["POST"], name="bulk_decide"
        ),
        *page_routes(
            "/approvals/{execution_id:localui_id}", approval_views.approval_detail, "approval"
        ),
        Route(
            "/approvals/{execution_id:localui_id}/context",
            approval_views.approval_context,
            name="approval_context",
        ),
        Route(
            "/approvals/{execution_id:localui_id}/approve",
            approval_views.approve,
            methods=["POST"],
            name="approve",
        ),
        Route(
            "/approvals/{execution_id:localui_id}/reject",
            approval_views.reject,
            methods=["POST"],
            name="reject",
        ),
        Route(
            "/approvals/{execution_id:localui_id}/notes",
            note_views.add_note,
            methods=["POST"],
            name="add_note",
        ),
        *page_routes("/cache", cache_views.store_cache, "cache"),
        *page_routes("/notifications", notification_views.notifications_page, "notifications"),
        *page_routes("/attention", attention_views.attention_list, "attention"),
        Route("/decisions.csv", decision_views.decisions_csv, name="decisions_csv"),
        Route("/audit.csv", audit_views.audit_csv, name="audit_csv"),
        *page_routes("/audit", audit_views.audit_list, "audit"),
        *page_routes("/decisions", decision_views.decisions_list, "decisions"),
        Route("/metrics", metrics_views.metrics_page, name="metrics"),
        Route("/live/nav", live_views.live_nav, name="live_nav"),
        Route("/live/runs", live_views.live_runs, name="live_runs"),
        Route("/live/runs/{execution_id:localui_id}", live_views.live_run, name="live_run"),
        Route("/live/approvals", live_views.live_approvals, name="live_approvals"),
        Route(
            "/live/approvals/{execution_id:localui_id}",
            live_views.live_approval,
            name="live_approval",
        ),
        Route("/live/mux", live_views.live_mux, name="live_mux"),
        Route("/prune.json", as_json(action_views.prune_preview), name="prune_json"),
        Route("/prune", action_views.prune_preview, methods=["GET"], name="prune"),
        Route("/prune", action_views.prune_now, methods=["POST"], name="prune_now"),
        Route(
            "/decide/{execution_id:localui_id}/{link}",
            decide_views.decision_link,
            methods=["GET"],
            name="decision_link",
        ),
        Route(
            "/decide/{execution_id:localui_id}",
            decide_views.decide_by_link,
            methods=["POST"],
            name="decide_by_link",
        ),
        Route("/signin", signin_views.signin, methods=["GET", "POST"], name="signin"),
        Route("/signout", signin_views.signout, methods=["POST"], name="signout"),
        Route("/me/away", me_views.me_away, methods=["POST"], name="me_away"),
        Route("/me/back", me_views.me_back, methods=["POST"], name="me_back"),
        Route("/signin/oidc", signin_views.oidc_start, name="signin_oidc"),
        Route("/signin/oidc/callback", signin_views.oidc_callback, name="signin_oidc_callback"),
        Mount("/static", app=PrecompressedStatics(static_dir()), name="static"),
    ]


async def _typed_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LocalUIError)
    return await error_response(request, exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if request.url.path.endswith(".json"):
        # No route answered, so no ``.json`` twin set the format: a script asked for JSON.
        request.scope["localui.format"] = "json"
    if exc.status_code == 404:
        return await error_response(request, NotFound(f"nothing at {request.url.path}"))
    error = LocalUIError(exc.detail)
    error.status_code = exc.status_code
    error.title = exc.detail
    return await error_response(request, error)


class LocalUIApp(Starlette):
    """Starlette with the security headers outside everything, so the server-error
    page Starlette's outermost middleware writes carries them too."""

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeadersMiddleware(super().build_middleware_stack())


def lifespan_of(app: Starlette) -> AbstractAsyncContextManager[Any]:
    """The lifespan of an app made by :func:`create_app`, for a parent app that mounts it.

    Starlette runs the lifespan of the outermost app only, and localui's opens the
    store, the decision log and the change feed. So a parent enters this one in its
    own lifespan::

        ui = create_app(Settings(store=...))

        @contextlib.asynccontextmanager
        async def lifespan(app):
            async with lifespan_of(ui):
                yield

        app = Starlette(routes=[Mount("/ops/localui", app=ui)], lifespan=lifespan)
    """
    return app.router.lifespan_context(app)


def trace_index(settings: Settings, backend: Backend) -> SpanIndex | None:
    """The spans of ``--traces``, else of a SQLite store's own file (the SDK traces
    into the same ``local.db``); a PostgreSQL store has no file of its own to look in."""
    path = settings.traces or (
        str(backend.target.sqlite_path) if backend.target.sqlite_path is not None else None
    )
    return SpanIndex(path) if path is not None else None


class TemplateCache(FileSystemBytecodeCache):
    """Compiled templates kept in the cache directory between starts (Jinja checks each
    against its source); one that cannot be read or written only costs a compile."""

    def __init__(self, directory: Path) -> None:
        with contextlib.suppress(OSError):
            directory.mkdir(parents=True, exist_ok=True)
        super().__init__(str(directory))

    def load_bytecode(self, bucket: Bucket) -> None:
        with contextlib.suppress(OSError):
            super().load_bytecode(bucket)

    def dump_bytecode(self, bucket: Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def create_app(
    settings: Settings,
    *,
    agents: Iterable[Any] = (),
    contexts: RunContexts | None = None,
    backend: Backend | None = None,
    seeding: Seeding | None = None,
) -> Starlette:
    """The app for one store: ``backend``, or the one ``settings.store`` names, opened
    by the lifespan (and then closed by it too). ``agents`` are those this process
    may resume; they must already be bound to the store (``localui.registry``), and
    ``contexts`` makes the ``RunContext`` each resume and fork hands their tools.
    ``seeding`` writes runs into the store while it is served (``localui demo``): the
    lifespan starts it and cancels it on shutdown."""
    templates = Jinja2Templates(
        directory=str(templates_dir()),
        context_processors=[template_values, me_views.me_values],
    )
    # The templates ship with the package and do not change under a running app;
    # checking each one's file on every render cost a dozen stat calls per page.
    templates.env.auto_reload = False
    # Compiled once and kept between starts: a page's templates took 25 ms of a start's
    # first answer to compile (1 ms to load compiled).
    templates.env.bytecode_cache = TemplateCache(cache_dir() / "templates")
    templates.env.filters["dom_id"] = dom_id
    templates.env.filters["code_spans"] = code_spans
    templates.env.globals["queue_card"] = QueueCards().template_global()
    auth = Authenticator(
        settings.sign_in, port=settings.port, token=settings.sign_in.token or new_token()
    )
    # The registry is the app's own, made before the lifespan so the request timer
    # (a middleware) holds it; the fleet it reads is opened by the lifespan.
    metrics = app_metrics(settings)
    auth.scraper_token = metrics.token
    oidc = None
    if settings.sign_in.oidc is not None:
        # Imported only here: its libraries are a server's memory for nothing otherwise.
        from localui.oidc import OpenIDSignIn

        oidc = OpenIDSignIn(settings.sign_in.oidc, auth.keys)
    # Held by the middleware from the start; the lifespan opens the log it writes.
    recorder = AuditRecorder()
    links = LinkSigner(auth.keys, settings.notifications.link_ttl)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        owned = backend is None
        opened = backend if backend is not None else open_backend(settings)
        templates.env.globals["store_label"] = opened.label
        registry = Registry(agents={a.name: a for a in agents})
        decisions = opened.decision_log(
            writable=not settings.read_only, lease_seconds=settings.claim_lease_seconds
        )
        if settings.sign_in.required:
            auth.users = opened.users(writable=False)
        auth.keys.open(opened.session_keys(writable=not settings.read_only))
        # A read-only server changes nothing, so it records nothing; it still reads.
        audit_log = opened.audit_log(writable=not settings.read_only)
        if not settings.read_only:
            recorder.log = audit_log
        notes = opened.notes(writable=not settings.read_only)
        actions = ActionService(
            settings=settings,
            store=opened.store,
            store_kind=opened.kind,
            registry=registry,
            decisions=decisions,
            make_checkpointer=opened.checkpointer,
            contexts=contexts,
            users=auth.users,
            notes=notes,
        )
        feed = ChangeFeed(opened.change_source(), interval=settings.poll_interval)
        watcher: Watcher | None = None
        # People told at their own address, with links of their own: they sign in, so
        # only where sign-in is on; and the outbox is a table, so not read-only.
        people = None
        if settings.sign_in.required and not settings.read_only:
            people = People(auth.users, settings.policy)

        def new_watcher() -> Watcher:
            return make_watcher(
                settings,
                feed=feed,
                backend=opened,
                decisions=decisions,
                links=deep_links(app.router, link_base(settings)),
                people=people,
                link_signer=links,
                notes=notes,
            )

        # Read-only writes nothing, and the outbox is a table (the CLI refuses the pair).
        if settings.notifies or (people is not None and await off_loop(people.any_address)):
            watcher = new_watcher()
        traces = trace_index(settings, opened)
        # The pauses' deadlines, when a rule gives any: the queue sorts by them, and a
        # writable server escalates and decides them (``localui.deadlines``).
        has_deadlines = settings.policy is not None and settings.policy.has_deadlines
        deadlines = opened.deadlines(writable=not settings.read_only) if has_deadlines else None
        app.state.localui = AppState(
            settings=settings,
            backend=opened,
            templates=templates,
            registry=registry,
            actions=actions,
            feed=feed,
            traces=traces,
            auth=auth,
            signer=Signer(auth.keys),
            links=links,
            oidc=oidc,
            live_renders=LiveRenders(feed=feed),
            metrics=metrics,
            seeding=seeding,
            watcher=watcher,
            audit=audit_log,
            deadlines=deadlines,
        )
        metrics.fleet.open(opened.store, decisions)
        # A read-only server changes nothing, so it carries no decision out either.
        recovery = None if settings.read_only else RecoverySweep(actions)
        await feed.start()
        if watcher is not None:
            await watcher.start()

        async def start_when_addressed() -> None:
            """On a server with no targets of its own, start announcing once someone is
            given an address (``localui users set NAME --notify URL``)."""
            nonlocal watcher
            assert people is not None
            while watcher is None:
                await asyncio.sleep(settings.notifications.sweep_interval)
                try:
                    addressed = await off_loop(people.any_address)
                except Unavailable:
                    continue  # the store is down: the next look tells
                if addressed:
                    watcher = new_watcher()
                    app.state.localui.watcher = watcher
                    await watcher.start()

        addressing = None
        if watcher is None and people is not None:
            addressing = asyncio.create_task(start_when_addressed(), name="localui addresses")
        seeder = None
        if seeding is not None:

            def landed(run: str) -> None:
                # Announced at once, so open pages show the run (and the progress
                # line moves) without waiting for the feed's next poll.
                feed.publish(Changes(runs=frozenset({run})))

            seeder = asyncio.create_task(seeding.run(landed, actions), name="localui seeding")
        if recovery is not None:
            await recovery.start()
        sweep = None
        if deadlines is not None and not settings.read_only:

            def record(events: Sequence[Event]) -> int:
                # The watcher as it is now: one may start later (start_when_addressed).
                current = app.state.localui.watcher
                return current.record(events) if current is not None else 0

            sweep = DeadlineSweep(actions, deadlines, record=record)
            await sweep.start()
        try:
            yield
        finally:
            if sweep is not None:
                await sweep.stop()
            if recovery is not None:
                await recovery.stop()
            if seeder is not None:
                seeder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await seeder
            if addressing is not None:
                addressing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await addressing
            if watcher is not None:
                await watcher.stop()
                watcher.outbox.close()
            # Ends every open live stream with the app.
            await feed.stop()
            # A bulk resume's runs finish before the store they write to closes.
            await asyncio.gather(*app.state.localui.background, return_exceptions=True)
            metrics.fleet.close()
            decisions.close()
            if deadlines is not None:
                deadlines.close()
            recorder.log = None
            audit_log.close()
            notes.close()
            if traces is not None:
                traces.close()
            if auth.users is not None:
                auth.users.close()
                auth.users = None
            auth.keys.close()
            if owned:
                opened.close()

    return LocalUIApp(
        routes=build_routes(),
        middleware=[
            # Outside the guards and sign-in, so what they refuse is recorded too.
            Middleware(AuditMiddleware, recorder=recorder),
            Middleware(RequestTiming, metrics=metrics),
            Middleware(GuardMiddleware, host_names=settings.host_names),
            Middleware(BodyLimitMiddleware),
            Middleware(
                AuthMiddleware,
                auth=auth,
                signin_page=signin_views.signin_page_renderer(templates, settings),
                switch_page=signin_views.switch_page_renderer(templates, settings),
                # A decision link's page checks its own link (``views.decide``).
                public=("/static/", "/decide/"),
            ),
            Middleware(PageCompression),
            Middleware(OneLookPerRead),
        ],
        exception_handlers={LocalUIError: _typed_error, HTTPException: _http_error},
        lifespan=lifespan,
    )
