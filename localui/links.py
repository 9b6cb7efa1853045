"""Personal decision links: a link that opens one pause's decision page for one person.

An approver is told of a pause at their own address with a link that lets them decide
it without opening the desk. Chat apps unfurl links and mail gateways fetch them, some
running their scripts, so a link is only ever a way to *see* the decision page: it
decides nothing on GET or HEAD, and the page has no script at all. Deciding takes a
POST of the rendered form, which carries a form key only a rendered page holds
(:meth:`LinkSigner.form_key`), from this origin (the same-origin guard every POST
passes), pressed by a person.

A link is signed with the store's keys (itsdangerous, as sessions are), so any server
on the store opens a link another minted, and a key rotation ends links as it ends
sessions. It names the person, the run, the paused row and the rule as it was (a
fingerprint: a policy changed since the link was sent makes it refuse), and expires
(``--link-ttl``). It is spent by the pause being decided, by anyone, or by the
person's own vote under a rule that needs several: both are read from the decision
record, so spending needs no table of its own and holds across processes.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer

from localui.keyring import KeyRing
from localui.policy import Rule

LINK_SALT = "localui-decision-link"
FORM_SALT = "localui-decision-form"
#: How long a link opens its page by default (``--link-ttl``).
DEFAULT_TTL_SECONDS = 24 * 3600.0


def rule_print(rule: Rule | None) -> str:
    """A fingerprint of ``rule`` as it is now ('' without one): a link keeps it, and a
    policy changed since refuses the link (the person was told of other terms)."""
    if rule is None:
        return ""
    return hashlib.sha256(repr(rule).encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class DecisionLink:
    """What a link names: whose it is, and which pause under which rule."""

    person: str
    execution_id: str
    checkpoint_id: str
    rule: str
    rule_print: str
    #: When it was minted, and when it stops opening its page (Unix seconds).
    issued_at: float
    expires_at: float

    @property
    def expires_text(self) -> str:
        return datetime.fromtimestamp(self.expires_at, UTC).isoformat(timespec="seconds")


class LinkInvalid(Exception):
    """Not a link this store's servers made (a bad signature, a cut-off or changed link,
    or a key retired since)."""


class LinkExpired(Exception):
    def __init__(self, link: DecisionLink) -> None:
        super().__init__(f"this link expired at {link.expires_text}")
        self.link = link


def token_digest(token: str) -> str:
    """What the form key binds to: a link's hash (the form never repeats the link)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class LinkSigner:
    """Mints and reads links and their forms' keys with the store's keys."""

    def __init__(self, keys: KeyRing, ttl: float = DEFAULT_TTL_SECONDS) -> None:
        self.keys = keys
        self.ttl = ttl
        self._made: tuple[tuple[bytes, ...], URLSafeTimedSerializer, URLSafeTimedSerializer]
        self._made = ((), URLSafeTimedSerializer(b"-"), URLSafeTimedSerializer(b"-"))

    @property
    def _max_age(self) -> int:
        # itsdangerous stamps whole seconds.
        return max(1, round(self.ttl))

    def _serializers(self) -> tuple[URLSafeTimedSerializer, URLSafeTimedSerializer]:
        secrets_now = self.keys.secrets()
        if self._made[0] != secrets_now:
            # A list of keys: itsdangerous signs with the last and accepts any of them.
            keys = list(secrets_now)
            self._made = (
                secrets_now,
                URLSafeTimedSerializer(keys, salt=LINK_SALT),
                URLSafeTimedSerializer(keys, salt=FORM_SALT),
            )
        return self._made[1], self._made[2]

    def mint(self, person: str, execution_id: str, checkpoint_id: str, rule: Rule | None) -> str:
        payload = [person, execution_id, checkpoint_id, rule.name if rule else "", rule_print(rule)]
        return str(self._serializers()[0].dumps(payload))

    def _read(self, token: str) -> DecisionLink:
        serializer = self._serializers()[0]
        try:
            payload, signed = serializer.loads(token, max_age=self._max_age, return_timestamp=True)
        except SignatureExpired as exc:
            # The signature was good: only its age is wrong, so say whose link for what.
            try:
                expired = serializer.load_payload(exc.payload or b"")
            except BadSignature:
                raise LinkInvalid() from None
            link = _link_of(expired, exc.date_signed, self.ttl)
            if link is None:
                raise LinkInvalid() from None
            raise LinkExpired(link) from None
        except BadSignature:
            raise LinkInvalid() from None
        link = _link_of(payload, signed, self.ttl)
        if link is None:
            raise LinkInvalid()
        return link

    async def read(self, token: str) -> DecisionLink:
        """The link ``token`` is, or :class:`LinkInvalid` / :class:`LinkExpired`. A link
        no key read so far verifies is tried again with the store's keys read afresh:
        another server may have minted it with a key made since."""
        try:
            return self._read(token)
        except LinkInvalid:
            if not await self.keys.fresh(soon=True):
                raise
        return self._read(token)

    def form_key(self, token: str) -> str:
        """A value only a rendered decision page holds: signed, bound to its link, new
        on each render."""
        return str(self._serializers()[1].dumps([token_digest(token), secrets.token_urlsafe(9)]))

    async def check_form_key(self, token: str, key: str) -> bool:
        """Whether ``key`` was rendered for ``token``'s page, within the link's life."""
        for attempt in range(2):
            try:
                value = self._serializers()[1].loads(key, max_age=self._max_age)
            except BadSignature:
                if attempt == 0 and await self.keys.fresh(soon=True):
                    continue
                return False
            return isinstance(value, list) and len(value) == 2 and value[0] == token_digest(token)
        return False


def _link_of(payload: Any, signed: datetime | None, ttl: float) -> DecisionLink | None:
    if (
        not isinstance(payload, list)
        or len(payload) != 5
        or not all(isinstance(part, str) for part in payload)
        or signed is None
    ):
        return None
    issued = signed.timestamp()
    person, execution_id, checkpoint_id, rule, printed = payload
    return DecisionLink(person, execution_id, checkpoint_id, rule, printed, issued, issued + ttl)
