"""Delivering what the outbox holds: a chat digest per target, a signed POST per event.

Each round claims the due rows (a lease: see ``localui.backends.notifications``),
sends them, and marks each sent, or failed and due again after a backoff: 1 s,
2 s, 4 s … at most ``retry_max``, until ``retry_for`` after the event, when it is
given up on with its last error. The schedule lives in the outbox, not in this
process, so a restart, or another process, goes on where it stopped.

Rows of a target no process is started with any more (a ``--notify`` URL dropped, a
policy rule's ``notify`` removed) would wait for ever: once their ``give_up_at`` has
passed, a round gives them up too, saying why (:data:`NOT_CONFIGURED`), at most
:data:`ROUND_SIZE` at a time and once a sweep interval. Not before: until then another
process may still be serving that target.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import tenacity

from localui.backends.base import Outbox
from localui.backends.notifications import Notification
from localui.links import LinkSigner
from localui.notify import formats
from localui.notify.events import Event
from localui.notify.outbox import event_of
from localui.notify.people import PERSONAL_EVENTS, People, person_of_target
from localui.notify.targets import CHAT, Target, mask_urls, webhook_address
from localui.settings import Notifications

logger = logging.getLogger(__name__)

#: Rows one round claims at most: a chat target gets them in one message.
ROUND_SIZE = 200
#: The error of a row given up on because no server was started with its target.
NOT_CONFIGURED = (
    "given up: the target is no longer configured (no server of this store sends to it)"
)


class DeliveryError(Exception):
    """A target did not take a delivery; the message says why, in one line."""


def message_id(event_key: str) -> str:
    """The ``webhook-id``: the same for every attempt at one event, so a receiver
    can drop a repeat (a header value, so no control characters)."""
    import hashlib

    return "msg_" + hashlib.sha256(event_key.encode()).hexdigest()[:32]


def backoff(settings: Notifications) -> Callable[[int], float]:
    """Seconds to wait after the ``n``-th failed attempt (tenacity's exponential wait)."""
    wait = tenacity.wait_exponential(multiplier=settings.retry_initial, max=settings.retry_max)
    retrying = tenacity.Retrying()

    def after(attempts: int) -> float:
        state = tenacity.RetryCallState(retrying, None, (), {})
        state.attempt_number = max(attempts, 1)
        return float(wait(state))

    return after


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class Deliverer:
    """Sends to the targets; blocking I/O, called from a worker thread."""

    def __init__(
        self,
        settings: Notifications,
        links: formats.Links,
        *,
        now: Callable[[], datetime],
        people: People | None = None,
        link_signer: LinkSigner | None = None,
    ) -> None:
        self.settings = settings
        self.links = links
        self._now = now
        self.people = people
        self.link_signer = link_signer
        self._redact = frozenset(settings.redact)
        self._signer: Any = None
        if settings.webhook_secret:
            from standardwebhooks.webhooks import Webhook

            self._signer = Webhook(settings.webhook_secret)

    def personal_link(self, person: str, event: Event) -> formats.PersonalLink | None:
        """``person``'s own decision link for a pause event, minted now (it lives
        ``--link-ttl`` from now, so a message sent late still gets a whole day), and the
        away person they decide it for, if they are told as a delegate."""
        if (
            event.type not in PERSONAL_EVENTS
            or self.link_signer is None
            or self.links.decide is None
            or self.people is None
            or not event.checkpoint_id
        ):
            return None
        rule = self.people.rule_named(event.rule)
        token = self.link_signer.mint(person, event.execution_id, event.checkpoint_id, rule)
        for_name = self.people.deciding_for(person, event, self._now())
        return formats.PersonalLink(self.links.decide(event.execution_id, token), for_name)

    def chat(self, target: Target, batch: Sequence[Notification]) -> None:
        """One Apprise message about every event in ``batch``, sent by the Apprise
        child process (``localui.notify.apprise_process``); to a person, with their
        own decision links."""
        from localui.notify.apprise_process import shared

        person = person_of_target(target.id)
        personal = None
        if person is not None:

            def personal(event: Event) -> formats.PersonalLink | None:
                return self.personal_link(person, event)

        events = [event_of(n) for n in batch]
        title, body = formats.message(events, self.links, self._now(), personal)
        try:
            shared().send(target.url, title, body)
        except Exception as exc:
            said = str(exc).strip().splitlines()
            raise DeliveryError(
                said[-1] if said else f"{target.label} did not take the message"
            ) from exc

    def webhook(self, target: Target, notification: Notification) -> None:
        """One signed POST (Standard Webhooks) about one event."""
        event = event_of(notification)
        body = json.dumps(formats.webhook_body(event, self.links, self._redact), ensure_ascii=False)
        msg_id = message_id(notification.event_key)
        stamp = datetime.now(UTC)
        headers = {
            "content-type": "application/json",
            "user-agent": "localui",
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(stamp.timestamp())),
            "webhook-signature": self._signer.sign(msg_id, stamp, body),
        }
        address = webhook_address(target.url)
        request = urllib.request.Request(
            address.url, data=body.encode(), headers=headers, method="POST"
        )
        if address.authorization is not None:
            # Unredirected: a redirect to another host never carries the password on.
            request.add_unredirected_header("Authorization", address.authorization)
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout) as answer:
                answer.read()
        except urllib.error.HTTPError as exc:
            raise DeliveryError(f"{target.label} answered HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DeliveryError(f"{target.label} cannot be reached: {reason}") from exc


@dataclass(frozen=True, slots=True)
class Round:
    """What one round of sending did."""

    claimed: int
    sent: int
    failed: int
    #: Rows of targets no longer configured given up on (:data:`NOT_CONFIGURED`).
    abandoned: int = 0


class Sender:
    """Claims due rows and delivers them; one round at a time, from a worker thread."""

    def __init__(
        self,
        outbox: Outbox,
        targets: Sequence[Target],
        deliverer: Deliverer,
        settings: Notifications,
        *,
        people: People | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.outbox = outbox
        self.targets = {t.id: t for t in targets}
        #: People with an address, each a target of their own (``localui.notify.people``).
        self.people = people
        self.deliverer = deliverer
        self.settings = settings
        self._clock = clock
        self._backoff = backoff(settings)
        #: When this sender last gave up on rows of targets no longer configured.
        self._abandoned_at: float | None = None

    def give_up_unconfigured(self, now: float, targets: Mapping[str, Target]) -> int:
        """Give up on the waiting rows of targets this process is not started with whose
        ``give_up_at`` has passed; once a sweep interval (it takes the write lock on
        SQLite), or again at once while a round gives up on as many as it may."""
        if self._abandoned_at is not None and now - self._abandoned_at < (
            self.settings.sweep_interval
        ):
            return 0
        given_up = self.outbox.give_up_unconfigured(
            targets=list(targets), now=now, detail=NOT_CONFIGURED, limit=ROUND_SIZE
        )
        self._abandoned_at = None if given_up >= ROUND_SIZE else now
        if given_up:
            logger.warning(
                "gave up on %d notification(s) for targets no server is started with", given_up
            )
        return given_up

    def send_round(self) -> Round:
        started = self._clock()
        targets = self.targets
        if self.people is not None:
            # People with an address now: a person whose address was cleared, or who
            # was removed, is a target no longer configured.
            targets = {**targets, **self.people.targets()}
        abandoned = self.give_up_unconfigured(started, targets)
        claimed = self.outbox.claim_due(
            now=started, lease=self.settings.lease, limit=ROUND_SIZE, targets=list(targets)
        )
        by_target: dict[str, list[Notification]] = {}
        for row in claimed:
            by_target.setdefault(row.target, []).append(row)
        sent = failed = 0
        untried: list[int] = []
        for target_id, rows in by_target.items():
            target = targets[target_id]
            if target.kind == CHAT:
                groups = [rows]
            else:
                groups = [[r] for r in rows]
            for group in groups:
                # Past half the lease, another process may soon take these rows over:
                # let them go rather than risk sending them twice.
                if self._clock() - started > self.settings.lease / 2:
                    untried.extend(r.id for r in group)
                    continue
                if self._deliver(target, group):
                    sent += len(group)
                else:
                    failed += len(group)
        self.outbox.release(untried)
        return Round(claimed=len(claimed), sent=sent, failed=failed, abandoned=abandoned)

    def _deliver(self, target: Target, group: Sequence[Notification]) -> bool:
        ids = [r.id for r in group]
        try:
            if target.kind == CHAT:
                self.deliverer.chat(target, group)
            else:
                self.deliverer.webhook(target, group[0])
        except Exception as exc:
            # What a target answered may quote its URL back: never a secret in the outbox.
            error = mask_urls(_one_line(exc))
            now = self._clock()
            for row in group:
                next_at = now + self._backoff(row.attempts + 1)
                give_up = next_at > row.give_up_at
                if give_up:
                    logger.warning("gave up on %s for %s: %s", row.event_type, target.label, error)
                self.outbox.mark_attempt_failed(
                    [row.id], error, next_at=None if give_up else next_at, now=now
                )
            return False
        self.outbox.mark_sent(ids, now=self._clock())
        return True
