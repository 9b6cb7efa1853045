"""The audit log's rules: what a row says, how rows are chained, and how a chain is checked.

Every change made through localui (an approval, a fork, a prune, a sign-in, a user
added on the command line, …) appends one row to ``localui_audit``, a table of
localui's own beside ``localui_decisions``. Rows are only ever appended, each carrying
the SHA-256 of the row before (``prev_hash``) and its own (``hash``, over its fields
and ``prev_hash``), so a row changed in place no longer matches its hash, and a row
taken out leaves the row after it pointing at a hash no row has. ``localui audit
verify`` walks the chain with :class:`ChainCheck` and names such rows.

A chain cannot tell that its newest rows were cut off: the row before them is as
valid a last row as any. ``localui audit verify`` prints the last row's hash so that
it can be noted elsewhere and compared later.

Pure: no I/O. The backends keep the rows (``localui.backends.audit``); the web app
and the CLI write them (``localui.auditing``).
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

#: ``prev_hash`` of the first row: there is no row before it.
GENESIS = ""

#: What a request to each route does, by the route's name. A route not named here is
#: recorded under its own name, so a new route is never left out of the log.
ACTIONS: Mapping[str, str] = {
    "approve": "approve",
    "reject": "reject",
    "bulk_decide": "bulk_decide",
    "resume_run": "resume",
    "bulk_resume": "bulk_resume",
    "reopen_pause": "reopen",
    "edit_preview": "edit_preview",
    "fork_run": "fork",
    "prune_now": "prune",
    "signin": "signin",
    "signout": "signout",
}
#: Where a view names what a request turned out to do, when its route alone does not
#: tell (an approval that was one vote of a two-person rule; a fork of an edited row).
ACTION_KEY = "localui.audit.action"
VOTE = "vote"
EDIT = "edit"
#: The action of a request no route answers (a 404 or 405 of the router).
NO_ROUTE = "no_route"
SIGNIN = "signin"
SIGNIN_FAILED = "signin_failed"
#: How a person who changed something from the command line came: as the OS user.
CLI = "cli"
#: The command line's changes.
USER_ADD = "user_add"
USER_RESET = "user_reset"
USER_REMOVE = "user_remove"
USER_GROUPS = "user_groups"
USER_AWAY = "user_away"
USER_BACK = "user_back"
NOTIFICATION_RETRY = "notification_retry"
#: ``localui users`` commands and what each records.
USER_ACTIONS: Mapping[str, str] = {
    "add": USER_ADD,
    "reset": USER_RESET,
    "remove": USER_REMOVE,
    "set": USER_GROUPS,
    "away": USER_AWAY,
    "back": USER_BACK,
}

OK, REFUSED, ERROR = "ok", "refused", "error"


def outcome_of(status: int) -> str:
    """The word for an HTTP status: ``ok``, ``refused`` (the asker's mistake or lack of
    right), or ``error`` (localui's or the store's)."""
    if status < 400:
        return OK
    return REFUSED if status < 500 else ERROR


def note_action(scope: MutableMapping[str, Any], action: str) -> None:
    """Record ``action`` for this request's row in place of its route's."""
    scope[ACTION_KEY] = action


def action_of(route_name: str | None) -> str:
    if route_name is None:
        return NO_ROUTE
    return ACTIONS.get(route_name, route_name)


def detail_text(detail: Mapping[str, Any]) -> str:
    """A row's detail as stored: compact JSON with its keys sorted, ``{}`` when empty."""
    return json.dumps(dict(detail), ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def instant(moment: datetime) -> str:
    """A row's time as stored and hashed: UTC ISO text, always to the microsecond, so
    both backends read back exactly the text that was hashed."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """What happened, before the chain gives it a place: who, how they came, from
    where, what, on which run, and how it ended."""

    actor: str
    #: How the person signed in: ``owner``, ``user``, ``proxy``, ``open`` (sign-in
    #: off), ``none`` (not signed in), or ``cli``.
    via: str
    #: The client's address (``localui.auth.client_address``), or the host for the CLI.
    address: str
    action: str
    method: str
    path: str
    execution_id: str | None
    #: Compact JSON (:func:`detail_text`).
    detail: str
    #: The HTTP status answered (the CLI's: 0 when it did what it was asked, else 1).
    status: int
    outcome: str


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One row of the log, as kept."""

    id: int
    at: str
    actor: str
    via: str
    address: str
    action: str
    method: str
    path: str
    execution_id: str | None
    detail: str
    status: int
    outcome: str
    prev_hash: str
    hash: str


#: An event's fields, in the order a row keeps them between ``at`` and ``prev_hash``.
EVENT_FIELDS = tuple(f.name for f in fields(AuditEvent))


_event_values = operator.attrgetter(*EVENT_FIELDS)
#: One encoder for every hash: ``json.dumps`` with options makes a new one per call,
#: which was a third of ``localui audit verify``'s time at a million rows.
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def entry_hash(id: int, at: str, event: AuditEvent | AuditEntry, prev_hash: str) -> str:
    """SHA-256 of a row's fields and the hash before it, as JSON of a fixed order."""
    text = _encode([id, at, *_event_values(event), prev_hash])
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def chained(event: AuditEvent, id: int, at: str, prev_hash: str) -> AuditEntry:
    """``event`` as the row that follows the one whose hash is ``prev_hash``."""
    values = {name: getattr(event, name) for name in EVENT_FIELDS}
    return AuditEntry(
        id=id, at=at, **values, prev_hash=prev_hash, hash=entry_hash(id, at, event, prev_hash)
    )


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """A place where the chain breaks. ``kind``: ``changed`` (the row's fields no
    longer give its hash), ``removed`` (rows ``first``..``last`` are gone), or
    ``relinked`` (the row points at a hash other than the row before's, with no row
    missing between: one of the two was rewritten)."""

    kind: str
    id: int
    message: str
    first: int | None = None
    last: int | None = None


@dataclass(slots=True)
class ChainCheck:
    """Walks rows oldest first (:meth:`see`) and keeps what does not hold."""

    count: int = 0
    last: AuditEntry | None = None
    problems: list[ChainProblem] = field(default_factory=list)

    def see(self, entry: AuditEntry) -> None:
        self.count += 1
        if entry_hash(entry.id, entry.at, entry, entry.prev_hash) != entry.hash:
            self.problems.append(
                ChainProblem(
                    "changed",
                    entry.id,
                    f"row {entry.id} was changed: its fields no longer give its hash",
                )
            )
        before = self.last
        expected = before.hash if before is not None else GENESIS
        first_missing = before.id + 1 if before is not None else 1
        if entry.prev_hash != expected or entry.id != first_missing:
            if entry.id > first_missing:
                span = (
                    f"row {first_missing}"
                    if first_missing == entry.id - 1
                    else f"rows {first_missing} to {entry.id - 1}"
                )
                self.problems.append(
                    ChainProblem(
                        "removed",
                        entry.id,
                        f"{span} removed: row {entry.id} follows"
                        + (f" row {before.id}" if before is not None else " nothing"),
                        first_missing,
                        entry.id - 1,
                    )
                )
            else:
                what = f"row {before.id}" if before is not None else "the start of the log"
                self.problems.append(
                    ChainProblem(
                        "relinked",
                        entry.id,
                        f"row {entry.id} does not follow {what}: one of them was rewritten",
                    )
                )
        self.last = entry

    @property
    def intact(self) -> bool:
        return not self.problems


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Filters and the keyset position of one page of the log, newest first. ``after``
    is the id of the last row of the page before (ids follow the chain)."""

    actor: str | None = None
    action: str | None = None
    execution_id: str | None = None
    #: ISO instants: at or after ``since``, before ``until``.
    since: str | None = None
    until: str | None = None
    after: int | None = None
    limit: int = 50


@dataclass(frozen=True, slots=True)
class AuditPage:
    entries: tuple[AuditEntry, ...]
    #: The id to pass as ``after`` for the next page; None on the last.
    next_key: int | None
