"""Notifications: a pause written -> its webhook received; a burst of pauses drained.

A fresh store (a SQLite file, or two fresh PostgreSQL schemas) is served by a real
``localui serve`` (default poll interval, 0.5 s) with one ``--webhook`` at a loopback
receiver (``bench.receiver``). This process writes pauses through the SDK: the demo
refund-bot on its offline model, which pauses each refund for a manager.

- **Latency**: ``samples`` pauses one at a time, each timed from just before the
  run starts (so the figure includes writing it) to the arrival of its POST; from
  the server's first sweep on, when its watcher follows the change feed (a pause
  written in the 2 s before is announced by that sweep, as the README says).
- **Burst**: ``burst`` pauses written back to back; drained is from the last write
  to the last delivery; every delivery is counted per ``webhook-id``, so a duplicate
  or a missing one shows.

    .venv/bin/python -m bench.notify                      # SQLite
    .venv/bin/python -m bench.notify --backend postgres   # LOCALUI_TEST_PG_DSN, else its own
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import pg
from bench.budgets import Budget, Verdict, judge
from bench.receiver import Receiver
from bench.servers import PgTarget, Server, _start, clean_env, free_port

Log = Callable[[str], None]

#: The budgets, judged on the figures of :func:`figures`.
NOTIFY_BUDGETS: tuple[Budget, ...] = (
    Budget(
        "notify_p50",
        "pause written -> webhook received p50 (poll 0.5 s)",
        1.0,
        "s",
        ("notify_p50_s",),
    ),
    Budget(
        "notify_p99",
        "pause written -> webhook received p99 (poll 0.5 s)",
        2.0,
        "s",
        ("notify_p99_s",),
    ),
    Budget(
        "notify_burst",
        "a burst of pauses: last write -> last delivery",
        30.0,
        "s",
        ("notify_burst_drain_s",),
    ),
    Budget("notify_twice", "burst deliveries sent twice", 0, "", ("notify_burst_duplicates",)),
    Budget("notify_lost", "burst pauses never delivered", 0, "", ("notify_burst_missing",)),
)
#: How long a burst may take to drain before it counts as lost.
DRAIN_TIMEOUT_S = 120.0
SECRET = "whsec_" + base64.b64encode(b"the benchmark's signing key.....").decode()


@dataclass
class NotifyRun:
    backend: str
    latencies: list[float] = field(default_factory=list)
    burst: int = 0
    write_s: float = 0.0
    drained_s: float = math.nan
    delivered: int = 0
    duplicates: int = 0
    errors: list[str] = field(default_factory=list)


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def figures(run: NotifyRun) -> dict[str, float]:
    return {
        "notify_p50_s": statistics.median(run.latencies) if run.latencies else math.nan,
        "notify_p99_s": _percentile(run.latencies, 0.99),
        "notify_burst_drain_s": run.drained_s,
        "notify_burst_duplicates": float(run.duplicates),
        "notify_burst_missing": float(run.burst - run.delivered),
    }


def _checkpointer(store: Path, target: PgTarget | None) -> Any:
    if target is None:
        from fastaiagent.checkpointers import SQLiteCheckpointer

        return SQLiteCheckpointer(str(store))
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    return PostgresCheckpointer(target.dsn, schema=target.schema, max_pool_size=4)


async def _pause(agent: Any, prompt: str) -> str:
    execution_id = str(uuid.uuid4())
    await agent.arun(prompt, execution_id=execution_id)
    return execution_id


def _arrived(receiver: Receiver) -> dict[str, float]:
    """When each run's first ``run.paused`` POST arrived, by execution id."""
    import json

    first: dict[str, float] = {}
    for got in receiver.requests():
        body = json.loads(got.body)
        first.setdefault(body["data"]["execution_id"], got.at)
    return first


def _wait_for_first_sweep(server: Server, timeout: float = 30.0) -> None:
    """Until the server's watcher has swept once: it follows the change feed from then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = httpx.get(server.base_url + "/notifications.json", timeout=5).json()
        if page["last_sweep_at"] is not None:
            return
        time.sleep(0.1)
    raise TimeoutError(f"the watcher had not swept {timeout:g} s after start")


def measure_notify(*, target: PgTarget | None, samples: int, burst: int, log: Log) -> NotifyRun:
    # Before the SDK reads its configuration: no traces, no ./.fastaiagent.
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-notify-"))
    store = workdir / "local.db"
    os.environ["FASTAIAGENT_TRACE_ENABLED"] = "false"
    os.environ["FASTAIAGENT_LOCAL_DB"] = str(store)
    from localui.demo.agent import build_agent
    from localui.demo.scenarios import get_scenario

    run = NotifyRun(backend="postgres" if target is not None else "sqlite")
    checkpointer = _checkpointer(store, target)
    checkpointer.setup()
    agent = build_agent(checkpointer)
    prompt = get_scenario("paused-1").prompt
    assert prompt is not None
    secret = workdir / "secret"
    secret.write_text(SECRET)
    loop = asyncio.new_event_loop()
    server: Server | None = None
    with Receiver() as receiver:
        try:
            # The SDK's tables exist before the server looks (a completed run makes them).
            loop.run_until_complete(agent.arun(get_scenario("completed").prompt or ""))
            where = [str(store)]
            if target is not None:
                where = [
                    target.dsn,
                    "--pg-schema",
                    target.schema,
                    "--pg-app-schema",
                    target.app_schema,
                ]
            port = free_port()
            command = [
                sys.executable,
                "-m",
                "localui",
                "serve",
                "--store",
                *where,
                "--port",
                str(port),
                "--no-auth",
                "--notify-on",
                "paused",
                "--webhook",
                receiver.url + "/hook",
                "--webhook-secret-file",
                str(secret),
            ]
            server = _start("localui", command, port=port, env=clean_env(), workdir=workdir)
            _wait_for_first_sweep(server)
            log(f"notify: timing {samples} pauses one at a time ({run.backend})")
            for _ in range(samples):
                started = time.time()
                execution_id = loop.run_until_complete(_pause(agent, prompt))
                deadline = time.monotonic() + 10
                while execution_id not in _arrived(receiver) and time.monotonic() < deadline:
                    time.sleep(0.01)
                arrival = _arrived(receiver).get(execution_id)
                if arrival is None:
                    run.errors.append(f"notify: the pause {execution_id} was not delivered in 10 s")
                    continue
                run.latencies.append(arrival - started)
                time.sleep(0.2)  # apart, so each is timed on its own
            before = len(receiver.requests())
            log(f"notify: writing {burst} pauses back to back")
            started = time.monotonic()
            ids = [loop.run_until_complete(_pause(agent, prompt)) for _ in range(burst)]
            written_at = time.time()
            run.write_s = time.monotonic() - started
            run.burst = burst
            wanted = set(ids)
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while time.monotonic() < deadline and not wanted <= _arrived(receiver).keys():
                time.sleep(0.05)
            time.sleep(1.0)  # a few polls more: a late duplicate would show
            arrived = _arrived(receiver)
            seen = Counter(r.headers["webhook-id"] for r in receiver.requests()[before:])
            run.delivered = len(wanted & arrived.keys())
            run.duplicates = sum(n - 1 for n in seen.values())
            if run.delivered == burst:
                run.drained_s = max(arrived[i] for i in ids) - written_at
        except Exception as exc:
            run.errors.append(f"notify: {type(exc).__name__}: {exc}")
        finally:
            if server is not None:
                server.stop()
            checkpointer.close()
            loop.close()
    return run


def report_lines(run: NotifyRun, verdicts: Sequence[Verdict]) -> list[str]:
    lines = [
        f"notifications on {run.backend}: {len(run.latencies)} pauses timed,"
        f" {run.burst} in a burst written in {run.write_s:.1f} s,"
        f" {run.delivered} delivered, {run.duplicates} twice",
    ]
    for v in verdicts:
        mark = "PASS" if v.passed else "MISS"
        lines.append(
            f"{mark} {v.budget.what}: {v.worst:.4g} {v.budget.unit} (budget {v.budget.limit:g})"
        )
    return lines


def run_notify_bench(
    *, backend: str, dsn: str | None, samples: int, burst: int
) -> tuple[dict[str, float], list[str]]:
    """This module in a child process; its figures and errors."""
    import json
    import subprocess

    out = Path(tempfile.mkdtemp(prefix="localui-bench-notify-")) / "figures.json"
    env = clean_env()
    if dsn is not None:
        env["LOCALUI_TEST_PG_DSN"] = dsn
    command = [sys.executable, "-m", "bench.notify", "--backend", backend]
    command += ["--samples", str(samples), "--burst", str(burst), "--figures", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if not out.is_file():
        return {}, [f"notify: the benchmark exited {done.returncode}: {done.stderr[-2000:]}"]
    written = json.loads(out.read_text())
    figures_: dict[str, float] = {k: float(v) for k, v in written["figures"].items()}
    return figures_, list(written["errors"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.notify")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--samples", type=int, default=30, help="pauses timed one by one")
    parser.add_argument("--burst", type=int, default=1000, help="pauses written back to back")
    parser.add_argument("--figures", type=Path, default=None, help="also write them here (JSON)")
    args = parser.parse_args(argv)
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    def measure(target: PgTarget | None) -> NotifyRun:
        return measure_notify(target=target, samples=args.samples, burst=args.burst, log=log)

    if args.backend == "postgres":
        with pg.server(log) as dsn:
            suffix = uuid.uuid4().hex[:8]
            target = PgTarget(dsn, f"bench_notify_{suffix}", f"bench_notify_{suffix}_localui")
            try:
                run = measure(target)
            finally:
                pg.drop_schema(dsn, target.schema)
                pg.drop_schema(dsn, target.app_schema)
    else:
        run = measure(None)
    verdicts = judge({run.backend: figures(run)}, runs=0, with_sdk_ui=False, budgets=NOTIFY_BUDGETS)
    for line in report_lines(run, verdicts):
        print(line, flush=True)
    for error in run.errors:
        print(f"ERROR {error}", flush=True)
    if args.figures is not None:
        import json

        args.figures.write_text(json.dumps({"figures": figures(run), "errors": run.errors}))
    if run.errors:
        return 2
    return 0 if all(v.passed for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())


#: How long an idle server's CPU is read for, once its watcher has announced what
#: waited when it started.
IDLE_SECONDS = 30.0
#: How long the first announcements (every waiting pause, its reminder, the newest
#: stalled runs) may take to drain before the idle reading starts anyway.
SETTLE_TIMEOUT_S = 180.0

#: Judged when the pages are timed with targets configured (``--notify-targets``).
WATCHER_BUDGETS: tuple[Budget, ...] = (
    Budget(
        "watcher_idle",
        "the watcher's idle cost: CPU with targets configured and no request",
        2,
        "% of a core",
        ("watcher_idle_pct",),
    ),
)


@dataclass
class BenchTargets:
    """A loopback receiver, and the options that point a server's notifications at it:
    a signed webhook and an Apprise ``json://`` chat target (``--notify-targets``)."""

    receiver: Receiver
    secret_file: Path

    @classmethod
    def start(cls, workdir: Path) -> BenchTargets:
        receiver = Receiver().__enter__()
        secret_file = workdir / "webhook-secret"
        secret_file.write_text(SECRET)
        return cls(receiver=receiver, secret_file=secret_file)

    def args(self) -> tuple[str, ...]:
        port = self.receiver.url.rsplit(":", 1)[1]
        return (
            "--webhook",
            f"{self.receiver.url}/hook",
            "--webhook-secret-file",
            str(self.secret_file),
            "--notify",
            f"json://127.0.0.1:{port}/chat",
            # Every event but run.decided: on PostgreSQL the bench copies its decision
            # record (100,000 entries) into the app's schema after the server made it,
            # which the server would take for 100,000 decisions made at once.
            "--notify-on",
            "paused,failed,stalled,overdue",
        )

    def stop(self) -> None:
        self.receiver.__exit__(None, None, None)


def _progress(server: Server) -> tuple[bool, int, int] | None:
    """Whether the watcher has swept since start, and the announcements pending and
    sent over every target (None: not readable)."""
    try:
        answer = httpx.get(f"{server.base_url}/notifications.json", timeout=30.0)
    except httpx.HTTPError:
        return None
    if answer.status_code != 200:
        return None
    body = answer.json()
    if not body.get("configured"):
        return None
    pending = sum(int(t["pending"]) for t in body["targets"])
    sent = sum(int(t["sent"]) + int(t["failed"]) for t in body["targets"])
    return body.get("last_sweep_at") is not None, pending, sent


def settle(server: Server, log: Log) -> float:
    """Wait until what the watcher announced at start is delivered (at most
    ``SETTLE_TIMEOUT_S``): the steady state a server with targets runs in. That is
    after its first sweep (``first_sweep_after`` past start), with nothing pending,
    and nothing more sent over two readings a second apart (a round in flight has
    claimed its rows, so they no longer count as pending). Seconds waited."""
    started = time.monotonic()
    deadline = started + SETTLE_TIMEOUT_S
    before: tuple[bool, int, int] | None = None
    while True:
        now = _progress(server)
        if now is None:
            raise RuntimeError("/notifications.json does not say the server's targets")
        swept, pending, _ = now
        if swept and pending == 0 and now == before:
            break
        if time.monotonic() >= deadline:
            log(f"  {pending} announcements still pending after {SETTLE_TIMEOUT_S:.0f} s")
            break
        before = now
        time.sleep(1.0)
    return time.monotonic() - started


def watcher_idle_pct(server: Server, log: Log, seconds: float = IDLE_SECONDS) -> float:
    """The server's CPU, in per cent of one core, over ``seconds`` with no request
    made: its watcher polling the change feed and sweeping. Read once what was
    announced at start has been delivered (or after ``SETTLE_TIMEOUT_S``)."""
    settle(server, log)
    cpu, started = server.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    used = server.cpu_seconds() - cpu
    pct = 100.0 * used / (time.monotonic() - started)
    log(f"  watcher idle: {pct:.2f} % of a core over {seconds:.0f} s ({used:.2f} s CPU)")
    return pct
