"""The fleet figure: two localui processes on one PostgreSQL store while a third writes.

A team runs localui on more than one machine against the store its agents write
to. Here two ``localui serve`` processes share the store and its runs index (the
app schema the single-server measurements left built), and ``bench.fleet_writer``
starts 50 runs a second through the SDK. While it writes, the runs list's first
page is timed on each process in turn: every request sees new rows, so every
request brings the shared index up to date first (or finds the other process doing
it). The runs written are taken out of the store afterwards, so the store stays
the one its cache key names.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.latency import failed, time_get, warm_up
from bench.model import FleetRun
from bench.pg import TABLES
from bench.servers import REPO, PgTarget, clean_env, pythonpath, start_localui
from bench.stores import BuiltStore

Log = Callable[[str], None]

#: Runs the writer starts per second.
RATE = 50.0
#: The page timed on each process.
URL = "/"


def measure_fleet(
    store: BuiltStore,
    pg: PgTarget,
    *,
    requests: int,
    warmup: int,
    app_path: Path | None,
    log: Log,
) -> FleetRun:
    result = FleetRun(rate_asked=RATE)
    servers = []
    writer: subprocess.Popen[str] | None = None
    ids_file = Path(tempfile.mkdtemp(prefix="localui-bench-fleet-")) / "ids.txt"
    try:
        for _ in range(2):
            cache = Path(tempfile.mkdtemp(prefix="localui-bench-cache-"))
            servers.append(start_localui(store.path, cache_dir=cache, app_path=app_path, pg=pg))
        # Long enough for every timed request on both processes, with room to spare.
        seconds = max(5.0, 1.0 * requests)
        writer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.fleet_writer",
                "--dsn",
                pg.dsn,
                "--schema",
                pg.schema,
                "--rate",
                str(RATE),
                "--seconds",
                str(seconds),
                "--ids",
                str(ids_file),
            ],
            cwd=REPO,
            env=clean_env(PYTHONPATH=pythonpath(app_path)),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        if writer.stdout.readline().strip() != "writing":
            raise RuntimeError("the fleet writer did not start")
        # Let the writes get going before anything is timed.
        time.sleep(2.0)
        result.load.append(os.getloadavg()[0])
        for name, server in zip(("a", "b"), servers, strict=True):
            with httpx.Client(base_url=server.base_url, timeout=300.0) as client:
                error = warm_up(client, URL, times=warmup)
                if error is not None:
                    result.timings[name] = failed(error)
                    continue
                cpu = server.cpu_seconds()
                timed = time_get(client, URL, requests=requests)
                cpu_ms = (server.cpu_seconds() - cpu) * 1000 / requests
                result.timings[name] = dataclasses.replace(timed, cpu_ms=cpu_ms)
            t = result.timings[name]
            log(
                f"  fleet, process {name}, runs list while writing: p50 {t.p50:.1f} ms,"
                f" p95 {t.p95:.1f} ms, server CPU {t.cpu_ms or 0:.1f} ms"
            )
        result.load.append(os.getloadavg()[0])
        if writer.poll() is not None:
            result.errors.append("fleet: the writer had stopped before the timing ended")
        out, _ = writer.communicate(timeout=seconds + 300)
        summary = json.loads(out.strip().splitlines()[-1])
        result.runs_written = int(summary["started"])
        result.runs_completed = int(summary["completed"])
        result.write_seconds = float(summary["seconds"])
        log(
            f"  fleet writer: {result.runs_written} runs started in {result.write_seconds:.1f} s"
            f" ({result.runs_completed} completed)"
        )
    except Exception as exc:
        result.errors.append(f"fleet: {type(exc).__name__}: {exc}")
    finally:
        if writer is not None and writer.poll() is None:
            writer.kill()
            writer.wait()
        for server in servers:
            server.stop()
        _take_out(pg, ids_file)
    return result


def _take_out(pg: PgTarget, ids_file: Path) -> None:
    """Delete the writer's runs: the store is reused by later runs of the bench."""
    import psycopg

    if not ids_file.is_file():
        return
    ids = ids_file.read_text().split()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"DELETE FROM {pg.schema}.{table} WHERE execution_id = ANY(%s)", (ids,))
