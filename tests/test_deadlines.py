"""Deadlines per policy rule, on SQLite and on PostgreSQL: a pause overdue at its rule's
``due`` is escalated (the ``escalate_to`` people may decide it, and are told once), and
one nobody decided by ``timeout_after`` is decided by the rule itself, exactly once,
across two servers, a ``kill -9`` and a downtime.

The pauses are payout-bot's (``bench/crash_agent.py``): a real agent on the SDK's
offline model whose tool appends what it was handed (``Resume.metadata``) to a ledger,
whichever process runs it. Servers are real ``localui serve`` child processes where the
test is about processes; the rest serve in process, through the app's lifespan.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import JSON, LOOPBACK_CLIENT, LocalServer, decide, sign_in_settings, start_localui

from localui.app import create_app
from localui.backends.base import DecisionLog
from localui.backends.postgres.decisions import PostgresDecisionLog
from localui.backends.sqlite.decisions import SQLiteDecisionLog
from localui.backends.users import token_hash
from localui.policy import PolicyError, parse_policy
from localui.records import APPROVAL, Decision
from localui.runs import parse_time
from localui.settings import Settings
from localui.words import DECIDED_AT_START

with warnings.catch_warnings():
    from starlette.exceptions import StarletteDeprecationWarning

    warnings.filterwarnings(
        "ignore",
        message="Using `httpx` with `starlette.testclient` is deprecated",
        category=StarletteDeprecationWarning,
    )
    from starlette.testclient import TestClient

CRASH_AGENT = Path(__file__).resolve().parent.parent / "bench" / "crash_agent.py"
#: Where the rules' events go: nothing listens there, so each stays in the outbox,
#: where the tests count them (one row per event and target).
DEAD_TARGET = "json://127.0.0.1:9/deadlines"
#: How long a deadline may take to be acted on here: the sweep polls every 2 s; the
#: rest is room for a slow, shared machine (the budget is a minute).
ACTED_WITHIN_S = 30.0
REJECT_REASON = "not approved in time: refused"


def policy(*lines: str, name: str = "payouts", agent: str = "payout-bot") -> str:
    body = "\n".join(lines)
    return f'[[rule]]\nname = "{name}"\nagent = "{agent}"\nnotify = ["{DEAD_TARGET}"]\n{body}\n'


REJECT_AT_1S = policy(
    'due = "1s"',
    'escalate_to = ["group:managers"]',
    'on_timeout = "reject"',
    f'timeout_reason = "{REJECT_REASON}"',
)


# --- policy parsing: each bad key a clear one-line error ------------------------------


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        (['due = "4x"'], "key 'due' must be a duration such as"),
        (["due = 90"], "key 'due' must be a duration such as"),
        (['due = "0s"'], "key 'due' must be a duration such as"),
        (['remind_every = "30m"'], "key 'remind_every' needs 'due'"),
        (['escalate_to = ["group:managers"]'], "key 'escalate_to' needs 'due'"),
        (['on_timeout = "reject"'], "key 'on_timeout' needs 'due'"),
        (['due = "4h"', 'remind_every = "soon"'], "key 'remind_every' must be a duration"),
        (['due = "4h"', 'escalate_to = ["managers"]'], "must be group:NAME, user:NAME or role"),
        (['due = "4h"', 'escalate_to = ["role:viewer"]'], "the roles that decide are"),
        (['due = "4h"', 'on_timeout = "ignore"'], "key 'on_timeout' must be one of reject"),
        (['due = "4h"', 'on_timeout = "reject"'], "key 'timeout_reason' is required"),
        (['due = "4h"', 'timeout_reason = "late"'], "key 'timeout_reason' needs 'on_timeout'"),
        (['due = "4h"', 'timeout_after = "1d"'], "key 'timeout_after' needs 'on_timeout'"),
        (
            ['due = "4h"', 'on_timeout = "reject"', 'timeout_reason = "x"', 'timeout_after = "1h"'],
            "key 'timeout_after' (1h) must be at least 'due' (4h)",
        ),
        (
            ['due = "4h"', 'on_timeout = "approve"', 'timeout_reason = "x"'],
            "say so twice with allow_timeout_approve = true",
        ),
        (
            [
                'due = "4h"',
                'on_timeout = "reject"',
                'timeout_reason = "x"',
                "allow_timeout_approve = true",
            ],
            "key 'allow_timeout_approve' is only for on_timeout",
        ),
        (
            [
                'due = "4h"',
                'on_timeout = "approve"',
                'timeout_reason = "x"',
                'allow_timeout_approve = "yes"',
            ],
            "key 'allow_timeout_approve' must be true or false",
        ),
        (
            [
                'due = "4h"',
                'on_timeout = "approve"',
                'timeout_reason = "x"',
                "allow_timeout_approve = true",
                "[[rule.field]]",
                'name = "limit"',
                'type = "number"',
                "required = true",
            ],
            "field 'limit' is required and has no default",
        ),
    ],
)
def test_each_bad_deadline_key_is_a_one_line_error(lines: list[str], said: str) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(policy(*lines), "policy.toml")
    message = str(raised.value)
    assert said in message
    assert message.startswith("policy.toml: rule 'payouts': ")
    assert "\n" not in message


def test_the_readme_example_reads_as_it_says() -> None:
    rule = parse_policy(
        policy(
            'due = "4h"',
            'remind_every = "30m"',
            'escalate_to = ["group:managers", "user:ada"]',
            'on_timeout = "reject"',
            'timeout_after = "1d"',
            'timeout_reason = "not approved within a day"',
        )
    ).rules[0]
    assert (rule.due, rule.remind_every, rule.timeout_after) == (4 * 3600, 1800, 86400)
    assert rule.escalated_who == "managers or ada"
    assert rule.actor == "policy:payouts"
    # timeout_after defaults to due.
    short = parse_policy(REJECT_AT_1S).rules[0]
    assert (short.due, short.timeout_after) == (1, 1)


# --- a store of the test's own with fresh payout-bot pauses -----------------------------


@dataclass
class Desk:
    """A fresh store on one backend: pauses made on demand, servers of either kind on
    it, and the ground truth read directly (the SDK's rows, the decision record, the
    outbox and the deadlines table)."""

    kind: str
    store_args: list[str]
    settings_of: dict[str, str]
    store: str
    env: dict[str, str]
    workdir: Path
    ledger: Path
    agent: Any
    sdk: Any
    open_log: Callable[[], DecisionLog]
    app_query: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]
    servers: list[LocalServer] = field(default_factory=list)

    def pause(self, order: str, agent: Any | None = None) -> str:
        from bench import crash_agent

        return asyncio.run(crash_agent.pause(agent or self.agent, order))

    def write_policy(self, text: str) -> Path:
        path = self.workdir / f"policy-{time.monotonic_ns()}.toml"
        path.write_text(text)
        return path

    def serve(
        self, name: str, policy_text: str, *, holds: Path | None = None, sign_in: bool = False
    ) -> LocalServer:
        env = dict(self.env)
        env["CRASH_HOLDS"] = str(holds or self.workdir / f"holds-{name}")
        Path(env["CRASH_HOLDS"]).mkdir(exist_ok=True)
        server = start_localui(
            [
                "serve",
                *self.store_args,
                "--agents",
                f"{CRASH_AGENT}:payout_bot",
                *([] if sign_in else ["--no-auth"]),
                "--claim-lease",
                "2",
                "--policy",
                str(self.write_policy(policy_text)),
            ],  # fmt: skip
            cwd=self.workdir,
            log=self.workdir / f"{name}-{time.monotonic_ns()}.log",
            env=env,
            ready="/signin" if sign_in else "/approvals.json",
        )
        self.servers.append(server)
        return server

    def settings(self, policy_text: str, **changes: Any) -> Settings:
        changes.setdefault("sign_in", sign_in_settings())
        return Settings(
            store=self.store,
            policy=parse_policy(policy_text, "policy.toml"),
            claim_lease_seconds=2.0,
            **self.settings_of,
            **changes,
        )

    def decisions(self, run: str) -> list[Decision]:
        log = self.open_log()
        try:
            return [d for d in log.list_for_run(run) if d.kind == APPROVAL]
        finally:
            log.close()

    def wait_decided(self, run: str, within: float = ACTED_WITHIN_S) -> Decision:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            found = self.decisions(run)
            if found and found[-1].outcome is not None:
                return found[-1]
            time.sleep(0.2)
        logs = "\n".join(s.output() for s in self.servers)
        pytest.fail(f"{run} was never decided:\n{logs}", pytrace=False)

    def ran(self, run: str) -> list[dict[str, Any]]:
        """What the tool was handed each time it went on past its pause, for ``run``."""
        if not self.ledger.exists():
            return []
        lines = [json.loads(x) for x in self.ledger.read_text().splitlines() if x.strip()]
        order = run.split("-")[1]
        return [x for x in lines if x["effect"] == "tool_ran" and x["order_id"] == order]

    def run_ends(self, run: str) -> list[str]:
        return [c.status for c in self.sdk.list(run, limit=500) if c.step_type == "run_end"]

    def events(self, event_type: str, run: str) -> int:
        """How many ``event_type`` events of ``run`` the outbox holds (one target)."""
        rows = self.app_query(
            "SELECT COUNT(*) FROM {app}localui_notifications"
            " WHERE event_type = {m} AND execution_id = {m}",
            (event_type, run),
        )
        return int(rows[0][0])

    def event_payload(self, event_type: str, run: str) -> dict[str, Any]:
        rows = self.app_query(
            "SELECT payload FROM {app}localui_notifications"
            " WHERE event_type = {m} AND execution_id = {m}",
            (event_type, run),
        )
        return dict(json.loads(rows[0][0]))


@pytest.fixture(params=["sqlite", "postgres"])
def desk(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Desk]:
    from bench import crash_agent

    workdir = tmp_path / "deadlines"
    workdir.mkdir()
    ledger = workdir / "ledger.jsonl"
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false", "CRASH_LEDGER": str(ledger)}
    env["PYTHONPATH"] = os.pathsep.join([str(CRASH_AGENT.parent.parent), env.get("PYTHONPATH", "")])
    cleanup: Callable[[], None]
    if request.param == "sqlite":
        path = workdir / "local.db"
        env.update(CRASH_STORE=str(path), FASTAIAGENT_LOCAL_DB=str(path))
        store, store_args = str(path), ["--store", str(path)]
        settings_of: dict[str, str] = {}

        def open_log() -> DecisionLog:
            return SQLiteDecisionLog(path)

        def app_query(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
            conn = sqlite3.connect(path)
            try:
                return conn.execute(sql.format(app="", m="?"), params).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return [(0,)]
                raise
            finally:
                conn.close()

        def cleanup() -> None:
            pass
    else:
        import psycopg
        from conftest import PgRaw, pg_name

        dsn: str = request.getfixturevalue("pg_dsn")
        schema, app_schema = pg_name("deadline"), pg_name("deadline_ui")
        env.update(CRASH_STORE=dsn, CRASH_SCHEMA=schema)
        store = dsn
        store_args = ["--store", dsn, "--pg-schema", schema, "--pg-app-schema", app_schema]
        settings_of = {"pg_schema": schema, "pg_app_schema": app_schema}

        def open_log() -> DecisionLog:
            return PostgresDecisionLog(dsn, schema=app_schema)

        def app_query(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
            with psycopg.connect(dsn, autocommit=True) as conn:
                try:
                    text = sql.format(app=f"{app_schema}.", m="%s")
                    return list(conn.execute(text, params).fetchall())
                except psycopg.errors.UndefinedTable:
                    return [(0,)]

        def cleanup() -> None:
            PgRaw(dsn, schema).drop()
            PgRaw(dsn, app_schema).drop()

    for key in ("CRASH_STORE", "CRASH_SCHEMA", "CRASH_LEDGER"):
        if key in env:
            monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("CRASH_HOLDS", str(workdir / "holds-in-process"))
    agent = crash_agent.payout_bot()
    sdk = agent._checkpointer  # the SDK keeps it here and offers no accessor
    sdk.setup()
    made = Desk(
        request.param,
        store_args,
        settings_of,
        store,
        env,
        workdir,
        ledger,
        agent,
        sdk,
        open_log,
        app_query,
    )
    try:
        yield made
    finally:
        for server in made.servers:
            server.stop()
        sdk.close()
        cleanup()


def in_process(desk: Desk, settings: Settings, agents: list[Any] | None = None) -> TestClient:
    app = create_app(settings, agents=[desk.agent] if agents is None else agents)
    return TestClient(app, base_url="http://127.0.0.1:8765", client=LOOPBACK_CLIENT)


def eventually(check: Callable[[], Any], what: str, within: float = ACTED_WITHIN_S) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        time.sleep(0.2)


def add_person(settings: Settings, name: str, *groups: str) -> dict[str, str]:
    """A person in the store's users table; the headers their scripts sign in with."""
    from localui.backends import open_backend

    backend = open_backend(settings)
    users = backend.users(writable=True)
    try:
        token = f"token-of-{name}-0123456789abcdef"
        users.add(name, "approver", token_hash(token), groups)
    finally:
        users.close()
        backend.close()
    return {**JSON, "Authorization": f"Bearer {token}"}


# --- escalation ----------------------------------------------------------------------


def test_an_escalated_person_may_decide_once_due_and_not_before(desk: Desk) -> None:
    settings = desk.settings(
        policy('approvers = ["user:ann"]', 'due = "3s"', 'escalate_to = ["group:managers"]')
    )
    add_person(settings, "ann")
    bob = add_person(settings, "bob", "managers")
    run = desk.pause("E1")
    with in_process(desk, settings) as client:
        shown = client.get("/approvals.json", headers=bob).json()["approvals"]
        [item] = [a for a in shown if a["execution_id"] == run]
        assert item["due_at"] is not None
        assert item["rule"]["may_decide"] is False
        early = decide(client, run, item["checkpoint_id"], approver="bob", headers=bob)
        assert early.status_code == 403, early.text
        assert "once it is overdue, managers" in early.json()["error"]["message"]
        assert desk.events("pause.escalated", run) == 0

        eventually(lambda: desk.events("pause.escalated", run), "the escalation")
        card = client.get(f"/approvals/{run}", headers={"Authorization": bob["Authorization"]})
        assert "escalated to managers" in card.text
        # Polls go on: the event stays recorded once.
        time.sleep(2.5)
        assert desk.events("pause.escalated", run) == 1
        payload = desk.event_payload("pause.escalated", run)
        assert (payload["rule"], payload["escalate_to"]) == ("payouts", ["group:managers"])

        late = decide(client, run, item["checkpoint_id"], approver="bob", headers=bob)
        assert late.status_code == 200, late.text
    [decision] = desk.decisions(run)
    assert (decision.actor, decision.approved, decision.outcome) == ("bob", True, "completed")
    assert [r["metadata"]["approver"] for r in desk.ran(run)] == ["bob"]


# --- the rule decides: reject, approve with the fields' defaults -----------------------


def test_a_timeout_rejects_as_the_rule_says(desk: Desk) -> None:
    server = desk.serve("one", REJECT_AT_1S)
    run = desk.pause("R1")
    decision = desk.wait_decided(run)
    assert (decision.actor, decision.approved, decision.outcome) == (
        "policy:payouts",
        False,
        "completed",
    )
    assert decision.reason == REJECT_REASON  # the server ran at the deadline
    [ran] = desk.ran(run)
    assert ran["approved"] is False
    assert ran["metadata"] == {
        "approver": "policy:payouts",
        "approvers": ["policy:payouts"],
        "reason": REJECT_REASON,
    }
    assert desk.run_ends(run) == ["completed"]
    eventually(lambda: desk.events("pause.timed_out", run), "the timed_out event")
    payload = desk.event_payload("pause.timed_out", run)
    assert (payload["actor"], payload["approved"]) == ("policy:payouts", False)
    # The decision page says who decided and why.
    with httpx.Client(base_url=server.url) as client:
        page = client.get(f"/approvals/{run}").text
    assert "policy:payouts" in page and REJECT_REASON in page


def test_escalation_and_timeout_reach_a_signed_webhook_once_each(desk: Desk) -> None:
    """``pause.escalated`` and ``pause.timed_out`` as a webhook receiver gets them: each
    POST signed (Standard Webhooks), each event once, with the rule, who it escalated to
    and when it was due, and who decided at the timeout; both are announced by default."""
    from test_notify import SECRET, verified

    from bench.receiver import Receiver
    from localui.notify import events as ev
    from localui.settings import Notifications

    run = desk.pause("W1")
    with Receiver() as receiver:
        notifications = Notifications(
            webhooks=(receiver.url + "/hook",),
            webhook_secret=SECRET,
            retry_initial=0.1,
            retry_max=0.4,
        )
        settings = desk.settings(
            policy(
                'due = "1s"',
                'escalate_to = ["group:managers"]',
                'on_timeout = "reject"',
                'timeout_after = "3s"',
                f'timeout_reason = "{REJECT_REASON}"',
            ),
            notifications=notifications,
        )
        assert {ev.ESCALATED, ev.TIMED_OUT} <= set(notifications.events)

        def of_run(received: list[Any], event_type: str) -> list[Any]:
            hooks = [r for r in received if r.path == "/hook"]
            return [
                r
                for r in hooks
                if (b := verified(r))["type"] == event_type and b["data"]["execution_id"] == run
            ]

        with in_process(desk, settings):
            got = receiver.wait_for(
                lambda r: bool(of_run(r, ev.ESCALATED) and of_run(r, ev.TIMED_OUT)),
                ACTED_WITHIN_S,
            )
            time.sleep(2.5)  # more polls and sending rounds: nothing is sent again
            got = receiver.requests("/hook")
        [escalated] = of_run(got, ev.ESCALATED)
        [timed_out] = of_run(got, ev.TIMED_OUT)
        esc = verified(escalated)["data"]
        assert (esc["rule"], esc["escalate_to"]) == ("payouts", ["group:managers"])
        assert esc["due_at"] and esc["url"].endswith(f"/approvals/{run}")
        out = verified(timed_out)["data"]
        assert (out["rule"], out["actor"], out["approved"]) == ("payouts", "policy:payouts", False)
        # Announced once the rule's claim is won, before the run goes on (a server killed
        # while the tool runs has still told it): the run's outcome is not known yet.
        assert out["outcome"] == ""
        assert escalated.headers["webhook-id"] != timed_out.headers["webhook-id"]
    [decision] = desk.decisions(run)
    assert (decision.actor, decision.reason) == ("policy:payouts", REJECT_REASON)
    assert parse_time(esc["due_at"]) < parse_time(decision.decided_at)


def test_a_timeout_approves_with_the_fields_defaults(desk: Desk) -> None:
    desk.serve(
        "one",
        policy(
            'due = "1s"',
            'on_timeout = "approve"',
            "allow_timeout_approve = true",
            'timeout_reason = "approved by default after a second"',
            "approvals = 2",
            "[[rule.field]]",
            'name = "limit"',
            'type = "number"',
            "default = 25",
            "max = 100",
            "required = true",
            "[[rule.field]]",
            'name = "order"',
            'type = "text"',
            'default = "context.order_id"',
            "[[rule.field]]",
            'name = "note"',
            'type = "text"',
        ),
    )
    run = desk.pause("A1")
    decision = desk.wait_decided(run)
    assert (decision.actor, decision.approved, decision.outcome) == (
        "policy:payouts",
        True,
        "completed",
    )
    [ran] = desk.ran(run)
    # Two approvals were needed; the timeout decided alone, with each field's default.
    assert ran["metadata"] == {
        "approver": "policy:payouts",
        "approvers": ["policy:payouts"],
        "reason": "approved by default after a second",
        "limit": 25.0,
        "order": "A1",
        "note": None,
    }
    assert desk.run_ends(run) == ["completed"]


# --- processes: two servers, kill -9, downtime ----------------------------------------


def test_two_servers_decide_each_pause_once_and_tell_once(desk: Desk) -> None:
    desk.serve("one", REJECT_AT_1S)
    desk.serve("two", REJECT_AT_1S)
    runs = [desk.pause(f"T{i}") for i in range(1, 5)]
    for run in runs:
        desk.wait_decided(run)
    time.sleep(3)  # both servers poll again: nothing more may happen
    for run in runs:
        assert len(desk.decisions(run)) == 1
        assert len(desk.ran(run)) == 1
        assert desk.run_ends(run) == ["completed"]
        assert desk.events("pause.escalated", run) == 1
        assert desk.events("pause.timed_out", run) == 1


@pytest.mark.parametrize("point", ["before-sdk-claim", "after-sdk-claim"])
def test_a_server_killed_at_the_deadline_leaves_the_pause_decided_once(
    desk: Desk, point: str
) -> None:
    holds = desk.workdir / "holds-first"
    holds.mkdir()
    (holds / point).write_text("")
    first = desk.serve("first", REJECT_AT_1S, holds=holds)
    run = desk.pause("K1")
    eventually(lambda: (holds / f"{point}.reached").exists(), f"{point} in the first server")
    os.kill(first.process.pid, signal.SIGKILL)  # no shutdown, no last write
    first.process.wait()
    first.stop()
    (holds / point).unlink()

    desk.serve("second", REJECT_AT_1S)
    decision = desk.wait_decided(run, within=60)
    time.sleep(3)
    assert [d.id for d in desk.decisions(run)] == [decision.id]
    assert (decision.actor, decision.approved) == ("policy:payouts", False)
    assert [r["approved"] for r in desk.ran(run)] == [False]
    assert desk.run_ends(run) == ["completed"]
    # Told once, by the server that won the claim, before it died.
    assert desk.events("pause.timed_out", run) == 1


def test_a_pause_overdue_while_no_server_ran_is_decided_at_the_next_start(desk: Desk) -> None:
    run = desk.pause("D1")
    time.sleep(2.5)  # past its deadline, with no localui running
    server = desk.serve("late", REJECT_AT_1S)
    decision = desk.wait_decided(run)
    assert decision.actor == "policy:payouts"
    assert decision.reason == REJECT_REASON + DECIDED_AT_START
    # The tool is told the rule's reason, not localui's note about itself.
    assert [r["metadata"]["reason"] for r in desk.ran(run)] == [REJECT_REASON]
    with httpx.Client(base_url=server.url) as client:
        page = client.get(f"/approvals/{run}").text
    assert "decided at start: no localui decided it at the deadline" in page


# --- the queue by due, and /attention ---------------------------------------------------


def test_the_queue_sorts_by_due_and_says_when(desk: Desk) -> None:
    from fastaiagent import Agent
    from fastaiagent.testing import FunctionModel

    from bench import crash_agent

    def other(name: str) -> Agent:
        return Agent(
            name=name,
            system_prompt="Pay out the order named, after approval.",
            llm=FunctionModel(crash_agent._respond, model=name),
            tools=[crash_agent.pay_out],
            checkpointer=crash_agent.checkpointer(),
        )

    others = [other("free-bot"), other("slow-bot")]
    try:
        free = desk.pause("Q1", others[0])  # no rule: no deadline
        slow = desk.pause("Q2", others[1])
    finally:
        for agent in others:
            checkpointer: Any = agent._checkpointer  # the SDK offers no accessor
            checkpointer.close()
    fast = desk.pause("Q3")
    rules = policy('due = "2h"', name="slow", agent="slow-bot") + policy('due = "1h"')
    settings = desk.settings(rules, sign_in=sign_in_settings(required=False), page_size=1)
    with in_process(desk, settings) as client:

        def walk(order: str | None) -> list[dict[str, Any]]:
            cards: list[dict[str, Any]] = []
            query = {"order": order} if order else {}
            while True:
                page = client.get("/approvals.json", params=query).json()
                cards.extend(page["approvals"])
                if not page["next"]:
                    return cards
                query = {**({"order": order} if order else {}), "after": page["next"]}

        def recorded() -> bool:
            return [c["execution_id"] for c in walk(None)] == [fast, slow, free]

        # The default order is by due once the sweep has recorded the deadlines.
        eventually(recorded, "the queue sorted by due")
        cards = {c["execution_id"]: c for c in walk("due")}
        assert [c["execution_id"] for c in walk("oldest")] == [free, slow, fast]
        assert cards[free]["due_at"] is None
        for run, hours in ((fast, 1), (slow, 2)):
            paused = cards[run]["created_at"]
            start, due = parse_time(paused), parse_time(cards[run]["due_at"])
            assert start is not None and due is not None
            assert (due - start).total_seconds() == hours * 3600
        html = client.get("/approvals").text
        assert "soonest due first" in html
        assert "due in 59 min" in html or "due in 1 h" in html
        assert client.get("/approvals.json", params={"order": "soon"}).status_code == 400


def test_attention_lists_a_pause_past_its_rules_due(desk: Desk) -> None:
    run = desk.pause("V1")
    settings = desk.settings(
        policy('due = "1s"', 'escalate_to = ["role:operator"]'),
        sign_in=sign_in_settings(required=False),
    )
    with in_process(desk, settings) as client:

        def listed() -> list[dict[str, Any]]:
            page = client.get("/attention.json").json()
            return [p for p in page["overdue_pauses"] if p["execution_id"] == run]

        [pause] = eventually(listed, "the overdue pause on /attention")
        assert pause["rule"] == "payouts"
        html = client.get("/attention").text
        assert "Past their rule&#39;s deadline" in html or "Past their rule's deadline" in html
        assert "escalated to operators" in html


def test_a_rules_remind_every_sets_the_rhythm_of_its_reminders() -> None:
    """Reminders of a rule's pause come at its ``due`` and then every ``remind_every``
    (at most ``--remind-times``); without them, every ``--remind-after`` as before."""
    from datetime import UTC, datetime, timedelta

    from localui.notify import events as ev
    from localui.records import Pending

    paused = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    pending = Pending("run", "payout-bot", "turn:0/tool:pay_out", "r", {}, None, paused.isoformat())

    def number(minutes: float, every: float | None) -> int:
        at = paused + timedelta(minutes=minutes)
        first = 4 * 3600 if every is not None else 3600
        return ev.reminder_number(pending, at, first, 3, every)

    # A rule with due = "4h", remind_every = "30m".
    assert [number(m, 1800) for m in (239, 240, 269, 270, 300, 999)] == [0, 1, 1, 2, 3, 3]
    # The server's --remind-after of an hour alone.
    assert [number(m, None) for m in (59, 60, 119, 120, 999)] == [0, 1, 1, 2, 3]


def test_a_pause_whose_deadline_is_not_recorded_yet_is_still_in_the_queue(desk: Desk) -> None:
    """A read-only server records no deadlines (a writable one does): its queue, sorted
    by due, still lists every pause, with the due time its rule gives."""
    run = desk.pause("N1")
    settings = desk.settings(
        policy('due = "1h"'), sign_in=sign_in_settings(required=False), read_only=True
    )
    with in_process(desk, settings) as client:
        page = client.get("/approvals.json").json()
        [card] = [c for c in page["approvals"] if c["execution_id"] == run]
        start, due = parse_time(card["created_at"]), parse_time(card["due_at"])
        assert start is not None and due is not None
        assert (due - start).total_seconds() == 3600
        assert page["order"] == "due"
