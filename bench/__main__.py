"""``python -m bench``: build the stores, measure both UIs, judge the budgets, write the table.

    .venv/bin/python -m bench                                   # 1k, 10k, 100k runs
    .venv/bin/python -m bench --sizes 1000 --requests 5         # a quick look
    .venv/bin/python -m bench --no-sdk-ui                       # localui alone
    .venv/bin/python -m bench --backend postgres --sizes 100k   # on PostgreSQL
    .venv/bin/python -m bench --sizes 1m --no-sdk-ui            # a million runs
    .venv/bin/python -m bench --only kill9                      # kill -9 mid-approval
    .venv/bin/python -m bench --only bulk-resume                # 1,000 crashed runs resumed
    .venv/bin/python -m bench --only deadlines                  # escalation, timeout, kill -9
    .venv/bin/python -m bench --only links                      # decision links, scanners

Exit status: 0 when every budget is met, 1 when one is missed, 2 when the
benchmark could not measure something (a page that did not answer 200, a server
that did not start). The table goes to ``--out`` (markdown) with the raw
samples beside it (same name, ``.json``).
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import pg, report, store_cache, writes
from bench.app_tables import fresh_app_tables
from bench.audit import run_audit_bench
from bench.browser import page_weights
from bench.budgets import (
    AUDIT_BUDGETS,
    BULK_RESUME_BUDGETS,
    TEAM_BUDGETS,
    Verdict,
    all_passed,
    judge,
)
from bench.bulk_resume import RUNS as BULK_RESUME_RUNS
from bench.bulk_resume import run_bulk_bench
from bench.demo_start import measure_demo
from bench.edits import take_out, time_edits
from bench.fleet import measure_fleet
from bench.kill9 import run_kill9
from bench.latency import Timing, failed, follow_next, time_get, time_in_turns, warm_up
from bench.model import (
    DEEP_PAGES,
    EDIT_BRANCH,
    SDK_QUEUE,
    ServerRun,
    StoreRun,
    localui_urls,
    median_start,
    sdk_urls,
)
from bench.notify import (
    NOTIFY_BUDGETS,
    WATCHER_BUDGETS,
    BenchTargets,
    run_notify_bench,
    settle,
    watcher_idle_pct,
)
from bench.pg import copy_record, drop_schema
from bench.sdk_ui import ensure_venv, installed, sdk_version
from bench.servers import (
    REPO,
    PgTarget,
    Server,
    agent_alone_rss_kb,
    clean_env,
    pythonpath,
    start_localui,
    start_sdk_ui,
    wait_until_idle,
    wait_until_indexed,
    wait_until_search_indexed,
    wait_until_sqlite_search_indexed,
)
from bench.speed import read_speed
from bench.stores import (
    BuiltStore,
    Templates,
    add_agents,
    add_spans,
    add_votes,
    build_store,
    make_templates,
)
from bench.team import measure_team

DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "localui-bench"
DEFAULT_OUT = REPO / "bench" / "results" / "latest.md"
Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Options:
    requests: int
    warmup: int
    inproc: bool
    weights: bool
    #: The localui the servers run: a copy of this checkout, or ``--localui-path``.
    app_path: Path | None
    #: The store on PostgreSQL (``--backend postgres``), or None for the SQLite file.
    pg: PgTarget | None = None
    #: The approval policy every localui server runs under (``--policy``), or None.
    policy: Path | None = None
    #: Notification options every localui server is given (``--notify-targets``): its
    #: watcher runs while the pages are timed, and its idle cost is read.
    notify: tuple[str, ...] = ()
    #: How long the idle server's CPU is read for (``--watcher-idle-seconds``).
    idle_seconds: float = 30.0
    #: How many times each kind of localui start is timed (``--starts``): the median counts.
    starts: int = 3


def _time_all(
    server: Server, urls: Mapping[str, str], options: Options, log: Log, run: ServerRun
) -> dict[str, Timing]:
    timings: dict[str, Timing] = {}
    run.load.append(os.getloadavg()[0])
    run.speed.append(read_speed())
    log(f"  machine speed: the probe took {run.speed[-1].words()}")
    with httpx.Client(base_url=server.base_url, timeout=300.0) as client:
        for key, url in urls.items():
            started = time.monotonic()
            error = warm_up(client, url, times=options.warmup)
            if error is not None:
                timings[key] = failed(error)
            else:
                cpu = server.cpu_seconds()
                timed = time_get(client, url, requests=options.requests)
                cpu_ms = (server.cpu_seconds() - cpu) * 1000 / options.requests
                timings[key] = dataclasses.replace(timed, cpu_ms=cpu_ms)
            t = timings[key]
            shown = f"ERROR {t.error}"
            if t.ok:
                shown = f"p50 {t.p50:.1f} ms, p95 {t.p95:.1f} ms, server CPU {t.cpu_ms:.1f} ms"
            log(f"  {server.name} {key}: {shown} ({time.monotonic() - started:.0f} s)")
    run.load.append(os.getloadavg()[0])
    run.speed.append(read_speed())
    log(f"  machine speed: the probe took {run.speed[-1].words()}")
    return timings


def _inproc(store: BuiltStore, cache: Path, urls: Mapping[str, str], options: Options) -> Any:
    where = [str(store.path)]
    if options.pg is not None:
        where = [options.pg.dsn, "--pg-schema", options.pg.schema, options.pg.app_schema]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.inproc",
            "--store",
            *where,
            "--requests",
            str(options.requests),
            "--warmup",
            str(options.warmup),
            *(["--policy", str(options.policy)] if options.policy is not None else []),
        ],
        input=json.dumps(dict(urls)),
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        env=clean_env(XDG_CACHE_HOME=str(cache), PYTHONPATH=pythonpath(options.app_path)),
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.inproc failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


#: Requests each server answers, in turns, for the approvals comparison: the two p50s
#: are a few per cent apart, so more samples than the other pages get.
SIDE_BY_SIDE_REQUESTS = 100


def measure_side_by_side(
    store: BuiltStore, cache: Path, sdk_venv: Path, options: Options, log: Log
) -> dict[str, Timing]:
    """Our approvals page and the SDK UI's JSON of its queue, both servers up, timed in
    turns (a later start of localui, with what the first left in ``cache``)."""
    local = start_localui(
        store.path,
        cache_dir=cache,
        app_path=options.app_path,
        pg=options.pg,
        policy=options.policy,
        notify=options.notify,
    )
    try:
        sdk = start_sdk_ui(store.path, venv=sdk_venv)
    except Exception:
        local.stop()
        raise
    try:
        with (
            httpx.Client(base_url=local.base_url, timeout=300.0) as ours,
            httpx.Client(base_url=sdk.base_url, timeout=300.0) as theirs,
        ):
            clients = {
                "approvals_html": (ours, "/approvals"),
                "sdk_pending": (theirs, SDK_QUEUE),
            }
            for name, (client, url) in clients.items():
                error = warm_up(client, url, times=options.warmup)
                if error is not None:
                    return {name: failed(error)}
            timings = time_in_turns(clients, requests=max(options.requests, SIDE_BY_SIDE_REQUESTS))
    finally:
        sdk.stop()
        local.stop()
    shown = ", ".join(f"{k} p50 {t.p50:.1f} ms" for k, t in timings.items() if t.ok)
    log(f"  approvals beside the SDK UI, in turns: {shown}")
    return timings


def measure_localui(
    store: BuiltStore, options: Options, log: Log, sdk_venv: Path | None = None
) -> ServerRun:
    result = ServerRun()
    cache = Path(tempfile.mkdtemp(prefix="localui-bench-cache-"))
    # The edits' branches, deleted once the server that made them has stopped.
    branches: list[str] = []
    try:
        if options.pg is not None:
            # A cold start on PostgreSQL: no runs index in the app's schema yet.
            drop_schema(options.pg.dsn, options.pg.app_schema)
        server = start_localui(
            store.path,
            cache_dir=cache,
            app_path=options.app_path,
            pg=options.pg,
            policy=options.policy,
            notify=options.notify,
            quiet=True,
        )
        result.start_samples["cold"] = [(server.startup_s, server.startup_cpu_s)]
        log(f"  localui started (cold) in {server.startup_s:.2f} s")
        if options.pg is not None:
            # The record lives in the app's schema, made again by this start: filled now.
            copied = copy_record(store.path, options.pg.dsn, options.pg.app_schema)
            log(f"  decision record copied to PostgreSQL: {copied} entries")
        try:
            result.indexed_s = wait_until_indexed(server)
            log(f"  runs index complete {result.indexed_s:.2f} s after start")
            # Text search is timed with its trigram index, as a later start has it.
            if options.pg is not None:
                result.search_indexed_s = wait_until_search_indexed(server, options.pg)
            else:
                result.search_indexed_s = wait_until_sqlite_search_indexed(
                    server, store.path, cache
                )
            log(f"  trigram index made {result.search_indexed_s:.2f} s after start")
            with httpx.Client(base_url=server.base_url, timeout=300.0) as client:
                cursor, result.deep_page = follow_next(client, "/runs.json", pages=DEEP_PAGES)
            log(f"  server idle {wait_until_idle(server):.1f} s later (its own work done)")
            if cursor is None:
                result.errors.append("the runs list has one page only: no deep page to time")
            urls = localui_urls(store, cursor)
            if options.notify:
                # Timed as a server with targets runs: what waited when it started
                # (every pause, its reminder) announced and delivered.
                log(f"  announcements at start delivered {settle(server, log):.1f} s later")
            result.timings = _time_all(server, urls, options, log, result)
            if options.notify:
                result.watcher_idle_pct = watcher_idle_pct(server, log, options.idle_seconds)
            result.memory_kb = server.memory_kb()
            result.agent_alone_kb = agent_alone_rss_kb(
                store.path, app_path=options.app_path, pg=options.pg
            )
            if options.weights:
                result.pages = page_weights(
                    {
                        "runs": f"{server.base_url}/",
                        "run50": f"{server.base_url}{urls['run50_html']}",
                        "run2000": f"{server.base_url}{urls['run2000_html']}",
                        "approvals": f"{server.base_url}/approvals",
                        "diff": f"{server.base_url}{urls['diff_html']}",
                    }
                )
            # Last, as each edit runs the agent in the server: the memory is read before.
            result.timings[EDIT_BRANCH] = _time_edits(server, store, options, branches, log)
        finally:
            server.stop()
            take_out(store, options.pg, branches)
        # Again, with what the first start left in its cache dir: several times, and the
        # median judged, since one start can meet a busy moment of a shared machine.
        warm = result.start_samples["warm"] = []
        for _ in range(options.starts):
            server = start_localui(
                store.path,
                cache_dir=cache,
                app_path=options.app_path,
                pg=options.pg,
                policy=options.policy,
                notify=options.notify,
                quiet=True,
            )
            warm.append((server.startup_s, server.startup_cpu_s))
            server.stop()
        log(f"  localui started (warm) in {_seconds(warm)}")
        if sdk_venv is not None:
            result.side_by_side = measure_side_by_side(store, cache, sdk_venv, options, log)
        # And as a viewer, with no agent to resume with: what the app itself costs.
        server = start_localui(
            store.path,
            cache_dir=cache,
            agents=False,
            app_path=options.app_path,
            pg=options.pg,
            policy=options.policy,
            notify=options.notify,
            quiet=True,
        )
        viewer = result.start_samples["viewer"] = [(server.startup_s, server.startup_cpu_s)]
        try:
            with httpx.Client(base_url=server.base_url, timeout=300.0) as client:
                for url in urls.values():
                    warm_up(client, url, times=options.warmup)
            result.viewer_memory_kb = server.memory_kb()
        finally:
            server.stop()
        for _ in range(options.starts - 1):
            server = start_localui(
                store.path,
                cache_dir=cache,
                agents=False,
                app_path=options.app_path,
                pg=options.pg,
                policy=options.policy,
                notify=options.notify,
                quiet=True,
            )
            viewer.append((server.startup_s, server.startup_cpu_s))
            server.stop()
        log(
            f"  localui without agents: started in {_seconds(viewer)},"
            f" {result.viewer_memory_kb.get('VmRSS', 0) / 1000:.0f} MB after warm-up"
        )
        if options.inproc:
            started = time.monotonic()
            result.inproc = _inproc(store, cache, urls, options)
            log(f"  in-process timings done ({time.monotonic() - started:.0f} s)")
        cold = result.start_samples["cold"]
        for _ in range(options.starts - 1):
            cold.append(_cold_start(store, options))
        log(f"  localui first starts: {_seconds(cold)}")
    except Exception as exc:
        result.errors.append(f"localui: {type(exc).__name__}: {exc}")
        log(traceback.format_exc())
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    for kind, samples in result.start_samples.items():
        if samples:
            wall, cpu = median_start(samples)
            result.startup_cpu[kind] = cpu
            if kind == "cold":
                result.startup_cold_s = wall
            elif kind == "warm":
                result.startup_warm_s = wall
            else:
                result.viewer_startup_s = wall
    return result


def _time_edits(
    server: Server, store: BuiltStore, options: Options, branches: list[str], log: Log
) -> Timing:
    """An edit's branch (``bench.edits``), with the server's CPU per edit."""
    with httpx.Client(base_url=server.base_url, timeout=300.0) as client:
        cpu = server.cpu_seconds()
        timed = time_edits(
            client,
            store,
            options.pg,
            requests=options.requests,
            warmup=options.warmup,
            branches=branches,
        )
        edits = max(1, len(branches))
        timed = dataclasses.replace(timed, cpu_ms=(server.cpu_seconds() - cpu) * 1000 / edits)
    shown = f"ERROR {timed.error}"
    if timed.ok:
        shown = f"p50 {timed.p50:.1f} ms, p95 {timed.p95:.1f} ms, server CPU {timed.cpu_ms:.1f} ms"
    log(f"  {server.name} {EDIT_BRANCH}: {shown}")
    return timed


def _cold_start(store: BuiltStore, options: Options) -> tuple[float, float]:
    """One more first start, stopped at its first 200: a fresh cache dir, or on
    PostgreSQL an app schema of its own (the first start's holds the decision record
    the pages were timed with); left as it was found."""
    cache = Path(tempfile.mkdtemp(prefix="localui-bench-cache-"))
    pg = options.pg
    if pg is not None:
        pg = dataclasses.replace(pg, app_schema=f"{pg.app_schema}_cold")
        drop_schema(pg.dsn, pg.app_schema)
    try:
        server = start_localui(
            store.path,
            cache_dir=cache,
            app_path=options.app_path,
            pg=pg,
            policy=options.policy,
            notify=options.notify,
            quiet=True,
        )
        server.stop()
        return server.startup_s, server.startup_cpu_s
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if pg is not None:
            drop_schema(pg.dsn, pg.app_schema)


def _seconds(samples: Sequence[tuple[float, float]]) -> str:
    return ", ".join(f"{wall:.2f}" for wall, _cpu in samples) + " s"


def measure_sdk(store: BuiltStore, venv: Path, options: Options, log: Log) -> ServerRun:
    result = ServerRun()
    try:
        server = start_sdk_ui(store.path, venv=venv)
    except Exception as exc:
        result.errors.append(f"sdk-ui: {exc}")
        return result
    result.startup_cold_s = server.startup_s
    result.startup_cpu["cold"] = server.startup_cpu_s
    log(f"  sdk-ui started in {server.startup_s:.2f} s")
    try:
        result.timings = _time_all(server, sdk_urls(store), options, log, result)
        result.memory_kb = server.memory_kb()
        if options.weights:
            result.pages = page_weights(
                {
                    "overview": f"{server.base_url}/",
                    "run50": f"{server.base_url}/executions/{store.run_50}",
                    "approvals": f"{server.base_url}/approvals",
                }
            )
    except Exception as exc:
        result.errors.append(f"sdk-ui: {type(exc).__name__}: {exc}")
        log(traceback.format_exc())
    finally:
        server.stop()
    return result


def snapshot_app(dest: Path) -> str:
    """Copy this checkout's app (``localui/``, ``templates/``, ``static/``) to ``dest``.

    Every server of a run then runs the same code even while someone edits the
    checkout. Returns a digest of what was copied, for the report.
    """
    shutil.rmtree(dest, ignore_errors=True)
    digest = hashlib.sha256()
    for name in ("localui", "templates", "static"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        for path in sorted((dest / name).rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(dest)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def compile_app(app_path: Path) -> None:
    """Compile the served copy's bytecode up front, as ``pip install`` does for a user:
    otherwise the first server of a run spends its start-up compiling it."""
    if not compileall.compile_dir(app_path / "localui", quiet=1):
        raise RuntimeError(f"the app at {app_path} does not compile")


def _span_sizes(text: str) -> list[int]:
    return [] if text == "none" else _sizes(text)


def _sizes(text: str) -> list[int]:
    sizes = sorted(
        {
            int(x.replace("_", "").replace("k", "000").replace("m", "000000"))
            for x in text.split(",")
            if x
        }
    )
    if not sizes or min(sizes) < 100:
        raise argparse.ArgumentTypeError("sizes are run counts of at least 100")
    return sizes


def _store(
    templates: Templates, stores_dir: Path, size: int, pending: int, fresh: bool, log: Log
) -> BuiltStore:
    """The store of ``size`` runs: the one built before when it matches, else built now."""
    path = stores_dir / f"runs-{size}.db"
    key = store_cache.store_key(runs=size, pending=pending, spans=False)
    store = None if fresh else store_cache.load(path, key)
    if store is not None:
        log(
            f"store {store.label}: {store.rows:,} rows, found in {stores_dir}"
            f" (built in {store_cache.built_seconds(path) or 0:.0f} s)"
        )
        if added := add_votes(path):
            log(f"store {store.label}: {added:,} votes added beside its decisions")
        if added := add_agents(path):
            log(f"store {store.label}: {added:,} decisions and votes given their run's agent")
        return store
    store_cache.forget(path)
    store = build_store(templates, path, runs=size, pending=pending)
    store_cache.save(store, key)
    log(f"store {store.label}: {store.rows:,} rows, {store.seconds:.1f} s")
    return store


def _fresh_app_tables(store: BuiltStore, plain: BuiltStore, log: Log) -> None:
    """``--fresh-app-tables``: the app's tables of ``store`` dropped, its decision record
    loaded again on the runs of ``plain`` (the same runs; a store with spans keeps no
    list of them)."""
    dropped = fresh_app_tables(store.path, plain.manifest, store.runs)
    log(f"store {store.label}: app tables dropped ({', '.join(dropped) or 'none'}), record loaded")


def _spanned(
    templates: Templates, store: BuiltStore, stores_dir: Path, fresh: bool, log: Log
) -> BuiltStore:
    """``store`` with trace spans: the one built before when it matches, else built now."""
    path = stores_dir / f"runs-{store.runs}-spans.db"
    key = store_cache.store_key(runs=store.runs, pending=store.pending, spans=True)
    spanned = None if fresh else store_cache.load(path, key)
    if spanned is not None:
        log(f"store {spanned.label}: {spanned.spans:,} spans, found in {stores_dir}")
        return spanned
    store_cache.forget(path)
    spanned = add_spans(templates, store, path)
    store_cache.save(spanned, key)
    log(f"store {spanned.label}: {spanned.spans:,} spans, {spanned.seconds:.1f} s")
    return spanned


def _measure_writes(
    stores: Sequence[BuiltStore], out: Path, app_path: Path, log: Log
) -> list[Verdict]:
    """The figures under writes (``bench.writes``), their raw samples beside ``out``
    (``-writes.json``): readers on the largest store up to 100,000 runs, the outbox
    on the largest store from 100,000 runs."""
    plain = [s for s in stores if not s.spans]
    readers_on = max((s for s in plain if s.runs <= 100_000), key=lambda s: s.runs, default=None)
    outbox_on = max((s for s in plain if s.runs >= 100_000), key=lambda s: s.runs, default=None)
    found: list[Verdict] = []
    raw: dict[str, Any] = {}
    if readers_on is not None:
        log(f"measuring {readers_on.label} under writes (load average {os.getloadavg()[0]:.1f})")
        under = writes.measure_writes(readers_on.path, app_path=app_path, log=log)
        raw["writes"] = {"store": readers_on.label, **under.as_json()}
        found += writes.verdicts(readers_on.label, under, None)
    if outbox_on is not None:
        log(f"measuring {outbox_on.label} while the outbox drains")
        drained = writes.measure_outbox(outbox_on.path, app_path=app_path, log=log)
        raw["outbox"] = {"store": outbox_on.label, **drained.as_json()}
        found += writes.verdicts(outbox_on.label, None, drained)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(f"{out.stem}-writes.json").write_text(json.dumps(raw, indent=1))
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark localui against its budgets, side by side with the SDK's UI.",
    )
    parser.add_argument(
        "--sizes", type=_sizes, default=[1000, 10000, 100000], help="runs per store (1000,10k)"
    )
    parser.add_argument(
        "--span-sizes",
        type=_span_sizes,
        default=None,
        help="sizes also built with trace spans, or none (default: the largest)",
    )
    parser.add_argument(
        "--pending", type=int, default=1000, help="paused runs per store (at most a tenth)"
    )
    parser.add_argument("--requests", type=int, default=30, help="timed requests per page")
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests before them")
    parser.add_argument(
        "--starts",
        type=int,
        default=3,
        help="how many times each kind of localui start (first, later, without agents) is"
        " timed; the medians are judged",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the markdown table")
    parser.add_argument(
        "--workdir", type=Path, default=DEFAULT_WORKDIR, help="stores and the SDK UI's venv"
    )
    parser.add_argument("--no-sdk-ui", action="store_true", help="measure localui alone")
    parser.add_argument(
        "--sdk-ui-venv", type=Path, default=None, help="venv for fastaiagent[ui] (made if missing)"
    )
    parser.add_argument(
        "--sdk-sizes",
        type=_sizes,
        default=None,
        help="sizes the SDK UI is measured on (default: the largest)",
    )
    parser.add_argument(
        "--backend",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="where the stores live: SQLite files, or schemas on PostgreSQL (the server in"
        " LOCALUI_TEST_PG_DSN, else one started for the run); the SDK UI reads SQLite only",
    )
    parser.add_argument(
        "--fresh-stores",
        action="store_true",
        help="build every store anew (by default a store built before for the same size and"
        " store format is reused from --workdir, and so is its PostgreSQL copy)",
    )
    parser.add_argument(
        "--fresh-app-tables",
        action="store_true",
        help="before measuring, drop the app's own tables (localui_*) from every store, as"
        " a reused store carries what earlier runs wrote into them, and load the bench's"
        " decision record again: each run starts as on a first start (the SDK's tables are"
        " kept)",
    )
    parser.add_argument(
        "--no-fleet",
        action="store_true",
        help="on PostgreSQL, skip the fleet figure (two servers while a third process writes)"
        " and the team figures (two replicas behind HAProxy)",
    )
    parser.add_argument(
        "--audit-rows",
        type=int,
        default=1_000_000,
        help="audit rows the audit log's figures are measured at (0: not measured)",
    )
    parser.add_argument(
        "--no-writes",
        action="store_true",
        help="on SQLite, skip the figures under writes (readers while another process"
        " writes runs; the runs list while the outbox drains)",
    )
    parser.add_argument(
        "--notify-burst",
        type=int,
        default=1000,
        metavar="N",
        help="pauses written back to back for the notification rows; 0 skips those rows",
    )
    parser.add_argument(
        "--notify-samples",
        type=int,
        default=30,
        metavar="N",
        help="pauses timed one at a time, pause written -> webhook received",
    )
    parser.add_argument(
        "--only-build",
        action="store_true",
        help="build (or find) the stores and their PostgreSQL copies, then stop",
    )
    parser.add_argument(
        "--only",
        choices=("kill9", "bulk-resume", "team", "deadlines", "links"),
        default=None,
        help="run one measurement alone: kill9 is kill -9 of localui at random moments"
        " during 100 approvals over 50 pauses, 5 rounds (bench/kill9.py); bulk-resume is"
        " --bulk-resume-runs crashed runs resumed from /attention in one go"
        " (bench/bulk_resume.py); team is two replicas behind HAProxy on the largest"
        " --sizes store (--backend postgres; bench/team.py); deadlines is how soon two"
        " servers escalate and decide a rule's pauses, one killed around the deadline, 3"
        " rounds (bench/deadlines.py); links is what scanners' 1,000 fetches of personal"
        " decision links decide (nothing), the decision page and the press to the run"
        " resumed (bench/links.py)",
    )
    parser.add_argument(
        "--bulk-resume-runs",
        type=int,
        default=BULK_RESUME_RUNS,
        metavar="N",
        help="crashed runs resumed in bulk for the bulk-resume rows; 0 skips them",
    )
    parser.add_argument(
        "--demo-starts",
        type=int,
        default=5,
        help="times `localui demo` is started to time its first page and its seeding (the"
        " medians are judged); 0 skips it",
    )
    parser.add_argument(
        "--only-demo",
        action="store_true",
        help="time `localui demo` only (no stores, no pages), and judge its two budgets",
    )
    parser.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="serve localui under this approval policy (bench/policy.toml: two approvals"
        " and a typed field on every refund pause), so the pages carry the rule's work",
    )
    parser.add_argument(
        "--notify-targets",
        action="store_true",
        help="give every localui server a signed webhook and an Apprise json:// target at a"
        " loopback receiver, so its watcher runs while the pages are timed; then read its"
        " idle CPU with no page open (judged: at most 2 %% of a core)",
    )
    parser.add_argument(
        "--watcher-idle-seconds",
        type=float,
        default=30.0,
        help="with --notify-targets: how long the idle server's CPU is read for",
    )
    parser.add_argument(
        "--localui-path",
        type=Path,
        default=None,
        help="a directory holding another localui package (with templates/ and static/"
        " beside it) to measure instead of this checkout's: a change tried out in a copy",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    if args.only == "kill9":
        out = REPO / "bench" / "results" / f"kill9-{args.backend}.md"
        if args.backend == "postgres":
            with pg.server(log) as dsn:
                return run_kill9(dsn, log, out)
        return run_kill9(None, log, out)
    if args.only == "deadlines":
        from bench.deadlines import run_deadlines

        out = REPO / "bench" / "results" / f"deadlines-{args.backend}.md"
        if args.backend == "postgres":
            with pg.server(log) as dsn:
                return run_deadlines(dsn, log, out)
        return run_deadlines(None, log, out)
    if args.only == "links":
        from bench.links import run_links

        out = REPO / "bench" / "results" / f"links-{args.backend}.md"
        if args.backend == "postgres":
            with pg.server(log) as dsn:
                return run_links(dsn, out)
        return run_links(None, out)
    if args.only == "bulk-resume":
        from bench.bulk_resume import main as bulk_resume_main

        out = REPO / "bench" / "results" / f"bulk-resume-{args.backend}.md"
        where = ["--localui-path", str(args.localui_path)] if args.localui_path else []
        return bulk_resume_main(
            ["--backend", args.backend, "--runs", str(args.bulk_resume_runs), "--out", str(out)]
            + where
        )
    if args.backend == "postgres":
        # The cluster lives in --workdir so the stores copied into it are found again.
        with pg.server(log, args.workdir.resolve() / "postgres") as dsn:
            return _main(args, argv, started, log, dsn)
    return _main(args, argv, started, log, None)


def _main(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    started: float,
    log: Log,
    dsn: str | None,
) -> int:
    pg_targets: dict[str, PgTarget] = {}

    largest = max(args.sizes)
    span_sizes = set([largest] if args.span_sizes is None else args.span_sizes)
    sdk_sizes = set(args.sdk_sizes or [largest])
    workdir: Path = args.workdir.resolve()
    stores_dir = workdir / "stores"
    # A run of its own in a shared --workdir: another bench there must not replace or
    # delete the app this one serves.
    app_path: Path = (
        args.localui_path.resolve() if args.localui_path else workdir / f"app-{os.getpid()}"
    )
    code = report.git_state()
    app_note = f"a copy at {app_path}, given by --localui-path"
    if args.localui_path is None:
        app_note = f"this checkout, copied at start (digest {snapshot_app(app_path)})"
    if args.notify_targets:
        app_note += "; every server given a signed webhook and an Apprise json:// target"
    compile_app(app_path)
    if args.only_demo:
        return _only_demo(args, log, app_path)
    try:
        templates = make_templates(workdir / "templates", log)
        stores: list[BuiltStore] = []
        for size in args.sizes:
            pending = min(args.pending, size // 10)
            store = _store(templates, stores_dir, size, pending, args.fresh_stores, log)
            if args.fresh_app_tables:
                _fresh_app_tables(store, store, log)
            if dsn is not None:
                # The app's schema (its index, dropped at each cold start) is this run's
                # own: another bench on the same server must not drop it mid-run.
                target = PgTarget(dsn, f"bench_{size}", f"bench_{size}_localui_{os.getpid()}")
                key = store_cache.store_key(runs=size, pending=pending, spans=False)
                key += f", build {store_cache.build_of(store.path)}"
                if not args.fresh_stores and pg.copied_key(dsn, target.schema) == key:
                    log(f"store {store.label} found in PostgreSQL {target.schema}")
                else:
                    seconds = pg.copy_store(store.path, dsn, target.schema, key)
                    log(
                        f"store {store.label} copied to PostgreSQL {target.schema}: {seconds:.1f} s"
                    )
                pg_targets[store.label] = target
            stores.append(store)
            if size in span_sizes:
                spanned = _spanned(templates, store, stores_dir, args.fresh_stores, log)
                if args.fresh_app_tables:
                    _fresh_app_tables(spanned, store, log)
                stores.append(spanned)
                if dsn is not None:
                    # A fleet's agents trace into a SQLite file of their own: the same
                    # runs on PostgreSQL, served with that file's spans (--traces), and
                    # an app schema of its own (its cold start drops it).
                    pg_targets[spanned.label] = PgTarget(
                        dsn,
                        pg_targets[store.label].schema,
                        f"bench_{size}_spans_localui_{os.getpid()}",
                        traces=spanned.path,
                    )
    except Exception:
        log(traceback.format_exc())
        return 2

    if args.only_build:
        log(f"stores ready in {stores_dir}")
        return 0
    if args.only == "team":
        return _only_team(args, stores, pg_targets, app_path, log)

    venv: Path | None = None
    sdk_note = "not measured (--no-sdk-ui)"
    if not args.no_sdk_ui:
        try:
            venv = ensure_venv(args.sdk_ui_venv or workdir / f"sdk-ui-venv-{sdk_version()}", log)
            sdk_note = ", ".join(f"{k} {v}" for k, v in installed(venv).items())
        except Exception as exc:
            sdk_note = f"not measured: its venv could not be made ({exc})"
            log(sdk_note)

    runs: list[StoreRun] = []
    team_verdicts: list[Verdict] = []
    team_errors: list[str] = []
    targets = BenchTargets.start(workdir) if args.notify_targets else None
    for store in stores:
        at_largest = store.runs == largest
        options = Options(
            requests=args.requests,
            warmup=args.warmup,
            # The app's queries never read spans: once, on the largest store without them.
            inproc=at_largest and not store.spans,
            # Page weight does not depend on the store's size: once, on the largest.
            weights=at_largest and not store.spans,
            app_path=app_path,
            pg=pg_targets.get(store.label),
            policy=args.policy.resolve() if args.policy else None,
            notify=targets.args() if targets is not None else (),
            idle_seconds=args.watcher_idle_seconds,
            starts=args.starts,
        )
        log(f"measuring {store.label} (load average {os.getloadavg()[0]:.1f})")
        local = measure_localui(store, options, log, sdk_venv=venv)
        sdk = None
        if venv is not None and store.runs in sdk_sizes and options.pg is None:
            sdk = measure_sdk(store, venv, options, log)
        fleet = None
        # The fleet and the team, once: on the largest store without spans.
        if options.pg is not None and at_largest and not store.spans and not args.no_fleet:
            log(f"measuring the fleet on {store.label} (load average {os.getloadavg()[0]:.1f})")
            fleet = measure_fleet(
                store,
                options.pg,
                requests=args.requests,
                warmup=args.warmup,
                app_path=app_path,
                log=log,
            )
        if options.pg is not None and at_largest and not store.spans and not args.no_fleet:
            log(f"measuring a team's two replicas behind HAProxy (load {os.getloadavg()[0]:.1f})")
            team = measure_team(
                store,
                options.pg,
                requests=args.requests,
                warmup=args.warmup,
                app_path=app_path,
                log=log,
            )
            team_verdicts += judge(
                {store.label: team.figures}, runs=largest, with_sdk_ui=False, budgets=TEAM_BUDGETS
            )
            team_errors += team.errors
        runs.append(StoreRun(store=store, localui=local, sdk=sdk, fleet=fleet))

    if targets is not None:
        log(f"the receiver got {len(targets.receiver.requests())} notifications in all")
        targets.stop()
    judged = {r.store.label: report.budget_figures(r) for r in runs if r.store.runs == largest}
    demo = None
    if args.demo_starts > 0:
        log(f"timing localui demo, {args.demo_starts} starts (load {os.getloadavg()[0]:.1f})")
        demo = measure_demo(args.demo_starts, log, app_path)
        judged["demo"] = demo.figures()
    verdicts = judge(
        judged,
        runs=largest,
        # Judged where the SDK UI has the page, on the same store: it reads SQLite only,
        # so on PostgreSQL the pair is reported beside its SQLite file, not judged.
        with_sdk_ui=dsn is None
        and any(r.localui.side_by_side for r in runs if r.store.runs == largest),
        with_demo=demo is not None,
        # The traced chain's run page is timed on a store with spans (on PostgreSQL, the
        # same runs served with the spans' SQLite file) only.
        with_spans=any(r.store.spans for r in runs if r.store.runs == largest),
    )
    if targets is not None:
        verdicts += judge(judged, runs=largest, with_sdk_ui=False, budgets=WATCHER_BUDGETS)
    if dsn is None and not args.no_writes:
        verdicts += _measure_writes(stores, args.out, app_path, log)
    errors = [e for r in runs for s in (r.localui, r.sdk) if s is not None for e in s.errors]
    if args.notify_burst > 0:
        # On a fresh store of its own (the figures do not depend on the store's size), in
        # a process of its own: it runs the SDK's agent, whose configuration is its own.
        log(f"measuring notifications (load average {os.getloadavg()[0]:.1f})")
        notified, notify_errors = run_notify_bench(
            backend=args.backend, dsn=dsn, samples=args.notify_samples, burst=args.notify_burst
        )
        label = next(r.store.label for r in runs if r.store.runs == largest)
        verdicts += judge(
            {label: notified}, runs=largest, with_sdk_ui=False, budgets=NOTIFY_BUDGETS
        )
        errors += notify_errors
    if args.bulk_resume_runs > 0:
        # A fresh store of crashed runs, in a process of its own (the agent's settings are
        # its own), served from this run's copy of the app.
        log(f"measuring bulk resume (load average {os.getloadavg()[0]:.1f})")
        resumed, bulk_errors = run_bulk_bench(
            backend=args.backend, dsn=dsn, runs=args.bulk_resume_runs, app_path=app_path
        )
        label = next(r.store.label for r in runs if r.store.runs == largest)
        verdicts += judge(
            {label: resumed}, runs=largest, with_sdk_ui=False, budgets=BULK_RESUME_BUDGETS
        )
        errors += bulk_errors
    if args.audit_rows > 0:
        # A store of its own (the figures depend on the audit rows, not the runs), in a
        # process of its own.
        log(f"measuring the audit log, {args.audit_rows:,} rows (load {os.getloadavg()[0]:.1f})")
        audited, audit_errors = run_audit_bench(
            backend=args.backend, dsn=dsn, rows=args.audit_rows, app_path=app_path
        )
        label = next(r.store.label for r in runs if r.store.runs == largest)
        for key, value in audited.items():
            log(f"  audit {key}: {value:.2f}")
        verdicts += judge({label: audited}, runs=largest, with_sdk_ui=False, budgets=AUDIT_BUDGETS)
        errors += audit_errors
    verdicts += team_verdicts
    errors += team_errors
    errors += [e for r in runs if r.fleet is not None for e in r.fleet.errors]
    errors += demo.errors if demo is not None else []
    errors += [
        f"{r.store.label} / fleet {k}: {t.error}"
        for r in runs
        if r.fleet is not None
        for k, t in r.fleet.timings.items()
        if not t.ok
    ]
    errors += [
        f"{r.store.label} / {k}: {t.error}"
        for r in runs
        for s in (r.localui, r.sdk)
        if s is not None
        for k, t in s.timings.items()
        if not t.ok
    ]
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    context = report.Context(
        command=" ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])]),
        seconds=time.monotonic() - started,
        templates_seconds=templates.seconds,
        sdk_note=sdk_note,
        requests=args.requests,
        warmup=args.warmup,
        code=code,
        app_note=app_note,
    )
    out.write_text(report.markdown(runs, verdicts, errors, context))
    out.with_suffix(".json").write_text(
        json.dumps(report.as_json(runs, verdicts, errors, context), indent=1)
    )
    for target in pg_targets.values():
        # The store stays for the next run; the index is the app's, made by each start.
        drop_schema(target.dsn, target.app_schema)
    if args.localui_path is None:
        shutil.rmtree(app_path, ignore_errors=True)
    log(f"wrote {out} in {time.monotonic() - started:.0f} s")
    for v in verdicts:
        log(f"{'PASS' if v.passed else 'MISS'} {v.budget.what}: {v.worst:.4g} {v.budget.unit}")
    if errors:
        for e in errors:
            log(f"ERROR {e}")
        return 2
    return 0 if all_passed(verdicts) else 1


def _only_team(
    args: argparse.Namespace,
    stores: Sequence[BuiltStore],
    pg_targets: Mapping[str, PgTarget],
    app_path: Path,
    log: Log,
) -> int:
    """``--only team``: the team figures alone, judged, on the largest store."""
    largest = max(stores, key=lambda s: s.runs)
    target = pg_targets.get(largest.label)
    if target is None:
        log("--only team needs --backend postgres")
        return 2
    log(f"measuring a team's two replicas behind HAProxy (load {os.getloadavg()[0]:.1f})")
    team = measure_team(
        largest, target, requests=args.requests, warmup=args.warmup, app_path=app_path, log=log
    )
    drop_schema(target.dsn, target.app_schema)
    verdicts = judge(
        {largest.label: team.figures}, runs=largest.runs, with_sdk_ui=False, budgets=TEAM_BUDGETS
    )
    for v in verdicts:
        log(f"{'PASS' if v.passed else 'MISS'} {v.budget.what}: {v.worst:.4g} {v.budget.unit}")
    for error in team.errors:
        log(f"ERROR {error}")
    if args.localui_path is None:
        shutil.rmtree(app_path, ignore_errors=True)
    return 2 if team.errors else 0 if all_passed(verdicts) else 1


def _only_demo(args: argparse.Namespace, log: Log, app_path: Path) -> int:
    """``--only-demo``: the demo's two budgets, judged on the medians of its starts."""
    log(f"timing localui demo, {args.demo_starts} starts (load {os.getloadavg()[0]:.1f})")
    demo = measure_demo(max(1, args.demo_starts), log, app_path)
    verdicts = [
        v
        for v in judge({"demo": demo.figures()}, runs=0, with_sdk_ui=False, with_demo=True)
        if v.budget.needs_demo
    ]
    if args.localui_path is None:
        shutil.rmtree(app_path, ignore_errors=True)
    log(f"demo first page: {', '.join(f'{s:.2f}' for s in demo.first_page_s)} s")
    log(f"demo all seeded: {', '.join(f'{s:.2f}' for s in demo.seeded_s)} s")
    for v in verdicts:
        log(f"{'PASS' if v.passed else 'MISS'} {v.budget.what}: {v.worst:.4g} {v.budget.unit}")
    for e in demo.errors:
        log(f"ERROR {e}")
    if demo.errors:
        return 2
    return 0 if all_passed(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
