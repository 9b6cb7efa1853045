"""The kill-9 rounds: ``kill -9`` of localui at random moments while people approve.

    .venv/bin/python -m bench --only kill9                       # SQLite, 5 rounds
    .venv/bin/python -m bench --only kill9 --backend postgres

Each round makes a store of its own with 50 payout-bot pauses (``bench.crash_agent``,
written by the real SDK), serves it with ``localui serve --claim-lease 2``, and sends
100 approvals over them from four threads, two per pause racing, while the server is
killed with SIGKILL at random moments (once every 5 to 15 approvals were answered, up
to 0.4 s later, with the other threads' approvals under way) and started again at
once. A request cut off by a kill is sent again against what the queue then shows.
Once every approval was answered, the last server runs until nothing is left to
carry out.

Budgets, per round, read from the SDK's own rows, localui's decision record and the
agent's ledger of real effects: 0 pauses lost (a pause left orphaned: its paused row
newest and no pending row), 0 decided twice (two run ends, two decisions carried out, or
the tool handed two different decisions), and every recorded decision carried out once (it
reached the tool, and its payout was made; a payout repeated by a kill inside the tool is
counted apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import crash_agent
from bench.servers import REPO, clean_env, free_port

Log = Callable[[str], None]

PAUSES = 50
APPROVALS = 100
ROUNDS = 5
LEASE_SECONDS = "2"
#: A kill comes once this many more approvals were answered (drawn uniformly), at a
#: random moment up to ``KILL_WITHIN_S`` later, while the other threads' approvals
#: are under way: mid-approval, at any point of it, and the round gets on however
#: long a restart takes on a loaded machine.
KILL_AFTER_ANSWERED = (5, 15)
KILL_WITHIN_S = 0.4
#: How long the last server may take to carry out what the killed ones left.
SETTLE_TIMEOUT_S = 120.0
AGENTS = f"{REPO / 'bench' / 'crash_agent.py'}:payout_bot"
LOCALUI = Path(sys.executable).with_name("localui")


@dataclass
class Round:
    number: int
    kills: int = 0
    #: Approvals answered 200 (this request's decision was carried out).
    decided_by_request: int = 0
    #: Approvals answered 409 (someone else's decision won).
    conflicts: int = 0
    #: Approvals cut off by a kill and sent again.
    retried: int = 0
    #: Approvals answered (200 or 409): the kills are paced by it.
    answered: int = 0
    #: Decisions carried out by a restarted server rather than by the request that
    #: made them (recorded and completed, with no 200 answered for them).
    recovered: int = 0
    rearmed: int = 0
    lost: int = 0
    decided_twice: int = 0
    not_carried_out_once: int = 0
    #: Runs whose payout was made twice: the process died inside the tool after the
    #: payout and before the SDK cached it (``@idempotent`` writes its cache row after
    #: the call returns), so the re-armed tool, run again from the top, made it again.
    repeated_effects: int = 0
    #: Runs whose decision reached the tool, and whose process died at a later step
    #: (before the run ended): crashed runs to resume, counted apart.
    crashed_after: int = 0
    still_waiting: int = 0
    completed: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.lost == 0 and self.decided_twice == 0 and self.not_carried_out_once == 0


class Served:
    """One ``localui serve`` at a time on the round's store, restarted after each kill."""

    def __init__(self, args: list[str], env: dict[str, str], workdir: Path) -> None:
        self.args, self.env, self.workdir = args, env, workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = (self.workdir / f"server-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen(
            [str(LOCALUI), "serve", *self.args, "--port", str(self.port)],
            cwd=self.workdir,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"localui exited at start: see {log.name}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/approvals.json", timeout=2).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError("localui did not start within 60 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def _store(
    number: int, dsn: str | None, workdir: Path
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """A fresh store for the round: its ``serve`` arguments and environment."""
    env = clean_env(
        FASTAIAGENT_TRACE_ENABLED="false",
        CRASH_LEDGER=str(workdir / "ledger.jsonl"),
        XDG_CACHE_HOME=str(workdir / "cache"),
    )
    schemas: tuple[str, str] | None = None
    if dsn is None:
        path = workdir / "local.db"
        env.update(CRASH_STORE=str(path), FASTAIAGENT_LOCAL_DB=str(path))
        args = ["--store", str(path)]
    else:
        suffix = f"{os.getpid()}_{number}_{random.randrange(10**6)}"
        schemas = (f"kill9_{suffix}", f"kill9_ui_{suffix}")
        env.update(CRASH_STORE=dsn, CRASH_SCHEMA=schemas[0])
        args = ["--store", dsn, "--pg-schema", schemas[0], "--pg-app-schema", schemas[1]]
    args += ["--agents", AGENTS, "--no-auth", "--claim-lease", LEASE_SECONDS]
    try:
        yield args, env
    finally:
        if dsn is not None and schemas is not None:
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _with_env(env: dict[str, str]) -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def scope() -> Iterator[None]:
        keys = ("CRASH_STORE", "CRASH_SCHEMA", "CRASH_LEDGER")
        before = {k: os.environ.get(k) for k in keys}
        for k in keys:
            if k in env:
                os.environ[k] = env[k]
        try:
            yield
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    return scope()


def _approve(served: Served, run: str, approver: str, result: Round, lock: threading.Lock) -> None:
    """One person's approval, sent again after a kill cut it off, until it is answered
    or the pause is no longer in the queue."""
    while True:
        try:
            with httpx.Client(base_url=served.url, timeout=30) as client:
                queue = client.get("/approvals.json", params={"order": "oldest"}).json()
                cards = [a for a in queue["approvals"] if a["execution_id"] == run]
                if not cards:
                    with lock:
                        result.answered += 1
                    return  # decided, or being carried out: nothing left to click
                answer = client.post(
                    f"/approvals/{run}/approve",
                    data={
                        "approver": approver,
                        "reason": "kill9",
                        "checkpoint_id": cards[0]["checkpoint_id"],
                    },
                    headers={"Accept": "application/json"},
                )
            with lock:
                result.answered += 1
                if answer.status_code == 200:
                    result.decided_by_request += 1
                elif answer.status_code in (404, 409):
                    result.conflicts += 1
                else:
                    result.problems.append(f"{run}: {answer.status_code} {answer.text[:200]}")
            return
        except (httpx.TransportError, ValueError):
            # Cut off by a kill (or an answer cut short): sent again once it is back.
            with lock:
                result.retried += 1
            time.sleep(0.5)


def one_round(number: int, dsn: str | None, log: Log, seed: int) -> Round:
    result = Round(number)
    started = time.monotonic()
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix=f"localui-kill9-{number}-"))
    with _store(number, dsn, workdir) as (args, env), _with_env(env):
        agent = crash_agent.payout_bot()
        sdk: Any = agent._checkpointer  # the SDK keeps it here and offers no accessor
        sdk.setup()
        try:
            runs = [asyncio.run(crash_agent.pause(agent, f"K{number}x{i}")) for i in range(PAUSES)]
            served = Served(args, env, workdir)
            served.start()
            lock = threading.Lock()
            work = [(runs[i // 2], f"approver-{i % 2}") for i in range(APPROVALS)]
            rng.shuffle(work)
            done = threading.Event()

            def drive() -> None:
                while True:
                    with lock:
                        if not work:
                            return
                        run, approver = work.pop()
                    _approve(served, run, approver, result, lock)

            drivers = [threading.Thread(target=drive) for _ in range(4)]
            for d in drivers:
                d.start()

            def watch() -> None:
                for d in drivers:
                    d.join()
                done.set()

            threading.Thread(target=watch, daemon=True).start()
            while not done.is_set():
                target = result.answered + rng.randint(*KILL_AFTER_ANSWERED)
                while result.answered < target and not done.wait(0.02):
                    pass
                if done.wait(rng.uniform(0, KILL_WITHIN_S)):
                    break
                served.kill()
                result.kills += 1
                served.start()
            _settle(runs, sdk, dsn is not None, env, result)
            served.stop()
            _judge(runs, sdk, dsn is not None, env, result)
        finally:
            sdk.close()
    result.seconds = time.monotonic() - started
    log(
        f"kill9 round {number}: {result.kills} kills, {result.lost} lost,"
        f" {result.decided_twice} decided twice, {result.recovered} carried out after a restart"
        f" ({result.rearmed} re-armed), {result.not_carried_out_once} not carried out once"
    )
    return result


def _open_decisions(env: dict[str, str], postgres: bool) -> Any:
    from localui.backends.postgres.decisions import PostgresDecisionLog
    from localui.backends.sqlite.decisions import SQLiteDecisionLog

    if postgres:
        app_schema = env["CRASH_SCHEMA"].replace("kill9_", "kill9_ui_", 1)
        return PostgresDecisionLog(env["CRASH_STORE"], schema=app_schema, writable=False)
    return SQLiteDecisionLog(env["CRASH_STORE"], writable=False)


def _settle(runs: list[str], sdk: Any, postgres: bool, env: dict[str, str], result: Round) -> None:
    """Let the last server carry out what the killed ones left, until nothing is."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        decisions = _open_decisions(env, postgres)
        try:
            open_ones = [
                d for run in runs for d in decisions.list_for_run(run) if d.outcome is None
            ]
        finally:
            decisions.close()
        if not open_ones and not _orphans(runs, sdk):
            return
        time.sleep(0.5)
    result.problems.append("decisions were still being carried out when the round ended")


def _orphans(runs: list[str], sdk: Any) -> list[str]:
    waiting = {p.execution_id for p in sdk.list_pending_interrupts(limit=1000)}
    found = []
    for run in runs:
        last = sdk.get_last(run)
        if last is not None and last.status == "interrupted" and run not in waiting:
            found.append(run)
    return found


def _judge(runs: list[str], sdk: Any, postgres: bool, env: dict[str, str], result: Round) -> None:
    ledger = Path(env["CRASH_LEDGER"])
    lines = [json.loads(x) for x in ledger.read_text().splitlines()] if ledger.exists() else []
    waiting = {p.execution_id for p in sdk.list_pending_interrupts(limit=1000)}
    orphans = set(_orphans(runs, sdk))
    decisions = _open_decisions(env, postgres)
    try:
        for run in runs:
            order = run.split("-")[1]
            mine = [x for x in lines if x["order_id"] == order]
            payouts = sum(1 for x in mine if x["effect"] == "pay_out")
            # Each distinct decision the tool was handed.
            seen = {
                json.dumps([x["approved"], x["metadata"]], sort_keys=True)
                for x in mine
                if x["effect"] == "tool_ran"
            }
            ends = [c.status for c in sdk.list(run, limit=500) if c.step_type == "run_end"]
            recorded = [
                d
                for d in decisions.list_for_run(run)
                if d.kind == "approval" and d.outcome != "already_resumed"
            ]
            if run in orphans:
                result.lost += 1
            elif not ends and run not in waiting:
                # The decision reached the tool and the run went on; its process died at
                # a later step. A crashed run the run page offers to resume, not a pause.
                result.crashed_after += 1
            if run in waiting:
                result.still_waiting += 1
            if ends == ["completed"]:
                result.completed += 1
            if len(ends) > 1 or len(recorded) > 1 or len(seen) > 1:
                result.decided_twice += 1
            if payouts > 1:
                result.repeated_effects += 1
            for d in recorded:
                if d.outcome == "completed":
                    result.recovered += 1
                if d.rearmed_checkpoint_id is not None:
                    result.rearmed += 1
                handed = json.dumps([d.approved, dict(d.metadata or {})], sort_keys=True)
                reached = d.outcome == "completed" or (
                    d.outcome == "unfinished" and run not in orphans
                )
                if not reached or handed not in seen or payouts == 0:
                    result.not_carried_out_once += 1
    finally:
        decisions.close()
    result.recovered -= result.decided_by_request


def run_kill9(dsn: str | None, log: Log, out: Path, rounds: int = ROUNDS) -> int:
    """The rounds, their table at ``out`` (markdown, raw figures beside it), and 0 when
    every budget held, 1 when one was missed."""
    results = [one_round(n, dsn, log, seed=n) for n in range(1, rounds + 1)]
    backend = "PostgreSQL" if dsn else "SQLite"
    lines = [
        f"# kill -9 mid-approval ({backend})",
        "",
        f"{PAUSES} pauses, {APPROVALS} approvals (two per pause, four threads), SIGKILL once"
        f" every {KILL_AFTER_ANSWERED[0]}-{KILL_AFTER_ANSWERED[1]} approvals were answered,"
        f" within {KILL_WITHIN_S} s, `--claim-lease {LEASE_SECONDS}`.",
        "",
        "| round | kills | lost | decided twice | not carried out once | carried out after"
        " a restart | re-armed | payout repeated | crashed later | 200 / 409 / retried"
        " | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.number} | {r.kills} | {r.lost} | {r.decided_twice} | {r.not_carried_out_once}"
            f" | {r.recovered} | {r.rearmed} | {r.repeated_effects} | {r.crashed_after}"
            f" | {r.decided_by_request} / {r.conflicts} /"
            f" {r.retried} | {r.seconds:.0f} |"
        )
    lines += [
        "",
        "Budgets: 0 lost, 0 decided twice, 0 not carried out once, every round. A payout"
        " repeated is a kill inside the tool between the payout and its cache row: the"
        " re-armed tool runs again from the top (README, SDK caveats); it is counted, not"
        " budgeted. Crashed later: the decision reached the tool and the process died at a"
        " later step of the run, which then waits for an operator's resume like any crash.",
    ]
    problems = [p for r in results for p in r.problems]
    if problems:
        lines += ["", "Problems:", *(f"- {p}" for p in problems)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    print("\n".join(lines))
    return 0 if all(r.passed for r in results) and not problems else 1
