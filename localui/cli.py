"""``localui serve`` and ``localui demo``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localui.audit import NOTIFICATION_RETRY, USER_ACTIONS
from localui.contexts import ContextFactory, RunContexts
from localui.errors import LocalUIError
from localui.policy import Policy, PolicyError, load_policy
from localui.registry import Registry, RegistryError, load_spec
from localui.roles import ROLES
from localui.settings import (
    APP_HOST,
    CLAIM_LEASE_SECONDS,
    EVENT_CHOICES,
    LOOPBACK_NAMES,
    Notifications,
    OpenIDConnect,
    Settings,
    SignIn,
)

if TYPE_CHECKING:
    from localui.actions import ActionService
    from localui.demo.scenarios import Seeding
    from localui.records import SeedFailure, SeedProgress
    from localui.views.state import Seeding as AppSeeding

DEFAULT_PORT = 8765


def default_store() -> str:
    """The SDK's own default: ``FASTAIAGENT_LOCAL_DB``, else ``.fastaiagent/local.db``."""
    return os.environ.get("FASTAIAGENT_LOCAL_DB") or ".fastaiagent/local.db"


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="Interface to listen on. Loopback by default: the app can approve and resume "
        "runs, so any other address requires sign-in (or --auth-proxy-header).",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="Another Host header name to answer to (loopback names always are).",
    )
    parser.add_argument("--read-only", action="store_true", help="Show everything, change nothing.")
    parser.add_argument(
        "--stale-after",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="An unfinished run with no new row for this long is stalled: its process most "
        "likely died (default: 600).",
    )
    parser.add_argument(
        "--remind-after",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="A pause waiting for a person this long is overdue, and reminded of again each"
        " interval when notifications are on (default: 3600).",
    )
    parser.add_argument(
        "--metrics-token-file",
        default="",
        metavar="PATH",
        help="A file holding the Bearer token a Prometheus scraper reads /metrics with "
        "(people signed in may read it without one).",
    )
    parser.add_argument(
        "--claim-lease",
        type=float,
        default=CLAIM_LEASE_SECONDS,
        metavar="SECONDS",
        help="A decision whose process has not said it is alive for this long was left by a"
        " process that died: another localui on the store carries it out"
        f" (default {CLAIM_LEASE_SECONDS:g}).",
    )
    parser.add_argument(
        "--root-path",
        default="",
        metavar="PREFIX",
        help="Behind a reverse proxy that serves the app at PREFIX (e.g. /tools/localui) and "
        "strips it before forwarding: every link, form and redirect carries PREFIX.",
    )
    auth = parser.add_argument_group(
        "sign-in",
        "Sign-in is on: the server prints a link carrying a token made at start (it signs in"
        " as an operator); `localui users add` makes links for other people.",
    )
    auth.add_argument(
        "--no-auth",
        action="store_true",
        help="No sign-in: anyone who can reach the server may act. Loopback --host only.",
    )
    auth.add_argument(
        "--auth-proxy-header",
        default="",
        metavar="HEADER",
        help="Believe this header (e.g. X-Forwarded-User) as the signed-in person's name, from a"
        " --trusted-proxy address only: for teams behind their own single sign-on proxy.",
    )
    auth.add_argument(
        "--auth-proxy-role-header",
        default="",
        metavar="HEADER",
        help="With --auth-proxy-header: the header carrying the person's role (viewer, approver,"
        " operator). Without it, the role `localui users add` gave that name, else"
        " --auth-proxy-default-role.",
    )
    auth.add_argument(
        "--auth-proxy-groups-header",
        default="",
        metavar="HEADER",
        help="With --auth-proxy-header: the header carrying the person's groups,"
        " comma-separated, as the approval policy's group:NAME reads them. Without it, the"
        " groups `localui users` gave that name.",
    )
    auth.add_argument(
        "--auth-proxy-default-role",
        default="viewer",
        choices=ROLES,
        help="The role of a proxied person nothing else gives a role to (default: viewer).",
    )
    auth.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="An address or network (10.0.0.0/8) of the proxy whose headers are believed.",
    )
    auth.add_argument(
        "--oidc-issuer",
        default="",
        metavar="URL",
        help="Sign in at this OpenID Provider (its issuer URL, as its discovery document names"
        " it), beside tokens. Register {public URL}/signin/oidc/callback as the redirect URI.",
    )
    auth.add_argument("--oidc-client-id", default="", metavar="ID")
    auth.add_argument(
        "--oidc-client-secret-file",
        default="",
        metavar="FILE",
        help="A file holding the client's secret (kept out of the command line).",
    )
    auth.add_argument(
        "--oidc-role",
        action="append",
        default=[],
        metavar="GROUP=ROLE",
        help="People in GROUP get ROLE (viewer, approver, operator; the highest of their"
        " groups wins). Repeatable; someone in no mapped group is refused.",
    )
    auth.add_argument(
        "--oidc-name-claim",
        default="preferred_username",
        metavar="CLAIM",
        help="The ID token's claim decisions name the person by (default preferred_username).",
    )
    auth.add_argument(
        "--oidc-groups-claim",
        default="groups",
        metavar="CLAIM",
        help="The ID token's claim listing the person's groups (default groups); they are"
        " also the groups an approval policy's group:NAME matches.",
    )
    auth.add_argument(
        "--oidc-scopes",
        default="openid profile email groups",
        metavar="SCOPES",
        help="The scopes asked for (default: openid profile email groups).",
    )


def _add_policy_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy",
        default=None,
        metavar="FILE",
        help="An approval policy (TOML): who may decide which pauses, how many people must"
        " approve, and the fields they fill in for the tool. Checked at start.",
    )


def _add_notify_options(parser: argparse.ArgumentParser) -> None:
    notify = parser.add_argument_group(
        "notifications",
        "Tell people when a run waits, is decided, fails or stalls: every event once, from"
        " an outbox in the store's database, retried until the target takes it.",
    )
    notify.add_argument(
        "--notify",
        action="append",
        default=[],
        metavar="URL",
        help="An Apprise URL (slack://…, msteams://…, mailto://…, ntfy://…, json://host/path):"
        " one message per poll, listing what happened (repeatable).",
    )
    notify.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="URL",
        help="An http(s) URL that gets one signed JSON POST per event, as Standard Webhooks"
        " lays it out (repeatable; needs --webhook-secret-file).",
    )
    notify.add_argument(
        "--webhook-secret-file",
        default=None,
        metavar="FILE",
        help="A file holding the webhooks' signing secret, in its whsec_… form.",
    )
    notify.add_argument(
        "--public-url",
        default="",
        metavar="URL",
        help="Where people open this server (https://ops.example.com/localui): the base of"
        " the links in messages (default: built from --host, --port and --root-path).",
    )
    notify.add_argument(
        "--notify-on",
        default="paused,decided,failed,cancelled,stalled,overdue,escalated,timed_out,noted",
        metavar="EVENTS",
        help="Which events to announce (default: paused,decided,failed,cancelled,stalled,"
        "overdue,escalated,timed_out,noted). 'noted' is a note left on a pause; 'escalated'"
        " and 'timed_out' are a policy rule's deadline passing (its due, its on_timeout"
        " decision);"
        " 'failed' is a run that failed or ran out of its timeout_seconds;"
        " 'cancelled' is the run.failed of a run someone cancelled on purpose (leave it out"
        " to hear of failures only).",
    )
    notify.add_argument(
        "--notify-redact",
        action="append",
        default=[],
        metavar="KEY",
        help="Never send the values of this key of a pause's context or call (repeatable).",
    )
    notify.add_argument(
        "--link-ttl",
        default="24h",
        metavar="AGE",
        help="How long a person's own decision link (sent to their --notify address) opens"
        " its pause's page: 90s, 30m, 12h, 7d (default: 24h).",
    )
    notify.add_argument(
        "--notify-lease",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="How long a server holds the deliveries it is making: if it dies meanwhile,"
        " another server (or this one restarted) sends them after this (default: 60).",
    )
    notify.add_argument(
        "--remind-times",
        type=int,
        default=3,
        metavar="N",
        help="Remind about one pause at most N times (default: 3).",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localui",
        description="See, trust and act on the durable runs of FastAIAgent agents.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="Serve the UI for a checkpoint store.")
    serve.add_argument(
        "--store",
        default=None,
        help="The store: a SQLite file (default: $FASTAIAGENT_LOCAL_DB or .fastaiagent/local.db),"
        " or a fleet's PostgreSQL database as postgresql://USER@HOST[:PORT]/DB (keep the password"
        " in ~/.pgpass or $PGPASSWORD rather than in the URL).",
    )
    serve.add_argument(
        "--pg-schema",
        default="fastaiagent",
        metavar="SCHEMA",
        help="With a postgresql:// store: the schema of the SDK's tables, as given to "
        "PostgresCheckpointer(schema=...) (default: fastaiagent).",
    )
    serve.add_argument(
        "--pg-app-schema",
        default="localui",
        metavar="SCHEMA",
        help="With a postgresql:// store: the schema of localui's own decision table, "
        "created on first use (default: localui).",
    )
    serve.add_argument(
        "--traces",
        default=None,
        metavar="PATH",
        help="The SQLite file the SDK traced into (default: a SQLite store's own file). "
        "With a postgresql:// store, name the local.db the agents wrote their spans to.",
    )
    serve.add_argument(
        "--agents",
        action="extend",
        nargs="+",
        default=[],
        metavar="SPEC",
        help="Agents this process may resume: MODULE:ATTR or FILE.py:ATTR (an Agent, a "
        "list of them, or a function returning either).",
    )
    serve.add_argument(
        "--context",
        action="append",
        default=[],
        metavar="[RUNNER=]SPEC",
        help="The RunContext that resumes and forks hand the tools: MODULE:FACTORY or "
        "FILE.py:FACTORY, a function called as FACTORY(execution_id=RUN_ID, runner=NAME) "
        "before each resume or fork that returns a fastaiagent RunContext. Unqualified it "
        "serves every runner; RUNNER=SPEC serves that runner instead. Repeatable. A factory "
        "that raises refuses the action before the pause is claimed.",
    )
    _add_server_options(serve)
    _add_policy_option(serve)
    _add_notify_options(serve)

    demo = sub.add_parser(
        "demo", help="Make a fresh store of demo runs (every durability case) and serve it."
    )
    demo.add_argument(
        "--store", default=None, help="Where to write the demo store (default: a temp dir)."
    )
    demo.add_argument(
        "--seed-only", action="store_true", help="Write the store, print its path, and stop."
    )
    _add_server_options(demo)
    _add_policy_option(demo)
    _add_notify_options(demo)

    export = sub.add_parser(
        "export", help="Write one run (rows, pause, cache, decisions, forks, spans) to a file."
    )
    export.add_argument("execution_id", metavar="RUN_ID")
    export.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="FILE",
        help="Where to write it (default: RUN_ID.localui.gz here).",
    )
    export.add_argument("--store", default=None, help="The store, as for serve.")
    export.add_argument("--pg-schema", default="fastaiagent", metavar="SCHEMA")
    export.add_argument("--pg-app-schema", default="localui", metavar="SCHEMA")
    export.add_argument(
        "--traces",
        default=None,
        metavar="PATH",
        help="The SQLite file the SDK traced into, as for serve.",
    )
    export.add_argument(
        "--redact",
        action="append",
        default=[],
        metavar="KEY",
        help="Replace the values of this key everywhere in the file (repeatable).",
    )

    opened = sub.add_parser("open", help="Serve exported runs read-only, with the same pages.")
    opened.add_argument("files", nargs="+", metavar="FILE")
    _add_server_options(opened)
    decisions = sub.add_parser("decisions", help="The decision record, for auditors.")
    decisions_sub = decisions.add_subparsers(dest="decisions_command", required=True)
    exported = decisions_sub.add_parser(
        "export",
        help="Write every decision and vote (newest first) to standard output as CSV or"
        " JSON lines.",
        description="Write every decision and vote (newest first) to standard output as CSV or"
        " JSON lines.",
    )
    exported.add_argument("--store", default=None, help="The store, as for serve.")
    exported.add_argument("--pg-schema", default="fastaiagent", metavar="SCHEMA")
    exported.add_argument("--pg-app-schema", default="localui", metavar="SCHEMA")
    exported.add_argument(
        "--since", default=None, metavar="AGE", help="Only decisions this recent: 90s, 12h, 7d, 2w."
    )
    exported.add_argument("--format", choices=("csv", "jsonl"), default="csv")

    users = sub.add_parser(
        "users", help="The people who may sign in to a store's servers, and their roles."
    )
    users_sub = users.add_subparsers(dest="users_command", required=True)
    for name, what in (
        ("add", "Add a person and print their sign-in link."),
        ("list", "List the people and their roles."),
        ("remove", "Remove a person: their link and sessions stop working."),
        ("reset", "Give a person a new link: the old one and its sessions stop working."),
        (
            "set",
            "Change a person's groups (each --group once; none at all clears them) or,"
            " with --role, their role (their groups stay unless --group is given too).",
        ),
        (
            "away",
            "Mark a person away: OTHER decides what they could (recorded as 'OTHER for"
            " NAME') until WHEN, or until `localui users back NAME`.",
        ),
        ("back", "Mark a person back: they decide their pauses again."),
    ):
        command = users_sub.add_parser(name, help=what, description=what)
        if name != "list":
            command.add_argument("name", help="The person's name, as decisions record it.")
        else:
            command.add_argument(
                "--check",
                action="store_true",
                help="Also list the people whose names look alike (and exit 1 if any do).",
            )
        if name == "add":
            command.add_argument("--role", required=True, choices=ROLES)
        if name == "set":
            command.add_argument("--role", default=None, choices=ROLES)
        if name == "away":
            command.add_argument(
                "--to",
                required=True,
                metavar="OTHER",
                help="Who decides for them: an approver or operator, not themselves.",
            )
            command.add_argument(
                "--until",
                default="",
                metavar="WHEN",
                help="An ISO date or time (2026-12-24, 2026-12-24T18:00; UTC unless a zone"
                " is given) or a length (12h, 3d, 2w). Without it: until they are back.",
            )
        if name in ("add", "set"):
            command.add_argument(
                "--group",
                action="append",
                default=[],
                metavar="GROUP",
                help="A group the approval policy names as group:GROUP (repeatable).",
            )
            address = command.add_mutually_exclusive_group()
            address.add_argument(
                "--notify",
                default=None,
                metavar="URL",
                help="The person's own address, an Apprise URL (mailto://…, json://host/path):"
                " where they are told of the pauses they may decide.",
            )
            if name == "set":
                address.add_argument(
                    "--no-notify",
                    action="store_true",
                    help="Clear the person's own address.",
                )
        command.add_argument(
            "--store", default=None, help="The store (as for serve); its database keeps the table."
        )
        command.add_argument("--pg-app-schema", default="localui", metavar="SCHEMA")
        if name in ("add", "reset"):
            command.add_argument(
                "--url",
                default=f"http://{APP_HOST}:{DEFAULT_PORT}/",
                help="The server's address as the person opens it, for the printed link.",
            )
    keys = sub.add_parser(
        "keys",
        help="The keys that sign sessions, shared by every server of a store.",
        description="The keys that sign sessions, previews and links, kept in the store so"
        " that every server of it accepts one session, after a restart too.",
    )
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    for name, what in (
        ("list", "List the keys: generation, made, accepted until."),
        (
            "rotate",
            "Make a new key to sign with; sessions signed with the older ones are accepted"
            " for --grace more, then end.",
        ),
    ):
        command = keys_sub.add_parser(name, help=what, description=what)
        command.add_argument("--store", default=None, help="The store, as for serve.")
        command.add_argument("--pg-app-schema", default="localui", metavar="SCHEMA")
        if name == "rotate":
            command.add_argument(
                "--grace",
                default="1d",
                metavar="AGE",
                help="How long sessions signed with the older keys stay valid (30m, 12h, 1d;"
                " 0s ends them at once). Default 1d.",
            )
    notifications = sub.add_parser(
        "notifications", help="What was announced, and each target's deliveries."
    )
    notifications_sub = notifications.add_subparsers(dest="notifications_command", required=True)
    for name, what in (
        ("list", "List the newest announcements and each target's deliveries."),
        ("retry", "Send the announcements given up on once more."),
    ):
        command = notifications_sub.add_parser(name, help=what, description=what)
        command.add_argument("--store", default=None, help="The store, as for serve.")
        command.add_argument("--pg-app-schema", default="localui", metavar="SCHEMA")
        if name == "list":
            command.add_argument("--limit", type=int, default=50, metavar="N")
        else:
            command.add_argument(
                "--target", default=None, metavar="ID", help="Only this target's (as listed)."
            )
    audit_parser = sub.add_parser(
        "audit", help="The audit log: every change made through localui, hash-chained."
    )
    audit_sub = audit_parser.add_subparsers(dest="audit_command", required=True)
    for name, what in (
        (
            "verify",
            "Check every row's hash and link; exit 1 naming each row changed or removed.",
        ),
        ("export", "Write every row, oldest first, to standard output as CSV or JSON lines."),
    ):
        command = audit_sub.add_parser(name, help=what, description=what)
        command.add_argument("--store", default=None, help="The store, as for serve.")
        command.add_argument("--pg-app-schema", default="localui", metavar="SCHEMA")
        if name == "export":
            command.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    return parser


def fail(message: str) -> int:
    print(f"localui: {message}", file=sys.stderr)
    return 2


def show_server_log() -> None:
    """What the server does on its own (a decision carried out for a process that died,
    a delivery that keeps failing) goes to stderr, one ``localui:`` line each, beside
    the lines printed at start; Python would otherwise drop all but warnings."""
    import logging

    logger = logging.getLogger("localui")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("localui: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def serve(
    settings: Settings,
    agents: Sequence[Any] = (),
    *,
    specs: Sequence[str] = (),
    context_specs: Sequence[str] = (),
    seeding: AppSeeding | None = None,
) -> int:
    """Open the store, load the agents ``specs`` name, bind them and ``agents`` to it,
    match the ``context_specs`` factories to them, and serve until interrupted (while
    ``seeding`` writes runs into it)."""
    import uvicorn
    from starlette.types import ASGIApp

    from localui.app import create_app
    from localui.backends import open_backend, target_of
    from localui.diff import load_deepdiff
    from localui.limits import server_limits
    from localui.memory import ReleaseFreedMemory, keep_thresholds
    from localui.notify.targets import TargetError, routes_of, targets_of

    target = target_of(settings)
    if target.sqlite_path is not None:
        # The SDK resolves its own default store from this variable, and caches its
        # config on first use: set it before any agent module is imported.
        os.environ.setdefault("FASTAIAGENT_LOCAL_DB", str(target.sqlite_path))
        try:
            is_file = target.sqlite_path.is_file()
        except OSError as exc:
            return fail(f"the store {target.sqlite_path} cannot be read: {exc.strerror}")
        if not is_file:
            return fail(
                f"no store at {target.sqlite_path} (pass --store or set FASTAIAGENT_LOCAL_DB)"
            )
    if settings.read_only and settings.notifications.configured:
        return fail("--read-only writes nothing, and notifications keep an outbox: pick one")
    if settings.notifies:
        try:
            # The webhooks here, and the chat URLs asked of the Apprise child: it
            # checks them while this process goes on starting (see the check below).
            targets_of(settings.notifications, chat=False)
        except TargetError as exc:
            return fail(str(exc))
        chat = [
            *settings.notifications.chat,
            *(settings.policy.notify_urls if settings.policy else ()),
        ]
        if chat:
            from localui.notify.apprise_process import shared

            shared().check_soon(chat)
    # The agents are imported before the store opens: opening may start indexing it
    # in a thread, which would slow the imports down.
    loaded = list(agents)
    try:
        for spec in specs:
            loaded.extend(load_spec(spec))
        factories = [ContextFactory.load(spec) for spec in context_specs]
    except RegistryError as exc:
        return fail(str(exc))
    # Now, not at the first diff (see load_deepdiff): its objects are frozen below with
    # the rest of start-up's, and loaded by the first diff instead (in a worker thread)
    # the viewer held 1.3-1.5 MB more after the bench's pages, on PostgreSQL with spans
    # (79.3-79.5 MB against 77.4-78.0; the budget is 80).
    load_deepdiff()
    # A server stays up for days: have malloc give back what its pages free (see
    # localui.memory), from before the store opens and perhaps starts indexing it.
    releasing = keep_thresholds()
    try:
        backend = open_backend(settings)
    except LocalUIError as exc:
        return fail(str(exc))
    try:
        # Made here once so a missing privilege is one line, not a failed lifespan.
        backend.decision_log(writable=not settings.read_only).close()
        registry = Registry.build(loaded, backend.target)
        contexts = RunContexts.build(factories, registry)
        if settings.notifies:
            targets_of(settings.notifications)
            routes_of(settings.policy)
    except (LocalUIError, RegistryError, TargetError) as exc:
        backend.close()
        return fail(str(exc))
    app: ASGIApp = create_app(
        settings,
        agents=registry.agents.values(),
        contexts=contexts,
        backend=backend,
        seeding=seeding,
    )
    if releasing:
        app = ReleaseFreedMemory(app)
    shown_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{shown_host}:{settings.port}/"
    print(f"localui: serving {backend.label} at {url}", flush=True)
    for line in sign_in_lines(settings, browser_url(settings)):
        print(f"localui: {line}", flush=True)
    if settings.root_path:
        print(f"localui: links point under {settings.root_path}/, where the proxy serves it")
    if registry.agents:
        print(f"localui: agents that can be resumed here: {', '.join(registry.names())}")
    for line in contexts.describe():
        print(f"localui: run context for {line}", flush=True)
    if settings.policy is not None:
        names = ", ".join(repr(r.name) for r in settings.policy.rules) or "none"
        print(f"localui: approval policy {settings.policy.source}: rules {names}", flush=True)
        for rule in settings.policy.rules:
            if rule.notify and settings.notifies:
                told = len(rule.notify)
                print(
                    f"localui: rule {rule.name!r}: its pauses are also announced to"
                    f" {told} target{'s' if told > 1 else ''} of its own",
                    flush=True,
                )
    show_server_log()
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        root_path=settings.root_path,
        # The client address must be the TCP peer: sign-in trusts proxy headers only
        # from --trusted-proxy addresses, and a loopback Host only from loopback.
        proxy_headers=False,
        # Open streams must not hold a stopping server for long.
        timeout_graceful_shutdown=2,
        **server_limits(),
    )
    # uvicorn stops on Ctrl-C or SIGTERM, then raises the signal again for whoever
    # installed a handler; these make that a quiet exit 0 through the clean-up below,
    # instead of a KeyboardInterrupt traceback or death by signal before it.
    signal.signal(signal.SIGINT, _exit_quietly)
    signal.signal(signal.SIGTERM, _exit_quietly)
    # What start-up made (modules, templates, the SDK, the agents) lives as long as the
    # server: moved out of the collector's generations, about 90,000 objects that are
    # never garbage are no longer walked by every full collection a page's allocations
    # set off (at a million runs, averaged over 60 requests: the run page of 50 rows
    # 1.9 ms a request before, 0.4 after; a compare as JSON 2.5, then 0.8). Garbage made
    # later is collected as ever.
    gc.freeze()
    try:
        uvicorn.Server(config).run()
    finally:
        backend.close()
    return 0


def is_loopback_host(host: str) -> bool:
    return host in LOOPBACK_NAMES or host.startswith("127.")


def browser_url(settings: Settings) -> str:
    """The address a person opens: on loopback, by localui's own name (``APP_HOST``),
    so the session cookie the link sets is sent to no other server of this machine."""
    host = APP_HOST if settings.host in LOOPBACK_NAMES else settings.host
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{settings.port}/"


def sign_in_problem(args: argparse.Namespace) -> str | None:
    """Why these sign-in options cannot be served, or None."""
    if args.no_auth and not is_loopback_host(args.host):
        return (
            f"--no-auth with --host {args.host} would let anyone on the network act on the"
            " store: drop --no-auth (sign-in) or use --auth-proxy-header behind your proxy"
        )
    if args.no_auth and args.auth_proxy_header:
        return "--no-auth and --auth-proxy-header contradict each other: pick one"
    if args.auth_proxy_header and not args.trusted_proxy:
        return "--auth-proxy-header needs --trusted-proxy: the addresses of your proxy"
    from localui.auth import parse_networks

    try:
        parse_networks(tuple(args.trusted_proxy))
        oidc_of(args)
    except LocalUIError as exc:
        return str(exc)
    return None


def oidc_of(args: argparse.Namespace) -> OpenIDConnect | None:
    """The ``--oidc-*`` options, checked and the secret read; :class:`BadRequest` says
    what is wrong in one line."""
    from urllib.parse import urlsplit

    from localui.errors import BadRequest

    given = [args.oidc_client_id, args.oidc_client_secret_file, *args.oidc_role]
    if not args.oidc_issuer:
        if any(given):
            raise BadRequest(
                "--oidc-client-id, --oidc-client-secret-file and --oidc-role need --oidc-issuer"
            )
        return None
    if args.no_auth:
        raise BadRequest("--no-auth and --oidc-issuer contradict each other: pick one")
    issuer = urlsplit(args.oidc_issuer)
    local = (issuer.hostname or "") in LOOPBACK_NAMES or (issuer.hostname or "").startswith("127.")
    if issuer.scheme != "https" and not (issuer.scheme == "http" and local):
        raise BadRequest(
            f"--oidc-issuer {args.oidc_issuer!r}: give an https:// URL (plain http only on this"
            " machine: the client's secret and people's tokens would cross the network unread)"
        )
    if not args.oidc_client_id or not args.oidc_client_secret_file:
        raise BadRequest("--oidc-issuer needs --oidc-client-id and --oidc-client-secret-file")
    try:
        secret = Path(args.oidc_client_secret_file).read_text().strip()
    except OSError as exc:
        raise BadRequest(
            f"--oidc-client-secret-file {args.oidc_client_secret_file}: {exc.strerror}"
        ) from exc
    if not secret:
        raise BadRequest(f"--oidc-client-secret-file {args.oidc_client_secret_file} is empty")
    roles = []
    for pair in args.oidc_role:
        group, _, role = pair.partition("=")
        if not group.strip() or role.strip() not in ROLES:
            raise BadRequest(
                f"--oidc-role {pair!r}: give GROUP=ROLE, ROLE one of {', '.join(ROLES)}"
            )
        roles.append((group.strip(), role.strip()))
    if not roles:
        raise BadRequest(
            "--oidc-issuer needs at least one --oidc-role GROUP=ROLE: no group, no access"
        )
    return OpenIDConnect(
        issuer=args.oidc_issuer,
        client_id=args.oidc_client_id,
        client_secret=secret,
        name_claim=args.oidc_name_claim,
        groups_claim=args.oidc_groups_claim,
        roles=tuple(roles),
        scopes=args.oidc_scopes,
    )


def sign_in_lines(settings: Settings, url: str) -> list[str]:
    """What a person needs to know at start about who may use the server."""
    sign_in = settings.sign_in
    if not sign_in.required:
        return ["sign-in is OFF (--no-auth): anyone who can reach this address may act"]
    lines = []
    if not is_loopback_host(settings.host):
        ways = "a session, a Bearer token" + (", or the proxy" if sign_in.proxy_user_header else "")
        lines.append(
            f"listening on {settings.host}, beyond this machine: every request must sign in"
            f" ({ways})"
        )
    if sign_in.proxy_user_header:
        lines.append(
            f"people signed in by the proxy at {', '.join(sign_in.trusted_proxies)}"
            f" are named by its {sign_in.proxy_user_header} header"
        )
    if sign_in.oidc is not None:
        mapped = ", ".join(f"{group}={role}" for group, role in sign_in.oidc.roles)
        lines.append(
            f"people sign in at the OpenID Provider {sign_in.oidc.issuer} ({mapped}); its"
            f" redirect URI is {url.rstrip('/')}/signin/oidc/callback unless --public-url"
            " says otherwise"
        )
    lines.append(f"sign in at {url}?token={sign_in.token} (as {sign_in.owner}, operator)")
    lines.append(f"scripts send the header: Authorization: Bearer {sign_in.token}")
    return lines


def _notifications(args: argparse.Namespace) -> Notifications:
    """The notification options; raises :class:`NotifyOptionError` with a one-line reason."""
    from localui.notify.events import UnknownEvent, parse_notify_on

    if not hasattr(args, "notify"):
        return Notifications()
    try:
        events = parse_notify_on(args.notify_on)
    except UnknownEvent as exc:
        raise NotifyOptionError(str(exc)) from exc
    secret = ""
    if args.webhook_secret_file:
        try:
            secret = Path(args.webhook_secret_file).read_text().strip()
        except OSError as exc:
            raise NotifyOptionError(
                f"--webhook-secret-file {args.webhook_secret_file}: {exc.strerror}"
            ) from exc
    if min(args.stale_after, args.remind_after, args.notify_lease) <= 0 or args.remind_times < 0:
        raise NotifyOptionError(
            "--stale-after, --remind-after and --notify-lease must be positive,"
            " --remind-times at least 0"
        )
    from localui.errors import BadRequest
    from localui.views.params import parse_age

    try:
        link_ttl = parse_age(args.link_ttl, "--link-ttl").total_seconds()
    except BadRequest as exc:
        raise NotifyOptionError(str(exc)) from exc
    if link_ttl <= 0:
        raise NotifyOptionError("--link-ttl must be longer than nothing")
    return Notifications(
        chat=tuple(args.notify),
        webhooks=tuple(args.webhook),
        webhook_secret=secret,
        public_url=args.public_url,
        events=tuple(t for t in EVENT_CHOICES if t in events),
        redact=tuple(args.notify_redact),
        remind_times=args.remind_times,
        lease=args.notify_lease,
        link_ttl=link_ttl,
    )


class NotifyOptionError(ValueError):
    """Notification options that cannot be served."""


def _settings(args: argparse.Namespace, store: str) -> Settings:
    from localui.auth import owner_name
    from localui.backends.users import new_token

    return Settings(
        store=store,
        host=args.host,
        port=args.port,
        read_only=args.read_only,
        claim_lease_seconds=args.claim_lease,
        allowed_hosts=tuple(args.allow_host),
        pg_schema=getattr(args, "pg_schema", "fastaiagent"),
        pg_app_schema=getattr(args, "pg_app_schema", "localui"),
        root_path=normal_root_path(args.root_path),
        traces=getattr(args, "traces", None),
        stale_after=args.stale_after,
        remind_after=args.remind_after,
        metrics_token_file=args.metrics_token_file,
        notifications=_notifications(args),
        sign_in=SignIn(
            required=not args.no_auth,
            token=new_token(),
            owner=owner_name(),
            proxy_user_header=args.auth_proxy_header,
            proxy_role_header=args.auth_proxy_role_header,
            proxy_default_role=args.auth_proxy_default_role,
            proxy_groups_header=args.auth_proxy_groups_header,
            trusted_proxies=tuple(args.trusted_proxy),
            oidc=oidc_of(args),
        ),
    )


def normal_root_path(text: str) -> str:
    """``tools/localui/`` -> ``/tools/localui``; empty stays empty (served at ``/``)."""
    text = text.strip().strip("/")
    return f"/{text}" if text else ""


def policy_of(args: argparse.Namespace) -> Policy | None:
    """The ``--policy`` file, read and checked; :class:`PolicyError` says what is wrong."""
    return load_policy(args.policy) if args.policy else None


def run_serve(args: argparse.Namespace) -> int:
    if problem := sign_in_problem(args):
        return fail(problem)
    try:
        policy = policy_of(args)
    except PolicyError as exc:
        return fail(str(exc))
    store = args.store or default_store()
    try:
        settings = dataclasses.replace(_settings(args, store), policy=policy)
    except NotifyOptionError as exc:
        return fail(str(exc))
    return serve(settings, specs=args.agents, context_specs=args.context)


def _exit_quietly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def run_demo(args: argparse.Namespace) -> int:
    if problem := sign_in_problem(args):
        return fail(problem)
    try:
        policy = policy_of(args)
        _notifications(args)
    except (PolicyError, NotifyOptionError) as exc:
        return fail(str(exc))
    temp_dir: str | None = None
    if args.store:
        store = Path(args.store).resolve()
        if store.exists():
            return fail(f"{store} exists; the demo writes a fresh store (pick a new path)")
        store.parent.mkdir(parents=True, exist_ok=True)
    else:
        temp_dir = tempfile.mkdtemp(prefix="localui-demo-")
        store = Path(temp_dir) / "local.db"
    os.environ["FASTAIAGENT_LOCAL_DB"] = str(store)
    # The demo's runs are traced into the store, so run pages show their spans;
    # the served agent (approvals, resumes) traces there too.
    os.environ["FASTAIAGENT_TRACE_ENABLED"] = "true"

    from fastaiagent.checkpointers import SQLiteCheckpointer

    from localui.demo import teams
    from localui.demo.agent import build_agent
    from localui.demo.scenarios import ALL_SCENARIOS, Seeding, create_store

    def say(line: str) -> None:
        print(f"  {line}", flush=True)

    seeding = Seeding(store, scenarios=ALL_SCENARIOS, say=say)
    if args.seed_only:
        print(f"localui: seeding demo runs into {store}", flush=True)
        report = asyncio.run(seeding.run())
        failures = seeding.progress().failures
        if failures:
            named = "; ".join(f"{f.scenario}: {' '.join(f.reason.split())}" for f in failures)
            return fail(f"seeding the demo failed: {named}")
        print(f"localui: {len(report.runs)} runs seeded in {report.seconds:.1f} s", flush=True)
        print(store)
        return 0
    # The store's tables, empty, so the server opens it at once; the runs arrive
    # while it serves.
    create_store(store)
    checkpointer = SQLiteCheckpointer(str(store))
    runners = [
        build_agent(checkpointer),
        teams.build_chain(checkpointer),
        teams.build_parcel_chain(checkpointer),
        teams.build_supervisor(checkpointer),
        teams.build_swarm(checkpointer),
        teams.build_long_agent(checkpointer),
    ]
    try:
        return serve(
            dataclasses.replace(_settings(args, str(store)), policy=policy),
            runners,
            seeding=ReportedSeeding(seeding),
        )
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


class ReportedSeeding:
    """The demo's seeding, saying in the terminal where it begins and how it ended; then
    the edited branches the app makes of two of its runs (``localui.demo.edits``),
    counted among the runs it seeds."""

    def __init__(self, seeding: Seeding) -> None:
        self._seeding = seeding
        self._branches: list[str] = []
        self._branch_failures: list[SeedFailure] = []

    def progress(self) -> SeedProgress:
        from localui.demo.edits import EDITED
        from localui.records import SeedProgress

        seeded = self._seeding.progress()
        return SeedProgress(
            landed=seeded.landed + len(self._branches),
            total=seeded.total + len(EDITED),
            failures=(*seeded.failures, *self._branch_failures),
        )

    async def run(self, landed: Callable[[str], None], actions: ActionService) -> object:
        from localui.demo.edits import EDITED, edit_demo_runs
        from localui.records import SeedFailure

        total = len(self._seeding.scenarios)
        print(f"localui: seeding {total} demo runs into {self._seeding.target}", flush=True)
        try:
            report = await self._seeding.run(landed)
        except Exception as exc:
            # The server goes on showing what landed; the terminal says why the rest did not.
            print(f"localui: seeding the demo stopped: {type(exc).__name__}: {exc}", flush=True)
            self._branch_failures.extend(
                SeedFailure(f"edited branch of {name}", "the seeding stopped") for name in EDITED
            )
            return None
        failed = self._seeding.progress().failures
        words = f"{len(report.runs)} of {total} runs seeded in {report.seconds:.1f} s"
        if failed:
            words += f"; failed: {', '.join(f.scenario for f in failed)} (reasons above)"
        print(f"localui: {words}", flush=True)

        def branched(execution_id: str) -> None:
            self._branches.append(execution_id)
            landed(execution_id)

        def not_branched(failure: SeedFailure) -> None:
            print(f"  {failure.scenario} was not made: {failure.reason}", flush=True)
            self._branch_failures.append(failure)

        if actions.settings.read_only:
            for name in EDITED:
                not_branched(SeedFailure(f"edited branch of {name}", "the server is read-only"))
        else:
            await edit_demo_runs(actions, report, branched, not_branched)
            print(f"localui: {len(self._branches)} edited branches made", flush=True)
        return report


def run_export(args: argparse.Namespace) -> int:
    from localui.app import trace_index
    from localui.backends import open_backend
    from localui.bundle import build_bundle

    settings = Settings(
        store=args.store or default_store(),
        pg_schema=args.pg_schema,
        pg_app_schema=args.pg_app_schema,
        traces=args.traces,
    )
    try:
        backend = open_backend(settings)
    except LocalUIError as exc:
        return fail(str(exc))
    traces = trace_index(settings, backend)
    decisions = backend.decision_log(writable=False)
    notes = backend.notes(writable=False)
    try:
        data = build_bundle(
            backend.store,
            [args.execution_id],
            decisions=decisions,
            traces=traces,
            redact_keys=args.redact,
            notes=notes,
        )
    except LocalUIError as exc:
        return fail(str(exc))
    finally:
        notes.close()
        decisions.close()
        if traces is not None:
            traces.close()
        backend.close()
    target = Path(args.output or f"{args.execution_id}.localui.gz")
    try:
        target.write_bytes(data)
    except OSError as exc:
        return fail(f"cannot write {target}: {exc}")
    print(f"localui: wrote run {args.execution_id} to {target}")
    return 0


def run_decisions_export(args: argparse.Namespace) -> int:
    """The decision record on standard output, read and written a chunk at a time."""
    from datetime import UTC, datetime

    from localui.backends import open_backend
    from localui.freetext import for_terminal
    from localui.records import DecisionQuery
    from localui.views.decisions import csv_chunks, export_chunks, jsonl_chunks
    from localui.views.params import parse_age
    from localui.views.urls import Urls

    settings = Settings(
        store=args.store or default_store(),
        pg_schema=args.pg_schema,
        pg_app_schema=args.pg_app_schema,
    )
    try:
        since = (
            (datetime.now(UTC) - parse_age(args.since, "--since")).isoformat()
            if args.since
            else None
        )
        backend = open_backend(settings)
    except LocalUIError as exc:
        return fail(str(exc))
    from starlette.routing import Router

    from localui.app import build_routes

    log = backend.decision_log(writable=False)
    try:
        rows = export_chunks(log, DecisionQuery(since=since), Urls(router=Router(build_routes())))
        written = csv_chunks(rows) if args.format == "csv" else jsonl_chunks(rows)
        # A terminal runs what an ESC sequence says (set its title, clear the screen):
        # there, the record's text is shown with its control characters escaped.
        shown = for_terminal if sys.stdout.isatty() else None
        for chunk in written:
            sys.stdout.write(shown(chunk) if shown else chunk)
        sys.stdout.flush()
    except LocalUIError as exc:
        return fail(str(exc))
    finally:
        log.close()
        backend.close()
    return 0


def run_open(args: argparse.Namespace) -> int:
    from localui.bundle import BundleError, load_bundles, read_bundle

    # Read-only, but a bundle holds a run's whole context: as private as the store.
    if problem := sign_in_problem(args):
        return fail(problem)

    temp_dir = tempfile.mkdtemp(prefix="localui-open-")
    try:
        store = Path(temp_dir) / "local.db"
        try:
            load_bundles([read_bundle(Path(f)) for f in args.files], store)
        except BundleError as exc:
            return fail(str(exc))
        settings = dataclasses.replace(_settings(args, str(store)), read_only=True)
        return serve(settings)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def run_users(args: argparse.Namespace) -> int:
    """``localui users add|list|remove|reset``: the table servers of this store read."""
    from datetime import UTC, datetime

    from localui.backends import open_users, target_of
    from localui.backends.users import check_groups, check_name, new_token, token_hash
    from localui.delegation import away_problem, is_away, until_of
    from localui.names import look_alike_pairs, look_alikes
    from localui.notify.targets import TargetError

    store = args.store or default_store()
    settings = Settings(store=store, pg_app_schema=args.pg_app_schema)
    sqlite_path = target_of(settings).sqlite_path
    if sqlite_path is not None and not sqlite_path.is_file():
        return fail(f"no store at {store} (pass --store or set FASTAIAGENT_LOCAL_DB)")
    try:
        users = open_users(settings, writable=args.users_command != "list")
    except LocalUIError as exc:
        return fail(str(exc))
    try:
        now = datetime.now(UTC)
        if args.users_command == "list":
            listed = users.list_users()
            for user in listed:
                groups = ",".join(user.groups) or "-"
                away = f"away to {user.away_to} {until_words(user.away_until)}"
                if not user.away_to:
                    away = "not away"
                elif not is_away(user, now):
                    away = f"not away (was {away})"
                print(
                    f"{user.name}\t{user.role}\tgroups {groups}"
                    f"\ttold at {shown_address(user.address)}\t{away}\tadded {user.created_at}"
                )
            if not args.check:
                return 0
            pairs = look_alike_pairs(u.name for u in listed)
            for a, b in pairs:
                print(f"localui: {a!r} and {b!r} look alike: a two-person rule counts them once")
            return 1 if pairs else 0
        name = check_name(args.name)
        action = USER_ACTIONS[args.users_command]
        command = f"localui users {args.users_command}"

        def record(done: bool, **detail: Any) -> None:
            record_change(settings, action, command, {"user": name, **detail}, done=done)

        if args.users_command == "set":
            # Checked before anything changes: a bad URL leaves the person as they were.
            address = "" if args.no_notify else address_of(args.notify)
            changed = users.by_name(name)
            if changed is not None and args.role is not None:
                changed = users.set_role(name, args.role)
            touches_address = address is not None
            if changed is not None and (args.group or (args.role is None and not touches_address)):
                changed = users.set_groups(name, check_groups(args.group))
            if changed is not None and address is not None:
                changed = users.set_address(name, address)
            detail: dict[str, Any] = {"groups": list(changed.groups)} if changed else {}
            if args.role is not None:
                detail["role"] = args.role
            if address is not None:
                detail["address"] = shown_address(address)
            record(changed is not None, **detail)
            if changed is None:
                return fail(f"no user {name!r}")
            groups = ", ".join(changed.groups) or "none"
            told = ""
            if changed.address:
                told = f", told at {shown_address(changed.address)}"
            elif address is not None:
                told = ", with no address of their own"
            print(f"localui: {name} is {changed.role}, in groups: {groups}{told}")
            return 0
        if args.users_command == "away":
            to = check_name(args.to)
            until = until_of(args.until, now)
            problem = away_problem(name, to, users.list_users(), now)
            if problem is not None:
                record(False, to=to, until=until)
                return fail(problem)
            marked = users.set_away(name, to, until)
            record(marked is not None, to=to, until=until)
            if marked is None:
                return fail(f"no user {name!r}")
            print(f"localui: {name} is away {until_words(until)}: {to} decides for them")
            return 0
        if args.users_command == "back":
            back = users.set_away(name, "", "")
            record(back is not None)
            if back is None:
                return fail(f"no user {name!r}")
            print(f"localui: {name} is back: they decide their own pauses again")
            return 0
        if args.users_command == "remove":
            removed = users.remove(name)
            record(removed)
            if not removed:
                return fail(f"no user {name!r}")
            print(f"localui: removed {name}; their link and sessions no longer work")
            return 0
        token = new_token()
        if args.users_command == "add":
            alike = look_alikes(name, (u.name for u in users.list_users()))
            if alike:
                record(False, role=args.role, looks_like=alike[0])
                return fail(
                    f"{name!r} looks like {alike[0]!r}, who is already a user: people must"
                    " tell names apart (pick another, or reset or remove theirs)"
                )
            address = address_of(args.notify) or ""
            try:
                user = users.add(
                    name, args.role, token_hash(token), check_groups(args.group), address
                )
            except LocalUIError:
                record(False, role=args.role)
                raise
            detail = {"address": shown_address(address)} if address else {}
            record(True, role=args.role, groups=list(user.groups), **detail)
        else:
            found = users.set_token(name, token_hash(token))
            record(found is not None)
            if found is None:
                return fail(f"no user {name!r}")
            user = found
        base = args.url if args.url.endswith("/") else args.url + "/"
        groups = f", groups {', '.join(user.groups)}" if user.groups else ""
        told = f", told at {shown_address(user.address)}" if user.address else ""
        print(f"localui: {user.name} ({user.role}{groups}{told}) signs in at {base}?token={token}")
        print(f"localui: scripts send the header: Authorization: Bearer {token}")
        print("localui: the token is shown only now; `localui users reset` makes a new one")
        return 0
    except (LocalUIError, TargetError) as exc:
        return fail(str(exc))
    finally:
        users.close()


def until_words(until: str) -> str:
    """``until 2026-12-24T00:00:00+00:00``, or ``until they are back``."""
    return f"until {until}" if until else "until they are back"


def address_of(url: str | None) -> str | None:
    """A person's address as ``--notify`` gave it, checked as a ``--notify`` target is
    (:class:`TargetError` in one line, before anything changes); None when not given."""
    if url is None:
        return None
    from localui.notify.targets import chat_target

    return chat_target(url.strip(), "--notify").url


def shown_address(url: str) -> str:
    """A person's address as the CLI shows it: masked, as targets are, since the URL may
    hold a password or token (``localui.notify.targets``); ``-`` when there is none."""
    from localui.notify.targets import CHAT, fingerprint, masked

    return f"{masked(url)}#{fingerprint(CHAT, url)}" if url else "-"


def run_keys(args: argparse.Namespace) -> int:
    """``localui keys list|rotate``: the keys every server of the store signs with."""
    import time
    from datetime import UTC, datetime

    from localui.backends import open_session_keys, target_of
    from localui.views.params import parse_age

    store = args.store or default_store()
    settings = Settings(store=store, pg_app_schema=args.pg_app_schema)
    sqlite_path = target_of(settings).sqlite_path
    if sqlite_path is not None and not sqlite_path.is_file():
        return fail(f"no store at {store} (pass --store or set FASTAIAGENT_LOCAL_DB)")
    try:
        grace = parse_age(args.grace, "--grace") if args.keys_command == "rotate" else None
        keys = open_session_keys(settings, writable=args.keys_command == "rotate")
    except LocalUIError as exc:
        return fail(str(exc))

    def when(stamp: float) -> str:
        return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds")

    try:
        if grace is not None:
            listed = keys.rotate(grace.total_seconds())
            record_change(
                settings,
                "keys_rotate",
                "localui keys rotate",
                {"grace": args.grace, "generation": listed[-1].generation},
                done=True,
            )
        else:
            shared = keys.shared(time.time())
            if shared is None:
                print("localui: no keys yet: the first server of this store makes them")
                return 0
            listed = shared.keys
        for key in listed:
            until = (
                "signs now" if key.retires_at is None else f"accepted until {when(key.retires_at)}"
            )
            print(f"key {key.generation}\tmade {when(key.created_at)}\t{until}")
        if grace is not None:
            print(
                f"localui: key {listed[-1].generation} signs from now on; every server of the"
                " store takes it up within a second"
            )
        return 0
    except LocalUIError as exc:
        return fail(str(exc))
    finally:
        keys.close()


def run_notifications(args: argparse.Namespace) -> int:
    """``localui notifications list|retry``: the outbox servers of this store share."""
    import time
    from datetime import UTC, datetime

    from localui.backends import open_outbox, target_of
    from localui.notify.targets import mask_urls

    settings = Settings(store=args.store or default_store(), pg_app_schema=args.pg_app_schema)
    sqlite_path = target_of(settings).sqlite_path
    if sqlite_path is not None and not sqlite_path.is_file():
        return fail(f"no store at {settings.store} (pass --store or set FASTAIAGENT_LOCAL_DB)")
    try:
        outbox = open_outbox(settings)
    except LocalUIError as exc:
        return fail(str(exc))

    def when(stamp: float | None) -> str:
        if stamp is None:
            return "never"
        return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds")

    try:
        if args.notifications_command == "retry":
            now = time.time()
            again = outbox.retry_failed(
                now=now, give_up_at=now + Notifications().retry_for, target=args.target
            )
            record_change(
                settings,
                NOTIFICATION_RETRY,
                "localui notifications retry",
                {"target": mask_urls(args.target) if args.target else None, "again": again},
                done=True,
            )
            print(f"localui: {again} given-up announcement(s) will be sent again")
            return 0
        # Rows recorded before targets were masked may still hold a URL's path.
        for status in outbox.target_statuses():
            error = f"; last error: {mask_urls(status.last_error)}" if status.last_error else ""
            print(
                f"target {mask_urls(status.target)}: {status.sent} sent"
                f" (last {when(status.last_sent_at)}), {status.pending} pending,"
                f" {status.failed} given up{error}"
            )
        for row in outbox.list_recent(args.limit):
            error = f"\t{mask_urls(row.last_error)}" if row.last_error else ""
            print(
                f"{when(row.created_at)}\t{row.event_type}\t{row.execution_id}\t{row.state}"
                f"\t{row.attempts} attempt(s)\t{mask_urls(row.target)}{error}"
            )
        return 0
    except LocalUIError as exc:
        return fail(str(exc))
    finally:
        outbox.close()


def run_audit(args: argparse.Namespace) -> int:
    """``localui audit verify|export``: the chain checked, or written out in its order."""
    from localui.audit import ChainCheck
    from localui.backends import open_audit, target_of
    from localui.views.audit import export_lines

    settings = Settings(store=args.store or default_store(), pg_app_schema=args.pg_app_schema)
    sqlite_path = target_of(settings).sqlite_path
    if sqlite_path is not None and not sqlite_path.is_file():
        return fail(f"no store at {settings.store} (pass --store or set FASTAIAGENT_LOCAL_DB)")
    try:
        log = open_audit(settings, writable=False)
    except LocalUIError as exc:
        return fail(str(exc))
    try:
        if args.audit_command == "export":
            from localui.freetext import for_terminal

            shown = for_terminal if sys.stdout.isatty() else None
            for chunk in export_lines(log.walk(), args.format):
                sys.stdout.write(shown(chunk) if shown else chunk)
            sys.stdout.flush()
            return 0
        checked = ChainCheck()
        for entry in log.walk():
            checked.see(entry)
        for problem in checked.problems:
            print(f"localui: {problem.message}", file=sys.stderr)
        if not checked.intact:
            print(
                f"localui: the audit log is broken: {len(checked.problems)} problem(s)"
                f" in {checked.count} row(s)",
                file=sys.stderr,
            )
            return 1
        last = checked.last
        newest = f"; the newest is row {last.id}, hash {last.hash}" if last is not None else ""
        print(f"localui: {checked.count} audit row(s), every hash and link intact{newest}")
        return 0
    except LocalUIError as exc:
        return fail(str(exc))
    finally:
        log.close()


def record_change(
    settings: Settings,
    action: str,
    command: str,
    detail: Mapping[str, Any],
    *,
    done: bool,
) -> None:
    """The command line's change as a row of the store's audit log; a row that cannot be
    written is said loudly, and the change stands."""
    from localui.auditing import cli_event
    from localui.backends import open_audit

    try:
        log = open_audit(settings, writable=True)
        try:
            log.append(cli_event(action, command, detail, done=done))
        finally:
            log.close()
    except LocalUIError as exc:
        print(f"localui: the audit log could not record this {command}: {exc}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return run_serve(args)
    if args.command == "export":
        return run_export(args)
    if args.command == "open":
        return run_open(args)
    if args.command == "users":
        return run_users(args)
    if args.command == "notifications":
        return run_notifications(args)
    if args.command == "keys":
        return run_keys(args)
    if args.command == "decisions":
        return run_decisions_export(args)
    if args.command == "audit":
        return run_audit(args)
    return run_demo(args)
