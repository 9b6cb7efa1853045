"""The runs index keeps up with the store: new runs, pauses claimed, prune, outbox marks."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastaiagent.checkpointers import SQLiteCheckpointer

from localui.store.records import RunQuery
from localui.store.sqlite import SQLiteStore


def states(store: SQLiteStore) -> dict[str, str]:
    from localui.runs import run_state

    page = store.list_runs(RunQuery(limit=500))
    return {
        f.execution_id: run_state(f.last_step_type, f.last_status, f.has_pending) for f in page.runs
    }


def direct_states(store: SQLiteStore) -> dict[str, str]:
    """The same, one run at a time from the SDK's tables, bypassing the index."""
    from localui.runs import run_state

    with sqlite3.connect(store.path) as conn:
        ids = [r[0] for r in conn.execute("SELECT DISTINCT execution_id FROM checkpoints")]
    result = {}
    for eid in ids:
        facts = store.get_run(eid)
        assert facts is not None
        result[eid] = run_state(facts.last_step_type, facts.last_status, facts.has_pending)
    return result


def test_a_run_written_by_another_process_is_indexed(store_copy: Path, tmp_path: Path) -> None:
    store = SQLiteStore(store_copy, index_dir=tmp_path / "index")
    before = states(store)
    env = {
        **os.environ,
        "FASTAIAGENT_TRACE_ENABLED": "false",
        "FASTAIAGENT_LOCAL_DB": str(store_copy),
    }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "localui.demo.worker",
            "--store",
            str(store_copy),
            "--scenario",
            "paused-1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    new_id = out.stdout.strip().splitlines()[-1]
    after = states(store)
    assert set(after) - set(before) == {new_id}
    assert after[new_id] == "paused"
    page = store.list_runs(RunQuery(limit=1))
    assert page.runs[0].execution_id == new_id  # newest activity first
    assert page.counts["paused"] == list(before.values()).count("paused") + 1
    assert after == direct_states(store)
    store.close()


def test_a_claimed_pause_turns_orphaned(store_copy: Path, tmp_path: Path, seeded: Any) -> None:
    store = SQLiteStore(store_copy, index_dir=tmp_path / "index")
    run = seeded.id("paused-2")
    assert states(store)[run] == "paused"
    SQLiteCheckpointer(str(store_copy)).delete_pending_interrupt_atomic(run)
    assert states(store)[run] == "orphaned"
    assert store.list_runs(RunQuery(state="orphaned")).counts["orphaned"] == 1
    store.close()


def test_prune_and_outbox_marks_are_seen(store_copy: Path, tmp_path: Path, seeded: Any) -> None:
    store = SQLiteStore(store_copy, index_dir=tmp_path / "index")
    assert store.totals().rows_quarantined == 0
    sdk = SQLiteCheckpointer(str(store_copy))
    rows = sdk.list(seeded.id("completed"))
    sdk.mark_quarantined({rows[0].checkpoint_id: "too large for the plane"})
    sdk.mark_synced([r.checkpoint_id for r in rows[1:]])
    facts = {f.execution_id: f for f in store.list_runs(RunQuery(limit=500)).runs}
    completed = facts[seeded.id("completed")]
    assert (completed.rows_waiting, completed.rows_quarantined) == (0, 1)
    assert store.totals().rows_quarantined == 1

    total_before = store.totals().rows
    deleted = sdk.prune(timedelta(seconds=0))
    assert deleted > 0
    left = states(store)
    assert left == direct_states(store)
    assert store.totals().rows < total_before
    # Prune keeps the paused rows, so every paused run is still listed as paused.
    assert {eid for eid, st in left.items() if st == "paused"} == seeded.ids("paused")
    store.close()


def test_an_index_of_another_version_is_rebuilt(
    copy_store: Callable[[], Path], tmp_path: Path
) -> None:
    path = copy_store()
    store = SQLiteStore(path, index_dir=tmp_path / "index")
    expected = states(store)
    index_file = store._index.path
    store.close()
    with sqlite3.connect(index_file) as conn:
        conn.execute("UPDATE meta SET value = 'old' WHERE key = 'version'")
        conn.execute("DELETE FROM runs")
    reopened = SQLiteStore(path, index_dir=tmp_path / "index")
    assert states(reopened) == expected
    reopened.close()


def test_a_long_run_pages_its_timeline(make_client: Any, store_copy: Path, raw: Any) -> None:
    """A run of 450 rows shows its newest 200; earlier rows and all rows are a link away."""
    base = raw(store_copy)
    # Hand-built: the SDK writes runs this long only after hours of turns.
    for i in range(450):
        base.insert_checkpoint(
            id=f"long-{i:03d}",
            chain_name="refund-bot",
            execution_id="long-run",
            checkpoint_id=f"long-{i:03d}",
            node_id=f"turn:{i // 2}" + ("/tool:refund" if i % 2 else ""),
            step_type="tool_call" if i % 2 else "llm_call",
            created_at=f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}+00:00",
        )
    client = make_client(store_copy)
    page = client.get("/runs/long-run.json").json()
    assert [r["checkpoint_id"] for r in page["rows"]] == [f"long-{i:03d}" for i in range(250, 450)]
    assert page["window"]["total"] == 450 and page["window"]["start"] == 250
    html = client.get("/runs/long-run").text
    assert "Rows 251–450 of 450." in html
    assert 'href="/runs/long-run?from=50#timeline"' in html
    earliest = client.get("/runs/long-run.json?from=0").json()
    assert earliest["rows"][0]["checkpoint_id"] == "long-000"
    assert len(client.get("/runs/long-run.json?from=0&rows=all").json()["rows"]) == 450
    assert client.get("/runs/long-run.json?from=x").status_code == 400
    assert client.get("/runs/long-run.json?rows=9").status_code == 400


def test_a_store_replaced_at_its_path_is_read_anew(
    copy_store: Callable[[], Path], tmp_path: Path, seeded: Any
) -> None:
    """Restoring a backup over the store: the runs list shows the file now at the path."""
    path = copy_store()
    store = SQLiteStore(path, index_dir=tmp_path / "index")
    assert seeded.id("completed") in states(store)
    replacement = tmp_path / "replacement.db"
    source, target = sqlite3.connect(path), sqlite3.connect(replacement)
    source.backup(target)
    source.close()
    # A backup file as a restore brings it: one self-contained file, no WAL beside it.
    target.execute("PRAGMA journal_mode = DELETE")
    target.execute("DELETE FROM checkpoints WHERE execution_id = ?", (seeded.id("completed"),))
    target.commit()
    target.close()
    # As a restore does with the writers stopped: the old file's WAL goes with it.
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.replace(replacement, path)
    after = states(store)
    assert seeded.id("completed") not in after
    assert after == direct_states(store)
    store.close()


def test_a_deleted_store_is_unavailable_not_an_error(
    copy_store: Callable[[], Path], tmp_path: Path
) -> None:
    from localui.errors import Unavailable

    path = copy_store()
    store = SQLiteStore(path, index_dir=tmp_path / "index")
    store.list_runs(RunQuery())
    path.unlink()
    with pytest.raises(Unavailable, match="is gone"):
        store.list_runs(RunQuery())
    store.close()
