"""Run demo scenarios: ``python -m localui.demo.worker``.

With ``--scenario NAME`` it runs that one scenario in this process. The execution
id is the last line of stdout, printed and flushed before the run starts, since
the crash scenarios end the process with ``os._exit`` and flush nothing.
Exit status: 0 when the run ended as its scenario says, 17/18/19 for the seeded
crashes, 1 when it ended any other way, 2 for bad arguments.

With ``--pool`` it is one of the seeder's worker processes
(``localui.demo.scenarios``): it imports the SDK once, then reads one JSON request
a line on stdin (``{"scenario": NAME, "source": ID or null}``) and runs each in a
child forked from itself, so a scenario costs no interpreter start and no imports,
and a seeded crash still kills a real process of its own. For each it writes one
JSON line on stdout: ``{"scenario", "exit", "stdout", "stderr"}``, the child's as
above.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localui.backends import is_busy
from localui.backends.urls import is_postgres_url

if TYPE_CHECKING:
    from fastaiagent.checkpointers import SQLiteCheckpointer
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    from localui.demo.scenarios import Scenario

#: Tries of the seeded approval while the SDK's claim meets a busy SQLite store.
_APPROVE_ATTEMPTS = 8


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.pool:
        return _serve_pool(args)
    if args.scenario is None:
        print("pass --scenario NAME, or --pool", file=sys.stderr)
        return 2
    # The SDK caches its configuration on first use, so these go in before
    # anything imports it: traced as the caller says (the demo traces into the
    # store), and nothing defaults to ./.fastaiagent (for a PostgreSQL store the
    # caller points FASTAIAGENT_LOCAL_DB elsewhere).
    os.environ.setdefault("FASTAIAGENT_TRACE_ENABLED", "false")
    if not is_postgres_url(args.store):
        os.environ["FASTAIAGENT_LOCAL_DB"] = args.store

    from localui.demo.scenarios import get_scenario

    try:
        scenario = get_scenario(args.scenario)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    if scenario.fork and args.source is None:
        print(f"scenario {scenario.name!r} forks a run: pass --source ID", file=sys.stderr)
        return 2
    try:
        outcome = asyncio.run(
            _run(scenario, _checkpointer(args.store, args.pg_schema), args.ledger, args.source)
        )
    except Exception as exc:
        print(f"scenario {scenario.name!r} raised {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if outcome != scenario.ends:
        print(
            f"scenario {scenario.name!r} ended {outcome}, expected {scenario.ends}", file=sys.stderr
        )
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m localui.demo.worker", description="Run one demo scenario."
    )
    parser.add_argument(
        "--store", required=True, help="the store to write: a SQLite file or a postgresql:// URL"
    )
    parser.add_argument(
        "--pg-schema",
        default="fastaiagent",
        help="with a postgresql:// store: the schema of the SDK's tables",
    )
    parser.add_argument("--scenario", help="the scenario's name")
    parser.add_argument(
        "--pool", action="store_true", help="run the scenarios named on stdin, one at a time"
    )
    parser.add_argument("--ledger", type=Path, help="append one JSON line per side effect here")
    parser.add_argument("--source", help="the execution id a fork scenario branches from")
    return parser


def _serve_pool(args: argparse.Namespace) -> int:
    """Run each requested scenario in a forked child, one at a time, until stdin ends."""
    os.environ.setdefault("FASTAIAGENT_TRACE_ENABLED", "false")
    if not is_postgres_url(args.store):
        os.environ["FASTAIAGENT_LOCAL_DB"] = args.store
    # What every scenario imports, imported once here for all the children. Nothing
    # here opens a connection or starts a thread, which a fork would not carry over.
    import fastaiagent  # noqa: F401

    import localui.demo.agent  # noqa: F401
    import localui.demo.teams  # noqa: F401

    if is_postgres_url(args.store):
        import fastaiagent.checkpointers.postgres  # noqa: F401
        import psycopg  # noqa: F401

    fixed = ["--store", args.store, "--pg-schema", args.pg_schema]
    if args.ledger is not None:
        fixed += ["--ledger", str(args.ledger)]
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        argv = [*fixed, "--scenario", str(request["scenario"])]
        if request.get("source"):
            argv += ["--source", str(request["source"])]
        code, out, err = _in_child(argv)
        reply = {"scenario": request["scenario"], "exit": code, "stdout": out, "stderr": err}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


def _in_child(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in a forked child: its exit code, stdout and stderr."""
    with tempfile.TemporaryDirectory(prefix="localui-scenario-") as captured:
        out_path, err_path = Path(captured) / "out", Path(captured) / "err"
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                for fd, path in ((1, out_path), (2, err_path)):
                    opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    os.dup2(opened, fd)
                    os.close(opened)
                code = main(argv)
            except BaseException as exc:
                print(f"worker raised {type(exc).__name__}: {exc}", file=sys.stderr)
            finally:
                # The SDK's spans and rows are written as they happen (its local trace
                # store writes on each span's end), so nothing waits for exit handlers.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        return (
            code,
            out_path.read_text(errors="replace") if out_path.exists() else "",
            err_path.read_text(errors="replace") if err_path.exists() else "",
        )


def _announce(execution_id: str) -> None:
    print(execution_id, flush=True)


def _checkpointer(store: str, pg_schema: str) -> SQLiteCheckpointer | PostgresCheckpointer:
    """The SDK's checkpointer for ``store``: its SQLite one, or its PostgreSQL one."""
    if is_postgres_url(store):
        import psycopg
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        checkpointer = PostgresCheckpointer(store, schema=pg_schema)
        # The SDK runs its migrations on a checkpointer's first use, in one transaction
        # that takes exclusive locks on its tables even when there is nothing to do; two
        # processes starting at once can deadlock each other. The demo's processes take
        # their turn under an advisory lock.
        with psycopg.connect(store, autocommit=True) as conn:
            key = f"localui demo setup {pg_schema}"
            conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
            try:
                checkpointer.setup()
            finally:
                conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))
        return checkpointer
    from fastaiagent import SQLiteCheckpointer

    return SQLiteCheckpointer(store)


async def _run(
    scenario: Scenario,
    checkpointer: SQLiteCheckpointer | PostgresCheckpointer,
    ledger: Path | None,
    source: str | None,
) -> str:
    """Run the scenario; return how its run ended (``completed``, ``paused``, ``failed``)."""
    from localui.demo.agent import build_agent

    if scenario.runner != "refund-bot" and not scenario.fork:
        try:
            return await _run_other(scenario, checkpointer)
        finally:
            checkpointer.close()
    if scenario.stop is not None:
        try:
            return await _run_stopped(scenario, checkpointer)
        finally:
            checkpointer.close()
    agent = build_agent(
        checkpointer,
        ledger=ledger,
        model_fails_once=scenario.model_fails_once,
        die_in_tool=scenario.die_in_tool,
        die_waiting_on_model=scenario.die_waiting_on_model,
    )
    try:
        if scenario.fork:
            assert source is not None  # checked by main
            # The fork's id is made inside afork, so it is known only afterwards;
            # no fork scenario crashes, so that is soon enough.
            try:
                result = await agent.afork(
                    source,
                    checkpoint_id=_row_of(checkpointer, source, scenario.fork_from),
                    input=scenario.prompt,
                )
            except RuntimeError:
                if scenario.ends != "failed":
                    raise
                # afork makes the branch's id inside and raised before returning it:
                # the branch is the source's one fork that is not yet announced.
                _announce(_failed_fork_of(checkpointer, source))
                return "failed"
            _announce(result.execution_id)
            return result.status
        assert scenario.prompt is not None
        execution_id = str(uuid.uuid4())
        _announce(execution_id)
        try:
            result = await agent.arun(scenario.prompt, execution_id=execution_id)
        except RuntimeError:
            # The SDK has written the ``failed`` run-end row by now.
            if scenario.ends == "failed":
                return "failed"
            raise
        if scenario.approve_after_pause:
            if result.status != "paused":
                return result.status
            result = await _approve(agent, execution_id, checkpointer)
        return result.status
    finally:
        checkpointer.close()


#: A run stopped by its ``timeout_seconds`` is stopped this long after it starts.
STOP_TIMEOUT_S = 0.5


async def _run_stopped(
    scenario: Scenario, checkpointer: SQLiteCheckpointer | PostgresCheckpointer
) -> str:
    """Run the refund-bot until something stops it inside its refund, as people do:
    ``Agent.cancel`` from another thread, or the run's own ``timeout_seconds``.
    The SDK ends the run ``failed`` with ``run_reason`` ``cancelled`` or ``timeout``."""
    import threading

    from fastaiagent._internal.errors import AgentTimeoutError

    from localui.demo.agent import build_agent

    assert scenario.prompt is not None
    held = threading.Event()
    agent = build_agent(
        checkpointer,
        hold_refund=held,
        timeout_seconds=STOP_TIMEOUT_S if scenario.stop == "timeout" else None,
    )
    execution_id = str(uuid.uuid4())
    _announce(execution_id)
    canceller = None
    if scenario.stop == "cancel":

        def cancel() -> None:
            # Once the refund is under way, from a thread of its own (as an operator's
            # request handler would): the SDK's cancel is safe from any thread.
            if held.wait(_HOLD_WAIT_S):
                agent.cancel(execution_id)

        canceller = threading.Thread(target=cancel, name="demo-cancel", daemon=True)
        canceller.start()
    try:
        result = await agent.arun(scenario.prompt, execution_id=execution_id)
    except AgentTimeoutError:
        # The SDK has written the run-end row (``run_reason="timeout"``) by now.
        return "failed"
    finally:
        if canceller is not None:
            canceller.join()
    # A cancelled run returns ``status="cancelled"``; its run-end row says ``failed``.
    return "failed" if result.status == "cancelled" else str(result.status)


#: How long the cancelling thread waits for the refund to begin.
_HOLD_WAIT_S = 30.0


def _failed_fork_of(checkpointer: SQLiteCheckpointer | PostgresCheckpointer, source: str) -> str:
    """The execution id of the source's fork whose run ended ``failed``."""
    from fastaiagent import SQLiteCheckpointer

    store: Any
    if isinstance(checkpointer, SQLiteCheckpointer):
        from localui.backends.sqlite.store import SQLiteStore

        store = SQLiteStore(str(checkpointer.db_path))
    else:
        from localui.backends.postgres.store import PostgresStore

        store = PostgresStore(
            checkpointer.connection_string, schema=str(checkpointer.schema).strip('"')
        )
    try:
        for fork in store.list_forks(source):
            last = checkpointer.get_last(fork.execution_id)
            if last is not None and last.step_type == "run_end" and last.status == "failed":
                return str(fork.execution_id)
    finally:
        store.close()
    raise LookupError(f"run {source} has no failed fork")


def _row_of(
    checkpointer: SQLiteCheckpointer | PostgresCheckpointer, source: str, node_id: str | None
) -> str | None:
    """The checkpoint id of the source's first row at ``node_id`` (None: the SDK's default)."""
    if node_id is None:
        return None
    for row in checkpointer.list(source, limit=500):
        if row.node_id == node_id:
            return row.checkpoint_id
    raise LookupError(f"run {source} has no row at {node_id}")


async def _run_other(
    scenario: Scenario, checkpointer: SQLiteCheckpointer | PostgresCheckpointer
) -> str:
    """Run a Chain, Supervisor, Swarm or long-agent scenario; return how it ended."""
    from localui.demo import teams

    execution_id = str(uuid.uuid4())
    _announce(execution_id)
    die = scenario.die_in_tool
    try:
        if scenario.runner == "chain":
            chain = teams.build_chain(checkpointer, die_in_refund=die)
            chained = await chain.aexecute({"order_id": "B-7"}, execution_id=execution_id)
            return str(chained.status)
        if scenario.runner == "parcel-chain":
            return await _run_parcel_chain(checkpointer, execution_id)
        assert scenario.prompt is not None
        if scenario.runner == "supervisor":
            runner: Any = teams.build_supervisor(checkpointer, die_in_refund=die)
        elif scenario.runner == "swarm":
            runner = teams.build_swarm(checkpointer, die_in_refund=die)
        else:
            runner = teams.build_long_agent(
                checkpointer,
                fail_at_end=scenario.model_fails_once,
                pause_at_end=scenario.ends == "paused",
            )
        result = await runner.arun(scenario.prompt, execution_id=execution_id)
        return str(result.status)
    except RuntimeError:
        # The SDK has written the ``failed`` run-end row by now.
        if scenario.ends == "failed":
            return "failed"
        raise


async def _run_parcel_chain(
    checkpointer: SQLiteCheckpointer | PostgresCheckpointer, execution_id: str
) -> str:
    """The parcel chain, its courier given less time than the carrier takes: the
    courier's timeout is checked before each of its model calls, so the call after its
    tool stops the chain."""
    from fastaiagent._internal.errors import AgentTimeoutError

    from localui.demo import teams

    chain = teams.build_parcel_chain(
        checkpointer, courier_timeout_s=STOP_TIMEOUT_S, carrier_wait_s=2 * STOP_TIMEOUT_S
    )
    try:
        result = await chain.aexecute({"parcel_id": "P-9"}, execution_id=execution_id)
    except AgentTimeoutError:
        # The SDK has written the chain's ``failed`` run-end row by now.
        return "failed"
    return str(result.status)


async def _approve(
    agent: Any, execution_id: str, checkpointer: SQLiteCheckpointer | PostgresCheckpointer
) -> Any:
    """Approve the paused run, trying again while the SDK's claim meets a busy store.

    On SQLite the SDK claims the pending row in a deferred transaction that reads and
    then deletes; when another process writes in between (the demo's scenarios run side
    by side), the delete fails at once with "database is locked", whatever the busy
    timeout. The transaction is rolled back, so the pause is still there and another try
    is safe; the pending row is checked before each retry, so a failure after the claim
    is never retried.
    """
    from fastaiagent import Resume

    resume_value = Resume(
        approved=True, metadata={"approver": "demo-seed", "reason": "seeded approval"}
    )
    for attempt in range(1, _APPROVE_ATTEMPTS + 1):
        try:
            return await agent.aresume(execution_id, resume_value=resume_value)
        except sqlite3.OperationalError as exc:
            if attempt == _APPROVE_ATTEMPTS or not is_busy(exc):
                raise
            if not _still_pending(checkpointer, execution_id):
                raise
            await asyncio.sleep(0.05 * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _still_pending(
    checkpointer: SQLiteCheckpointer | PostgresCheckpointer, execution_id: str
) -> bool:
    return any(
        p.execution_id == execution_id for p in checkpointer.list_pending_interrupts(limit=10_000)
    )


if __name__ == "__main__":
    sys.exit(main())
