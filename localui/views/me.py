"""The signed-in person's own menu: "I am away" (someone decides for me until …) and
"I am back" (``localui.delegation``).

A person sets only their own away: the name comes from their sign-in, never the form.
Both are POSTs behind the same-origin guard, refused on a read-only server, and write
the users table as ``localui users away|back`` does, so every server knows within the
two seconds its people are cached for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from localui import delegation
from localui.auth import APPROVER, Person, person_of, require, safe_next
from localui.errors import BadRequest
from localui.offloop import off_loop
from localui.records import User
from localui.views.respond import wants_json
from localui.views.state import AppState, context


@dataclass(frozen=True, slots=True)
class MeMenu:
    """What the person's menu in the nav shows: whether they are away and who decides
    for them, or the form to say they are."""

    #: ``Away until 2026-12-24 18:00 UTC: bob decides for you.``; empty when not away.
    away_words: str = ""
    #: Whether the menu offers "I am away" (a person who decides, on a server that may
    #: change things).
    may_go_away: bool = False
    #: Where the menu's forms come back to: the page they were sent from.
    next: str = ""


def away_words(away_to: str, away_until: str) -> str:
    until = delegation.instant(away_until) if away_until else None
    when = f"until {until:%Y-%m-%d %H:%M} UTC" if until else "until you are back"
    return f"Away {when}: {away_to} decides for you."


def me_menu(person: Person, read_only: bool, now: datetime, here: str = "") -> MeMenu:
    if not person.signed_in:
        return MeMenu()
    away = delegation.away_at(person.away_to, person.away_until, now)
    return MeMenu(
        away_words=away_words(person.away_to, person.away_until) if away else "",
        # The start-up token's owner is no person of the users table to be away.
        may_go_away=person.can_decide and person.via != "owner" and not read_only and not away,
        next=here,
    )


def me_values(request: Request) -> dict[str, MeMenu]:
    """The menu for every page template (a Jinja context processor); no I/O: the
    person's away came with their sign-in."""
    ctx: AppState | None = getattr(request.app.state, "localui", None)
    read_only = ctx is None or ctx.settings.read_only
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return {"me": me_menu(person_of(request), read_only, datetime.now(UTC), here)}


def _set_away(ctx: AppState, name: str, to: str, until: str) -> User:
    """Write ``name``'s away (``to`` empty: back), checked against everyone as the
    table says now; a writable directory is opened for it and closed again (a server
    otherwise only reads the table)."""
    users = ctx.backend.users(writable=True)
    try:
        if to:
            people = users.list_users()
            if not any(p.name == name for p in people):
                raise BadRequest(
                    f"{name} is not one of this store's people (`localui users add`): only"
                    " they can be away"
                )
            problem = delegation.away_problem(name, to, people, datetime.now(UTC))
            if problem is not None:
                raise BadRequest(problem)
        changed = users.set_away(name, to, until)
        if changed is None:
            raise BadRequest(f"{name} is not one of this store's people (`localui users add`)")
        return changed
    finally:
        users.close()


async def _change(request: Request, *, away: bool) -> Response:
    ctx = context(request)
    ctx.actions.preflight.ensure_writable()
    person = require(request, APPROVER)
    if not person.signed_in:
        raise BadRequest("sign-in is off here: nobody is signed in to be away")
    form = await request.form()
    to, until = "", ""
    if away:
        to = str(form.get("to") or "").strip()
        if not to:
            raise BadRequest("say who decides while you are away (to)")
        until = delegation.until_of(str(form.get("until") or ""), datetime.now(UTC))
    changed = await off_loop(_set_away, ctx, person.name, to, until)
    # The next page this process draws shows the change, not a two-second-old person.
    ctx.auth.forget(person.name)
    ctx.actions.preflight.people.forget()
    if wants_json(request):
        return JSONResponse(
            {"name": changed.name, "away_to": changed.away_to, "away_until": changed.away_until}
        )
    root = request.scope.get("root_path", "")
    return RedirectResponse(safe_next(str(form.get("next") or ""), root), status_code=303)


async def me_away(request: Request) -> Response:
    """``POST /me/away``: ``to`` decides for the signed-in person ``until`` then."""
    return await _change(request, away=True)


async def me_back(request: Request) -> Response:
    """``POST /me/back``: the signed-in person decides their own pauses again."""
    return await _change(request, away=False)
