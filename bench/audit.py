"""The audit log at a million rows: ``/audit``'s first page, ``localui audit verify``,
and what an audited action adds.

    .venv/bin/python -m bench.audit                         # a million rows, SQLite
    .venv/bin/python -m bench.audit --backend postgres      # on LOCALUI_TEST_PG_DSN
    .venv/bin/python -m bench.audit --rows 100000 --requests 20

``python -m bench`` runs it too (``--audit-rows``, a million unless told), and judges
its figures with the other budgets.

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
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.latency import time_get, warm_up
from bench.servers import REPO, PgTarget, clean_env, pythonpath, start_localui
from localui.audit import GENESIS, AuditEvent, chained, detail_text, instant
from localui.backends.audit import entry_values
from localui.backends.base import AuditLog

PAGE_BUDGET_MS = 15.0
VERIFY_BUDGET_S = 10.0
APPEND_BUDGET_MS = 2.0
#: Rows inserted per transaction while filling.
FILL_BATCH = 50_000
PEOPLE = tuple(f"person-{n}" for n in range(200))
ACTIONS = ("approve", "reject", "resume", "fork", "prune", "signin", "signout", "bulk_resume")


def _entries(rows: int, first_id: int, prev: str) -> Iterator[tuple[object, ...]]:
    """``rows`` chained rows' values after row ``first_id - 1`` (hash ``prev``), a row a
    second ending now, as the server would have appended them."""
    rng = random.Random(rows)
    base = time.time() - rows
    next_id = first_id
    for n in range(rows):
        action = rng.choice(ACTIONS)
        run = f"run-{rng.randrange(100_000):06d}" if action not in ("signin", "signout") else None
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
        yield entry_values(entry)


def fill(path: Path, rows: int) -> float:
    """``rows`` chained rows appended to the SQLite store's audit log; the seconds it took."""
    from localui.backends.sqlite.audit import SQLiteAuditLog

    SQLiteAuditLog(path, writable=True).close()  # the table and its indexes
    started = time.perf_counter()
    conn = sqlite3.connect(path)
    try:
        last = conn.execute(
            "SELECT id, hash FROM localui_audit ORDER BY id DESC LIMIT 1"
        ).fetchone()
        first_id, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
        batch: list[tuple[object, ...]] = []
        for values in _entries(rows, first_id, prev):
            batch.append(values)
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


def fill_postgres(dsn: str, app_schema: str, rows: int) -> float:
    """``rows`` chained rows copied into ``app_schema``'s audit log; the seconds it took."""
    import psycopg
    from psycopg import sql

    from localui.backends.audit import COLUMN_NAMES, TABLE
    from localui.backends.postgres.audit import PostgresAuditLog

    PostgresAuditLog(dsn, schema=app_schema, writable=True).close()
    table = sql.Identifier(app_schema, TABLE)
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in COLUMN_NAMES)
    started = time.perf_counter()
    with psycopg.connect(dsn) as conn:
        with conn.cursor() as cur:
            last = cur.execute(
                sql.SQL("SELECT id, hash FROM {} ORDER BY id DESC LIMIT 1").format(table)
            ).fetchone()
            first_id, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
            copy = sql.SQL("COPY {} ({}) FROM STDIN").format(table, columns)
            with cur.copy(copy) as out:
                for values in _entries(rows, first_id, prev):
                    out.write_row(values)
        conn.commit()
        conn.execute(sql.SQL("ANALYZE {}").format(table))
    return time.perf_counter() - started


def time_verify(store_args: list[str], app_path: Path | None) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "localui", "audit", "verify", *store_args],
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=pythonpath(app_path)),
        check=False,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"localui audit verify failed: {done.stderr.strip()}")
    return elapsed, done.stdout.strip()


def time_appends(log: AuditLog, count: int) -> list[float]:
    """Milliseconds per append to the chain, one after another (``log`` is closed)."""
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
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--localui-path", type=Path, default=None)
    parser.add_argument("--figures", type=Path, default=None, help="also write them here (JSON)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="localui-bench-audit-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        if args.backend == "sqlite":
            return _measure(args, workdir, None)
        from bench import pg

        with pg.server(lambda line: print(line, flush=True)) as dsn:
            return _measure(args, workdir, dsn)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _measure(args: argparse.Namespace, workdir: Path, dsn: str | None) -> int:
    from fastaiagent.checkpointers import SQLiteCheckpointer

    store = workdir / f"audit-{args.rows}.db"
    store.unlink(missing_ok=True)
    SQLiteCheckpointer(str(store)).setup()
    target: PgTarget | None = None
    print(f"filling {args.rows:,} audit rows ({args.backend}) …", flush=True)
    if dsn is None:
        filled = fill(store, args.rows)
        store_args = ["--store", str(store)]
    else:
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        from bench.pg import drop_schema

        suffix = os.getpid()
        target = PgTarget(dsn, f"bench_audit_{suffix}", f"bench_audit_{suffix}_localui")
        sdk = PostgresCheckpointer(dsn, schema=target.schema)
        sdk.setup()
        sdk.close()
        filled = fill_postgres(dsn, target.app_schema, args.rows)
        store_args = ["--store", dsn, "--pg-app-schema", target.app_schema]
    print(f"filled in {filled:.1f} s", flush=True)
    try:
        return _timed(args, workdir, store, store_args, target)
    finally:
        if target is not None:
            drop_schema(target.dsn, target.schema)
            drop_schema(target.dsn, target.app_schema)


def _timed(
    args: argparse.Namespace,
    workdir: Path,
    store: Path,
    store_args: list[str],
    target: PgTarget | None,
) -> int:
    verify_s, said = time_verify(store_args, args.localui_path)
    print(f"localui audit verify: {verify_s:.2f} s ({said})", flush=True)

    server = start_localui(
        store, cache_dir=workdir / "cache", agents=False, app_path=args.localui_path, pg=target
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

    if target is None:
        from localui.backends.sqlite.audit import SQLiteAuditLog

        log: AuditLog = SQLiteAuditLog(store, writable=True)
    else:
        from localui.backends.postgres.audit import PostgresAuditLog

        log = PostgresAuditLog(target.dsn, schema=target.app_schema, writable=True)
    appends = time_appends(log, args.appends)
    append_ms = statistics.median(appends)
    print(f"append to the chain: p50 {append_ms:.2f} ms over {len(appends)}", flush=True)

    figures = {
        "audit_page_ms": max(pages.values()),
        "audit_verify_s": verify_s,
        "audit_append_ms": append_ms,
    }
    if args.figures is not None:
        args.figures.write_text(json.dumps({"figures": figures, "errors": []}))
    verdicts = [
        ("/audit first page p50", figures["audit_page_ms"], PAGE_BUDGET_MS, "ms"),
        ("localui audit verify", verify_s, VERIFY_BUDGET_S, "s"),
        ("an audited action's append p50", append_ms, APPEND_BUDGET_MS, "ms"),
    ]
    missed = False
    for what, value, limit, unit in verdicts:
        ok = value <= limit
        missed |= not ok
        print(f"{'ok  ' if ok else 'MISS'} {what}: {value:.2f} {unit} (budget {limit:g} {unit})")
    return 1 if missed else 0


def run_audit_bench(
    *, backend: str, dsn: str | None, rows: int, app_path: Path | None
) -> tuple[dict[str, float], list[str]]:
    """This module in a child process (its SDK configuration is its own); its figures
    and errors."""
    out = Path(tempfile.mkdtemp(prefix="localui-bench-audit-")) / "figures.json"
    env = clean_env()
    if dsn is not None:
        env["LOCALUI_TEST_PG_DSN"] = dsn
    command = [sys.executable, "-m", "bench.audit", "--backend", backend, "--rows", str(rows)]
    command += ["--figures", str(out)]
    if app_path is not None:
        command += ["--localui-path", str(app_path)]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if not out.is_file():
        return {}, [f"audit: the benchmark exited {done.returncode}: {done.stderr[-2000:]}"]
    written = json.loads(out.read_text())
    return {k: float(v) for k, v in written["figures"].items()}, list(written["errors"])


if __name__ == "__main__":
    raise SystemExit(main())
