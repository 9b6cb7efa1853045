"""Signed values the server hands out and only accepts back unchanged.

Prune deletes as of a cutoff instant. The preview shows what a cutoff deletes and
signs it; the POST must bring that signature back, so a hand-made cutoff (one
second ago, deleting what no one previewed) is refused before anything is deleted.
The keys are the store's (``localui.keyring``): a preview made on one process is
accepted by every other on the store, and after a restart.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from localui.keyring import KeyRing


@dataclass(frozen=True, slots=True)
class Signer:
    """HMAC-SHA256 over a purpose and a value, with the newest key of ``keys``;
    verified against every key still accepted."""

    keys: KeyRing

    def sign(self, purpose: str, value: str) -> str:
        return _sign(self.keys.secrets()[-1], purpose, value)

    def verify(self, purpose: str, value: str, signature: str) -> bool:
        sent = signature.encode("utf-8", "replace")
        return any(
            hmac.compare_digest(_sign(secret, purpose, value).encode(), sent)
            for secret in self.keys.secrets()
        )

    async def check(self, purpose: str, value: str, signature: str) -> bool:
        """:meth:`verify`, reading the store's keys again first when it fails: the value
        may have been signed by another process with a key made since they were read."""
        if self.verify(purpose, value, signature):
            return True
        return await self.keys.fresh(soon=True) and self.verify(purpose, value, signature)


def _sign(secret: bytes, purpose: str, value: str) -> str:
    return hmac.new(secret, f"{purpose}\n{value}".encode(), hashlib.sha256).hexdigest()
