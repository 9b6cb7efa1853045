"""Numbers, ages, instants and cursors from query strings and forms, parsed strictly.

Every call site goes through here, so a value no parser expected (``²`` is a digit
to ``str.isdigit``, ``int`` refuses it; 5,000 digits; a date past year 1 once a
zone is applied) is a 400 that says which forms are accepted, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
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


def parse_when(name: str, text: str | None, now: datetime) -> datetime | None:
    """An age before ``now`` (``7d``) or an ISO instant, in UTC; None when empty."""
    if not text:
        return None
    value = text.strip()
    if value[:1].isdigit() and value[-1:].lower() in "smhdw" and "-" not in value:
        return now - parse_age(value, name)
    return parse_instant(name, value)


#: The longest value a page's filter takes.
MAX_FILTER_CHARS = 200


def filter_values(params: Mapping[str, str], names: Sequence[str]) -> dict[str, str | None]:
    """Each named filter of a listing as given, trimmed; None when empty. A value longer
    than :data:`MAX_FILTER_CHARS` is a 400."""
    values: dict[str, str | None] = {}
    for name in names:
        value = (params.get(name) or "").strip() or None
        if value is not None and len(value) > MAX_FILTER_CHARS:
            raise BadRequest(f"{name} is longer than {MAX_FILTER_CHARS} characters")
        values[name] = value
    return values


def iso_or_none(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


#: The longest JSON pair taken (a bulk pick, a cursor's content): room for two long
#: ids, and a bound on the text before JSON reads it, so no nesting goes deep.
MAX_PAIR_CHARS = 4096
#: The longest cursor text taken (base64 of its pair).
MAX_CURSOR_CHARS = 1024


def storable(name: str, text: str) -> str:
    """``text`` if every store can hold and compare it; a 400 for a NUL (PostgreSQL
    text never holds one) or a lone surrogate (``"\\ud800"`` in JSON: not text)."""
    if "\x00" in text:
        raise BadRequest(f"{name} holds a NUL character, which no id or text here has")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(
            f"{name} holds a lone surrogate (U+D800 to U+DFFF), which is not text"
        ) from None
    return text


def parse_pair(name: str, text: str, what: str) -> tuple[str, str]:
    """``["a", "b"]``, two strings in JSON as a page wrote them; anything else is a 400
    saying that ``name`` is not ``what``. Bounded before JSON reads it, and each string
    :func:`storable`."""
    if len(text) > MAX_PAIR_CHARS:
        raise BadRequest(f"{name} is longer than {what} ever is ({MAX_PAIR_CHARS:,} characters)")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise BadRequest(f"{name}={text[:80]!r} is not {what}") from None
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise BadRequest(f"{name}={text[:80]!r} is not {what}")
    return storable(name, value[0]), storable(name, value[1])


def decode_cursor(text: str, name: str = "after") -> tuple[str, str]:
    """A cursor from a page's ``next`` (base64 of a JSON pair); anything else is a 400
    that says what was wrong."""
    what = "a cursor this server gave out"
    if len(text) > MAX_CURSOR_CHARS:
        raise BadRequest(f"{name} is longer than any cursor this server gives out")
    try:
        padded = text + "=" * (-len(text) % 4)
        decoded = base64.urlsafe_b64decode(padded.encode()).decode("utf-8")
    except (ValueError, binascii.Error):
        raise BadRequest(f"{name}={text!r} is not {what}") from None
    return parse_pair(name, decoded, what)


def encode_cursor(key: tuple[str, str]) -> str:
    raw = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


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
        pair = parse_pair("pick", value, "a card's [run, paused row] pair")
        if pair not in cards:
            cards.append(pair)
    return cards
