"""Notifications: every event announced once, to chat targets and signed webhooks.

The stores are the seeded runs the real SDK wrote (4 pauses, 2 crashed runs, 1
failed run), on SQLite and on PostgreSQL; new runs come from the demo agent in
child processes. Targets are loopback receivers (``notify_receiver``): webhooks
POST to them, and Apprise's own ``json://`` and ``form://`` plugins do too.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from helpers import NO_SIGN_IN, free_port, start_localui
from standardwebhooks.webhooks import Webhook
from starlette.applications import Starlette

from bench.receiver import Received, Receiver
from localui import runs
from localui.app import create_app
from localui.backends.notifications import Notice
from localui.cli import main
from localui.notify import events as ev
from localui.notify import formats
from localui.notify.sender import ROUND_SIZE
from localui.notify.targets import fingerprint
from localui.policy import parse_policy
from localui.records import APPROVAL, Decision, Pending, RunFacts
from localui.settings import Notifications, Settings
from localui.views.state import AppState

if TYPE_CHECKING:
    from conftest import PgStore, Seeded

SECRET = "whsec_" + base64.b64encode(b"the tests' webhook signing key!!").decode()
#: Short intervals, so the tests wait little; timeouts stay generous.
FAST = {"poll_interval": 0.1}
QUICK_RETRIES = {"retry_initial": 0.1, "retry_max": 0.4, "sweep_interval": 0.3}
SEEDED_PAUSES = 4
BASE_URL = "http://127.0.0.1:8765"
#: The paused call of the seeded ``paused-1`` (PostgreSQL's JSONB orders keys its own way).
CALLS = ('refund(order_id="A-1002", amount=250.0)', 'refund(amount=250.0, order_id="A-1002")')


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass(frozen=True)
class Where:
    """A fresh copy of the seeded runs on one backend, as settings and as CLI flags."""

    kind: str
    store: str
    #: Which run each seeded scenario wrote in this store (``Seeded`` or ``PgSeeded``).
    seed: Any
    pg: PgStore | None = None

    def settings(self, notifications: Notifications, **changes: Any) -> Settings:
        changes.setdefault("sign_in", NO_SIGN_IN)
        # The seeded crashes grow older than the default 10 min while the suite runs: only
        # the test about stalled runs (which sets its own) should see them stall.
        changes.setdefault("stale_after", 10.0**9)
        for key, value in FAST.items():
            changes.setdefault(key, value)
        if self.pg is not None:
            return self.pg.settings(notifications=notifications, **changes)
        return Settings(store=self.store, notifications=notifications, **changes)

    def store_args(self) -> list[str]:
        if self.pg is None:
            return ["--store", self.store]
        return [
            "--store",
            self.pg.dsn,
            "--pg-schema",
            self.pg.schema,
            "--pg-app-schema",
            self.pg.app_schema,
        ]

    def worker_args(self) -> list[str]:
        if self.pg is None:
            return ["--store", self.store]
        return ["--store", self.pg.dsn, "--pg-schema", self.pg.schema]


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, store_copy: Path, seeded: Seeded) -> Where:
    if request.param == "sqlite":
        return Where("sqlite", str(store_copy), seeded)
    pg: PgStore = request.getfixturevalue("pg_store")
    return Where("postgres", pg.dsn, request.getfixturevalue("pg_seeded"), pg)


def webhook_settings(receiver: Receiver, **changes: Any) -> Notifications:
    values: dict[str, Any] = {
        "webhooks": (receiver.url + "/hook",),
        "webhook_secret": SECRET,
        **QUICK_RETRIES,
    }
    values.update(changes)
    return Notifications(**values)


def run_worker(where: Where, scenario: str, cwd: Path) -> str:
    """One demo scenario in a child process, as the user's agent would run it."""
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"}
    if where.pg is None:
        env["FASTAIAGENT_LOCAL_DB"] = where.store
    else:
        env["FASTAIAGENT_LOCAL_DB"] = str(cwd / "unused.db")
    done = subprocess.run(
        [sys.executable, "-m", "localui.demo.worker", *where.worker_args(), "--scenario", scenario],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 17, 18), done.stderr
    return done.stdout.strip().splitlines()[-1]


@contextlib.asynccontextmanager
async def running(app: Starlette) -> AsyncIterator[AppState]:
    async with app.router.lifespan_context(app):
        yield app.state.localui


def verified(request: Received) -> dict[str, Any]:
    """The body of a webhook POST, once its Standard Webhooks signature checks out."""
    body: dict[str, Any] = Webhook(SECRET).verify(request.body, request.headers)
    return body


def on(requests: list[Received], path: str) -> list[Received]:
    return [r for r in requests if r.path.startswith(path)]


def bodies(requests: list[Received]) -> list[dict[str, Any]]:
    return [verified(r) for r in requests]


def of_type(requests: list[Received], event_type: str) -> list[dict[str, Any]]:
    return [b for b in bodies(requests) if b["type"] == event_type]


async def until(receiver: Receiver, done: Any, timeout: float = 30.0) -> list[Received]:
    return await anyio.to_thread.run_sync(lambda: receiver.wait_for(done, timeout))


def acting_agents(where: Where, stack: contextlib.ExitStack) -> list[Any]:
    """The demo refund-bot bound to the store, so the app can approve its pauses."""
    from localui.demo.agent import build_agent

    if where.pg is None:
        from fastaiagent.checkpointers import SQLiteCheckpointer

        checkpointer: Any = SQLiteCheckpointer(where.store)
    else:
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        checkpointer = PostgresCheckpointer(where.pg.dsn, schema=where.pg.schema)
    stack.callback(checkpointer.close)
    return [build_agent(checkpointer)]


# --- the pure rules ---------------------------------------------------------------


NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def _pending(created: datetime, **changes: Any) -> Pending:
    values: dict[str, Any] = {
        "execution_id": "run-1",
        "agent": "refund-bot",
        "node_id": "turn:0/tool:refund",
        "reason": "needs approval",
        "context": {"order": "1042", "card": "4111"},
        "agent_path": "agent:refund-bot",
        "created_at": created.isoformat(),
        "checkpoint_id": "ck-1",
    }
    values.update(changes)
    return Pending(**values)


def test_is_stalled_only_for_an_unfinished_run_silent_past_the_limit() -> None:
    old = (NOW - timedelta(seconds=601)).isoformat()
    fresh = (NOW - timedelta(seconds=599)).isoformat()
    assert runs.is_stalled("unfinished", old, NOW, 600.0)
    assert not runs.is_stalled("unfinished", fresh, NOW, 600.0)
    assert not runs.is_stalled("paused", old, NOW, 600.0)
    assert not runs.is_stalled("failed", old, NOW, 600.0)
    assert not runs.is_stalled("unfinished", "not a time", NOW, 600.0)


def test_reminders_come_each_interval_up_to_the_limit_each_with_its_own_key() -> None:
    def reminder(waited: float) -> int | None:
        found = ev.overdue(_pending(NOW - timedelta(seconds=waited)), None, NOW, 3600.0, 3)
        return found.reminder if found is not None else None

    assert [reminder(s) for s in (3599, 3600, 7300, 10900, 99999)] == [None, 1, 2, 3, 3]
    first = ev.overdue(_pending(NOW - timedelta(seconds=3700)), None, NOW, 3600.0, 3)
    second = ev.overdue(_pending(NOW - timedelta(seconds=7300)), None, NOW, 3600.0, 3)
    paused = ev.paused(_pending(NOW), None)
    assert first is not None and second is not None
    assert len({first.key, second.key, paused.key}) == 3


def test_a_pause_event_names_the_call_and_leaves_redacted_values_out() -> None:
    from localui.records import PausedCall

    call = PausedCall(
        checkpoint_id="ck-1",
        state_snapshot={"tool_name": "refund"},
        node_input={"order": "1042", "card": "4111"},
        cached_results=0,
        run_rows=3,
        run_pauses=1,
    )
    event = ev.paused(_pending(NOW), call, frozenset({"card"}))
    assert event.call == 'refund(order="1042", card="[redacted]")'
    assert event.context == {"order": "1042", "card": "[redacted]"}
    assert event.runner == "Agent 'refund-bot'"
    links = formats.Links(approval=lambda i: f"https://x/approvals/{i}", run=lambda i: i)
    title, body = formats.message([event], links, NOW + timedelta(minutes=3))
    assert title == 'Waiting for approval: refund(order="1042", card="[redacted]")'
    assert "4111" not in body and "3 min ago" in body and "https://x/approvals/run-1" in body


def test_only_a_carried_out_approval_is_a_decision_event() -> None:
    def decision(outcome: str | None, kind: str = APPROVAL) -> Decision:
        return Decision(
            id=7,
            kind=kind,
            execution_id="run-1",
            checkpoint_id="ck-1",
            approved=False,
            actor="Ada",
            reason="over budget",
            decided_at=NOW.isoformat(),
            outcome=outcome,
            detail=None,
            finished_at=NOW.isoformat() if outcome else None,
        )

    assert ev.decided(decision(None)) is None
    assert ev.decided(decision("already_resumed")) is None
    assert ev.decided(decision("completed", kind="resume")) is None
    done = ev.decided(decision("completed"), "refund-bot")
    assert done is not None and done.actor == "Ada" and done.approved is False


def test_a_failed_run_and_a_stalled_run_are_told_apart() -> None:
    def facts(step: str | None, status: str, at: datetime) -> RunFacts:
        return RunFacts(
            execution_id="run-2",
            agent="refund-bot",
            row_count=3,
            first_at=at.isoformat(),
            last_at=at.isoformat(),
            last_checkpoint_id="ck-9",
            last_node_id="turn:1/tool:refund",
            last_step_type=step,
            last_status=status,
            has_pending=False,
            pending_reason=None,
            fork_parent_checkpoint_id=None,
            rows_waiting=0,
            rows_quarantined=0,
        )

    failed = facts("run_end", "failed", NOW)
    crashed = facts("tool_call", "running", NOW - timedelta(hours=1))
    assert ev.failed(failed) is not None and ev.stalled(failed, NOW, 600) is None
    stalled = ev.stalled(crashed, NOW, 600)
    assert ev.failed(crashed) is None and stalled is not None and stalled.reason == "tool"


def test_notify_on_names_are_checked() -> None:
    assert ev.parse_notify_on("paused, overdue") == {ev.PAUSED, ev.OVERDUE}
    with pytest.raises(ev.UnknownEvent, match="'paused2' is not an event"):
        ev.parse_notify_on("paused2")


# --- on real stores -----------------------------------------------------------------


@pytest.mark.anyio
async def test_waiting_pauses_are_announced_once_each_and_a_restart_announces_none_again(
    where: Where,
) -> None:
    with Receiver() as receiver:
        settings = where.settings(webhook_settings(receiver, redact=("customer",)))
        async with running(create_app(settings)):
            got = await until(receiver, lambda r: len(r) >= SEEDED_PAUSES)
            await anyio.sleep(1.0)  # a few polls and a sweep more: nothing else comes
        paused = of_type(receiver.requests(), ev.PAUSED)
        assert len(receiver.requests()) == len(got) == SEEDED_PAUSES
        assert {b["data"]["execution_id"] for b in paused} == where.seed.ids("paused")
        ids = {r.headers["webhook-id"] for r in got}
        assert len(ids) == SEEDED_PAUSES
        one = next(b for b in paused if b["data"]["execution_id"] == where.seed.id("paused-1"))
        data = one["data"]
        assert data["call"] in CALLS
        assert data["context"]["order_id"] == "A-1002"
        assert data["context"]["customer"] == "[redacted]"
        assert data["url"].endswith(f"/approvals/{where.seed.id('paused-1')}")
        assert data["runner"] == "Agent 'refund-bot'" and data["agent"] == "refund-bot"
        assert data["checkpoint_id"] and data["node_id"] and data["reason"]

        async with running(create_app(settings)):
            await anyio.sleep(1.5)
        assert len(receiver.requests()) == SEEDED_PAUSES


@pytest.mark.anyio
async def test_a_run_that_failed_while_no_localui_ran_is_announced_after_the_restart(
    where: Where, tmp_path: Path
) -> None:
    """A restart announces nothing again, but what came while nothing watched: the
    failures after the newest event the outbox holds. The seeded failed run, older
    than notifications, is not announced."""
    with Receiver() as receiver:
        settings = where.settings(webhook_settings(receiver))
        async with running(create_app(settings)):
            await until(receiver, lambda r: len(r) >= SEEDED_PAUSES)
        failed = await anyio.to_thread.run_sync(run_worker, where, "failed", tmp_path)
        async with running(create_app(settings)):
            await until(receiver, lambda r: len(of_type(r, ev.FAILED)) >= 1)
            await anyio.sleep(1.0)  # a few polls and a sweep more: nothing else comes
    everything = receiver.requests()
    assert [b["data"]["execution_id"] for b in of_type(everything, ev.FAILED)] == [failed]
    assert len(everything) == SEEDED_PAUSES + 1
    assert max(Counter(r.headers["webhook-id"] for r in everything).values()) == 1


@pytest.mark.anyio
async def test_a_new_pause_its_decision_a_failure_a_stall_and_reminders_are_delivered(
    where: Where, tmp_path: Path
) -> None:
    with Receiver() as receiver, contextlib.ExitStack() as stack:
        notifications = webhook_settings(receiver, remind_times=2)
        settings = where.settings(notifications, stale_after=1.0, remind_after=2.0)
        app = create_app(settings, agents=acting_agents(where, stack))
        async with running(app):
            await until(receiver, lambda r: len(of_type(r, ev.PAUSED)) >= SEEDED_PAUSES)
            paused = await anyio.to_thread.run_sync(run_worker, where, "paused-1", tmp_path)
            await until(
                receiver,
                lambda r: any(b["data"]["execution_id"] == paused for b in of_type(r, ev.PAUSED)),
            )
            # The seeded crashed runs have been silent for longer than a second.
            await until(receiver, lambda r: len(of_type(r, ev.STALLED)) >= 2)
            failed = await anyio.to_thread.run_sync(run_worker, where, "failed", tmp_path)
            await until(
                receiver,
                lambda r: any(b["data"]["execution_id"] == failed for b in of_type(r, ev.FAILED)),
            )
            await until(
                receiver,
                lambda r: any(
                    b["data"]["execution_id"] == paused and b["data"]["reminder"] == 2
                    for b in of_type(r, ev.OVERDUE)
                ),
            )
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=BASE_URL
            ) as client:
                cards = (await client.get("/approvals.json")).json()["approvals"]
                (card,) = [c for c in cards if c["execution_id"] == paused]
                answer = await client.post(
                    f"/approvals/{paused}/reject",
                    data={
                        "approver": "Ada",
                        "reason": "too much",
                        "checkpoint_id": card["checkpoint_id"],
                    },
                    headers={"accept": "application/json"},
                )
                assert answer.status_code == 200, answer.text
            decided = await until(receiver, lambda r: len(of_type(r, ev.DECIDED)) >= 1)
            await anyio.sleep(2.5)  # past another reminder interval: the limit holds
        decision = of_type(decided, ev.DECIDED)[0]["data"]
        assert decision["execution_id"] == paused
        assert decision["actor"] == "Ada" and decision["approved"] is False
        assert decision["reason"] == "too much" and decision["outcome"]
        everything = receiver.requests()
        reminders = [
            b["data"]["reminder"]
            for b in of_type(everything, ev.OVERDUE)
            if b["data"]["execution_id"] == paused
        ]
        assert sorted(reminders) in ([1, 2], [2])
        ids = Counter(r.headers["webhook-id"] for r in everything)
        assert max(ids.values()) == 1


@pytest.mark.anyio
async def test_a_failure_and_a_decision_before_the_watcher_first_looks_are_announced_once(
    where: Where, tmp_path: Path
) -> None:
    """The watcher follows the feed from ``first_sweep_after`` on: a run that fails and
    an approval decided before then leave no change for it, and its sweeps find them."""
    first_look = 8.0
    with Receiver() as receiver, contextlib.ExitStack() as stack:
        notifications = webhook_settings(receiver, first_sweep_after=first_look)
        app = create_app(where.settings(notifications), agents=acting_agents(where, stack))
        started = time.monotonic()
        async with running(app) as state:
            assert state.watcher is not None
            failed = await anyio.to_thread.run_sync(run_worker, where, "failed", tmp_path)
            paused = where.seed.id("paused-1")
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=BASE_URL
            ) as client:
                cards = (await client.get("/approvals.json")).json()["approvals"]
                (card,) = [c for c in cards if c["execution_id"] == paused]
                answer = await client.post(
                    f"/approvals/{paused}/reject",
                    data={
                        "approver": "Ada",
                        "reason": "no",
                        "checkpoint_id": card["checkpoint_id"],
                    },
                    headers={"accept": "application/json"},
                )
                assert answer.status_code == 200, answer.text
            # Both happened before the watcher subscribed to the feed.
            assert time.monotonic() - started < first_look and state.watcher.swept_at is None
            await until(
                receiver,
                lambda r: len(of_type(r, ev.FAILED)) >= 1 and len(of_type(r, ev.DECIDED)) >= 1,
            )
            swept = state.watcher.swept_at
            # More sweeps: what is recorded is not offered again.
            while state.watcher.swept_at == swept:
                await anyio.sleep(0.1)
            assert await anyio.to_thread.run_sync(state.watcher.sweep) == 0
        everything = receiver.requests()
        assert [b["data"]["execution_id"] for b in of_type(everything, ev.FAILED)] == [failed]
        (decision,) = of_type(everything, ev.DECIDED)
        assert decision["data"]["execution_id"] == paused and decision["data"]["actor"] == "Ada"
        assert decision["data"]["agent"] == "refund-bot"
        assert max(Counter(r.headers["webhook-id"] for r in everything).values()) == 1


@pytest.mark.anyio
async def test_a_receiver_down_for_a_while_gets_everything_once_it_is_back(where: Where) -> None:
    with Receiver(down=True) as receiver:
        settings = where.settings(webhook_settings(receiver))
        async with running(create_app(settings)) as state:
            assert state.watcher is not None
            await until(receiver, lambda r: len(r) >= 3 * SEEDED_PAUSES)
            statuses = await anyio.to_thread.run_sync(state.watcher.outbox.target_statuses)
            assert statuses[0].pending == SEEDED_PAUSES and statuses[0].sent == 0
            assert statuses[0].last_error is not None and "HTTP 503" in statuses[0].last_error
            receiver.down = False
            tried = len(receiver.requests())
            await until(
                receiver,
                lambda r: len({x.headers["webhook-id"] for x in r[tried:]}) >= SEEDED_PAUSES,
            )
            await anyio.sleep(1.0)
            statuses = await anyio.to_thread.run_sync(state.watcher.outbox.target_statuses)
        assert statuses[0].sent == SEEDED_PAUSES and statuses[0].pending == 0
        after = Counter(r.headers["webhook-id"] for r in receiver.requests()[tried:])
        assert len(after) == SEEDED_PAUSES and max(after.values()) == 1


@pytest.mark.anyio
async def test_a_sweep_offers_only_what_it_has_not_offered_before(where: Where) -> None:
    """Every 10 s the watcher sweeps the waiting pauses: once they are recorded, a sweep
    builds no event for them (no paused call read, nothing written), until a reminder
    comes due; then it offers that reminder alone."""
    import dataclasses

    with Receiver() as receiver:
        # Only the first sweep runs by itself: the test makes the others.
        notifications = webhook_settings(receiver, sweep_interval=10.0**6)
        settings = where.settings(notifications, remind_after=10.0**9)
        async with running(create_app(settings)) as state:
            watcher = state.watcher
            assert watcher is not None
            await until(receiver, lambda r: len(r) >= SEEDED_PAUSES)
            await anyio.to_thread.run_sync(watcher.sweep)
            events, keys = await anyio.to_thread.run_sync(watcher.sweep_events)
            assert events == [] and len(keys) == SEEDED_PAUSES
            watcher.settings = dataclasses.replace(watcher.settings, remind_after=1.0)
            events, keys = await anyio.to_thread.run_sync(watcher.sweep_events)
            assert sorted(e.type for e in events) == [ev.OVERDUE] * SEEDED_PAUSES
            assert len(keys) == 2 * SEEDED_PAUSES
            assert await anyio.to_thread.run_sync(watcher.sweep) == SEEDED_PAUSES
            events, _keys = await anyio.to_thread.run_sync(watcher.sweep_events)
            assert events == []


class PendingReads:
    """The served store, counting the watcher's reads of every waiting pause (the one
    read a sweep can make of them); everything else goes to the store as it is."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.reads = 0

    def list_pending(self, **kwargs: Any) -> Any:
        self.reads += 1
        return self.store.list_pending(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.mark.anyio
async def test_an_idle_sweep_reads_no_pending_row_until_the_pauses_change(
    where: Where, tmp_path: Path
) -> None:
    """With a thousand pauses waiting, reading them all every 10 s was most of an idle
    server's work: a sweep reads them again only once the feed has said a pause came
    or went, or when a reminder comes due."""
    with Receiver() as receiver:
        notifications = webhook_settings(receiver, sweep_interval=10.0**6)
        settings = where.settings(notifications, remind_after=10.0**9)
        async with running(create_app(settings)) as state:
            watcher = state.watcher
            assert watcher is not None
            await until(receiver, lambda r: len(r) >= SEEDED_PAUSES)
            counted = PendingReads(watcher.store)
            watcher.store = counted
            assert await anyio.to_thread.run_sync(watcher.sweep) == 0
            assert await anyio.to_thread.run_sync(watcher.sweep) == 0
            assert counted.reads == 0

            paused = await anyio.to_thread.run_sync(run_worker, where, "paused-1", tmp_path)
            await until(
                receiver,
                lambda r: any(b["data"]["execution_id"] == paused for b in of_type(r, ev.PAUSED)),
            )
            assert await anyio.to_thread.run_sync(watcher.sweep) == 0
            assert counted.reads == 1
            assert await anyio.to_thread.run_sync(watcher.sweep) == 0
            assert counted.reads == 1

            await anyio.sleep(1.0)  # the new pause waits a reminder interval too
            watcher.settings = dataclasses.replace(watcher.settings, remind_after=1.0)
            assert await anyio.to_thread.run_sync(watcher.sweep) == SEEDED_PAUSES + 1
            assert counted.reads == 2
            assert await anyio.to_thread.run_sync(watcher.sweep) == 0
            assert counted.reads == 2
            got = await until(receiver, lambda r: len(of_type(r, ev.OVERDUE)) >= SEEDED_PAUSES + 1)
        assert {b["data"]["execution_id"] for b in of_type(got, ev.OVERDUE)} == {
            *where.seed.ids("paused"),
            paused,
        }


@pytest.mark.anyio
async def test_after_a_restart_a_sweep_builds_nothing_the_outbox_holds_for_every_target(
    where: Where,
) -> None:
    """A new process has offered nothing yet, but what the outbox holds for every target
    is not built again (no paused call read, nothing written: a thousand waiting pauses
    cost a restart one query); a target added since gets each waiting pause, once."""
    with Receiver() as first, Receiver() as added:
        notifications = webhook_settings(first, sweep_interval=10.0**6)
        settings = where.settings(notifications, remind_after=10.0**9)
        async with running(create_app(settings)):
            await until(first, lambda r: len(r) >= SEEDED_PAUSES)
        # The sweeps below are the test's own: the watcher makes none by itself.
        quiet = dataclasses.replace(notifications, first_sweep_after=10.0**6)
        async with running(create_app(dataclasses.replace(settings, notifications=quiet))) as s:
            assert s.watcher is not None
            events, keys = await anyio.to_thread.run_sync(s.watcher.sweep_events)
            assert events == [] and len(keys) == SEEDED_PAUSES
        both = dataclasses.replace(quiet, webhooks=(first.url + "/hook", added.url + "/hook"))
        async with running(create_app(dataclasses.replace(settings, notifications=both))) as s:
            assert s.watcher is not None
            events, keys = await anyio.to_thread.run_sync(s.watcher.sweep_events)
            assert sorted(e.type for e in events) == [ev.PAUSED] * SEEDED_PAUSES
            # Recorded for the new target alone: the first has each of them already.
            assert await anyio.to_thread.run_sync(s.watcher.sweep) == SEEDED_PAUSES
            await until(added, lambda r: len(r) >= SEEDED_PAUSES)
            await anyio.sleep(1.0)
        assert len(first.requests()) == SEEDED_PAUSES
        assert len(added.requests()) == SEEDED_PAUSES


@pytest.mark.anyio
async def test_rows_left_for_a_target_no_longer_configured_hold_back_none_of_its_own(
    where: Where,
) -> None:
    """A target dropped from the configuration (its receiver gone with it) leaves its
    rows pending. More than a round of them used to fill every round's claim, oldest
    first, be let go and claimed again at once: the server spun a core and its own
    targets were told nothing. Each process claims only its own targets' rows."""
    with Receiver(down=True) as gone, Receiver() as current:
        settings = where.settings(webhook_settings(gone), remind_after=10.0**9)
        async with running(create_app(settings)) as state:
            assert state.watcher is not None
            outbox = state.watcher.outbox
            await until(gone, lambda r: len(r) >= SEEDED_PAUSES)
            [status] = await anyio.to_thread.run_sync(outbox.target_statuses)
            # More of them than a round claims, as a busy fleet would have left.
            backlog = [
                Notice(f"left-behind-{i}", ev.PAUSED, f"run-{i}", "{}")
                for i in range(2 * ROUND_SIZE)
            ]
            now = time.time()
            recorded = await anyio.to_thread.run_sync(
                lambda: outbox.record(backlog, [status.target], now=now, give_up_at=now + 3600)
            )
            assert recorded == len(backlog)
        moved = dataclasses.replace(settings.notifications, webhooks=(current.url + "/hook",))
        async with running(create_app(dataclasses.replace(settings, notifications=moved))) as s:
            assert s.watcher is not None
            told = await until(current, lambda r: len(r) >= SEEDED_PAUSES)
            assert sorted(b["type"] for b in bodies(told)) == [ev.PAUSED] * SEEDED_PAUSES
            statuses = {
                t.target: t
                for t in await anyio.to_thread.run_sync(s.watcher.outbox.target_statuses)
            }
        # The dropped target's rows are as they were: pending, for whichever process
        # is started with it.
        left = statuses[status.target]
        assert left.pending == SEEDED_PAUSES + len(backlog) and left.sent == 0


@pytest.mark.anyio
async def test_pauses_that_waited_before_are_announced_once_the_runs_index_is_built(
    store_copy: Path, seeded: Seeded, tmp_path: Path
) -> None:
    """On a first start of a big store the runs index is built in the background; the
    backlog of waiting pauses is announced once it is complete, not beside the build
    (at a million runs that doubled its time). SQLite alone: the build is held here by
    the index file's write lock, which PostgreSQL has no counterpart of."""
    import sqlite3

    from localui.backends.sqlite import SQLiteBackend
    from localui.backends.sqlite.store import SQLiteStore
    from localui.records import RunQuery

    where = Where("sqlite", str(store_copy), seeded)
    # An index built once for another file: the next open builds it anew.
    built = SQLiteStore(store_copy, index_dir=tmp_path / "index")
    built.list_runs(RunQuery())
    index_file = built._index.path
    built.close()
    with sqlite3.connect(index_file) as conn:
        conn.execute("UPDATE meta SET value = 'another file' WHERE key = 'identity'")
    holder = sqlite3.connect(index_file, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    store = SQLiteStore(store_copy, index_dir=tmp_path / "index", background_index_from_rows=0)
    with Receiver() as receiver:
        settings = where.settings(webhook_settings(receiver, first_sweep_after=0.1))
        app = create_app(settings, backend=SQLiteBackend(store_copy, store=store))
        async with running(app) as state:
            watcher = state.watcher
            assert watcher is not None
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=BASE_URL
            ) as client:
                try:
                    assert "Indexing" in (await client.get("/")).text  # the build starts
                    await anyio.sleep(1.5)  # the first sweep was due long ago
                    assert receiver.requests() == []
                    assert watcher.swept_at is None and watcher.index_building is not None
                    page = (await client.get("/notifications.json")).json()
                    assert page["last_sweep_at"] is None and page["index_percent"] is not None
                    html = (await client.get("/notifications")).text
                    assert "the runs index is being built" in html
                finally:
                    holder.execute("ROLLBACK")
                    holder.close()
                got = await until(receiver, lambda r: len(r) >= SEEDED_PAUSES)
                page = (await client.get("/notifications.json")).json()
        assert {b["data"]["execution_id"] for b in of_type(got, ev.PAUSED)} == seeded.ids("paused")
        assert page["last_sweep_at"] is not None and page["index_percent"] is None


#: How long the receiver's process is away in the test below, as the issue asks.
RECEIVER_AWAY = 30.0


@pytest.mark.anyio
async def test_a_receiver_away_for_30_s_on_the_default_backoff_gets_each_event_once(
    where: Where,
) -> None:
    """Nothing listens on the receiver's port for 30 s (its process is down, so every
    attempt is refused), then it comes back: with the default schedule (1 s, 2 s, 4 s,
    … attempts at 0, 1, 3, 7, 15 and 31 s) every pause arrives once, on the first
    attempt after it is back, and none is given up on."""
    port = free_port()
    notifications = Notifications(
        webhooks=(f"http://127.0.0.1:{port}/hook",), webhook_secret=SECRET
    )
    assert notifications.retry_initial == 1.0 and notifications.retry_max == 300.0
    async with running(create_app(where.settings(notifications))) as state:
        assert state.watcher is not None
        outbox = state.watcher.outbox
        away_until = time.monotonic() + RECEIVER_AWAY
        # The first sweep records the waiting pauses, and the first attempts fail.
        await anyio.sleep(notifications.first_sweep_after + 2.0)
        statuses = await anyio.to_thread.run_sync(outbox.target_statuses)
        assert statuses[0].pending == SEEDED_PAUSES and statuses[0].sent == 0
        assert statuses[0].last_error is not None and "cannot be reached" in statuses[0].last_error
        await anyio.sleep(max(0.0, away_until - time.monotonic()))
        statuses = await anyio.to_thread.run_sync(outbox.target_statuses)
        assert statuses[0].pending == SEEDED_PAUSES and statuses[0].failed == 0
        with Receiver(port=port) as receiver:
            # The next attempt is due at 31 s; 30 s more is generous on a busy machine.
            got = await until(receiver, lambda r: len(r) >= SEEDED_PAUSES, timeout=30.0)
            await anyio.sleep(1.0)
            statuses = await anyio.to_thread.run_sync(outbox.target_statuses)
            everything = receiver.requests()
        assert len(got) >= SEEDED_PAUSES
        ids = Counter(r.headers["webhook-id"] for r in everything)
        assert len(ids) == SEEDED_PAUSES and max(ids.values()) == 1
        assert {verified(r)["type"] for r in everything} == {"run.paused"}
        assert statuses[0].sent == SEEDED_PAUSES
        assert statuses[0].pending == 0 and statuses[0].failed == 0


@pytest.mark.anyio
async def test_a_target_given_up_on_is_failed_with_its_last_error_and_retry_sends_it(
    where: Where,
) -> None:
    port = free_port()  # nothing listens here
    notifications = Notifications(
        webhooks=(f"http://127.0.0.1:{port}/hook",),
        webhook_secret=SECRET,
        retry_initial=0.1,
        retry_max=0.2,
        retry_for=0.5,
    )
    async with running(create_app(where.settings(notifications))) as state:
        assert state.watcher is not None
        outbox = state.watcher.outbox
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            statuses = await anyio.to_thread.run_sync(outbox.target_statuses)
            if statuses and statuses[0].failed == SEEDED_PAUSES:
                break
            await anyio.sleep(0.1)
        assert statuses[0].failed == SEEDED_PAUSES
        assert statuses[0].last_error is not None and "cannot be reached" in statuses[0].last_error
    args = [a for a in where.store_args() if a]
    if "--pg-schema" in args:
        at = args.index("--pg-schema")
        del args[at : at + 2]
    with Receiver(port=port) as receiver:
        assert main(["notifications", "retry", *args]) == 0
        async with running(create_app(where.settings(notifications))):
            got = await until(receiver, lambda r: len(r) >= SEEDED_PAUSES)
        assert len({r.headers["webhook-id"] for r in got}) == SEEDED_PAUSES


@pytest.mark.anyio
async def test_apprise_chat_targets_get_one_digest_per_poll(where: Where) -> None:
    with Receiver() as receiver:
        port = receiver.port
        notifications = Notifications(
            chat=(f"json://127.0.0.1:{port}/chat-json", f"form://127.0.0.1:{port}/chat-form"),
            **QUICK_RETRIES,
        )
        async with running(create_app(where.settings(notifications))):
            await until(receiver, lambda r: len(r) >= 2)
            await anyio.sleep(1.0)
        (as_json,) = receiver.requests("/chat-json")
        (as_form,) = receiver.requests("/chat-form")
        message = as_json.json()
        assert message["title"] == f"{SEEDED_PAUSES} runs wait for a person"
        for execution_id in where.seed.ids("paused"):
            assert execution_id in message["message"]
            assert execution_id in as_form.form()["message"]
        assert any(f"{call} waits for a person" in message["message"] for call in CALLS)


@pytest.mark.anyio
async def test_a_policy_rule_s_notify_urls_are_told_of_the_pauses_it_governs(where: Where) -> None:
    """A rule's ``notify`` URLs get its pauses and their reminders, in one digest each
    poll; a rule that governs no waiting pause tells its URLs nothing; the server's own
    webhook gets every event, each naming the rule that governs it."""
    with Receiver() as receiver:
        port = receiver.port
        policy = parse_policy(
            f"""
            [[rule]]
            name = "nobody-s"
            agent = "no-such-agent"
            notify = ["json://127.0.0.1:{port}/nobody"]

            [[rule]]
            name = "refunds"
            agent = "refund-bot"
            tool = "refund"
            approvals = 2
            notify = ["json://127.0.0.1:{port}/refunds"]
            """
        )
        settings = where.settings(
            webhook_settings(receiver, remind_times=1), policy=policy, remind_after=1.0
        )
        app = create_app(settings)
        async with running(app):
            await until(receiver, lambda r: len(on(r, "/hook")) >= 2 * SEEDED_PAUSES)
            await until(receiver, lambda r: len(on(r, "/refunds")) >= 1)
            await anyio.sleep(1.0)  # a few polls and a sweep more: nothing else comes
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=BASE_URL
            ) as client:
                page = (await client.get("/notifications.json")).json()
        hooks = bodies(receiver.requests("/hook"))
        assert (
            sorted(b["type"] for b in hooks)
            == [ev.OVERDUE] * SEEDED_PAUSES + [ev.PAUSED] * SEEDED_PAUSES
        )
        assert {b["data"]["rule"] for b in hooks} == {"refunds"}
        assert receiver.requests("/nobody") == []
        told = " ".join(m.json()["message"] for m in receiver.requests("/refunds"))
        assert all(execution_id in told for execution_id in where.seed.ids("paused"))
        # Each target shows scheme, host and fingerprint: told apart by the fingerprint.
        urls = {
            fingerprint("webhook", receiver.url + "/hook"): "hook",
            fingerprint("chat", f"json://127.0.0.1:{port}/refunds"): "refunds",
            fingerprint("chat", f"json://127.0.0.1:{port}/nobody"): "nobody",
        }
        targets = {urls[t["label"].rpartition("#")[2]]: t for t in page["targets"]}
        refunds = [a for a in page["recent"] if a["target"] == targets["refunds"]["id"]]
        assert sorted(a["event_type"] for a in refunds) == sorted(
            a["event_type"] for a in page["recent"] if a["target"] == targets["hook"]["id"]
        )
        assert len(refunds) == 2 * SEEDED_PAUSES and targets["refunds"]["sent"] == len(refunds)
        assert not [a for a in page["recent"] if a["target"] == targets["nobody"]["id"]]
        gets = {name: t["gets"] for name, t in targets.items()}
        assert gets["hook"] == "every event"
        assert gets["refunds"] == "the pauses (and reminders) of rule 'refunds'"
        assert gets["nobody"] == "the pauses (and reminders) of rule 'nobody-s'"


def test_a_malformed_target_is_a_one_line_error_at_start(
    store_copy: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    bad_policy = tmp_path / "policy.toml"
    bad_policy.write_text('[[rule]]\nname = "refunds"\nnotify = ["nonsense://here"]\n')
    base = ["serve", "--store", str(store_copy), "--no-auth", "--port", str(free_port())]
    cases = [
        (["--notify", "nonsense://here"], "not a notification URL Apprise knows"),
        (["--webhook", "ftp://host/x", "--webhook-secret-file", str(secret)], "not an http://"),
        (["--webhook", "http://127.0.0.1:9/x"], "needs --webhook-secret-file"),
        (["--notify-on", "paused,sometimes", "--notify", "json://127.0.0.1:9/"], "not an event"),
        (["--webhook-secret-file", str(tmp_path / "missing")], "--webhook-secret-file"),
        (["--policy", str(bad_policy)], "policy rule 'refunds': notify nonsense://"),
    ]
    for extra, said in cases:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


@pytest.mark.anyio
async def test_the_notifications_page_lists_targets_and_announcements(where: Where) -> None:
    with Receiver() as receiver:
        app = create_app(where.settings(webhook_settings(receiver)))
        async with running(app):
            await until(receiver, lambda r: len(r) >= SEEDED_PAUSES)
            await anyio.sleep(0.5)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=BASE_URL
            ) as client:
                page = (await client.get("/notifications.json")).json()
                html = (await client.get("/notifications")).text
    (target,) = page["targets"]
    assert target["kind"] == "webhook" and target["sent"] == SEEDED_PAUSES
    digest = fingerprint("webhook", receiver.url + "/hook")
    assert target["label"] == f"http://127.0.0.1:{receiver.port}/…#{digest}"
    assert len(page["recent"]) == SEEDED_PAUSES
    assert {r["state"] for r in page["recent"]} == {"sent"}
    assert "run.paused" in html and f"127.0.0.1:{receiver.port}/…#{digest}" in html


# --- served processes -----------------------------------------------------------------


def serve_args(where: Where, receiver: Receiver, secret: Path, *extra: str) -> list[str]:
    return [
        "serve",
        *where.store_args(),
        "--no-auth",
        "--webhook",
        receiver.url + "/hook",
        "--webhook-secret-file",
        str(secret),
        *extra,
    ]


def test_a_server_killed_mid_delivery_delivers_after_restart_at_most_once_more_same_id(
    where: Where, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    hold = threading.Event()
    with Receiver(hold=hold) as receiver:
        args = serve_args(where, receiver, secret, "--notify-lease", "2", "--notify-on", "paused")
        first = start_localui(args, cwd=tmp_path, log=tmp_path / "first.log")
        try:
            # The first POST is held unanswered: that row is sent and not yet marked,
            # the other pauses are recorded and claimed, not yet sent.
            (in_flight,) = receiver.wait_for(lambda r: len(r) >= 1)
        finally:
            first.process.send_signal(signal.SIGKILL)
            first.process.wait()
            first.stop()
        hold.set()
        second = start_localui(args, cwd=tmp_path, log=tmp_path / "second.log")
        try:
            got = receiver.wait_for(
                lambda r: len({x.headers["webhook-id"] for x in r}) >= SEEDED_PAUSES
            )
            time.sleep(1.5)
        finally:
            second.stop()
    seen = Counter(r.headers["webhook-id"] for r in receiver.requests())
    assert len(seen) == SEEDED_PAUSES, got
    assert seen[in_flight.headers["webhook-id"]] == 2
    assert all(n == 1 for k, n in seen.items() if k != in_flight.headers["webhook-id"])
    assert {b["data"]["execution_id"] for b in bodies(receiver.requests())} == where.seed.ids(
        "paused"
    )


@pytest.mark.postgres
def test_two_servers_on_one_postgresql_store_deliver_each_event_once(
    pg_store: PgStore, pg_seeded: Any, tmp_path: Path
) -> None:
    where = Where("postgres", pg_store.dsn, pg_seeded, pg_store)
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    with Receiver() as receiver:
        args = serve_args(where, receiver, secret, "--notify-on", "paused,failed")
        servers = [
            start_localui(args, cwd=tmp_path, log=tmp_path / f"server-{n}.log") for n in (1, 2)
        ]
        try:
            new = [run_worker(where, name, tmp_path) for name in ("paused-1", "paused-2", "failed")]
            receiver.wait_for(lambda r: len(r) >= SEEDED_PAUSES + len(new))
            time.sleep(2.0)  # several polls of both servers: nothing comes twice
        finally:
            for server in servers:
                server.stop()
    seen = Counter(r.headers["webhook-id"] for r in receiver.requests())
    assert len(seen) == SEEDED_PAUSES + len(new) and max(seen.values()) == 1
    announced = {b["data"]["execution_id"] for b in bodies(receiver.requests())}
    assert announced == where.seed.ids("paused") | set(new)


def test_a_deep_link_opened_without_a_session_lands_on_its_pause_after_sign_in(
    store_copy: Path, seeded: Seeded
) -> None:
    from helpers import LOOPBACK_CLIENT, TEST_TOKEN, sign_in_settings
    from starlette.testclient import TestClient

    with Receiver() as receiver:
        settings = Settings(
            store=str(store_copy),
            sign_in=sign_in_settings(),
            notifications=webhook_settings(receiver, public_url="https://ops.example.com/desk"),
            **FAST,
        )
        with TestClient(create_app(settings), base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
            got = receiver.wait_for(lambda r: len(r) >= SEEDED_PAUSES)
            paused = seeded.id("paused-1")
            (link,) = [b["data"]["url"] for b in bodies(got) if b["data"]["execution_id"] == paused]
            assert link == f"https://ops.example.com/desk/approvals/{paused}"
            path = link.removeprefix("https://ops.example.com/desk")
            first = client.get(path)
            assert first.status_code == 401
            assert f'name="next" value="{path}"' in first.text
            signed = client.post(
                "/signin", data={"token": TEST_TOKEN, "next": path}, follow_redirects=False
            )
            assert signed.status_code == 303 and signed.headers["location"] == path
            card = client.get(path)
            assert card.status_code == 200 and "A-1002" in card.text


@pytest.mark.parametrize(
    ("host", "public_url", "base"),
    [
        ("127.0.0.1", "", "http://localui.localhost:8765/desk"),
        ("localhost", "", "http://localui.localhost:8765/desk"),
        ("10.1.2.3", "", "http://10.1.2.3:8765/desk"),
        ("127.0.0.1", "https://ops.example.com/localui/", "https://ops.example.com/localui"),
    ],
)
def test_deep_links_point_where_the_session_cookie_lives(
    host: str, public_url: str, base: str
) -> None:
    """On loopback a link opens localui by its own name, as the printed sign-in link
    does: the session cookie set there is the one the link's page is read with."""
    from localui.settings import Notifications, Settings
    from localui.views.urls import link_base

    settings = Settings(
        store="local.db",
        host=host,
        root_path="/desk",
        notifications=Notifications(public_url=public_url),
    )
    assert link_base(settings) == base


def test_chat_urls_are_checked_and_sent_by_a_child_process_not_the_server() -> None:
    # A fresh interpreter, so nothing else this test run imported is counted.
    script = """
import os, signal, sys
from bench.receiver import Receiver
from localui.notify.apprise_process import AppriseProcess
child = AppriseProcess()
with Receiver() as receiver:
    url = f"json://127.0.0.1:{receiver.port}/chat"
    child.check_soon([url])
    print(child.label(url), child.label("nonsense://here"))
    child.send(url, "first", "a run waits")
    first = child.pid
    os.kill(first, signal.SIGKILL)
    os.waitpid(first, 0)
    child.send(url, "second", "after the child died")
    print(first != child.pid, [r.json()["title"] for r in receiver.requests("/chat")])
    child.close()
print("apprise" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    checked, restarted, in_server = done.stdout.splitlines()
    assert "('label', 'json://127.0.0.1:" in checked
    assert "('error', 'not a notification URL Apprise knows')" in checked
    assert restarted == "True ['first', 'second']"
    assert in_server == "False"
