"""Throughput under writes: the runs list answering many readers while another process
writes runs to the same SQLite store.

    .venv/bin/python -m bench.writes --store S.db                # a copy of S.db is served
    .venv/bin/python -m bench.writes --store S.db --readers 50 --seconds 10 --rounds 3

One ``localui serve`` process on a copy of the store; ``--readers`` clients each ask
for the runs list's first page as soon as their previous answer came, for
``--seconds``, first with nothing else writing (alone), then while
``bench.writes_writer`` writes ``--rate`` runs a second (one in ten a pause), in
turns, ``--rounds`` times: the machine is shared, so what is judged is the ratio of
two figures taken one right after the other. Afterwards every pause the writer
wrote must be in the approvals queue. The readers run in this process, on one
event loop: their cost is the same in both halves of a round.

Budget: requests/s while writing at least 70 % of alone, in every round; no error;
no pause missing from the queue.

The outbox figure (``--outbox``, on a large store): the runs list's first page,
timed one request after another, alone and while ``bench.outbox_drain`` marks
1,000 rows a second synced through the SDK, as a store connected to the plane
has it. Budget: p50 while draining within the page budget, 15 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from math import nan
from pathlib import Path

import httpx

from bench.budgets import Budget, Verdict
from bench.latency import Timing, failed, time_get, warm_up
from bench.servers import (
    REPO,
    Server,
    clean_env,
    pythonpath,
    start_localui,
    wait_until_indexed,
    wait_until_sqlite_search_indexed,
)

Log = Callable[[str], None]

#: The least share of the readers' throughput alone that they keep while a writer writes.
BUDGET_RATIO = 0.70
#: The runs list's p50 while the outbox drains (the page budget).
OUTBOX_BUDGET_MS = 15.0
#: How far short of the rate asked the outbox drain may fall, in %.
OUTBOX_SHORTFALL_PCT = 5
URL = "/"


@dataclass
class Half:
    """One timed stretch of the readers: requests answered, errors, latencies."""

    requests: int = 0
    errors: list[str] = field(default_factory=list)
    samples_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    #: CPU the server used meanwhile (all its threads), whatever else the machine did.
    server_cpu_s: float = 0.0

    @property
    def cpu_ms_per_request(self) -> float:
        return self.server_cpu_s * 1000 / self.requests if self.requests else 0.0

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def p(self, q: float) -> float:
        if not self.samples_ms:
            return 0.0
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True, slots=True)
class Written:
    """What one stretch of the writer wrote."""

    runs: int
    seconds: float
    #: The execution ids of the pauses it wrote.
    pauses: tuple[str, ...]


@dataclass
class WritesRun:
    readers: int
    rate_asked: float
    rounds: list[tuple[Half, Half]] = field(default_factory=list)
    runs_written: int = 0
    write_seconds: float = 0.0
    pauses_written: int = 0
    pauses_missing: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [w.per_second / a.per_second if a.per_second else 0.0 for a, w in self.rounds]

    @property
    def passed(self) -> bool:
        return (
            bool(self.rounds)
            and min(self.ratios) >= BUDGET_RATIO
            and not self.errors
            and self.pauses_missing == 0
            and all(not a.errors and not w.errors for a, w in self.rounds)
        )

    def as_json(self) -> dict[str, object]:
        return {
            "readers": self.readers,
            "rate_asked": self.rate_asked,
            "runs_written": self.runs_written,
            "write_seconds": self.write_seconds,
            "pauses_written": self.pauses_written,
            "pauses_missing": self.pauses_missing,
            "ratios": self.ratios,
            "rounds": [
                {
                    name: {
                        "requests_per_s": h.per_second,
                        "p50_ms": h.p(0.5),
                        "p99_ms": h.p(0.99),
                        "server_cpu_ms_per_request": h.cpu_ms_per_request,
                        "errors": h.errors[:5],
                    }
                    for name, h in (("alone", a), ("writing", w))
                }
                for a, w in self.rounds
            ],
            "errors": self.errors,
            "passed": self.passed,
        }


def _read_timed(server: Server, readers: int, seconds: float) -> Half:
    cpu = server.cpu_seconds()
    half = asyncio.run(_read(server.base_url, readers, seconds))
    half.server_cpu_s = server.cpu_seconds() - cpu
    return half


async def _read(base_url: str, readers: int, seconds: float) -> Half:
    half = Half()
    limits = httpx.Limits(max_connections=readers, max_keepalive_connections=readers)
    async with httpx.AsyncClient(base_url=base_url, timeout=60.0, limits=limits) as client:
        deadline = time.monotonic() + seconds

        async def reader() -> None:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    response = await client.get(URL)
                except httpx.HTTPError as exc:
                    half.errors.append(f"GET {URL}: {type(exc).__name__}: {exc}")
                    continue
                if response.status_code != 200:
                    half.errors.append(f"GET {URL} answered {response.status_code}")
                    continue
                half.samples_ms.append((time.perf_counter() - started) * 1000)
                half.requests += 1

        began = time.monotonic()
        await asyncio.gather(*(reader() for _ in range(readers)))
        half.seconds = time.monotonic() - began
    return half


def _queued(client: httpx.Client) -> set[str]:
    """Every execution id in the approvals queue, following its pages."""
    found: set[str] = set()
    url: str | None = "/approvals.json"
    while url:
        answer = client.get(url)
        if answer.status_code != 200:
            raise RuntimeError(f"GET {url} answered {answer.status_code}: {answer.text[:300]}")
        page = answer.json()
        found.update(item["execution_id"] for item in page["approvals"])
        following = page.get("next")
        url = f"/approvals.json?after={following}" if following else None
    return found


def _copy(store: Path, into: Path) -> Path:
    """A copy of ``store`` to write to: the bench's stores are reused by later runs."""
    target = into / "store.db"
    src, dst = sqlite3.connect(f"file:{store}?mode=ro", uri=True), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return target


def measure_writes(
    store: Path,
    *,
    readers: int = 50,
    seconds: float = 10.0,
    rounds: int = 2,
    rate: float = 300.0,
    app_path: Path | None = None,
    log: Log,
) -> WritesRun:
    result = WritesRun(readers=readers, rate_asked=rate)
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-writes-"))
    server: Server | None = None
    try:
        copy = _copy(store, workdir)
        server = start_localui(copy, cache_dir=workdir / "cache", app_path=app_path)
        wait_until_indexed(server)
        asyncio.run(_read(server.base_url, readers, min(2.0, seconds)))  # warm
        pauses: list[str] = []
        for n in range(1, rounds + 1):
            alone = _read_timed(server, readers, seconds)
            writing, written = _read_while_writing(server, copy, workdir, n, readers, seconds, rate)
            result.rounds.append((alone, writing))
            result.runs_written += written.runs
            result.write_seconds += written.seconds
            pauses += written.pauses
            log(
                f"  writes round {n}: alone {alone.per_second:.1f} req/s (p50"
                f" {alone.p(0.5):.0f} ms), writing {writing.per_second:.1f} req/s (p50"
                f" {writing.p(0.5):.0f} ms, p99 {writing.p(0.99):.0f} ms), ratio"
                f" {result.ratios[-1]:.2f}; server CPU per request"
                f" {alone.cpu_ms_per_request:.1f} ms alone, {writing.cpu_ms_per_request:.1f} ms"
                f" writing; {written.runs} runs in"
                f" {written.seconds:.1f} s; errors"
                f" {len(alone.errors)}+{len(writing.errors)}"
            )
        result.pauses_written = len(pauses)
        with httpx.Client(base_url=server.base_url, timeout=120.0) as client:
            result.pauses_missing = len(set(pauses) - _queued(client))
        log(
            f"  writes: {result.pauses_written} pauses written,"
            f" {result.pauses_missing} missing from the queue"
        )
    except Exception as exc:
        result.errors.append(f"writes: {type(exc).__name__}: {exc}")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _read_while_writing(
    server: Server,
    store: Path,
    workdir: Path,
    number: int,
    readers: int,
    seconds: float,
    rate: float,
) -> tuple[Half, Written]:
    writer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.writes_writer",
            "--store",
            str(store),
            "--rate",
            str(rate),
            # Writing from before the readers start until after they stop.
            "--seconds",
            str(seconds + 2.0),
            "--pauses",
            str(workdir / f"pauses-{number}.txt"),
        ],
        cwd=REPO,
        env=clean_env(PYTHONPATH=pythonpath(None)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        if writer.stdout.readline().strip() != "writing":
            raise RuntimeError("the writer did not start")
        time.sleep(1.0)
        half = _read_timed(server, readers, seconds)
        out, _ = writer.communicate(timeout=seconds + 120)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    if writer.returncode != 0:
        raise RuntimeError(f"the writer exited with {writer.returncode}")
    summary = json.loads(out.strip().splitlines()[-1])
    pauses = tuple(Path(summary["pauses"]).read_text().split())
    return half, Written(int(summary["written"]), float(summary["seconds"]), pauses)


@dataclass
class OutboxRun:
    rate_asked: float
    alone: Timing | None = None
    draining: Timing | None = None
    rows_marked: int = 0
    drain_seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def shortfall_pct(self) -> float:
        """How far the drain's rate fell short of the rate asked, in % (0: reached it)."""
        if self.drain_seconds <= 0:
            return 100.0
        return max(0.0, 1 - self.rows_marked / (self.rate_asked * self.drain_seconds)) * 100

    @property
    def passed(self) -> bool:
        return (
            not self.errors
            and self.draining is not None
            and self.draining.ok
            and self.draining.p50 <= OUTBOX_BUDGET_MS
            and self.shortfall_pct <= OUTBOX_SHORTFALL_PCT
        )

    def as_json(self) -> dict[str, object]:
        return {
            "rate_asked": self.rate_asked,
            "alone": self.alone.as_json() if self.alone else None,
            "draining": self.draining.as_json() if self.draining else None,
            "rows_marked": self.rows_marked,
            "drain_seconds": self.drain_seconds,
            "shortfall_pct": self.shortfall_pct,
            "errors": self.errors,
            "passed": self.passed,
        }


def measure_outbox(
    store: Path,
    *,
    requests: int = 200,
    rate: float = 1000.0,
    app_path: Path | None = None,
    log: Log,
) -> OutboxRun:
    result = OutboxRun(rate_asked=rate)
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-outbox-"))
    server: Server | None = None
    drain: subprocess.Popen[str] | None = None
    try:
        copy = _copy(store, workdir)
        server = start_localui(copy, cache_dir=workdir / "cache", app_path=app_path)
        wait_until_indexed(server)
        # A store the plane drains day after day, as a later start has it: its trigram
        # index filled (a first build fills it after the runs list is complete).
        wait_until_sqlite_search_indexed(server, copy, workdir / "cache")
        with httpx.Client(base_url=server.base_url, timeout=120.0) as client:
            error = warm_up(client, URL, times=10)
            result.alone = failed(error) if error else time_get(client, URL, requests=requests)
            # Long enough for every timed request, with room to spare.
            seconds = 10.0 + requests * 0.2
            drain = subprocess.Popen(
                [sys.executable, "-m", "bench.outbox_drain", "--store", str(copy)]
                + ["--rate", str(rate), "--seconds", str(seconds)],
                cwd=REPO,
                env=clean_env(PYTHONPATH=pythonpath(None)),
                stdout=subprocess.PIPE,
                text=True,
            )
            assert drain.stdout is not None
            if drain.stdout.readline().strip() != "draining":
                raise RuntimeError("the outbox drain did not start")
            time.sleep(2.0)
            result.draining = time_get(client, URL, requests=requests)
            if drain.poll() is not None:
                result.errors.append("outbox: the drain had stopped before the timing ended")
        out, _ = drain.communicate(timeout=seconds + 120)
        summary = json.loads(out.strip().splitlines()[-1])
        result.rows_marked = int(summary["marked"])
        result.drain_seconds = float(summary["seconds"])
        alone, draining = result.alone, result.draining
        log(
            f"  outbox: runs list alone p50 {alone.p50:.1f} ms, while {rate:.0f} rows/s are"
            f" marked synced p50 {draining.p50:.1f} ms (p95 {draining.p95:.1f} ms);"
            f" {result.rows_marked} rows marked in {result.drain_seconds:.1f} s"
        )
    except Exception as exc:
        result.errors.append(f"outbox: {type(exc).__name__}: {exc}")
    finally:
        if drain is not None and drain.poll() is None:
            drain.kill()
            drain.wait()
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return result


#: The budgets of these figures, judged as ``bench.budgets`` judges the others (a
#: figure at most its limit): the share of throughput lost while writing, the errors
#: and missing pauses, and the runs list's p50 while the outbox drains.
WRITES_BUDGETS = (
    Budget(
        "writes_throughput_loss",
        "Runs list, 50 readers: throughput lost while another process writes 300 runs/s",
        round((1 - BUDGET_RATIO) * 100),
        "%",
        ("writes_loss_pct",),
    ),
    Budget(
        "writes_failures",
        "Runs list under writes: errors, and pauses written missing from the queue",
        0,
        "",
        ("writes_failures",),
    ),
    Budget(
        "outbox_runs_list",
        "Runs list p50 while the outbox marks 1,000 rows/s synced",
        OUTBOX_BUDGET_MS,
        "ms",
        ("outbox_runs_list_ms",),
    ),
    # The row above holds only if the drain reached the rate: a slower one tests less.
    Budget(
        "outbox_drain_rate",
        "The outbox drain: rows marked short of the 1,000 a second asked",
        OUTBOX_SHORTFALL_PCT,
        "%",
        ("outbox_shortfall_pct",),
    ),
)


def verdicts(label: str, writes: WritesRun | None, outbox: OutboxRun | None) -> list[Verdict]:
    """The verdicts of what was measured on the store named ``label``."""
    figures: dict[str, float] = {}
    if writes is not None:
        lost = 1 - min(writes.ratios) if writes.ratios else 1.0
        figures["writes_loss_pct"] = lost * 100
        failures = len(writes.errors) + writes.pauses_missing
        failures += sum(len(a.errors) + len(w.errors) for a, w in writes.rounds)
        figures["writes_failures"] = failures
    if outbox is not None:
        ok = outbox.draining is not None and outbox.draining.ok and not outbox.errors
        figures["outbox_runs_list_ms"] = outbox.draining.p50 if ok and outbox.draining else nan
        figures["outbox_shortfall_pct"] = outbox.shortfall_pct if ok else nan
    found = []
    for budget in WRITES_BUDGETS:
        [metric] = budget.metrics
        if metric not in figures:
            continue
        where = f"{label} / {metric}"
        found.append(
            Verdict(
                budget=budget,
                worst=figures[metric],
                where=where,
                figures={where: figures[metric]},
                missing=(),
            )
        )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.writes")
    parser.add_argument("--store", type=Path, required=True, help="a store to serve a copy of")
    parser.add_argument("--readers", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=300.0, help="runs written per second")
    parser.add_argument("--json", type=Path, default=None, help="where the figures go")
    parser.add_argument(
        "--localui-path",
        type=Path,
        default=None,
        help="a directory holding another localui package to measure (see python -m bench)",
    )
    parser.add_argument(
        "--requests", type=int, default=200, help="with --outbox: timed requests each way"
    )
    parser.add_argument(
        "--outbox",
        action="store_true",
        help="measure the runs list while the outbox drains instead (on a large store)",
    )
    args = parser.parse_args()
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    if args.outbox:
        outbox = measure_outbox(
            args.store, requests=args.requests, app_path=args.localui_path, log=log
        )
        if args.json is not None:
            args.json.write_text(json.dumps(outbox.as_json(), indent=1))
        for error in outbox.errors:
            log(f"ERROR {error}")
        log(f"{'PASS' if outbox.passed else 'MISS'} runs list while the outbox drains")
        return 2 if outbox.errors else 0 if outbox.passed else 1
    result = measure_writes(
        args.store,
        readers=args.readers,
        seconds=args.seconds,
        rounds=args.rounds,
        rate=args.rate,
        app_path=args.localui_path,
        log=log,
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result.as_json(), indent=1))
    for error in result.errors:
        log(f"ERROR {error}")
    ratios = ", ".join(f"{r:.2f}" for r in result.ratios)
    median = statistics.median(result.ratios) if result.ratios else 0.0
    log(
        f"{'PASS' if result.passed else 'MISS'} runs list, {args.readers} readers, writing"
        f" {args.rate:.0f} runs/s: {ratios} of alone (median {median:.2f},"
        f" budget {BUDGET_RATIO:.2f})"
    )
    if result.errors:
        return 2
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
