"""Every URL the app hands out, built from route names, under the prefix it is served at.

Ids come from whoever called the SDK: an ``execution_id`` may hold ``/ ? # % \\``
or text outside Latin-1. So ids never enter a URL by string formatting; they go
through the ``id`` path convertor, which tilde-encodes them (as Datasette does):
every byte outside ``[A-Za-z0-9_-]`` becomes ``~XX``. Why not percent-encoding:
Starlette (like most servers and proxies) decodes ``%2F`` to ``/`` before routing,
so ``/runs/a%2Fb`` would reach the router as ``/runs/a/b`` and not match, and a
``{execution_id:path}`` route cannot tell ``/runs/a/rows/b`` (run ``a``, row ``b``)
from a run called ``a/rows/b``. A tilde-encoded segment holds no ``/``, ``%``,
``.``, ``?`` or ``#``, passes every proxy unchanged, and is plain ASCII, so it fits
in ``Location`` and ``HX-Redirect`` headers. Ids made of letters, digits and
dashes (the SDK's own uuids) read the same encoded, and a hand-typed URL with a
plain id still opens: decoding only touches ``~XX``.

The prefix is the request's ``root_path``: where a parent app mounted this one
(``Mount("/ops/localui", app=create_app(...))``) or what ``--root-path`` says a
reverse proxy strips. ``request.url_for`` is not used: mounted, it asks the
parent's router, where another route may bear the same name.
"""

from __future__ import annotations

import re
import socket
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlencode

from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import HTTPConnection
from starlette.routing import Mount, Route, Router
from starlette.types import Scope

from localui.notify.formats import Links
from localui.settings import APP_HOST, LOOPBACK_NAMES, Settings

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_TILDE_BYTE = re.compile(r"(?:~[0-9A-Fa-f]{2})+")
#: A parameter in a route's path format (``/runs/{execution_id}``), as Starlette writes it.
_PARAM = re.compile(r"{([a-zA-Z_][a-zA-Z0-9_]*)}")
#: In element ids, ``~`` would be a CSS combinator inside an htmx target selector.
_DOM_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")


#: Values made only of characters every encoding here leaves as they are (the SDK's uuids):
#: returned at once, which matters for a page that links fifty runs.
_PLAIN = re.compile(r"[A-Za-z0-9-]+")


def tilde_encode(value: str) -> str:
    """``a/b`` -> ``a~2Fb``, ``王`` -> ``~E7~8E~8B``; ``[A-Za-z0-9_-]`` left as it is."""
    if _PLAIN.fullmatch(value):
        return value
    return "".join(chr(b) if b in _SAFE else f"~{b:02X}" for b in value.encode("utf-8"))


def tilde_decode(value: str) -> str:
    """The inverse of :func:`tilde_encode`; anything else in ``value`` stays as it is."""

    def decode(match: re.Match[str]) -> str:
        return unquote(match.group(0).replace("~", "%"))

    return _TILDE_BYTE.sub(decode, value)


def dom_id(value: str) -> str:
    """An id for an HTML ``id`` attribute and a ``#`` selector: ``[A-Za-z0-9-]`` plus
    ``_XX`` for every other byte, so two different ids never share an element id."""
    if _PLAIN.fullmatch(value):
        return value
    return "".join(chr(b) if b in _DOM_SAFE else f"_{b:02X}" for b in value.encode("utf-8"))


class IdConvertor(Convertor[str]):
    """``{name:id}`` in a route: one tilde-encoded path segment."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return tilde_decode(value)

    def to_string(self, value: str) -> str:
        if not value:
            raise ValueError("an id in a URL must not be empty")
        return tilde_encode(value)


# Starlette keeps convertors in one table that routes read when they are built; this
# key is localui's own, so an app that mounts localui keeps its own ``id`` meaning.
ID = "localui_id"
register_url_convertor(ID, IdConvertor())


@dataclass(frozen=True, slots=True)
class RoutePath:
    """A route's path format cut at its parameters: ``("/runs/", "execution_id", "")``."""

    parts: tuple[str, ...]
    convertors: Mapping[str, Convertor[Any]]

    @classmethod
    def of(cls, route: Route | Mount) -> RoutePath:
        return cls(tuple(_PARAM.split(route.path_format)), route.param_convertors)

    def build(self, params: Mapping[str, str]) -> str | None:
        """The path with ``params`` encoded as the router would; None when they are not
        exactly this route's (the router then finds the one they fit)."""
        if params.keys() != self.convertors.keys():
            return None
        parts = list(self.parts)
        for i in range(1, len(parts), 2):
            parts[i] = self.convertors[parts[i]].to_string(params[parts[i]])
        return "".join(parts)


#: :func:`route_paths` by router: ``id(router)`` -> (a reference to it, its paths).
_ROUTE_PATHS: dict[int, tuple[weakref.ref[Router], Mapping[str, RoutePath]]] = {}


def route_paths(router: Router) -> Mapping[str, RoutePath]:
    """Each route's :class:`RoutePath` by name, split once per router rather than once
    per request (a tenth of a millisecond of every page). Routes, and mounts of a bare
    app (``static``): a mount of routes names its own routes, which the router finds.
    Keyed by identity, as a Router compares by value and is not hashable; a router
    added to later finds what it lacks through its own lookup."""
    known = _ROUTE_PATHS.get(id(router))
    if known is not None and known[0]() is router:
        return known[1]
    paths: dict[str, RoutePath] = {}
    for r in reversed(router.routes):
        if isinstance(r, Route) or (isinstance(r, Mount) and not r.routes):
            if r.name is not None:
                paths[r.name] = RoutePath.of(r)
    for key in [k for k, (ref, _) in _ROUTE_PATHS.items() if ref() is None]:
        del _ROUTE_PATHS[key]
    _ROUTE_PATHS[id(router)] = (weakref.ref(router), paths)
    return paths


@dataclass(frozen=True, slots=True)
class Urls:
    """Paths of this app's routes under one prefix; what views and templates link with."""

    #: Left out of equality and hashing (a Router is not hashable): within one app it is
    #: always the same, and live renders are keyed by the prefix.
    router: Router = field(compare=False)
    #: Where the app is served: ``""``, or a mount point / proxy prefix like ``/ops/localui``.
    prefix: str = ""
    #: Each route's path split around its parameters, by name (:func:`route_paths`):
    #: the router's own lookup tries every route in turn, for every link on a page,
    #: and a queue page has a hundred and fifty.
    _paths: dict[str, RoutePath] = field(default_factory=dict, compare=False, repr=False)

    def path(
        self,
        name: str,
        /,
        query: Mapping[str, str | int | None] | None = None,
        fragment: str | None = None,
        **params: str,
    ) -> str:
        """The path of route ``name`` with its ``params`` encoded, then ``?query`` (None
        values left out) and ``#fragment`` (an element id, see :func:`dom_id`)."""
        if not self._paths:
            self._paths.update(route_paths(self.router))
        known = self._paths.get(name)
        built = known.build(params) if known is not None else None
        url = self.prefix + (
            built if built is not None else str(self.router.url_path_for(name, **params))
        )
        if query:
            pairs = {k: v for k, v in query.items() if v is not None and v != ""}
            if pairs:
                url += "?" + urlencode(pairs)
        if fragment:
            url += "#" + quote(fragment, safe="-_")
        return url

    def static(self, file: str) -> str:
        return self.path("static", path=file)

    # Named shortcuts for the links most pages make.

    def runs(self, query: Mapping[str, str | int | None] | None = None) -> str:
        return self.path("runs", query)

    def run(self, execution_id: str, fragment: str | None = None) -> str:
        return self.path("run", fragment=fragment, execution_id=execution_id)

    def row(self, execution_id: str, checkpoint_id: str) -> str:
        return self.path("row_detail", execution_id=execution_id, checkpoint_id=checkpoint_id)

    def approval(self, execution_id: str) -> str:
        return self.path("approval", execution_id=execution_id)


def urls_of(request: HTTPConnection) -> Urls:
    """The URLs as this request's client must see them: under the request's root path."""
    return urls_of_scope(request.scope)


def urls_of_scope(scope: Scope) -> Urls:
    """:func:`urls_of` for middleware, which has the ASGI scope but no request yet."""
    prefix = quote(scope.get("root_path", "").rstrip("/"), safe="/")
    return Urls(router=scope["app"].router, prefix=prefix)


def link_base(settings: Settings) -> str:
    """Where deep links in messages point: ``--public-url``, else this server's own
    address (a wildcard ``--host`` named by the machine's name, loopback by localui's
    own name, where the session cookie lives) under ``--root-path``."""
    if settings.notifications.public_url:
        return settings.notifications.public_url.rstrip("/")
    host = settings.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    elif host in LOOPBACK_NAMES:
        host = APP_HOST
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{settings.port}{settings.root_path}"


def deep_links(router: Router, base: str) -> Links:
    """Absolute links to a pause, a run and a person's decision page under ``base``,
    from the route names."""
    urls = Urls(router=router, prefix=base.rstrip("/"))
    return Links(
        approval=urls.approval,
        run=lambda execution_id: urls.run(execution_id),
        decide=lambda execution_id, link: urls.path(
            "decision_link", execution_id=execution_id, link=link
        ),
    )
