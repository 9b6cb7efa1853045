"""Crash-safe approvals: the decision record keeps exactly what a decision hands the
tool, on SQLite and on PostgreSQL, so a process that takes over can carry it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from helpers import TEST_TOKEN, LocalServer, card, decide, start_localui

from localui import runs
from localui.backends.base import DecisionLog
from localui.backends.postgres.decisions import PostgresDecisionLog
from localui.backends.sqlite.decisions import SQLiteDecisionLog
from localui.records import APPROVAL, Decision

if TYPE_CHECKING:
    from conftest import ActingClientFactory, Ledger, PgStore
    from starlette.testclient import TestClient


# --- one interface over both stores -------------------------------------------------

#: ``localui_decisions`` before it kept metadata; each backend fills in its own types.
OLD_TABLE = (
    "CREATE TABLE {t} (id {id}, kind TEXT NOT NULL, execution_id TEXT NOT NULL,"
    " checkpoint_id TEXT NOT NULL, approved {approved}, actor TEXT NOT NULL,"
    " reason TEXT NOT NULL DEFAULT '', decided_at {at}, outcome TEXT, detail TEXT,"
    " finished_at {fin}, UNIQUE (kind, execution_id, checkpoint_id))"
)


@dataclass
class Desk:
    """An acting app over a fresh copy of the seeded runs, and how to open its decision
    record directly (``writable=False`` as a read-only server opens it)."""

    client: TestClient
    open_log: Callable[..., DecisionLog]
    #: Runs plain SQL on the decision table's database (``{t}`` is the table).
    sql: Callable[[str], None]
    #: The table as localui made it before it kept metadata.
    old_table: str


@pytest.fixture(params=["sqlite", "postgres"])
def desk(
    request: pytest.FixtureRequest, ledger: Ledger, tmp_path: Path
) -> Iterator[Callable[[], Desk]]:
    logs: list[DecisionLog] = []

    def keep(log: DecisionLog) -> DecisionLog:
        logs.append(log)
        return log

    def make() -> Desk:
        if request.param == "sqlite":
            store_path: Path = request.getfixturevalue("store_copy")
            acting: ActingClientFactory = request.getfixturevalue("make_acting_client")

            def run_sqlite(text: str) -> None:
                with sqlite3.connect(store_path) as conn:
                    conn.executescript(text.replace("{t}", "localui_decisions"))

            return Desk(
                acting(store_path, ledger),
                lambda writable=True: keep(SQLiteDecisionLog(store_path, writable=writable)),
                run_sqlite,
                OLD_TABLE.format(
                    id="INTEGER PRIMARY KEY AUTOINCREMENT",
                    approved="INTEGER",
                    at="TEXT NOT NULL",
                    fin="TEXT",
                    t="{t}",
                ),
            )
        pg: PgStore = request.getfixturevalue("pg_store")
        make_pg = request.getfixturevalue("make_pg_client")

        def run_pg(text: str) -> None:
            pg.app_raw.execute(text.replace("{t}", f"{pg.app_schema}.localui_decisions"))

        return Desk(
            make_pg(pg, ledger),
            lambda writable=True: keep(
                PostgresDecisionLog(pg.dsn, schema=pg.app_schema, writable=writable)
            ),
            run_pg,
            OLD_TABLE.format(
                id="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
                approved="BOOLEAN",
                at="TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()",
                fin="TIMESTAMPTZ",
                t="{t}",
            ),
        )

    yield make
    for log in logs:
        log.close()


def _claim(log: DecisionLog, metadata: dict[str, Any] | None) -> Any:
    return log.claim(
        kind=APPROVAL,
        execution_id="run-old",
        checkpoint_id="cp-new",
        approved=True,
        actor="Bea",
        reason="",
        still_pending=lambda: True,
        metadata=metadata,
    )


# --- the metadata a decision hands the tool, recorded --------------------------------


def test_a_decision_records_the_resume_metadata_it_handed_the_tool(
    desk: Callable[[], Desk],
) -> None:
    made = desk()
    run = next(
        item["execution_id"]
        for item in made.client.get("/approvals.json").json()["approvals"]
        if item["node_id"].endswith("tool:refund")
    )
    response = decide(made.client, run, card(made.client, run)["checkpoint_id"], reason="ok")
    assert response.status_code == 200, response.text
    [decision] = made.open_log().list_for_run(run)
    assert decision.metadata == {"approver": "Ann Approver", "reason": "ok"}


def test_an_old_table_reads_read_only_and_is_migrated_when_written(
    desk: Callable[[], Desk],
) -> None:
    made = desk()
    # The table as localui made it before it kept metadata, with one decision in it.
    made.sql("DROP TABLE IF EXISTS {t}")
    made.sql(made.old_table)
    made.sql(
        "INSERT INTO {t} (kind, execution_id, checkpoint_id, approved, actor, decided_at,"
        " outcome) VALUES ('approval', 'run-old', 'cp-1', TRUE, 'Ann',"
        " '2026-01-01T00:00:00+00:00', 'completed')"
    )

    [old] = made.open_log(writable=False).list_for_run("run-old")
    assert (old.actor, old.outcome, old.metadata) == ("Ann", "completed", None)

    writer = made.open_log()
    claim = _claim(writer, {"approver": "Bea", "reason": "", "limit": 3})
    assert claim.won
    assert [(d.actor, d.metadata) for d in writer.list_for_run("run-old")] == [
        ("Ann", None),
        ("Bea", {"approver": "Bea", "limit": 3, "reason": ""}),
    ]


# --- kill -9 of a served localui mid-approval ----------------------------------------

#: The agent the served processes load, and the test builds its pauses with.
CRASH_AGENT = Path(__file__).resolve().parent.parent / "bench" / "crash_agent.py"
#: A short lease, so a test waits seconds, not the default half-minute, for a dead
#: process's claim to be taken over.
LEASE = "2"
#: How long a decision left by a killed process may take to be carried out.
RECOVERY_TIMEOUT_S = 60.0
APPROVER = "Ann Approver"


@dataclass
class CrashStore:
    """A store of the test's own holding fresh payout-bot pauses, with what a served
    localui needs to act on it and the SDK's own reads as ground truth."""

    kind: str
    store: str
    store_args: list[str]
    env: dict[str, str]
    workdir: Path
    ledger: Path
    runs: list[str]
    sdk: Any
    open_log: Callable[[], DecisionLog]
    #: What ``Settings`` needs besides ``store`` to serve it in this process.
    settings_of: dict[str, str]

    def serve(self, name: str, holds: Path | None = None) -> LocalServer:
        env = dict(self.env)
        env["CRASH_HOLDS"] = str(holds or self.workdir / f"holds-{name}")
        Path(env["CRASH_HOLDS"]).mkdir(exist_ok=True)
        return start_localui(
            [
                "serve",
                *self.store_args,
                "--agents",
                f"{CRASH_AGENT}:payout_bot",
                "--no-auth",
                "--claim-lease",
                LEASE,
            ],  # fmt: skip
            cwd=self.workdir,
            log=self.workdir / f"{name}-{time.monotonic_ns()}.log",
            env=env,
            ready="/approvals.json",
        )

    def effects(self, effect: str, order_run: str) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        lines = [json.loads(x) for x in self.ledger.read_text().splitlines() if x.strip()]
        order = order_run.split("-")[1]
        return [x for x in lines if x["effect"] == effect and x["order_id"] == order]

    def run_ends(self, run: str) -> list[str]:
        return [c.status for c in self.sdk.list(run, limit=500) if c.step_type == "run_end"]

    def waiting(self) -> set[str]:
        return {p.execution_id for p in self.sdk.list_pending_interrupts(limit=1000)}


@pytest.fixture(params=["sqlite", "postgres"])
def crash_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CrashStore]:
    from bench import crash_agent

    workdir = tmp_path / "crash"
    workdir.mkdir()
    ledger = workdir / "ledger.jsonl"
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false", "CRASH_LEDGER": str(ledger)}
    env["PYTHONPATH"] = os.pathsep.join([str(CRASH_AGENT.parent.parent), env.get("PYTHONPATH", "")])
    cleanup: Callable[[], None]
    if request.param == "sqlite":
        path = workdir / "local.db"
        env.update(CRASH_STORE=str(path), FASTAIAGENT_LOCAL_DB=str(path))
        store_args = ["--store", str(path)]
        settings_of: dict[str, str] = {}

        def open_log() -> DecisionLog:
            return SQLiteDecisionLog(path)

        def cleanup() -> None:
            pass
    else:
        from conftest import PgRaw, pg_name

        dsn: str = request.getfixturevalue("pg_dsn")
        schema, app_schema = pg_name("crash"), pg_name("crash_ui")
        env.update(CRASH_STORE=dsn, CRASH_SCHEMA=schema)
        store_args = ["--store", dsn, "--pg-schema", schema, "--pg-app-schema", app_schema]
        settings_of = {"pg_schema": schema, "pg_app_schema": app_schema}

        def open_log() -> DecisionLog:
            return PostgresDecisionLog(dsn, schema=app_schema)

        def cleanup() -> None:
            PgRaw(dsn, schema).drop()
            PgRaw(dsn, app_schema).drop()

    for key in ("CRASH_STORE", "CRASH_SCHEMA", "CRASH_LEDGER"):
        if key in env:
            monkeypatch.setenv(key, env[key])
    agent = crash_agent.payout_bot()
    sdk = agent._checkpointer  # the SDK keeps it here and offers no accessor
    sdk.setup()
    try:
        runs = [asyncio.run(crash_agent.pause(agent, f"O{i}")) for i in range(1, 5)]
        yield CrashStore(
            request.param,
            env["CRASH_STORE"],
            store_args,
            env,
            workdir,
            ledger,
            runs,
            sdk,
            open_log,
            settings_of,
        )
    finally:
        sdk.close()
        cleanup()


def _post_in_background(server: LocalServer, run: str, checkpoint_id: str) -> threading.Thread:
    """Approve as a person does; the answer never comes when the server is killed."""

    def post() -> None:
        with contextlib.suppress(httpx.HTTPError), httpx.Client(base_url=server.url) as client:
            decide(client, run, checkpoint_id, approver=APPROVER, reason="ok", headers=None)

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def _wait_for(path: Path, server: LocalServer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path.name} was never reached:\n{server.output()}", pytrace=False)
        time.sleep(0.05)


def _kill(server: LocalServer) -> None:
    """``kill -9``: no shutdown, no clean-up, no last write."""
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    server.stop()


def _wait_until_decided(crash: CrashStore, run: str, server: LocalServer) -> Decision:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    log = crash.open_log()
    try:
        while time.monotonic() < deadline:
            recorded = [d for d in log.list_for_run(run) if d.kind == APPROVAL]
            if recorded and recorded[-1].outcome is not None:
                return recorded[-1]
            time.sleep(0.2)
    finally:
        log.close()
    pytest.fail(f"the decision on {run} was never carried out:\n{server.output()}", pytrace=False)


def _card(server: LocalServer, run: str) -> dict[str, Any]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        return card(client, run)


@pytest.mark.parametrize(
    ("point", "rearmed", "tool_runs"),
    [
        # Claimed by localui, not yet by the SDK: the pending row is still there.
        ("before-sdk-claim", False, 1),
        # The SDK took the pending row; the tool had not run: an orphan until re-armed.
        ("after-sdk-claim", True, 1),
        # Inside the tool, interrupt() had returned: it runs again from the top.
        ("after-interrupt", True, 1),
        # The payout was made (and cached) before the kill: the rerun finds it cached.
        ("after-effect", True, 2),
    ],
)
def test_a_killed_approval_is_carried_out_once_after_a_restart(
    crash_store: CrashStore, point: str, rearmed: bool, tool_runs: int
) -> None:
    crash = crash_store
    run, *others = crash.runs
    server = crash.serve("first")
    holds = crash.workdir / "holds-first"
    (holds / point).write_text("")
    shown = _card(server, run)
    _post_in_background(server, run, shown["checkpoint_id"])
    _wait_for(holds / f"{point}.reached", server)
    _kill(server)
    (holds / point).unlink()

    again = crash.serve("again")
    try:
        decision = _wait_until_decided(crash, run, again)
    finally:
        again.stop()

    assert (decision.outcome, decision.actor, decision.approved) == ("completed", APPROVER, True)
    # The operator watching the restarted server is told what it did on its own.
    told = f"localui: carried out decision {decision.id} on {run}, left by a process that died"
    assert told in again.output()
    assert decision.metadata == {"approver": APPROVER, "reason": "ok"}
    assert (decision.rearmed_checkpoint_id is not None) == rearmed
    # The SDK's rows: the run ended once, nothing waits, the other pauses still wait.
    assert crash.run_ends(run) == ["completed"]
    assert crash.waiting() == set(others)
    # The recorded decision reached the tool, and the payout was made once.
    ran = crash.effects("tool_ran", run)
    assert [(r["approved"], r["metadata"]) for r in ran] == [(True, decision.metadata)] * tool_runs
    assert len(crash.effects("pay_out", run)) == 1
    log = crash.open_log()
    try:
        assert [d.id for d in log.list_for_run(run)] == [decision.id]
    finally:
        log.close()


def test_a_kill_before_the_claim_leaves_the_pause_waiting(crash_store: CrashStore) -> None:
    crash = crash_store
    run = crash.runs[0]
    server = crash.serve("first")
    shown = _card(server, run)
    _kill(server)

    again = crash.serve("again")
    try:
        assert _card(again, run)["checkpoint_id"] == shown["checkpoint_id"]
        assert crash.waiting() == set(crash.runs)
        with httpx.Client(base_url=again.url, timeout=60) as client:
            answer = decide(client, run, shown["checkpoint_id"], approver=APPROVER)
        assert answer.status_code == 200, answer.text
    finally:
        again.stop()
    assert crash.run_ends(run) == ["completed"]
    assert len(crash.effects("pay_out", run)) == 1


def test_the_other_process_takes_over_when_the_one_holding_the_claim_dies(
    crash_store: CrashStore,
) -> None:
    crash = crash_store
    run = crash.runs[0]
    holder, other = crash.serve("holder"), crash.serve("other")
    try:
        holds = crash.workdir / "holds-holder"
        (holds / "after-sdk-claim").write_text("")
        _post_in_background(holder, run, _card(holder, run)["checkpoint_id"])
        _wait_for(holds / "after-sdk-claim.reached", holder)
        _kill(holder)
        decision = _wait_until_decided(crash, run, other)
    finally:
        holder.stop()
        other.stop()
    assert (decision.outcome, decision.rearmed_checkpoint_id is not None) == ("completed", True)
    assert crash.run_ends(run) == ["completed"]
    assert len(crash.effects("pay_out", run)) == 1
    assert crash.waiting() == set(crash.runs[1:])


# --- the operator's "Re-open this pause for a decision" ------------------------------


@contextlib.contextmanager
def _app(crash: CrashStore, **settings: Any) -> Iterator[TestClient]:
    """The app over the crash store in this process, sign-in on (the start-up token is
    an operator's), the payout-bot registered."""
    from conftest import BASE_URL
    from helpers import LOOPBACK_CLIENT, sign_in_settings
    from starlette.testclient import TestClient

    from bench import crash_agent
    from localui.app import create_app
    from localui.settings import Settings

    agent = crash_agent.payout_bot()
    made = Settings(store=crash.store, sign_in=sign_in_settings(), **crash.settings_of, **settings)
    try:
        with TestClient(
            create_app(made, agents=[agent]), base_url=BASE_URL, client=LOOPBACK_CLIENT
        ) as client:
            yield client
    finally:
        agent._checkpointer.close()


def _as(token: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Accept": "application/json", **more}


def _orphan(crash: CrashStore, run: str) -> str:
    """What a process that claimed the pause through the SDK and died leaves: the
    paused row newest, its pending row gone. The paused row's id."""
    assert crash.sdk.delete_pending_interrupt_atomic(run) is not None
    return str(crash.sdk.get_last(run).checkpoint_id)


def _reopen(client: TestClient, run: str, checkpoint_id: str, headers: dict[str, str]) -> Any:
    return client.post(
        f"/runs/{run}/reopen", data={"checkpoint_id": checkpoint_id}, headers=headers
    )


def test_an_operator_reopens_an_orphaned_pause_once_and_it_is_decided(
    crash_store: CrashStore,
) -> None:
    from helpers import TEST_TOKEN, all_at_once

    from localui.backends.users import new_token, token_hash

    crash = crash_store
    run = crash.runs[0]
    paused = _orphan(crash, run)
    with _app(crash) as client:
        users = client.app.state.localui.backend.users(writable=True)  # type: ignore[attr-defined]
        approver = new_token()
        users.add("Bea", "approver", token_hash(approver))
        users.close()
        operator = _as(TEST_TOKEN)

        page = client.get(f"/runs/{run}.json", headers=operator).json()
        assert (page["state"], page["orphan"]["checkpoint_id"]) == ("orphaned", paused)
        assert page["orphan"]["carried_by"] is None
        assert "runs again from the top" in page["orphan"]["rerun"]
        html = client.get(f"/runs/{run}", headers={"Authorization": f"Bearer {TEST_TOKEN}"})
        assert "Re-open this pause for a decision" in html.text

        refused = _reopen(client, run, paused, _as(approver))
        assert refused.status_code == 403 and "needs operator" in refused.json()["error"]["message"]
        cross = _reopen(client, run, paused, _as(TEST_TOKEN, Origin="http://evil.example"))
        assert cross.status_code == 403
        assert client.get(f"/runs/{run}/reopen", headers=operator).status_code == 405
        assert run not in crash.waiting()

        answers = all_at_once(4, lambda _: _reopen(client, run, paused, operator))
        assert sorted(a.status_code for a in answers) == [200, 409, 409, 409]
        assert crash.waiting() == set(crash.runs)
        shown = next(
            item
            for item in client.get("/approvals.json", headers=operator).json()["approvals"]
            if item["execution_id"] == run
        )
        assert shown["checkpoint_id"] != paused
        decided = decide(client, run, shown["checkpoint_id"], headers=operator)
        assert decided.status_code == 200, decided.text
        assert decided.json()["status"] == "completed"
    assert crash.run_ends(run) == ["completed"]
    assert len(crash.effects("pay_out", run)) == 1


def test_reopen_refuses_a_run_that_moved_on_a_waiting_pause_and_read_only(
    crash_store: CrashStore,
) -> None:
    from helpers import TEST_TOKEN

    crash = crash_store
    done, waiting, orphan = crash.runs[:3]
    operator = _as(TEST_TOKEN)
    orphaned_row = _orphan(crash, orphan)
    with _app(crash) as client:
        seen = next(
            item["checkpoint_id"]
            for item in client.get("/approvals.json", headers=operator).json()["approvals"]
            if item["execution_id"] == done
        )
        assert decide(client, done, seen, headers=operator).status_code == 200
        moved = _reopen(client, done, seen, operator)
        assert moved.status_code == 409 and "moved on" in moved.json()["error"]["message"]
        waiting_row = str(crash.sdk.get_last(waiting).checkpoint_id)
        still = _reopen(client, waiting, waiting_row, operator)
        assert still.status_code == 409 and "already waiting" in still.json()["error"]["message"]
        assert _reopen(client, orphan, "", operator).status_code == 400
    with _app(crash, read_only=True) as reader:
        assert _reopen(reader, orphan, orphaned_row, operator).status_code == 403
    assert crash.run_ends(done) == ["completed"]
    assert crash.waiting() == {waiting, *crash.runs[3:]}


def test_an_orphan_a_dead_process_decided_is_carried_out_not_reopened(
    crash_store: CrashStore,
) -> None:
    from helpers import TEST_TOKEN

    crash = crash_store
    run = crash.runs[0]
    paused = str(crash.sdk.get_last(run).checkpoint_id)
    log = crash.open_log()
    try:
        # Exactly what a process killed right after the SDK's claim leaves behind.
        claim = log.claim(
            kind=APPROVAL,
            execution_id=run,
            checkpoint_id=paused,
            approved=True,
            actor="Cy",
            reason="",
            still_pending=lambda: True,
            metadata={"approver": "Cy", "reason": ""},
        )
        assert claim.won
    finally:
        log.close()
    _orphan(crash, run)
    with _app(crash, claim_lease_seconds=600.0) as client:
        # Its process may still be alive for all this one knows: nobody re-opens it.
        page = client.get(f"/runs/{run}.json", headers=_as(TEST_TOKEN)).json()
        assert page["state"] == "orphaned"
        assert "Cy approved this pause" in page["orphan"]["carried_by"]
        refused = _reopen(client, run, paused, _as(TEST_TOKEN))
        assert refused.status_code == 409 and "carries that" in refused.json()["error"]["message"]
    assert crash.waiting() == set(crash.runs[1:])
    with _app(crash, claim_lease_seconds=1.0):
        # Silent for longer than the lease: this process carries the decision out.
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while crash.run_ends(run) != ["completed"] and time.monotonic() < deadline:
            time.sleep(0.2)
    assert crash.run_ends(run) == ["completed"]
    [tool_ran] = crash.effects("tool_ran", run)
    assert tool_ran["metadata"] == {"approver": "Cy", "reason": ""}


def test_a_pause_rearmed_for_a_recorded_decision_is_not_given_to_anyone_else(
    crash_store: CrashStore,
) -> None:
    crash = crash_store
    run = crash.runs[0]
    paused = str(crash.sdk.get_last(run).checkpoint_id)
    log = crash.open_log()
    with _app(crash, claim_lease_seconds=600.0) as client:
        actions = client.app.state.localui.actions  # type: ignore[attr-defined]
        claim = log.claim(
            kind=APPROVAL,
            execution_id=run,
            checkpoint_id=paused,
            approved=False,
            actor="Cy",
            reason="over budget",
            still_pending=lambda: True,
            metadata={"approver": "Cy", "reason": "over budget"},
        )
        _orphan(crash, run)
        # Half-way through a recovery: the pause written again, not yet resumed.
        rearmed = "rearmed-" + paused
        log.set_rearmed(claim.decision.id, rearmed)
        rows = crash.sdk.list(run, limit=500)
        actions.pauses.rearm(run, paused, runs.run_owner(actions.store.list_rows(run)), rearmed)
        assert len(crash.sdk.list(run, limit=500)) == len(rows) + 1
        assert run in crash.waiting()

        answer = decide(client, run, rearmed, headers=_as(TEST_TOKEN))
        assert answer.status_code == 409, answer.text
        assert "being rejected by Cy" in answer.json()["error"]["message"]
    log.close()
    assert run in crash.waiting()
    assert crash.effects("tool_ran", run) == []
