"""Numbers, ages, instants and cursors from query strings and forms, parsed strictly.

Every call site goes through here, so a value no parser expected (``²`` is a digit
to ``str.isdigit``, ``int`` refuses it; 5,000 digits; a date past year 1 once a
zone is applied) is a 400 that says which forms are accepted, never a 500.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from localui.errors import BadRequest

_ASCII_DIGITS = frozenset("0123456789")
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: The oldest age anyone prunes or filters by: about ten years.
MAX_AGE = timedelta(days=3660)
AGE_FORMS = "a whole number and a unit, like 90s, 30m, 12h, 7d or 2w, up to 10 years"


def is_ascii_number(text: str, *, max_digits: int) -> bool:
    return 0 < len(text) <= max_digits and all(c in _ASCII_DIGITS for c in text)


def parse_count(name: str, text: str, *, maximum: int) -> int:
    """A whole number 0..maximum written in ASCII digits; anything else is a 400."""
    value = text.strip()
    if not is_ascii_number(value, max_digits=len(str(maximum))) or int(value) > maximum:
        raise BadRequest(f"{name}={text[:40]!r}: give a whole number from 0 to {maximum:,}")
    return int(value)


def parse_age(text: str, name: str = "older_than") -> timedelta:
    """``90s``, ``30m``, ``12h``, ``7d`` or ``2w`` as a timedelta, at most :data:`MAX_AGE`."""
    value = text.strip().lower()
    digits, unit = value[:-1], value[-1:]
    if unit not in AGE_UNITS or not is_ascii_number(digits, max_digits=9):
        raise BadRequest(f"{name}={text[:40]!r}: give {AGE_FORMS}")
    age = timedelta(seconds=int(digits) * AGE_UNITS[unit])
    if age > MAX_AGE:
        raise BadRequest(f"{name}={text[:40]!r} is too large: give {AGE_FORMS}")
    return age


INSTANT_FORMS = (
    "an ISO 8601 time with its zone, as the preview gives it (2026-01-31T12:00:00+00:00)"
)


def parse_instant(name: str, text: str) -> datetime:
    """An aware instant no further than :data:`MAX_AGE` from now, in UTC."""
    if len(text) > 64:
        raise BadRequest(f"{name} is longer than any time: give {INSTANT_FORMS}")
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise BadRequest(f"{name}={text!r}: give {INSTANT_FORMS}") from exc
    if value.tzinfo is None:
        raise BadRequest(f"{name}={text!r} has no time zone: give {INSTANT_FORMS}")
    try:
        instant = value.astimezone(UTC)
    except OverflowError as exc:
        raise BadRequest(f"{name}={text!r} is out of range: give {INSTANT_FORMS}") from exc
    now = datetime.now(UTC)
    if not now - MAX_AGE <= instant <= now + MAX_AGE:
        raise BadRequest(f"{name}={text!r} is out of range: give {INSTANT_FORMS}")
    return instant


def encode_cursor(key: tuple[str, str]) -> str:
    raw = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str, name: str = "after") -> tuple[str, str]:
    """A cursor from ``next``; anything else is a 400 that says what was wrong."""
    if len(text) > 1024:
        raise BadRequest(f"{name} is longer than any cursor this server gives out")
    try:
        padded = text + "=" * (-len(text) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, TypeError, RecursionError) as exc:
        raise BadRequest(f"{name}={text!r} is not a cursor this server gave out") from exc
    if not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"{name}={text!r} is not a cursor this server gave out")
    return value[0], value[1]


FIELD_PREFIX = "field."


def fields_of(form: Any) -> dict[str, str]:
    """The rule's fields a form sent, ``field.<name>``, by name (the rule checks them)."""
    return {
        str(k)[len(FIELD_PREFIX) :]: str(v)
        for k, v in form.multi_items()
        if str(k).startswith(FIELD_PREFIX)
    }


def picked_cards(values: list[str]) -> list[tuple[str, str]]:
    """The ``pick`` checkboxes: each a JSON pair ``[execution_id, checkpoint_id]``, so
    each card's decision is bound to the paused row that card showed."""
    cards: list[tuple[str, str]] = []
    for value in values:
        try:
            pair = json.loads(value)
        except ValueError:
            raise BadRequest(f"pick={value!r} is not a card's [run, paused row] pair") from None
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
        ):
            raise BadRequest(f"pick={value!r} is not a card's [run, paused row] pair")
        if (pair[0], pair[1]) not in cards:
            cards.append((pair[0], pair[1]))
    return cards
