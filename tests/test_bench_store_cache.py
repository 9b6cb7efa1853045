"""The benchmark builds a store once and finds it again: the same file, the same
PostgreSQL copy, rebuilt only when asked or when its key changes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from bench import store_cache

REPO = Path(__file__).resolve().parent.parent
RUNS = 100


def only_build(workdir: Path, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTAIAGENT_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--sizes",
            str(RUNS),
            "--span-sizes",
            "none",
            "--only-build",
            "--workdir",
            str(workdir),
            *extra,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr


def test_a_store_is_built_once_then_found(tmp_path: Path) -> None:
    store = tmp_path / "stores" / f"runs-{RUNS}.db"
    first = only_build(tmp_path)
    assert f"store {RUNS} runs: " in first and "found" not in first
    built = store.stat().st_mtime_ns
    second = only_build(tmp_path)
    assert f"store {RUNS} runs: " in second and "found in" in second
    assert store.stat().st_mtime_ns == built
    fresh = only_build(tmp_path, "--fresh-stores")
    assert "found" not in fresh
    assert store.stat().st_mtime_ns != built


def test_a_store_of_another_key_is_not_reused(tmp_path: Path) -> None:
    only_build(tmp_path)
    store = tmp_path / "stores" / f"runs-{RUNS}.db"
    key = store_cache.store_key(runs=RUNS, pending=RUNS // 10, spans=False)
    assert store_cache.load(store, key) is not None
    assert store_cache.load(store, key.replace("format ", "format x")) is None
    assert store_cache.load(store, store_cache.store_key(runs=RUNS, pending=1, spans=False)) is None
    # A description without its store (a build cut short) is no store.
    store.unlink()
    assert store_cache.load(store, key) is None


def test_a_postgresql_copy_is_made_once_then_found(tmp_path: Path) -> None:
    dsn = os.environ.get("LOCALUI_TEST_PG_DSN", "")
    if not dsn:
        pytest.fail("LOCALUI_TEST_PG_DSN: run the tests with scripts/test.sh", pytrace=False)
    from bench.pg import drop_schema

    schema = f"bench_{RUNS}"
    drop_schema(dsn, schema)
    try:
        first = only_build(tmp_path, "--backend", "postgres")
        assert f"copied to PostgreSQL {schema}" in first
        second = only_build(tmp_path, "--backend", "postgres")
        assert f"found in PostgreSQL {schema}" in second
        assert "copied to PostgreSQL" not in second
        # Another build of the same size (another workdir) holds other runs: copied again.
        other = tmp_path / "other"
        other.mkdir()
        third = only_build(other, "--backend", "postgres")
        assert f"copied to PostgreSQL {schema}" in third
    finally:
        drop_schema(dsn, schema)


def _sdk_rows(store: Path) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(store)) as conn:
        return [
            tuple(conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall())
            for table in ("checkpoints", "pending_interrupts", "idempotency_cache")
        ]


def test_fresh_app_tables_puts_back_the_record_a_build_makes_and_keeps_the_sdk_s(
    tmp_path: Path,
) -> None:
    """A reused store carries what earlier servers wrote into the app's tables; with
    ``--fresh-app-tables`` they are dropped (the server makes them again) and the bench's
    record is loaded again, the SDK's rows kept byte for byte."""
    from localui.backends.decisions import TABLE, VOTES_TABLE
    from localui.backends.notifications import TABLE as NOTIFICATIONS

    only_build(tmp_path)
    store = tmp_path / "stores" / f"runs-{RUNS}.db"
    with closing(sqlite3.connect(store)) as conn, conn:
        built = {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in (TABLE, VOTES_TABLE)
        }
        # What a server leaves behind: its outbox, and an edit it recorded.
        conn.execute(f"CREATE TABLE {NOTIFICATIONS} (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute(f"INSERT INTO {NOTIFICATIONS} (body) VALUES ('announced')")
        conn.execute(
            f"INSERT INTO {TABLE} (kind, execution_id, checkpoint_id, actor, reason, decided_at)"
            " VALUES ('edit', 'a-branch', 'a-row', 'Ada', '', '2026-01-01T00:00:00+00:00')"
        )
    assert built[TABLE] == RUNS and built[VOTES_TABLE] > 0
    sdk = _sdk_rows(store)

    log = only_build(tmp_path, "--fresh-app-tables")
    assert "found in" in log and "record loaded" in log
    assert f"app tables dropped ({TABLE}, {NOTIFICATIONS}, {VOTES_TABLE})" in log
    with closing(sqlite3.connect(store)) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert NOTIFICATIONS not in tables
        for table, count in built.items():
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == count
        assert conn.execute(f"SELECT count(*) FROM {TABLE} WHERE kind = 'edit'").fetchone() == (0,)
    assert _sdk_rows(store) == sdk
