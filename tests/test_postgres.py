"""What only PostgreSQL has: timestamps, cursors and JSONB read back in SQLite's shape,
keyset ties, older schemas, the decision record shared through the database, the
change source, roles and privileges, and one-line start-up errors.

What both stores must answer alike is in ``test_backends.py``, run on each. The runs
are the demo scenarios, written by the real SDK into PostgreSQL (crashes included)
once per session; each test works on its own copy in schemas of its own. Answers are
checked against plain SQL on the same schema, and against what the SQLite store
answers for the same scenarios.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers import LOOPBACK_CLIENT, card, decide

from localui import runs
from localui.backends import open_backend
from localui.backends.base import StoreTarget
from localui.backends.decisions import ABANDONED_AFTER_SECONDS, VOTES_TABLE
from localui.backends.postgres.decisions import PostgresDecisionLog
from localui.backends.postgres.store import PostgresStore
from localui.backends.urls import redact
from localui.demo.scenarios import SCENARIO_NAMES
from localui.errors import BadRequest, StoreMissing
from localui.records import APPROVAL, RunFacts, RunQuery
from localui.registry import RegistryError, bind

if TYPE_CHECKING:
    from conftest import PgSeeded, PgStore, Seeded
    from starlette.testclient import TestClient

    from localui.backends.sqlite.store import SQLiteStore

pytestmark = pytest.mark.postgres

JSON = {"Accept": "application/json"}
COUNTS = {"completed": 3, "paused": 4, "failed": 1, "unfinished": 2}
#: What ``datetime.now(timezone.utc).isoformat()`` writes into the SQLite store.
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00$")


def state_of(facts: RunFacts) -> str:
    return runs.run_state(facts.last_step_type, facts.last_status, facts.has_pending)


def all_runs(store: PostgresStore, **query: Any) -> list[RunFacts]:
    page = store.list_runs(replace(RunQuery(limit=1000), **query))
    assert page.next_key is None
    return list(page.runs)


def iso(value: Any) -> str:
    return str(value.isoformat())


def states() -> dict[str, str]:
    """Each scenario's state (DESIGN.md's table), as conftest's ``Seeded`` holds it."""
    from conftest import Seeded

    return dict(Seeded.STATES)


@pytest.fixture
def pg(pg_store: PgStore) -> Iterator[PostgresStore]:
    opened = PostgresStore(pg_store.dsn, schema=pg_store.schema)
    yield opened
    opened.close()


# --- the read model ---------------------------------------------------------


def test_runs_with_one_newest_instant_page_by_id(pg: PostgresStore, pg_store: PgStore) -> None:
    """Keyset ties: three runs whose newest rows share one microsecond."""
    ids = [f.execution_id for f in all_runs(pg)][:3]
    pg_store.raw.execute(
        "UPDATE {s}.checkpoints c SET created_at = '2030-01-01T00:00:00.000001+00:00'"
        " WHERE c.checkpoint_id IN (SELECT DISTINCT ON (execution_id) checkpoint_id"
        " FROM {s}.checkpoints WHERE execution_id = ANY(%s)"
        " ORDER BY execution_id, created_at DESC)",
        (ids,),
    )
    walked: list[str] = []
    after = None
    while True:
        page = pg.list_runs(RunQuery(limit=1, after=after))
        walked.extend(f.execution_id for f in page.runs)
        if page.next_key is None:
            break
        after = page.next_key
    assert walked[:3] == sorted(ids, reverse=True)
    assert len(walked) == len(set(walked)) == len(SCENARIO_NAMES)


def test_a_forged_cursor_is_a_bad_request(pg: PostgresStore) -> None:
    with pytest.raises(BadRequest, match="not a cursor"):
        pg.list_runs(RunQuery(after=("not a time", "x")))
    with pytest.raises(BadRequest, match="not a cursor"):
        pg.list_pending(after=("2024-01-01", "x"))  # no time zone: not one we gave out


def test_get_run_facts_match_the_table(
    pg: PostgresStore, pg_store: PgStore, pg_seeded: PgSeeded
) -> None:
    run = pg_seeded.id("completed")
    history = pg_store.raw.rows(run)
    assert pg.get_run(run) == RunFacts(
        execution_id=run,
        agent="refund-bot",
        row_count=4,
        first_at=iso(history[0]["created_at"]),
        last_at=iso(history[-1]["created_at"]),
        last_checkpoint_id=history[-1]["checkpoint_id"],
        last_node_id="run_end",
        last_step_type="run_end",
        last_status="completed",
        has_pending=False,
        pending_reason=None,
        fork_parent_checkpoint_id=None,
        rows_waiting=4,
        rows_quarantined=0,
    )
    for facts in all_runs(pg):
        assert pg.get_run(facts.execution_id) == facts
        assert ISO_UTC.match(facts.first_at) and ISO_UTC.match(facts.last_at)
    assert pg.get_run("no-such-run") is None
    assert pg.list_rows("no-such-run") == ()


def test_rows_are_those_sqlite_holds_for_the_same_scenarios(
    pg: PostgresStore,
    pg_store: PgStore,
    pg_seeded: PgSeeded,
    store: SQLiteStore,
    seeded: Seeded,
) -> None:
    def shape(rows: Any) -> list[tuple[Any, ...]]:
        return [
            (h.node_id, h.node_index, h.step_type, h.status, h.agent_path, h.synced) for h in rows
        ]

    for name in SCENARIO_NAMES:
        run = pg_seeded.id(name)
        headers = pg.list_rows(run)
        assert [h.checkpoint_id for h in headers] == [
            r["checkpoint_id"] for r in pg_store.raw.rows(run)
        ], name
        assert shape(headers) == shape(store.list_rows(seeded.id(name))), name
        assert all(ISO_UTC.match(h.created_at) for h in headers)
        facts, sqlite_facts = pg.get_run(run), store.get_run(seeded.id(name))
        assert facts is not None and sqlite_facts is not None
        assert state_of(facts) == state_of(sqlite_facts)
        assert (facts.row_count, facts.last_node_id, facts.pending_reason) == (
            sqlite_facts.row_count,
            sqlite_facts.last_node_id,
            sqlite_facts.pending_reason,
        )


def test_row_detail_raw_is_the_text_the_server_returns(
    pg: PostgresStore, pg_store: PgStore, pg_seeded: PgSeeded
) -> None:
    last = pg.list_rows(pg_seeded.id("crashed-in-tool"))[-1]
    detail = pg.get_row(last.checkpoint_id)
    assert detail is not None
    (stored,) = pg_store.raw.query(
        "SELECT node_input::text AS t FROM {s}.checkpoints WHERE checkpoint_id = %s",
        (last.checkpoint_id,),
    )
    assert detail.raw["node_input"] == stored["t"]


def test_cache_reads_bare_values_and_pages_by_age(
    pg: PostgresStore, pg_store: PgStore, pg_seeded: PgSeeded
) -> None:
    (entry,) = pg.list_cache(pg_seeded.id("idempotent-resumed"))
    assert ISO_UTC.match(entry.created_at)
    failed = pg_seeded.id("failed")
    for key, value, at in (
        ("k-bare-str", '"cb-bare"', "2024-01-01T00:00:01+00:00"),
        ("k-bare-dict", '{"refund": 1}', "2024-01-01T00:00:02+00:00"),
    ):
        pg_store.raw.execute(
            "INSERT INTO {s}.idempotency_cache VALUES (%s, %s, %s::jsonb, %s)",
            (failed, key, value, at),
        )
    assert [
        (e.function_key, e.value, e.enveloped, e.created_at) for e in pg.list_cache(failed)
    ] == [
        ("k-bare-str", "cb-bare", False, "2024-01-01T00:00:01+00:00"),
        ("k-bare-dict", {"refund": 1}, False, "2024-01-01T00:00:02+00:00"),
    ]
    # The store-wide cache by age, two at a time: every entry once, oldest first.
    cutoff = "2100-01-01T00:00:00+00:00"
    walked = []
    after = None
    while True:
        page = pg.list_cache_before(cutoff, after=after, limit=2)
        assert page.total == 9
        walked.extend(page.entries)
        if page.next_key is None:
            break
        after = page.next_key
    assert len(walked) == 9
    assert [e.function_key for e in walked[:2]] == ["k-bare-str", "k-bare-dict"]
    assert [e.created_at for e in walked] == sorted(e.created_at for e in walked)
    assert pg.list_cache_before("2024-01-01T00:00:02+00:00").total == 1


def test_prune_preview_is_what_the_sdk_prunes(pg: PostgresStore, pg_store: PgStore) -> None:
    from datetime import UTC, datetime, timedelta

    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    # An hour ahead: every row the seed wrote is older than that.
    preview = pg.prune_preview((datetime.now(UTC) + timedelta(hours=1)).isoformat())
    sdk = PostgresCheckpointer(pg_store.dsn, schema=pg_store.schema)
    try:
        deleted = sdk.prune(timedelta(hours=-1))
    finally:
        sdk.close()
    assert deleted == preview.would_delete == 33
    assert pg.totals().rows == 5 and pg.count_pending() == 4


def test_a_store_without_the_newer_columns_degrades(pg_store: PgStore, pg_seeded: PgSeeded) -> None:
    """An older SDK's tables: no step_type, synced or sync_error (added by later versions)."""
    for column in ("step_type", "synced", "sync_error"):
        pg_store.raw.execute(f"ALTER TABLE {{s}}.checkpoints DROP COLUMN {column}")
    old = PostgresStore(pg_store.dsn, schema=pg_store.schema)
    try:
        states = {f.execution_id: state_of(f) for f in all_runs(old)}
        # Without run-end markers nothing reads as ended: the SDK itself cannot tell.
        assert set(states.values()) <= {"unfinished", "paused", "orphaned"}
        assert states[pg_seeded.id("paused-1")] == "paused"
        rows = old.list_rows(pg_seeded.id("completed"))
        assert {(h.step_type, h.synced, h.sync_error) for h in rows} == {(None, None, None)}
        assert old.totals().rows_waiting == 0
        assert all_runs(old, outbox="waiting") == []
    finally:
        old.close()


def test_reads_are_read_only_in_utc_under_a_timeout(pg: PostgresStore, pg_store: PgStore) -> None:
    import psycopg

    with pg._read() as cur:
        cur.execute("SHOW transaction_read_only")
        assert cur.fetchone()["transaction_read_only"] == "on"
        cur.execute("SHOW TimeZone")
        assert cur.fetchone()["TimeZone"] == "UTC"
        cur.execute("SHOW statement_timeout")
        assert cur.fetchone()["statement_timeout"] == "5s"
    for read in (pg._read, pg._read_one):  # several statements, and one alone
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction), read() as cur:
            cur.execute(f"DELETE FROM {pg_store.schema}.pending_interrupts")
    with pg._read_one() as cur:
        cur.execute("SHOW transaction_read_only")
        assert cur.fetchone()["transaction_read_only"] == "on"
    assert pg.count_pending() == 4


def test_opening_a_missing_schema_or_server_says_so_in_one_line(
    pg_store: PgStore, pg_dsn: str
) -> None:
    with pytest.raises(StoreMissing, match="no schema 'nosuch_schema'.*--pg-schema"):
        PostgresStore(pg_dsn, schema="nosuch_schema")
    with pytest.raises(StoreMissing, match="not a plain PostgreSQL name"):
        PostgresStore(pg_dsn, schema="x; DROP TABLE y")
    with pytest.raises(StoreMissing) as caught:
        PostgresStore("postgresql://someone:s3cret@127.0.0.1:1/db", schema=pg_store.schema)
    message = str(caught.value)
    assert message.startswith("PostgreSQL at 127.0.0.1:1 is not answering: ")
    assert "\n" not in message and "s3cret" not in message


def test_location_and_labels_never_show_the_password(pg_store: PgStore) -> None:
    url = "postgresql://app:s3cret@db.example:6543/fleet?sslmode=require&password=other"
    assert redact(url) == "postgresql://app:***@db.example:6543/fleet?sslmode=require&password=***"
    with_password = pg_store.dsn.replace("postgres@", "postgres:s3cret@")
    assert with_password != pg_store.dsn
    backend = open_backend(replace(pg_store.settings(), store=with_password))
    try:
        for shown in (backend.label, backend.store.location, backend.target.describe()):
            assert "s3cret" not in shown and "***" in shown
    finally:
        backend.close()


# --- pages and JSON -----------------------------------------------------------


UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON document (lists merged, maps keyed by run or row id
    merged too), to compare two shapes."""
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            name = "*" if UUID.match(key) else key
            paths.add(f"{prefix}.{name}")
            paths |= key_paths(inner, f"{prefix}.{name}")
    elif isinstance(value, list):
        for inner in value:
            paths |= key_paths(inner, f"{prefix}[]")
    return paths


def untraced(paths: set[str]) -> set[str]:
    """Key paths of a run page as a store without spans gives them (no decision taken
    outside localui is known without the resume's span)."""
    traced = (".trace.attempts[]", ".rows[].calls[]", ".decisions[]")
    return {p for p in paths if not p.startswith(traced)}


@pytest.fixture
def pg_client(make_pg_client: Callable[..., TestClient], pg_store: PgStore) -> TestClient:
    return make_pg_client(pg_store)


def test_pages_answer_with_the_keys_sqlite_gives(
    pg_client: TestClient, client: TestClient, pg_seeded: PgSeeded, seeded: Seeded
) -> None:
    for url in ("/runs.json", "/approvals.json", "/prune.json?older_than=0s", "/cache.json"):
        pg_body, sqlite_body = pg_client.get(url).json(), client.get(url).json()
        assert key_paths(pg_body) == key_paths(sqlite_body), url
    assert pg_client.get("/runs.json").json()["counts"] == client.get("/runs.json").json()["counts"]
    for name in SCENARIO_NAMES:
        pg_run = pg_client.get(f"/runs/{pg_seeded.id(name)}.json").json()
        sqlite_run = client.get(f"/runs/{seeded.id(name)}.json").json()
        # The PostgreSQL store is served without --traces, so it has no spans to show.
        assert key_paths(pg_run) == untraced(key_paths(sqlite_run)), name
        assert (pg_run["state"], pg_run["resume"] and pg_run["resume"]["shape"]) == (
            sqlite_run["state"],
            sqlite_run["resume"] and sqlite_run["resume"]["shape"],
        ), name
        assert [(r["node_id"], r["status"]) for r in pg_run["rows"]] == [
            (r["node_id"], r["status"]) for r in sqlite_run["rows"]
        ]
        pg_row = pg_run["rows"][-1]["checkpoint_id"]
        sqlite_row = sqlite_run["rows"][-1]["checkpoint_id"]
        assert key_paths(
            pg_client.get(f"/runs/{pg_seeded.id(name)}/rows/{pg_row}.json").json()
        ) == key_paths(client.get(f"/runs/{seeded.id(name)}/rows/{sqlite_row}.json").json())


def test_every_page_renders(
    pg_client: TestClient, pg_seeded: PgSeeded, page_text: Callable[..., str]
) -> None:
    html = pg_client.get("/").text
    for name, state in states().items():
        assert page_text(html, f"run-{pg_seeded.id(name)}").startswith(state), name
    assert "31 rows in the store" in page_text(html, "runs-table")
    for name in SCENARIO_NAMES:
        run = pg_seeded.id(name)
        assert pg_client.get(f"/runs/{run}").status_code == 200, name
    paused = pg_seeded.id("paused-1")
    assert pg_client.get(f"/approvals/{paused}").status_code == 200
    assert f'id="approval-{paused}"' in pg_client.get("/approvals").text
    # The queue's cards are light: a frozen context loads when its card is opened.
    holder = next(
        a["execution_id"]
        for a in pg_client.get("/approvals.json").json()["approvals"]
        if "Grace Hopper" in json.dumps(a["context"])
    )
    assert "Grace Hopper" in pg_client.get(f"/approvals/{holder}/context").text
    assert pg_client.get("/prune").status_code == 200
    pages = pg_client.get("/runs.json", params={"state": "paused"}).json()
    assert {r["execution_id"] for r in pages["runs"]} == pg_seeded.ids("paused")
    forged = pg_client.get("/runs.json", params={"after": "WyJub3QgYSB0aW1lIiwieCJd"})
    assert forged.status_code == 400


def test_the_page_header_shows_the_store_without_its_password(pg_store: PgStore) -> None:
    from starlette.testclient import TestClient as Client

    from localui.app import create_app

    with_password = pg_store.dsn.replace("postgres@", "postgres:s3cret@")
    app = create_app(replace(pg_store.settings(), store=with_password))
    with Client(app, base_url="http://127.0.0.1:8765", client=LOOPBACK_CLIENT) as client:
        html = client.get("/").text
    assert "s3cret" not in html
    assert f"(schema {pg_store.schema})" in html


# --- acting through the SDK's PostgresCheckpointer ----------------------------


def decision_rows(store: PgStore, execution_id: str) -> list[dict[str, Any]]:
    return store.app_raw.query(
        "SELECT * FROM {s}.localui_decisions WHERE execution_id = %s ORDER BY id",
        (execution_id,),
    )


def test_an_approval_leaves_the_sdks_schema_without_a_table_of_the_apps(
    make_pg_client: Callable[..., TestClient], pg_store: PgStore, pg_seeded: PgSeeded
) -> None:
    client = make_pg_client(pg_store)
    run = pg_seeded.id("paused-1")
    assert decide(client, run, card(client, run)["checkpoint_id"]).status_code == 200
    assert [r["actor"] for r in decision_rows(pg_store, run)] == ["Ann Approver"]
    tables = {
        r["table_name"]
        for r in pg_store.raw.query(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (pg_store.schema,),
        )
    }
    assert tables == {"checkpoints", "pending_interrupts", "idempotency_cache", "schema_version"}


def test_two_apps_share_one_decision_record(
    make_pg_client: Callable[..., TestClient], pg_store: PgStore, pg_seeded: PgSeeded
) -> None:
    one = make_pg_client(pg_store)
    other = make_pg_client(pg_store)
    run = pg_seeded.id("two-tools-first-pauses")
    shown = card(other, run)

    assert decide(one, run, shown["checkpoint_id"], approver="Ann").status_code == 200

    seen = other.get(f"/approvals/{run}.json").json()
    assert seen["pending"] is None
    [decision] = seen["decisions"]
    assert decision["approver"] == "Ann"
    second = decide(other, run, shown["checkpoint_id"], approver="Bob")
    assert second.status_code == 409
    assert second.json()["error"]["message"] == (
        f"This pause was already approved by Ann at {decision['decided_at']}."
    )
    assert [r["actor"] for r in decision_rows(pg_store, run)] == ["Ann"]
    assert other.get(f"/runs/{run}.json").json()["decisions"][0]["approver"] == "Ann"


def test_a_read_only_app_reads_decisions_and_creates_nothing(
    make_pg_client: Callable[..., TestClient], pg_store: PgStore, pg_seeded: PgSeeded
) -> None:
    reader = make_pg_client(pg_store, agents=[], read_only=True)
    run = pg_seeded.id("paused-1")
    assert reader.get(f"/runs/{run}.json").json()["decisions"] == []
    assert (
        pg_store.app_raw.query(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg_store.app_schema,)
        )
        == []
    )
    refused = decide(reader, run, card(reader, run)["checkpoint_id"])
    assert refused.status_code == 403
    writer = make_pg_client(pg_store)
    assert decide(writer, run, card(writer, run)["checkpoint_id"]).status_code == 200
    assert [d["approver"] for d in reader.get(f"/runs/{run}.json").json()["decisions"]] == [
        "Ann Approver"
    ]


# --- the decision record itself -----------------------------------------------


@pytest.fixture
def decisions(pg_store: PgStore) -> Iterator[PostgresDecisionLog]:
    log = PostgresDecisionLog(pg_store.dsn, schema=pg_store.app_schema)
    yield log
    log.close()


def _claim(log: PostgresDecisionLog, actor: str, pending: bool = True) -> Any:
    return log.claim(
        kind=APPROVAL,
        execution_id="run-1",
        checkpoint_id="cp-1",
        approved=True,
        actor=actor,
        reason="",
        still_pending=lambda: pending,
    )


def test_claims_one_wins_then_finish_and_release(decisions: PostgresDecisionLog) -> None:
    won = _claim(decisions, "ann")
    lost = _claim(decisions, "bob")
    assert (won.won, lost.won, lost.decision.id, lost.decision.actor) == (
        True,
        False,
        won.decision.id,
        "ann",
    )
    assert ISO_UTC.match(won.decision.decided_at)
    finished = decisions.finish(won.decision.id, "completed", "done")
    assert (finished.outcome, finished.detail) == ("completed", "done")
    assert ISO_UTC.match(finished.finished_at or "")
    assert decisions.list_for_run("run-1") == (finished,)
    decisions.release(won.decision.id)
    assert decisions.list_for_run("run-1") == ()
    assert _claim(decisions, "cy").won


def test_an_abandoned_claim_is_taken_over_only_while_the_pause_waits(
    decisions: PostgresDecisionLog, pg_store: PgStore
) -> None:
    first = _claim(decisions, "ann")
    pg_store.app_raw.execute(
        "UPDATE {s}.localui_decisions SET decided_at = now() - make_interval(secs => %s)",
        (ABANDONED_AFTER_SECONDS + 5,),
    )
    assert not _claim(decisions, "bob", pending=False).won
    taken = _claim(decisions, "bob", pending=True)
    assert taken.won and taken.decision.actor == "bob" and taken.decision.id != first.decision.id
    assert [d.actor for d in decisions.list_for_run("run-1")] == ["bob"]


def test_concurrent_claims_from_many_connections(pg_store: PgStore) -> None:
    logs = [PostgresDecisionLog(pg_store.dsn, schema=pg_store.app_schema) for _ in range(4)]
    try:
        barrier = threading.Barrier(16)

        def one(i: int) -> bool:
            barrier.wait(timeout=30)
            return bool(_claim(logs[i % 4], f"actor-{i}").won)

        with ThreadPoolExecutor(max_workers=16) as pool:
            results = list(pool.map(one, range(16)))
    finally:
        for log in logs:
            log.close()
    assert results.count(True) == 1


# --- binding agents and the command line ---------------------------------------


def test_bind_refuses_an_agent_on_another_schema_or_database(pg_store: PgStore) -> None:
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    from localui.demo.agent import build_agent

    target = StoreTarget(pg_dsn=pg_store.dsn, pg_schema=pg_store.schema)
    same = build_agent(
        PostgresCheckpointer(pg_store.dsn.replace("127.0.0.1", "localhost"), schema=pg_store.schema)
    )
    bind(same, target)
    with pytest.raises(RegistryError, match="pass --pg-schema other_schema"):
        bind(build_agent(PostgresCheckpointer(pg_store.dsn, schema="other_schema")), target)
    elsewhere = pg_store.dsn.rsplit("/", 1)[0] + "/another_db"
    with pytest.raises(RegistryError, match="another_db"):
        bind(build_agent(PostgresCheckpointer(elsewhere, schema=pg_store.schema)), target)
    bare = build_agent(None)
    bind(bare, target)
    assert (bare._checkpointer.schema, bare._checkpointer.connection_string) == (
        pg_store.schema,
        pg_store.dsn,
    )


def _serve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localui", "serve", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_serve_says_in_one_line_when_postgres_cannot_be_reached(tmp_path: Path) -> None:
    done = _serve("--store", "postgresql://app:s3cret@127.0.0.1:1/fleet", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("localui: PostgreSQL at 127.0.0.1:1 is not answering: ")
    assert "s3cret" not in done.stderr and done.stdout == ""


def test_serve_says_in_one_line_when_the_schema_is_missing(
    tmp_path: Path, pg_store: PgStore
) -> None:
    done = _serve("--store", pg_store.dsn, "--pg-schema", "fastaiagent_nope", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"localui: no schema 'fastaiagent_nope' in {pg_store.dsn}: check --pg-schema "
        "(the SDK's default is fastaiagent)"
    ]


# --- the change feed's source ----------------------------------------------------


@pytest.fixture
def source(pg_store: PgStore) -> Iterator[tuple[Any, list[str]]]:
    from localui.backends.postgres.changes import PostgresChangeSource

    statements: list[str] = []
    made = PostgresChangeSource(
        pg_store.dsn,
        schema=pg_store.schema,
        app_schema=pg_store.app_schema,
        trace=statements.append,
    )
    made.reset()
    yield made, statements
    made.close()


def run_worker(pg_store: PgStore, scenario: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "localui.demo.worker", "--store", pg_store.dsn]
        + ["--pg-schema", pg_store.schema, "--scenario", scenario],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_the_app_feeds_its_live_pages_from_the_postgres_source(
    make_pg_client: Callable[..., TestClient], pg_store: PgStore
) -> None:
    from localui.backends.postgres.changes import PostgresChangeSource

    client = make_pg_client(pg_store)
    feed = client.app.state.localui.feed
    assert isinstance(feed.source, PostgresChangeSource)
    assert (feed.source.schema, feed.source.app_schema) == (pg_store.schema, pg_store.app_schema)


def test_an_idle_poll_is_one_statement_reading_no_table(source: tuple[Any, list[str]]) -> None:
    """Polls between which nothing commits are each the gate's one statement. The gate
    is the server's snapshot, which any commit anywhere on it moves: the tests of other
    workers commit on the same server, so a poll after one of theirs reads the cursor
    again (and finds nothing of ours). Among a few polls in a row, some fall between
    their commits; a poll that always read the tables would never be one statement."""
    feed_source, statements = source
    gate = "SELECT pg_current_snapshot()::text, pg_stat_get_tuples_deleted("
    idle_polls = 0
    for _ in range(50):
        statements.clear()
        assert feed_source.poll() is None
        if len(statements) == 1:
            assert statements[0].startswith(gate)
            idle_polls += 1
            if idle_polls == 2:
                break
    assert idle_polls == 2


def test_the_source_pins_new_rows_pauses_and_decisions_to_runs(
    source: tuple[Any, list[str]], pg_store: PgStore, pg_seeded: PgSeeded, tmp_path: Path
) -> None:
    feed_source, _ = source
    new = run_worker(pg_store, "paused-1", tmp_path)
    changes = feed_source.poll()
    assert changes is not None and not changes.everything
    assert (changes.runs, changes.pauses_added, changes.pauses_removed) == (
        {new},
        {new},
        frozenset(),
    )
    assert feed_source.poll() is None

    log = PostgresDecisionLog(pg_store.dsn, schema=pg_store.app_schema)
    try:
        claim = log.claim(
            kind=APPROVAL,
            execution_id=new,
            checkpoint_id="cp",
            approved=True,
            actor="ann",
            reason="",
            still_pending=lambda: True,
        )
        # The app's table appeared with the first claim: nothing to pin that to.
        appeared = feed_source.poll()
        assert appeared is not None and appeared.everything
        log.finish(claim.decision.id, "completed", None)
        finished = feed_source.poll()
        assert finished is not None and not finished.everything
        assert finished.decided == {new}
    finally:
        log.close()

    pg_store.raw.execute(
        "DELETE FROM {s}.pending_interrupts WHERE execution_id = %s", (pg_seeded.id("paused-2"),)
    )
    claimed = feed_source.poll()
    assert claimed is not None and claimed.pauses_removed == {pg_seeded.id("paused-2")}


def test_the_source_sees_the_outbox_move_and_a_prune(
    source: tuple[Any, list[str]], pg_store: PgStore, pg_seeded: PgSeeded
) -> None:
    from datetime import timedelta

    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    feed_source, _ = source
    run = pg_seeded.id("failed")
    sdk = PostgresCheckpointer(pg_store.dsn, schema=pg_store.schema)
    try:
        sdk.mark_synced([r["checkpoint_id"] for r in pg_store.raw.rows(run)])
        changes = feed_source.poll()
        assert changes is not None and changes.runs == {run} and not changes.everything
        sdk.prune(timedelta(hours=-1))
    finally:
        sdk.close()  # the server counts the deletes once the session is done
    # The commit and the count of deletes reach this session at different moments:
    # whichever poll comes after the count says so.
    deadline = time.monotonic() + 15
    while (pruned := feed_source.poll()) is None or not pruned.everything:
        assert time.monotonic() < deadline, "the prune never reached the change source"
        time.sleep(0.1)


# --- the privileges the README lists --------------------------------------------


@pytest.fixture
def roles(pg_store: PgStore) -> Iterator[dict[str, str]]:
    """Login roles for this test (roles are cluster-wide: named for it, dropped after):
    ``owner`` owns the SDK's schema as a fleet's workers would; ``reader`` may only
    read its tables; ``actor`` is a member of ``owner``."""
    from conftest import pg_name

    names = {kind: pg_name(f"lu_{kind}") for kind in ("owner", "reader", "actor")}
    database = pg_store.dsn.rsplit("/", 1)[1]
    admin = pg_store.raw
    for name in names.values():
        admin.execute(f"CREATE ROLE {name} LOGIN")
    owner, reader, actor = names["owner"], names["reader"], names["actor"]
    admin.execute(f"GRANT CREATE ON DATABASE {database} TO {owner}")
    admin.execute(f"ALTER SCHEMA {{s}} OWNER TO {owner}")
    for table in ("checkpoints", "pending_interrupts", "idempotency_cache", "schema_version"):
        admin.execute(f"ALTER TABLE {{s}}.{table} OWNER TO {owner}")
    admin.execute(f"GRANT USAGE ON SCHEMA {{s}} TO {reader}")
    admin.execute(
        f"GRANT SELECT ON {{s}}.checkpoints, {{s}}.pending_interrupts, {{s}}.idempotency_cache"
        f" TO {reader}"
    )
    admin.execute(f"GRANT {owner} TO {actor}")
    dsns = {kind: pg_store.dsn.replace("postgres@", f"{name}@") for kind, name in names.items()}
    try:
        yield dsns
    finally:
        pg_store.app_raw.drop()
        pg_store.raw.drop()
        for name in (actor, reader, owner):
            admin.execute(f"DROP OWNED BY {name} CASCADE")
            admin.execute(f"DROP ROLE {name}")


def test_a_reader_role_serves_read_only_and_says_what_to_grant(
    roles: dict[str, str], pg_store: PgStore, pg_seeded: PgSeeded
) -> None:
    from starlette.testclient import TestClient as Client

    from localui.app import create_app

    run = pg_seeded.id("paused-1")
    settings = replace(pg_store.settings(read_only=True), store=roles["reader"])
    app = create_app(settings)
    with Client(app, base_url="http://127.0.0.1:8765", client=LOOPBACK_CLIENT) as reader:
        none = {"orphaned": 0, "cancelled": 0, "timed_out": 0}
        assert reader.get("/runs.json").json()["counts"] == {**COUNTS, **none}
        assert reader.get(f"/approvals/{run}.json").status_code == 200  # no app schema yet
        # Once an acting localui made its schema, a reader needs to be let in.
        PostgresDecisionLog(pg_store.dsn, schema=pg_store.app_schema).close()
        refused = reader.get(f"/runs/{run}.json")
        assert refused.status_code == 503
        assert refused.json()["error"]["message"].endswith(
            f"(a read-only localui shows decisions with USAGE on schema {pg_store.app_schema}"
            f" and SELECT on {pg_store.app_schema}.localui_decisions and"
            f" {pg_store.app_schema}.localui_votes)"
        )
        name = roles["reader"].split("//")[1].split("@")[0]
        pg_store.app_raw.execute(f"GRANT USAGE ON SCHEMA {{s}} TO {name}")
        pg_store.app_raw.execute(
            f"GRANT SELECT ON {{s}}.localui_decisions, {{s}}.localui_votes TO {name}"
        )
        assert reader.get(f"/runs/{run}.json").json()["decisions"] == []
    store = PostgresStore(roles["reader"], schema=pg_store.schema)
    try:
        assert store.count_pending() == 4
    finally:
        store.close()


def test_a_member_of_the_fleets_role_acts_through_the_sdk(
    roles: dict[str, str],
    pg_store: PgStore,
    pg_seeded: PgSeeded,
    make_pg_client: Callable[..., TestClient],
) -> None:
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    from localui.demo.agent import build_agent

    sdk = PostgresCheckpointer(roles["actor"], schema=pg_store.schema)
    try:
        acting = replace(pg_store, dsn=roles["actor"])
        client = make_pg_client(acting, agents=[build_agent(sdk)])
        run = pg_seeded.id("paused-3")
        response = decide(client, run, card(client, run)["checkpoint_id"])
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "completed"
        preview = client.get("/prune.json", params={"older_than": "0s"}).json()
        done = client.post(
            "/prune",
            data={
                "older_than": "0s",
                "cutoff": preview["cutoff"],
                "prune_token": preview["prune_token"],
            },
            headers=JSON,
        )
        assert done.json()["deleted"] == preview["would_delete"]
    finally:
        sdk.close()


def test_a_read_only_record_sees_votes_once_their_table_is_made(pg_store: PgStore) -> None:
    """A read-only process asks whether the votes table exists until it does, then
    reads a run's votes in one statement; a table dropped since is asked about again."""
    import psycopg

    reader = PostgresDecisionLog(pg_store.dsn, schema=pg_store.app_schema, writable=False)
    try:
        assert reader.votes_for_run("run-1") == ()
        writer = PostgresDecisionLog(pg_store.dsn, schema=pg_store.app_schema)
        try:
            writer.cast_vote(
                execution_id="run-1",
                checkpoint_id="cp-1",
                actor="Ada",
                reason="fine",
                fields_json="{}",
                needed=2,
            )
        finally:
            writer.close()
        assert [v.actor for v in reader.votes_for_run("run-1")] == ["Ada"]
        assert [v.actor for v in reader.votes_for_run("run-1")] == ["Ada"]
        with psycopg.connect(pg_store.dsn, autocommit=True) as conn:
            conn.execute(f'DROP TABLE "{pg_store.app_schema}".{VOTES_TABLE}')
        assert reader.votes_for_run("run-1") == ()
        assert reader.votes_for_run("run-1") == ()
    finally:
        reader.close()
