"""The keys every localui process on a store signs with, and the sessions ended by
signing out: ``localui_keys`` and ``localui_signouts``, tables localui owns.

They live beside ``localui_users`` (in the SQLite store's file, in the app schema on
PostgreSQL), so a session opened on one process is accepted by every other process
serving the store, and by the same process after a restart. The first server to
find no key makes one; ``localui keys rotate`` adds a newer one and gives the older
ones a date after which they are no longer accepted.

Whoever can read these tables can sign a session for anyone: they are as secret as
the sessions themselves (README, "Run it for a team").

This module holds what both backends' tables share.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

KEYS_TABLE = "localui_keys"
SIGNOUTS_TABLE = "localui_signouts"
#: Bytes of a key: as many as the HMAC-SHA256 that uses it.
KEY_BYTES = 32
#: How far back a reader looks again for sign-outs written since it last looked: a
#: sign-out written by a slower transaction may carry a slightly earlier time.
SIGNOUT_OVERLAP_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Key:
    """One signing key. ``retires_at`` (Unix seconds): when it stops being accepted;
    None while it is the newest or was never rotated out."""

    generation: int
    secret: bytes
    created_at: float
    retires_at: float | None
    #: The store's sign-in identity, the same on every key of one store: the session
    #: cookie is named after it, so every process on the store uses one cookie.
    ring: str

    def accepted(self, now: float) -> bool:
        return self.retires_at is None or self.retires_at > now


@dataclass(frozen=True, slots=True)
class Shared:
    """What one look at the tables found: the keys still accepted, oldest first, and
    the sessions ended at or after the time asked for, as (session id, when, until)."""

    keys: tuple[Key, ...]
    ended: tuple[tuple[str, float, float], ...]


def new_secret() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def new_ring() -> str:
    """A store's sign-in identity: 8 hex digits, enough to tell apart the stores one
    browser signs in to on one host (cookies do not tell ports apart)."""
    return secrets.token_hex(4)
