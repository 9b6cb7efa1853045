"""The trace section of chains', supervisors' and swarms' runs, on both backends.

The runs are written, traced, by the real SDK in a child process
(``tests/traced_runs.py``): the demo's refund-chain paused and approved by ann, a fork
of it, a chain whose first node is an agent, the demo's supervisor paused in its
worker and approved, the demo's swarm paused after a handoff. Each attempt of such a
run is the runner's own root span (``chain.*``, ``supervisor.*``, ``swarm.*``) with
everything under it: a team's members are not attempts of their own.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import BASE_URL, PgRaw, backup, pg_name, text_of
from helpers import JSON, LOOPBACK_CLIENT, NO_SIGN_IN, start_localui
from starlette.testclient import TestClient
from traced_runs import PIPELINE, RESOLVER, SUMMARISER, SUMMARY

from localui.app import create_app
from localui.settings import Settings

pytestmark = pytest.mark.postgres

SCRIPT = Path(__file__).with_name("traced_runs.py")


@dataclass(frozen=True)
class Traced:
    settings: Settings
    runs: Mapping[str, str]

    def id(self, name: str) -> str:
        return self.runs[name]


def write_runs(tmp: Path, *store: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--store", *store, "--traces", str(tmp / "traces.db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    written: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return written


@pytest.fixture(scope="module", params=("sqlite", "postgres"))
def traced(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Traced]:
    tmp = tmp_path_factory.mktemp(f"traced-{request.param}")
    if request.param == "sqlite":
        # The SDK traces into the store's own file, as a user's agents do by default.
        path = tmp / "traces.db"
        yield Traced(
            Settings(store=str(path), sign_in=NO_SIGN_IN, stale_after=10.0**9),
            write_runs(tmp, str(path)),
        )
        return
    dsn = request.getfixturevalue("pg_dsn")
    schema, app_schema = pg_name("fastaiagent_traced"), pg_name("localui")
    try:
        written = write_runs(tmp, dsn, "--pg-schema", schema)
        settings = Settings(
            store=dsn,
            pg_schema=schema,
            pg_app_schema=app_schema,
            traces=str(tmp / "traces.db"),
            sign_in=NO_SIGN_IN,
            stale_after=10.0**9,
        )
        yield Traced(settings, written)
    finally:
        PgRaw(dsn, schema).drop()
        PgRaw(dsn, app_schema).drop()


@pytest.fixture(scope="module")
def client(traced: Traced) -> Iterator[TestClient]:
    with TestClient(create_app(traced.settings), base_url=BASE_URL, client=LOOPBACK_CLIENT) as c:
        yield c


def page_of(client: TestClient, execution_id: str) -> dict[str, Any]:
    response = client.get(f"/runs/{execution_id}.json")
    assert response.status_code == 200, response.text
    page: dict[str, Any] = response.json()
    return page


def steps_on_rows(page: Mapping[str, Any], attempt: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Each step as (kind, name, status, node of the row it sits on)."""
    nodes = {r["checkpoint_id"]: r["node_id"] for r in page["rows"]}
    return [
        (s["kind"], s["name"], s["status"], nodes.get(s["checkpoint_id"], "-"))
        for s in attempt["steps"]
    ]


def test_a_chain_run_shows_each_attempt_with_its_nodes_calls_on_their_rows(
    client: TestClient, traced: Traced
) -> None:
    run_id = traced.id("chain-resumed")
    page = page_of(client, run_id)
    trace = page["trace"]
    assert trace["traced"] is True and trace["note"] is None
    assert json.loads(trace["input"]) == {"order_id": "B-7"}
    assert "customer of B-7 notified" in trace["answer"]
    first, resume = trace["attempts"]
    assert (first["kind"], first["status"]) == ("first run", "paused")
    # A chain writes a node's row after the node ran: each call sits on its node's row.
    assert steps_on_rows(page, first) == [
        ("tool", "tool.lookup_order", "ok", "step_1_lookup"),
        ("tool", "tool.plan_refund", "ok", "step_2_plan"),
        ("tool", "tool.refund", "paused", "step_3_refund"),
    ]
    assert (resume["kind"], resume["status"]) == ("resume", "completed")
    assert (resume["resume_node"], resume["resumed_by"], resume["approved"]) == (
        "step_3_refund",
        RESOLVER,
        True,
    )
    assert steps_on_rows(page, resume) == [
        ("tool", "tool.refund", "ok", "step_3_refund"),
        ("tool", "tool.notify_customer", "ok", "step_4_notify"),
    ]
    html = client.get(f"/runs/{run_id}").text
    trace_text = text_of(html, "trace")
    assert "Attempt 1: chain first run" in trace_text
    marker = f"Attempt 2: chain resume at step_3_refund, approved by {RESOLVER}"
    assert marker in trace_text
    assert html.count("<rect ") == 5
    (marked,) = [r for r in page["rows"] if r["reentry"]]
    assert marked["reentry"] == marker


def test_a_fork_of_a_chain_is_an_attempt_of_the_branch(client: TestClient, traced: Traced) -> None:
    page = page_of(client, traced.id("chain-fork"))
    (fork,) = page["trace"]["attempts"]
    assert (fork["kind"], fork["status"]) == ("fork", "paused")
    assert steps_on_rows(page, fork) == [("tool", "tool.refund", "paused", "step_3_refund")]
    assert "Attempt 1: chain fork" in text_of(
        client.get(f"/runs/{traced.id('chain-fork')}").text, "trace"
    )


def test_a_chains_agent_node_shows_the_agent_and_its_model_call(
    client: TestClient, traced: Traced
) -> None:
    """The agent of a node runs under an execution id of its own; in the chain's trace
    it is what the chain ran, not another run to leave out."""
    run_id = traced.id("pipeline")
    page = page_of(client, run_id)
    (attempt,) = page["trace"]["attempts"]
    assert steps_on_rows(page, attempt) == [
        ("agent", f"agent.{SUMMARISER}", "ok", "step_1_summarise"),
        ("model", "llm.test.summariser-demo", "ok", "step_1_summarise"),
        ("tool", "tool.file_ticket", "ok", "step_2_file"),
    ]
    assert attempt["steps"][0]["model"] == "summariser-demo"
    assert SUMMARY in page["trace"]["answer"]
    html = client.get(f"/runs/{run_id}").text
    assert f"agent {SUMMARISER}" in text_of(html, "trace")
    listed = {r["execution_id"]: r for r in client.get("/runs.json").json()["runs"]}
    assert listed[run_id]["outcome"].startswith('{"output": "ticket T-1 filed: ')
    assert listed[run_id]["agent"] == PIPELINE


def test_a_supervisor_run_is_one_attempt_per_run_with_its_workers_inside(
    client: TestClient, traced: Traced
) -> None:
    run_id = traced.id("supervisor-resumed")
    page = page_of(client, run_id)
    trace = page["trace"]
    first, resume = trace["attempts"]
    assert first["kind"] == "first run" and first["status"] == "paused"
    kinds = [(k, n, s) for k, n, s, _ in steps_on_rows(page, first)]
    assert kinds == [
        ("agent", "agent.refund-desk", "paused"),
        ("model", "llm.test.planner-demo", "ok"),
        ("tool", "tool.delegate_to_refunder", "paused"),
        ("agent", "agent.refunder", "paused"),
        ("model", "llm.test.refunder-demo", "ok"),
        ("tool", "tool.refund", "paused"),
    ]
    # The worker's resume says who approved: the team's attempt tells it.
    assert resume["kind"] == "resume"
    assert (resume["resume_node"], resume["resumed_by"], resume["approved"]) == (
        "turn:0/tool:refund",
        RESOLVER,
        True,
    )
    # The supervisor's answer, not its worker's, is the run's.
    assert trace["answer"] == "Final report ready."
    listed = {r["execution_id"]: r for r in client.get("/runs.json").json()["runs"]}
    assert listed[run_id]["outcome"] == "Final report ready."
    html = client.get(f"/runs/{run_id}").text
    assert "Attempt 2: supervisor resume at turn:0/tool:refund, approved by ann" in text_of(
        html, "trace"
    )


def test_a_swarm_run_is_one_attempt_with_each_member_inside(
    client: TestClient, traced: Traced
) -> None:
    page = page_of(client, traced.id("swarm-paused"))
    (attempt,) = page["trace"]["attempts"]
    assert attempt["kind"] == "first run"
    # Its active member, the refunder, waits on the refund.
    assert attempt["status"] == "paused"
    agents = [s["name"] for s in attempt["steps"] if s["kind"] == "agent"]
    assert agents == ["agent.triage", "agent.refunder"]
    assert page["trace"]["input"] == "Refund order B-7"
    assert "Attempt 1: swarm first run" in text_of(
        client.get(f"/runs/{traced.id('swarm-paused')}").text, "trace"
    )


def test_a_bundle_carries_the_chains_spans(client: TestClient, traced: Traced) -> None:
    response = client.get(f"/runs/{traced.id('chain-resumed')}/bundle")
    assert response.status_code == 200, response.text
    bundle = json.loads(gzip.decompress(response.content))
    (run,) = bundle["runs"]
    names = sorted(span["name"] for span in run["spans"])
    assert names == sorted(
        ["chain.refund-chain"] * 2
        + ["tool.lookup_order", "tool.plan_refund", "tool.refund", "tool.refund"]
        + ["tool.notify_customer"]
    )


# --- pauses decided outside localui ------------------------------------------------------


def test_a_pause_the_sdk_says_someone_else_answered_is_decided_outside_localui(
    client: TestClient, traced: Traced
) -> None:
    """ann answered these pauses through the SDK itself, not through localui: the SDK's
    resume spans name her, and localui's decision record has nothing of it."""
    for name, node in (("chain-resumed", "step_3_refund"), ("supervisor-resumed", None)):
        run_id = traced.id(name)
        page = page_of(client, run_id)
        (decided,) = page["decisions"]
        assert (decided["kind"], decided["approver"], decided["approved"]) == (
            "outside",
            RESOLVER,
            True,
        )
        (pause,) = [r for r in page["rows"] if r["checkpoint_id"] == decided["checkpoint_id"]]
        assert pause["status"] == "interrupted"
        if node is not None:
            assert pause["node_id"] == node
        words = text_of(client.get(f"/runs/{run_id}").text, "decisions")
        assert f"{RESOLVER} approved the pause at {pause['node_id']} at " in words
        assert "decided outside localui (named by the SDK's trace of the resume)" in words
    # Runs nobody answered, or whose resume answered no pause, have none.
    for name in ("chain-waiting", "pipeline", "swarm-paused"):
        assert page_of(client, traced.id(name))["decisions"] == []


def test_decisions_lists_the_pauses_decided_outside_localui_on_their_own(
    client: TestClient, traced: Traced
) -> None:
    outside = client.get("/decisions.json", params={"kind": "outside"}).json()
    listed = {d["execution_id"]: d for d in outside["decisions"]}
    assert set(listed) == {traced.id("chain-resumed"), traced.id("supervisor-resumed")}
    assert {d["agent"] for d in listed.values()} == {"refund-chain", "refund-desk"}
    for entry in listed.values():
        assert (entry["kind"], entry["approver"], entry["approved"]) == ("outside", RESOLVER, True)
        assert entry["outcome"] == "decided outside localui"
        assert "named by the SDK's trace of the resume" in entry["detail"]
    # Newest first, as the rest of the record.
    assert [d["execution_id"] for d in outside["decisions"]] == [
        traced.id("supervisor-resumed"),
        traced.id("chain-resumed"),
    ]
    # The record itself holds only what localui decided: nothing here.
    assert client.get("/decisions.json").json()["decisions"] == []
    only_chain = client.get("/decisions.json", params={"kind": "outside", "agent": "refund-chain"})
    assert [d["execution_id"] for d in only_chain.json()["decisions"]] == [
        traced.id("chain-resumed")
    ]
    nobody = client.get("/decisions.json", params={"kind": "outside", "approver": "bob"})
    assert nobody.json()["decisions"] == []
    # Decided in the last hour, none before it.
    recent = client.get("/decisions.json", params={"kind": "outside", "since": "1h"})
    assert len(recent.json()["decisions"]) == 2
    earlier = client.get("/decisions.json", params={"kind": "outside", "until": "1h"})
    assert earlier.json()["decisions"] == []
    html = client.get("/decisions", params={"kind": "outside"}).text
    assert 'value="outside" selected' in html and "decided outside localui" in html
    csv = client.get("/decisions.csv", params={"kind": "outside"}).text.splitlines()
    assert len(csv) == 3 and all(",outside," in line for line in csv[1:])


def test_the_pauses_decided_outside_localui_come_a_page_at_a_time(traced: Traced) -> None:
    from dataclasses import replace

    app = create_app(replace(traced.settings, page_size=1))
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as one:
        first = one.get("/decisions.json", params={"kind": "outside"}).json()
        assert [d["execution_id"] for d in first["decisions"]] == [traced.id("supervisor-resumed")]
        second = one.get(
            "/decisions.json", params={"kind": "outside", "after": first["next"]}
        ).json()
        assert [d["execution_id"] for d in second["decisions"]] == [traced.id("chain-resumed")]
        if second["next"] is not None:
            third = one.get(
                "/decisions.json", params={"kind": "outside", "after": second["next"]}
            ).json()
            assert third["decisions"] == [] and third["next"] is None
        bad = one.get("/decisions.json", params={"kind": "outside", "after": "nonsense"})
        assert bad.status_code == 400


AGENTS_FILE = """\
from fastaiagent.checkpointers import SQLiteCheckpointer

from localui.demo.teams import build_chain


def refund_chain():
    return build_chain(SQLiteCheckpointer({store!r}))
"""


def test_a_pause_localui_approved_is_localuis_own_decision_not_one_made_outside(
    tmp_path: Path,
) -> None:
    """A served localui, tracing as the SDK does by default, approves a chain's pause:
    the SDK's resume span names the approver too, and localui tells it is its own."""
    store = tmp_path / "traces.db"
    run_id = write_runs(tmp_path, str(store))["chain-waiting"]
    agents = tmp_path / "chain_agents.py"
    agents.write_text(AGENTS_FILE.format(store=str(store)))
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "true", "FASTAIAGENT_LOCAL_DB": str(store)}
    server = start_localui(
        ["serve", "--store", str(store), "--agents", f"{agents}:refund_chain", "--no-auth"],
        cwd=tmp_path,
        log=tmp_path / "serve.log",
        env=env,
        ready="/approvals.json",
        timeout=60,
    )
    try:
        with httpx.Client(base_url=server.url, timeout=60) as served:
            card = served.get(f"/approvals/{run_id}.json").json()
            answer = served.post(
                f"/approvals/{run_id}/approve",
                data={
                    "approver": "Ann Approver",
                    "reason": "within policy",
                    "checkpoint_id": card["pending"]["checkpoint_id"],
                },
                headers=JSON,
            )
            assert answer.status_code == 200, answer.text
    finally:
        # Stopped before reading: the SDK writes its last spans as the process ends.
        assert server.stop() == 0, server.output()

    settings = Settings(store=str(store), sign_in=NO_SIGN_IN, stale_after=10.0**9)
    with TestClient(create_app(settings), base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        traces = client.app.state.localui.traces  # type: ignore[attr-defined]
        (resolution,) = traces.resolutions(run_id)
        assert (resolution.resolver, resolution.approved) == ("Ann Approver", True)
        decisions = page_of(client, run_id)["decisions"]
        assert [(d["kind"], d["approver"]) for d in decisions] == [("approval", "Ann Approver")]
        outside = client.get("/decisions.json", params={"kind": "outside"}).json()
        assert run_id not in {d["execution_id"] for d in outside["decisions"]}
        assert "decided outside localui" not in text_of(
            client.get(f"/runs/{run_id}").text, "decisions"
        )


def test_the_sdks_hitl_ledger_names_who_decided_outside_localui(
    client: TestClient, traced: Traced, tmp_path: Path
) -> None:
    """The SDK writes its HITL ledger (``hitl_events``) while connected to its platform,
    which these tests cannot reach; its rows are written here by the SDK's own
    ``HitlEventStore``, as a connected run's pause and resolution would be. A ledger
    event that a resume's span already tells is one decision, not two."""
    from fastaiagent.trace.hitl_export import HitlEvent, HitlEventStore

    traces = Path(traced.settings.traces or traced.settings.store)
    copy = backup(traces, tmp_path / "traces.db")
    resumed = page_of(client, traced.id("chain-resumed"))["trace"]["attempts"][1]
    waiting = traced.id("chain-waiting")
    ledger = HitlEventStore(str(copy))
    try:
        for event in (
            HitlEvent(
                event_id="ledger-1",
                run_id=traced.id("chain-resumed"),
                event_type="resolved",
                kind="interrupt",
                chain_id="refund-chain",
                node="step_3_refund",
                status="approved",
                resolver=RESOLVER,
                occurred_at=resumed["started_at"],
            ),
            HitlEvent(
                event_id="ledger-2", run_id=waiting, event_type="paused", node="step_3_refund"
            ),
            HitlEvent(
                event_id="ledger-3",
                run_id=waiting,
                event_type="resolved",
                kind="interrupt",
                chain_id="refund-chain",
                node="step_3_refund",
                status="rejected",
                resolver="dave",
            ),
        ):
            ledger.record(event)
    finally:
        ledger.close()

    from dataclasses import replace

    settings = (
        replace(traced.settings, store=str(copy))
        if traced.settings.traces is None
        else replace(traced.settings, traces=str(copy))
    )
    with TestClient(create_app(settings), base_url=BASE_URL, client=LOOPBACK_CLIENT) as ledgered:
        (decided,) = page_of(ledgered, waiting)["decisions"]
        assert (decided["kind"], decided["approver"], decided["approved"]) == (
            "outside",
            "dave",
            False,
        )
        words = text_of(ledgered.get(f"/runs/{waiting}").text, "decisions")
        assert "dave rejected the pause at step_3_refund at " in words
        assert "decided outside localui (from the SDK's HITL ledger)" in words
        (told_twice,) = page_of(ledgered, traced.id("chain-resumed"))["decisions"]
        assert "named by the SDK's trace of the resume" in text_of(
            ledgered.get(f"/runs/{traced.id('chain-resumed')}").text, "decisions"
        )
        assert told_twice["approver"] == RESOLVER
        outside = ledgered.get("/decisions.json", params={"kind": "outside"}).json()
        assert sorted(d["approver"] for d in outside["decisions"]) == ["ann", "ann", "dave"]
