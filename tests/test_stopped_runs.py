"""Runs stopped on purpose: cancelled from another thread, or out of their timeout_seconds.

The SDK ends such a run ``failed`` and saves why on its run-end row
(``state_snapshot["run_reason"]``: ``cancelled`` or ``timeout``). The stores here are
written by the real SDK: the demo's ``cancelled`` and ``timed-out`` agent runs (the
refund-bot cancelled by ``Agent.cancel`` from a thread while its refund waits, and
stopped by a ``timeout_seconds`` of 0.5 s), a plain ``failed`` run and a pause beside
them, and on SDKs that stop chains (1.93 on) a chain cancelled inside a node and one
whose agent node ran out of time. The agents' tests also run on the lowest SDK the
project declares (``floor``, 1.91, where agents can be stopped); the chains' do not.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import BASE_URL, PgRaw, backup, copy_pg_store, pg_name, sdk_version, text_of
from helpers import JSON, LOOPBACK_CLIENT, NO_SIGN_IN
from starlette.testclient import TestClient

from bench.receiver import Receiver
from localui import runs
from localui.app import create_app
from localui.backends.sqlite.index import schema as sqlite_index
from localui.demo.agent import AGENT_NAME, build_agent
from localui.demo.scenarios import get_scenario, seed
from localui.demo.teams import record
from localui.notify import events as ev
from localui.settings import CANCELLED_FAILURES, Notifications, Settings

#: Every test reads the same runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.postgres

#: Chains (and swarms) are stopped by cancel and a node's timeout from SDK 1.93 on.
CHAINS = sdk_version() >= (1, 93)

SCENARIOS = ("cancelled", "timed-out", "failed", "paused-1")
#: Which runs end in which state (the chains' only where the SDK writes them).
STATES = {
    "cancelled": runs.CANCELLED,
    "timed-out": runs.TIMED_OUT,
    "failed": runs.FAILED,
    "paused-1": runs.PAUSED,
    **(
        {
            "chain-cancelled": runs.CANCELLED,
            "chain-timed-out": runs.TIMED_OUT,
            "courier-timed-out": runs.TIMED_OUT,
        }
        if CHAINS
        else {}
    ),
}
COUNTS = Counter(STATES.values())
AGENT_RUNS = ("cancelled", "timed-out")
#: The SDK's ``run_reason`` of each (``fastaiagent.agent.run_control``).
SDK_REASONS = {"cancelled": "cancelled", "timed-out": "timeout"}
CHAIN_RUNS = ("chain-cancelled", "chain-timed-out") if CHAINS else ()

#: Cancelled inside its tool node; its agent-node twin runs out of its courier's time.
CHAIN_NAME = "parcel-chain"
COURIER_CHAIN = "courier-chain"
COURIER = "courier"


def build_parcel_chain(
    checkpointer: Any,
    *,
    events: list[str] | None = None,
    held: threading.Event | None = None,
    wait_s: float = 0.0,
    courier_timeout_s: float | None = None,
    courier: bool = False,
) -> Any:
    """Two nodes: look a parcel up, then wait ``wait_s`` on the carrier (an await the SDK
    can stop) in a tool node, or with ``courier`` in an agent node whose agent calls
    that tool, with ``courier_timeout_s`` as its timeout_seconds."""
    from fastaiagent import Agent, Chain, tool
    from fastaiagent.agent.agent import AgentConfig
    from fastaiagent.llm.message import MessageRole
    from fastaiagent.testing import FunctionModel

    name = COURIER_CHAIN if courier else CHAIN_NAME

    @tool(name="lookup_parcel", register=False)
    def lookup_parcel(parcel_id: str) -> str:
        """Find a parcel."""
        record(events, f"tool:{name}:lookup_parcel")
        return f"parcel {parcel_id}: at the depot"

    @tool(name="wait_for_carrier", register=False)
    async def wait_for_carrier(parcel_id: str) -> str:
        """Wait for the carrier to collect a parcel."""
        record(events, f"tool:{name}:wait_for_carrier")
        if held is not None:
            held.set()
        await asyncio.sleep(wait_s)
        return f"parcel {parcel_id} collected"

    def respond(messages: list[Any]) -> str | tuple[str, list[dict[str, Any]]]:
        record(events, f"model:{COURIER}")
        if messages and messages[-1].role == MessageRole.tool:
            return "Collected."
        call = {"id": "call_wait", "name": "wait_for_carrier", "arguments": {"parcel_id": "P-9"}}
        return "", [call]

    mapping = {"parcel_id": "{{state.parcel_id}}"}
    chain = Chain(name, checkpointer=checkpointer)
    chain.add_node("step_1_lookup", tool=lookup_parcel, input_mapping=mapping)
    if courier:
        agent = Agent(
            name=COURIER,
            system_prompt="You hand parcels to the carrier.",
            llm=FunctionModel(respond, model="courier-demo"),
            tools=[wait_for_carrier],
            checkpointer=checkpointer,
            config=AgentConfig(timeout_seconds=courier_timeout_s),
        )
        chain.add_node("step_2_collect", agent=agent)
    else:
        chain.add_node("step_2_collect", tool=wait_for_carrier, input_mapping=mapping)
    chain.connect("step_1_lookup", "step_2_collect")
    return chain


def write_stopped_chains(checkpointer: Any) -> dict[str, str]:
    """A chain cancelled from a thread inside a node, and one whose agent node ran out
    of its timeout_seconds, written by the SDK into ``checkpointer``."""
    if not CHAINS:
        return {}
    from fastaiagent._internal.errors import AgentTimeoutError

    written: dict[str, str] = {}
    held = threading.Event()
    chain = build_parcel_chain(checkpointer, held=held, wait_s=60.0)
    cancelled = written["chain-cancelled"] = str(uuid.uuid4())
    canceller = threading.Thread(target=lambda: held.wait(30) and chain.cancel(cancelled))
    canceller.start()
    result = asyncio.run(chain.aexecute({"parcel_id": "P-9"}, execution_id=cancelled))
    canceller.join()
    assert result.status == "cancelled"

    # The courier's own timeout is checked before each of its model calls: its tool
    # outlasts it, and the next call stops the chain.
    slow = build_parcel_chain(checkpointer, wait_s=0.4, courier_timeout_s=0.2, courier=True)
    timed_out = written["chain-timed-out"] = str(uuid.uuid4())
    with pytest.raises(AgentTimeoutError) as stopped:
        asyncio.run(slow.aexecute({"parcel_id": "P-9"}, execution_id=timed_out))
    # The agent node is a run of its own, which timed out too; the error names it.
    found = re.search(r"execution_id=([0-9a-f-]{36})", str(stopped.value))
    assert found is not None, stopped.value
    written["courier-timed-out"] = found.group(1)
    return written


# --- stores -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Seeds:
    sqlite: Path
    sqlite_runs: Mapping[str, str]
    dsn: str
    pg_schema: str
    pg_runs: Mapping[str, str]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str) -> Iterator[Seeds]:
    from fastaiagent.checkpointers import SQLiteCheckpointer
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    scenarios = tuple(get_scenario(name) for name in SCENARIOS)
    path = tmp_path_factory.mktemp("stopped") / "local.db"
    on_sqlite = dict(seed(path, scenarios=scenarios).runs)
    sdk = SQLiteCheckpointer(str(path))
    try:
        on_sqlite.update(write_stopped_chains(sdk))
    finally:
        sdk.close()
    schema = pg_name("fastaiagent_stopped")
    try:
        on_pg = dict(seed(pg_dsn, pg_schema=schema, scenarios=scenarios).runs)
        pg_sdk = PostgresCheckpointer(pg_dsn, schema=schema)
        try:
            on_pg.update(write_stopped_chains(pg_sdk))
        finally:
            pg_sdk.close()
        yield Seeds(path, on_sqlite, pg_dsn, schema, on_pg)
    finally:
        PgRaw(pg_dsn, schema).drop()


@dataclass
class Stopped:
    """A test's own copy of the stopped runs on one backend, with the SDK bound to it."""

    kind: str
    settings: Settings
    runs: Mapping[str, str]
    checkpointer: Any
    stack: ExitStack
    #: What the registered runners did, in order (``model:X``, ``tool:X:Y``).
    events: list[str] = field(default_factory=list)

    def id(self, name: str) -> str:
        return self.runs[name]

    def runners(self) -> list[Any]:
        """The runners as a user registers them: nothing slow, no timeout."""
        made = [build_agent(self.checkpointer, events=self.events)]
        if CHAINS:
            made.append(build_parcel_chain(self.checkpointer, events=self.events))
            made.append(build_parcel_chain(self.checkpointer, events=self.events, courier=True))
        return made

    def app_client(self, **changes: Any) -> TestClient:
        """A client of the app with these settings changed; its lifespan runs once entered."""
        from dataclasses import replace

        app = create_app(replace(self.settings, **changes), agents=self.runners())
        return TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT)

    def client(self, **changes: Any) -> TestClient:
        """:meth:`app_client`, running until the test ends."""
        return self.stack.enter_context(self.app_client(**changes))

    def worker_args(self) -> list[str]:
        if self.kind == "sqlite":
            return ["--store", self.settings.store]
        return ["--store", self.settings.store, "--pg-schema", self.settings.pg_schema]


@pytest.fixture(params=("sqlite", "postgres"))
def stopped(request: pytest.FixtureRequest, seeds: Seeds, tmp_path: Path) -> Iterator[Stopped]:
    with ExitStack() as stack:
        if request.param == "sqlite":
            from fastaiagent.checkpointers import SQLiteCheckpointer

            path = backup(seeds.sqlite, tmp_path / "copy.db")
            settings = Settings(store=str(path), sign_in=NO_SIGN_IN, stale_after=10.0**9)
            checkpointer: Any = SQLiteCheckpointer(str(path))
            ids = seeds.sqlite_runs
        else:
            from fastaiagent.checkpointers.postgres import PostgresCheckpointer

            schema, app_schema = pg_name("fastaiagent"), pg_name("localui")
            copy_pg_store(seeds.dsn, seeds.pg_schema, seeds.dsn, schema)
            stack.callback(PgRaw(seeds.dsn, schema).drop)
            stack.callback(PgRaw(seeds.dsn, app_schema).drop)
            settings = Settings(
                store=seeds.dsn,
                pg_schema=schema,
                pg_app_schema=app_schema,
                sign_in=NO_SIGN_IN,
                stale_after=10.0**9,
            )
            checkpointer = PostgresCheckpointer(seeds.dsn, schema=schema)
            ids = seeds.pg_runs
        stack.callback(checkpointer.close)
        # Entered last, so the apps close before the checkpointer and the schemas go.
        with ExitStack() as apps:
            yield Stopped(request.param, settings, ids, checkpointer, apps)


def ids_in(stopped: Stopped, state: str) -> set[str]:
    return {stopped.id(name) for name, s in STATES.items() if s == state}


# --- the runs list ------------------------------------------------------------------------


@pytest.mark.floor
def test_each_stopped_run_is_listed_in_its_own_state_with_its_own_chip(stopped: Stopped) -> None:
    client = stopped.client()
    body = client.get("/runs.json").json()

    assert {r["execution_id"]: r["state"] for r in body["runs"]} == {
        stopped.id(name): state for name, state in STATES.items()
    }
    assert body["counts"] == {
        "completed": 0,
        "failed": 1,
        "cancelled": COUNTS[runs.CANCELLED],
        "timed_out": COUNTS[runs.TIMED_OUT],
        "paused": 1,
        "orphaned": 0,
        "unfinished": 0,
    }
    for state in (runs.CANCELLED, runs.TIMED_OUT, runs.FAILED):
        chip = client.get("/runs.json", params={"state": state}).json()
        assert {r["execution_id"] for r in chip["runs"]} == ids_in(stopped, state), state

    html = client.get("/runs").text
    chips = dict(re.findall(r'class="tab state-(\w+)[^"]*">[^<]*<span class="count">(\d+)', html))
    assert (chips["cancelled"], chips["timed_out"], chips["failed"]) == (
        str(COUNTS[runs.CANCELLED]),
        str(COUNTS[runs.TIMED_OUT]),
        "1",
    )
    assert ">Timed out <span" in html and ">Cancelled <span" in html
    only = client.get("/runs", params={"state": "timed_out"}).text
    assert stopped.id("timed-out") in only and stopped.id("cancelled") not in only


# --- the run page -------------------------------------------------------------------------


@pytest.mark.floor
def test_the_run_page_says_what_stopped_the_run_and_gives_no_crash_advice(
    stopped: Stopped,
) -> None:
    client = stopped.client()
    cancelled = client.get(f"/runs/{stopped.id('cancelled')}.json").json()
    timed_out = client.get(f"/runs/{stopped.id('timed-out')}.json").json()

    said = cancelled["verdict"]
    assert cancelled["state"] == "cancelled" and said["tone"] == "warn"
    assert said["headline"].startswith("Cancelled ")
    assert "inside tool `refund`" in said["headline"]
    assert "someone stopped it on purpose" in said["headline"]
    assert "Nothing crashed." in said["headline"]
    assert "Resume steps back past the stop marker" in said["resume"]
    assert "re-invokes `refund` with the saved arguments" in said["resume"]
    # "_RunCancelled" before SDK 1.93.
    assert "RunCancelled: run " in cancelled["run_error"]

    said = timed_out["verdict"]
    assert timed_out["state"] == "timed_out"
    assert said["headline"].startswith("Timed out ")
    assert "passed its timeout_seconds" in said["headline"]
    assert "timeout_seconds=0.5" in said["headline"]
    assert "times out again" in said["resume"]

    html = client.get(f"/runs/{stopped.id('cancelled')}").text
    banner = text_of(html, "run-state")
    assert "someone stopped it on purpose" in banner
    assert "its process died" not in banner and "Failed " not in banner
    assert "Someone stopped the run on purpose" in text_of(html, "legend")


@pytest.mark.skipif(not CHAINS, reason="chains are stopped from SDK 1.93 on")
def test_a_stopped_chain_s_page_names_the_node_it_stopped_in(stopped: Stopped) -> None:
    client = stopped.client()
    for name, opening in (("chain-cancelled", "Cancelled "), ("chain-timed-out", "Timed out ")):
        page = client.get(f"/runs/{stopped.id(name)}.json").json()
        said = page["verdict"]
        assert said["headline"].startswith(opening), said
        # The chain is registered, so the node after the last finished one is known.
        assert "in node `step_2_collect`, after `step_1_lookup`" in said["headline"]
        assert "at node `step_2_collect`" in said["resume"]


# --- /attention ---------------------------------------------------------------------------


@pytest.mark.floor
def test_attention_leaves_out_a_cancelled_run_and_keeps_a_timed_out_one(stopped: Stopped) -> None:
    body = stopped.client().get("/attention.json").json()
    listed = {r["execution_id"]: r["why"] for r in body["runs"]}

    assert not ids_in(stopped, runs.CANCELLED) & set(listed)
    for execution_id in ids_in(stopped, runs.TIMED_OUT) | ids_in(stopped, runs.FAILED):
        assert listed[execution_id] == ["failed"]
    # A timeout is a failure of the work: counted among the failures.
    assert body["counts"]["failed"] == 1 + len(ids_in(stopped, runs.TIMED_OUT))


@pytest.mark.floor
def test_a_run_cancelled_while_its_pause_still_waits_needs_a_person(stopped: Stopped) -> None:
    from fastaiagent.chain.checkpoint import write_run_end

    paused = stopped.id("paused-1")
    # The SDK's own run-end writer, as a cancel landing as the pause is written leaves it.
    write_run_end(
        stopped.checkpointer,
        execution_id=paused,
        chain_name=AGENT_NAME,
        status="failed",
        reason="cancelled",
    )
    client = stopped.client()
    body = client.get("/attention.json").json()

    assert client.get(f"/runs/{paused}.json").json()["state"] == "cancelled"
    assert {r["execution_id"]: r["why"] for r in body["runs"]}[paused] == ["failed"]
    assert stopped.id("cancelled") not in {r["execution_id"] for r in body["runs"]}


# --- /metrics -----------------------------------------------------------------------------


@pytest.mark.floor
def test_metrics_count_the_cancelled_and_timed_out_runs(stopped: Stopped) -> None:
    text = stopped.client().get("/metrics").text
    lines = text.splitlines()

    assert f'localui_runs{{state="cancelled"}} {COUNTS[runs.CANCELLED]}.0' in lines
    assert f'localui_runs{{state="timed_out"}} {COUNTS[runs.TIMED_OUT]}.0' in lines
    assert 'localui_runs{state="failed"} 1.0' in lines


# --- a resume and a fork of a stopped copy ------------------------------------------------


@pytest.mark.parametrize(
    "name",
    (*(pytest.param(n, marks=pytest.mark.floor) for n in AGENT_RUNS), *CHAIN_RUNS),
)
def test_a_resume_of_a_stopped_run_does_what_the_page_said(stopped: Stopped, name: str) -> None:
    execution_id = stopped.id(name)
    client = stopped.client()
    page = client.get(f"/runs/{execution_id}.json").json()
    plan = page["resume"]
    assert plan is not None, page["resume_refusal"]

    answer = client.post(
        f"/runs/{execution_id}/resume",
        data={"checkpoint_id": plan["checkpoint_id"], "actor": "Ops Person", "confirm": "yes"},
        headers=JSON,
    )

    assert answer.status_code == 200, answer.text
    if name in AGENT_RUNS:
        # Re-entered at the refund it was stopped in: the tool first, no model call before.
        assert plan["node_id"] == "turn:0/tool:refund"
        assert stopped.events[:2] == [f"tool:{AGENT_NAME}:refund", f"model:{AGENT_NAME}"]
    else:
        # After the last finished node: the collecting node runs again from its start.
        assert plan["node_id"] == "step_1_lookup"
        owner = COURIER_CHAIN if name == "chain-timed-out" else CHAIN_NAME
        first = f"model:{COURIER}" if owner == COURIER_CHAIN else f"tool:{owner}:wait_for_carrier"
        assert stopped.events[0] == first
        assert f"tool:{owner}:lookup_parcel" not in stopped.events
    assert client.get(f"/runs/{execution_id}.json").json()["state"] == "completed"


@pytest.mark.floor
def test_a_fork_of_a_stopped_run_is_a_new_run_and_leaves_it_stopped(stopped: Stopped) -> None:
    source = stopped.id("cancelled")
    client = stopped.client()
    page = client.get(f"/runs/{source}.json").json()
    assert "this run stays as it is" in page["verdict"]["fork"]
    [row] = [r for r in page["rows"] if r["node_id"] == "turn:0"]

    forked = client.post(
        f"/runs/{source}/fork",
        data={"checkpoint_id": row["checkpoint_id"], "input": ""},
        follow_redirects=False,
    )

    assert forked.status_code == 303, forked.text
    new = forked.headers["location"].rsplit("/", 1)[1]
    assert new != source
    assert client.get(f"/runs/{new}.json").json()["state"] == "completed"
    assert stopped.events[0] == f"model:{AGENT_NAME}"
    assert client.get(f"/runs/{source}.json").json()["state"] == "cancelled"


# --- bundles ------------------------------------------------------------------------------


@pytest.mark.floor
def test_a_bundle_says_why_its_run_was_stopped_and_opens_as_it_was(
    stopped: Stopped, tmp_path: Path
) -> None:
    from localui.bundle import load_bundles, read_bundle

    client = stopped.client()
    files = []
    for name in AGENT_RUNS:
        response = client.get(f"/runs/{stopped.id(name)}/bundle")
        assert response.status_code == 200, response.text
        (run,) = json.loads(gzip.decompress(response.content))["runs"]
        assert (run["state"], run["run_reason"]) == (STATES[name], SDK_REASONS[name])
        files.append(tmp_path / f"{name}.localui.gz")
        files[-1].write_bytes(response.content)

    opened_store = tmp_path / "opened" / "local.db"
    opened_store.parent.mkdir()
    load_bundles([read_bundle(f) for f in files], opened_store)
    with TestClient(
        create_app(Settings(store=str(opened_store), sign_in=NO_SIGN_IN, read_only=True)),
        base_url=BASE_URL,
        client=LOOPBACK_CLIENT,
    ) as opened:
        states = {r["execution_id"]: r["state"] for r in opened.get("/runs.json").json()["runs"]}
    assert states == {stopped.id(name): STATES[name] for name in AGENT_RUNS}


# --- an index of the previous version -----------------------------------------------------


@pytest.mark.floor
def test_an_index_built_before_run_reasons_is_rebuilt_with_them(stopped: Stopped) -> None:
    """An index from before this version holds every stopped run as ``failed``: opening
    it again rebuilds it, as every change of what a row holds does."""
    with stopped.app_client() as first:
        assert first.get("/runs.json").json()["counts"]["cancelled"] == COUNTS[runs.CANCELLED]
    if stopped.kind == "sqlite":
        import sqlite3

        path = sqlite_index.index_path(Path(stopped.settings.store).resolve(), None)
        conn = sqlite3.connect(path)
        with conn:
            conn.execute(
                "UPDATE runs SET state = 'failed', run_reason = NULL"
                " WHERE state IN ('cancelled', 'timed_out')"
            )
            conn.execute("UPDATE meta SET value = '9' WHERE key = 'version'")
        conn.close()
    else:
        from localui.backends.postgres.index.schema import Tables

        t = Tables(stopped.settings.pg_app_schema, stopped.settings.pg_schema)
        app = PgRaw(stopped.settings.store, stopped.settings.pg_app_schema)
        app.execute(
            f"UPDATE {t.runs} SET state = 'failed', run_reason = NULL"
            " WHERE state IN ('cancelled', 'timed_out')"
        )
        app.execute(f"UPDATE {t.meta} SET value = '5' WHERE key = 'version'")

    counts = stopped.client().get("/runs.json").json()["counts"]

    assert (counts["cancelled"], counts["timed_out"], counts["failed"]) == (
        COUNTS[runs.CANCELLED],
        COUNTS[runs.TIMED_OUT],
        1,
    )


# --- notifications ------------------------------------------------------------------------


def run_worker(stopped: Stopped, scenario: str, cwd: Path) -> str:
    """One demo scenario in a child process, as the user's agent would run it."""
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"}
    env["FASTAIAGENT_LOCAL_DB"] = (
        stopped.settings.store if stopped.kind == "sqlite" else str(cwd / "unused.db")
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "localui.demo.worker",
            *stopped.worker_args(),
            "--scenario",
            scenario,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def failures(receiver: Receiver) -> dict[str, str]:
    """Each announced run.failed: its run and its reason."""
    found = {}
    for request in receiver.requests():
        body = json.loads(request.body)
        if body["type"] == ev.FAILED:
            found[body["data"]["execution_id"]] = body["data"]["reason"]
    return found


#: The webhooks' signing secret (the body is read here without checking it).
SECRET = "whsec_" + base64.b64encode(b"the tests' webhook signing key!!").decode()


def watching(stopped: Stopped, receiver: Receiver, events: tuple[str, ...]) -> TestClient:
    """The app announcing ``events`` to ``receiver``; its watcher runs once entered."""
    notifications = Notifications(
        webhooks=(receiver.url + "/hook",),
        webhook_secret=SECRET,
        events=events,
        retry_initial=0.1,
        retry_max=0.4,
        sweep_interval=0.3,
    )
    return stopped.app_client(notifications=notifications, poll_interval=0.1)


@pytest.mark.floor
def test_run_failed_carries_the_reason_and_notify_on_can_leave_cancellations_out(
    stopped: Stopped, tmp_path: Path
) -> None:
    # What `--notify-on paused,decided,failed,stalled,overdue` gives: no `cancelled`.
    chosen = ev.parse_notify_on("paused,decided,failed,stalled,overdue")
    assert CANCELLED_FAILURES not in chosen and CANCELLED_FAILURES in Notifications().events
    with Receiver() as receiver, watching(stopped, receiver, tuple(sorted(chosen))):
        cancelled = run_worker(stopped, "cancelled", tmp_path)
        timed_out = run_worker(stopped, "timed-out", tmp_path)
        assert receiver.wait_for(lambda _r: timed_out in failures(receiver), 30)
        time.sleep(1.5)  # polls and a sweep more: the cancellation stays unannounced
        assert failures(receiver) == {timed_out: "timeout"}
        assert cancelled not in failures(receiver)

    with Receiver() as everything, watching(stopped, everything, Notifications().events):
        again = run_worker(stopped, "cancelled", tmp_path)
        assert everything.wait_for(lambda _r: again in failures(everything), 30)
        assert failures(everything)[again] == "cancelled"
