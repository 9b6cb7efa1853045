"""The keys this process signs sessions, previews and links with, and the sessions
signed out, as the store keeps them for every localui process on it
(``localui.backends.keys``).

Read again at most every :data:`REFRESH_SECONDS`, by the first request after that
(the others wait for the same read): a key rotated or a session signed out on one
process is honoured by every other within that second and one more request. A
store that cannot keep them (a ``--read-only`` server on a store no writable one
has served, an exported bundle) leaves the process with a key of its own, as
before: its sessions end when it stops.
"""

from __future__ import annotations

import asyncio
import logging
import time

from localui.backends.base import SessionKeys
from localui.backends.keys import SIGNOUT_OVERLAP_SECONDS, Key, new_secret
from localui.offloop import off_loop

log = logging.getLogger("localui")

#: How long what the store said about keys and sign-outs is believed.
REFRESH_SECONDS = 1.0
#: How soon it is read again for a value none of the keys read verifies (signed,
#: perhaps, with a key another process has just made): often enough that a rotation
#: is met at once, seldom enough that bad cookies cannot keep the store busy.
SOON_SECONDS = 0.25


class KeyRing:
    """The accepted keys (oldest first; the newest signs) and the ended sessions."""

    def __init__(self) -> None:
        self._source: SessionKeys | None = None
        self._keys: tuple[Key, ...] = (Key(0, new_secret(), time.time(), None, ring=""),)
        #: Session id -> when it would have expired anyway (Unix seconds).
        self._ended: dict[str, float] = {}
        #: The latest sign-out time read: the next read starts a little before it.
        self._ended_seen = 0.0
        self._read_at = float("-inf")
        self._reading: asyncio.Lock | None = None

    @property
    def shared(self) -> bool:
        """Whether the keys come from the store (every process on it shares them)."""
        return bool(self._keys[-1].ring)

    @property
    def ring(self) -> str:
        """The store's sign-in identity ('' for a key of this process's own)."""
        return self._keys[-1].ring

    @property
    def generation(self) -> int:
        return self._keys[-1].generation

    def secrets(self) -> tuple[bytes, ...]:
        """Every accepted key, oldest first: the last one signs."""
        return tuple(k.secret for k in self._keys)

    def open(self, source: SessionKeys) -> None:
        """Read the store's keys for the first time (blocking: at start-up), making
        them when there are none and ``source`` may write."""
        self._source = source
        if not self._read(source):
            log.warning(
                "localui: the store keeps no signing keys and this server may not write"
                " them: sessions last as long as this process"
            )

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    def _read(self, source: SessionKeys) -> bool:
        after = self._ended_seen - SIGNOUT_OVERLAP_SECONDS if self._ended_seen else 0.0
        shared = source.shared(after)
        self._read_at = time.monotonic()
        if shared is None:
            return False
        self._keys = shared.keys
        now = time.time()
        for session_id, ended_at, expires_at in shared.ended:
            self._ended[session_id] = expires_at
            self._ended_seen = max(self._ended_seen, ended_at)
        if len(self._ended) > 1000:
            self._ended = {s: until for s, until in self._ended.items() if until > now}
        return True

    async def fresh(self, *, soon: bool = False) -> bool:
        """Read the store again when what it said is older than :data:`REFRESH_SECONDS`
        (``soon``: :data:`SOON_SECONDS`); whether the keys changed. Raises
        :class:`~localui.errors.Unavailable` when it cannot be read."""
        source = self._source
        believed = SOON_SECONDS if soon else REFRESH_SECONDS
        if source is None or time.monotonic() - self._read_at < believed:
            return False
        if self._reading is None:
            self._reading = asyncio.Lock()
        async with self._reading:
            if time.monotonic() - self._read_at < believed:
                return False  # read by the request this one waited for
            before = self.secrets()
            await off_loop(self._read, source)
            return self.secrets() != before

    def ended(self, session_id: object) -> bool:
        """Whether the session was signed out (on any process of the store)."""
        return isinstance(session_id, str) and session_id in self._ended

    async def end(self, session_id: str, expires_at: float) -> None:
        """Sign a session out here at once, and for every process through the store."""
        self._ended[session_id] = expires_at
        if self._source is not None and self.shared:
            await off_loop(self._source.end_session, session_id, expires_at)
