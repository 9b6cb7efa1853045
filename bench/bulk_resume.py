"""Bulk resume after an outage: 1,000 crashed runs resumed from ``/attention``, each once.

    .venv/bin/python -m bench --only bulk-resume                      # SQLite
    .venv/bin/python -m bench --only bulk-resume --backend postgres
    .venv/bin/python -m bench.bulk_resume --runs 1000 [--backend postgres]

The crashes are real: a few child processes run the demo's refund-bot on the SDK's
offline model ("Refund order Z-100000 for 40.00 and notify the customer") and die
with ``os._exit``, half as ``refund`` starts (before its effect) and half while the
model is asked for the turn after both tools ran (after them). The rest of the runs
are copies of their rows under new execution ids, checkpoint ids, order ids and
times (minutes earlier, as an outage's would be), with the ``@idempotent`` cache rows
the crash left, keyed again for the copy's arguments as the SDK keys them. On
PostgreSQL the same store is copied into a schema of its own (``bench.pg``).

A real ``localui serve --no-auth --agents bench/bulk_resume.py:refund_bot`` serves it
(``--stale-after 2``: the real crashes are seconds old, an outage's would be minutes);
the picks come from ``/attention.json``, page after page, as the page shows them, and
all of them are posted to ``POST /runs/bulk-resume`` (``confirm=yes``: the page asks
for it, since the real crashes' newest rows are recent), in batches of at most the
view's limit per request. The wall time is from the first post to the last answer.

Then, read from the store and the agent's ledger of real effects (not from the
answer): every run has exactly one ``run_end`` row, ``completed``; each order was
charged back once and its customer notified once (a tool run twice shows here); each
run has one resume recorded. The same picks posted again must resume nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench import pg
from bench.budgets import BULK_RESUME_BUDGETS, Verdict, judge
from bench.servers import (
    REPO,
    PgTarget,
    Server,
    _start,
    clean_env,
    free_port,
    pythonpath,
    wait_until_indexed,
)

Log = Callable[[str], None]

#: Crashed runs resumed in one go: an outage's worth.
RUNS = 1000
#: Real crashes of each kind; every other run is a copy of one of them.
REAL_PER_KIND = 2
#: How each real crash dies: the demo agent's switches, and the exit code it dies with.
KINDS = {"in-tool": ("die_in_tool", 17), "waiting-on-model": ("die_waiting_on_model", 18)}
#: Under the approval limit: the refund goes through without a pause.
AMOUNT = "40.00"
#: The copies' rows are this much older than their template's, one more second per copy.
OUTAGE_AGO = timedelta(minutes=5)
STALE_AFTER_S = "2"
AGENTS = f"{REPO / 'bench' / 'bulk_resume.py'}:refund_bot"
#: How long the served app may take to list every crashed run as stalled.
LISTED_TIMEOUT_S = 120.0
#: The qualified name ``@idempotent`` keys ``charge_back``'s cache rows by.
CHARGE_BACK = "build_agent.<locals>.charge_back"
_TEXT_COLUMNS = ("state_snapshot", "node_input", "node_output", "interrupt_context")


def refund_bot() -> Any:
    """The demo's refund-bot, as ``localui serve --agents`` loads it here: writing where
    localui reads, and recording every real effect to ``BULK_LEDGER``."""
    from fastaiagent.checkpointers import SQLiteCheckpointer

    from localui.demo.agent import build_agent

    ledger = Path(os.environ["BULK_LEDGER"])
    dsn = os.environ.get("BULK_PG_DSN")
    if dsn:
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        schema = os.environ["BULK_PG_SCHEMA"]
        return build_agent(PostgresCheckpointer(dsn, schema=schema, max_pool_size=2), ledger=ledger)
    # ``localui serve`` sets this to the served store before it imports agents.
    return build_agent(SQLiteCheckpointer(os.environ["FASTAIAGENT_LOCAL_DB"]), ledger=ledger)


def _crash_child(kind: str, store: Path, ledger: Path, order: str, execution_id: str) -> int:
    """In a child process: start a run that dies the way ``kind`` says (never returns
    when it does)."""
    import asyncio

    from fastaiagent.checkpointers import SQLiteCheckpointer

    from localui.demo.agent import build_agent

    switch, _code = KINDS[kind]
    agent = build_agent(
        SQLiteCheckpointer(str(store)),
        ledger=ledger,
        die_in_tool=switch == "die_in_tool",
        die_waiting_on_model=switch == "die_waiting_on_model",
    )
    prompt = f"Refund order {order} for {AMOUNT} and notify the customer"
    asyncio.run(agent.arun(prompt, execution_id=execution_id))
    return 1  # it should have died


@dataclass
class BulkRun:
    backend: str
    runs: int = 0
    real_crashes: int = 0
    copies: int = 0
    #: Posts it took (at most the view's limit of picks each), and that limit.
    posts: int = 0
    picks_per_post: int = 0
    #: Seconds from the first post to the last answer, and the server's CPU over them.
    wall_s: float = float("nan")
    server_cpu_s: float = float("nan")
    #: Seconds to read the picks from ``/attention.json``, and how many pages.
    picks_s: float = float("nan")
    attention_pages: int = 0
    #: How the answers said each pick ended.
    answered: dict[str, int] = field(default_factory=dict)
    #: Read from the store and the ledger: runs that ended as one resume would (one
    #: ``run_end``, completed; each effect once; one resume recorded).
    resumed_once: int = 0
    #: Runs with two run ends, an effect made twice, or two resumes recorded.
    twice: int = 0
    #: Runs the same picks posted again resumed.
    resumed_again: int = 0
    load: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _charge_back_key(order: str) -> str:
    from fastaiagent.chain.idempotent import _build_default_key

    return _build_default_key(CHARGE_BACK, (order, float(AMOUNT)), {})


def make_crashes(store: Path, ledger: Path, workdir: Path, log: Log) -> list[tuple[str, str]]:
    """The real crashes, each in a child process of its own: ``(execution id, order)``."""
    made: list[tuple[str, str]] = []
    cwd = workdir / "children"  # the SDK writes .fastaiagent/ into its working directory
    cwd.mkdir(exist_ok=True)
    env = clean_env(FASTAIAGENT_TRACE_ENABLED="false", PYTHONPATH=str(REPO))
    for kind, (_switch, code) in KINDS.items():
        for _ in range(REAL_PER_KIND):
            order = f"Z-{100000 + len(made)}"
            execution_id = f"outage-{kind}-{uuid.uuid4().hex[:8]}"
            command = [sys.executable, "-m", "bench.bulk_resume", "--crash", kind]
            command += ["--store", str(store), "--ledger", str(ledger)]
            command += ["--order", order, "--execution-id", execution_id]
            done = subprocess.run(
                command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
            )
            if done.returncode != code:
                raise RuntimeError(
                    f"the {kind} crash exited {done.returncode}, not {code}: {done.stderr[-2000:]}"
                )
            made.append((execution_id, order))
    log(f"bulk resume: {len(made)} real crashes ({', '.join(KINDS)}) in child processes")
    return made


def copy_crashes(
    store: Path, real: list[tuple[str, str]], copies: int
) -> list[tuple[str, str, str]]:
    """``copies`` runs copied from the real crashes' rows, round robin: each one's
    execution id, order, and the order of the crash it copies."""
    conn = sqlite3.connect(store)
    try:
        templates = []
        for execution_id, order in real:
            rows = _rows(
                conn,
                "SELECT * FROM checkpoints WHERE execution_id = ? ORDER BY rowid",
                (execution_id,),
            )
            cache = _rows(
                conn, "SELECT * FROM idempotency_cache WHERE execution_id = ?", (execution_id,)
            )
            for entry in cache:
                if entry["function_key"] != _charge_back_key(order):
                    raise RuntimeError("the SDK keyed charge_back's cache row otherwise")
            templates.append((execution_id, order, rows, cache))
        checkpoint_columns = list(templates[0][2][0])
        made: list[tuple[str, str, str]] = []
        new_rows: list[tuple[Any, ...]] = []
        new_cache: list[tuple[Any, ...]] = []
        cache_columns: list[str] = []
        for n in range(copies):
            old_id, old_order, rows, cache = templates[n % len(templates)]
            # Same width as the real orders', so no order id is a prefix of another.
            order = f"Z-{200000 + n}"
            execution_id = f"outage-copy-{n:06d}-{uuid.uuid4().hex[:8]}"
            shift = OUTAGE_AGO + timedelta(seconds=n)
            ids: dict[str, str] = {}
            for row in rows:
                new = dict(row)
                checkpoint_id = str(uuid.uuid4())
                ids[row["checkpoint_id"]] = checkpoint_id
                if "id" in new:
                    new["id"] = checkpoint_id
                new["checkpoint_id"] = checkpoint_id
                new["execution_id"] = execution_id
                if row["parent_checkpoint_id"]:
                    new["parent_checkpoint_id"] = ids.get(
                        row["parent_checkpoint_id"], row["parent_checkpoint_id"]
                    )
                new["created_at"] = _earlier(row["created_at"], shift)
                for column in _TEXT_COLUMNS:
                    if new.get(column):
                        text = new[column].replace(old_order, order).replace(old_id, execution_id)
                        for old, fresh in ids.items():
                            text = text.replace(old, fresh)
                        new[column] = text
                new_rows.append(tuple(new[c] for c in checkpoint_columns))
            for entry in cache:
                cached = dict(entry)
                cached["execution_id"] = execution_id
                cached["function_key"] = _charge_back_key(order)
                cached["result"] = cached["result"].replace(old_order, order)
                cached["created_at"] = _earlier(entry["created_at"], shift)
                cache_columns = list(cached)
                new_cache.append(tuple(cached.values()))
            made.append((execution_id, order, old_order))
        with conn:
            marks = ", ".join("?" * len(checkpoint_columns))
            conn.executemany(
                f"INSERT INTO checkpoints ({', '.join(checkpoint_columns)}) VALUES ({marks})",
                new_rows,
            )
            if new_cache:
                marks = ", ".join("?" * len(cache_columns))
                conn.executemany(
                    f"INSERT INTO idempotency_cache ({', '.join(cache_columns)}) VALUES ({marks})",
                    new_cache,
                )
    finally:
        conn.close()
    return made


def _earlier(created_at: str, by: timedelta) -> str:
    at = datetime.fromisoformat(created_at) - by
    text = at.isoformat(timespec="microseconds")
    # As the SDK writes them: "+00:00" where it wrote one, nothing where it did not.
    return text if "+" in created_at[10:] or created_at.endswith("Z") else text[:26]


def _serve(
    store: Path, target: PgTarget | None, ledger: Path, cache: Path, app_path: Path | None
) -> Server:
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-bulk-serve-"))
    where = [str(store)]
    extra = {"BULK_LEDGER": str(ledger)}
    if target is not None:
        where = [target.dsn, "--pg-schema", target.schema, "--pg-app-schema", target.app_schema]
        extra |= {"BULK_PG_DSN": target.dsn, "BULK_PG_SCHEMA": target.schema}
    command = [sys.executable, "-m", "localui", "serve", "--store", *where, "--port", str(port)]
    # Loopback with no sign-in: every page and action is open, as the other rows serve.
    command += ["--no-auth", "--agents", AGENTS, "--stale-after", STALE_AFTER_S]
    env = clean_env(
        XDG_CACHE_HOME=str(cache),
        PYTHONPATH=pythonpath(app_path),
        FASTAIAGENT_TRACE_ENABLED="false",
        **extra,
    )
    return _start("localui", command, port=port, env=env, workdir=workdir)


def read_picks(server: Server, expected: int, run: BulkRun) -> list[str]:
    """Every pick ``/attention.json`` offers, following ``next``, once it lists
    ``expected`` stalled runs."""
    import httpx

    with httpx.Client(base_url=server.base_url, timeout=120.0) as client:
        deadline = time.monotonic() + LISTED_TIMEOUT_S
        while client.get("/attention.json").json()["counts"]["stalled"] < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"/attention did not list {expected} stalled runs in time")
            time.sleep(0.5)
        started = time.perf_counter()
        picks: list[str] = []
        after: str | None = None
        while True:
            page = client.get("/attention.json", params={"after": after} if after else {}).json()
            run.attention_pages += 1
            for row in page["runs"]:
                if row["checkpoint_id"] and not row["resume_problem"]:
                    picks.append(json.dumps([row["execution_id"], row["checkpoint_id"]]))
                else:
                    run.errors.append(
                        f"{row['execution_id']}: not offered for a resume ({row['resume_problem']})"
                    )
            after = page["next"]
            if after is None:
                break
        run.picks_s = time.perf_counter() - started
    return picks


def post_picks(server: Server, picks: list[str], limit: int) -> tuple[Counter[str], int]:
    """Every pick posted, at most ``limit`` a request, as the page's form posts them;
    the results the answers gave, and the posts made."""
    import httpx

    results: Counter[str] = Counter()
    posts = 0
    with httpx.Client(base_url=server.base_url, timeout=600.0) as client:
        for start in range(0, len(picks), limit):
            form = {"pick": picks[start : start + limit], "confirm": "yes"}
            answer = client.post(
                "/runs/bulk-resume", data=form, headers={"Accept": "application/json"}
            )
            posts += 1
            if answer.status_code != 200:
                raise RuntimeError(
                    f"bulk resume answered {answer.status_code}: {answer.text[:500]}"
                )
            results.update(item["result"] for item in answer.json()["items"])
    return results, posts


def _effects(ledger: Path) -> Counter[tuple[str, str]]:
    """Real effects by ``(effect, order)``, as the ledger has them now."""
    lines = [json.loads(x) for x in ledger.read_text().splitlines()] if ledger.exists() else []
    return Counter((x["effect"], x["order_id"]) for x in lines)


def judge_store(
    runs: list[tuple[str, str, str]],
    before: Counter[tuple[str, str]],
    ledger: Path,
    store: Path,
    target: PgTarget | None,
    run: BulkRun,
) -> None:
    """How each run ended, read from the SDK's rows, the decision record and the ledger.

    ``runs``: each run's execution id, order, and the order whose crash made its rows
    (its own, or the one it copies: a copy's effects before the crash are its
    template's). ``before``: the ledger before the bulk resume. A refund is made once
    in all (before the crash, or by the resume); nothing is made twice. The customer is
    notified at most once: after a crash inside ``refund`` the SDK's resume runs
    ``refund`` again and not the call after it, as a single resume does.
    """
    from localui.records import RESUME

    after = _effects(ledger)
    if target is not None:
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        from localui.backends.postgres.decisions import PostgresDecisionLog

        sdk: Any = PostgresCheckpointer(target.dsn, schema=target.schema, max_pool_size=1)
        decisions: Any = PostgresDecisionLog(target.dsn, schema=target.app_schema, writable=False)
    else:
        from fastaiagent.checkpointers import SQLiteCheckpointer

        from localui.backends.sqlite.decisions import SQLiteDecisionLog

        sdk = SQLiteCheckpointer(str(store))
        decisions = SQLiteDecisionLog(str(store), writable=False)
    try:
        for execution_id, order, crashed_as in runs:

            def made(effect: str, order: str = order, crashed_as: str = crashed_as) -> int:
                return (
                    before[(effect, crashed_as)] + after[(effect, order)] - before[(effect, order)]
                )

            ends = [c.status for c in sdk.list(execution_id, limit=500) if c.step_type == "run_end"]
            resumes = [d for d in decisions.list_for_run(execution_id) if d.kind == RESUME]
            charged, notified = made("charge_back"), made("notify_customer")
            if len(ends) > 1 or charged > 1 or notified > 1 or len(resumes) > 1:
                run.twice += 1
            elif ends == ["completed"] and charged == 1 and len(resumes) == 1:
                run.resumed_once += 1
            else:
                run.errors.append(
                    f"{execution_id}: ends {ends}, charged back {charged}, notified {notified},"
                    f" {len(resumes)} resumes recorded"
                )
    finally:
        sdk.close()
        decisions.close()


def measure_bulk_resume(
    run: BulkRun, *, target: PgTarget | None, app_path: Path | None, log: Log
) -> None:
    """Crash, copy, serve, pick, post and judge, into ``run`` as it goes (a failure
    part-way leaves what was measured)."""
    from localui.views.bulk_resume import BULK_RESUME_LIMIT

    runs = run.runs
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-bulk-"))
    store, ledger, cache = workdir / "local.db", workdir / "ledger.jsonl", workdir / "cache"
    real = make_crashes(store, ledger, workdir, log)
    run.real_crashes = len(real)
    run.copies = max(0, runs - len(real))
    runs_made = [(eid, order, order) for eid, order in real]
    runs_made += copy_crashes(store, real, run.copies)
    run_ids = [eid for eid, _, _ in runs_made]
    log(f"bulk resume: {run.copies} copies of their rows, {len(run_ids)} crashed runs")
    if target is not None:
        seconds = pg.copy_store(store, target.dsn, target.schema)
        log(f"bulk resume: the store copied to PostgreSQL {target.schema} in {seconds:.1f} s")
    server = _serve(store, target, ledger, cache, app_path)
    try:
        wait_until_indexed(server)
        picks = read_picks(server, len(run_ids), run)
        log(
            f"bulk resume: {len(picks)} picks from {run.attention_pages} pages of /attention.json"
            f" in {run.picks_s:.1f} s"
        )
        run.picks_per_post = BULK_RESUME_LIMIT
        run.load.append(os.getloadavg()[0])
        before = _effects(ledger)
        cpu = server.cpu_seconds()
        started = time.perf_counter()
        answered, run.posts = post_picks(server, picks, BULK_RESUME_LIMIT)
        run.wall_s = time.perf_counter() - started
        run.server_cpu_s = server.cpu_seconds() - cpu
        run.load.append(os.getloadavg()[0])
        run.answered = dict(answered)
        log(
            f"bulk resume: {len(picks)} runs posted in {run.posts} request(s), answered in"
            f" {run.wall_s:.1f} s (server CPU {run.server_cpu_s:.1f} s): {dict(answered)}"
        )
        # The same picks again, as a second click or another tab would post them.
        again, _ = post_picks(server, picks, BULK_RESUME_LIMIT)
        run.resumed_again = again["resumed"]
        log(f"bulk resume: the same picks again: {dict(again)}")
    finally:
        server.stop()
    judge_store(runs_made, before, ledger, store, target, run)
    log(f"bulk resume: {run.resumed_once} resumed once, {run.twice} run twice (from the store)")


def figures(run: BulkRun) -> dict[str, float]:
    return {
        "bulk_resume_s": run.wall_s,
        "bulk_resume_not_once": float(run.runs - run.resumed_once),
        "bulk_resume_twice": float(run.twice),
        "bulk_resume_again": float(run.resumed_again),
    }


def report_lines(run: BulkRun, verdicts: Sequence[Verdict]) -> list[str]:
    load = "/".join(f"{x:.1f}" for x in run.load) or "?"
    lines = [
        f"# Bulk resume after an outage ({run.backend})",
        "",
        f"{run.runs:,} crashed runs ({run.real_crashes} real crashes of killed child"
        f" processes, {run.copies:,} copies of their rows), picked from"
        f" {run.attention_pages} pages of `/attention.json` in {run.picks_s:.1f} s, posted to"
        f" `POST /runs/bulk-resume` in {run.posts} request(s) of at most"
        f" {run.picks_per_post:,} picks, load average {load}.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| wall time, first post to last answer | {run.wall_s:.1f} s |",
        f"| server CPU over it | {run.server_cpu_s:.1f} s"
        f" ({run.server_cpu_s * 1000 / max(run.runs, 1):.0f} ms a run) |",
        f"| answered | {', '.join(f'{k} {v}' for k, v in sorted(run.answered.items()))} |",
        f"| resumed once (from the store and the ledger) | {run.resumed_once:,} |",
        f"| run twice | {run.twice} |",
        f"| resumed again by the same picks posted again | {run.resumed_again} |",
        "",
        "| budget | limit | measured | verdict |",
        "|---|---|---|---|",
    ]
    for v in verdicts:
        verdict = "pass" if v.passed else "**MISSED**"
        lines.append(
            f"| {v.budget.what} | {v.budget.limit:g} {v.budget.unit} | {v.worst:.4g} | {verdict} |"
        )
    return lines


def run_bulk_bench(
    *, backend: str, dsn: str | None, runs: int, app_path: Path | None
) -> tuple[dict[str, float], list[str]]:
    """This module in a child process (the agent's configuration is its own); its
    figures and errors."""
    out = Path(tempfile.mkdtemp(prefix="localui-bench-bulk-")) / "figures.json"
    env = clean_env()
    if dsn is not None:
        env["LOCALUI_TEST_PG_DSN"] = dsn
    command = [sys.executable, "-m", "bench.bulk_resume", "--backend", backend]
    command += ["--runs", str(runs), "--figures", str(out)]
    if app_path is not None:
        command += ["--localui-path", str(app_path)]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if not out.is_file():
        return {}, [f"bulk resume: the benchmark exited {done.returncode}: {done.stderr[-2000:]}"]
    written = json.loads(out.read_text())
    return {k: float(v) for k, v in written["figures"].items()}, list(written["errors"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bulk_resume")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--runs", type=int, default=RUNS, help="crashed runs resumed in bulk")
    parser.add_argument("--figures", type=Path, default=None, help="also write them here (JSON)")
    parser.add_argument("--out", type=Path, default=None, help="the markdown table")
    parser.add_argument("--localui-path", type=Path, default=None, help="the localui served")
    # A crash of its own, in this (child) process: see make_crashes.
    parser.add_argument("--crash", choices=tuple(KINDS), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ledger", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--order", help=argparse.SUPPRESS)
    parser.add_argument("--execution-id", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.crash is not None:
        return _crash_child(args.crash, args.store, args.ledger, args.order, args.execution_id)
    if args.runs < len(KINDS) * REAL_PER_KIND:
        parser.error(f"--runs is at least {len(KINDS) * REAL_PER_KIND} (the real crashes)")
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    run = BulkRun(backend="PostgreSQL" if args.backend == "postgres" else "SQLite", runs=args.runs)

    def measure(target: PgTarget | None) -> None:
        measure_bulk_resume(run, target=target, app_path=args.localui_path, log=log)

    try:
        if args.backend == "postgres":
            with pg.server(log) as dsn:
                suffix = uuid.uuid4().hex[:8]
                target = PgTarget(dsn, f"bench_bulk_{suffix}", f"bench_bulk_{suffix}_localui")
                try:
                    measure(target)
                finally:
                    pg.drop_schema(dsn, target.schema)
                    pg.drop_schema(dsn, target.app_schema)
        else:
            measure(None)
    except Exception as exc:
        run.errors.append(f"bulk resume: {type(exc).__name__}: {exc}")
        import traceback

        log(traceback.format_exc())
    verdicts = judge(
        {run.backend: figures(run)}, runs=0, with_sdk_ui=False, budgets=BULK_RESUME_BUDGETS
    )
    lines = report_lines(run, verdicts)
    if run.errors:
        lines += ["", "Problems:", *(f"- {e}" for e in run.errors[:50])]
    print("\n".join(lines), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        args.out.with_suffix(".json").write_text(json.dumps(asdict(run), indent=1))
    if args.figures is not None:
        args.figures.write_text(json.dumps({"figures": figures(run), "errors": run.errors}))
    if run.errors:
        return 2
    return 0 if all(v.passed for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
