"""The settings one app process runs with."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from localui import runs
from localui.policy import Policy

#: The name localui prints its links with. Browsers resolve every ``*.localhost`` name
#: to loopback, and keep a cookie it sets for that name alone: unlike one set on
#: ``127.0.0.1`` or ``localhost`` (cookies ignore ports), it never goes to another web
#: server of this machine that the browser visits by those names.
APP_HOST = "localui.localhost"
#: Names of this machine: accepted in ``Host`` from loopback clients only.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", APP_HOST)


@dataclass(frozen=True, slots=True)
class OpenIDConnect:
    """Sign-in at the team's identity provider (``localui.oidc``)."""

    #: The issuer's URL, as its discovery document names it.
    issuer: str
    client_id: str
    client_secret: str
    #: The ID token's claim that names the person.
    name_claim: str = "preferred_username"
    #: The ID token's claim that lists the person's groups.
    groups_claim: str = "groups"
    #: (group, role) pairs: a person gets the highest role of their groups; a person in
    #: none of them is refused.
    roles: tuple[tuple[str, str], ...] = ()
    scopes: str = "openid profile email groups"


@dataclass(frozen=True, slots=True)
class SignIn:
    """Who may use the server, and how they prove it (``localui.auth``)."""

    #: Off only with ``--no-auth``, which the CLI allows on loopback alone.
    required: bool = True
    #: The start-up token (the link printed at start, and scripts' Bearer token);
    #: empty means ``create_app`` makes one.
    token: str = ""
    #: The name decisions record for whoever signs in with the start-up token.
    owner: str = "owner"
    #: Trusted proxy mode: the header naming the person a trusted proxy signed in.
    proxy_user_header: str = ""
    #: The header carrying that person's role; without it, localui's users table
    #: decides, then ``proxy_default_role``.
    proxy_role_header: str = ""
    proxy_default_role: str = "viewer"
    #: The header carrying that person's groups, comma-separated; without it (or
    #: when the proxy sends none), the groups ``localui users`` gave that name.
    proxy_groups_header: str = ""
    #: Addresses or networks (``10.0.0.0/8``) whose proxy headers are believed.
    trusted_proxies: tuple[str, ...] = ()
    #: Bad tokens from one client address: each answer after ``slow_after`` of them
    #: waits ``slow_seconds`` more; after ``lock_after`` the address is refused for
    #: ``lock_seconds``, good token or not.
    slow_after: int = 3
    slow_seconds: float = 0.5
    lock_after: int = 10
    lock_seconds: float = 300.0
    #: Bad tokens from all addresses together in ``global_window`` seconds, past which
    #: every token is refused until the window moves on (sessions carry on).
    global_lock_after: int = 100
    global_window: float = 60.0
    #: How long a session cookie stays good.
    session_seconds: int = 7 * 86400
    #: Sign-in at an OpenID Provider beside tokens and the proxy, when set.
    oidc: OpenIDConnect | None = None


#: How long an unfinished decision's process may stay silent before another process
#: takes the decision over (``localui.backends.decisions``).
CLAIM_LEASE_SECONDS = 30.0


#: Every event a watcher announces (``localui.notify.events``).
EVENT_TYPES = (
    "run.paused",
    "run.decided",
    "run.failed",
    "run.stalled",
    "pause.overdue",
    "pause.escalated",
    "pause.timed_out",
    "pause.noted",
)
#: Not an event of its own: the ``run.failed`` of a run someone cancelled on purpose,
#: which ``--notify-on`` chooses apart from other failures (``cancelled``).
CANCELLED_FAILURES = "run.failed.cancelled"
#: What ``--notify-on`` chooses from, as the watcher holds it.
EVENT_CHOICES = (*EVENT_TYPES, CANCELLED_FAILURES)


@dataclass(frozen=True, slots=True)
class Notifications:
    """Where events are announced (``localui.notify``), and how deliveries are retried."""

    #: Apprise URLs (``slack://…``, ``mailto://…``, ``json://host/path``): one digest
    #: message per poll each.
    chat: tuple[str, ...] = ()
    #: URLs that get one signed JSON POST per event (Standard Webhooks).
    webhooks: tuple[str, ...] = ()
    #: The webhooks' signing secret in its ``whsec_…`` form.
    webhook_secret: str = ""
    #: The absolute base of deep links; empty: built from host, port and root path.
    public_url: str = ""
    #: The event types announced (and :data:`CANCELLED_FAILURES` when a cancelled
    #: run's ``run.failed`` is announced too).
    events: tuple[str, ...] = EVENT_CHOICES
    #: Keys whose values never leave in a message (anywhere in a pause's context).
    redact: tuple[str, ...] = ()
    #: How many overdue reminders a pause gets at most.
    remind_times: int = 3
    #: Retries: the first after ``retry_initial`` seconds, each wait twice the last,
    #: at most ``retry_max``; given up on ``retry_for`` seconds after the event.
    retry_initial: float = 1.0
    retry_max: float = 300.0
    retry_for: float = 86400.0
    #: How long a sender holds the rows it claimed: a process that died holding them
    #: lets them go after this, and another process sends them.
    lease: float = 60.0
    #: How often the watcher looks for stalled runs and overdue pauses, in seconds.
    sweep_interval: float = 10.0
    #: Seconds after start before the first of those looks (which announces the pauses
    #: already waiting): the server answers its first pages before that work.
    first_sweep_after: float = 2.0
    #: Each webhook POST or chat message gives up after this many seconds.
    timeout: float = 10.0
    #: How long a personal decision link opens its page, in seconds (``--link-ttl``).
    link_ttl: float = 86400.0

    @property
    def configured(self) -> bool:
        return bool(self.chat or self.webhooks)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``create_app`` needs to know; built by the CLI or a test."""

    #: A SQLite file path, or a ``postgresql://`` URL.
    store: str
    host: str = "127.0.0.1"
    port: int = 8765
    #: Hide every action and refuse them on the server with 403.
    read_only: bool = False
    #: How long a decision's process may go without a heartbeat before another
    #: process carries the decision out (``--claim-lease``).
    claim_lease_seconds: float = CLAIM_LEASE_SECONDS
    #: Extra ``Host`` names to accept besides loopback and ``host`` itself.
    allowed_hosts: tuple[str, ...] = ()
    #: How often the change feed looks at the store, in seconds.
    poll_interval: float = 0.5
    #: PostgreSQL schema holding the SDK's tables.
    pg_schema: str = "fastaiagent"
    #: PostgreSQL schema of the app's own table (``localui_decisions``), made on first use.
    pg_app_schema: str = "localui"
    page_size: int = 50
    #: The path prefix a reverse proxy strips before it forwards (``--root-path``):
    #: links and redirects put it back. Mounted in a parent app, the mount sets it.
    root_path: str = ""
    sign_in: SignIn = SignIn()
    #: The SQLite file the SDK traced into (``--traces``); by default a SQLite
    #: store's own file, where the SDK writes its spans.
    traces: str | None = None
    #: An unfinished run whose newest row is older than this many seconds is stalled
    #: (``--stale-after``): its process most likely died.
    stale_after: float = 600.0
    #: A pause waiting longer than this many seconds is overdue (``--remind-after``).
    remind_after: float = 3600.0
    #: A file holding the Bearer token a Prometheus scraper sends to ``/metrics``
    #: (``--metrics-token-file``); empty: only people signed in may read it.
    metrics_token_file: str = ""
    #: The approval policy (``--policy``, ``localui.policy``); None decides every pause
    #: as without one: any approver, alone.
    policy: Policy | None = None
    notifications: Notifications = Notifications()

    @property
    def notifies(self) -> bool:
        """Whether this server announces anything: it has a target of its own, or a
        policy rule has ``notify`` URLs, and it may write (the outbox is a table; a
        read-only server sharing a policy file announces nothing)."""
        targets = self.notifications.configured or bool(self.policy and self.policy.notify_urls)
        return targets and not self.read_only

    def attention_cutoffs(self, now: datetime) -> tuple[str, str]:
        """``(stale_before, overdue_before)``: the instants before which an unfinished run
        is stalled and a pause overdue, as of ``now``."""
        return runs.cutoff(now, self.stale_after), runs.cutoff(now, self.remind_after)

    @property
    def host_names(self) -> frozenset[str]:
        """``Host`` header names this server answers to."""
        names = set(LOOPBACK_NAMES) | set(self.allowed_hosts)
        if self.host not in ("0.0.0.0", "::", ""):
            names.add(self.host)
        return frozenset(names)
