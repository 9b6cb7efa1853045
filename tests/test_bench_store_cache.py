"""The benchmark builds a store once and finds it again: the same file, the same
PostgreSQL copy, rebuilt only when asked or when its key changes."""

from __future__ import annotations

import os
import subprocess
import sys
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
    finally:
        drop_schema(dsn, schema)
