"""The figures under writes measure what they say on a real store: readers while
another process writes runs (every pause it wrote found in the queue after), and the
runs list while the SDK's outbox drain marks rows synced. Their budgets are judged by
``python -m bench`` on large stores; here the machinery runs briefly on the seeded one.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTAIAGENT_")}
    return subprocess.run(
        [sys.executable, "-m", "bench.writes", *args],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _runs(store: Path) -> set[str]:
    with sqlite3.connect(store) as conn:
        return {r[0] for r in conn.execute("SELECT execution_id FROM checkpoints")}


def test_readers_are_timed_alone_and_while_a_writer_writes(
    store_copy: Path, tmp_path: Path
) -> None:
    out = tmp_path / "writes.json"
    before = _runs(store_copy)
    done = _bench(
        "--store",
        str(store_copy),
        "--readers",
        "4",
        "--seconds",
        "1.5",
        "--rounds",
        "1",
        "--rate",
        "50",
        "--json",
        str(out),
        cwd=tmp_path,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["errors"] == []
    [round_] = figures["rounds"]
    assert round_["alone"]["requests_per_s"] > 0 and round_["writing"]["requests_per_s"] > 0
    assert round_["alone"]["errors"] == [] and round_["writing"]["errors"] == []
    assert figures["runs_written"] > 0
    assert figures["pauses_written"] > 0 and figures["pauses_missing"] == 0
    assert figures["passed"] == (done.returncode == 0)
    # The writer wrote to a copy: the store given is as it was.
    assert _runs(store_copy) == before


def test_the_runs_list_is_timed_while_the_outbox_drains(store_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "outbox.json"
    done = _bench(
        "--outbox", "--store", str(store_copy), "--requests", "20", "--json", str(out), cwd=tmp_path
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["errors"] == []
    assert figures["alone"]["error"] is None and figures["draining"]["error"] is None
    assert len(figures["draining"]["samples_ms"]) == 20
    # The seeded store's rows, fewer than a second's worth: the drain marked them all.
    with sqlite3.connect(store_copy) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    assert figures["rows_marked"] == rows
    assert figures["passed"] == (done.returncode == 0)
