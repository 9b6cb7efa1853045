"""The audit log at a million rows: ``/audit``'s first page, ``localui audit verify``,
and what an audited action adds.

    .venv/bin/python -m bench.audit                         # a million rows, SQLite
    .venv/bin/python -m bench.audit --rows 100000 --requests 20

A store of the SDK's schema (made by its ``SQLiteCheckpointer``) is given ``--rows``
audit rows in bulk, each chained to the one before as the server chains them
(``localui.audit.chained``), then:

- ``/audit`` (HTML, newest first) and ``/audit?person=…`` are timed on a ``localui
  serve`` of that store, one request after another, as the pages are in ``bench``;
- ``localui audit verify`` is timed as a person runs it, to its exit;
- an audited action's extra cost is what the server does once the answer has gone:
  one append to the million-row chain (``AuditLog.append``: the write lock, the last
  hash, the insert), timed ``--appends`` times in a process of its own. The response
  is sent before that append, so the person waits for none of it.

Budgets (issue #42): first page ≤ 15 ms p50; verify ≤ 10 s; the append ≤ 2 ms p50.
Exits 0 when every budget is met, 1 when one is missed.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.latency import time_get, warm_up
from bench.servers import clean_env, pythonpath, start_localui
from localui.audit import GENESIS, AuditEvent, chained, detail_text, instant
from localui.backends.audit import entry_values

PAGE_BUDGET_MS = 15.0
VERIFY_BUDGET_S = 10.0
APPEND_BUDGET_MS = 2.0
#: Rows inserted per transaction while filling.
FILL_BATCH = 50_000
PEOPLE = tuple(f"person-{n}" for n in range(200))
ACTIONS = ("approve", "reject", "resume", "fork", "prune", "signin", "signout", "bulk_resume")


def fill(path: Path, rows: int) -> float:
    """``rows`` chained rows appended to the store's audit log; the seconds it took."""
    from localui.backends.sqlite.audit import SQLiteAuditLog

    SQLiteAuditLog(path, writable=True).close()  # the table and its indexes
    rng = random.Random(rows)
    started = time.perf_counter()
    conn = sqlite3.connect(path)
    try:
        last = conn.execute(
            "SELECT id, hash FROM localui_audit ORDER BY id DESC LIMIT 1"
        ).fetchone()
        next_id, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
        base = time.time() - rows  # a row a second, ending now
        batch: list[tuple[object, ...]] = []
        for n in range(rows):
            action = rng.choice(ACTIONS)
            run = (
                f"run-{rng.randrange(100_000):06d}" if action not in ("signin", "signout") else None
            )
            event = AuditEvent(
                actor=rng.choice(PEOPLE),
                via="user",
                address=f"10.0.{rng.randrange(256)}.{rng.randrange(256)}",
                action=action,
                method="POST",
                path=f"/runs/{run}/{action}" if run else f"/{action}",
                execution_id=run,
                detail=detail_text({}),
                status=200,
                outcome="ok",
            )
            at = instant(datetime.fromtimestamp(base + n, UTC))
            entry = chained(event, next_id, at, prev)
            next_id, prev = next_id + 1, entry.hash
            batch.append(entry_values(entry))
            if len(batch) >= FILL_BATCH:
                _insert(conn, batch)
                batch = []
        _insert(conn, batch)
        conn.execute("ANALYZE")
    finally:
        conn.close()
    return time.perf_counter() - started


def _insert(conn: sqlite3.Connection, batch: list[tuple[object, ...]]) -> None:
    with conn:
        conn.executemany(f"INSERT INTO localui_audit VALUES ({', '.join('?' * 14)})", batch)


def time_verify(path: Path, app_path: Path | None) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "localui", "audit", "verify", "--store", str(path)],
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=pythonpath(app_path)),
        check=False,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"localui audit verify failed: {done.stderr.strip()}")
    return elapsed, done.stdout.strip()


def time_appends(path: Path, count: int) -> list[float]:
    """Milliseconds per append to the chain, one after another."""
    from localui.backends.sqlite.audit import SQLiteAuditLog

    log = SQLiteAuditLog(path, writable=True)
    event = AuditEvent(
        "bench", "owner", "127.0.0.1", "approve", "POST", "/x", "run-1", "{}", 200, "ok"
    )
    samples = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            log.append(event)
            samples.append((time.perf_counter() - started) * 1000)
    finally:
        log.close()
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--localui-path", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="localui-bench-audit-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return _measure(args, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _measure(args: argparse.Namespace, workdir: Path) -> int:
    from fastaiagent.checkpointers import SQLiteCheckpointer

    store = workdir / f"audit-{args.rows}.db"
    store.unlink(missing_ok=True)
    SQLiteCheckpointer(str(store)).setup()
    print(f"filling {args.rows:,} audit rows into {store} …", flush=True)
    print(f"filled in {fill(store, args.rows):.1f} s", flush=True)

    verify_s, said = time_verify(store, args.localui_path)
    print(f"localui audit verify: {verify_s:.2f} s ({said})", flush=True)

    server = start_localui(
        store, cache_dir=workdir / "cache", agents=False, app_path=args.localui_path
    )
    pages: dict[str, float] = {}
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            for name, url in (
                ("/audit", "/audit"),
                ("/audit?person=", f"/audit?person={PEOPLE[7]}"),
            ):
                problem = warm_up(client, url, times=5)
                if problem:
                    raise SystemExit(problem)
                timed = time_get(client, url, requests=args.requests)
                if not timed.ok:
                    raise SystemExit(timed.error)
                pages[name] = timed.p50
                print(f"GET {name}: p50 {timed.p50:.1f} ms, p95 {timed.p95:.1f} ms", flush=True)
    finally:
        server.stop()

    appends = time_appends(store, args.appends)
    append_ms = statistics.median(appends)
    print(f"append to the chain: p50 {append_ms:.2f} ms over {len(appends)}", flush=True)

    verdicts = [
        ("/audit first page p50", max(pages.values()), PAGE_BUDGET_MS, "ms"),
        ("localui audit verify", verify_s, VERIFY_BUDGET_S, "s"),
        ("an audited action's append p50", append_ms, APPEND_BUDGET_MS, "ms"),
    ]
    missed = False
    for what, value, limit, unit in verdicts:
        ok = value <= limit
        missed |= not ok
        print(f"{'ok  ' if ok else 'MISS'} {what}: {value:.2f} {unit} (budget {limit:g} {unit})")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
