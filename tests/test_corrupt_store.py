"""Damaged data in a store the real SDK wrote: every page still answers, and the damaged
value shows as unreadable in its own place.

The damage is made by hand (no SDK writes it): a byte that is not UTF-8 in a text
column, JSON nested far deeper than any parser recurses, a context nested 250 deep,
text where the SDK writes numbers, and a store file replaced by junk and put back
under a running server.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import ClientFactory, PgStore, Raw, Seeded
    from starlette.testclient import TestClient


#: Text with one byte that is not UTF-8, as SQLite stores it when a writer hands it bytes.
NOT_UTF8 = "CAST(X'4f6b20ff2072656675736564' AS TEXT)"
DEEP = 10_000


def nested(depth: int) -> str:
    """JSON text of a context nested ``depth`` objects deep."""
    return '{"k": ' * depth + '"bottom"' + "}" * depth


@dataclass(frozen=True)
class Damaged:
    client: TestClient
    paused: str
    completed: str
    #: Checkpoint ids of the paused run's first and last rows and the completed run's last.
    rows: tuple[str, str, str]

    def urls(self) -> list[str]:
        """Every page a damaged row can show on, and its JSON twin."""
        a, b, c = self.rows
        pages = [
            "/",
            "/approvals",
            f"/approvals/{self.paused}",
            "/prune?older_than=0s",
            "/cache?older_than=0s",
            f"/runs/{self.paused}",
            f"/runs/{self.paused}/rows/{a}",
            f"/runs/{self.paused}/rows/{b}",
            f"/runs/{self.paused}/diff?a={a}&b={b}",
            f"/runs/{self.completed}",
            f"/runs/{self.completed}/rows/{c}",
            f"/diff?a={b}&b={c}",
        ]
        return pages + [_json_twin(url) for url in pages]


def _json_twin(url: str) -> str:
    path, _, query = url.partition("?")
    return f"{'/runs' if path == '/' else path}.json" + (f"?{query}" if query else "")


def assert_every_page_answers(damaged: Damaged) -> dict[str, str]:
    texts: dict[str, str] = {}
    for url in damaged.urls():
        response = damaged.client.get(url)
        assert response.status_code == 200, (url, response.status_code, response.text[-500:])
        assert "Traceback" not in response.text
        texts[url] = response.text
    return texts


# --- SQLite -------------------------------------------------------------------------


@pytest.fixture
def sqlite_damage(
    make_client: ClientFactory, store_copy: Path, seeded: Seeded, raw: Callable[[Path], Raw]
) -> Iterator[Callable[[str], Damaged]]:
    """``damage(sql)``: run ``sql`` (with ``:paused`` and ``:completed`` bound) on a fresh
    copy, then serve it."""

    def damage(sql: str) -> Damaged:
        params = {"paused": seeded.id("paused-1"), "completed": seeded.id("completed")}
        paused_rows = raw(store_copy).rows(params["paused"])
        done_rows = raw(store_copy).rows(params["completed"])
        rows = (
            paused_rows[0]["checkpoint_id"],
            paused_rows[-1]["checkpoint_id"],
            done_rows[-1]["checkpoint_id"],
        )
        for statement in sql.split(";"):
            if statement.strip():
                _execute_named(raw(store_copy), statement, params)
        client = make_client(store_copy, raise_server_exceptions=False)
        return Damaged(client, params["paused"], params["completed"], rows)

    yield damage


def _execute_named(db: Raw, sql: str, params: dict[str, Any]) -> None:
    import sqlite3

    conn = sqlite3.connect(db.path)
    try:
        with conn:
            conn.execute(sql, params)
    finally:
        conn.close()


SQLITE_DAMAGE = {
    "reason-not-utf8": f"UPDATE pending_interrupts SET reason = {NOT_UTF8}"
    " WHERE execution_id = :paused",
    "agent-not-utf8": f"UPDATE checkpoints SET chain_name = {NOT_UTF8}"
    " WHERE execution_id = :paused",
    "node-id-not-utf8": f"UPDATE checkpoints SET node_id = {NOT_UTF8}"
    " WHERE execution_id = :completed",
    "status-not-utf8": f"UPDATE checkpoints SET status = {NOT_UTF8}"
    " WHERE execution_id = :completed AND step_type = 'llm_call'",
    "snapshot-not-utf8": f"UPDATE checkpoints SET state_snapshot = {NOT_UTF8}"
    " WHERE execution_id IN (:paused, :completed)",
    "context-not-utf8": f"UPDATE pending_interrupts SET context = {NOT_UTF8}"
    " WHERE execution_id = :paused",
    "cache-not-utf8": f"UPDATE idempotency_cache SET result = {NOT_UTF8}",
    "created-at-not-utf8": f"UPDATE checkpoints SET created_at = {NOT_UTF8}"
    " WHERE execution_id = :completed AND step_type = 'llm_call'",
    "snapshot-deep": "UPDATE checkpoints SET state_snapshot = '"
    + "[" * DEEP
    + "]" * DEEP
    + "' WHERE execution_id IN (:paused, :completed)",
    "input-deep": "UPDATE checkpoints SET node_input = '"
    + nested(DEEP)
    + "' WHERE execution_id IN (:paused, :completed)",
    "context-deep": f"UPDATE pending_interrupts SET context = '{nested(DEEP)}'",
    "context-250": f"UPDATE pending_interrupts SET context = '{nested(250)}'",
    "snapshot-900": "UPDATE checkpoints SET state_snapshot = '"
    + nested(900)
    + "' WHERE execution_id IN (:paused, :completed)",
    "node-index-text": "UPDATE checkpoints SET node_index = 'seven'"
    " WHERE execution_id IN (:paused, :completed)",
    "iteration-text": "UPDATE checkpoints SET iteration = 'twice'"
    " WHERE execution_id IN (:paused, :completed)",
}


@pytest.mark.parametrize("damage_name", sorted(SQLITE_DAMAGE))
def test_a_damaged_sqlite_value_never_takes_a_page_down(
    sqlite_damage: Callable[[str], Damaged], damage_name: str
) -> None:
    assert_every_page_answers(sqlite_damage(SQLITE_DAMAGE[damage_name]))


def test_a_reason_that_is_not_utf8_reads_unreadable_in_its_cell(
    sqlite_damage: Callable[[str], Damaged], page_text: Callable[..., str]
) -> None:
    damaged = sqlite_damage(SQLITE_DAMAGE["reason-not-utf8"])
    listed = {r["execution_id"]: r for r in damaged.client.get("/runs.json").json()["runs"]}
    assert "unreadable" in listed[damaged.paused]["pending_reason"]
    queue = damaged.client.get("/approvals.json").json()["approvals"]
    assert "unreadable" in next(a for a in queue if a["execution_id"] == damaged.paused)["reason"]
    # The other pauses read as before.
    assert sum("unreadable" in a["reason"] for a in queue) == 1
    assert "unreadable" in page_text(damaged.client.get("/approvals").text).lower()


def test_a_context_250_deep_renders_its_top_and_says_the_rest_is_cut(
    sqlite_damage: Callable[[str], Damaged], page_text: Callable[..., str]
) -> None:
    damaged = sqlite_damage(SQLITE_DAMAGE["context-250"])
    words = page_text(damaged.client.get(f"/approvals/{damaged.paused}").text)
    assert "k" in words and "nested deeper than" in words
    body = damaged.client.get(f"/approvals/{damaged.paused}.json").json()
    depth, value = 0, body["pending"]["context"]
    while isinstance(value, dict):
        value, depth = value["k"], depth + 1
    assert (depth, value) == (250, "bottom")  # the JSON keeps all of it


def test_json_10000_deep_reads_unreadable(sqlite_damage: Callable[[str], Damaged]) -> None:
    damaged = sqlite_damage(SQLITE_DAMAGE["context-deep"])
    body = damaged.client.get(f"/runs/{damaged.paused}.json").json()
    rows = body["rows"]
    assert rows
    queue = damaged.client.get("/approvals.json").json()["approvals"]
    contexts = [a["context"] for a in queue]
    assert all(set(c) == {"unreadable"} for c in contexts)
    assert "nested deeper" in contexts[0]["unreadable"]


def test_a_store_replaced_by_junk_and_put_back_serves_again(
    make_client: ClientFactory, store_copy: Path, seeded: Seeded, tmp_path: Path
) -> None:
    client = make_client(store_copy, raise_server_exceptions=True)
    completed = seeded.id("completed")
    urls = ["/", "/runs.json", f"/runs/{completed}", "/approvals", "/prune?older_than=0s"]
    assert all(client.get(u).status_code == 200 for u in urls)
    kept = shutil.copy(store_copy, tmp_path / "kept.db")

    junk = tmp_path / "junk"
    junk.write_bytes(b"not a database at all\n" * 500)
    junk.replace(store_copy)
    for url in urls:
        response = client.get(url)
        assert response.status_code in (200, 503), (url, response.status_code)
        assert "Traceback" not in response.text
    assert client.get("/runs.json").status_code == 503

    Path(kept).replace(store_copy)
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code, response.text[-300:])
    listed = {r["execution_id"] for r in client.get("/runs.json").json()["runs"]}
    assert completed in listed


# --- PostgreSQL: the same damage where its column types allow it ----------------------------


PG_DAMAGE = {
    "snapshot-deep": "UPDATE {s}.checkpoints SET state_snapshot = %(deep_list)s::jsonb"
    " WHERE execution_id IN (%(paused)s, %(completed)s)",
    "input-deep": "UPDATE {s}.checkpoints SET node_input = %(deep_object)s::jsonb"
    " WHERE execution_id IN (%(paused)s, %(completed)s)",
    "context-deep": "UPDATE {s}.pending_interrupts SET context = %(deep_object)s::jsonb",
    "context-250": "UPDATE {s}.pending_interrupts SET context = %(object_250)s::jsonb",
    "cache-deep": "UPDATE {s}.idempotency_cache SET result = %(deep_object)s::jsonb",
}


@pytest.mark.postgres
@pytest.mark.parametrize("damage_name", sorted(PG_DAMAGE))
def test_a_damaged_postgres_value_never_takes_a_page_down(
    pg_store: PgStore,
    make_pg_client: Callable[..., TestClient],
    seeded_pg_ids: dict[str, str],
    damage_name: str,
) -> None:
    import psycopg

    paused_rows = pg_store.raw.rows(seeded_pg_ids["paused"])
    done_rows = pg_store.raw.rows(seeded_pg_ids["completed"])
    rows = (
        paused_rows[0]["checkpoint_id"],
        paused_rows[-1]["checkpoint_id"],
        done_rows[-1]["checkpoint_id"],
    )
    params = {
        **seeded_pg_ids,
        "deep_list": "[" * DEEP + "]" * DEEP,
        "deep_object": nested(DEEP),
        "object_250": nested(250),
    }
    with psycopg.connect(pg_store.dsn, autocommit=True) as conn:
        # PostgreSQL's own parser recurses too: let it take this depth.
        conn.execute("SET max_stack_depth = '7MB'")
        conn.execute(PG_DAMAGE[damage_name].replace("{s}", pg_store.schema), params)
    client = make_pg_client(pg_store, agents=[], raise_server_exceptions=False)
    damaged = Damaged(client, seeded_pg_ids["paused"], seeded_pg_ids["completed"], rows)
    assert_every_page_answers(damaged)


@pytest.fixture
def seeded_pg_ids(pg_seeded: Any) -> dict[str, str]:
    return {"paused": pg_seeded.id("paused-1"), "completed": pg_seeded.id("completed")}


def test_nested_helper_is_valid_json() -> None:
    value = json.loads(nested(5))
    assert value == {"k": {"k": {"k": {"k": {"k": "bottom"}}}}}
