"""Delegation: who decides for a person while they are away.

A person is away when their ``away_to`` names someone (``localui users away NAME --to
OTHER [--until WHEN]``, or "I am away" in their own menu) and ``away_until`` has not
passed (empty: until they are back). While away, their **delegate** may decide what they
could: a rule naming ``user:ada`` (or a group or role of hers) accepts ada's delegate,
whose decision is recorded as "bob for ada". A delegate who is away too passes it on: the
chain is followed at most :data:`MAX_STEPS` steps, never back to anyone already on it,
and only through people who exist and whose role may decide; where it cannot go on, the
last good delegate decides (and with none, the person is taken as not away).

Setting an away that would make a cycle (ada to bob while bob is away to ada) is refused
(:func:`away_problem`); two aways set at once on two servers can still make one, and the
chain then stops before it returns, so nothing ever loops.

Pure: no I/O. The people come from the users table (``localui.backends.users``), read at
most two seconds ago, so a change reaches every server within that.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from localui.errors import BadRequest
from localui.policy import Rule
from localui.records import User
from localui.roles import ROLES

#: How many delegations a chain follows at most (ada to bob to carl to dan).
MAX_STEPS = 3
#: The units of an away's length, as ``--until 3d`` gives it.
UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 604800}
#: The longest away: about a year, past which a person is better removed.
MAX_AWAY = timedelta(days=400)
UNTIL_FORMS = (
    "an ISO date or time (2026-12-24, 2026-12-24T18:00, 2026-12-24T18:00+01:00; UTC when"
    " no zone is given) or a length like 90m, 12h, 3d or 2w"
)


@dataclass(frozen=True, slots=True)
class Decider:
    """Someone to tell that a pause waits for them: ``name`` decides it, told at
    ``address`` (their own Apprise URL; empty when they have none), ``for_name`` the
    away person they decide it for (empty: in their own right)."""

    name: str
    address: str
    for_name: str = ""


@dataclass(frozen=True, slots=True)
class Standing:
    """What a person may do with a pause under a rule: decide it in their own right
    (``own``), or only for the away people in ``for_names`` (their delegate they are,
    and the rule lets them decide); neither: not at all."""

    own: bool
    for_names: tuple[str, ...] = ()

    @property
    def may(self) -> bool:
        return self.own or bool(self.for_names)


def can_decide(role: str) -> bool:
    """Whether a role decides pauses at all (approver, operator)."""
    return role in ROLES and ROLES.index(role) >= 1


def instant(text: str) -> datetime | None:
    """An ISO time as stored (UTC when it has no zone); None when it is not one."""
    try:
        value = datetime.fromisoformat(text)
        # A zone can carry a time past year 1 or 9999 (0001-01-01T00:00+14:00).
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def is_away(user: User, now: datetime) -> bool:
    """Whether ``user`` is away at ``now`` (:func:`away_at`)."""
    return away_at(user.away_to, user.away_until, now)


def away_at(away_to: str, away_until: str, now: datetime) -> bool:
    """Whether an away is on at ``now``: someone named, and the until not passed. An
    until that cannot be read (written by hand) ends the away: the person decides."""
    if not away_to:
        return False
    if not away_until:
        return True
    until = instant(away_until)
    return until is not None and now < until


#: Everyone, as a sequence of users or by name (the rules look people up by name).
People = Iterable[User] | Mapping[str, User]


def _by_name(people: People) -> Mapping[str, User]:
    return people if isinstance(people, Mapping) else {p.name: p for p in people}


def chain_of(name: str, people: People, now: datetime) -> list[User]:
    """The delegates ``name``'s pauses pass through while they are away, in order: at
    most :data:`MAX_STEPS`, each a person who exists, may decide, and is not already on
    the chain (nor ``name``); empty when ``name`` is not away (or names nobody good)."""
    by_name = _by_name(people)
    current = by_name.get(name)
    seen = {name}
    chain: list[User] = []
    while current is not None and len(chain) < MAX_STEPS and is_away(current, now):
        nxt = by_name.get(current.away_to)
        if nxt is None or nxt.name in seen or not can_decide(nxt.role):
            break  # a stop: the last good delegate decides
        chain.append(nxt)
        seen.add(nxt.name)
        current = nxt
    return chain


def delegate_of(name: str, people: People, now: datetime) -> User | None:
    """Who decides for ``name`` at ``now``: the end of their chain (:func:`chain_of`),
    or None when they are not away and decide themselves."""
    chain = chain_of(name, people, now)
    return chain[-1] if chain else None


def stand_ins(people: People, now: datetime) -> Mapping[str, tuple[User, ...]]:
    """Each delegate's name and the away people they decide for at ``now``, in the
    order given: worked out once for everyone, then asked of each card (a queue asks it
    for one person many times over)."""
    by_name = _by_name(people)
    found: dict[str, list[User]] = {}
    for user in by_name.values():
        if user.away_to:
            end = delegate_of(user.name, by_name, now)
            if end is not None:
                found.setdefault(end.name, []).append(user)
    return {name: tuple(users) for name, users in found.items()}


def represented_by(name: str, people: People, now: datetime) -> tuple[User, ...]:
    """The away people whose delegate ``name`` is at ``now``, in the order given."""
    return stand_ins(people, now).get(name, ())


def _allowed(rule: Rule | None, user: User) -> bool:
    return can_decide(user.role) and (
        rule is None or rule.allows(user.name, user.role, user.groups)
    )


def standing(
    rule: Rule | None,
    name: str,
    role: str,
    groups: Sequence[str],
    people: People,
    now: datetime,
) -> Standing:
    """What the person ``name`` (signed in with ``role`` and ``groups``) may do with a
    pause under ``rule`` (None: no rule governs it, any approver decides): in their own
    right, else for each away person they are the delegate of whom the rule lets decide,
    judged by that person's own role and groups (a delegate decides what the person could,
    never more)."""
    return standing_among(rule, name, role, groups, represented_by(name, people, now))


def standing_among(
    rule: Rule | None, name: str, role: str, groups: Sequence[str], represented: Sequence[User]
) -> Standing:
    """:func:`standing`, given the away people ``name`` stands in for (``stand_ins``)."""
    if not can_decide(role):
        return Standing(own=False)
    if rule is None or rule.allows(name, role, groups):
        return Standing(own=True)
    return Standing(own=False, for_names=tuple(p.name for p in represented if _allowed(rule, p)))


def deciders(rule: Rule | None, people: People, now: datetime) -> tuple[Decider, ...]:
    """Everyone to tell that a pause governed by ``rule`` waits, each once.

    For announcing a pause to each person who may decide it: the rule's approvers
    (``rule.allows`` by their own role and groups), or, with no rule or a rule naming
    nobody, every approver and operator; ``people`` is everyone in the users table
    (``UserDirectory.list_users``), read recently. Each away person is replaced by
    their delegate (:func:`delegate_of`), who is told ``for_name`` = the away person;
    someone who may decide in their own right is listed once, as themselves
    (``for_name`` empty), even when they also stand in for someone; someone standing in
    for several is listed once, for the first of them in ``people``'s order. A person
    with no address is listed with ``address`` empty: the caller decides whether to
    skip them or tell them some other way. Viewers are never listed, nor a delegate
    whose role no longer decides (the chain stops before them).
    """
    by_name = _by_name(people)
    found: dict[str, Decider] = {}
    for user in by_name.values():
        if not _allowed(rule, user):
            continue
        delegate = delegate_of(user.name, by_name, now)
        if delegate is None:
            found[user.name] = Decider(user.name, user.address)  # their own right wins
        elif delegate.name not in found:
            found[delegate.name] = Decider(delegate.name, delegate.address, user.name)
    return tuple(found.values())


def delegate_words(deciding_for: Sequence[str]) -> str:
    """``for ada, who is away``: what a delegate is told after "Deciding as bob", on a
    card, a decision link's page and their own message."""
    if not deciding_for:
        return ""
    who = "who is away" if len(deciding_for) == 1 else "who are away"
    return f"for {' or '.join(deciding_for)}, {who}"


def away_problem(name: str, to: str, people: People, now: datetime) -> str | None:
    """Why ``name`` cannot be away to ``to`` (one line), or None when they can: both
    must be people here, ``to`` someone else whose role may decide, and ``to``'s own
    chain must not come back to ``name`` (a cycle)."""
    by_name = _by_name(people)
    if name not in by_name:
        return f"no user {name!r}"
    if not to.strip():
        return "say who decides while you are away"
    if to == name:
        return f"{name} cannot decide for themselves while away: name someone else"
    other = by_name.get(to)
    if other is None:
        return f"no user {to!r} to decide for {name}"
    if not can_decide(other.role):
        return f"{to} is a {other.role}: only an approver or operator can decide for {name}"
    if any(p.name == name for p in chain_of(to, by_name, now)):
        return f"{to} is away and passes their pauses back to {name}: that would be a circle"
    return None


def until_of(text: str, now: datetime) -> str:
    """``--until``/the menu's until as stored: ISO UTC text; empty text stays empty
    (until they are back). A :class:`BadRequest` for anything else, or a time passed."""
    value = text.strip()
    if not value:
        return ""
    if len(value) > 64:
        raise BadRequest(f"until: too long: give {UNTIL_FORMS}")
    unit = value[-1:].lower()
    digits = value[:-1]
    if unit in UNITS and digits.isascii() and digits.isdigit() and len(digits) <= 9:
        length = timedelta(seconds=int(digits) * UNITS[unit])
        if length > MAX_AWAY:
            raise BadRequest(f"until {value!r}: an away lasts at most {MAX_AWAY.days} days")
        if length <= timedelta(0):
            raise BadRequest(f"until {value!r}: give a length above zero")
        return (now + length).astimezone(UTC).isoformat()
    when = instant(value)
    if when is None:
        raise BadRequest(f"until {value!r} is not a time: give {UNTIL_FORMS}")
    if when <= now:
        raise BadRequest(f"until {value!r} has passed already")
    if when - now > MAX_AWAY:
        raise BadRequest(f"until {value!r}: an away lasts at most {MAX_AWAY.days} days")
    return when.isoformat()
