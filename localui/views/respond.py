"""HTML or JSON from one view model, and the one place errors become responses.

A view builds one view model (a frozen dataclass) and hands it to
:func:`respond`, which renders it into the page template, into the partial
for an htmx request, or into JSON for ``.json`` URLs and
``Accept: application/json``. Fields marked ``hidden_from_json`` are
presentation only (grouping, pre-formatted text) and stay out of the JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Awaitable, Mapping
from dataclasses import field
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from localui.errors import LocalUIError
from localui.offloop import off_loop
from localui.records import Unreadable
from localui.views.nav import Nav, nav_counts
from localui.views.state import AppState, beside, context
from localui.views.urls import urls_of

#: ``field(metadata=HIDDEN)`` keeps a view-model field out of the JSON.
HIDDEN: Mapping[str, bool] = {"hidden_from_json": True}


def html_only(default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that the HTML needs and the JSON leaves out."""
    if default is dataclasses.MISSING:
        return field(metadata=HIDDEN)
    return field(default=default, metadata=HIDDEN)


#: What JSON holds as it is: most of a page's values, so tested first.
_PLAIN = (str, int, type(None))
#: The JSON fields of each view model class (its dataclass fields less the hidden).
_JSON_FIELDS: dict[type, tuple[str, ...]] = {}


def _json_fields(cls: type) -> tuple[str, ...]:
    names = _JSON_FIELDS.get(cls)
    if names is None:
        names = tuple(
            f.name for f in dataclasses.fields(cls) if not f.metadata.get("hidden_from_json")
        )
        _JSON_FIELDS[cls] = names
    return names


def to_jsonable(value: Any) -> Any:
    """A view model as plain JSON data, leaving out presentation-only fields.

    The plain values come first and each class's fields are listed once: a compare of
    two 50-row runs is some 45,000 values, and asking each whether it was a dataclass,
    then a Mapping, took 3 ms of its answer."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, float):
        # The SDK stores NaN and Infinity as Python's json writes them; strict JSON has
        # no such numbers, so they travel as the words.
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    cls = type(value)
    if hasattr(cls, "__dataclass_fields__"):
        if isinstance(value, Unreadable):
            return {"unreadable": value.error}
        return {name: to_jsonable(getattr(value, name)) for name in _json_fields(cls)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return [to_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
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
        values["nav"] = nav if nav is not None else await page_nav(request, ctx)
    response = ctx.templates.TemplateResponse(request, name, values, status_code=status_code)
    # One URL answers a full page or a fragment, so caches must key on the header.
    response.headers["Vary"] = "HX-Request, Accept"
    return response


async def error_response(request: Request, exc: LocalUIError) -> Response:
    """The one place typed errors become responses: JSON, an htmx fragment, or a page."""
    body = {"status": exc.status_code, "title": exc.title, "message": str(exc)}
    if exc.details:
        body["details"] = to_jsonable(exc.details)
    if wants_json(request):
        return JSONResponse({"error": body}, status_code=exc.status_code)
    ctx: AppState | None = getattr(request.app.state, "localui", None)
    if ctx is None:
        return HTMLResponse(str(exc), status_code=exc.status_code)
    fragment = is_htmx(request)
    name = "partials/_error.html" if fragment else "pages/error.html"
    # A refused action is no reason to lose the badge; a store that is down is.
    nav = None if fragment else await page_nav(request, ctx)
    return ctx.templates.TemplateResponse(
        request,
        name,
        {"error": body, "settings": ctx.settings, "nav": nav, "urls": urls_of(request)},
        status_code=exc.status_code,
    )


def pretty_json(value: Any) -> str:
    """Indented JSON for a ``<pre>``; the template escapes it."""
    if isinstance(value, Unreadable):
        return value.raw
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


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


async def page_nav(request: Request, ctx: AppState) -> Nav:
    """The nav's counts: those :func:`nav_ahead` started for this request, else read now."""
    ahead: Awaitable[Nav] | None = getattr(request.state, "nav_ahead", None)
    if ahead is not None:
        request.state.nav_ahead = None
        return await ahead
    return await off_loop(nav_counts, ctx.store, ctx.settings)
