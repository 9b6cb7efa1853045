"""Acting on runs through the app: approve, reject, resume, fork and prune.

Every test acts on a copy of the seeded store, through an app whose refund-bot
writes one ledger line per real side effect into a fresh ledger. The seed's
effects are not in that ledger, so its counts are what the app caused: an
approval's ``charge_back`` is answered from the ``@idempotent`` cache the paused
run wrote (0 lines), while a step that never charged charges once (1 line).
Exactly-once is judged by the store itself: run-end rows, pending rows and the
app's own decision record.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from helpers import all_at_once, card, decide

from localui.demo.agent import EXIT_DIED_IN_TOOL

if TYPE_CHECKING:
    from conftest import ActingClientFactory, ClientFactory, Ledger, Raw, Seeded
    from starlette.testclient import TestClient

JSON = {"Accept": "application/json"}
HTMX = {"HX-Request": "true"}
CROSS_SITE = {"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}
#: The origin the app tests' client talks to (conftest's BASE_URL).
SAME_ORIGIN = "http://127.0.0.1:8765"
#: The seeded store's pauses: paused-1, -2, -3 and two-tools-first-pauses.
PENDING = 4
#: The seeded store's pauses as ``interrupted`` rows; idempotent-resumed keeps its own.
INTERRUPTED_ROWS = 5


# --- the store as ground truth ----------------------------------------------


def pending_ids(db: Raw) -> set[str]:
    return {r["execution_id"] for r in db.query("SELECT execution_id FROM pending_interrupts")}


def run_ends(db: Raw, execution_id: str) -> list[str]:
    """The status of each run-end row of a run, in the order written."""
    return [r["status"] for r in db.rows(execution_id) if r["step_type"] == "run_end"]


def decision_rows(db: Raw, execution_id: str | None = None) -> list[sqlite3.Row]:
    """The app's decision record; empty when the table was never created."""
    tables = db.query("SELECT name FROM sqlite_master WHERE name = 'localui_decisions'")
    if not tables:
        return []
    if execution_id is None:
        return db.query("SELECT * FROM localui_decisions ORDER BY id")
    return db.query(
        "SELECT * FROM localui_decisions WHERE execution_id = ? ORDER BY id", (execution_id,)
    )


def snapshot(db: Raw) -> tuple[list[tuple[Any, ...]], ...]:
    """Every row of the SDK's tables and of the decision record, to compare before/after."""
    tables = ["checkpoints", "pending_interrupts", "idempotency_cache"]
    if db.query("SELECT name FROM sqlite_master WHERE name = 'localui_decisions'"):
        tables.append("localui_decisions")
    return tuple(
        [tuple(r) for r in db.query(f"SELECT * FROM {table} ORDER BY rowid")] for table in tables
    )


# --- the app --------------------------------------------------------------------


@dataclass(frozen=True)
class Desk:
    """An app with the demo agent registered, over its own copy of the seeded store."""

    client: TestClient
    store: Path
    db: Raw
    ledger: Ledger


@pytest.fixture
def desk(
    store_copy: Path,
    ledger: Ledger,
    make_acting_client: ActingClientFactory,
    raw: Callable[[Path], Raw],
) -> Desk:
    return Desk(make_acting_client(store_copy, ledger), store_copy, raw(store_copy), ledger)


def resume(
    client: TestClient,
    execution_id: str,
    checkpoint_id: str,
    *,
    confirm: bool = True,
    actor: str = "Ops Person",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    data = {"checkpoint_id": checkpoint_id, "actor": actor}
    if confirm:
        data["confirm"] = "yes"
    return client.post(
        f"/runs/{execution_id}/resume", data=data, headers=JSON if headers is None else headers
    )


def sentences(text: str) -> str:
    """Page text as a person reads it: element edges leave a space before punctuation."""
    return re.sub(r" (?=[.,:;)])", "", text)


def message(response: httpx.Response) -> str:
    return str(response.json()["error"]["message"])


def approver_value(html: str, execution_id: str) -> str | None:
    """The prefilled ``approver`` of the decision form of one run's card, or None."""
    form = re.search(
        rf'<form id="approval-{re.escape(execution_id)}-form".*?</form>', html, re.DOTALL
    )
    if form is None:
        return None
    field = re.search(r'<input name="approver" value="([^"]*)"', form.group(0))
    assert field is not None, "the decision form has no approver field"
    return field.group(1)


# --- approve and reject ---------------------------------------------------------


@pytest.mark.floor
def test_approve_completes_the_run_and_records_who_why_and_outcome(
    desk: Desk, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("paused-1")
    shown = card(desk.client, run)
    assert shown["problem"] is None and shown["context"]["order_id"] == "A-1002"

    response = decide(desk.client, run, shown["checkpoint_id"], reason="within policy")

    assert response.status_code == 200
    outcome = response.json()
    assert (outcome["action"], outcome["status"]) == ("approve", "completed")
    assert outcome["output"] == "Done: refunded 250.00 on A-1002."
    decision = outcome["decision"]
    assert decision["approver"] == "Ann Approver"
    assert decision["reason"] == "within policy"
    assert decision["approved"] is True
    assert decision["outcome"] == "completed"
    assert decision["checkpoint_id"] == shown["checkpoint_id"]

    page = desk.client.get(f"/runs/{run}.json").json()
    assert page["state"] == "completed"
    assert page["decisions"] == [decision]
    assert run_ends(desk.db, run) == ["completed"]
    assert pending_ids(desk.db) == {seeded.id(n) for n in ("paused-2", "paused-3")} | {
        seeded.id("two-tools-first-pauses")
    }
    # The paused run had charged before it paused: the resumed refund got the
    # charge back from the @idempotent cache instead of charging again.
    assert desk.ledger.count() == 0
    [row] = decision_rows(desk.db, run)
    assert (row["kind"], row["actor"], row["outcome"]) == ("approval", "Ann Approver", "completed")

    decisions = page_text(desk.client.get(f"/runs/{run}").text, "decisions")
    assert (
        f"Ann Approver approved it at {decision['decided_at']}: the run completed. "
        "Reason: “within policy”." in decisions
    )


def test_reject_needs_a_reason_and_the_tool_declines(
    desk: Desk, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("paused-2")
    shown = card(desk.client, run)

    refused = decide(desk.client, run, shown["checkpoint_id"], verb="reject", reason="  ")
    assert refused.status_code == 400
    assert message(refused) == "a reason is required to reject"
    assert run in pending_ids(desk.db)
    assert decision_rows(desk.db) == []

    fragment = decide(
        desk.client, run, shown["checkpoint_id"], verb="reject", reason="over budget", headers=HTMX
    )
    assert fragment.status_code == 200
    said = page_text(fragment.text, f"outcome-{run}")
    assert "Ann Approver rejected it at" in said
    assert "The run completed: Done: refund of 900.00 on A-1003 declined: over budget." in said

    page = desk.client.get(f"/runs/{run}.json").json()
    assert page["state"] == "completed"
    [decision] = page["decisions"]
    assert (decision["approved"], decision["reason"]) == (False, "over budget")
    assert run_ends(desk.db, run) == ["completed"]
    assert desk.ledger.count() == 0


def test_an_approver_is_required(desk: Desk, seeded: Seeded) -> None:
    run = seeded.id("paused-1")
    shown = card(desk.client, run)
    before = snapshot(desk.db)

    response = decide(desk.client, run, shown["checkpoint_id"], approver="   ")

    assert response.status_code == 400
    assert message(response) == "say who you are: approver is required"
    assert snapshot(desk.db) == before
    assert card(desk.client, run)["checkpoint_id"] == shown["checkpoint_id"]


def test_approving_the_first_of_two_tool_calls(desk: Desk, seeded: Seeded) -> None:
    run = seeded.id("two-tools-first-pauses")
    shown = card(desk.client, run)
    assert shown["context"]["order_id"] == "A-1005"

    response = decide(desk.client, run, shown["checkpoint_id"])

    assert response.status_code == 200
    outcome = response.json()
    assert outcome["status"] == "completed"
    # The SDK re-invokes only the paused tool; the sibling call of the same turn
    # is reported to the model as not run, so the customer is never notified.
    assert outcome["output"] == (
        "Done: refunded 700.00 on A-1005; [no result: the agent was interrupted before "
        "this tool ran; it was not run on resume]."
    )
    assert desk.client.get(f"/runs/{run}.json").json()["state"] == "completed"
    assert run_ends(desk.db, run) == ["completed"]
    assert desk.ledger.count("charge_back") == 0
    assert desk.ledger.count("notify_customer") == 0


def build_two_step(store: Path) -> Any:
    """An agent whose tool asks a person twice, in two turns: its first approval
    resumes into a second pause."""
    from fastaiagent import Agent, interrupt, tool
    from fastaiagent.checkpointers import SQLiteCheckpointer
    from fastaiagent.llm.message import Message, MessageRole
    from fastaiagent.testing import FunctionModel

    @tool(name="sign_off", register=False)
    def sign_off(step: int) -> str:
        """Ask a person to sign off one step."""
        answer = interrupt(f"sign_off_{step}", {"step": step})
        return f"step {step} {'approved' if answer.approved else 'rejected'}"

    def model(messages: list[Message]) -> str | tuple[str, list[dict[str, Any]]]:
        done = sum(1 for m in messages if m.role == MessageRole.tool)
        if done < 2:
            call = {"id": f"call_{done}", "name": "sign_off", "arguments": {"step": done + 1}}
            return "", [call]
        return "both steps signed off"

    return Agent(
        name="two-step",
        llm=FunctionModel(model),
        tools=[sign_off],
        checkpointer=SQLiteCheckpointer(str(store)),
    )


@dataclass(frozen=True)
class TwoStep:
    """A fresh store with one two-step run paused at its first sign-off, and an app
    with the two-step agent registered."""

    client: TestClient
    run: str


@pytest.fixture
def two_step(tmp_path: Path, make_acting_client: ActingClientFactory) -> Iterator[TwoStep]:
    store = tmp_path / "two-step.db"
    seeding = build_two_step(store)
    try:
        result = asyncio.run(seeding.arun("sign both steps off", execution_id="two-step-run"))
    finally:
        seeding._checkpointer.close()
    assert result.status == "paused"
    serving = build_two_step(store)
    try:
        yield TwoStep(make_acting_client(store, agents=[serving]), "two-step-run")
    finally:
        serving._checkpointer.close()


def test_an_approval_can_pause_the_run_again(
    two_step: TwoStep, page_text: Callable[..., str]
) -> None:
    client, run = two_step.client, two_step.run
    first = card(client, run)
    assert (first["reason"], first["context"]) == ("sign_off_1", {"step": 1})

    fragment = decide(client, run, first["checkpoint_id"], approver="Ann", headers=HTMX)

    assert fragment.status_code == 200
    said = sentences(page_text(fragment.text, f"outcome-{run}"))
    assert "Ann approved it at" in said and "the run paused." in said
    assert "The run paused again: paused again for sign_off_2. It is back in the queue." in said
    second = card(client, run)
    assert (second["reason"], second["context"]) == ("sign_off_2", {"step": 2})
    assert second["checkpoint_id"] != first["checkpoint_id"]
    assert client.get(f"/runs/{run}.json").json()["state"] == "paused"

    done = decide(client, run, second["checkpoint_id"], approver="Bob")
    assert done.status_code == 200
    assert (done.json()["status"], done.json()["output"]) == ("completed", "both steps signed off")
    decisions = client.get(f"/runs/{run}.json").json()["decisions"]
    assert [(d["approver"], d["outcome"]) for d in decisions] == [
        ("Ann", "paused"),
        ("Bob", "completed"),
    ]


def test_a_second_click_after_the_run_paused_again_says_who_decided(two_step: TwoStep) -> None:
    client, run = two_step.client, two_step.run
    first = card(client, run)
    assert decide(client, run, first["checkpoint_id"], approver="Ann").json()["status"] == "paused"

    again = decide(client, run, first["checkpoint_id"], approver="Bob")

    assert again.status_code == 409
    assert "already approved by Ann" in message(again)
    # The pause the run waits at now is untouched by that click.
    assert card(client, run)["reason"] == "sign_off_2"
    assert [d["approver"] for d in client.get(f"/runs/{run}.json").json()["decisions"]] == ["Ann"]


def test_a_stale_card_is_refused_with_the_current_row(desk: Desk, seeded: Seeded) -> None:
    run = seeded.id("paused-1")
    shown = card(desk.client, run)
    # A real row of the run, but not the one it waits at: the step before the pause.
    [earlier] = [r["checkpoint_id"] for r in desk.db.rows(run) if r["step_type"] == "tool_call"]
    before = snapshot(desk.db)

    response = decide(desk.client, run, earlier)

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["details"] == {"current_checkpoint_id": shown["checkpoint_id"]}
    assert f"the run now waits at row {shown['checkpoint_id']}" in error["message"]
    assert f"not the row {earlier} you saw" in error["message"]
    assert snapshot(desk.db) == before
    assert run in pending_ids(desk.db)
    assert desk.ledger.count() == 0


# --- preflight: what this process cannot carry out is refused before any claim


def test_without_the_agent_an_approval_is_refused_and_the_pause_kept(
    store_copy: Path,
    make_client: ClientFactory,
    raw: Callable[[Path], Raw],
    seeded: Seeded,
    page_text: Callable[..., str],
) -> None:
    client = make_client(store_copy)
    db = raw(store_copy)
    run = seeded.id("paused-1")
    shown = card(client, run)
    expected = (
        "No agent named 'refund-bot' is registered in this localui process (registered: none)."
        " Restart it with --agents MODULE:ATTR (or FILE.py:ATTR) naming the code that builds"
        " the Agent 'refund-bot', bound to this store."
    )
    assert shown["problem"] == expected

    response = decide(client, run, shown["checkpoint_id"])

    assert response.status_code == 422
    assert message(response) == expected
    assert run in pending_ids(db)
    assert decision_rows(db) == []
    html = client.get("/approvals").text
    assert approver_value(html, run) is None, "a card that cannot be decided has no form"
    # The queue says it once above its cards; the card's own page says it in full.
    assert "Read-only here" in page_text(html, f"approval-{run}")
    assert expected not in page_text(html, f"approval-{run}")
    own = client.get(f"/approvals/{run}").text
    assert f"Cannot be decided here: {expected}" in page_text(own, f"approval-{run}")


def test_with_no_runner_registered_the_queue_says_so_once(
    store_copy: Path, make_client: ClientFactory, page_text: Callable[..., str]
) -> None:
    """Every pause of the demo lacks its runner here: one banner names them all and how
    to register them, and no card repeats it."""
    client = make_client(store_copy)
    listing = client.get("/approvals.json").json()["approvals"]
    assert len(listing) > 3
    html = client.get("/approvals").text
    banner = page_text(html, "missing-runners")
    assert "for Agent 'refund-bot' (registered: none)" in banner
    assert "--agents MODULE:ATTR" in banner
    whole = page_text(html, "approvals-queue")
    assert whole.count("--agents") == 1
    assert whole.count("Cannot decide here") == 1
    assert "Cannot be decided here" not in whole
    for item in listing:
        assert "Read-only here" in page_text(html, f"approval-{item['execution_id']}")
        # The JSON keeps each card's own reason for scripts.
        assert "is registered in this localui process" in item["problem"]


@pytest.mark.parametrize("scenario", ["paused-1", "crashed-in-tool"])
def test_with_no_runner_registered_the_run_page_says_so_once(
    store_copy: Path,
    make_client: ClientFactory,
    seeded: Seeded,
    page_text: Callable[..., str],
    scenario: str,
) -> None:
    client = make_client(store_copy)
    run = seeded.id(scenario)
    html = client.get(f"/runs/{run}").text
    whole = page_text(html, "main")
    assert whole.count("is registered in this localui process") == 1, whole
    assert whole.count("--agents MODULE:ATTR") == 1
    assert "Cannot act on this run here: No agent named 'refund-bot'" in page_text(
        html, "runner-missing"
    )
    assert "Read-only here" in page_text(html, "actions")


def test_an_agent_without_the_paused_tool_is_refused_and_the_pause_kept(
    store_copy: Path,
    ledger: Ledger,
    make_acting_client: ActingClientFactory,
    raw: Callable[[Path], Raw],
    seeded: Seeded,
) -> None:
    from fastaiagent import Agent, tool
    from fastaiagent.checkpointers import SQLiteCheckpointer
    from fastaiagent.testing import FunctionModel

    @tool(name="notify_customer", register=False)
    def notify_customer(order_id: str, message: str) -> str:
        """Send the customer of an order a message."""
        return "sent"

    checkpointer = SQLiteCheckpointer(str(store_copy))
    wrong = Agent(
        name="refund-bot",
        llm=FunctionModel(lambda messages: "no"),
        tools=[notify_customer],
        checkpointer=checkpointer,
    )
    db = raw(store_copy)
    run = seeded.id("paused-1")
    client = make_acting_client(store_copy, agents=[wrong])
    shown = card(client, run)
    before = snapshot(db)

    response = decide(client, run, shown["checkpoint_id"])

    assert response.status_code == 422
    assert message(response) == (
        "Agent 'refund-bot' here has no tool 'refund' (it has: notify_customer). Register the "
        "agent built with the same tool list the run used; resuming without it would lose the "
        "pause."
    )
    assert shown["problem"] == message(response)
    assert snapshot(db) == before
    assert run in pending_ids(db)

    # The pause was not lost: an app with the right agent still decides it.
    right = make_acting_client(store_copy, ledger)
    assert decide(right, run, shown["checkpoint_id"]).json()["status"] == "completed"
    assert run_ends(db, run) == ["completed"]
    checkpointer.close()


# --- exactly once -----------------------------------------------------------------


def test_twenty_concurrent_approvals_resume_the_run_once(
    store_copy: Path,
    ledger: Ledger,
    make_acting_client: ActingClientFactory,
    raw: Callable[[Path], Raw],
    seeded: Seeded,
) -> None:
    client = make_acting_client(store_copy, ledger, raise_server_exceptions=False)
    db = raw(store_copy)
    run = seeded.id("paused-1")
    shown = card(client, run)
    rows_before = len(db.rows(run))

    responses = all_at_once(
        20, lambda i: decide(client, run, shown["checkpoint_id"], approver=f"approver-{i:02d}")
    )

    statuses = [r.status_code for r in responses]
    said = [message(r) for r in responses if r.status_code == 409]
    print(
        f"\none app, 20 clicks: {statuses.count(200)} win, {len(said)} conflicts (409: "
        f"{sum('already approved' in m for m in said)} 'already approved', "
        f"{sum('being approved' in m for m in said)} 'being approved'), "
        f"{sum(s >= 500 for s in statuses)} errors"
    )
    assert [s for s in statuses if s >= 500] == []
    assert statuses.count(200) == 1, statuses
    assert statuses.count(409) == 19, statuses
    [won] = [r.json() for r in responses if r.status_code == 200]
    assert won["status"] == "completed"
    winner = won["decision"]["approver"]
    for words in said:
        assert re.match(rf"This pause was (already|being) approved by {winner} ", words), words
    assert run_ends(db, run) == ["completed"]
    # One resume writes the next model turn and the run end, nothing more.
    assert len(db.rows(run)) == rows_before + 2
    assert [r["actor"] for r in decision_rows(db, run)] == [winner]
    assert run not in pending_ids(db)
    assert ledger.count() == 0


def test_a_second_tab_is_told_who_approved_and_when(
    desk: Desk, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("paused-3")
    shown = card(desk.client, run)

    first = decide(desk.client, run, shown["checkpoint_id"], approver="Ann", headers={})
    assert first.status_code == 200 and first.url.path == f"/approvals/{run}"
    decided_at = desk.client.get(f"/runs/{run}.json").json()["decisions"][0]["decided_at"]

    second = decide(desk.client, run, shown["checkpoint_id"], approver="Bob", headers={})

    assert second.status_code == 409
    assert page_text(second.text, "error") == (
        f"409 · Conflict This pause was already approved by Ann at {decided_at}."
    )
    as_json = decide(desk.client, run, shown["checkpoint_id"], approver="Bob")
    assert as_json.status_code == 409
    assert as_json.json()["error"]["details"]["decision"]["actor"] == "Ann"
    assert run_ends(desk.db, run) == ["completed"]
    assert [r["actor"] for r in decision_rows(desk.db, run)] == ["Ann"]


def test_a_decided_approval_page_shows_the_decision(
    desk: Desk, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("paused-1")
    shown = card(desk.client, run)
    decided = decide(desk.client, run, shown["checkpoint_id"], verb="reject", reason="duplicate")
    decided_at = decided.json()["decision"]["decided_at"]

    html = desk.client.get(f"/approvals/{run}").text

    assert "This run is not waiting for a person now." in page_text(html)
    assert sentences(page_text(html, "decisions")) == (
        f"Decisions Ann Approver rejected it at {decided_at}: the run completed. "
        f"Reason: “duplicate”. Done: refund of 250.00 on A-1002 declined: duplicate. "
        # One decision on the page: its row's id at the shortest, 8 characters.
        f"(row {shown['checkpoint_id'][:8]})"
    )
    assert approver_value(html, run) is None
    data = desk.client.get(f"/approvals/{run}.json").json()
    assert data["pending"] is None
    assert [d["approver"] for d in data["decisions"]] == ["Ann Approver"]


# --- resume a crashed or failed run ------------------------------------------------


def resume_point(client: TestClient, run: str) -> dict[str, Any]:
    plan = client.get(f"/runs/{run}.json").json()["resume"]
    assert plan is not None
    return dict(plan)


def died_in_its_tool_just_now(store: Path) -> str:
    """A run of the demo agent whose process died in its refund tool seconds ago, in
    ``store``: a child process of its own writes it, and dies as the scenario says."""
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false", "FASTAIAGENT_LOCAL_DB": str(store)}
    done = subprocess.run(
        [sys.executable, "-m", "localui.demo.worker", "--store", str(store)]
        + ["--scenario", "crashed-in-tool"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=store.parent,
    )
    assert done.returncode == EXIT_DIED_IN_TOOL, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.floor
def test_resume_of_a_run_that_died_in_its_tool_charges_once(
    desk: Desk, page_text: Callable[..., str]
) -> None:
    # Written now, not with the session's seed: however late this test runs, the
    # run's newest row is seconds old.
    run = died_in_its_tool_just_now(desk.store)
    plan = resume_point(desk.client, run)
    assert (plan["shape"], plan["tool"]) == ("tool", "refund")
    html = desk.client.get(f"/runs/{run}").text
    # Its rows are seconds old: the page asks whether the run's process is gone.
    assert "I know the run's process is gone" in page_text(html, "actions")
    before = snapshot(desk.db)

    unconfirmed = resume(desk.client, run, plan["checkpoint_id"], confirm=False)
    assert unconfirmed.status_code == 409
    assert re.match(
        r"The newest row is only \d+ s old: the run may still be alive", message(unconfirmed)
    )
    assert snapshot(desk.db) == before
    assert desk.ledger.count() == 0

    response = resume(desk.client, run, plan["checkpoint_id"])

    assert response.status_code == 200
    assert (response.json()["status"], response.json()["output"]) == (
        "completed",
        "Done: refunded 80.00 on A-1006.",
    )
    # The run died as refund started, before charging: the resume charges exactly once.
    assert desk.ledger.count("charge_back", "A-1006") == 1
    assert desk.ledger.count() == 1
    nodes = [r["node_id"] for r in desk.db.rows(run)]
    assert nodes == ["turn:0", "turn:0/tool:refund", "turn:1", "run_end"]
    assert run_ends(desk.db, run) == ["completed"]


def test_resume_of_a_run_that_died_waiting_on_the_model_charges_nothing(
    desk: Desk, seeded: Seeded
) -> None:
    run = seeded.id("crashed-waiting-on-model")
    plan = resume_point(desk.client, run)
    assert (plan["shape"], plan["node_id"]) == ("turn", "turn:1")

    response = resume(desk.client, run, plan["checkpoint_id"])

    assert response.status_code == 200
    assert response.json()["output"] == "Done: refunded 35.00 on A-1007."
    # The model call of turn 1 is issued again (a second turn:1 row); refund is not.
    nodes = [r["node_id"] for r in desk.db.rows(run)]
    assert nodes == ["turn:0", "turn:0/tool:refund", "turn:1", "turn:1", "run_end"]
    assert desk.ledger.count() == 0


def test_resume_of_a_failed_run(desk: Desk, seeded: Seeded, page_text: Callable[..., str]) -> None:
    run = seeded.id("failed")
    assert desk.client.get(f"/runs/{run}.json").json()["state"] == "failed"
    plan = resume_point(desk.client, run)
    assert (plan["shape"], plan["node_id"]) == ("turn", "turn:0")

    response = resume(desk.client, run, plan["checkpoint_id"], headers={})

    assert response.status_code == 200 and response.url.path == f"/runs/{run}"
    page = desk.client.get(f"/runs/{run}.json").json()
    assert page["state"] == "completed"
    assert [(d["kind"], d["approver"], d["outcome"]) for d in page["decisions"]] == [
        ("resume", "Ops Person", "completed")
    ]
    assert run_ends(desk.db, run) == ["failed", "completed"]
    # The model failed before it asked for a refund: the resume is its first charge.
    assert desk.ledger.count("charge_back", "A-1008") == 1
    assert desk.ledger.count() == 1
    assert "Ops Person resumed it at" in page_text(response.text, "decisions")


def test_concurrent_resumes_run_once(
    store_copy: Path,
    ledger: Ledger,
    make_acting_client: ActingClientFactory,
    raw: Callable[[Path], Raw],
    seeded: Seeded,
) -> None:
    client = make_acting_client(store_copy, ledger, raise_server_exceptions=False)
    db = raw(store_copy)
    run = seeded.id("crashed-in-tool")
    plan = resume_point(client, run)

    responses = all_at_once(
        10, lambda i: resume(client, run, plan["checkpoint_id"], actor=f"ops-{i}")
    )

    statuses = [r.status_code for r in responses]
    print(f"\none app, 10 resume clicks: {sorted(statuses)}")
    assert statuses.count(200) == 1, statuses
    # A loser is told who is resuming (or resumed) it, that it moved on from the row
    # it saw (409), or that it completed (422) -- never an error.
    assert set(statuses) <= {200, 409, 422}, [(r.status_code, r.text) for r in responses]
    [won] = [r.json() for r in responses if r.status_code == 200]
    winner = won["decision"]["approver"]
    for lost in (r for r in responses if r.status_code != 200):
        assert re.match(
            rf"This run was (being|already) resumed by {winner} "
            r"|the run would now re-enter at row "
            r"|The run completed: the SDK refuses to resume it",
            message(lost),
        ), message(lost)
    assert ledger.count("charge_back", "A-1006") == 1
    assert ledger.count() == 1
    assert run_ends(db, run) == ["completed"]
    assert len(decision_rows(db, run)) == 1


def test_a_completed_run_cannot_be_resumed_and_offers_fork(
    desk: Desk, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("completed")
    last = desk.db.rows(run)[-1]["checkpoint_id"]
    before = snapshot(desk.db)

    response = resume(desk.client, run, last)

    assert response.status_code == 422
    why = (
        "The run completed: the SDK refuses to resume it (AlreadyResumed), because that would "
        "repeat its side effects. Fork it from a row to run part of it again."
    )
    assert message(response) == why
    assert snapshot(desk.db) == before
    html = desk.client.get(f"/runs/{run}").text
    assert f'action="/runs/{run}/resume"' not in html
    actions = page_text(html, "actions")
    assert f"No resume: {why}" in actions
    assert f'<form method="post" action="/runs/{run}/fork"' in html


def test_an_orphaned_pause_is_explained_and_offers_no_resume_or_approve(
    desk: Desk, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    from fastaiagent.checkpointers import SQLiteCheckpointer

    run = seeded.id("paused-3")
    paused_row = card(desk.client, run)["checkpoint_id"]
    checkpointer = SQLiteCheckpointer(str(desk.store))
    try:
        claimed = checkpointer.delete_pending_interrupt_atomic(run)
    finally:
        checkpointer.close()
    assert claimed is not None

    page = desk.client.get(f"/runs/{run}.json").json()
    assert (page["state"], page["resume"]) == ("orphaned", None)
    html = desk.client.get(f"/runs/{run}").text
    assert page_text(html, "verdict").startswith("Orphaned pause at turn:0/tool:refund")
    assert "No resume: The run paused, and its pending approval was claimed" in page_text(
        html, "actions"
    )
    assert f'action="/runs/{run}/resume"' not in html
    assert f"/approvals/{run}/approve" not in html
    assert run not in {
        a["execution_id"] for a in desk.client.get("/approvals.json").json()["approvals"]
    }
    approval = desk.client.get(f"/approvals/{run}").text
    assert "This run is not waiting for a person now." in page_text(approval)
    assert approver_value(approval, run) is None

    refused = decide(desk.client, run, paused_row)
    assert refused.status_code == 404
    assert message(refused) == f"run {run!r} is not waiting for an approval"
    not_resumed = resume(desk.client, run, paused_row)
    assert not_resumed.status_code == 422
    assert message(not_resumed).startswith("The run paused, and its pending approval was claimed")
    assert desk.ledger.count() == 0
    assert run_ends(desk.db, run) == []


# --- fork ------------------------------------------------------------------------


def test_fork_from_a_row_links_both_ways(
    desk: Desk, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    source = seeded.id("completed")
    [row] = [r for r in desk.db.rows(source) if r["node_id"] == "turn:0/tool:refund"]
    runs_before = {r["execution_id"] for r in desk.db.query("SELECT execution_id FROM checkpoints")}

    response = desk.client.post(
        f"/runs/{source}/fork",
        data={"checkpoint_id": row["checkpoint_id"], "input": ""},
        follow_redirects=False,
    )

    assert response.status_code == 303
    match = re.fullmatch(r"/runs/([0-9a-f-]{36})", response.headers["location"])
    assert match is not None, response.headers["location"]
    new = match.group(1)
    runs_after = {r["execution_id"] for r in desk.db.query("SELECT execution_id FROM checkpoints")}
    assert runs_after - runs_before == {new}

    forked = desk.client.get(f"/runs/{new}.json").json()
    assert forked["fork_of"]["source_execution_id"] == source
    assert forked["fork_of"]["source_checkpoint_id"] == row["checkpoint_id"]
    html = desk.client.get(f"/runs/{new}").text
    assert f'href="/runs/{source}#row-{row["checkpoint_id"]}"' in html
    # The source's id as the lineage shows it: its shortest prefix, 8 characters.
    assert f"Forked from row turn:0/tool:refund of run {source[:8]} copy." in sentences(
        page_text(html, "lineage")
    )

    listed = desk.client.get(f"/runs/{source}.json").json()["forks"]
    assert new in {f["execution_id"] for f in listed}
    assert f'href="/runs/{new}"' in desk.client.get(f"/runs/{source}").text


def test_the_fork_panel_says_what_a_fork_runs_again_before_anyone_forks(
    desk: Desk, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("idempotent-resumed")
    [row] = [r for r in desk.db.rows(run) if r["node_id"] == "turn:0"]
    before = snapshot(desk.db)

    panel = page_text(desk.client.get(f"/runs/{run}").text, "actions")
    assert "a new input starts a fresh conversation" in panel
    assert "it reuses none of this run's @idempotent results" in panel
    query = {"checkpoint_id": row["checkpoint_id"]}
    fragment = desk.client.get(f"/runs/{run}/fork", params=query, headers=HTMX)
    said = desk.client.get(f"/runs/{run}/fork.json", params=query).json()

    assert fragment.status_code == 200 and "<html" not in fragment.text
    preview = sentences(page_text(fragment.text, "fork-preview"))
    assert 'After this row the original called refund(order_id="A-1009", amount=450.0).' in preview
    assert "No @idempotent result of this run is reused: a branch is a new execution." in preview
    assert "A new input starts a fresh conversation" in preview
    assert {k: said[k] for k in ("conversation", "model_called_again", "cached_reused")} == {
        "conversation": "continued",
        "model_called_again": True,
        "cached_reused": 0,
    }
    assert [(t["tool"], t["arguments"], t["cached_in_source"]) for t in said["tools_again"]] == [
        ("refund", {"order_id": "A-1009", "amount": 450.0}, True)
    ]
    assert snapshot(desk.db) == before and desk.ledger.count() == 0


@pytest.mark.parametrize(
    ("scenario", "node_id", "why"),
    [
        ("completed", "run_end", "This is the run-end marker, not a step"),
        ("fork-of-completed", "__fork_origin__", "This is the fork marker that opens this run"),
    ],
)
def test_fork_from_a_marker_row_is_refused(
    desk: Desk,
    seeded: Seeded,
    page_text: Callable[..., str],
    scenario: str,
    node_id: str,
    why: str,
) -> None:
    run = seeded.id(scenario)
    [row] = [r for r in desk.db.rows(run) if r["node_id"] == node_id]
    before = snapshot(desk.db)
    form = {"checkpoint_id": row["checkpoint_id"]}

    as_json = desk.client.post(f"/runs/{run}/fork", data=form, headers=JSON)
    as_page = desk.client.post(f"/runs/{run}/fork", data=form)

    assert as_json.status_code == as_page.status_code == 422
    assert message(as_json).startswith(why)
    assert why in page_text(as_page.text, "error")
    assert snapshot(desk.db) == before


# --- prune --------------------------------------------------------------------------


def test_prune_deletes_what_it_previewed_and_keeps_pauses(desk: Desk, seeded: Seeded) -> None:
    run = seeded.id("paused-1")
    shown = card(desk.client, run)
    preview = desk.client.get("/prune.json?older_than=0s").json()
    assert preview["would_delete"] == preview["checkpoint_rows"] + preview["cache_rows"] > 0
    assert preview["pauses_kept"] == INTERRUPTED_ROWS

    pruned = desk.client.post(
        "/prune",
        data={
            "older_than": "0s",
            "cutoff": preview["cutoff"],
            "prune_token": preview["prune_token"],
        },
        headers=JSON,
    )

    assert pruned.status_code == 200
    assert pruned.json()["deleted"] == preview["would_delete"]
    assert pruned.json()["cutoff"] == preview["cutoff"]
    left = desk.db.query("SELECT status, COUNT(*) AS n FROM checkpoints GROUP BY status")
    assert {r["status"]: r["n"] for r in left} == {"interrupted": INTERRUPTED_ROWS}
    assert len(pending_ids(desk.db)) == PENDING
    assert desk.db.query("SELECT COUNT(*) AS n FROM idempotency_cache")[0]["n"] == 0

    # The pause still works from its paused row alone.
    response = decide(desk.client, run, shown["checkpoint_id"])
    assert response.status_code == 200
    assert response.json()["output"] == "Done: refunded 250.00 on A-1002."
    assert run_ends(desk.db, run) == ["completed"]
    # Prune took the paused run's cache entry too, so the approval charged again.
    assert desk.ledger.count("charge_back", "A-1002") == 1
    assert desk.ledger.count() == 1


def test_the_prune_form_posts_back_the_previewed_cutoff(
    desk: Desk, page_text: Callable[..., str]
) -> None:
    html = desk.client.get("/prune?older_than=0s").text
    cutoff = re.search(r'<input type="hidden" name="cutoff" value="([^"]+)">', html)
    token = re.search(r'<input type="hidden" name="prune_token" value="([^"]+)">', html)
    count = re.search(r"Prune these (\d+) rows", html)
    assert cutoff is not None and token is not None and count is not None
    would_delete = int(count.group(1))
    assert (
        would_delete
        == desk.client.get("/prune.json", params={"older_than": "0s"}).json()["would_delete"]
    )

    done = desk.client.post(
        "/prune",
        data={"older_than": "0s", "cutoff": cutoff.group(1), "prune_token": token.group(1)},
    )

    assert done.status_code == 200
    assert (
        sentences(page_text(done.text)).count(
            f"Pruned {would_delete} rows (checkpoints and cache entries) older than "
            f"{cutoff.group(1)}."
        )
        == 1
    )
    after = desk.client.get("/prune.json", params={"older_than": "0s"}).json()
    assert (after["would_delete"], after["pauses_kept"]) == (0, INTERRUPTED_ROWS)


# --- guards: read-only, cross-site, GET -------------------------------------------


def every_post(client: TestClient, seeded: Seeded, db: Raw) -> list[tuple[str, dict[str, str]]]:
    """Each action with the form a person's click would send."""
    paused = seeded.id("paused-1")
    crashed = seeded.id("crashed-in-tool")
    completed = seeded.id("completed")
    paused_row = card(client, paused)["checkpoint_id"]
    return [
        (f"/approvals/{paused}/approve", {"approver": "Ann", "checkpoint_id": paused_row}),
        (
            f"/approvals/{paused}/reject",
            {"approver": "Ann", "reason": "no", "checkpoint_id": paused_row},
        ),
        (
            f"/runs/{crashed}/resume",
            {"checkpoint_id": db.rows(crashed)[-1]["checkpoint_id"], "confirm": "yes"},
        ),
        (f"/runs/{completed}/fork", {"checkpoint_id": db.rows(completed)[0]["checkpoint_id"]}),
        ("/prune", {"older_than": "0s"}),
    ]


def test_read_only_refuses_every_post_and_shows_no_action(
    store_copy: Path,
    ledger: Ledger,
    make_acting_client: ActingClientFactory,
    raw: Callable[[Path], Raw],
    seeded: Seeded,
    page_text: Callable[..., str],
) -> None:
    client = make_acting_client(store_copy, ledger, read_only=True)
    db = raw(store_copy)
    before = snapshot(db)

    for path, form in every_post(client, seeded, db):
        response = client.post(path, data=form, headers=JSON)
        assert response.status_code == 403, path
        assert message(response).startswith("this server is read-only"), path

    pages = ["/", "/approvals", "/prune?older_than=0s"]
    pages += [f"/runs/{seeded.id(name)}" for name in seeded.STATES]
    pages += [f"/approvals/{run}" for run in seeded.ids("paused")]
    for path in pages:
        html = client.get(path).text
        assert 'method="post"' not in html, path
        assert "hx-post" not in html, path
        for label in (
            ">Approve</button>",
            ">Reject</button>",
            "Resume at <code>",
            ">Fork</button>",
        ):
            assert label not in html, (path, label)
    assert "Read-only: decisions are made elsewhere." in page_text(client.get("/approvals").text)
    assert "Read-only: pruning is done elsewhere." in page_text(
        client.get("/prune?older_than=0s").text
    )
    # Nothing written, not even the app's own decision table.
    assert snapshot(db) == before
    assert decision_rows(db) == [] and len(before) == 3
    assert ledger.count() == 0


def test_cross_site_posts_are_refused_and_change_nothing(desk: Desk, seeded: Seeded) -> None:
    posts = every_post(desk.client, seeded, desk.db)
    before = snapshot(desk.db)

    for path, form in posts:
        both = desk.client.post(path, data=form, headers=CROSS_SITE)
        assert both.status_code == 403, path
        assert both.text == "Cross-site request refused (Sec-Fetch-Site: cross-site).", path
        origin_only = desk.client.post(path, data=form, headers={"Origin": CROSS_SITE["Origin"]})
        assert origin_only.status_code == 403, path
        assert "Origin http://evil.example is not this server" in origin_only.text, path

    assert snapshot(desk.db) == before
    assert desk.ledger.count() == 0
    # The same click from the app's own page goes through.
    path, form = posts[0]
    same = desk.client.post(
        path, data=form, headers={**JSON, "Sec-Fetch-Site": "same-origin", "Origin": SAME_ORIGIN}
    )
    assert same.status_code == 200 and same.json()["status"] == "completed"


def test_get_on_an_action_url_changes_nothing(desk: Desk, seeded: Seeded) -> None:
    posts = every_post(desk.client, seeded, desk.db)
    before = snapshot(desk.db)

    for path, form in posts:
        response = desk.client.get(path, params=form)
        if path == "/prune":
            assert response.status_code == 200
            assert "Prune these" in response.text  # a preview, not a prune
        elif path.endswith("/fork"):
            assert response.status_code == 200
            assert "What a fork from" in response.text  # a preview, not a fork
        else:
            assert response.status_code == 405, path

    assert snapshot(desk.db) == before
    assert len(pending_ids(desk.db)) == PENDING
    assert desk.ledger.count() == 0


# --- the approver, remembered ---------------------------------------------------------


def test_the_approver_cookie_prefills_the_next_card(desk: Desk, seeded: Seeded) -> None:
    first, nxt = seeded.id("paused-1"), seeded.id("paused-2")
    assert approver_value(desk.client.get("/approvals").text, nxt) == ""

    response = decide(
        desk.client, first, card(desk.client, first)["checkpoint_id"], approver=" Grace Manager "
    )

    assert response.status_code == 200
    assert "localui_approver=" in response.headers["set-cookie"]
    # Percent-encoded, so a name outside Latin-1 fits in the header too.
    assert desk.client.cookies.get("localui_approver") == "Grace%20Manager"
    assert approver_value(desk.client.get("/approvals").text, nxt) == "Grace Manager"
    assert approver_value(desk.client.get(f"/approvals/{nxt}").text, nxt) == "Grace Manager"


def test_the_approver_cookie_prefills_the_card_on_the_run_page(desk: Desk, seeded: Seeded) -> None:
    first, nxt = seeded.id("paused-1"), seeded.id("paused-2")
    assert approver_value(desk.client.get(f"/runs/{nxt}").text, nxt) == ""
    decide(desk.client, first, card(desk.client, first)["checkpoint_id"], approver="Grace Manager")

    assert approver_value(desk.client.get(f"/runs/{nxt}").text, nxt) == "Grace Manager"


# --- a busy store -------------------------------------------------------------------


def test_an_approval_waits_out_a_locked_database(
    desk: Desk, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("paused-1")
    shown = card(desk.client, run)
    locked = threading.Event()

    def hold_the_write_lock() -> None:
        conn = sqlite3.connect(desk.store, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            locked.set()
            time.sleep(1.0)
            conn.execute("COMMIT")
        finally:
            conn.close()

    holder = threading.Thread(target=hold_the_write_lock)
    holder.start()
    assert locked.wait(timeout=5)
    started = time.monotonic()
    fragment = decide(desk.client, run, shown["checkpoint_id"], headers=HTMX)
    waited = time.monotonic() - started
    holder.join()

    assert fragment.status_code == 200
    said = page_text(fragment.text, f"outcome-{run}")
    assert "The run completed: Done: refunded 250.00 on A-1002." in said
    assert "lock" not in fragment.text.lower()
    # The lock was in the way: the approval could not write before it was released.
    assert waited >= 0.8
    assert run_ends(desk.db, run) == ["completed"]
    [row] = decision_rows(desk.db, run)
    assert row["outcome"] == "completed"


# --- the nav badge ----------------------------------------------------------------


def every_page(seeded: Seeded, db: Raw) -> Sequence[str]:
    paused = seeded.id("paused-2")
    rows = [r["checkpoint_id"] for r in db.rows(paused)]
    other = db.rows(seeded.id("completed"))[0]["checkpoint_id"]
    return [
        "/",
        "/runs",
        "/runs?state=paused",
        f"/runs/{paused}",
        f"/runs/{paused}/rows/{rows[0]}",
        f"/runs/{paused}/diff?a={rows[0]}&b={rows[1]}",
        f"/diff?a={rows[0]}&b={other}",
        "/approvals",
        f"/approvals/{paused}",
        "/prune",
    ]


def test_the_nav_badge_counts_pending_approvals_on_every_page(
    desk: Desk, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    pages = every_page(seeded, desk.db)
    for path in pages:
        response = desk.client.get(path)
        assert response.status_code == 200, path
        assert page_text(response.text, "nav-pending") == str(PENDING), path

    run = seeded.id("paused-1")
    decide(desk.client, run, card(desk.client, run)["checkpoint_id"])

    for path in pages:
        assert page_text(desk.client.get(path).text, "nav-pending") == str(PENDING - 1), path


def test_the_nav_badge_counts_pending_approvals_on_error_pages(
    desk: Desk, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("paused-1")
    paused_row = card(desk.client, run)["checkpoint_id"]
    assert decide(desk.client, run, paused_row, headers={}).status_code == 200
    completed = seeded.id("completed")
    last = desk.db.rows(completed)[-1]["checkpoint_id"]

    for status, response in [
        (404, desk.client.get("/runs/no-such-run")),
        (409, decide(desk.client, run, paused_row, approver="Bob", headers={})),
        (422, resume(desk.client, completed, last, headers={})),
    ]:
        assert response.status_code == status
        assert page_text(response.text, "nav-pending") == str(PENDING - 1), status
