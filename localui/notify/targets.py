"""The targets events go to, checked once at start: a malformed URL is a one-line
error then, while a target that cannot be reached yet is only retried later.

This is also the one place that shows a target's URL. A URL may carry secrets anywhere
after its host: a password (``https://user:PW@host/``), a token in the query, or a
Slack- or Discord-style token in the path. So pages, the CLI, logs, errors and the
outbox's target column show only its scheme, its host (as Apprise masks it, for a chat
URL) and a fingerprint: the first 10 hex digits of the SHA-256 of ``"<kind> <URL>"``
(``printf 'webhook %s' URL | sha256sum`` tells which of yours it is), as
``https://hooks.example.com/…#1a2b3c4d5e``.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

from localui.policy import Policy
from localui.settings import Notifications

CHAT = "chat"
WEBHOOK = "webhook"

#: A URL inside text (an error, an id recorded before targets were masked).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
#: A fingerprint at the end of a shown target: kept when text is masked again.
_FINGERPRINT = re.compile(r"#[0-9a-f]{10}$")


class TargetError(ValueError):
    """A target URL that cannot be used, said in one line."""


def fingerprint(kind: str, url: str) -> str:
    return hashlib.sha256(f"{kind} {url}".encode("utf-8", "surrogatepass")).hexdigest()[:10]


def masked(url: str) -> str:
    """``url`` with nothing after its host: ``scheme://host[:port]``, and ``/…`` when
    a user, password, path, query or fragment was left out."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "…"
    end = min((rest.index(c) for c in "/?#" if c in rest), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    host = netloc.rpartition("@")[2]
    hidden = "@" in netloc or tail not in ("", "/")
    return f"{scheme}://{host or '(no host)'}{'/…' if hidden else ''}"


def mask_urls(text: str) -> str:
    """``text`` with every URL in it :func:`masked`, a fingerprint after one kept."""

    def one(found: re.Match[str]) -> str:
        url = found.group(0)
        mark = _FINGERPRINT.search(url)
        if mark is None:
            return masked(url)
        return masked(url[: mark.start()]) + mark.group(0)

    return _URL.sub(one, text)


@dataclass(frozen=True, slots=True)
class Target:
    """One place events go. ``url`` may hold secrets: only ``label`` is ever shown."""

    kind: str
    url: str
    #: What pages, the CLI and logs show: scheme, host and fingerprint (module doc).
    label: str
    #: The outbox's key for this target before its label was masked (it showed the
    #: path): rows recorded under it are renamed to :attr:`id` at start.
    former_id: str = ""

    @property
    def id(self) -> str:
        """Stable across restarts and the same in every process with the same URL, and
        secret-free: the outbox keys each delivery by it."""
        return self.label


def _target(kind: str, url: str, shown: str, formerly_shown: str) -> Target:
    digest = fingerprint(kind, url)
    return Target(
        kind=kind,
        url=url,
        label=f"{masked(shown)}#{digest}",
        former_id=f"{formerly_shown}#{digest}",
    )


@dataclass(frozen=True, slots=True)
class WebhookAddress:
    """Where a webhook POST goes: the URL without its ``user:password@``, which is sent
    as HTTP Basic authorization instead (never resolved as part of the host)."""

    url: str
    authorization: str | None


def webhook_address(url: str) -> WebhookAddress:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return WebhookAddress(url, None)
    user = unquote(parts.username or "")
    password = unquote(parts.password or "")
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    return WebhookAddress(bare, f"Basic {basic}")


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
    return _target(CHAT, url, said, said)


def webhook_target(url: str) -> Target:
    """An ``http://`` or ``https://`` URL with a host; a ``user:password@`` in it is
    sent as Basic authorization (:func:`webhook_address`)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"--webhook {masked(url)}: not an http:// or https:// URL with a host")
    try:
        port = parts.port
    except ValueError as exc:
        raise TargetError(f"--webhook {masked(url)}: {mask_urls(str(exc))}") from exc
    where = parts.hostname + (f":{port}" if port else "")
    return _target(WEBHOOK, url, url, f"{parts.scheme}://{where}{parts.path}")


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
