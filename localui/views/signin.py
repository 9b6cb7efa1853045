"""``/signin`` and ``/signout``: the page a person without a session sees, and its form.

A sign-in link (``/?token=...``) is handled by :class:`localui.auth.AuthMiddleware`
on any URL; this page is for pasting a token by hand, which keeps it out of the
browser's history, and for being told why a link did not work. It shows nothing
of the store: whoever sees it has not proved who they are.
"""

from __future__ import annotations

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
from localui.settings import Settings
from localui.views.state import context
from localui.views.urls import Urls, urls_of, urls_of_scope


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
    html = templates.get_template("pages/signin.html").render(
        message=message, next_url=next_url, settings=settings, urls=urls
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
    response = RedirectResponse(urls_of(request).path("signin"), status_code=303)
    context(request).auth.clear_session(response, request.scope)
    return response
