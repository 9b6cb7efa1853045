"""Crash-safe approvals: the decision record keeps exactly what a decision hands the
tool, on SQLite and on PostgreSQL, so a process that takes over can carry it out.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers import card, decide

from localui.backends.base import DecisionLog
from localui.backends.postgres.decisions import PostgresDecisionLog
from localui.backends.sqlite.decisions import SQLiteDecisionLog
from localui.records import APPROVAL

if TYPE_CHECKING:
    from conftest import ActingClientFactory, Ledger, PgStore
    from starlette.testclient import TestClient


# --- one interface over both stores -------------------------------------------------

#: ``localui_decisions`` before it kept metadata; each backend fills in its own types.
OLD_TABLE = (
    "CREATE TABLE {t} (id {id}, kind TEXT NOT NULL, execution_id TEXT NOT NULL,"
    " checkpoint_id TEXT NOT NULL, approved {approved}, actor TEXT NOT NULL,"
    " reason TEXT NOT NULL DEFAULT '', decided_at {at}, outcome TEXT, detail TEXT,"
    " finished_at {fin}, UNIQUE (kind, execution_id, checkpoint_id))"
)


@dataclass
class Desk:
    """An acting app over a fresh copy of the seeded runs, and how to open its decision
    record directly (``writable=False`` as a read-only server opens it)."""

    client: TestClient
    open_log: Callable[..., DecisionLog]
    #: Runs plain SQL on the decision table's database (``{t}`` is the table).
    sql: Callable[[str], None]
    #: The table as localui made it before it kept metadata.
    old_table: str


@pytest.fixture(params=["sqlite", "postgres"])
def desk(
    request: pytest.FixtureRequest, ledger: Ledger, tmp_path: Path
) -> Iterator[Callable[[], Desk]]:
    logs: list[DecisionLog] = []

    def keep(log: DecisionLog) -> DecisionLog:
        logs.append(log)
        return log

    def make() -> Desk:
        if request.param == "sqlite":
            store_path: Path = request.getfixturevalue("store_copy")
            acting: ActingClientFactory = request.getfixturevalue("make_acting_client")

            def run_sqlite(text: str) -> None:
                with sqlite3.connect(store_path) as conn:
                    conn.executescript(text.replace("{t}", "localui_decisions"))

            return Desk(
                acting(store_path, ledger),
                lambda writable=True: keep(SQLiteDecisionLog(store_path, writable=writable)),
                run_sqlite,
                OLD_TABLE.format(
                    id="INTEGER PRIMARY KEY AUTOINCREMENT",
                    approved="INTEGER",
                    at="TEXT NOT NULL",
                    fin="TEXT",
                    t="{t}",
                ),
            )
        pg: PgStore = request.getfixturevalue("pg_store")
        make_pg = request.getfixturevalue("make_pg_client")

        def run_pg(text: str) -> None:
            pg.app_raw.execute(text.replace("{t}", f"{pg.app_schema}.localui_decisions"))

        return Desk(
            make_pg(pg, ledger),
            lambda writable=True: keep(
                PostgresDecisionLog(pg.dsn, schema=pg.app_schema, writable=writable)
            ),
            run_pg,
            OLD_TABLE.format(
                id="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
                approved="BOOLEAN",
                at="TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()",
                fin="TIMESTAMPTZ",
                t="{t}",
            ),
        )

    yield make
    for log in logs:
        log.close()


def _claim(log: DecisionLog, metadata: dict[str, Any] | None) -> Any:
    return log.claim(
        kind=APPROVAL,
        execution_id="run-old",
        checkpoint_id="cp-new",
        approved=True,
        actor="Bea",
        reason="",
        still_pending=lambda: True,
        metadata=metadata,
    )


# --- the metadata a decision hands the tool, recorded --------------------------------


def test_a_decision_records_the_resume_metadata_it_handed_the_tool(
    desk: Callable[[], Desk],
) -> None:
    made = desk()
    run = next(
        item["execution_id"]
        for item in made.client.get("/approvals.json").json()["approvals"]
        if item["node_id"].endswith("tool:refund")
    )
    response = decide(made.client, run, card(made.client, run)["checkpoint_id"], reason="ok")
    assert response.status_code == 200, response.text
    [decision] = made.open_log().list_for_run(run)
    assert decision.metadata == {"approver": "Ann Approver", "reason": "ok"}


def test_an_old_table_reads_read_only_and_is_migrated_when_written(
    desk: Callable[[], Desk],
) -> None:
    made = desk()
    # The table as localui made it before it kept metadata, with one decision in it.
    made.sql("DROP TABLE IF EXISTS {t}")
    made.sql(made.old_table)
    made.sql(
        "INSERT INTO {t} (kind, execution_id, checkpoint_id, approved, actor, decided_at,"
        " outcome) VALUES ('approval', 'run-old', 'cp-1', TRUE, 'Ann',"
        " '2026-01-01T00:00:00+00:00', 'completed')"
    )

    [old] = made.open_log(writable=False).list_for_run("run-old")
    assert (old.actor, old.outcome, old.metadata) == ("Ann", "completed", None)

    writer = made.open_log()
    claim = _claim(writer, {"approver": "Bea", "reason": "", "limit": 3})
    assert claim.won
    assert [(d.actor, d.metadata) for d in writer.list_for_run("run-old")] == [
        ("Ann", None),
        ("Bea", {"approver": "Bea", "limit": 3, "reason": ""}),
    ]
