"""Seed a store with real runs of every kind the UI has to show.

Each scenario runs in a child process of its own (forked by a
``localui.demo.worker`` process): crashes are real ``os._exit`` deaths, and the
SDK's habit of writing ``.fastaiagent/`` into its working directory lands in a
temporary directory instead of the user's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from localui.backends.urls import is_postgres_url
from localui.demo.agent import EXIT_DIED_IN_TOOL, EXIT_DIED_WAITING_ON_MODEL
from localui.demo.teams import EXIT_DIED_IN_TEAM_TOOL
from localui.offloop import off_loop
from localui.records import SeedFailure, SeedProgress

#: How a scenario's run is left: the run's own outcome, or the process died.
Ending = Literal["completed", "paused", "failed", "died"]

#: What stops a run on purpose (SDK 1.91): ``Agent.cancel`` from another thread, or the
#: run's ``timeout_seconds``; either way its run-end row is ``failed`` with a reason.
Stop = Literal["cancel", "timeout"]

#: Which runner a scenario runs: the refund-bot agent, or one of ``localui.demo.teams``.
Runner = Literal["refund-bot", "chain", "parcel-chain", "supervisor", "swarm", "long"]

#: A child that takes longer than this is stuck, not slow (each takes about a second).
_CHILD_TIMEOUT_S = 120.0

#: The project the demo store's tables are made under (see ``create_store``).
DEMO_PROJECT = "localui-demo"

#: Worker processes seeding side by side: one per core of a small machine.
WORKERS = 2

#: The longest reply line a worker may send (a scenario's stdout and stderr).
_REPLY_LIMIT = 16 * 1024 * 1024


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
    #: Stopped on purpose while its refund waits on the payment provider.
    stop: Stop | None = None

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
    # Stopped on purpose inside the refund (agents since SDK 1.91; the demo seeds on
    # the lowest SDK the project supports, so both are agent runs): someone cancelled
    # it, or it ran out of its timeout_seconds.
    Scenario("cancelled", "Refund order A-1011 for 60.00", "failed", stop="cancel"),
    Scenario("timed-out", "Refund order A-1012 for 75.00", "failed", stop="timeout"),
    # A chain whose courier agent ran out of its timeout_seconds in its second node:
    # ``timed_out`` where the SDK names why (1.93 on), a plain ``failed`` before.
    Scenario("chain-timed-out", None, "failed", runner="parcel-chain", stop="timeout"),
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
    """Run every scenario into ``store`` and report the ids; see :class:`Seeding`.

    Raises :class:`SeedError` naming each scenario that did not land and why.
    """
    seeding = Seeding(store, pg_schema=pg_schema, ledger=ledger, say=progress, scenarios=scenarios)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        report = asyncio.run(seeding.run())
    else:
        # Called from code that runs an event loop (a notebook, Playwright's sync API):
        # the seeding gets a loop of its own, on a thread of its own.
        with ThreadPoolExecutor(max_workers=1) as pool:
            report = pool.submit(asyncio.run, seeding.run()).result()
    failures = seeding.progress().failures
    if failures:
        raise SeedError("; ".join(f"scenario {f.scenario!r}: {f.reason}" for f in failures))
    return report


class Seeding:
    """The scenarios written into ``store`` by two worker processes, in the background.

    ``store`` is a SQLite file, or a ``postgresql://`` URL whose ``pg_schema``
    receives the SDK's tables (``PostgresCheckpointer``). Each worker
    (``python -m localui.demo.worker --pool``) imports the SDK once and forks a child
    per scenario, so crashes are real deaths of a process of their own; a scenario
    that waits for another (``after``) is started once that one has landed. A
    scenario that does not land is a :class:`SeedFailure` with its worker's words,
    said through ``say``; the others go on, and those waiting for it are failures
    too. ``localui demo`` serves the store while this runs (the app's lifespan runs
    it as its :class:`~localui.views.common.Seeding`).
    """

    def __init__(
        self,
        store: Path | str,
        *,
        pg_schema: str = "fastaiagent",
        ledger: Path | None = None,
        say: Callable[[str], None] = lambda _m: None,
        scenarios: tuple[Scenario, ...] = ALL_SCENARIOS,
        workers: int = WORKERS,
    ) -> None:
        if isinstance(store, str) and is_postgres_url(store):
            self.target: Path | str = store
        else:
            # Workers run elsewhere, so relative paths would point into their temp dir.
            self.target = Path(store).resolve()
        self.pg_schema = pg_schema
        self.ledger = ledger.resolve() if ledger is not None else None
        self.scenarios = scenarios
        self.workers = workers
        self._say = say
        self._runs: dict[str, str] = {}
        self._failures: list[SeedFailure] = []

    def progress(self) -> SeedProgress:
        return SeedProgress(
            landed=len(self._runs), total=len(self.scenarios), failures=tuple(self._failures)
        )

    async def run(self, landed: Callable[[str], None] = lambda _run: None) -> SeedReport:
        """Seed every scenario; call ``landed`` with each run's id as it is in the store."""
        started = time.monotonic()
        if isinstance(self.target, str):
            await off_loop(_prepare_postgres, self.target, self.pg_schema)
        else:
            self.target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="localui-seed-") as workdir:
            command, env = self._pool_command(), self._env(Path(workdir))
            pools = [_Pool(command, Path(workdir), env, n) for n in range(self.workers)]
            ready: asyncio.Queue[Scenario | None] = asyncio.Queue()
            for scenario in self.scenarios:
                if scenario.after is None:
                    ready.put_nowait(scenario)
            try:
                async with asyncio.TaskGroup() as group:
                    for pool in pools:
                        group.create_task(self._work(pool, ready, landed))
            finally:
                for pool in pools:
                    await pool.stop()
        ordered = {s.name: self._runs[s.name] for s in self.scenarios if s.name in self._runs}
        return SeedReport(
            store=self.target,
            runs=MappingProxyType(ordered),
            seconds=time.monotonic() - started,
        )

    async def _work(
        self,
        pool: _Pool,
        ready: asyncio.Queue[Scenario | None],
        landed: Callable[[str], None],
    ) -> None:
        while (scenario := await ready.get()) is not None:
            source = self._runs.get(scenario.after) if scenario.fork and scenario.after else None
            try:
                run_id = await pool.run(scenario, source)
            except SeedError as exc:
                self._fail(scenario, str(exc))
            else:
                self._runs[scenario.name] = run_id
                self._say(f"{scenario.name:<26} {scenario.ends:<9} {run_id}")
                landed(run_id)
                for waiting in self.scenarios:
                    if waiting.after == scenario.name:
                        ready.put_nowait(waiting)
            if self.progress().finished:
                for _ in range(self.workers):
                    ready.put_nowait(None)

    def _fail(self, scenario: Scenario, reason: str) -> None:
        self._failures.append(SeedFailure(scenario.name, reason))
        self._say(f"{scenario.name:<26} FAILED    {reason}")
        for waiting in self.scenarios:
            if waiting.after == scenario.name:
                self._fail(waiting, f"waits for scenario {scenario.name!r}, which failed")

    def _pool_command(self) -> list[str]:
        command = [sys.executable, "-m", "localui.demo.worker", "--pool"]
        command += ["--store", str(self.target), "--pg-schema", self.pg_schema]
        if self.ledger is not None:
            command += ["--ledger", str(self.ledger)]
        return command

    def _env(self, workdir: Path) -> dict[str, str]:
        env = dict(os.environ)
        # Traced, as a user's agents are by default: the spans land in the same file
        # (for PostgreSQL, in the throwaway directory's local.db, as the SDK's other
        # files still want a SQLite path).
        env["FASTAIAGENT_TRACE_ENABLED"] = "true"
        env["FASTAIAGENT_LOCAL_DB"] = (
            str(self.target) if isinstance(self.target, Path) else str(workdir / "local.db")
        )
        return env


class _Pool:
    """One worker process, started on first use, asked one scenario at a time."""

    def __init__(self, command: list[str], workdir: Path, env: Mapping[str, str], n: int) -> None:
        self.command = command
        self.workdir = workdir
        self.env = dict(env)
        # Its own words go to a file, read when it dies: a pipe nobody reads could fill.
        self.stderr = workdir / f"worker-{n}.err"
        self._process: asyncio.subprocess.Process | None = None

    async def run(self, scenario: Scenario, source: str | None) -> str:
        """The execution id the scenario's child printed last; SeedError when the child
        did not end as the scenario says (or the worker itself died)."""
        process = await self._started()
        assert process.stdin is not None and process.stdout is not None
        request = {"scenario": scenario.name, "source": source}
        try:
            process.stdin.write((json.dumps(request) + "\n").encode())
            await process.stdin.drain()
            line = await asyncio.wait_for(process.stdout.readline(), _CHILD_TIMEOUT_S)
        except TimeoutError:
            await self.stop()
            raise SeedError(f"still running after {_CHILD_TIMEOUT_S:.0f} s") from None
        except (BrokenPipeError, ConnectionResetError):
            line = b""
        if not line:
            stderr = await self._stop_for_stderr()
            raise SeedError(f"the worker process died; stderr:\n{_tail(stderr)}")
        reply = json.loads(line)
        return _execution_id(scenario, int(reply["exit"]), reply["stdout"], reply["stderr"])

    async def _started(self) -> asyncio.subprocess.Process:
        if self._process is None or self._process.returncode is not None:
            with self.stderr.open("ab") as stderr:
                self._process = await asyncio.create_subprocess_exec(
                    *self.command,
                    cwd=self.workdir,
                    env=self.env,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=stderr,
                    # Its own process group: stopping it ends a scenario's child as well.
                    start_new_session=True,
                    # A scenario's reply carries its whole output on one line.
                    limit=_REPLY_LIMIT,
                )
        return self._process

    async def _stop_for_stderr(self) -> str:
        await self.stop()
        return self.stderr.read_text(errors="replace") if self.stderr.exists() else ""

    async def stop(self) -> None:
        """End the worker and any child of a scenario it is running."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        # Shielded: a cancelled seeding still reaps what it started.
        await asyncio.shield(process.wait())


def create_store(path: Path) -> None:
    """The SDK's tables in a new SQLite file, written by the SDK, and nothing else.

    Any SDK write stamps the project the working directory names, creating
    ``.fastaiagent/config.toml`` there on first use; the demo's store is made from
    the user's directory, which must stay as it was. The SDK's own scope for the
    project (the context variable its writers read first; it has no public setter)
    names the demo's instead, for this one call.
    """
    from fastaiagent import SQLiteCheckpointer

    scope: ContextVar[Any] | None = None
    try:
        from fastaiagent._internal.scope import scoped_project_id

        scope = scoped_project_id
    except ImportError:
        pass  # an SDK from before project scoping stamps no project, and writes no file
    token = scope.set(DEMO_PROJECT) if scope is not None else None
    try:
        checkpointer = SQLiteCheckpointer(str(path))
        checkpointer.setup()
        checkpointer.close()
    finally:
        if scope is not None and token is not None:
            scope.reset(token)


def _prepare_postgres(dsn: str, schema: str) -> None:
    """Create the SDK's tables once, before children that would race to create them."""
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    checkpointer = PostgresCheckpointer(dsn, schema=schema, max_pool_size=1)
    try:
        checkpointer.setup()
    finally:
        checkpointer.close()


def _execution_id(scenario: Scenario, code: int, stdout: str, stderr: str) -> str:
    """The execution id a scenario's child printed last, when it ended as it must."""
    lines = stdout.strip().splitlines()
    if code != scenario.exit_code:
        raise SeedError(
            f"its worker exited with {code}, expected {scenario.exit_code}; "
            f"stderr:\n{_tail(stderr)}"
        )
    if not lines or not lines[-1].strip():
        raise SeedError(f"its worker printed no execution id; stderr:\n{_tail(stderr)}")
    return lines[-1].strip()


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "(empty)"
