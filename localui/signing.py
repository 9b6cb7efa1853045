"""Signed values the server hands out and only accepts back unchanged.

Prune deletes as of a cutoff instant. The preview shows what a cutoff deletes and
signs it; the POST must bring that signature back, so a hand-made cutoff (one
second ago, deleting what no one previewed) is refused before anything is deleted.
The secret lives as long as the process: a preview from before a restart is
simply previewed again.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Signer:
    """HMAC-SHA256 over a purpose and a value, with a secret made per process."""

    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def sign(self, purpose: str, value: str) -> str:
        message = f"{purpose}\n{value}".encode()
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()

    def verify(self, purpose: str, value: str, signature: str) -> bool:
        expected = self.sign(purpose, value).encode()
        return hmac.compare_digest(expected, signature.encode("utf-8", "replace"))
