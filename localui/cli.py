"""``localui serve`` and ``localui demo``."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localui.errors import LocalUIError
from localui.registry import Registry, RegistryError, load_spec
from localui.settings import Settings

DEFAULT_PORT = 8765


def default_store() -> str:
    """The SDK's own default: ``FASTAIAGENT_LOCAL_DB``, else ``.fastaiagent/local.db``."""
    return os.environ.get("FASTAIAGENT_LOCAL_DB") or ".fastaiagent/local.db"


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="Interface to listen on. Loopback by default: the app can approve and resume "
        "runs, so expose it to a network only behind your own authentication.",
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
        "--root-path",
        default="",
        metavar="PREFIX",
        help="Behind a reverse proxy that serves the app at PREFIX (e.g. /tools/localui) and "
        "strips it before forwarding: every link, form and redirect carries PREFIX.",
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
        "--agents",
        action="extend",
        nargs="+",
        default=[],
        metavar="SPEC",
        help="Agents this process may resume: MODULE:ATTR or FILE.py:ATTR (an Agent, a "
        "list of them, or a function returning either).",
    )
    _add_server_options(serve)

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
    return parser


def fail(message: str) -> int:
    print(f"localui: {message}", file=sys.stderr)
    return 2


def serve(settings: Settings, agents: Sequence[Any] = (), *, specs: Sequence[str] = ()) -> int:
    """Open the store, load the agents ``specs`` name, bind them and ``agents`` to it,
    and serve until interrupted."""
    import uvicorn
    from starlette.types import ASGIApp

    from localui.app import create_app
    from localui.backends import open_backend, target_of
    from localui.memory import ReleaseFreedMemory, keep_thresholds

    target = target_of(settings)
    if target.sqlite_path is not None:
        # The SDK resolves its own default store from this variable, and caches its
        # config on first use: set it before any agent module is imported.
        os.environ.setdefault("FASTAIAGENT_LOCAL_DB", str(target.sqlite_path))
        if not target.sqlite_path.is_file():
            return fail(
                f"no store at {target.sqlite_path} (pass --store or set FASTAIAGENT_LOCAL_DB)"
            )
    # The agents are imported before the store opens: opening may start indexing it
    # in a thread, which would slow the imports down.
    loaded = list(agents)
    try:
        for spec in specs:
            loaded.extend(load_spec(spec))
    except RegistryError as exc:
        return fail(str(exc))
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
    except (LocalUIError, RegistryError) as exc:
        backend.close()
        return fail(str(exc))
    app: ASGIApp = create_app(settings, agents=registry.agents.values(), backend=backend)
    if releasing:
        app = ReleaseFreedMemory(app)
    shown_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    print(f"localui: serving {backend.label} at http://{shown_host}:{settings.port}/", flush=True)
    if settings.root_path:
        print(f"localui: links point under {settings.root_path}/, where the proxy serves it")
    if registry.agents:
        print(f"localui: agents that can be resumed here: {', '.join(registry.names())}")
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        root_path=settings.root_path,
        # Open streams must not hold a stopping server for long.
        timeout_graceful_shutdown=2,
    )
    # uvicorn stops on Ctrl-C or SIGTERM, then raises the signal again for whoever
    # installed a handler; these make that a quiet exit 0 through the clean-up below,
    # instead of a KeyboardInterrupt traceback or death by signal before it.
    signal.signal(signal.SIGINT, _exit_quietly)
    signal.signal(signal.SIGTERM, _exit_quietly)
    try:
        uvicorn.Server(config).run()
    finally:
        backend.close()
    return 0


def _settings(args: argparse.Namespace, store: str) -> Settings:
    return Settings(
        store=store,
        host=args.host,
        port=args.port,
        read_only=args.read_only,
        allowed_hosts=tuple(args.allow_host),
        pg_schema=getattr(args, "pg_schema", "fastaiagent"),
        pg_app_schema=getattr(args, "pg_app_schema", "localui"),
        root_path=normal_root_path(args.root_path),
    )


def normal_root_path(text: str) -> str:
    """``tools/localui/`` -> ``/tools/localui``; empty stays empty (served at ``/``)."""
    text = text.strip().strip("/")
    return f"/{text}" if text else ""


def run_serve(args: argparse.Namespace) -> int:
    store = args.store or default_store()
    return serve(_settings(args, store), specs=args.agents)


def _exit_quietly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def run_demo(args: argparse.Namespace) -> int:
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
    os.environ["FASTAIAGENT_TRACE_ENABLED"] = "false"

    from localui.demo.scenarios import ALL_SCENARIOS, SeedError, seed

    print(f"localui: seeding demo runs into {store}", flush=True)
    try:
        report = seed(
            store,
            progress=lambda line: print(f"  {line}", flush=True),
            scenarios=ALL_SCENARIOS,
        )
    except SeedError as exc:
        return fail(f"seeding the demo failed: {exc}")
    print(f"localui: {len(report.runs)} runs seeded in {report.seconds:.1f} s", flush=True)
    if args.seed_only:
        print(store)
        return 0

    from fastaiagent.checkpointers import SQLiteCheckpointer

    from localui.demo import teams
    from localui.demo.agent import build_agent

    checkpointer = SQLiteCheckpointer(str(store))
    runners = [
        build_agent(checkpointer),
        teams.build_chain(checkpointer),
        teams.build_supervisor(checkpointer),
        teams.build_swarm(checkpointer),
        teams.build_long_agent(checkpointer),
    ]
    try:
        return serve(_settings(args, str(store)), runners)
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return run_serve(args)
    return run_demo(args)
