"""``--context``: the ``RunContext`` localui hands a runner's tools when it resumes or forks.

The payout-desk's ``pay`` tool reads the desk it acts for from its context
(``tests/context_runs.py``), so a resume without one would fail in the tool after
the SDK claimed the pause. Its runs are written by a process of their own, on
SQLite and on PostgreSQL; the app acts on them in this process with a factory
whose every call is counted, and the tool writes each payment to a ledger file
naming the clerk of the context it was given.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from context_runs import AGENT_NAME, EXIT_DIED_IN_TOOL, Desk, build_agent, ledger_lines
from helpers import JSON, LOOPBACK_CLIENT, NO_SIGN_IN, card, decide, start_localui

from localui.backends.base import DecisionLog
from localui.contexts import ContextFactory, RunContexts
from localui.records import APPROVAL
from localui.settings import Settings

if TYPE_CHECKING:
    from starlette.testclient import TestClient

CONTEXT_RUNS = Path(__file__).with_name("context_runs.py")
HTMX = {"HX-Request": "true"}


# --- a store of payout-desk runs, on either backend ----------------------------------


@dataclass
class PayoutStore:
    """A fresh store the payout-desk's own processes write into, and SQL on it."""

    #: What the child process and ``localui serve`` are given to reach it.
    store_args: list[str]
    settings_of: dict[str, Any]
    store: str
    ledger: Path
    checkpointer: Callable[[], Any]
    open_log: Callable[[], DecisionLog]
    query: Callable[[str, tuple[Any, ...]], list[dict[str, Any]]]
    query_app: Callable[[str, tuple[Any, ...]], list[dict[str, Any]]]
    workdir: Path

    def write(self, *, paused: str | None = None, crashed: str | None = None) -> None:
        """Runs of the payout-desk, written by a process of its own."""
        command = [sys.executable, str(CONTEXT_RUNS), *self.store_args]
        command += ["--ledger", str(self.workdir / "origin-ledger.jsonl")]
        command += ["--paused", paused] if paused else ["--crashed", str(crashed)]
        done = subprocess.run(
            command,
            cwd=self.workdir,
            env={**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        expected = 0 if paused else EXIT_DIED_IN_TOOL
        assert done.returncode == expected, done.stderr

    def settings(self, **changes: Any) -> Settings:
        changes.setdefault("sign_in", NO_SIGN_IN)
        return Settings(store=self.store, **self.settings_of, **changes)

    def pending(self, execution_id: str) -> bool:
        sql = "SELECT 1 AS one FROM {s}pending_interrupts WHERE execution_id = {p}"
        return bool(self.query(sql, (execution_id,)))

    def nodes(self, execution_id: str) -> list[tuple[str, str]]:
        sql = "SELECT node_id, status FROM {s}checkpoints WHERE execution_id = {p}"
        return sorted((r["node_id"], r["status"]) for r in self.query(sql, (execution_id,)))

    def decisions(self, execution_id: str) -> list[dict[str, Any]]:
        """The app's decision rows of a run (none before the app made its table)."""
        sql = "SELECT kind, outcome FROM {s}localui_decisions WHERE execution_id = {p}"
        try:
            return self.query_app(sql, (execution_id,))
        except Exception as exc:
            if "localui_decisions" in str(exc):
                return []
            raise

    def paid(self) -> list[dict[str, Any]]:
        return ledger_lines(self.ledger)


def sqlite_payouts(tmp_path: Path) -> PayoutStore:
    import sqlite3

    from fastaiagent.checkpointers import SQLiteCheckpointer

    from localui.backends.sqlite.decisions import SQLiteDecisionLog

    path = tmp_path / "local.db"
    workdir = tmp_path / "work"
    workdir.mkdir()

    def query(sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        conn = sqlite3.connect(path)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(sql.format(s="", p="?"), params).fetchall()]
        finally:
            conn.close()

    return PayoutStore(
        store_args=["--store", str(path)],
        settings_of={},
        store=str(path),
        ledger=tmp_path / "ledger.jsonl",
        checkpointer=lambda: SQLiteCheckpointer(str(path)),
        open_log=lambda: SQLiteDecisionLog(path),
        query=query,
        query_app=query,
        workdir=workdir,
    )


@pytest.fixture(params=["sqlite", "postgres"])
def payouts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PayoutStore]:
    if request.param == "sqlite":
        yield sqlite_payouts(tmp_path)
        return
    from conftest import PgRaw, pg_name
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    from localui.backends.postgres.decisions import PostgresDecisionLog

    dsn: str = request.getfixturevalue("pg_dsn")
    schema, app_schema = pg_name("payouts"), pg_name("payouts_ui")

    def pg_query(on: str) -> Callable[[str, tuple[Any, ...]], list[dict[str, Any]]]:
        def run(sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
            return PgRaw(dsn, on).query(sql.format(s="{s}.", p="%s"), params)

        return run

    workdir = tmp_path / "work"
    workdir.mkdir()
    try:
        yield PayoutStore(
            store_args=["--store", dsn, "--pg-schema", schema],
            settings_of={"pg_schema": schema, "pg_app_schema": app_schema},
            store=dsn,
            ledger=tmp_path / "ledger.jsonl",
            checkpointer=lambda: PostgresCheckpointer(dsn, schema=schema),
            open_log=lambda: PostgresDecisionLog(dsn, schema=app_schema),
            query=pg_query(schema),
            query_app=pg_query(app_schema),
            workdir=workdir,
        )
    finally:
        PgRaw(dsn, schema).drop()
        PgRaw(dsn, app_schema).drop()


# --- the factory, and the app acting with it -------------------------------------------


@dataclass
class DeskFactory:
    """A ``--context`` factory whose calls are counted; ``broken`` makes it raise that
    message, ``wrong`` makes it return a plain dict."""

    ledger: Path
    clerk: str = "Fay at the payout desk"
    broken: str | None = None
    wrong: bool = False
    calls: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, *, execution_id: str, runner: str) -> Any:
        from fastaiagent import RunContext

        self.calls.append((execution_id, runner))
        if self.broken is not None:
            raise RuntimeError(self.broken)
        desk = Desk(clerk=self.clerk, ledger=str(self.ledger))
        return {"desk": desk} if self.wrong else RunContext(desk)

    def contexts(self) -> RunContexts:
        # Matched by the runner's name, as ``--context payout-desk=...`` is.
        return RunContexts(
            by_runner={AGENT_NAME: ContextFactory(f"{AGENT_NAME}=desk:make", AGENT_NAME, self)}
        )


@contextmanager
def acting(payouts: PayoutStore, factory: DeskFactory, **settings: Any) -> Iterator[TestClient]:
    """The app over the store with the payout-desk registered and ``factory`` as its
    ``--context``."""
    from conftest import BASE_URL
    from starlette.testclient import TestClient

    from localui.app import create_app

    agent = build_agent(payouts.checkpointer())
    app = create_app(payouts.settings(**settings), agents=[agent], contexts=factory.contexts())
    try:
        with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
            yield client
    finally:
        agent._checkpointer.close()  # the SDK keeps it here and offers no accessor


def in_queue(client: TestClient, execution_id: str) -> bool:
    return any(
        item["execution_id"] == execution_id
        for item in client.get("/approvals.json").json()["approvals"]
    )


# --- approve ------------------------------------------------------------------------------


def test_an_approval_hands_the_tool_the_factorys_context(payouts: PayoutStore) -> None:
    payouts.write(paused="pay-1")
    factory = DeskFactory(payouts.ledger)
    with acting(payouts, factory) as client:
        seen = card(client, "pay-1")["checkpoint_id"]
        answer = decide(client, "pay-1", seen)

        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "completed"
        assert answer.json()["output"] == "Done: paid 250.00 on P-250 by Fay at the payout desk."
        assert not in_queue(client, "pay-1")
    assert factory.calls == [("pay-1", AGENT_NAME)]
    # The tool ran once, on the resume, with the desk the factory made.
    assert payouts.paid() == [
        {
            "order_id": "P-250",
            "amount": 250.0,
            "clerk": "Fay at the payout desk",
            "execution_id": "pay-1",
        }
    ]
    assert ("run_end", "completed") in payouts.nodes("pay-1")
    assert [d["kind"] for d in payouts.decisions("pay-1")] == [APPROVAL]


@pytest.mark.parametrize(
    ("broken", "wrong", "said"),
    [
        (
            "reports <db> is down\nretry later",
            False,
            "payout-desk=desk:make raised RuntimeError: reports <db> is down retry later",
        ),
        (None, True, "payout-desk=desk:make returned dict, not a fastaiagent RunContext"),
    ],
    ids=["raises", "returns-a-dict"],
)
def test_a_failing_factory_refuses_the_approval_and_the_pause_waits(
    payouts: PayoutStore, broken: str | None, wrong: bool, said: str
) -> None:
    payouts.write(paused="pay-2")
    factory = DeskFactory(payouts.ledger, broken=broken, wrong=wrong)
    before = payouts.nodes("pay-2")
    with acting(payouts, factory) as client:
        seen = card(client, "pay-2")["checkpoint_id"]

        refused = decide(client, "pay-2", seen)

        assert refused.status_code == 422, refused.text
        message = refused.json()["error"]["message"]
        assert message.startswith("the run context for 'payout-desk' could not be made: ")
        assert said in message
        assert "\n" not in message
        # A person clicking the card reads the same line, escaped like any refusal.
        page = decide(client, "pay-2", seen, headers=HTMX)
        assert page.status_code == 422
        assert "reports &lt;db&gt; is down" in page.text if broken else "dict" in page.text
        assert "<db>" not in page.text
        # Nothing was claimed: the pause waits in the queue and in the store.
        assert in_queue(client, "pay-2")
        assert payouts.pending("pay-2")
        assert payouts.decisions("pay-2") == []
        assert payouts.nodes("pay-2") == before
        assert payouts.paid() == []
        assert factory.calls == [("pay-2", AGENT_NAME)] * 2

        # Fixed, the same pause is approved.
        factory.broken, factory.wrong = None, False
        answer = decide(client, "pay-2", seen)

        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "completed"
    assert [line["clerk"] for line in payouts.paid()] == ["Fay at the payout desk"]
    assert not payouts.pending("pay-2")


# --- resume a crashed run, and fork it ------------------------------------------------------


def test_a_crashed_run_resumes_and_forks_with_the_context(payouts: PayoutStore) -> None:
    payouts.write(crashed="pay-3")
    factory = DeskFactory(payouts.ledger, broken="no desk today")
    with acting(payouts, factory) as client:
        plan = client.get("/runs/pay-3.json").json()["resume"]
        assert (plan["shape"], plan["tool"]) == ("tool", "pay")
        form = {"checkpoint_id": plan["checkpoint_id"], "actor": "Ops", "confirm": "yes"}

        refused = client.post("/runs/pay-3/resume", data=form, headers=JSON)
        assert refused.status_code == 422
        assert "RuntimeError: no desk today" in refused.json()["error"]["message"]
        assert payouts.decisions("pay-3") == []
        no_fork = client.post("/runs/pay-3/fork", data={"input": "pay order F-30 30"}, headers=JSON)
        assert no_fork.status_code == 422
        assert "no desk today" in no_fork.json()["error"]["message"]
        assert payouts.paid() == []

        factory.broken = None
        resumed = client.post("/runs/pay-3/resume", data=form, headers=JSON)

        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["output"] == "Done: paid 40.00 on C-40 by Fay at the payout desk."

        forked = client.post("/runs/pay-3/fork", data={"input": "pay order F-30 30"}, headers=JSON)

        assert forked.status_code == 200, forked.text
        branch = forked.json()["new_execution_id"]
        assert branch and branch != "pay-3"
    # The factory is asked for the run acted on; a fork's is the run it branches from.
    assert factory.calls == [("pay-3", AGENT_NAME)] * 4
    # The crash-resumed tool and the branch's own: both with the factory's desk (the SDK
    # gives neither path's tool ``ctx.run``, so the branch is told by its order).
    assert [(line["order_id"], line["clerk"]) for line in payouts.paid()] == [
        ("C-40", "Fay at the payout desk"),
        ("F-30", "Fay at the payout desk"),
    ]
    assert ("run_end", "completed") in payouts.nodes(branch)


# --- a decision whose process died, carried out by the recovery sweep --------------------


def test_the_recovery_sweep_hands_the_tool_the_context(payouts: PayoutStore) -> None:
    import time

    payouts.write(paused="pay-4")
    with acting(payouts, DeskFactory(payouts.ledger)) as client:
        # Shown once, so the app made its decision table.
        seen = card(client, "pay-4")["checkpoint_id"]
    log = payouts.open_log()
    try:
        # What a process killed right after it claimed the decision leaves behind.
        claim = log.claim(
            kind=APPROVAL,
            execution_id="pay-4",
            checkpoint_id=seen,
            approved=True,
            actor="Cy",
            reason="",
            still_pending=lambda: True,
            metadata={"approver": "Cy", "reason": ""},
            agent=AGENT_NAME,
        )
        assert claim.won
    finally:
        log.close()
    factory = DeskFactory(payouts.ledger, clerk="the desk of whoever recovers")
    with acting(payouts, factory, claim_lease_seconds=1.0):
        deadline = time.monotonic() + 60
        while ("run_end", "completed") not in payouts.nodes("pay-4"):
            assert time.monotonic() < deadline, "the sweep did not carry the decision out"
            time.sleep(0.2)
    assert factory.calls == [("pay-4", AGENT_NAME)]
    assert [(line["clerk"], line["execution_id"]) for line in payouts.paid()] == [
        ("the desk of whoever recovers", "pay-4")
    ]


# --- localui serve --context ---------------------------------------------------------


def empty_store(tmp_path: Path) -> Path:
    """A store as the SDK creates it, with no run in it yet."""
    from fastaiagent.checkpointers import SQLiteCheckpointer

    path = tmp_path / "empty.db"
    checkpointer = SQLiteCheckpointer(str(path))
    checkpointer.setup()
    checkpointer.close()
    return path


def serve_args(store: Path, *context: str) -> list[str]:
    args = ["serve", "--store", str(store), "--no-auth"]
    args += ["--agents", f"{CONTEXT_RUNS}:served_agent"]
    for spec in context:
        args += ["--context", spec]
    return args


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ("nosuchmodule:make_context", ("cannot import nosuchmodule", "ModuleNotFoundError")),
        (f"{CONTEXT_RUNS}:no_such_factory", ("has no attribute 'no_such_factory'",)),
        (f"{CONTEXT_RUNS}:NOT_CALLABLE", ("str is not callable",)),
        (f"{CONTEXT_RUNS}:takes_no_keywords", ("cannot be called as takes_no_keywords(",)),
        (f"nobody={CONTEXT_RUNS}:make_context", ("no runner named 'nobody'", "'payout-desk'")),
        ("make_context", ("expected MODULE:ATTR",)),
    ],
    ids=[
        "unknown-module",
        "unknown-attribute",
        "not-callable",
        "wrong-signature",
        "no-runner",
        "malformed",
    ],
)
def test_serve_refuses_a_bad_context_spec(
    tmp_path: Path, spec: str, fragments: tuple[str, ...]
) -> None:
    done = run_serve(tmp_path, serve_args(empty_store(tmp_path), spec))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"localui: --context {spec!r}: "), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    assert "serving" not in done.stdout


def run_serve(cwd: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localui", *args],
        cwd=cwd,
        env={**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_serve_refuses_a_second_default(tmp_path: Path) -> None:
    spec = f"{CONTEXT_RUNS}:make_context"
    done = run_serve(tmp_path, serve_args(empty_store(tmp_path), spec, spec))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "is already the default; name the runner as RUNNER=MODULE:FACTORY" in line


def test_serve_with_a_context_approves_through_it(tmp_path: Path) -> None:
    """``localui serve --agents ... --context payout-desk=...`` as a person starts it: the
    pause approved over HTTP reaches the tool with the factory's desk."""
    payouts = sqlite_payouts(tmp_path)
    payouts.write(paused="pay-5")
    server = start_localui(
        serve_args(Path(payouts.store), f"{AGENT_NAME}={CONTEXT_RUNS}:make_context"),
        cwd=payouts.workdir,
        log=tmp_path / "server.log",
        env={
            **os.environ,
            "FASTAIAGENT_TRACE_ENABLED": "false",
            "PAYOUT_LEDGER": str(payouts.ledger),
        },
    )
    try:
        assert f"run context for {AGENT_NAME}: {AGENT_NAME}={CONTEXT_RUNS}:make_context" in (
            server.output()
        )
        with httpx.Client(base_url=server.url, timeout=60) as client:
            seen = card(client, "pay-5")["checkpoint_id"]
            answer = decide(client, "pay-5", seen)
    finally:
        server.stop()
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"] == "Done: paid 250.00 on P-250 by cli:payout-desk."
    assert [line["clerk"] for line in payouts.paid()] == ["cli:payout-desk"]
