"""Approval policies on real pauses the SDK wrote, on SQLite and on PostgreSQL: who may
decide, two people where a rule says so (exactly once), and the typed fields the tool
receives in ``Resume.metadata``.

Each test serves a fresh copy of the seeded runs with the refund-bot registered; the
people sign in with personal tokens from the store's own users table.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from helpers import JSON, TEST_TOKEN, all_at_once, sign_in_settings

from localui.backends.users import token_hash
from localui.policy import Policy, parse_policy

if TYPE_CHECKING:
    from starlette.testclient import TestClient

TWO_FROM_FINANCE = """
[[rule]]
name = "large refunds"
agent = "refund-*"
reason = "manager_*"
tool = "ref?nd"
approvers = ["group:finance", "user:ada"]
approvals = 2

[[rule.field]]
name = "amount"
type = "number"
label = "Amount to refund"
default = "context.amount"
min = 1
max = "context.amount"
required = true
"""

#: Matches no pause of the seed: its tool glob names another tool.
OTHER_TOOL = """
[[rule]]
name = "notices"
agent = "refund-*"
tool = "notify_*"
approvers = ["user:nobody-here"]
"""


@dataclass
class Desk:
    """An app acting on a fresh copy of the seeded runs, its users table, and plain
    SQL on the app's own tables and the run's rows."""

    client: TestClient
    ids: Callable[[str], str]
    users: Any
    query: Callable[[str, tuple[Any, ...]], list[dict[str, Any]]]
    execute: Callable[[str, tuple[Any, ...]], int]
    #: Python that opens the served store's decision log, for a process of its own.
    open_log: str
    #: ``--store`` (and the schemas) as ``localui decisions export`` takes them.
    export_args: list[str] = field(default_factory=list)
    #: Another app over the same store, with these settings changed.
    client_with: Callable[..., TestClient] | None = None

    def votes(self, run: str) -> list[str]:
        rows = self.query("SELECT actor FROM {app}localui_votes WHERE execution_id = ?", (run,))
        return [r["actor"] for r in rows]

    def decisions(self, run: str) -> list[dict[str, Any]]:
        rows = self.query(
            "SELECT actor, approved, outcome, metadata FROM {app}localui_decisions"
            " WHERE execution_id = ? ORDER BY id",
            (run,),
        )
        for row in rows:
            # JSON text on SQLite, decoded JSONB on PostgreSQL.
            if isinstance(row["metadata"], str):
                row["metadata"] = json.loads(row["metadata"])
        return rows

    def run_ends(self, run: str) -> list[str]:
        rows = self.query(
            "SELECT status FROM {sdk}checkpoints WHERE execution_id = ? AND step_type = 'run_end'",
            (run,),
        )
        return [r["status"] for r in rows]

    def add(self, name: str, role: str = "approver", *groups: str) -> dict[str, str]:
        """A person in the users table; the headers their scripts sign in with."""
        token = f"token-of-{name}-0123456789abcdef"
        self.users.add(name, role, token_hash(token), groups)
        return {**JSON, "Authorization": f"Bearer {token}"}


@pytest.fixture(params=["sqlite", "postgres"])
def open_desk(request: pytest.FixtureRequest) -> Iterator[Callable[..., Desk]]:
    """``open_desk(policy_text, **settings)``: a :class:`Desk` with sign-in on."""
    closing: list[Any] = []

    def make(policy_text: str, **settings: Any) -> Desk:
        settings.setdefault("sign_in", sign_in_settings())
        policy: Policy = parse_policy(policy_text, "policy.toml")
        if request.param == "sqlite":
            from conftest import Raw

            from localui.backends.sqlite.users import SQLiteUsers

            path: Path = request.getfixturevalue("copy_store")()
            make_client = request.getfixturevalue("make_acting_client")

            def client_with(**more: Any) -> TestClient:
                return make_client(
                    path, policy=policy, raise_server_exceptions=False, **(settings | more)
                )

            client = client_with()
            export_args = ["--store", str(path)]
            raw = Raw(path)
            users = SQLiteUsers(path, writable=True)
            ids = request.getfixturevalue("seeded").id

            def query(sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
                rows = raw.query(sql.format(app="", sdk=""), params)
                return [dict(zip(r.keys(), r, strict=True)) for r in rows]

            def execute(sql: str, params: tuple[Any, ...]) -> int:
                return raw.execute(sql.format(app="", sdk=""), params)

            open_log = (
                "from localui.backends.sqlite.decisions import SQLiteDecisionLog as Log;"
                f" log = Log({str(path)!r})"
            )

        else:
            from localui.backends.postgres.users import PostgresUsers

            store = request.getfixturevalue("pg_store")
            make_pg = request.getfixturevalue("make_pg_client")

            def client_with(**more: Any) -> TestClient:
                return make_pg(
                    store, policy=policy, raise_server_exceptions=False, **(settings | more)
                )

            client = client_with()
            export_args = [
                "--store",
                store.dsn,
                "--pg-schema",
                store.schema,
                "--pg-app-schema",
                store.app_schema,
            ]
            users = PostgresUsers(store.dsn, schema=store.app_schema, writable=True)
            ids = request.getfixturevalue("pg_seeded").id

            def query(sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
                text = sql.format(app=f"{store.app_schema}.", sdk=f"{store.schema}.")
                return store.raw.query(text.replace("?", "%s"), params)

            def execute(sql: str, params: tuple[Any, ...]) -> int:
                text = sql.format(app=f"{store.app_schema}.", sdk=f"{store.schema}.")
                return store.raw.execute(text.replace("?", "%s"), params)

            open_log = (
                "from localui.backends.postgres.decisions import PostgresDecisionLog as Log;"
                f" log = Log({store.dsn!r}, schema={store.app_schema!r})"
            )

        closing.append(users)
        return Desk(client, ids, users, query, execute, open_log, export_args, client_with)

    yield make
    for users in closing:
        users.close()


def approve(
    desk: Desk, run: str, checkpoint_id: str, headers: dict[str, str], **fields: Any
) -> httpx.Response:
    data = {"checkpoint_id": checkpoint_id, "reason": "checked the order"}
    data.update({f"field.{k}": str(v) for k, v in fields.items()})
    return desk.client.post(f"/approvals/{run}/approve", data=data, headers=headers)


def message(response: httpx.Response) -> str:
    return str(response.json()["error"]["message"])


def test_a_rule_is_matched_by_agent_reason_and_tool_glob(open_desk: Callable[..., Desk]) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    owner = {**JSON, "Authorization": f"Bearer {TEST_TOKEN}"}
    shown = desk.client.get("/approvals.json", headers=owner).json()["approvals"]
    assert {item["agent"] for item in shown} == {"refund-bot"}
    for item in shown:
        assert item["rule"]["name"] == "large refunds", item
        assert item["rule"]["approvals"] == 2 and item["rule"]["votes"] == []
        # The owner is an operator, but the rule names finance and ada only.
        assert item["rule"]["may_decide"] is False
    other = open_desk(OTHER_TOOL)
    shown = other.client.get("/approvals.json", headers=owner).json()["approvals"]
    assert shown and all(item["rule"] is None for item in shown)


def test_two_people_approve_and_the_tool_gets_both_names_and_the_typed_amount(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    ada = desk.add("ada", "approver")
    bob = desk.add("bob", "approver", "finance")
    run = desk.ids("paused-1")  # refund of 250.00 on A-1002
    checkpoint = desk.client.get("/approvals.json", headers=ada).json()["approvals"]
    paused = next(item for item in checkpoint if item["execution_id"] == run)
    checkpoint_id = paused["checkpoint_id"]

    first = approve(desk, run, checkpoint_id, ada, amount="120.5")
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "voted"
    assert first.json()["approvers"] == ["ada"] and first.json()["needed"] == 2
    assert desk.votes(run) == ["ada"] and desk.decisions(run) == []
    assert desk.run_ends(run) == []  # the run still waits

    # The card says so, in words, to everyone who looks.
    page = desk.client.get(f"/approvals/{run}", headers={"Authorization": ada["Authorization"]})
    assert re.search(
        r"Rule &#39;large refunds&#39;: 2 approvals from finance or ada — ada approved \d+ s ago;"
        r" one more person needed",
        page.text,
    ), page.text
    # Votes appear in the run's decisions.
    recorded = desk.client.get(f"/runs/{run}.json", headers=ada).json()["decisions"]
    assert [(d["kind"], d["approver"]) for d in recorded] == [("vote", "ada")]

    again = approve(desk, run, checkpoint_id, ada, amount="120.5")
    assert again.status_code == 409
    assert "ada already approved this pause at " in message(again)
    assert desk.votes(run) == ["ada"]

    second = approve(desk, run, checkpoint_id, bob, amount="120.5")
    assert second.status_code == 200, second.text
    outcome = second.json()
    assert outcome["status"] == "completed"
    # What the tool did with Resume.metadata: the amount as the number typed, both names.
    assert outcome["output"] == "Done: refunded 120.50 on A-1002, approved by ada, bob."
    assert outcome["decision"]["approver"] == "bob"
    assert desk.run_ends(run) == ["completed"]
    [decision] = desk.decisions(run)
    assert (decision["actor"], bool(decision["approved"])) == ("bob", True)
    # The audit log tells the vote from the approval that completed the count.
    owner = {"Authorization": f"Bearer {TEST_TOKEN}"}
    audited = desk.client.get(f"/audit.json?run={run}", headers=owner).json()["entries"]
    assert [(e["action"], e["actor"], e["status"]) for e in reversed(audited)] == [
        ("vote", "ada", 200),
        ("approve", "ada", 409),
        ("approve", "bob", 200),
    ]
    # The record keeps exactly what the tool was handed: a recovery hands it the same.
    assert decision["metadata"] == {
        "approver": "bob",
        "approvers": ["ada", "bob"],
        "reason": "checked the order",
        "amount": 120.5,
    }
    assert desk.votes(run) == ["ada", "bob"]
    recorded = desk.client.get(f"/runs/{run}.json", headers=ada).json()["decisions"]
    assert [(d["kind"], d["approver"]) for d in recorded] == [("vote", "ada"), ("approval", "bob")]


def test_a_second_person_rejects_and_the_pause_ends_at_once(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    ada = desk.add("ada", "approver")
    cyd = desk.add("cyd", "approver", "finance")
    run = desk.ids("paused-2")  # 900.00 on A-1003
    items = desk.client.get("/approvals.json", headers=ada).json()["approvals"]
    checkpoint_id = next(i for i in items if i["execution_id"] == run)["checkpoint_id"]
    assert approve(desk, run, checkpoint_id, ada, amount=900).json()["status"] == "voted"

    rejected = desk.client.post(
        f"/approvals/{run}/reject",
        data={"checkpoint_id": checkpoint_id, "reason": "not this month", "field.amount": "900"},
        headers=cyd,
    )
    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["output"] == "Done: refund of 900.00 on A-1003 declined: not this month."
    [decision] = desk.decisions(run)
    assert (decision["actor"], bool(decision["approved"])) == ("cyd", False)
    assert decision["metadata"] == {
        "approver": "cyd",
        "approvers": ["ada", "cyd"],
        "reason": "not this month",
        "amount": 900.0,
    }
    assert desk.run_ends(run) == ["completed"]


def test_ten_concurrent_final_votes_resume_the_run_once(open_desk: Callable[..., Desk]) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    ada = desk.add("ada", "approver")
    people = [desk.add(f"fin-{i}", "approver", "finance") for i in range(10)]
    run = desk.ids("paused-1")
    items = desk.client.get("/approvals.json", headers=ada).json()["approvals"]
    checkpoint_id = next(i for i in items if i["execution_id"] == run)["checkpoint_id"]
    assert approve(desk, run, checkpoint_id, ada, amount=250).json()["status"] == "voted"

    responses = all_at_once(10, lambda i: approve(desk, run, checkpoint_id, people[i], amount=200))

    statuses = [r.status_code for r in responses]
    assert (statuses.count(200), statuses.count(409)) == (1, 9), [r.text for r in responses]
    [won] = [r.json() for r in responses if r.status_code == 200]
    winner = won["decision"]["approver"]
    assert won["output"] == f"Done: refunded 200.00 on A-1002, approved by ada, {winner}."
    for lost in (r for r in responses if r.status_code == 409):
        words = message(lost)
        assert winner in words and ("approved by" in words or "approvals" in words), words
    assert desk.run_ends(run) == ["completed"]
    assert [d["actor"] for d in desk.decisions(run)] == [winner]
    assert desk.votes(run) == ["ada", winner]


def test_a_field_out_of_range_is_400_and_records_nothing(open_desk: Callable[..., Desk]) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    ada = desk.add("ada", "approver")
    run = desk.ids("paused-1")
    items = desk.client.get("/approvals.json", headers=ada).json()["approvals"]
    checkpoint_id = next(i for i in items if i["execution_id"] == run)["checkpoint_id"]
    for sent, why in (
        ("251", "field 'amount': 251.0 is above the maximum 250"),
        ("0", "field 'amount': 0.0 is below the minimum 1"),
        ("a lot", "field 'amount': 'a lot' is not a number"),
        ("", "field 'amount' (Amount to refund) is required"),
    ):
        refused = approve(desk, run, checkpoint_id, ada, amount=sent)
        assert refused.status_code == 400 and message(refused) == why
    unknown = approve(desk, run, checkpoint_id, ada, amount="5", amuont="5")
    assert unknown.status_code == 400 and "has no field 'amuont'" in message(unknown)
    assert desk.votes(run) == [] and desk.decisions(run) == [] and desk.run_ends(run) == []


def test_people_outside_the_rule_are_refused_and_nothing_is_recorded(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    sales = desk.add("sam", "approver", "sales")
    operator = desk.add("olga", "operator")
    owner = {**JSON, "Authorization": f"Bearer {TEST_TOKEN}"}
    run = desk.ids("paused-3")
    items = desk.client.get("/approvals.json", headers=sales).json()["approvals"]
    checkpoint_id = next(i for i in items if i["execution_id"] == run)["checkpoint_id"]
    for who, headers in (("sam", sales), ("olga", operator), ("the-owner", owner)):
        refused = approve(desk, run, checkpoint_id, headers, amount=10)
        assert refused.status_code == 403, refused.text
        assert message(refused) == (
            f"Rule 'large refunds': only finance or ada may decide this pause,"
            f" and {who} is not one of them"
        )
        rejected = desk.client.post(
            f"/approvals/{run}/reject",
            data={"checkpoint_id": checkpoint_id, "reason": "no"},
            headers=headers,
        )
        assert rejected.status_code == 403
    assert desk.votes(run) == [] and desk.decisions(run) == [] and desk.run_ends(run) == []
    # The card is read-only for them, saying who can; "cards I can decide" leaves it out.
    page = desk.client.get("/approvals", headers={"Authorization": sales["Authorization"]})
    assert "Only finance or ada may decide this pause: you see it read-only." in page.text
    mine = desk.client.get("/approvals.json?mine=1", headers=sales).json()
    assert mine["approvals"] == [] and mine["mine"] is True


def test_groups_from_a_trusted_proxy_header_decide(open_desk: Callable[..., Desk]) -> None:
    desk = open_desk(
        TWO_FROM_FINANCE.replace("approvals = 2", "approvals = 1"),
        sign_in=sign_in_settings(
            proxy_user_header="X-User",
            proxy_groups_header="X-Groups",
            proxy_default_role="approver",
            trusted_proxies=("127.0.0.1",),
        ),
    )
    run = desk.ids("paused-1")
    dee = {**JSON, "X-User": "dee"}
    items = desk.client.get("/approvals.json", headers=dee).json()["approvals"]
    checkpoint_id = next(i for i in items if i["execution_id"] == run)["checkpoint_id"]
    assert approve(desk, run, checkpoint_id, dee, amount=5).status_code == 403
    allowed = approve(desk, run, checkpoint_id, {**dee, "X-Groups": "audit, finance"}, amount=5)
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["output"] == "Done: refunded 5.00 on A-1002, approved by dee."
    mine = desk.client.get("/approvals.json?mine=1", headers={**dee, "X-Groups": "finance"})
    assert {i["execution_id"] for i in mine.json()["approvals"]} == {
        i["execution_id"] for i in items if i["execution_id"] != run
    }


def test_an_approval_whose_process_died_before_its_claim_is_carried_out_next_time(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    ada = desk.add("ada", "approver")
    cyd = desk.add("cyd", "approver", "finance")
    run = desk.ids("paused-1")
    items = desk.client.get("/approvals.json", headers=ada).json()["approvals"]
    checkpoint_id = next(i for i in items if i["execution_id"] == run)["checkpoint_id"]
    assert approve(desk, run, checkpoint_id, ada, amount=250).json()["status"] == "voted"
    # Bob's approval completed the count in a process that died before it claimed the
    # pause: a process of its own casts his vote through the decision log and exits.
    cast = (
        f"{desk.open_log}; log.cast_vote(execution_id={run!r}, checkpoint_id="
        f"{checkpoint_id!r}, actor='bob', reason='fine by me', fields_json="
        "'{\"amount\": 130.0}', needed=2); log.close()"
    )
    subprocess.run([sys.executable, "-c", cast], check=True, timeout=60)
    assert desk.votes(run) == ["ada", "bob"] and desk.decisions(run) == []

    # Just after, the approval may still be on its way: nobody else may take it.
    early = approve(desk, run, checkpoint_id, cyd, amount=5)
    assert early.status_code == 409
    assert "already has its 2 approvals: the last was bob's" in message(early)

    # Once it is older than a live claim ever is (the wait is passed by moving the
    # vote's time back, not by sleeping), the next approval carries Bob's out as cast.
    desk.execute(
        "UPDATE {app}localui_votes SET voted_at = ? WHERE actor = 'bob'",
        ("2026-01-01T00:00:00+00:00",),
    )
    late = approve(desk, run, checkpoint_id, cyd, amount=5)
    assert late.status_code == 200, late.text
    assert late.json()["output"] == "Done: refunded 130.00 on A-1002, approved by ada, bob."
    [decision] = desk.decisions(run)
    assert decision["actor"] == "bob" and decision["metadata"] == {
        "approver": "bob",
        "approvers": ["ada", "bob"],
        "reason": "fine by me",
        "amount": 130.0,
    }
    assert desk.run_ends(run) == ["completed"] and desk.votes(run) == ["ada", "bob"]


def test_a_bulk_decision_carries_the_fields_and_checks_them_card_by_card(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(TWO_FROM_FINANCE.replace("approvals = 2", "approvals = 1"))
    bob = desk.add("bob", "approver", "finance")
    small, large = desk.ids("paused-1"), desk.ids("paused-2")  # 250.00 and 900.00
    items = desk.client.get("/approvals.json", headers=bob).json()["approvals"]
    picks = [
        json.dumps([i["execution_id"], i["checkpoint_id"]])
        for i in items
        if i["execution_id"] in (small, large)
    ]
    done = desk.client.post(
        "/approvals/bulk",
        data={"verb": "approve", "reason": "batch", "pick": picks, "field.amount": "300"},
        headers=bob,
    )
    assert done.status_code == 200, done.text
    results = {i["execution_id"]: i for i in done.json()["items"]}
    # 300 is above the first card's own maximum (its context's amount): refused alone.
    assert results[small]["result"] == "refused"
    assert "field 'amount': 300.0 is above the maximum 250" in results[small]["words"]
    assert desk.decisions(small) == [] and desk.run_ends(small) == []
    assert results[large]["result"] == "won", results[large]
    [decision] = desk.decisions(large)
    assert decision["metadata"]["amount"] == 300.0
    assert decision["metadata"]["approvers"] == ["bob"]
