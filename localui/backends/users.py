"""The people who may use a server: ``localui_users``, a table localui owns.

Each person has a name, a role (``viewer``, ``approver``, ``operator``), the
groups an approval policy names (``group:finance``, ``localui.policy``) and a
personal token, of which only the SHA-256 is stored. A plain, fast hash is
enough because every token is 32 bytes from ``secrets``: 256 bits of chance
leave nothing to guess or look up in a dictionary, which is what slow password
hashes (bcrypt, argon2) defend against; and a fast hash lets each script
request with a Bearer token be checked in microseconds.

The table lives beside ``localui_decisions``: in the SQLite store's own file, and
in the app schema on PostgreSQL (each backend's ``users``). So the people who may
act on a store travel with it, every localui process serving one PostgreSQL
database knows the same people, and there is no other file to keep or lose. The
servers only read it; ``localui users`` writes it.

This module holds what both backends' tables share: the name, the columns, the
row mapper, and the rules for tokens, names and roles.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
import unicodedata
from collections.abc import Callable, Collection, Sequence
from typing import Any

from localui.backends.base import UserDirectory
from localui.backends.shared import NamedRow
from localui.errors import BadRequest, Conflict
from localui.names import MAX_NAME
from localui.records import User
from localui.roles import ROLES

TABLE = "localui_users"
#: How long a read of everyone is believed: as long as the sign-in's look-up of one
#: person (``localui.auth.CACHE_SECONDS``), so a change made by ``localui users`` (an
#: away, a role) reaches every server within it.
EVERYONE_SECONDS = 2.0

#: The table's columns, in the order every SELECT and RETURNING lists them.
COLUMN_NAMES = (
    "name",
    "role",
    "token_sha256",
    "created_at",
    "user_groups",
    "address",
    "away_to",
    "away_until",
)
COLUMNS = ", ".join(COLUMN_NAMES)
#: The groups column: added after the table first shipped, so a table made by an
#: older localui gets it on its next write (``ALTER TABLE``), and reads of a table
#: that has not been written since see nobody in any group.
GROUPS_COLUMN = "user_groups"
#: Every column added since the table first shipped (all text, empty by default), in
#: the order they came: a table made by an older localui gets the ones it lacks on its
#: next write, and reads of it meanwhile see them empty (nobody in a group, no address,
#: nobody away).
ADDED_COLUMNS = (GROUPS_COLUMN, "address", "away_to", "away_until")
#: The longest group name accepted.
MAX_GROUP = 64


def new_token() -> str:
    """A fresh personal token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_name(name: str) -> str:
    """A person's name as stored: trimmed, printable, not too long; else a 400."""
    name = name.strip()
    if not name:
        raise BadRequest("a person needs a name")
    if len(name) > MAX_NAME:
        raise BadRequest(f"a name is at most {MAX_NAME} characters")
    if any(unicodedata.category(c).startswith("C") for c in name):
        raise BadRequest("a name cannot contain control or invisible format characters")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise BadRequest(f"role {role!r} is not one of {', '.join(ROLES)}")
    return role


def check_groups(groups: Sequence[str]) -> tuple[str, ...]:
    """Group names as stored: trimmed, each printable with no comma or space (the
    proxy's groups header is comma-separated), in the order given, once each."""
    found: list[str] = []
    for group in groups:
        group = group.strip()
        if not group:
            raise BadRequest("a group needs a name")
        if len(group) > MAX_GROUP:
            raise BadRequest(f"a group name is at most {MAX_GROUP} characters")
        if any(c == "," or c.isspace() or unicodedata.category(c).startswith("C") for c in group):
            raise BadRequest(f"group {group!r}: no commas, spaces or control characters")
        if group not in found:
            found.append(group)
    return tuple(found)


def groups_text(groups: Sequence[str]) -> str:
    """How the groups column keeps them: comma-separated, as the proxy header sends them."""
    return ",".join(groups)


def groups_of(text: str | None) -> tuple[str, ...]:
    return tuple(g for g in (text or "").split(",") if g)


def already_a_user(name: str) -> Conflict:
    """What adding a name that is taken raises, on either backend."""
    return Conflict(f"{name!r} is already a user (reset or remove them)")


def select_list(present: Collection[str]) -> str:
    """The SELECT list for a table with the columns ``present``: each column it lacks
    read as empty text, under its own name."""
    return ", ".join(c if c in present else f"'' AS {c}" for c in COLUMN_NAMES)


def user_from_row(row: NamedRow, instant: Callable[[Any], str] = str) -> User:
    """A row of ``COLUMNS`` (by name) as a :class:`User`; ``instant`` turns the
    database's time value into ISO text."""
    return User(
        name=str(row["name"]),
        role=str(row["role"]),
        token_sha256=str(row["token_sha256"]),
        created_at=instant(row["created_at"]),
        groups=groups_of(row[GROUPS_COLUMN]),
        address=str(row["address"] or ""),
        away_to=str(row["away_to"] or ""),
        away_until=str(row["away_until"] or ""),
    )


class Everyone:
    """Everyone in a users table, as it said at most :data:`EVERYONE_SECONDS` ago: what
    the delegation rules (``localui.delegation``) read on each decision and queue page,
    one read per two seconds however many ask. Callable from any thread; with no
    directory (sign-in off) there is nobody."""

    def __init__(
        self,
        users: UserDirectory | None,
        *,
        seconds: float = EVERYONE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.users = users
        self._seconds = seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._read: tuple[float, tuple[User, ...]] | None = None

    def forget(self) -> None:
        """Read the table again on the next call (this process has just changed it)."""
        with self._lock:
            self._read = None

    def __call__(self) -> tuple[User, ...]:
        if self.users is None:
            return ()
        with self._lock:
            now = self._clock()
            if self._read is None or now - self._read[0] >= self._seconds:
                self._read = (now, self.users.list_users())
            return self._read[1]
