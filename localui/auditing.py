"""Writing the audit log (``localui.audit``): a row for every request that may change
something, for every sign-in, and for the command line's changes.

:class:`AuditMiddleware` sits outside every other middleware, so a request the
cross-site guard, the body cap or sign-in refuses is recorded as surely as one an
endpoint answers. It writes after the response has been sent, in a worker thread: the
person has their answer first, and a row that cannot be written is logged loudly and
never turns a completed action into an error.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from typing import Any

from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localui import audit
from localui.audit import AuditEntry, AuditEvent
from localui.auth import (
    NOBODY,
    SAFE_METHODS,
    SCOPE_KEY,
    SIGNIN_KEY,
    Person,
    SigninAttempt,
    client_address,
    owner_name,
)
from localui.backends.base import AuditLog
from localui.offloop import off_loop

logger = logging.getLogger("localui.audit")

#: The longest path a row keeps; a longer one is cut, and says so.
MAX_PATH = 2000


class AuditRecorder:
    """The log a server appends to: opened by the lifespan (a read-only server opens
    none and records nothing, as it changes nothing), held by the middleware."""

    def __init__(self) -> None:
        self.log: AuditLog | None = None

    def append(self, event: AuditEvent) -> AuditEntry | None:
        """``event`` appended, or None when there is no log or the write failed: a
        failure is logged as an error, with the row it could not write."""
        log = self.log
        if log is None:
            return None
        try:
            return log.append(event)
        except Exception:
            logger.exception(
                "localui: the audit log could not record %s %s by %r (%s) with status %s",
                event.method,
                event.path,
                event.actor,
                event.action,
                event.status,
            )
            return None


def route_of(routes: Any, scope: Scope) -> tuple[str | None, Mapping[str, Any]]:
    """The name and path parameters of the route a request goes to (one that answers
    its path with another method counts: the 405 is recorded under its name)."""
    partial: tuple[str | None, Mapping[str, Any]] | None = None
    for route in routes:
        match, child = route.matches(scope)
        if match == Match.FULL:
            if isinstance(route, Mount) and route.routes:
                inner = route_of(route.routes, {**scope, **child})
                if inner[0] is not None:
                    return inner
            return route.name, child.get("path_params", {})
        if match == Match.PARTIAL and partial is None:
            partial = (route.name, child.get("path_params", {}))
    return partial if partial is not None else (None, {})


def request_event(scope: Scope, status: int, routes: Any) -> AuditEvent:
    """The row for a request that was answered with ``status``."""
    attempt = scope.get(SIGNIN_KEY)
    person = scope.get(SCOPE_KEY)
    who = person if isinstance(person, Person) else NOBODY
    detail: dict[str, Any] = {}
    execution_id: str | None = None
    method = scope.get("method", "GET")
    if method not in SAFE_METHODS:
        name, params = route_of(routes, scope)
        noted = scope.get(audit.ACTION_KEY)
        action = noted if isinstance(noted, str) else audit.action_of(name)
        value = params.get("execution_id")
        execution_id = value if isinstance(value, str) else None
    else:
        action = audit.SIGNIN
    if isinstance(attempt, SigninAttempt):
        if attempt.person is not None:
            who = attempt.person
        if action not in (audit.SIGNIN, audit.SIGNIN_FAILED):
            detail["asked"] = action  # a bad token sent with another request
        signed_in = attempt.person is not None and status < 400
        action = audit.SIGNIN if signed_in else audit.SIGNIN_FAILED
        detail["by"] = attempt.by
    elif action == audit.SIGNIN and status >= 400:
        action = audit.SIGNIN_FAILED
    path: str = scope.get("path", "")
    if len(path) > MAX_PATH:
        path = path[:MAX_PATH] + "…"
        detail["path_cut"] = True
    address = client_address(scope)
    return AuditEvent(
        actor=who.name,
        via=who.via,
        address=str(address) if address is not None else "",
        action=action,
        method=method,
        path=path,
        execution_id=execution_id,
        detail=audit.detail_text(detail),
        status=status,
        outcome=audit.outcome_of(status),
    )


class AuditMiddleware:
    """One audit row per request whose method may change something, and per sign-in
    (a link is a GET), written once the response has gone."""

    def __init__(self, app: ASGIApp, *, recorder: AuditRecorder) -> None:
        self.app = app
        self.recorder = recorder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.recorder.log is None:
            await self.app(scope, receive, send)
            return
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException:
            # Starlette's outermost middleware answers it with a 500.
            status = status or 500
            raise
        finally:
            if scope.get("method", "GET") not in SAFE_METHODS or SIGNIN_KEY in scope:
                routes = scope["app"].router.routes
                event = request_event(scope, status or 500, routes)
                await off_loop(self.recorder.append, event)


def cli_event(
    action: str,
    command: str,
    detail: Mapping[str, Any],
    *,
    done: bool,
    execution_id: str | None = None,
) -> AuditEvent:
    """The row for a change made on the command line, by the OS user on this host;
    ``done``: the command did what it was asked (status 0), else refused (status 1)."""
    return AuditEvent(
        actor=owner_name(),
        via=audit.CLI,
        address=socket.gethostname(),
        action=action,
        method="CLI",
        path=command,
        execution_id=execution_id,
        detail=audit.detail_text(detail),
        status=0 if done else 1,
        outcome=audit.OK if done else audit.REFUSED,
    )
