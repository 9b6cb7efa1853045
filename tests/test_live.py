"""The change feed, its fan-out, and the live streams, on stores real agents wrote.

Streams are read through the app itself (its lifespan running, the ASGI
protocol spoken by hand) and made finite by the test: it leaves, like a
browser closing a tab, once it has read the events it waits for. Writes come
from the demo agent in a child process, or from an approval through the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import anyio
import httpx
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream
from helpers import NO_SIGN_IN, start_localui
from starlette.applications import Starlette

from localui.app import create_app
from localui.backends.base import Changes
from localui.backends.sqlite import SQLiteBackend
from localui.backends.sqlite.changes import SQLiteChangeSource
from localui.backends.sqlite.store import SQLiteStore
from localui.live import ChangeFeed, Resync
from localui.settings import Settings
from localui.views.state import AppState

if TYPE_CHECKING:
    from conftest import Seeded
    from starlette.testclient import TestClient

BASE_URL = "http://127.0.0.1:8765"
#: The seeded store's runs and pauses (tests/conftest.py's Seeded.STATES).
SEEDED_RUNS = 10
SEEDED_PAUSES = 4
#: Polls this often in tests, so waits are short; a wait's timeout is generous.
INTERVAL = 0.05
WAIT_S = 20.0

RUN_FRAGMENTS = ("nav-badge", "run-state", "run-actions", "decisions", "timeline")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- helpers: a child agent, the app, a stream ---------------------------------


async def run_worker(store: Path, scenario: str, cwd: Path) -> str:
    """Run one demo scenario in a child process, as an agent of the user's would;
    returns its execution id."""
    env = {
        **os.environ,
        "FASTAIAGENT_TRACE_ENABLED": "false",
        "FASTAIAGENT_LOCAL_DB": str(store),
    }
    result = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "localui.demo.worker",
            "--store",
            str(store),
            "--scenario",
            scenario,
        ],
        cwd=cwd,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode().strip().splitlines()[-1]


@dataclass
class Event:
    event: str | None
    data: str


@dataclass
class Stream:
    """One SSE response, read event by event."""

    chunks: MemoryObjectReceiveStream[bytes | None]
    start: dict[str, Any]
    buffer: str = ""
    ended: bool = False
    seen: list[Event] = field(default_factory=list)

    @property
    def status(self) -> int:
        return int(self.start["status"])

    async def next(self, timeout: float = WAIT_S) -> Event | None:
        """The next event with data or a name (comments skipped); None when it ended."""
        with anyio.fail_after(timeout):
            while True:
                while "\r\n\r\n" in self.buffer:
                    block, self.buffer = self.buffer.split("\r\n\r\n", 1)
                    event = parse_event(block)
                    if event is not None:
                        self.seen.append(event)
                        return event
                if self.ended:
                    return None
                chunk = await self.chunks.receive()
                if chunk is None:
                    self.ended = True
                else:
                    self.buffer += chunk.decode()

    async def until(self, wanted: Callable[[Event], bool], timeout: float = WAIT_S) -> Event:
        """Read on until an event is ``wanted``."""
        with anyio.fail_after(timeout):
            while True:
                event = await self.next(timeout=math.inf)
                assert event is not None, f"the stream ended; it sent {self.names()}"
                if wanted(event):
                    return event

    async def first(self, *names: str) -> dict[str, Event]:
        """The first event of each name (the stream's opening state)."""
        return await self.each({name: lambda e: True for name in names})

    async def each(
        self, wanted: dict[str, Callable[[Event], bool]], timeout: float = WAIT_S
    ) -> dict[str, Event]:
        """For each event name, the first event of that name that is wanted, in any order."""
        got: dict[str, Event] = {}
        with anyio.fail_after(timeout):
            while wanted.keys() - got.keys():
                event = await self.until(
                    lambda e: e.event in wanted and e.event not in got and wanted[e.event](e),
                    timeout=math.inf,
                )
                assert event.event is not None
                got[event.event] = event
        return got

    def names(self) -> list[str | None]:
        return [e.event for e in self.seen]


def parse_event(block: str) -> Event | None:
    name, data = None, []
    for line in block.split("\r\n"):
        if line.startswith(":") or line.startswith("retry:"):
            continue
        key, _, value = line.partition(": ")
        if key == "event":
            name = value
        elif key == "data":
            data.append(value)
    if name is None and not data:
        return None
    return Event(event=name, data="\n".join(data))


@contextlib.asynccontextmanager
async def open_stream(
    app: Starlette,
    path: str,
    *,
    buffer: float = math.inf,
    cookie: str = "",
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> AsyncIterator[Stream]:
    """GET ``path`` as a browser's EventSource would; leaving the block is the browser
    going away. ``buffer=0`` is a client that reads only when the test does."""
    send_chunks, receive_chunks = anyio.create_memory_object_stream[bytes | None](buffer)
    left = anyio.Event()
    started = anyio.Event()
    url = urlsplit(path)
    sent_headers = [(b"host", b"127.0.0.1:8765"), (b"accept", b"text/event-stream"), *headers]
    if cookie:
        sent_headers.append((b"cookie", cookie.encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": url.path,
        "raw_path": url.path.encode(),
        "query_string": url.query.encode(),
        "root_path": "",
        "headers": sent_headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8765),
    }
    start: dict[str, Any] = {}

    async def receive() -> dict[str, Any]:
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
            started.set()
        elif message["type"] == "http.response.body":
            if message.get("body"):
                await send_chunks.send(message["body"])
            if not message.get("more_body", False):
                await send_chunks.send(None)

    async with send_chunks, receive_chunks, anyio.create_task_group() as tasks:
        tasks.start_soon(app, scope, receive, send)
        with anyio.fail_after(WAIT_S):
            await started.wait()
        try:
            yield Stream(chunks=receive_chunks, start=start)
        finally:
            left.set()


@contextlib.asynccontextmanager
async def running(app: Starlette) -> AsyncIterator[AppState]:
    """The app with its lifespan running (its change feed polling)."""
    async with app.router.lifespan_context(app):
        ctx: AppState = app.state.localui
        yield ctx


@contextlib.contextmanager
def acting_app(store: Path, **settings: Any) -> Iterator[Starlette]:
    """The app over ``store`` with the demo refund-bot registered, so it can approve."""
    from fastaiagent.checkpointers import SQLiteCheckpointer

    from localui.demo.agent import build_agent

    checkpointer = SQLiteCheckpointer(str(store))
    try:
        agent = build_agent(checkpointer)
        yield create_app(
            Settings(store=str(store), poll_interval=INTERVAL, sign_in=NO_SIGN_IN, **settings),
            agents=[agent],
        )
    finally:
        checkpointer.close()


def http(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL)


async def approve(client: httpx.AsyncClient, execution_id: str) -> dict[str, Any]:
    """Approve a pause through the app, as a person's form would."""
    cards = (await client.get("/approvals.json")).json()["approvals"]
    (card,) = [c for c in cards if c["execution_id"] == execution_id]
    response = await client.post(
        f"/approvals/{execution_id}/approve",
        data={"approver": "Ada", "reason": "fine", "checkpoint_id": card["checkpoint_id"]},
        headers={"accept": "application/json"},
    )
    assert response.status_code == 200, response.text
    outcome: dict[str, Any] = response.json()
    return outcome


class StillSource:
    """A change source where nothing ever changes, counting what it is asked."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def reset(self) -> None:
        self.calls["reset"] += 1

    def poll(self) -> Changes | None:
        self.calls["poll"] += 1
        return None

    def close(self) -> None:
        self.calls["close"] += 1


STORE_METHODS = (
    "list_runs",
    "get_run",
    "list_rows",
    "get_row",
    "get_pending",
    "list_pending",
    "list_cache",
    "get_fork_origin",
    "list_forks",
    "totals",
    "count_pending",
    "get_project_id",
    "prune_preview",
)


class CountingStore(SQLiteStore):
    """The SQLite read model, counting every call the app makes on it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls: Counter[str] = Counter()
        for name in STORE_METHODS:
            setattr(self, name, self._counted(name, getattr(self, name)))

    def _counted(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return method(*args, **kwargs)

        return counted


# --- the feed -------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_feed_sees_a_run_another_process_writes(store_copy: Path, tmp_path: Path) -> None:
    feed = ChangeFeed(SQLiteChangeSource(store_copy), interval=INTERVAL)
    await feed.start()
    try:
        async with await feed.subscribe() as subscription:
            new_run = await run_worker(store_copy, "paused-1", tmp_path)
            seen = Changes()
            with anyio.fail_after(WAIT_S):
                while not (new_run in seen.runs and new_run in seen.pauses_added):
                    item = await subscription.next()
                    assert isinstance(item, Changes), item
                    seen = seen.merge(item)
    finally:
        await feed.stop()
    assert seen.runs == {new_run}
    assert seen.pauses_added == {new_run}
    assert not seen.pauses_removed and not seen.decided and not seen.everything


class SlowPollSource(SQLiteChangeSource):
    """The real SQLite source, with a poll slow enough to be cancelled mid-read; it
    notes when each poll ends and when the connection is closed."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.events: list[str] = []
        self.polling = threading.Event()

    def poll(self) -> Changes | None:
        self.polling.set()
        time.sleep(0.3)
        changes = super().poll()
        self.events.append("poll ended")
        return changes

    def close(self) -> None:
        self.events.append("closed")
        super().close()


@pytest.mark.anyio
async def test_stopping_never_closes_the_source_under_a_poll_in_flight(store_copy: Path) -> None:
    # A poll cancelled mid-read (its stream or the app going away) still holds the
    # source until the read returns: closing SQLite's connection under a read in
    # another thread crashes the process.
    source = SlowPollSource(store_copy)
    feed = ChangeFeed(source, interval=INTERVAL)
    subscription = await feed.subscribe()
    polling = asyncio.ensure_future(feed.poll_once())
    await anyio.to_thread.run_sync(source.polling.wait)
    polling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await polling
    await feed.stop()
    assert source.events == ["poll ended", "closed"]
    assert await subscription.next() is None  # the stop reached its subscriber too


@pytest.mark.anyio
async def test_a_poll_cancelled_twice_still_waits_for_its_read(store_copy: Path) -> None:
    # A stream closing while the app shuts down can cancel the same poll twice; the
    # second cancellation must not let go of the source either.
    source = SlowPollSource(store_copy)
    feed = ChangeFeed(source, interval=INTERVAL)
    await feed.subscribe()
    polling = asyncio.ensure_future(feed.poll_once())
    await anyio.to_thread.run_sync(source.polling.wait)
    polling.cancel()
    await asyncio.sleep(0.01)
    polling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await polling
    assert source.events == ["poll ended"]  # the task ended only after its read
    await feed.stop()
    assert source.events == ["poll ended", "closed"]


@pytest.mark.anyio
async def test_with_no_one_watching_the_feed_reads_nothing(
    store_copy: Path, tmp_path: Path
) -> None:
    statements: list[str] = []
    feed = ChangeFeed(SQLiteChangeSource(store_copy, trace=statements.append), interval=0.01)
    await feed.start()
    try:
        # A run written while no one watches: the feed does not look at all.
        await run_worker(store_copy, "paused-1", tmp_path)
        await anyio.sleep(0.3)
        assert (feed.polls, statements) == (0, [])

        async with await feed.subscribe() as subscription:
            baseline = len(statements)
            assert baseline > 0  # the first subscriber takes a fresh baseline
            await anyio.sleep(0.3)
            assert feed.polls >= 3
            # Nothing changed since: each poll was one PRAGMA, reading no table, and
            # the run written before the baseline is not replayed as a change.
            assert set(statements[baseline:]) == {"PRAGMA data_version"}
            assert subscription.queue.empty()

            new_run = await run_worker(store_copy, "paused-1", tmp_path)
            with anyio.fail_after(WAIT_S):
                item = await subscription.next()
            assert isinstance(item, Changes) and new_run in item.runs

        await anyio.sleep(0.1)
        polls, count = feed.polls, len(statements)
        await anyio.sleep(0.3)
        assert (feed.polls, len(statements)) == (polls, count)  # idle again
    finally:
        await feed.stop()


@pytest.mark.anyio
async def test_a_subscriber_that_falls_behind_is_told_to_resync() -> None:
    source = StillSource()
    feed = ChangeFeed(source, interval=60, queue_size=2)
    slow = await feed.subscribe()
    fast = await feed.subscribe()
    assert source.calls["reset"] == 1  # one baseline for both
    start = feed.seq

    got = []
    for run in ("a", "b", "c"):
        feed.publish(Changes(runs=frozenset({run})))
        got.append(await fast.next())
    assert [c.runs for c in got if isinstance(c, Changes)] == [{"a"}, {"b"}, {"c"}]
    assert fast.overflows == 0

    # The slow one never read: its queue of two overflowed on the third change.
    assert await slow.next() == Resync(seq=start + 3)
    assert slow.overflows == 1
    feed.publish(Changes(pauses_added=frozenset({"d"})))
    after = await slow.next()
    assert isinstance(after, Changes) and after.pauses_added == {"d"}

    # One that lags a little gets what it missed merged into one.
    feed.publish(Changes(runs=frozenset({"e"})))
    feed.publish(Changes(pauses_removed=frozenset({"d"})))
    merged = await slow.next()
    assert isinstance(merged, Changes)
    assert (merged.runs, merged.pauses_removed, merged.seq) == ({"e"}, {"d"}, start + 6)

    await feed.stop()
    assert await slow.next() is None and await fast.next() is None
    assert source.calls["close"] == 1


@pytest.mark.anyio
async def test_stopping_the_feed_ends_every_subscription() -> None:
    feed = ChangeFeed(StillSource(), interval=60, queue_size=1)
    await feed.start()
    subscriptions = [await feed.subscribe() for _ in range(3)]
    feed.publish(Changes(runs=frozenset({"a"})))  # fills each queue of one
    await feed.stop()
    for subscription in subscriptions:
        assert await subscription.next() is None
    with pytest.raises(RuntimeError):
        await feed.subscribe()


@pytest.mark.anyio
async def test_the_backends_source_pins_a_new_pause_to_its_run(
    store_copy: Path, tmp_path: Path
) -> None:
    """The source the backend gives the feed names the run that paused, and nothing else."""
    backend = SQLiteBackend(store_copy)
    source = backend.change_source()
    try:
        source.reset()
        assert source.poll() is None
        new_run = await run_worker(store_copy, "paused-1", tmp_path)
        changes = source.poll()
        assert changes is not None
        assert changes.pauses_added == {new_run} and changes.runs == {new_run}
        assert not changes.everything and not changes.pauses_removed
        assert source.poll() is None
    finally:
        source.close()
        backend.close()


# --- the streams ----------------------------------------------------------------


@pytest.mark.anyio
async def test_the_runs_stream_opens_with_the_table_and_pushes_a_new_run(
    store_copy: Path, tmp_path: Path, page_text: Callable[..., str]
) -> None:
    app = create_app(Settings(store=str(store_copy), poll_interval=INTERVAL, sign_in=NO_SIGN_IN))
    async with running(app), open_stream(app, "/live/runs") as stream:
        assert stream.status == 200
        opening = await stream.first("nav-badge", "runs-table")
        assert page_text(opening["nav-badge"].data, "nav-pending") == str(SEEDED_PAUSES)
        table = opening["runs-table"].data
        assert table.startswith('<section id="runs-table">')
        assert table.count('<tr id="run-') == SEEDED_RUNS
        assert 'id="runs-live" hidden hx-preserve' in table  # keeps the page's connection

        new_run = await run_worker(store_copy, "paused-1", tmp_path)
        pushed = await stream.each(
            {
                "runs-table": lambda e: f'<tr id="run-{new_run}" class="state-paused">' in e.data,
                "nav-badge": lambda e: True,
            }
        )
        table = pushed["runs-table"].data
        assert table.count('<tr id="run-') == SEEDED_RUNS + 1
        row = page_text(table, f"run-{new_run}")
        assert row.startswith("paused ") and "waiting: manager_approval" in row
        assert page_text(pushed["nav-badge"].data, "nav-pending") == str(SEEDED_PAUSES + 1)


@pytest.mark.anyio
async def test_the_runs_stream_follows_the_page_filters(
    store_copy: Path, seeded: Seeded, tmp_path: Path
) -> None:
    app = create_app(Settings(store=str(store_copy), poll_interval=INTERVAL, sign_in=NO_SIGN_IN))
    async with running(app), open_stream(app, "/live/runs?state=failed") as stream:
        table = (await stream.first("runs-table"))["runs-table"].data
        assert table.count('<tr id="run-') == 1 and f'id="run-{seeded.id("failed")}"' in table
        async with http(app) as client:
            assert (await client.get("/live/runs?state=nope")).status_code == 400
        # A new paused run changes the counts the tabs show, not the failed rows.
        await run_worker(store_copy, "paused-1", tmp_path)
        paused = f'Paused <span class="count">{SEEDED_PAUSES + 1}</span>'
        pushed = await stream.until(lambda e: e.event == "runs-table" and paused in e.data)
        assert pushed.data.count('<tr id="run-') == 1


@pytest.mark.anyio
async def test_a_run_page_turns_completed_when_its_pause_is_approved(
    store_copy: Path, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("paused-1")
    with acting_app(store_copy) as app:
        async with (
            running(app),
            http(app) as client,
            open_stream(app, f"/live/runs/{run}", cookie="localui_approver=Ada") as s,
        ):
            opening = await s.first(*RUN_FRAGMENTS)
            state = page_text(opening["run-state"].data, "run-state")
            assert state.startswith("paused · Agent 'refund-bot'")
            assert 'id="pending"' in opening["run-state"].data
            # The card is prefilled with this browser's approver, as the page has it.
            assert 'name="approver" value="Ada"' in opening["run-state"].data
            rows = opening["timeline"].data.count('<details class="row')
            assert "No decisions recorded" in page_text(opening["decisions"].data, "decisions")

            outcome = await approve(client, run)
            assert outcome["status"] == "completed"

            pushed = await s.each(
                {
                    "run-state": lambda e: "completed" in e.data.split("</p>", 1)[0],
                    "timeline": lambda e: "kind-run_end" in e.data,
                    "decisions": lambda e: "the run completed" in e.data,
                }
            )
            done = pushed["run-state"].data
            assert 'id="pending"' not in done
            assert page_text(done, "verdict").startswith("Completed ")
            timeline = pushed["timeline"].data
            assert timeline.count('<details class="row') > rows
            # Rows already on the page are kept as they are (hx-preserve).
            assert timeline.count("hx-preserve") == timeline.count('<details class="row')
            assert "Ada approved it at" in page_text(pushed["decisions"].data, "decisions")


@pytest.mark.anyio
async def test_the_queue_stream_drops_a_card_once_it_is_decided(
    store_copy: Path, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("paused-1")
    with acting_app(store_copy) as app:
        async with (
            running(app),
            http(app) as client,
            open_stream(app, "/live/approvals", cookie="localui_approver=Bo") as s,
        ):
            opening = await s.first("nav-badge", "queue")
            queue = opening["queue"].data
            assert queue.count('<article class="approval"') == SEEDED_PAUSES
            assert queue.count('name="approver" value="Bo"') == SEEDED_PAUSES
            assert f'id="approval-{run}"' in queue
            assert f'<template class="gone-note" data-for="{run}">' not in queue

            await approve(client, run)
            pushed = await s.each(
                {
                    "queue": lambda e: f'id="approval-{run}"' not in e.data,
                    "nav-badge": lambda e: True,
                }
            )
            queue = pushed["queue"].data
            assert queue.count('<article class="approval"') == SEEDED_PAUSES - 1
            assert f"{SEEDED_PAUSES - 1} waiting" in page_text(queue, "approvals-queue")
            # A note says who decided it; the page puts it where the card was.
            assert f'<template class="gone-note" data-for="{run}">' in queue
            assert "approved by Ada: fine" in queue
            assert page_text(pushed["nav-badge"].data, "nav-pending") == str(SEEDED_PAUSES - 1)


@pytest.mark.anyio
async def test_a_client_that_stops_reading_gets_a_resync_then_everything(
    store_copy: Path, tmp_path: Path, page_text: Callable[..., str]
) -> None:
    # The feed polls only when the test says so.
    app = create_app(Settings(store=str(store_copy), poll_interval=3600, sign_in=NO_SIGN_IN))
    async with running(app) as ctx:
        feed = ctx.feed
        feed.queue_size = 1
        async with open_stream(app, "/live/approvals", buffer=0) as stream:
            await stream.first("nav-badge", "queue")
            # From here the test does not read: the stream blocks on its first send.
            new_run = await run_worker(store_copy, "paused-1", tmp_path)
            assert await feed.poll_once() is not None  # the new pause: its card to send
            for _ in range(2):  # more than the stream's queue of one holds
                feed.publish(Changes(everything=True))
            await anyio.sleep(0.1)
            event = await stream.until(lambda e: e.event == "resync")
            assert "missed changes" in event.data
            # Then the whole state again, whether it changed or not.
            again = await stream.first("nav-badge", "queue")
    assert page_text(again["nav-badge"].data, "nav-pending") == str(SEEDED_PAUSES + 1)
    assert f'id="approval-{new_run}"' in again["queue"].data


@pytest.mark.anyio
async def test_a_reconnect_gets_the_current_state_first(store_copy: Path, tmp_path: Path) -> None:
    """A browser that lost its stream missed changes; the new stream opens with them."""
    app = create_app(Settings(store=str(store_copy), poll_interval=INTERVAL, sign_in=NO_SIGN_IN))
    async with running(app):
        async with open_stream(app, "/live/approvals") as stream:
            first = (await stream.first("queue"))["queue"].data
        new_run = await run_worker(store_copy, "paused-1", tmp_path)  # while disconnected
        async with open_stream(app, "/live/approvals") as stream:
            again = await stream.first("nav-badge", "queue")
    assert f'id="approval-{new_run}"' not in first
    assert f'id="approval-{new_run}"' in again["queue"].data
    assert f">{SEEDED_PAUSES + 1}<" in again["nav-badge"].data


@pytest.mark.anyio
async def test_streams_share_renders_and_idle_streams_read_nothing(
    store_copy: Path, seeded: Seeded
) -> None:
    store = CountingStore(store_copy)
    app = create_app(
        Settings(store=str(store_copy), poll_interval=0.01, sign_in=NO_SIGN_IN),
        backend=SQLiteBackend(store_copy, store=store),
    )
    try:
        async with running(app) as ctx:
            feed = ctx.feed
            await anyio.sleep(0.3)
            # No stream open: neither the feed nor anything else asked the store a thing.
            assert (feed.polls, sum(store.calls.values())) == (0, 0)

            async with contextlib.AsyncExitStack() as streams:
                opened = [
                    await streams.enter_async_context(open_stream(app, "/live/runs"))
                    for _ in range(5)
                ]
                for stream in opened:
                    await stream.first("nav-badge", "runs-table")
                renders = ctx.live_renders
                assert renders is not None
                # Five streams on the same views: one render of each (the badge, the table).
                assert (renders.renders, store.calls["list_runs"]) == (2, 1)
                calls = sum(store.calls.values())
                await anyio.sleep(0.3)
                assert feed.polls >= 3
                assert sum(store.calls.values()) == calls  # nothing changed: nothing read

                feed.publish(Changes(runs=frozenset({seeded.id("completed")})))
                with anyio.fail_after(WAIT_S):
                    while renders.renders < 3:
                        await anyio.sleep(0.01)
                await anyio.sleep(0.2)  # every stream has taken the change by now
                # Only the table was touched by that change: the badge is not rendered again.
                assert (renders.renders, store.calls["list_runs"]) == (3, 2)
    finally:
        store.close()


@pytest.mark.anyio
async def test_the_app_stopping_ends_open_streams(store_copy: Path, seeded: Seeded) -> None:
    app = create_app(Settings(store=str(store_copy), poll_interval=INTERVAL, sign_in=NO_SIGN_IN))
    async with running(app) as ctx:
        async with (
            open_stream(app, "/live/nav") as nav,
            open_stream(app, f"/live/runs/{seeded.id('failed')}") as run,
        ):
            await nav.first("nav-badge")
            await run.first(*RUN_FRAGMENTS)
            await ctx.feed.stop()  # what the lifespan does on shutdown
            assert await nav.next(timeout=5) is None
            assert await run.next(timeout=5) is None


@pytest.mark.anyio
async def test_a_stream_for_a_run_that_does_not_exist_is_a_404(store_copy: Path) -> None:
    app = create_app(Settings(store=str(store_copy), poll_interval=INTERVAL, sign_in=NO_SIGN_IN))
    async with running(app), http(app) as client:
        response = await client.get("/live/runs/no-such-run")
    assert response.status_code == 404
    assert "no-such-run" in response.text


def test_every_page_connects_its_own_stream(client: TestClient, seeded: Seeded) -> None:
    """Hidden hooks only: without JavaScript the pages read and work as before."""
    run = seeded.id("paused-2")
    pages = {
        "/": 'sse-connect="/live/runs"',
        "/?state=paused&q=A-1": 'sse-connect="/live/runs?state=paused&amp;q=A-1"',
        f"/runs/{run}": f'sse-connect="/live/runs/{run}"',
        "/approvals?order=newest": 'sse-connect="/live/approvals?order=newest"',
        "/prune": 'sse-connect="/live/nav"',
    }
    for path, hook in pages.items():
        html = client.get(path).text
        assert html.count("sse-connect=") == 1, path
        assert hook in html, path
        assert '<div class="live"' in html and " hidden" in html, path
    # The runs table's own htmx swap (the filter form) brings its stream along.
    fragment = client.get("/?state=failed", headers={"HX-Request": "true"}).text
    assert fragment.startswith('<section id="runs-table">')
    assert (
        'sse-connect="/live/runs?state=failed"' in fragment
        and 'id="runs-live" hidden hx-preserve' not in fragment
    )


# --- a real server --------------------------------------------------------------


def test_a_server_with_open_streams_stops_at_once(store_copy: Path, tmp_path: Path) -> None:
    """uvicorn waits for open responses before it stops; live streams must end first."""
    server = start_localui(
        ["serve", "--store", str(store_copy), "--no-auth"],
        cwd=tmp_path,
        log=tmp_path / "serve.log",
    )
    base = server.url
    try:
        ended: list[str] = []
        opened = threading.Barrier(4)

        def watch(path: str) -> None:
            try:
                with httpx.stream("GET", base + path, timeout=30) as response:
                    lines = response.iter_lines()
                    for line in lines:
                        if line.startswith("data:"):
                            break
                    opened.wait(timeout=30)
                    for _ in lines:
                        pass
                ended.append("cleanly")
            except httpx.HTTPError as exc:
                ended.append(f"{type(exc).__name__}: {exc}")

        watchers = [
            threading.Thread(target=watch, args=(path,), daemon=True)
            for path in ("/live/nav", "/live/runs", "/live/approvals")
        ]
        for watcher in watchers:
            watcher.start()
        opened.wait(timeout=30)
        asked = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(timeout=30)
        took = time.monotonic() - asked
        for watcher in watchers:
            watcher.join(timeout=10)
    finally:
        server.stop()
    output = server.output()
    print(f"\nstopped {took:.2f} s after SIGTERM with 3 streams open")
    # uvicorn re-raises the signal it handled once it has stopped.
    assert code in (0, -signal.SIGTERM), output
    assert "returned without completing response" not in output, output
    # Not cut off by uvicorn's graceful-shutdown timeout: the streams ended themselves.
    assert "timeout graceful shutdown exceeded" not in output, output
    assert ended == ["cleanly"] * 3


def test_a_prune_by_another_process_refreshes_every_view_at_the_next_poll(
    store_copy: Path,
) -> None:
    """The SDK's prune deletes old finished rows, not the newest: the source counts
    the rows when a commit moved the store, and says everything changed."""
    from datetime import timedelta

    from fastaiagent.checkpointers import SQLiteCheckpointer

    source = SQLiteChangeSource(store_copy)
    try:
        source.reset()
        assert source.poll() is None
        checkpointer = SQLiteCheckpointer(str(store_copy))
        try:
            assert checkpointer.prune(timedelta(0)) > 0
        finally:
            checkpointer.close()
        changes = source.poll()
        assert changes is not None and changes.everything
        assert source.poll() is None
    finally:
        source.close()


def test_closing_the_source_waits_for_a_read_in_another_thread(store_copy: Path) -> None:
    """SQLite answers a connection closed under a running read with a segmentation
    fault: ``close`` waits for the read, and the source reads nothing after it."""
    reading, release = threading.Event(), threading.Event()

    def trace(statement: str) -> None:
        if "schema_version" in statement and not reading.is_set():
            reading.set()  # a read is under way in the reader's thread: hold it there
            release.wait(10)

    source = SQLiteChangeSource(store_copy, trace=trace)
    reader = threading.Thread(target=source.reset)
    reader.start()
    assert reading.wait(10)
    closer = threading.Thread(target=source.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # still waiting for the read
    release.set()
    reader.join(10)
    closer.join(10)
    assert not reader.is_alive() and not closer.is_alive()
    assert source.poll() is None
    source.reset()  # closed: a late reset reads nothing and opens nothing


# --- one stream per browser -------------------------------------------------------


def shared(event: Event) -> tuple[str, str, str]:
    """A shared stream's event: the watched URLs it is for, its fragment name, the HTML."""
    assert event.event == "m"
    head, _, html = event.data.partition("\n")
    to, _, name = head.partition(" ")
    return to, name, html


@pytest.mark.anyio
async def test_one_shared_stream_carries_every_watched_page(
    store_copy: Path, seeded: Seeded, tmp_path: Path, page_text: Callable[..., str]
) -> None:
    failed = seeded.id("failed")
    watched = ["/live/runs", f"/live/runs/{failed}", "/live/runs/no-such-run", "/live/approvals"]
    query = "&".join(f"s={quote(url, safe='')}" for url in watched)
    with acting_app(store_copy) as app:
        async with running(app), open_stream(app, f"/live/mux?{query}") as stream:
            assert stream.status == 200
            opening: dict[str, tuple[str, str]] = {}
            with anyio.fail_after(WAIT_S):
                while {"store-status", "runs-table", "queue", *RUN_FRAGMENTS} - opening.keys():
                    event = await stream.next()
                    assert event is not None
                    to, name, html = shared(event)
                    opening[name] = (to, html)
            # The badge once, for every page that shows it; the gone run is left out.
            assert opening["store-status"][0] == "*"
            assert opening["nav-badge"][0] == "0,1,3"
            assert opening["runs-table"][0] == "0"
            assert {opening[name][0] for name in RUN_FRAGMENTS[1:]} == {"1"}
            assert opening["queue"][0] == "3"
            assert f'id="run-{failed}"' in opening["runs-table"][1]

            new_run = await run_worker(store_copy, "paused-1", tmp_path)
            pushed: dict[str, str] = {}
            with anyio.fail_after(WAIT_S):
                while {"runs-table", "nav-badge", "queue"} - pushed.keys():
                    event = await stream.next()
                    assert event is not None
                    to, name, html = shared(event)
                    pushed[name] = html
            assert f'id="run-{new_run}"' in pushed["runs-table"]
            assert page_text(pushed["nav-badge"], "nav-pending") == str(SEEDED_PAUSES + 1)
            assert f'id="approval-{new_run}"' in pushed["queue"]
        async with http(app) as client:
            for bad in ("s=/elsewhere", "s=/live/mux", "", "&".join(["s=/live/nav"] * 65)):
                assert (await client.get(f"/live/mux?{bad}")).status_code == 400


BROWSER = ((b"sec-fetch-mode", b"cors"), (b"user-agent", b"Mozilla/5.0 (test)"))


@pytest.mark.anyio
async def test_a_browser_holds_at_most_four_streams(store_copy: Path) -> None:
    app = create_app(Settings(store=str(store_copy), poll_interval=INTERVAL, sign_in=NO_SIGN_IN))
    async with running(app), contextlib.AsyncExitStack() as streams:
        held = [
            await streams.enter_async_context(open_stream(app, "/live/nav", headers=BROWSER))
            for _ in range(4)
        ]
        for stream in held:
            assert stream.status == 200
            await stream.first("nav-badge")
        async with open_stream(app, "/live/nav", headers=BROWSER) as refused:
            assert refused.status == 429
            assert (b"retry-after", b"5") in refused.start["headers"]
        # Another browser, and a script (no Sec-Fetch-Mode), are not this browser.
        other = ((b"sec-fetch-mode", b"cors"), (b"user-agent", b"Mozilla/5.0 (other)"))
        async with open_stream(app, "/live/nav", headers=other) as stream:
            assert stream.status == 200
        async with open_stream(app, "/live/nav") as stream:
            assert stream.status == 200
    # Closed streams are given back.
    async with running(app), open_stream(app, "/live/nav", headers=BROWSER) as stream:
        assert stream.status == 200
