"""The deadline rounds: how soon two servers escalate and decide a rule's pauses, with
``kill -9`` of one of them around the deadline.

    .venv/bin/python -m bench --only deadlines                       # SQLite, 3 rounds
    .venv/bin/python -m bench --only deadlines --backend postgres

Each round makes a store of its own (``bench.kill9``'s), serves it with two ``localui
serve`` processes under a policy whose rule gives payout-bot's pauses ``due = "3s"``
(escalated to a group) and ``on_timeout = "reject"`` at ``timeout_after = "6s"``, and
writes 20 pauses (``bench.crash_agent``, the real SDK on its offline model) one after
another. At a random moment 2 to 8 s after the first pause, one server is killed with
SIGKILL and started again at once. Then the servers run until every pause is decided.

Figures, per round, read from the SDK's own rows (when each paused row was written), localui's
outbox (when ``pause.escalated`` was recorded) and its decision record (when the rule's
decision was claimed): the delay from due to escalation and from the timeout to the
decision, p50 and worst. Budgets: every delay within 60 s (the issue's), 0 decided twice
(two run ends, two decisions, or the tool handed two), 0 left undecided, one escalation
event per pause.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import crash_agent
from bench.kill9 import Log, Served, _open_decisions, _store, _with_env

PAUSES = 20
ROUNDS = 3
DUE_S = 3
TIMEOUT_S = 6
#: The kill comes this long after the first pause, drawn uniformly: before, at and after
#: the deadlines of the pauses written so far.
KILL_BETWEEN_S = (2.0, 8.0)
BUDGET_S = 60.0
SETTLE_TIMEOUT_S = 120.0
POLICY = f"""
[[rule]]
name = "payouts"
agent = "payout-bot"
due = "{DUE_S}s"
escalate_to = ["group:managers"]
on_timeout = "reject"
timeout_after = "{TIMEOUT_S}s"
timeout_reason = "not approved in time"
notify = ["json://127.0.0.1:9/deadlines"]
"""


@dataclass
class Round:
    number: int
    kills: int = 0
    escalation_delays: list[float] = field(default_factory=list)
    timeout_delays: list[float] = field(default_factory=list)
    decided_twice: int = 0
    undecided: int = 0
    escalation_events_not_one: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        worst = max([*self.escalation_delays, *self.timeout_delays], default=0.0)
        return (
            worst <= BUDGET_S
            and self.decided_twice == 0
            and self.undecided == 0
            and self.escalation_events_not_one == 0
            and not self.problems
        )


def _seconds(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value)).timestamp()


def _outbox(env: dict[str, str], postgres: bool, app_schema: str | None) -> list[Any]:
    """``(execution_id, created_at)`` of every ``pause.escalated`` the outbox holds."""
    query = "SELECT execution_id, created_at FROM {t} WHERE event_type = 'pause.escalated'"
    if postgres:
        import psycopg

        with psycopg.connect(env["CRASH_STORE"], autocommit=True) as conn:
            table = f'"{app_schema}".localui_notifications'
            return list(conn.execute(query.format(t=table)).fetchall())
    import sqlite3

    lite = sqlite3.connect(env["CRASH_STORE"])
    try:
        return lite.execute(query.format(t="localui_notifications")).fetchall()
    finally:
        lite.close()


def one_round(number: int, dsn: str | None, log: Log, seed: int) -> Round:
    rng = random.Random(seed)
    result = Round(number)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="localui-deadlines-") as tmp:
        workdir = Path(tmp)
        policy = workdir / "policy.toml"
        policy.write_text(POLICY)
        with _store(number, dsn, workdir) as (args, env), _with_env(env):
            app_schema = args[args.index("--pg-app-schema") + 1] if dsn else None
            agent = crash_agent.payout_bot()
            sdk: Any = agent._checkpointer  # the SDK keeps it here and offers no accessor
            sdk.setup()
            served = [Served([*args, "--policy", str(policy)], env, workdir) for _ in (1, 2)]
            try:
                for server in served:
                    server.start()
                kill_at = time.monotonic() + rng.uniform(*KILL_BETWEEN_S)
                runs: list[str] = []
                for i in range(PAUSES):
                    runs.append(asyncio.run(crash_agent.pause(agent, f"D{number}x{i}")))
                    if result.kills == 0 and time.monotonic() >= kill_at:
                        _kill_and_restart(rng.choice(served), result, log)
                if result.kills == 0:
                    time.sleep(max(0.0, kill_at - time.monotonic()))
                    _kill_and_restart(rng.choice(served), result, log)
                _settle(runs, env, dsn is not None, result)
                # When each paused: its paused row, which outlives the pending row.
                paused = {
                    run: _seconds(c.created_at)
                    for run in runs
                    for c in sdk.list(run, limit=500)
                    if c.status == "interrupted"
                }
                missing = [r for r in runs if r not in paused]
                if missing:
                    result.problems.append(f"{len(missing)} pauses have no paused row")
                _judge(runs, paused, sdk, env, dsn is not None, app_schema, result)
            finally:
                for server in served:
                    server.stop()
                sdk.close()
    result.seconds = time.monotonic() - started
    log(
        f"deadlines round {number}: {result.kills} kill, escalation worst"
        f" {max(result.escalation_delays, default=0):.1f} s, timeout worst"
        f" {max(result.timeout_delays, default=0):.1f} s, {result.decided_twice} decided twice"
    )
    return result


def _kill_and_restart(server: Served, result: Round, log: Log) -> None:
    server.kill()
    result.kills += 1
    server.start()
    log(f"killed and restarted the server on {server.url}")


def _settle(runs: list[str], env: dict[str, str], postgres: bool, result: Round) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    decisions = _open_decisions(env, postgres)
    try:
        while time.monotonic() < deadline:
            done = sum(
                1 for run in runs if any(d.outcome is not None for d in decisions.list_for_run(run))
            )
            if done == len(runs):
                return
            time.sleep(0.5)
    finally:
        decisions.close()
    result.problems.append(f"not every pause was decided within {SETTLE_TIMEOUT_S:.0f} s")


def _judge(
    runs: list[str],
    paused: dict[str, float],
    sdk: Any,
    env: dict[str, str],
    postgres: bool,
    app_schema: str | None,
    result: Round,
) -> None:
    time.sleep(3)  # both servers poll again: nothing more may happen
    ledger = Path(env["CRASH_LEDGER"])
    lines = [json.loads(x) for x in ledger.read_text().splitlines()] if ledger.exists() else []
    escalations: dict[str, list[float]] = {}
    for execution_id, created_at in _outbox(env, postgres, app_schema):
        escalations.setdefault(str(execution_id), []).append(float(created_at))
    decisions = _open_decisions(env, postgres)
    try:
        for run in runs:
            order = run.split("-")[1]
            seen = {
                json.dumps([x["approved"], x["metadata"]], sort_keys=True)
                for x in lines
                if x["order_id"] == order and x["effect"] == "tool_ran"
            }
            ends = [c.status for c in sdk.list(run, limit=500) if c.step_type == "run_end"]
            recorded = [d for d in decisions.list_for_run(run) if d.kind == "approval"]
            if len(ends) > 1 or len(recorded) > 1 or len(seen) > 1:
                result.decided_twice += 1
            if not recorded or recorded[0].outcome is None or not ends:
                result.undecided += 1
            told = escalations.get(run, [])
            if len(told) != 1:
                result.escalation_events_not_one += 1
            if run not in paused:
                continue
            if told:
                result.escalation_delays.append(min(told) - (paused[run] + DUE_S))
            if recorded:
                decided = _seconds(recorded[0].decided_at)
                result.timeout_delays.append(decided - (paused[run] + TIMEOUT_S))
    finally:
        decisions.close()


def _figures(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def run_deadlines(dsn: str | None, log: Log, out: Path, rounds: int = ROUNDS) -> int:
    """The rounds, their table at ``out`` (markdown, raw figures beside it), and 0 when
    every budget held, 1 when one was missed."""
    results = [one_round(n, dsn, log, seed=n) for n in range(1, rounds + 1)]
    backend = "PostgreSQL" if dsn else "SQLite"
    lines = [
        f"# Deadlines: escalation and timeout with two servers ({backend})",
        "",
        f"{PAUSES} pauses per round, `due = {DUE_S}s`, `timeout_after = {TIMEOUT_S}s`,"
        f" two `localui serve` on one store, one killed with SIGKILL"
        f" {KILL_BETWEEN_S[0]:.0f}-{KILL_BETWEEN_S[1]:.0f} s after the first pause and"
        " started again at once.",
        "",
        "| round | kills | due → escalated, p50 / worst (s) | timeout → decided, p50 / worst"
        " (s) | decided twice | undecided | escalation events not one | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.number} | {r.kills} | {_figures(r.escalation_delays)}"
            f" | {_figures(r.timeout_delays)} | {r.decided_twice} | {r.undecided}"
            f" | {r.escalation_events_not_one} | {r.seconds:.0f} |"
        )
    lines += [
        "",
        f"Budgets: every delay within {BUDGET_S:.0f} s, 0 decided twice, 0 undecided, one"
        " pause.escalated per pause, every round. Delays are measured from the SDK's own"
        " time of the pause (its paused row) plus the rule's durations, on this host's"
        " clock.",
    ]
    problems = [p for r in results for p in r.problems]
    if problems:
        lines += ["", "Problems:", *(f"- {p}" for p in problems)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    print("\n".join(lines))
    return 0 if all(r.passed for r in results) else 1
