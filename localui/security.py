"""Who may talk to this server, and how: the Host allowlist and cross-site refusal.

A pure ASGI middleware so it also guards streams. It refuses:

* a request whose ``Host`` is not a name this server answers to, which stops
  DNS rebinding from turning a web page into a client of a loopback server; a
  loopback name (``localhost``) is accepted only from a loopback client, since
  any client on a network can send it;
* an unsafe method (anything but GET, HEAD, OPTIONS) sent cross-site, judged the
  way browsers report it: ``Sec-Fetch-Site`` when present, else ``Origin``
  against ``Host``. No token dance: every browser that can run the pages sends
  one of the two on a cross-site POST.

Read-only mode is not here: each action enforces it itself, so no route can
forget it by being mounted somewhere this middleware does not see.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from localui.auth import is_loopback_client
from localui.settings import LOOPBACK_NAMES

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(host_header: str) -> str:
    """The name part of a ``Host`` header: ``[::1]:8765`` -> ``::1``, ``a:80`` -> ``a``."""
    value = host_header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end != -1 else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class GuardMiddleware:
    def __init__(self, app: ASGIApp, *, host_names: Iterable[str]) -> None:
        self.app = app
        self.host_names = frozenset(name.lower() for name in host_names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        name = host_name(host)
        if name not in self.host_names or (
            name in LOOPBACK_NAMES and not is_loopback_client(scope)
        ):
            await _refuse(scope, send, 400, f"Host {host!r} is not one this server answers to.")
            return
        method = scope.get("method", "GET")
        if method not in SAFE_METHODS:
            reason = cross_site_reason(headers, host)
            if reason is not None:
                await _refuse(scope, send, 403, reason)
                return
        await self.app(scope, receive, send)


def cross_site_reason(headers: dict[str, str], host: str) -> str | None:
    """Why an unsafe request looks cross-site, or None when it is same-origin."""
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None:
        if fetch_site in ("same-origin", "none"):
            return None
        return f"Cross-site request refused (Sec-Fetch-Site: {fetch_site})."
    origin = headers.get("origin")
    if origin is None or origin == "null":
        # Not a browser cross-site form post: scripts and curl send no Origin.
        return None if origin is None else "Cross-site request refused (Origin: null)."
    if urlsplit(origin).netloc.lower() != host.lower():
        return f"Cross-site request refused (Origin {origin} is not this server)."
    return None


async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    accept = headers.get("accept", "")
    if "application/json" in accept or scope.get("path", "").endswith(".json"):
        body = json.dumps({"error": {"status": status, "message": message}}).encode()
        content_type = b"application/json"
    else:
        body = message.encode()
        content_type = b"text/plain; charset=utf-8"
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
