"""The targets events go to, checked once at start: a malformed URL is a one-line
error then, while a target that cannot be reached yet is only retried later."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from urllib.parse import urlsplit

from localui.policy import Policy
from localui.settings import Notifications

CHAT = "chat"
WEBHOOK = "webhook"


class TargetError(ValueError):
    """A target URL that cannot be used, said in one line."""


@dataclass(frozen=True, slots=True)
class Target:
    """One place events go. ``url`` may hold a token: only ``label`` is ever shown."""

    kind: str
    url: str
    #: The URL with its secrets masked, as pages and the CLI show it.
    label: str

    @property
    def id(self) -> str:
        """Stable across restarts and the same in every process with the same URL, and
        secret-free: the outbox keys each delivery by it."""
        digest = hashlib.sha256(f"{self.kind} {self.url}".encode()).hexdigest()[:10]
        return f"{self.label}#{digest}"


def chat_target(url: str, given_as: str = "--notify") -> Target:
    """An Apprise URL (``slack://…``, ``mailto://…``, ``json://…``) Apprise accepts,
    checked in the Apprise child process (``localui.notify.apprise_process``);
    ``given_as`` names where it was given, for the error."""
    from localui.notify.apprise_process import AppriseGone, shared

    try:
        kind, said = shared().label(url)
    except AppriseGone as exc:
        raise TargetError(f"{given_as}: the URL could not be checked: {exc}") from exc
    if kind == "error":
        scheme = url.split("://", 1)[0] if "://" in url else url
        raise TargetError(
            f"{given_as} {scheme}://…: not a notification URL Apprise knows, or missing its"
            " parts (see the Apprise wiki for the form of each service's URL)"
        )
    return Target(kind=CHAT, url=url, label=said)


def webhook_target(url: str) -> Target:
    """An ``http://`` or ``https://`` URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"--webhook {url!r}: not an http:// or https:// URL with a host")
    try:
        port = parts.port
    except ValueError as exc:
        raise TargetError(f"--webhook {url!r}: {exc}") from exc
    where = parts.hostname + (f":{port}" if port else "")
    return Target(kind=WEBHOOK, url=url, label=f"{parts.scheme}://{where}{parts.path}")


def targets_of(settings: Notifications, *, chat: bool = True) -> tuple[Target, ...]:
    """Every configured target (the chat ones only with ``chat``); raises
    :class:`TargetError` for the first bad one."""
    if settings.webhooks and not settings.webhook_secret:
        raise TargetError("--webhook needs --webhook-secret-file: receivers check the signature")
    if settings.webhook_secret:
        from standardwebhooks.webhooks import Webhook

        try:
            Webhook(settings.webhook_secret)
        except Exception as exc:
            raise TargetError(f"the webhook secret is not a whsec_… base64 secret: {exc}") from exc
    return (
        *(chat_target(u) for u in (settings.chat if chat else ())),
        *(webhook_target(u) for u in settings.webhooks),
    )


def routes_of(policy: Policy | None) -> dict[str, tuple[Target, ...]]:
    """Each policy rule's own targets (its ``notify`` URLs), by rule name; raises
    :class:`TargetError` for the first bad one."""
    if policy is None:
        return {}
    checked: dict[str, Target] = {}
    routes: dict[str, tuple[Target, ...]] = {}
    for rule in policy.rules:
        for url in rule.notify:
            if url not in checked:
                checked[url] = chat_target(url, f"policy rule {rule.name!r}: notify")
        if rule.notify:
            routes[rule.name] = tuple(checked[url] for url in rule.notify)
    return routes
