# ruff: noqa: F811
"""Edit a row and go on: the branch goes on from the edit, as the SDK carries it.

Each test edits a copy of a store the real SDK wrote (both backends) through the app's
``POST /runs/{id}/fork``, then reads what the branch did: the demo's model answers from
the conversation it was sent (its final answer repeats the last tool results; its tool
call repeats the amount the user asked for), and its tools note each call. The source
run's rows must stay byte for byte as they were.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from conftest import BASE_URL, LOOPBACK_CLIENT
from starlette.testclient import TestClient

# The store copies (both backends, fixtures ``seeds`` and ``copy``) and the runners the
# fork predictions use; the tests take ``copy`` by name, as pytest hands fixtures.
from test_predictions import Copy, copy, every_row, runners, seeds  # noqa: F401

from localui.app import create_app
from localui.demo import teams
from localui.records import EDIT

JSON = {"Accept": "application/json"}


def edits_of(copy: Copy, branch: str) -> list[Any]:
    log = copy.backend.decision_log(writable=False)
    try:
        return [d for d in log.list_for_run(branch) if d.kind == EDIT]
    finally:
        log.close()


def rows_with_tool_result(copy: Copy, execution_id: str) -> Any:
    """The first row whose conversation ends with a tool's result (the model is next)."""
    for row in copy.store.list_rows(execution_id):
        detail = copy.store.get_row(row.checkpoint_id)
        messages = (detail.state_snapshot.get("messages") if detail else None) or []
        if messages and messages[-1].get("role") == "tool" and row.step_type != "run_end":
            return row, detail
    raise AssertionError("the run has no row after a tool's result")


def paused_chain(copy: Copy) -> tuple[str, Any, Any]:
    """The demo's paused chain: its id, its pending pause and the row the pause waits at."""
    execution_id = copy.report.run_id("chain-paused")
    pending = copy.store.get_pending(execution_id)
    assert pending is not None
    paused_row = copy.store.get_row(pending.checkpoint_id)
    assert paused_row is not None
    return execution_id, pending, paused_row


@pytest.mark.postgres
def test_an_edited_tool_result_is_what_the_model_sees(copy: Copy) -> None:
    execution_id = copy.report.run_id("completed")
    row, detail = rows_with_tool_result(copy, execution_id)
    messages = json.loads(json.dumps(detail.state_snapshot["messages"]))
    messages[-1]["content"] = "refunded 1.00 on A-1003 (edited)"
    events: list[str] = []
    app = create_app(copy.settings, agents=list(runners(copy.checkpointer, events).values()))
    before = every_row(copy.store, execution_id)
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        answer = client.post(
            f"/runs/{execution_id}/fork",
            data={
                "checkpoint_id": row.checkpoint_id,
                "messages": json.dumps(messages),
                "actor": "Ada",
            },
            headers=JSON,
        )
        assert answer.status_code == 200, answer.text
        branch = answer.json()["new_execution_id"]
        page = client.get(f"/runs/{branch}")
        source_page = client.get(f"/runs/{execution_id}")
        audited = client.get(f"/audit.json?run={execution_id}").json()["entries"]
    assert every_row(copy.store, execution_id) == before, "the source run changed"
    # The audit log calls it an edit, not a plain fork.
    assert [(e["action"], e["status"]) for e in audited] == [("edit", 200)]
    # The model was called again, saw the edited result, and answered from it.
    assert answer.json()["output"] == "Done: refunded 1.00 on A-1003 (edited).", answer.json()
    assert [e for e in events if e.startswith("tool:")] == [], "no tool ran again"
    assert events.count("model:refund-bot") == 1
    branch_rows = copy.store.list_rows(branch)
    origin = branch_rows[0]
    assert origin.node_id == "__fork_origin__" and origin.parent_checkpoint_id == row.checkpoint_id
    assert [r.status for r in branch_rows if r.step_type == "run_end"] == ["completed"]
    # Who edited what is kept with the branch.
    (decision,) = edits_of(copy, branch)
    assert decision.actor == "Ada" and decision.outcome == "completed"
    assert decision.metadata is not None
    assert decision.metadata["source_execution_id"] == execution_id
    assert decision.metadata["changes"][0]["what"] == "result"
    assert decision.metadata["changes"][0]["after"] == "refunded 1.00 on A-1003 (edited)"
    # Both pages say so.
    assert page.status_code == 200 and "refunded 1.00 on A-1003 (edited)" in page.text
    assert "edited" in page.text and "Ada" in page.text
    assert source_page.status_code == 200 and f"/runs/{branch}" in source_page.text
    assert "edited by Ada" in source_page.text


@pytest.mark.postgres
def test_an_edited_request_makes_the_model_call_the_tool_with_the_new_amount(
    copy: Copy,
) -> None:
    execution_id = copy.report.run_id("completed")
    first = copy.store.list_rows(execution_id)[0]
    detail = copy.store.get_row(first.checkpoint_id)
    assert detail is not None
    messages = json.loads(json.dumps(detail.state_snapshot["messages"]))
    user = next(m for m in messages if m["role"] == "user")
    user["content"] = "Refund order A-1003 for 12.50"
    events: list[str] = []
    app = create_app(copy.settings, agents=list(runners(copy.checkpointer, events).values()))
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        answer = client.post(
            f"/runs/{execution_id}/fork",
            data={"checkpoint_id": first.checkpoint_id, "messages": json.dumps(messages)},
            headers=JSON,
        )
    assert answer.status_code == 200, answer.text
    branch = answer.json()["new_execution_id"]
    refunds = [
        copy.store.get_row(r.checkpoint_id)
        for r in copy.store.list_rows(branch)
        if r.node_id.endswith("/tool:refund")
    ]
    assert refunds and refunds[0] is not None
    assert refunds[0].node_input == {"order_id": "A-1003", "amount": 12.5}
    assert "tool:refund-bot:refund" in events


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("edit", "status", "said"),
    [
        ("not json", 400, "messages is not JSON"),
        ('{"role": "user"}', 400, "JSON list of messages"),
        ('[{"role": "robot", "content": "x"}]', 400, "role must be one of"),
        ('[{"role": "tool", "content": "x", "tool_call_id": "c9"}]', 400, "no earlier"),
        (
            '[{"role": "user", "content": "Refund order A-1 for 5.00"}, {"role": "assistant", '
            '"tool_calls": [{"id": "c1", "name": "launch_rockets", "arguments": {}}]}]',
            422,
            "calls 'launch_rockets'",
        ),
        ("SAME", 400, "nothing was edited"),
    ],
)
def test_a_bad_edit_is_refused_and_changes_nothing(
    copy: Copy, edit: str, status: int, said: str
) -> None:
    execution_id = copy.report.run_id("completed")
    row, detail = rows_with_tool_result(copy, execution_id)
    if edit == "SAME":
        edit = json.dumps(detail.state_snapshot["messages"])
    events: list[str] = []
    app = create_app(copy.settings, agents=list(runners(copy.checkpointer, events).values()))
    runs_before = copy.store.count_runs() if hasattr(copy.store, "count_runs") else None
    before = every_row(copy.store, execution_id)
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        answer = client.post(
            f"/runs/{execution_id}/fork",
            data={"checkpoint_id": row.checkpoint_id, "messages": edit},
            headers=JSON,
        )
    assert answer.status_code == status, answer.text
    assert said in answer.json()["error"]["message"]
    assert events == []
    assert every_row(copy.store, execution_id) == before
    if runs_before is not None:
        assert copy.store.count_runs() == runs_before


@pytest.mark.postgres
def test_a_chain_s_edited_state_is_what_its_next_nodes_read(copy: Copy) -> None:
    execution_id = copy.report.run_id("chain-paused")
    rows = copy.store.list_rows(execution_id)
    row = next(r for r in rows if r.node_id == "step_1_lookup")
    detail = copy.store.get_row(row.checkpoint_id)
    assert detail is not None
    state = dict(detail.state_snapshot)
    events: list[str] = []
    app = create_app(copy.settings, agents=list(runners(copy.checkpointer, events).values()))
    # The nodes after the row read ``state.order_id`` (their input mapping).
    key = "order_id"
    assert isinstance(state.get(key), str), state
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        typed = client.post(
            f"/runs/{execution_id}/fork",
            data={"checkpoint_id": row.checkpoint_id, "state": json.dumps({**state, key: 3})},
            headers=JSON,
        )
        assert typed.status_code == 400 and "stays text" in typed.json()["error"]["message"]
        answer = client.post(
            f"/runs/{execution_id}/fork",
            data={
                "checkpoint_id": row.checkpoint_id,
                "state": json.dumps({**state, key: "Z-9"}),
            },
            headers=JSON,
        )
    assert answer.status_code == 200, answer.text
    branch = answer.json()["new_execution_id"]
    origin = copy.store.list_rows(branch)[0]
    after = copy.store.get_row(origin.checkpoint_id)
    assert after is not None
    (decision,) = edits_of(copy, branch)
    assert decision.metadata is not None and decision.metadata["changes"][0]["key"] == key
    later = [copy.store.get_row(r.checkpoint_id) for r in copy.store.list_rows(branch)]
    seen = [(d.header.node_id, d.state_snapshot.get(key)) for d in later if d is not None]
    assert seen[0][0] == "__fork_origin__", seen
    assert seen[0][1] == "Z-9", seen
    outputs = [d.state_snapshot.get("output") for d in later[1:] if d is not None]
    assert "refund 300.00 on Z-9" in outputs, outputs
    assert f"tool:{teams.CHAIN_NAME}:plan_refund" in events


@pytest.mark.postgres
def test_the_editor_shows_the_row_and_its_fields_go_on_from_the_edit(copy: Copy) -> None:
    execution_id = copy.report.run_id("completed")
    row, detail = rows_with_tool_result(copy, execution_id)
    last = len(detail.state_snapshot["messages"]) - 1
    events: list[str] = []
    app = create_app(copy.settings, agents=list(runners(copy.checkpointer, events).values()))
    before = every_row(copy.store, execution_id)
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        run_page = client.get(f"/runs/{execution_id}")
        editor = client.get(
            f"/runs/{execution_id}/edit", params={"checkpoint_id": row.checkpoint_id}
        )
        missing = client.get(f"/runs/{execution_id}/edit", params={"checkpoint_id": "nope"})
        assert every_row(copy.store, execution_id) == before, "a GET changed the run"
        answer = client.post(
            f"/runs/{execution_id}/fork",
            data={
                "checkpoint_id": row.checkpoint_id,
                "edit": "fields",
                f"content.{last}": "refunded 2.00 on A-1003 (typed)",
                "actor": "Grace",
            },
            follow_redirects=False,
        )
    assert "Edit the row and go on" in run_page.text
    assert editor.status_code == 200, editor.text
    assert f'name="content.{last}"' in editor.text and "Go on from here" in editor.text
    assert missing.status_code == 404
    assert answer.status_code == 303, answer.text
    branch = answer.headers["location"].rsplit("/", 1)[1]
    (decision,) = edits_of(copy, branch)
    assert decision.actor == "Grace"
    assert decision.detail == "Done: refunded 2.00 on A-1003 (typed)."
    assert every_row(copy.store, execution_id) == before


@pytest.mark.postgres
@pytest.mark.parametrize("role", ["viewer", "approver"])
def test_only_operators_edit_and_no_other_site_can(copy: Copy, role: str) -> None:
    from helpers import sign_in_settings

    from localui.backends import open_users
    from localui.backends.users import new_token, token_hash

    execution_id = copy.report.run_id("completed")
    row, detail = rows_with_tool_result(copy, execution_id)
    messages = json.loads(json.dumps(detail.state_snapshot["messages"]))
    messages[-1]["content"] = "refunded 3.00 (edited)"
    settings = dataclasses.replace(copy.settings, sign_in=sign_in_settings())
    users = open_users(settings, writable=True)
    token = new_token()
    users.add(f"a-{role}", role, token_hash(token))
    users.close()
    events: list[str] = []
    app = create_app(settings, agents=list(runners(copy.checkpointer, events).values()))
    before = every_row(copy.store, execution_id)
    runs_before = copy.store.list_forks(execution_id)
    data = {"checkpoint_id": row.checkpoint_id, "messages": json.dumps(messages)}
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        refused = client.post(
            f"/runs/{execution_id}/fork",
            data=data,
            headers={**JSON, "Authorization": f"Bearer {token}"},
        )
        cross_site = client.post(
            f"/runs/{execution_id}/fork",
            data=data,
            headers={"Sec-Fetch-Site": "cross-site", "Origin": "https://elsewhere.example"},
        )
    assert refused.status_code == 403, refused.text
    assert cross_site.status_code == 403
    assert events == []
    assert every_row(copy.store, execution_id) == before
    assert copy.store.list_forks(execution_id) == runs_before


@pytest.mark.postgres
def test_a_crashed_chain_resumes_with_its_state_edited(copy: Copy) -> None:
    execution_id = copy.report.run_id("chain-crashed")
    events: list[str] = []
    app = create_app(copy.settings, agents=list(runners(copy.checkpointer, events).values()))
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        plan = client.get(f"/runs/{execution_id}.json").json()["resume"]
        reentry = copy.store.get_row(plan["checkpoint_id"])
        assert reentry is not None
        state = {**reentry.state_snapshot, "order_id": "Z-9"}
        editor = client.get(
            f"/runs/{execution_id}/edit", params={"checkpoint_id": plan["checkpoint_id"]}
        )
        crashed_agent = copy.report.run_id("crashed-in-tool")
        agent_plan = client.get(f"/runs/{crashed_agent}.json").json()["resume"]
        agent_state = client.post(
            f"/runs/{crashed_agent}/resume",
            data={
                "checkpoint_id": agent_plan["checkpoint_id"],
                "state": '{"x": 1}',
                "confirm": "yes",
            },
            headers=JSON,
        )
        answer = client.post(
            f"/runs/{execution_id}/resume",
            data={
                "checkpoint_id": plan["checkpoint_id"],
                "state": json.dumps(state),
                "confirm": "yes",
                "actor": "Ada",
            },
            headers=JSON,
        )
        page = client.get(f"/runs/{execution_id}")
    assert "Resume this run with this state" in editor.text
    assert agent_state.status_code == 400, agent_state.text
    assert "only a chain" in agent_state.json()["error"]["message"]
    assert answer.status_code == 200, answer.text
    # The refund node ran again, on the edited order, and asked a manager again.
    assert f"tool:{teams.CHAIN_NAME}:refund" in events
    refunds = [
        copy.store.get_row(r.checkpoint_id)
        for r in copy.store.list_rows(execution_id)
        if r.node_id == "step_3_refund" and r.created_at >= reentry.header.created_at
    ]
    assert any(d is not None and d.state_snapshot.get("order_id") == "Z-9" for d in refunds)
    assert "state.order_id" in page.text and "Z-9" in page.text


@pytest.mark.postgres
def test_a_paused_chain_is_approved_with_its_state_edited(copy: Copy) -> None:
    """Signed in: an operator approves a paused chain with its state edited (the SDK's
    ``Chain.aresume(modified_state=, resume_value=)``); an approver may not edit, and an
    agent's pause has no state to edit. The refund node runs again on the edited order."""
    from helpers import sign_in_settings

    from localui.backends import open_users
    from localui.backends.users import new_token, token_hash

    execution_id, pending, paused_row = paused_chain(copy)
    agent_paused = copy.report.run_id("paused-1")
    state = {**paused_row.state_snapshot, "order_id": "Z-9"}
    settings = dataclasses.replace(copy.settings, sign_in=sign_in_settings())
    users = open_users(settings, writable=True)
    tokens = {role: new_token() for role in ("operator", "approver")}
    for role, token in tokens.items():
        users.add(f"an-{role}", role, token_hash(token))
    users.close()
    as_ = {role: {**JSON, "Authorization": f"Bearer {t}"} for role, t in tokens.items()}
    events: list[str] = []
    app = create_app(settings, agents=list(runners(copy.checkpointer, events).values()))
    before = every_row(copy.store, execution_id)
    decide = {"checkpoint_id": pending.checkpoint_id, "state": json.dumps(state), "reason": "typo"}
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        editor = client.get(
            f"/runs/{execution_id}/edit",
            params={"checkpoint_id": pending.checkpoint_id},
            headers={"Authorization": f"Bearer {tokens['operator']}"},
        )
        by_approver = client.post(
            f"/approvals/{execution_id}/approve", data=decide, headers=as_["approver"]
        )
        unchanged = client.post(
            f"/approvals/{execution_id}/approve",
            data={**decide, "state": json.dumps(paused_row.state_snapshot)},
            headers=as_["operator"],
        )
        retyped = client.post(
            f"/approvals/{execution_id}/approve",
            data={**decide, "state": json.dumps({**state, "order_id": 9})},
            headers=as_["operator"],
        )
        agent_pending = copy.store.get_pending(agent_paused)
        assert agent_pending is not None
        on_agent = client.post(
            f"/approvals/{agent_paused}/approve",
            data={"checkpoint_id": agent_pending.checkpoint_id, "state": '{"x": 1}'},
            headers=as_["operator"],
        )
        assert every_row(copy.store, execution_id) == before, "a refused edit changed the run"
        assert events == []
        answer = client.post(
            f"/approvals/{execution_id}/approve", data=decide, headers=as_["operator"]
        )
        page = client.get(
            f"/runs/{execution_id}", headers={"Authorization": f"Bearer {tokens['operator']}"}
        )
    assert editor.status_code == 200 and "Approve with this state" in editor.text
    assert by_approver.status_code == 403, by_approver.text
    assert unchanged.status_code == 400 and "nothing was edited" in unchanged.text
    assert retyped.status_code == 400 and "stays text" in retyped.text
    assert on_agent.status_code == 400 and "only a chain" in on_agent.text
    assert copy.store.get_pending(agent_paused) is not None, "the agent's pause was lost"
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "completed", answer.json()
    # The refund node ran again on the edited order, approved, and the chain went on.
    assert events[:2] == [
        f"tool:{teams.CHAIN_NAME}:refund",
        f"tool:{teams.CHAIN_NAME}:notify_customer",
    ], events
    later = [
        copy.store.get_row(r.checkpoint_id)
        for r in copy.store.list_rows(execution_id)
        if r.created_at >= paused_row.header.created_at
    ]
    outputs = [d.state_snapshot.get("output") for d in later if d is not None]
    assert "refunded 300.00 on Z-9" in outputs, outputs
    # The record keeps who approved with which edit; the tool was handed no edit.
    log = copy.backend.decision_log(writable=False)
    try:
        (decision,) = [d for d in log.list_for_run(execution_id) if d.kind == "approval"]
    finally:
        log.close()
    assert decision.actor == "an-operator" and decision.approved is True
    assert decision.edited_state == state
    assert decision.resume_metadata == {"approver": "an-operator", "reason": "typo"}
    assert "state.order_id" in page.text and "Z-9" in page.text


@pytest.mark.postgres
def test_an_approval_with_an_edited_state_whose_process_died_is_carried_out_with_it(
    copy: Copy,
) -> None:
    """What a process killed after recording the claim leaves behind: the next localui
    carries the approval out once its lease ran out, with the same edited state."""
    import time

    from localui.records import STATE_EDIT

    execution_id, pending, paused_row = paused_chain(copy)
    state = {**paused_row.state_snapshot, "order_id": "Q-4"}
    log = copy.backend.decision_log(writable=True)
    try:
        claim = log.claim(
            kind="approval",
            execution_id=execution_id,
            checkpoint_id=pending.checkpoint_id,
            approved=True,
            actor="Cy",
            reason="",
            still_pending=lambda: True,
            metadata={"approver": "Cy", "reason": "", STATE_EDIT: {"state": state, "changes": []}},
        )
        assert claim.won
    finally:
        log.close()
    events: list[str] = []
    settings = dataclasses.replace(copy.settings, claim_lease_seconds=1.0)
    app = create_app(settings, agents=list(runners(copy.checkpointer, events).values()))
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT):
        deadline = time.monotonic() + 60
        while f"tool:{teams.CHAIN_NAME}:notify_customer" not in events:
            assert time.monotonic() < deadline, events
            time.sleep(0.2)
    outputs = [
        d.state_snapshot.get("output")
        for d in (copy.store.get_row(r.checkpoint_id) for r in copy.store.list_rows(execution_id))
        if d is not None
    ]
    assert "refunded 300.00 on Q-4" in outputs, outputs
    assert events.count(f"tool:{teams.CHAIN_NAME}:refund") == 1, events


@pytest.mark.postgres
def test_the_editor_s_preview_says_what_the_edited_branch_does(copy: Copy) -> None:
    execution_id = copy.report.run_id("completed")
    row, detail = rows_with_tool_result(copy, execution_id)
    count = len(detail.state_snapshot["messages"])
    events: list[str] = []
    app = create_app(copy.settings, agents=list(runners(copy.checkpointer, events).values()))
    before = every_row(copy.store, execution_id)
    # Drop the tool's result: the call is left unanswered, so the branch does not run it.
    fields = {"checkpoint_id": row.checkpoint_id, "edit": "fields", "remove_from": str(count)}
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        preview = client.post(f"/runs/{execution_id}/edit/preview", data=fields, headers=JSON)
        html = client.post(f"/runs/{execution_id}/edit/preview", data=fields)
        assert every_row(copy.store, execution_id) == before, "a preview changed the run"
        assert events == []
        went = client.post(f"/runs/{execution_id}/fork", data=fields, headers=JSON)
    assert preview.status_code == 200, preview.text
    said = preview.json()
    assert said["conversation"] == "continued" and said["model_called_again"] is True
    assert [c.split("(")[0] for c in said["not_run"]] == ["refund"], said
    assert "From the edited conversation" in html.text
    assert went.status_code == 200, went.text
    # As previewed: the model was called again and no tool ran.
    assert events == ["model:refund-bot"], events
    branch = went.json()["new_execution_id"]
    origin = copy.store.get_row(copy.store.list_rows(branch)[0].checkpoint_id)
    assert origin is not None
    notes = origin.state_snapshot["messages"][count - 1 :]
    assert len(notes) == 1 and "branched before its result" in str(notes[0]["content"])


@pytest.mark.postgres
@pytest.mark.parametrize("case", ["run-end row", "no runner", "read-only", "supervisor"])
def test_an_edit_the_app_cannot_carry_out_is_refused_before_anything_runs(
    copy: Copy, case: str
) -> None:
    name = "supervisor-paused" if case == "supervisor" else "completed"
    execution_id = copy.report.run_id(name)
    rows = copy.store.list_rows(execution_id)
    row = rows[-1] if case == "run-end row" else rows[0]
    detail = copy.store.get_row(row.checkpoint_id)
    assert detail is not None
    messages = json.loads(json.dumps(detail.state_snapshot.get("messages") or []))
    messages.append({"role": "user", "content": "and notify the customer"})
    events: list[str] = []
    settings = copy.settings
    if case == "read-only":
        settings = dataclasses.replace(settings, read_only=True)
    agents = [] if case == "no runner" else list(runners(copy.checkpointer, events).values())
    app = create_app(settings, agents=agents)
    before = every_row(copy.store, execution_id)
    forks = copy.store.list_forks(execution_id)
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        answer = client.post(
            f"/runs/{execution_id}/fork",
            data={"checkpoint_id": row.checkpoint_id, "messages": json.dumps(messages)},
            headers=JSON,
        )
    expected = {
        "run-end row": (422, "run-end marker"),
        "no runner": (422, "refund-bot"),
        "read-only": (403, "read-only"),
        "supervisor": (422, "no fork for a supervisor"),
    }[case]
    assert answer.status_code == expected[0], answer.text
    assert expected[1] in answer.json()["error"]["message"].lower()
    assert events == []
    assert every_row(copy.store, execution_id) == before
    assert copy.store.list_forks(execution_id) == forks


@pytest.mark.postgres
def test_an_edit_whose_process_died_is_closed_not_run_again(copy: Copy) -> None:
    import time

    execution_id = copy.report.run_id("completed")
    row, detail = rows_with_tool_result(copy, execution_id)
    messages = json.loads(json.dumps(detail.state_snapshot["messages"]))
    messages[-1]["content"] = "refunded 4.00 (edited)"
    events: list[str] = []
    app = create_app(copy.settings, agents=list(runners(copy.checkpointer, events).values()))
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        branch = client.post(
            f"/runs/{execution_id}/fork",
            data={"checkpoint_id": row.checkpoint_id, "messages": json.dumps(messages)},
            headers=JSON,
        ).json()["new_execution_id"]
    # What a process killed while its branch ran leaves behind: a claim nobody finishes.
    log = copy.backend.decision_log(writable=True)
    try:
        claim = log.claim(
            kind=EDIT,
            execution_id=branch,
            checkpoint_id="a-second-edit",
            approved=None,
            actor="Dee",
            reason="",
            still_pending=lambda: False,
            metadata={"source_execution_id": execution_id, "changes": []},
        )
        assert claim.won
    finally:
        log.close()
    events.clear()
    quick = dataclasses.replace(copy.settings, claim_lease_seconds=1.0)
    app = create_app(quick, agents=list(runners(copy.checkpointer, events).values()))
    deadline = time.monotonic() + 30
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT):
        while time.monotonic() < deadline:
            found = [d for d in edits_of(copy, branch) if d.actor == "Dee"]
            if found and found[0].outcome is not None:
                break
            time.sleep(0.2)
    (closed,) = [d for d in edits_of(copy, branch) if d.actor == "Dee"]
    assert closed.outcome == "completed", closed
    assert "ended" in (closed.detail or "")
    assert events == [], "the branch was run a second time"
    assert [r.status for r in copy.store.list_rows(branch) if r.step_type == "run_end"] == [
        "completed"
    ]
