"""Seed a store with real runs of every kind the UI has to show.

Each scenario runs in a child process of its own (``localui.demo.worker``):
crashes are real ``os._exit`` deaths, and the SDK's habit of writing
``.fastaiagent/`` into its working directory lands in a temporary directory
instead of the user's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from localui.backends.urls import is_postgres_url
from localui.demo.agent import EXIT_DIED_IN_TOOL, EXIT_DIED_WAITING_ON_MODEL
from localui.demo.teams import EXIT_DIED_IN_TEAM_TOOL

#: How a scenario's run is left: the run's own outcome, or the process died.
Ending = Literal["completed", "paused", "failed", "died"]

#: Which runner a scenario runs: the refund-bot agent, or one of ``localui.demo.teams``.
Runner = Literal["refund-bot", "chain", "supervisor", "swarm", "long"]

#: A child that takes longer than this is stuck, not slow (each takes about a second).
_CHILD_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Scenario:
    """One seeded run: what the user asked, which failure switch is on, how it ends.

    ``after`` names the scenario this one waits for: the run a fork branches
    from, or the previous pause, so the approval queue fills in order.
    """

    name: str
    prompt: str | None
    ends: Ending
    model_fails_once: bool = False
    die_in_tool: bool = False
    die_waiting_on_model: bool = False
    approve_after_pause: bool = False
    fork: bool = False
    after: str | None = None
    runner: Runner = "refund-bot"
    #: For a fork: the node id of the source row it branches from (default: the last step).
    fork_from: str | None = None

    @property
    def exit_code(self) -> int:
        """The exit code its worker must end with."""
        if self.die_in_tool and self.runner != "refund-bot":
            return EXIT_DIED_IN_TEAM_TOOL
        if self.die_in_tool:
            return EXIT_DIED_IN_TOOL
        if self.die_waiting_on_model:
            return EXIT_DIED_WAITING_ON_MODEL
        return 0


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("completed", "Refund order A-1001 for 40.00", "completed"),
    Scenario("paused-1", "Refund order A-1002 for 250.00", "paused"),
    Scenario("paused-2", "Refund order A-1003 for 900.00", "paused", after="paused-1"),
    Scenario("paused-3", "Refund order A-1004 for 1200.00", "paused", after="paused-2"),
    Scenario("crashed-in-tool", "Refund order A-1006 for 80.00", "died", die_in_tool=True),
    Scenario(
        "crashed-waiting-on-model",
        "Refund order A-1007 for 35.00",
        "died",
        die_waiting_on_model=True,
    ),
    Scenario("failed", "Refund order A-1008 for 20.00", "failed", model_fails_once=True),
    Scenario(
        "two-tools-first-pauses",
        "Refund order A-1005 for 700.00 and notify the customer",
        "paused",
    ),
    Scenario(
        "idempotent-resumed",
        "Refund order A-1009 for 450.00",
        "completed",
        approve_after_pause=True,
    ),
    # No new input: the branch re-runs the source's last step forward, so it
    # repeats no tool and its rows sort the same by time and by node_index.
    Scenario("fork-of-completed", None, "completed", fork=True, after="completed"),
)

#: The other runners' shapes: chains, teams, a run past the 500 rows the SDK reads,
#: and a fork that failed. ``localui demo`` seeds these beside the refund-bot's.
SHAPE_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("chain-paused", None, "paused", runner="chain"),
    Scenario("chain-crashed", None, "died", die_in_tool=True, runner="chain"),
    Scenario("supervisor-paused", "Refund order B-7", "paused", runner="supervisor"),
    Scenario(
        "supervisor-crashed", "Refund order B-7", "died", die_in_tool=True, runner="supervisor"
    ),
    Scenario("swarm-paused", "Refund order B-7", "paused", runner="swarm"),
    Scenario("swarm-crashed", "Refund order B-7", "died", die_in_tool=True, runner="swarm"),
    Scenario("long-paused", "Book the ledger", "paused", runner="long"),
    Scenario("long-failed", "Book the ledger", "failed", model_fails_once=True, runner="long"),
    # A new input from the source's first turn: the branch's model call fails.
    Scenario(
        "fork-failed",
        "Refund order A-1010 for 10.00",
        "failed",
        model_fails_once=True,
        fork=True,
        after="completed",
        fork_from="turn:1",
    ),
)

ALL_SCENARIOS: tuple[Scenario, ...] = SCENARIOS + SHAPE_SCENARIOS

SCENARIO_NAMES: tuple[str, ...] = tuple(s.name for s in SCENARIOS)


def get_scenario(name: str) -> Scenario:
    for scenario in ALL_SCENARIOS:
        if scenario.name == name:
            return scenario
    raise KeyError(f"no demo scenario {name!r}; known: {', '.join(SCENARIO_NAMES)}")


class SeedError(RuntimeError):
    """A seeding child did not end the way its scenario says it must."""


@dataclass(frozen=True, slots=True)
class SeedReport:
    """What ``seed`` wrote: the execution id of each scenario's run, by name."""

    #: A SQLite file, or the ``postgresql://`` URL the runs were written to.
    store: Path | str
    runs: Mapping[str, str]
    seconds: float

    def run_id(self, scenario: str) -> str:
        try:
            return self.runs[scenario]
        except KeyError:
            raise KeyError(
                f"no seeded run for scenario {scenario!r}; seeded: {', '.join(self.runs)}"
            ) from None


def seed(
    store: Path | str,
    *,
    pg_schema: str = "fastaiagent",
    ledger: Path | None = None,
    progress: Callable[[str], None] = lambda _m: None,
    scenarios: tuple[Scenario, ...] = SCENARIOS,
) -> SeedReport:
    """Run every scenario into ``store``, each in a child process, and report the ids.

    ``store`` is a SQLite file, or a ``postgresql://`` URL whose ``pg_schema``
    receives the SDK's tables (``PostgresCheckpointer``). Independent children
    run concurrently; one that waits for another (``after``) starts when that
    one has finished. Raises :class:`SeedError` when a child exits with an
    unexpected code or prints no execution id.
    """
    started = time.monotonic()
    target: Path | str
    if isinstance(store, str) and is_postgres_url(store):
        target = store
        _prepare_postgres(store, pg_schema)
    else:
        # Children run elsewhere, so relative paths would point into their temp dir.
        target = Path(store).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
    ledger = ledger.resolve() if ledger is not None else None
    env = dict(os.environ)
    # Traced, as a user's agents are by default: the spans land in the same file
    # (for PostgreSQL, in the throwaway directory's local.db).
    env["FASTAIAGENT_TRACE_ENABLED"] = "true"
    runs: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="localui-seed-") as workdir:
        # With a PostgreSQL store the SDK's other files (its config, traces)
        # still want a SQLite path: the throwaway directory's.
        env["FASTAIAGENT_LOCAL_DB"] = (
            str(target) if isinstance(target, Path) else str(Path(workdir) / "local.db")
        )

        def start(pool: ThreadPoolExecutor, scenario: Scenario) -> Future[str]:
            source = runs[scenario.after] if scenario.fork and scenario.after else None
            return pool.submit(
                _run_child, scenario, str(target), pg_schema, ledger, Path(workdir), env, source
            )

        pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2))
        try:
            pending = {start(pool, s): s for s in scenarios if s.after is None}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    scenario = pending.pop(future)
                    runs[scenario.name] = future.result()
                    progress(f"{scenario.name:<26} {scenario.ends:<9} {runs[scenario.name]}")
                    for waiting in scenarios:
                        if waiting.after == scenario.name:
                            pending[start(pool, waiting)] = waiting
        finally:
            # On a failure, children not yet started never start; running ones finish.
            pool.shutdown(wait=True, cancel_futures=True)
    ordered = {s.name: runs[s.name] for s in scenarios}
    return SeedReport(
        store=target, runs=MappingProxyType(ordered), seconds=time.monotonic() - started
    )


def _prepare_postgres(dsn: str, schema: str) -> None:
    """Create the SDK's tables once, before children that would race to create them."""
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    checkpointer = PostgresCheckpointer(dsn, schema=schema, max_pool_size=1)
    try:
        checkpointer.setup()
    finally:
        checkpointer.close()


def _run_child(
    scenario: Scenario,
    store: str,
    pg_schema: str,
    ledger: Path | None,
    workdir: Path,
    env: Mapping[str, str],
    source: str | None,
) -> str:
    """Run one scenario's worker; return the execution id it printed last."""
    command = [
        sys.executable,
        "-m",
        "localui.demo.worker",
        "--store",
        store,
        "--scenario",
        scenario.name,
    ]
    if is_postgres_url(store):
        command += ["--pg-schema", pg_schema]
    if ledger is not None:
        command += ["--ledger", str(ledger)]
    if source is not None:
        command += ["--source", source]
    try:
        done = subprocess.run(
            command,
            cwd=workdir,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=_CHILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise SeedError(
            f"scenario {scenario.name!r}: worker still running after {exc.timeout:.0f} s"
        ) from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != scenario.exit_code:
        raise SeedError(
            f"scenario {scenario.name!r}: worker exited with {done.returncode}, expected "
            f"{scenario.exit_code}; stderr:\n{_tail(done.stderr)}"
        )
    if not lines or not lines[-1].strip():
        raise SeedError(
            f"scenario {scenario.name!r}: worker printed no execution id; "
            f"stderr:\n{_tail(done.stderr)}"
        )
    return lines[-1].strip()


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "(empty)"
