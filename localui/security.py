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

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


# --- headers every response carries, and the body cap ----------------------------------

#: No inline script or style anywhere: htmx is configured (``htmx-config`` in base.html)
#: to need no ``eval`` and to inject no indicator style, so 'self' is enough for both.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
#: Everything a POST may carry: an action's form is a few short fields.
MAX_BODY_BYTES = 1_000_000


class SecurityHeadersMiddleware:
    """Adds the security headers to every response, ``Cache-Control: no-store`` to JSON
    (errors too) and to the answers of actions, and ``Vary: Accept`` to every page and
    JSON answer of a URL where the ``Accept`` header chose between them, so no cache
    hands one's answer to the other.

    Pure ASGI rather than the ``secure`` package: ``secure`` sets headers on a
    framework's response object, and this must also reach event streams, static files,
    the guard's refusals and the server-error page, which only the ASGI messages all see.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        is_action = scope.get("method", "GET") not in SAFE_METHODS
        # ``.json`` URLs answer JSON whatever Accept says; the others choose by it.
        by_accept = not scope.get("path", "").endswith(".json")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in _REPLACED_HEADERS
                ]
                headers.extend(SECURITY_HEADERS)
                content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                is_json = content_type.startswith(b"application/json")
                if is_action or is_json:
                    headers = [(k, v) for k, v in headers if k.lower() != b"cache-control"]
                    headers.append((b"cache-control", b"no-store"))
                if by_accept and (is_json or content_type.startswith(b"text/html")):
                    headers = _vary_on_accept(headers)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


_REPLACED_HEADERS = frozenset(name for name, _ in SECURITY_HEADERS) | {b"server"}


def _vary_on_accept(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``Accept`` among the names ``Vary`` lists (added once)."""
    names: list[bytes] = []
    for key, value in headers:
        if key.lower() == b"vary":
            names.extend(n.strip() for n in value.split(b",") if n.strip())
    if b"accept" in {n.lower() for n in names}:
        return headers
    kept = [(k, v) for k, v in headers if k.lower() != b"vary"]
    return [*kept, (b"vary", b", ".join([*names, b"Accept"]))]


class BodyTooLarge(Exception):
    """The request body went past :data:`MAX_BODY_BYTES` while it was being read."""


class BodyLimitMiddleware:
    """Answers 413 to a body over ``max_bytes``: at once when ``Content-Length`` says so,
    else as soon as the bytes read pass it, before anything more is read or parsed."""

    def __init__(self, app: ASGIApp, *, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = f"The request body is larger than {self.max_bytes:,} bytes."
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit() or len(value) > 18 or int(value) > self.max_bytes:
                    await _refuse(scope, send, 413, message)
                    return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            event = await receive()
            if event["type"] == "http.request":
                received += len(event.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(message)
            return event

        async def tracking_send(event: Message) -> None:
            nonlocal started
            if event["type"] == "http.response.start":
                started = True
            await send(event)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if started:
                raise
            await _refuse(scope, send, 413, message)
