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
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import BASE_URL, PgRaw, pg_name, text_of
from helpers import LOOPBACK_CLIENT, NO_SIGN_IN
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
