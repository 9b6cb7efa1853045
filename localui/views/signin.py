"""``/signin`` and ``/signout``: the page a person without a session sees, and its form.

A sign-in link (``/?token=...``) is handled by :class:`localui.auth.AuthMiddleware`
on any URL; this page is for pasting a token by hand, which keeps it out of the
browser's history, and for being told why a link did not work. It shows nothing
of the store: whoever sees it has not proved who they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates
from starlette.types import Scope

from localui.auth import (
    SIGNIN_KEY,
    Locked,
    Person,
    SigninAttempt,
    SigninPage,
    SwitchPage,
    client_key,
    person_of,
    safe_next,
    without_token,
)
from localui.errors import NotFound
from localui.settings import Settings
from localui.views.state import context
from localui.views.urls import Urls, urls_of, urls_of_scope

if TYPE_CHECKING:
    # Its libraries (httpx, Authlib, joserfc) load only on a server that signs in at an
    # OpenID Provider, each function below importing it when called: loaded at start
    # they were 16 MB of a server's 68 MB (a 1,000-run store, after its pages).
    from localui.oidc import OpenIDSignIn


def signin_page_renderer(templates: Jinja2Templates, settings: Settings) -> SigninPage:
    """The sign-in page as the middleware answers it, for the URL that was asked for."""

    def render(scope: Scope, message: str, status: int) -> Response:
        here = without_token(scope)
        root = scope.get("root_path", "")
        # After signing in the browser GETs this: an action's URL would only answer 405.
        looked = scope.get("method") in ("GET", "HEAD") and not here.endswith("/signin")
        next_url = here if looked else root + "/"
        return _page(templates, settings, urls_of_scope(scope), message, next_url, status)

    return render


def switch_page_renderer(templates: Jinja2Templates, settings: Settings) -> SwitchPage:
    """What a sign-in link for someone else answers a browser already signed in: who
    is signed in, whom the link signs in, and a button to switch (a POST, so another
    site cannot press it); nothing changes until it is pressed."""

    def render(scope: Scope, current: Person, offered: Person, token: str) -> Response:
        html = templates.get_template("pages/signin_switch.html").render(
            current=current,
            offered=offered,
            token=token,
            next_url=without_token(scope),
            settings=settings,
            urls=urls_of_scope(scope),
        )
        return HTMLResponse(html, status_code=200, headers={"Cache-Control": "no-store"})

    return render


def _page(
    templates: Jinja2Templates,
    settings: Settings,
    urls: Urls,
    message: str,
    next_url: str,
    status: int,
) -> Response:
    oidc = settings.sign_in.oidc
    html = templates.get_template("pages/signin.html").render(
        message=message,
        next_url=next_url,
        settings=settings,
        urls=urls,
        provider=urlsplit(oidc.issuer).netloc if oidc is not None else "",
    )
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


async def signin(request: Request) -> Response:
    ctx = context(request)
    root = request.scope.get("root_path", "")
    next_url = safe_next(request.query_params.get("next", ""), root)
    if request.method == "GET":
        if person_of(request).signed_in:
            return RedirectResponse(next_url, status_code=303)
        return _page(ctx.templates, ctx.settings, urls_of(request), "", next_url, 200)
    form = await request.form()
    next_url = safe_next(str(form.get("next") or ""), root)
    auth = ctx.auth
    client = client_key(request.scope)
    try:
        found = await auth.check_token(str(form.get("token") or "").strip(), client)
    except Locked as exc:
        request.scope[SIGNIN_KEY] = SigninAttempt(None, "form")
        response = _page(ctx.templates, ctx.settings, urls_of(request), str(exc), next_url, 429)
        response.headers["Retry-After"] = str(max(1, round(exc.seconds)))
        return response
    if found is None:
        request.scope[SIGNIN_KEY] = SigninAttempt(None, "form")
        message = "That token is not valid (or no longer is): ask for a new one."
        return _page(ctx.templates, ctx.settings, urls_of(request), message, next_url, 401)
    person, mark = found
    request.scope[SIGNIN_KEY] = SigninAttempt(person, "form")
    response = RedirectResponse(next_url, status_code=303)
    auth.set_session(response, request.scope, person, mark)
    return response


async def signout(request: Request) -> Response:
    auth = context(request).auth
    response = RedirectResponse(urls_of(request).path("signin"), status_code=303)
    value = request.cookies.get(auth.cookie_name(request.scope))
    if value:
        # Ended for every process on the store, not only forgotten by this browser.
        await auth.end_session(value)
    auth.clear_session(response, request.scope)
    return response


# --- sign-in at the team's OpenID Provider (localui.oidc) -----------------------------


def _oidc(request: Request) -> OpenIDSignIn:
    oidc = context(request).oidc
    if oidc is None:
        raise NotFound("this server does not sign in with an OpenID Provider (--oidc-issuer)")
    return oidc


def _callback_url(request: Request) -> str:
    """Where the provider sends the browser back: under ``--public-url`` when set (what
    is registered at the provider), else this server's own address."""
    from localui.oidc import CALLBACK_PATH

    ctx = context(request)
    public = ctx.settings.notifications.public_url
    if public:
        return public.rstrip("/") + CALLBACK_PATH
    scheme = "https" if ctx.auth.over_tls(request.scope) else "http"
    root = request.scope.get("root_path", "").rstrip("/")
    return f"{scheme}://{request.url.netloc}{root}{CALLBACK_PATH}"


def _flow_cookie(request: Request, response: Response, oidc: OpenIDSignIn, value: str) -> None:
    from localui.oidc import FLOW_SECONDS

    tls = context(request).auth.over_tls(request.scope)
    response.set_cookie(
        oidc.cookie,
        value,
        max_age=FLOW_SECONDS if value else 0,
        path=request.scope.get("root_path") or "/",
        httponly=True,
        # Lax: the provider's redirect back is a top-level GET from another site.
        samesite="lax",
        secure=tls,
    )


async def oidc_start(request: Request) -> Response:
    """Off to the provider, with a fresh state, nonce and PKCE verifier in a cookie."""
    from localui.oidc import Refused

    ctx = context(request)
    oidc = _oidc(request)
    next_url = safe_next(request.query_params.get("next", ""), request.scope.get("root_path", ""))
    if person_of(request).signed_in:
        return RedirectResponse(next_url, status_code=303)
    try:
        url, value = await oidc.start(next_url, _callback_url(request))
    except Refused as exc:
        return _page(ctx.templates, ctx.settings, urls_of(request), str(exc), next_url, exc.status)
    response = RedirectResponse(url, status_code=303)
    _flow_cookie(request, response, oidc, value)
    return response


async def oidc_callback(request: Request) -> Response:
    """Back from the provider: the state checked, the code traded, the ID token checked,
    the person signed in with the role their groups give; else a page that says why."""
    from localui.oidc import Refused

    ctx = context(request)
    oidc = _oidc(request)
    home = (request.scope.get("root_path") or "") + "/"
    try:
        person, flow = await oidc.finish(
            dict(request.query_params), request.cookies.get(oidc.cookie), _callback_url(request)
        )
    except Refused as exc:
        request.scope[SIGNIN_KEY] = SigninAttempt(None, "oidc")  # for the audit log
        response = _page(ctx.templates, ctx.settings, urls_of(request), str(exc), home, exc.status)
    else:
        request.scope[SIGNIN_KEY] = SigninAttempt(person, "oidc")
        response = RedirectResponse(flow.next_url, status_code=303)
        ctx.auth.set_session(response, request.scope, person, "")
    # Spent either way: the same answer from the provider cannot be brought back.
    _flow_cookie(request, response, oidc, "")
    return response
