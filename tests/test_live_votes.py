"""Votes reach open pages live, on SQLite and on PostgreSQL.

Under a rule that needs two people, a first approval is a vote: the pause stays, and
what its card says of the rule changes ("ada approved 3 s ago; one more person
needed"). The change feed's source sees a vote cast or withdrawn by any process, and
the live streams of the queue, the run's page and the card's own page push what the
card says of its rule again, with it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers import NO_SIGN_IN
from starlette.applications import Starlette
from test_live import INTERVAL, http, open_stream, running

from localui.app import create_app
from localui.backends.base import ChangeSource
from localui.policy import parse_policy
from localui.settings import Settings

if TYPE_CHECKING:
    from conftest import PgSeeded, PgStore, Seeded

TWO_PEOPLE = """
[[rule]]
name = "large refunds"
agent = "refund-*"
approvers = ["group:finance", "user:ada"]
approvals = 2
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Served:
    """A fresh copy of the seeded runs: its change source, how to open the app over it
    with the refund-bot registered, and Python that opens its decision log."""

    source: Callable[[], ChangeSource]
    app: Callable[..., contextlib.AbstractContextManager[Starlette]]
    open_log: str
    paused: str
    checkpoint_id: str


@pytest.fixture(params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    from localui.demo.agent import build_agent

    if request.param == "sqlite":
        from fastaiagent.checkpointers import SQLiteCheckpointer

        from localui.backends.sqlite.changes import SQLiteChangeSource
        from localui.backends.sqlite.decisions import SQLiteDecisionLog

        path: Path = request.getfixturevalue("store_copy")
        seeded: Seeded = request.getfixturevalue("seeded")
        SQLiteDecisionLog(path, writable=True).close()  # the tables, as a first start makes them

        @contextlib.contextmanager
        def sqlite_app(**settings: Any) -> Iterator[Starlette]:
            checkpointer = SQLiteCheckpointer(str(path))
            try:
                yield create_app(
                    Settings(
                        store=str(path), poll_interval=INTERVAL, sign_in=NO_SIGN_IN, **settings
                    ),
                    agents=[build_agent(checkpointer)],
                )
            finally:
                checkpointer.close()

        from localui.backends.sqlite.store import SQLiteStore

        run = seeded.id("paused-1")
        read = SQLiteStore(path)
        pending = read.get_pending(run)
        read.close()
        assert pending is not None and pending.checkpoint_id
        yield Served(
            source=lambda: SQLiteChangeSource(path),
            app=sqlite_app,
            open_log=(
                "from localui.backends.sqlite.decisions import SQLiteDecisionLog as Log;"
                f" log = Log({str(path)!r}, writable=True)"
            ),
            paused=run,
            checkpoint_id=pending.checkpoint_id,
        )
        return
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    from localui.backends.postgres.changes import PostgresChangeSource
    from localui.backends.postgres.decisions import PostgresDecisionLog

    store: PgStore = request.getfixturevalue("pg_store")
    pg_seeded: PgSeeded = request.getfixturevalue("pg_seeded")
    PostgresDecisionLog(store.dsn, schema=store.app_schema).close()

    @contextlib.contextmanager
    def pg_app(**settings: Any) -> Iterator[Starlette]:
        checkpointer = PostgresCheckpointer(store.dsn, schema=store.schema)
        try:
            yield create_app(
                store.settings(poll_interval=INTERVAL, **settings),
                agents=[build_agent(checkpointer)],
            )
        finally:
            checkpointer.close()

    from localui.backends.postgres.store import PostgresStore

    run = pg_seeded.id("paused-1")
    pg_read = PostgresStore(store.dsn, schema=store.schema, app_schema=store.app_schema)
    pg_pending = pg_read.get_pending(run)
    pg_read.close()
    assert pg_pending is not None and pg_pending.checkpoint_id
    yield Served(
        source=lambda: PostgresChangeSource(
            store.dsn, schema=store.schema, app_schema=store.app_schema
        ),
        app=pg_app,
        open_log=(
            "from localui.backends.postgres.decisions import PostgresDecisionLog as Log;"
            f" log = Log({store.dsn!r}, schema={store.app_schema!r})"
        ),
        paused=run,
        checkpoint_id=pg_pending.checkpoint_id,
    )


def in_another_process(served: Served, code: str) -> str:
    """Run ``code`` with ``log`` open on the served store's decision log, in a process
    of its own; what it prints."""
    done = subprocess.run(
        [sys.executable, "-c", f"{served.open_log}\n{code}\nlog.close()"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def cast(served: Served, actor: str) -> int:
    """A vote by ``actor`` on the paused run, cast by another process; its id."""
    where = f"execution_id={served.paused!r}, checkpoint_id={served.checkpoint_id!r}"
    printed = in_another_process(
        served,
        f"ballot = log.cast_vote({where}, actor={actor!r}, reason='', fields_json='{{}}',"
        " needed=2)\nprint(ballot.votes[-1].id)",
    )
    return int(printed)


def test_a_vote_cast_or_withdrawn_by_another_process_moves_the_feed(served: Served) -> None:
    source = served.source()
    try:
        source.reset()
        assert source.poll() is None
        vote = cast(served, "ada")
        changes = source.poll()
        assert changes is not None
        assert changes.voted == {served.paused}
        assert changes.touches(served.paused)
        assert not (changes.everything or changes.runs or changes.decided)
        assert not (changes.pauses_added or changes.pauses_removed)
        assert source.poll() is None

        # A vote withdrawn (another decision came first) cannot be pinned to its run
        # by the cursors: every view refreshes.
        in_another_process(served, f"log.withdraw_vote({vote})")
        changes = source.poll()
        assert changes is not None and changes.everything
        assert source.poll() is None
    finally:
        source.close()


@pytest.mark.anyio
async def test_the_queue_the_run_and_the_card_streams_push_a_new_vote(
    served: Served, page_text: Callable[..., str]
) -> None:
    run, rule_id = served.paused, f'id="approval-{served.paused}-rule"'
    policy = parse_policy(TWO_PEOPLE, "policy.toml")
    with served.app(policy=policy) as app:
        async with (
            running(app),
            http(app) as client,
            _streams(app, "/live/approvals", f"/live/runs/{run}", f"/live/approvals/{run}") as (
                queue,
                run_page,
                card_page,
            ),
        ):
            opening = (await queue.first("queue"))["queue"].data
            assert rule_id in opening
            assert "none yet; 2 people needed" in page_text(opening, f"approval-{run}-rule")
            await run_page.first("run-state", "decisions")
            card_opening = await card_page.first("approval-rule", "decisions")
            assert "none yet" in page_text(
                card_opening["approval-rule"].data, f"approval-{run}-rule"
            )
            # The card's own page listens to its stream.
            html = (await client.get(f"/approvals/{run}")).text
            assert f'sse-connect="/live/approvals/{run}"' in html
            assert f'hx-target="#approval-{run}-rule"' in html and rule_id in html

            response = await client.post(
                f"/approvals/{run}/approve",
                data={"approver": "ada", "reason": "", "checkpoint_id": served.checkpoint_id},
                headers={"accept": "application/json"},
            )
            assert response.status_code == 200, response.text
            assert response.json()["status"] == "voted"

            def says_ada(e: Any) -> bool:
                return "ada approved" in e.data

            pushed = (await queue.each({"queue": says_ada}))["queue"].data
            words = page_text(pushed, f"approval-{run}-rule")
            assert "ada approved" in words and "one more person needed" in words, words
            # Still waiting: the card stays in the queue.
            assert f'id="approval-{run}"' in pushed

            on_run = await run_page.each(
                {"run-state": says_ada, "decisions": lambda e: "ada approved it at" in e.data}
            )
            assert "one more person needed" in page_text(
                on_run["run-state"].data, f"approval-{run}-rule"
            )
            on_card = await card_page.each(
                {"approval-rule": says_ada, "decisions": lambda e: "ada approved it at" in e.data}
            )
            assert "one more person needed" in page_text(
                on_card["approval-rule"].data, f"approval-{run}-rule"
            )

            # The second approval resumes the run: the card's page says it no longer waits.
            response = await client.post(
                f"/approvals/{run}/approve",
                data={"approver": "bob", "reason": "", "checkpoint_id": served.checkpoint_id},
                headers={"accept": "application/json"},
            )
            assert response.status_code == 200, response.text
            assert response.json()["status"] == "completed"
            decided = await card_page.each(
                {
                    "approval-rule": lambda e: "No longer waiting" in e.data,
                    "decisions": lambda e: "bob approved it at" in e.data,
                }
            )
            assert rule_id in decided["approval-rule"].data


@contextlib.asynccontextmanager
async def _streams(app: Starlette, *paths: str) -> AsyncIterator[tuple[Any, ...]]:
    async with contextlib.AsyncExitStack() as stack:
        yield tuple(
            [
                await stack.enter_async_context(open_stream(app, p, cookie="localui_approver=Bo"))
                for p in paths
            ]
        )
