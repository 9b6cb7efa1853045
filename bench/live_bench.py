"""Live streams under load: one ``localui serve`` process, a hundred SSE clients.

    .venv/bin/python bench/live_bench.py                  # seeds a demo store first
    .venv/bin/python bench/live_bench.py --store S.db     # a copy of S.db is served
    .venv/bin/python bench/live_bench.py --clients 100 --trials 20 --idle 10

It reports, for the server process:

- CPU while idle: utime+stime from ``/proc/PID/stat`` over ``--idle`` seconds,
  with no client, then with every client connected and nothing changing;
- memory per client: the RSS it gains with the clients connected, divided by
  their number;
- write to event: each trial writes a paused run in one transaction (its rows and
  its pending row, copied from a seeded pause, as the SDK writes a pause) and
  times, on this process's clock, from the commit to each client receiving the
  event that shows it (the runs table, the queue card, the nav badge). The
  clients run in this process, so this is when the event was sent plus a
  loopback hop;
- shutdown: seconds from SIGINT, then SIGTERM (each on a fresh server with every
  client connected), to the process exiting, and whether the streams ended cleanly.

Clients: 60% on ``/live/runs``, 20% on ``/live/approvals``, 20% on ``/live/nav``.
Budgets (``--check``): idle CPU with clients under 2% of a core, p95 write to
event under 1.5 s at the default 0.5 s poll, shutdown under 2 s, under 1 MB
per client. Exit status 1 when ``--check`` and one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
LOCALUI = Path(sys.executable).parent / "localui"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

BUDGETS = {
    "idle CPU with clients (% of a core)": 2.0,
    "write to event p95 (s)": 1.5,
    "shutdown (s)": 2.0,
    "memory per client (KB)": 1024.0,
}


# --- the server ---------------------------------------------------------------


def _shows(fragment: str, text: str) -> Callable[[str, str], bool]:
    """Whether an SSE event is the named fragment and holds ``text``."""

    def check(name: str, data: str) -> bool:
        return name == fragment and text in data

    return check


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")


def start_server(store: Path, workdir: Path) -> Server:
    port = free_port()
    log = workdir / f"serve-{port}.log"
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(LOCALUI), "serve", "--store", str(store), "--port", str(port), "--no-auth"],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/runs.json", timeout=2).status_code == 200:
                return Server(process=process, url=url, log=log)
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"localui serve did not start:\n{log.read_text()}")


def stop_server(server: Server) -> None:
    if server.process.poll() is None:
        server.process.kill()
        server.process.wait()


# --- the clients --------------------------------------------------------------


@dataclass
class Client:
    path: str
    #: Each event as it arrived: (monotonic time, event name, data).
    events: list[tuple[float, str, str]] = field(default_factory=list)
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    ended: str = ""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, http: httpx.AsyncClient) -> None:
        try:
            async with http.stream("GET", self.path) as response:
                name, data = "", []
                async for line in response.aiter_lines():
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: "):
                        data.append(line[6:])
                    elif line == "" and (name or data):
                        self.events.append((time.monotonic(), name, "\n".join(data)))
                        self.changed.set()
                        self.opened.set()
                        name, data = "", []
            self.ended = "cleanly"
        except httpx.HTTPError as exc:
            self.ended = f"{type(exc).__name__}"
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise

    def first_after(self, since: float, wanted: Callable[[str, str], bool]) -> float | None:
        for at, name, data in self.events:
            if at >= since and wanted(name, data):
                return at
        return None


def client_paths(count: int) -> list[str]:
    runs = round(count * 0.6)
    queue = round(count * 0.2)
    return (
        ["/live/runs"] * runs + ["/live/approvals"] * queue + ["/live/nav"] * (count - runs - queue)
    )


async def connect(server: Server, count: int) -> tuple[list[Client], list[asyncio.Task[None]]]:
    http = httpx.AsyncClient(
        base_url=server.url,
        timeout=httpx.Timeout(10, read=None),
        limits=httpx.Limits(max_connections=count + 10, max_keepalive_connections=0),
    )
    clients = [Client(path) for path in client_paths(count)]
    tasks = [asyncio.create_task(c.run(http)) for c in clients]
    await asyncio.wait_for(asyncio.gather(*(c.opened.wait() for c in clients)), timeout=60)
    return clients, tasks


# --- writing a pause as the SDK does ------------------------------------------


def paused_template(store: Path) -> tuple[list[str], list[tuple[object, ...]], tuple[object, ...]]:
    """The rows and pending row of one seeded pause, to copy under new ids."""
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        (run,) = conn.execute("SELECT execution_id FROM pending_interrupts LIMIT 1").fetchone()
        cursor = conn.execute(
            "SELECT * FROM checkpoints WHERE execution_id = ? ORDER BY created_at, rowid", (run,)
        )
        columns = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
        pending = conn.execute(
            "SELECT * FROM pending_interrupts WHERE execution_id = ?", (run,)
        ).fetchone()
    finally:
        conn.close()
    return columns, rows, pending


def write_pause(
    store: Path, template: tuple[list[str], list[tuple[object, ...]], tuple[object, ...]]
) -> tuple[str, float]:
    """A new paused run, committed in one transaction; its id and the commit's time."""
    columns, rows, pending = template
    run = f"bench-{uuid.uuid4()}"
    now = datetime.now(UTC).isoformat()
    conn = sqlite3.connect(store, timeout=10)
    try:
        with conn:
            for row in rows:
                values = dict(zip(columns, row, strict=True))
                values["id"] = str(uuid.uuid4())
                if "checkpoint_id" in values:
                    values["checkpoint_id"] = values["id"]
                values["execution_id"] = run
                values["created_at"] = now
                marks = ", ".join("?" for _ in values)
                conn.execute(
                    f"INSERT INTO checkpoints ({', '.join(values)}) VALUES ({marks})",
                    list(values.values()),
                )
            pending_row = list(pending)
            pending_row[0] = run
            marks = ", ".join("?" for _ in pending_row)
            conn.execute(f"INSERT INTO pending_interrupts VALUES ({marks})", pending_row)
        committed = time.monotonic()
    finally:
        conn.close()
    return run, committed


# --- the measurements -----------------------------------------------------------


def cpu_percent(server: Server, seconds: float) -> float:
    before = server.cpu_seconds()
    time.sleep(seconds)
    return 100 * (server.cpu_seconds() - before) / seconds


async def measure(
    store: Path, workdir: Path, count: int, trials: int, idle: float
) -> dict[str, float]:
    results: dict[str, float] = {}
    server = start_server(store, workdir)
    try:
        # Warm the process up (imports, templates, the runs index) before measuring.
        for path in ("/", "/approvals", "/prune"):
            httpx.get(server.url + path, timeout=30)
        results["idle CPU, no client (% of a core)"] = await asyncio.to_thread(
            cpu_percent, server, idle
        )
        rss_before = server.rss_kb()
        clients, tasks = await connect(server, count)
        await asyncio.sleep(1)
        rss_after = server.rss_kb()
        results["memory per client (KB)"] = (rss_after - rss_before) / count
        results["RSS with clients (MB)"] = rss_after / 1024
        results["idle CPU with clients (% of a core)"] = await asyncio.to_thread(
            cpu_percent, server, idle
        )

        template = paused_template(store)
        latencies: dict[str, list[float]] = {path: [] for path in set(client_paths(count))}
        missed = 0
        cpu_before = server.cpu_seconds()
        started = time.monotonic()
        pending = count_pending(store)
        for _ in range(trials):
            run, committed = await asyncio.to_thread(write_pause, store, template)
            pending += 1
            badge = f">{pending}</span>"
            wanted: dict[str, Callable[[str, str], bool]] = {
                "/live/runs": _shows("runs-table", f'id="run-{run}"'),
                "/live/approvals": _shows("queue", f'id="approval-{run}"'),
                "/live/nav": _shows("nav-badge", badge),
            }
            deadline = committed + 10
            for client in clients:
                while (at := client.first_after(committed, wanted[client.path])) is None:
                    if time.monotonic() > deadline:
                        break
                    client.changed.clear()
                    try:
                        await asyncio.wait_for(client.changed.wait(), timeout=0.5)
                    except TimeoutError:
                        pass
                if at is None:
                    missed += 1
                else:
                    latencies[client.path].append(at - committed)
            await asyncio.sleep(0.7)  # land the next write anywhere in the poll cycle
        busy = time.monotonic() - started
        results["CPU while writing a pause every ~1 s (% of a core)"] = (
            100 * (server.cpu_seconds() - cpu_before) / busy
        )
        every = sorted(x for xs in latencies.values() for x in xs)
        results["write to event p50 (s)"] = statistics.median(every)
        results["write to event p95 (s)"] = percentile(every, 0.95)
        results["write to event max (s)"] = every[-1]
        for path, xs in sorted(latencies.items()):
            xs.sort()
            results[f"  {path}: p50 (s)"] = statistics.median(xs)
            results[f"  {path}: p95 (s)"] = percentile(xs, 0.95)
        results["events measured"] = len(every)
        results["events missed"] = missed
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        stop_server(server)

    for sig in (signal.SIGINT, signal.SIGTERM):
        server = start_server(store, workdir)
        try:
            clients, tasks = await connect(server, count)
            asked = time.monotonic()
            server.process.send_signal(sig)
            while server.process.poll() is None:
                await asyncio.sleep(0.01)
            took = time.monotonic() - asked
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=10)
            clean = sum(1 for c in clients if c.ended == "cleanly")
            results[f"shutdown on {sig.name} (s)"] = took
            results[f"streams ended cleanly on {sig.name}"] = clean
            log = server.log.read_text(errors="replace")
            if "timeout graceful shutdown exceeded" in log or "without completing" in log:
                print(f"{sig.name}: the server log says:\n{log}", file=sys.stderr)
        finally:
            stop_server(server)
    return results


def percentile(ordered: list[float], q: float) -> float:
    return ordered[round(q * (len(ordered) - 1))]


def count_pending(store: Path) -> int:
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM pending_interrupts").fetchone()[0])
    finally:
        conn.close()


def seed(workdir: Path) -> Path:
    store = workdir / "seeded.db"
    subprocess.run(
        [str(LOCALUI), "demo", "--seed-only", "--store", str(store)],
        cwd=workdir,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return store


def copy_store(source: Path, target: Path) -> Path:
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--store", type=Path, help="a SQLite store to copy (default: seed one)")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--trials", type=int, default=20, help="paused runs written")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds per CPU sample")
    parser.add_argument("--check", action="store_true", help="exit 1 when a budget is missed")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="localui-live-bench-"))
    try:
        source = args.store or seed(workdir)
        store = copy_store(source, workdir / "local.db")
        results = asyncio.run(measure(store, workdir, args.clients, args.trials, args.idle))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"\nlocalui live streams, {args.clients} clients, one `localui serve` process")
    for name, value in results.items():
        print(f"  {name:55} {value:10.3f}")
    failed = []
    for name, budget in BUDGETS.items():
        measured = [v for k, v in results.items() if k.startswith(name.split(" (")[0])]
        if name.startswith("shutdown"):
            measured = [v for k, v in results.items() if k.startswith("shutdown on")]
        worst = max(measured) if measured else float("inf")
        verdict = "ok" if worst <= budget else "MISSED"
        if verdict != "ok":
            failed.append(name)
        print(f"  budget {name:48} <= {budget:7.2f}: {worst:8.3f} {verdict}")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
