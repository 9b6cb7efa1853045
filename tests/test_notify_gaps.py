"""Notifications across gaps: what came while no localui watched, announced once at
the next start (the store's last look, ``localui_watch``), and rows of a target no
server is started with any more, given up on once their retries would have run out.

On the seeded runs the real SDK wrote, on SQLite and on PostgreSQL, as in
``test_notify``; new runs come from the demo agent in child processes, decisions
from the app's own approve path, targets are loopback receivers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from test_notify import (
    BASE_URL,
    SEEDED_PAUSES,
    Where,
    acting_agents,
    bodies,
    of_type,
    run_worker,
    running,
    until,
    webhook_settings,
)

from bench.receiver import Receiver
from localui.app import create_app
from localui.backends import open_outbox
from localui.backends.base import Outbox
from localui.backends.notifications import FAILED, PENDING, SENT, Notice
from localui.notify import events as ev
from localui.notify.sender import NOT_CONFIGURED
from localui.notify.targets import targets_of
from localui.settings import Notifications

if TYPE_CHECKING:
    from conftest import PgStore, Seeded


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, store_copy: Path, seeded: Seeded) -> Where:
    if request.param == "sqlite":
        return Where("sqlite", str(store_copy), seeded)
    pg: PgStore = request.getfixturevalue("pg_store")
    return Where("postgres", pg.dsn, request.getfixturevalue("pg_seeded"), pg)


@contextlib.contextmanager
def outbox_of(where: Where) -> Any:
    outbox = open_outbox(where.settings(Notifications()))
    try:
        yield outbox
    finally:
        outbox.close()


def states(outbox: Outbox, target: str) -> dict[str, tuple[str, str | None]]:
    """Each row of ``target``: its event key's state and error."""
    return {
        n.event_key: (n.state, n.last_error)
        for n in outbox.list_recent(10_000)
        if n.target == target
    }


async def decide_with_no_watcher(where: Where, execution_id: str, reason: str) -> None:
    """Reject a pause through a server that announces nothing (no target: no watcher),
    as a desk without notifications would."""
    with contextlib.ExitStack() as stack:
        app = create_app(where.settings(Notifications()), agents=acting_agents(where, stack))
        async with running(app) as state:
            assert state.watcher is None
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=BASE_URL
            ) as client:
                cards = (await client.get("/approvals.json")).json()["approvals"]
                (card,) = [c for c in cards if c["execution_id"] == execution_id]
                answer = await client.post(
                    f"/approvals/{execution_id}/reject",
                    data={
                        "approver": "Ada",
                        "reason": reason,
                        "checkpoint_id": card["checkpoint_id"],
                    },
                    headers={"accept": "application/json"},
                )
                assert answer.status_code == 200, answer.text


def ids(received: list[Any], event_type: str) -> list[str]:
    return [b["data"]["execution_id"] for b in of_type(received, event_type)]


# --- the store's last look --------------------------------------------------------------


def test_the_last_look_moves_only_forward_and_is_shared_by_every_process(where: Where) -> None:
    with outbox_of(where) as one, outbox_of(where) as other:
        assert one.looked_at() is None
        one.advance_looked_at(1000.5)
        assert other.looked_at() == 1000.5
        # A process that began reading earlier leaves it where the other put it.
        other.advance_looked_at(900.0)
        assert one.looked_at() == 1000.5
        other.advance_looked_at(2000.0)
        assert one.looked_at() == other.looked_at() == 2000.0


@pytest.mark.anyio
async def test_a_failure_and_a_decision_while_no_watcher_ran_are_announced_once_at_the_next_start(
    where: Where, tmp_path: Path
) -> None:
    """A server ran and stopped; a run failed and an approval was decided while no
    watcher ran; then a server that announces only pauses recorded a newer pause.
    Reaching back only to the newest event the outbox held missed both: the last look
    finds them, and the next start announces each once."""
    with Receiver() as receiver:
        settings = where.settings(webhook_settings(receiver))
        async with running(create_app(settings)) as state:
            assert state.watcher is not None
            await until(receiver, lambda r: len(r) >= SEEDED_PAUSES)
            while state.watcher.swept_at is None:
                await anyio.sleep(0.05)
            looked = await anyio.to_thread.run_sync(state.watcher.outbox.looked_at)
        assert looked is not None

        failed = await anyio.to_thread.run_sync(run_worker, where, "failed", tmp_path)
        decided = where.seed.id("paused-1")
        await decide_with_no_watcher(where, decided, "while nothing watched")
        pauses_only = dataclasses.replace(settings.notifications, events=(ev.PAUSED,))
        async with running(create_app(dataclasses.replace(settings, notifications=pauses_only))):
            paused = await anyio.to_thread.run_sync(run_worker, where, "paused-1", tmp_path)
            await until(receiver, lambda r: paused in ids(r, ev.PAUSED))
            await anyio.sleep(1.0)  # sweeps of a watcher that offers no failure
        with outbox_of(where) as outbox:
            # It looked at no failure and no decision: the look is where it was.
            assert outbox.looked_at() == looked
            newest = outbox.list_recent(1)[0]
        assert newest.event_type == ev.PAUSED and newest.execution_id == paused

        async with running(create_app(settings)):
            await until(
                receiver, lambda r: ids(r, ev.FAILED) == [failed] and len(ids(r, ev.DECIDED)) == 1
            )
            await anyio.sleep(1.5)  # a few sweeps more: nothing comes twice
    everything = receiver.requests()
    assert ids(everything, ev.FAILED) == [failed]
    (decision,) = of_type(everything, ev.DECIDED)
    assert decision["data"]["execution_id"] == decided
    assert decision["data"]["reason"] == "while nothing watched"
    assert len(everything) == SEEDED_PAUSES + 3
    assert max(Counter(r.headers["webhook-id"] for r in everything).values()) == 1


@pytest.mark.anyio
async def test_what_came_before_the_last_look_is_not_offered_again_after_a_restart(
    where: Where, tmp_path: Path
) -> None:
    """A failure the last look has passed is not offered again, even to a target added
    since; one that came while no server ran goes to both targets, once each."""
    with Receiver() as first, Receiver() as added:
        notifications = webhook_settings(first)
        settings = where.settings(notifications)
        async with running(create_app(settings)) as state:
            assert state.watcher is not None
            state.watcher.look_back = 0.0
            await until(first, lambda r: len(r) >= SEEDED_PAUSES)
            before = await anyio.to_thread.run_sync(run_worker, where, "failed", tmp_path)
            await until(first, lambda r: before in ids(r, ev.FAILED))
            # A sweep that began after it: the look has passed it.
            await anyio.to_thread.run_sync(state.watcher.sweep)
            outbox = state.watcher.outbox
            looked = await anyio.to_thread.run_sync(outbox.looked_at)
            facts = await anyio.to_thread.run_sync(state.watcher.store.get_run, before)
        assert looked is not None and facts is not None
        assert datetime_of(facts.last_at) < looked

        during = await anyio.to_thread.run_sync(run_worker, where, "failed", tmp_path)
        hooks = (first.url + "/hook", added.url + "/hook")
        both = dataclasses.replace(notifications, webhooks=hooks)
        async with running(create_app(dataclasses.replace(settings, notifications=both))):
            await until(first, lambda r: during in ids(r, ev.FAILED))
            await until(added, lambda r: during in ids(r, ev.FAILED) and len(r) > SEEDED_PAUSES)
            await anyio.sleep(1.5)  # a few sweeps more
    assert ids(first.requests(), ev.FAILED) == [before, during]
    # The added target gets the pauses that wait and what came while nothing ran.
    assert ids(added.requests(), ev.FAILED) == [during]
    assert sorted(b["type"] for b in bodies(added.requests())) == sorted(
        [ev.FAILED] + [ev.PAUSED] * SEEDED_PAUSES
    )
    for receiver in (first, added):
        assert max(Counter(r.headers["webhook-id"] for r in receiver.requests()).values()) == 1


def datetime_of(text: str) -> float:
    from localui.runs import parse_time

    parsed = parse_time(text)
    assert parsed is not None
    return parsed.timestamp()


@pytest.mark.anyio
async def test_two_watchers_on_one_store_announce_what_came_while_none_ran_once(
    where: Where, tmp_path: Path
) -> None:
    with Receiver() as receiver:
        settings = where.settings(webhook_settings(receiver))
        async with running(create_app(settings)) as state:
            assert state.watcher is not None
            await until(receiver, lambda r: len(r) >= SEEDED_PAUSES)
            while state.watcher.swept_at is None:
                await anyio.sleep(0.05)
        failed = await anyio.to_thread.run_sync(run_worker, where, "failed", tmp_path)
        decided = where.seed.id("paused-2")
        await decide_with_no_watcher(where, decided, "while both were down")
        async with running(create_app(settings)) as one, running(create_app(settings)) as two:
            assert one.watcher is not None and two.watcher is not None
            await until(
                receiver, lambda r: ids(r, ev.FAILED) == [failed] and len(ids(r, ev.DECIDED)) == 1
            )
            swept = (one.watcher.swept_at, two.watcher.swept_at)
            # Both have swept since, at least once more each: nothing comes twice.
            while one.watcher.swept_at == swept[0] or two.watcher.swept_at == swept[1]:
                await anyio.sleep(0.1)
            await anyio.sleep(0.5)
    everything = receiver.requests()
    assert ids(everything, ev.FAILED) == [failed]
    assert ids(everything, ev.DECIDED) == [decided]
    assert len(everything) == SEEDED_PAUSES + 2
    assert max(Counter(r.headers["webhook-id"] for r in everything).values()) == 1


# --- targets no longer configured ------------------------------------------------------------


def test_rows_of_a_target_no_longer_configured_are_given_up_only_past_give_up_at(
    where: Where,
) -> None:
    """The outbox itself, on its own clock: rows of the caller's targets are never
    given up this way, nor rows another process holds, nor more than asked at once."""
    t0 = 1_000_000.0
    with outbox_of(where) as outbox:

        def notices(*names: str) -> list[Notice]:
            return [Notice(name, ev.PAUSED, f"run-{name}", "{}") for name in names]

        outbox.record(notices("soon", "held"), ["gone"], now=t0, give_up_at=t0 + 10)
        outbox.record(notices("later"), ["gone"], now=t0, give_up_at=t0 + 1000)
        outbox.record(notices("mine"), ["kept"], now=t0, give_up_at=t0 + 10)
        # Another process serving "gone" holds this one, past its give_up_at.
        [held] = [
            n
            for n in outbox.claim_due(now=t0 + 9, lease=60, limit=10, targets=["gone"])
            if n.event_key == "held"
        ]
        outbox.release([n.id for n in outbox.list_recent(10) if n.event_key == "soon"])

        def give_up(now: float, limit: int = 100) -> int:
            return outbox.give_up_unconfigured(
                targets=["kept"], now=now, detail=NOT_CONFIGURED, limit=limit
            )

        assert give_up(t0 + 9.9) == 0
        assert {k: s for k, (s, _) in states(outbox, "gone").items()} == {
            "soon": PENDING,
            "held": PENDING,
            "later": PENDING,
        }
        assert give_up(t0 + 11) == 1
        assert states(outbox, "gone")["soon"] == (FAILED, NOT_CONFIGURED)
        assert states(outbox, "gone")["held"] == (PENDING, None)
        assert states(outbox, "gone")["later"] == (PENDING, None)
        # Once its holder's lease has run out, the held row goes too.
        assert give_up(held.lease_until + 1 if held.lease_until else t0 + 70) == 1
        assert states(outbox, "gone")["held"] == (FAILED, NOT_CONFIGURED)

        # A bounded round: at most ``limit`` a time.
        outbox.record(notices("a", "b", "c"), ["gone"], now=t0, give_up_at=t0 + 10)
        assert [give_up(t0 + 100, limit=2) for _ in range(3)] == [2, 1, 0]

        # The caller's own target, far past its give_up_at: left to its sender.
        assert give_up(t0 + 10**6) == 1  # "later"
        assert states(outbox, "kept") == {"mine": (PENDING, None)}
        assert states(outbox, "gone")["later"] == (FAILED, NOT_CONFIGURED)
        # Given up on like any other: ``localui notifications retry`` sends them again.
        assert outbox.retry_failed(now=t0, give_up_at=t0 + 10**7, target="gone") == 6


@pytest.mark.anyio
async def test_a_server_gives_up_on_a_dropped_target_s_rows_once_their_retries_run_out(
    where: Where,
) -> None:
    """A target dropped from the flags leaves its rows pending; the next server gives
    them up once their ``give_up_at`` has passed (not before), and /notifications says
    why. Its own target's rows, some past their ``give_up_at`` already, are sent."""
    retry_for = 8.0
    with Receiver(down=True) as gone, Receiver() as current:
        dropped = webhook_settings(gone, retry_for=retry_for)
        settings = where.settings(dropped, remind_after=10.0**9)
        async with running(create_app(settings)) as state:
            assert state.watcher is not None
            await until(gone, lambda r: len(r) >= SEEDED_PAUSES)
            [gone_id] = [t.id for t in state.watcher.targets]
        kept = webhook_settings(current)
        [current_id] = [t.id for t in targets_of(kept)]
        with outbox_of(where) as outbox:
            rows = states(outbox, gone_id)
            assert len(rows) == SEEDED_PAUSES
            assert {s for s, _ in rows.values()} == {PENDING}
            recorded = outbox.list_recent(100)
            give_up_at = max(n.give_up_at for n in recorded)
            # Rows of the current target whose retries would have run out already.
            now, one = time.time(), recorded[0]
            late = [
                Notice(f"late-{i}", one.event_type, one.execution_id, one.payload) for i in range(2)
            ]
            outbox.record(late, [current_id], now=now, give_up_at=now - 50)
        app = create_app(dataclasses.replace(settings, notifications=kept))
        async with running(app) as s:
            assert s.watcher is not None
            outbox = s.watcher.outbox
            await until(current, lambda r: len(r) >= SEEDED_PAUSES + len(late))
            if time.time() < give_up_at:
                # Rounds ran, and the dropped target's rows still wait.
                assert {st for st, _ in states(outbox, gone_id).values()} == {PENDING}
            while {st for st, _ in states(outbox, gone_id).values()} != {FAILED}:
                assert time.time() < give_up_at + 30, states(outbox, gone_id)
                await anyio.sleep(0.1)
            given_up = [n for n in outbox.list_recent(100) if n.target == gone_id]
            mine = states(outbox, current_id)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=BASE_URL
            ) as client:
                page = (await client.get("/notifications.json")).json()
                html = (await client.get("/notifications")).text
    assert all(n.next_at >= n.give_up_at for n in given_up)
    assert {n.last_error for n in given_up} == {NOT_CONFIGURED}
    assert {st for st, _ in mine.values()} == {SENT} and len(mine) == SEEDED_PAUSES + len(late)
    shown = [r for r in page["recent"] if r["state"] == FAILED]
    assert len(shown) == SEEDED_PAUSES
    assert {r["last_error"] for r in shown} == {NOT_CONFIGURED}
    assert NOT_CONFIGURED in html and "<td>given up</td>" in html
    assert len(gone.requests()) >= SEEDED_PAUSES  # tried while it was configured
