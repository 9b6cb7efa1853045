"""Notifications across gaps: rows of a target no server is started with any more,
given up on once their retries would have run out.

On the seeded runs the real SDK wrote, on SQLite and on PostgreSQL, as in
``test_notify``; new runs come from the demo agent in child processes, decisions
from the app's own approve path, targets are loopback receivers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from test_notify import (
    BASE_URL,
    SEEDED_PAUSES,
    Where,
    of_type,
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


def ids(received: list[Any], event_type: str) -> list[str]:
    return [b["data"]["execution_id"] for b in of_type(received, event_type)]


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
