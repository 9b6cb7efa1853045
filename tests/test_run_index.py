"""The runs index keeps up with the store: new runs, pauses claimed, prune, outbox marks."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastaiagent.checkpointers import SQLiteCheckpointer
from helpers import LOOPBACK_CLIENT, NO_SIGN_IN

from localui.backends.sqlite.store import SQLiteStore
from localui.records import RunQuery


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


def test_an_approved_run_whose_rows_were_pruned_is_not_called_never_continued(
    make_client: Any, store_copy: Path, seeded: Any
) -> None:
    sdk = SQLiteCheckpointer(str(store_copy))
    assert sdk.prune(timedelta(seconds=0)) > 0
    sdk.close()
    run = seeded.id("idempotent-resumed")  # approved, then completed; only its pause is left

    page = make_client(store_copy).get(f"/runs/{run}.json").json()

    assert page["state"] == "orphaned"
    assert [r["status"] for r in page["rows"]] == ["interrupted"]
    verdict = page["verdict"]
    assert "never continued" not in verdict["headline"]
    assert "kept by prune" in verdict["headline"]
    assert "prune deleted the others" in verdict["resume"]


def test_a_run_pruned_while_the_index_is_built_again_says_it_was_deleted(
    store_copy: Path, tmp_path: Path, seeded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a store indexed in the background (a large one), a prune sets off a build
    anew; until it commits, the index as it was lists the pruned runs. Such a run's page
    says its rows were deleted since the list was read; once the build is done it is an
    unknown id like any other. The build is held before it starts (its own step
    wrapped to wait: no real part can hold a thread at that point)."""
    import html
    import threading

    from conftest import BASE_URL
    from starlette.testclient import TestClient

    from localui.app import create_app
    from localui.backends.sqlite import SQLiteBackend
    from localui.settings import Settings

    store = SQLiteStore(store_copy, index_dir=tmp_path / "index", background_index_from_rows=0)
    sync = store._index._sync
    sync.complete()
    gone = seeded.id("completed")
    assert store.listed(gone)
    started, go = threading.Event(), threading.Event()
    build_on = sync._build_on

    def held(conn: Any, columns: Any, identity: str) -> None:
        started.set()
        go.wait(60)
        build_on(conn, columns, identity)

    monkeypatch.setattr(sync, "_build_on", held)
    app = create_app(
        Settings(store=str(store_copy), sign_in=NO_SIGN_IN),
        backend=SQLiteBackend(store_copy, store=store),
    )
    said = "is no longer in this store: its rows were deleted"
    try:
        with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
            sdk = SQLiteCheckpointer(str(store_copy))
            assert sdk.prune(timedelta(seconds=0)) > 0
            sdk.close()
            answer = client.get(f"/runs/{gone}")
            assert started.wait(30) and not go.is_set()
            assert answer.status_code == 404
            assert said in html.unescape(answer.text)
            assert store.listed(gone) and store.get_run(gone) is None
            go.set()
            sync.complete()
            assert not store.listed(gone)
            after = client.get(f"/runs/{gone}")
            assert after.status_code == 404
            text = html.unescape(after.text)
            assert f"no run with execution id {gone!r}" in text and said not in text
    finally:
        go.set()


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


def test_a_store_replaced_in_place_by_content_is_read_anew_after_a_restart(
    copy_store: Callable[[], Path], tmp_path: Path, seeded: Any
) -> None:
    """A file copied over the served one: same inode, same row count, other runs."""
    path = copy_store()
    index_dir = tmp_path / "index"
    store = SQLiteStore(path, index_dir=index_dir)
    assert seeded.id("completed") in states(store)
    store.close()
    replacement = tmp_path / "replacement.db"
    source, target = sqlite3.connect(path), sqlite3.connect(replacement)
    source.backup(target)
    source.close()
    target.execute("PRAGMA journal_mode = DELETE")
    # Other runs, row for row: every rowid and the row count stay as they were.
    target.execute("UPDATE checkpoints SET execution_id = 'restored-' || execution_id")
    target.execute("UPDATE pending_interrupts SET execution_id = 'restored-' || execution_id")
    target.commit()
    target.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    inode = os.stat(path).st_ino
    path.write_bytes(replacement.read_bytes())  # in place, as `cp` over it does
    assert os.stat(path).st_ino == inode

    reopened = SQLiteStore(path, index_dir=index_dir)
    after = states(reopened)
    assert seeded.id("completed") not in after
    assert f"restored-{seeded.id('completed')}" in after
    assert after == direct_states(reopened)
    reopened.close()


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


# --- a store indexed in the background ---------------------------------------
#
# A store of 20,000 rows or more is indexed in a thread of its own. These tests
# lower that threshold to 0 and hold the index file's write lock from another
# connection, as a second localui process building the same index would, so the
# build is certainly still running while the store is asked.


def _stale_index(path: Path, index_dir: Path) -> tuple[Any, dict[str, Any], Path]:
    """Index ``path`` once and mark the index as built for another file, as if the
    store had been replaced: the next open rebuilds it. Returns what the complete
    index answered (first page, totals) and the index file."""
    store = SQLiteStore(path, index_dir=index_dir)
    first = store.list_runs(RunQuery())
    answers = {
        "totals": store.totals(),
        "paused": store.list_runs(RunQuery(state="paused")),
        "forks": {f.execution_id: store.list_forks(f.execution_id) for f in first.runs},
    }
    index_file = store._index.path
    store.close()
    with sqlite3.connect(index_file) as conn:
        conn.execute("UPDATE meta SET value = 'another file' WHERE key = 'identity'")
    return first, answers, index_file


def _hold_write_lock(index_file: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(index_file, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def test_a_store_being_indexed_answers_its_first_page_at_once(
    copy_store: Callable[[], Path], tmp_path: Path, raw: Any
) -> None:
    import threading

    path = copy_store()
    first, complete, index_file = _stale_index(path, tmp_path / "index")
    holder = _hold_write_lock(index_file)
    store = SQLiteStore(path, index_dir=tmp_path / "index", background_index_from_rows=0)
    try:
        page = store.list_runs(RunQuery())
        assert page.indexing is not None
        assert (
            page.indexing.rows_total == raw(path).query("SELECT MAX(rowid) FROM checkpoints")[0][0]
        )
        # The runs written to most recently, each summarised exactly from its rows.
        assert page.runs == first.runs
        assert (dict(page.counts), page.next_key) == ({}, None)
        assert store.get_run(first.runs[0].execution_id) == first.runs[0]
        assert store.get_run("no-such-run") is None
        forks = {f.execution_id: store.list_forks(f.execution_id) for f in first.runs}
        assert forks == complete["forks"] and any(forks.values())

        # What needs the whole index waits for it rather than answering from half.
        waited: dict[str, Any] = {}
        waiting = threading.Thread(
            target=lambda: waited.update(paused=store.list_runs(RunQuery(state="paused")))
        )
        waiting.start()
        waiting.join(0.3)
        assert waiting.is_alive() and not waited
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    waiting.join(30)
    assert waited["paused"] == complete["paused"]
    assert store.totals() == complete["totals"]
    done = store.list_runs(RunQuery())
    assert (done.indexing, done.runs, dict(done.counts)) == (None, first.runs, dict(first.counts))
    assert {f.execution_id: store.list_forks(f.execution_id) for f in first.runs} == complete[
        "forks"
    ]
    store.close()


def test_a_build_that_cannot_get_the_index_says_why_and_is_tried_again(
    copy_store: Callable[[], Path], tmp_path: Path
) -> None:
    from localui.backends.sqlite.index import RunIndex
    from localui.errors import Unavailable

    path = copy_store()
    _first, complete, index_file = _stale_index(path, tmp_path / "index")
    reader = SQLiteStore(path, index_dir=tmp_path / "elsewhere")
    holder = _hold_write_lock(index_file)
    index = RunIndex(
        path,
        columns=reader._index_columns,
        index_dir=tmp_path / "index",
        busy_timeout=0.1,
        background_from_rows=0,
    )
    try:
        with pytest.raises(Unavailable, match="could not be built: database is locked"):
            index.totals()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    totals = complete["totals"]
    assert index.totals() == (totals.rows, totals.rows_waiting, totals.rows_quarantined)
    index.close()
    reader.close()


def test_the_runs_page_says_it_is_indexing_and_asks_again(
    copy_store: Callable[[], Path], tmp_path: Path
) -> None:
    from starlette.testclient import TestClient

    from localui.app import create_app
    from localui.backends.sqlite import SQLiteBackend
    from localui.settings import Settings

    path = copy_store()
    first, complete, index_file = _stale_index(path, tmp_path / "index")
    holder = _hold_write_lock(index_file)
    store = SQLiteStore(path, index_dir=tmp_path / "index", background_index_from_rows=0)
    app = create_app(
        Settings(store=str(path), sign_in=NO_SIGN_IN), backend=SQLiteBackend(path, store=store)
    )
    with TestClient(app, base_url="http://127.0.0.1:8765", client=LOOPBACK_CLIENT) as client:
        try:
            html = client.get("/").text
            rows = complete["totals"].rows
            assert f"Indexing this store's {rows:,} rows" in html
            assert 'hx-get="/" hx-trigger="every 1s"' in html
            assert "rows in the store" not in html
            for run in first.runs:
                assert f'href="/runs/{run.execution_id}"' in html
            body = client.get("/runs.json").json()
            assert body["totals"] is None and body["counts"] == {}
            assert body["indexing"]["rows_total"] == rows
            assert [r["execution_id"] for r in body["runs"]] == [r.execution_id for r in first.runs]
            # A run's page needs no more than its own rows.
            for run in first.runs:
                assert client.get(f"/runs/{run.execution_id}").status_code == 200
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        store.totals()  # waits for the build
        fragment = client.get("/", headers={"HX-Request": "true"}).text
        assert "Indexing" not in fragment and "every 1s" not in fragment
        assert f"{complete['totals'].rows} rows in the store" in fragment
        assert client.get("/runs.json").json()["indexing"] is None
    store.close()


def _searched_fields(raw: Any, path: Path) -> dict[str, list[str]]:
    """What text search looks in, per run, straight from the SDK's rows."""
    fields: dict[str, list[str]] = {}
    for eid, agent, node, node_input in raw(path).query(
        "SELECT execution_id, chain_name, node_id, node_input FROM checkpoints"
    ):
        run = fields.setdefault(eid, [eid, agent])
        if "/tool:" in node and node_input:
            run.append(node_input)
    for eid, reason in raw(path).query("SELECT execution_id, reason FROM pending_interrupts"):
        fields[eid].append(reason or "")
    return fields


def _assert_search_agrees(store: SQLiteStore, fields: dict[str, list[str]]) -> None:
    texts = {"zz", "-", "A-", '"', '"order_id"', "NO-SUCH-TEXT", "Bot", "refund-BOT"}
    for run in fields.values():
        for field in run:
            texts.update({field[:3], field[2:9], field[-5:].upper()})
    for text in sorted(t for t in texts if t.strip()):
        expected = {
            eid for eid, run in fields.items() if any(text.lower() in f.lower() for f in run)
        }
        page = store.list_runs(RunQuery(text=text, limit=1000))
        assert {f.execution_id for f in page.runs} == expected, text
        assert sum(page.counts.values()) == len(expected), text


def test_text_search_finds_exactly_the_runs_holding_the_text(
    store_copy: Path, tmp_path: Path, raw: Any
) -> None:
    """Trigram lookups (3 characters or more) and the scan of shorter texts agree
    with a plain substring test over each run's id, agent, pause reason and tool
    arguments, ignoring ASCII case."""
    store = SQLiteStore(store_copy, index_dir=tmp_path / "index")
    _assert_search_agrees(store, _searched_fields(raw, store_copy))
    store.close()


def test_the_trigram_index_is_filled_after_a_build_and_search_is_right_meanwhile(
    store_copy: Path, tmp_path: Path, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large store's build loads the runs and fills the trigram index after, in
    steps: a fill cut short is finished by the next start; until it is complete,
    search scans the runs and answers the same; runs folded in meanwhile (above and
    below where the fill has got) are found once it is."""
    from localui.backends.sqlite.index import schema
    from localui.backends.sqlite.index.sync import IndexSync

    index_dir = tmp_path / "index"
    store = SQLiteStore(store_copy, index_dir=index_dir, background_index_from_rows=0)
    store.totals()  # waits for the build
    filler = store._index._sync._filler
    if filler is not None:
        filler.join(30)
    index_file = store._index.path
    with sqlite3.connect(index_file) as conn:
        assert schema.text_complete(conn)
        runs = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    _assert_search_agrees(store, _searched_fields(raw, store_copy))
    store.close()

    # The process was killed one step into a fill of a few runs per step.
    monkeypatch.setattr(schema, "TEXT_STEP_RUNS", max(1, runs // 3))
    conn = sqlite3.connect(index_file, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO run_text (run_text) VALUES ('delete-all')")
    conn.execute("UPDATE text_filled SET upto = 0, merged = 0")
    assert not schema.fill_text_step(conn)
    conn.execute("COMMIT")
    conn.close()

    # The next start, its fill held back: search is right without the trigram index.
    starts: list[IndexSync] = []
    monkeypatch.setattr(IndexSync, "_start_filling", lambda self: starts.append(self))
    store = SQLiteStore(store_copy, index_dir=index_dir, background_index_from_rows=0)
    assert starts, "an unfinished fill is taken up on start"
    fields = _searched_fields(raw, store_copy)
    _assert_search_agrees(store, fields)
    # A new run is folded in meanwhile (above where the fill has got).
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"}
    subprocess.run(
        [sys.executable, "-m", "localui.demo.worker", "--store", str(store_copy)]
        + ["--scenario", "paused-1"],
        cwd=tmp_path,
        env={**env, "FASTAIAGENT_LOCAL_DB": str(store_copy)},
        capture_output=True,
        check=True,
        timeout=120,
    )
    fields = _searched_fields(raw, store_copy)
    _assert_search_agrees(store, fields)

    monkeypatch.undo()
    sync = store._index._sync
    with sync.lock:
        sync._start_filling()
        filler = sync._filler
    assert filler is not None
    filler.join(30)
    with sqlite3.connect(index_file) as conn:
        assert schema.text_complete(conn)
        filled = conn.execute("SELECT COUNT(*) FROM run_text_docsize").fetchone()[0]
    assert filled == runs + 1
    _assert_search_agrees(store, fields)
    store.close()


def _add_run(store_path: Path, tmp_path: Path) -> str:
    """A paused run written to the store by the SDK in another process; its id."""
    env = {
        **os.environ,
        "FASTAIAGENT_TRACE_ENABLED": "false",
        "FASTAIAGENT_LOCAL_DB": str(store_path),
    }
    out = subprocess.run(
        [sys.executable, "-m", "localui.demo.worker", "--store", str(store_path)]
        + ["--scenario", "paused-1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout.strip().splitlines()[-1]


def test_while_rows_are_only_added_the_store_is_not_counted_on_every_change(
    store_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting every row (to see rows a prune deleted) reads an index of the whole
    store, 80 ms at 3.9M rows, so while rows are only added it is done at most every
    RECOUNT_EVERY_S; rows pruned meanwhile are seen once it is due, even if the store
    does not change again."""
    from localui.backends.sqlite.index import sync

    store = SQLiteStore(store_copy, index_dir=tmp_path / "index")
    states(store)  # the first catch-up counts in full
    statements: list[str] = []
    store._index._sync.conn.set_trace_callback(statements.append)

    def full_counts() -> int:
        return sum(1 for s in statements if s.strip() == "SELECT COUNT(*) FROM s.checkpoints")

    new_run = _add_run(store_copy, tmp_path)
    assert states(store)[new_run] == "paused"
    assert full_counts() == 0

    # A prune in another process, and a run added at the same moment.
    assert SQLiteCheckpointer(str(store_copy)).prune(timedelta(seconds=0)) > 0
    _add_run(store_copy, tmp_path)
    store.list_runs(RunQuery())
    monkeypatch.setattr(sync, "RECOUNT_EVERY_S", 0.0)
    assert states(store) == direct_states(store)
    assert full_counts() == 1
    assert store.totals().rows == sum(len(store.list_rows(eid)) for eid in direct_states(store))
    store.close()


def test_runs_folded_in_after_the_trigram_index_is_complete_are_found_then_batched(
    store_copy: Path, tmp_path: Path, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run folded in once the trigram index is complete waits for the next batch
    (one FTS5 segment for many runs, not one per catch-up): search scans it meanwhile
    and finds exactly what it finds once the batch has put it in."""
    from localui.backends.sqlite.index import schema, sync

    monkeypatch.setattr(sync, "TEXT_BATCH_EVERY_S", 3600.0)
    store = SQLiteStore(store_copy, index_dir=tmp_path / "index")
    states(store)
    index = store._index._sync
    with index.lock:
        assert schema.text_complete(index.conn)
        upto = schema.text_upto(index.conn)
    new_run = _add_run(store_copy, tmp_path)
    fields = _searched_fields(raw, store_copy)
    _assert_search_agrees(store, fields)
    with index.lock:
        assert schema.text_upto(index.conn) == upto  # not in the trigram index yet
        [tail] = index.conn.execute("SELECT execution_id FROM runs WHERE rowid > ?", (upto,))
    assert tail == (new_run,)
    assert [f.execution_id for f in store.list_runs(RunQuery(text=new_run[2:14])).runs] == [new_run]

    monkeypatch.setattr(sync, "TEXT_BATCH_EVERY_S", 0.0)
    _add_run(store_copy, tmp_path)
    fields = _searched_fields(raw, store_copy)
    _assert_search_agrees(store, fields)
    with index.lock:
        top = index.conn.execute("SELECT MAX(rowid) FROM runs").fetchone()[0]
        assert schema.text_upto(index.conn) == top
        in_text = index.conn.execute("SELECT COUNT(*) FROM run_text_docsize").fetchone()[0]
        assert in_text == index.conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    _assert_search_agrees(store, fields)
    store.close()


def _waiting_in_refresh(thread: Any) -> bool:
    """Whether ``thread`` has asked for a refresh (it waits for the index's lock)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == "refresh" and "asked" in frame.f_locals:
            return True
        frame = frame.f_back
    return False


def test_readers_waiting_on_a_catch_up_share_it(
    store_copy: Path, tmp_path: Path, seeded: Any
) -> None:
    """Readers that asked while another was catching up need only the next catch-up,
    not one each, even when rows land during it: whatever they could ask to see was
    committed before that next catch-up began. A reader that asks after a row landed
    sees it."""
    import threading

    store = SQLiteStore(store_copy, index_dir=tmp_path / "index")
    states(store)
    index = store._index._sync
    sdk = SQLiteCheckpointer(str(store_copy))
    template = sdk.list(seeded.id("completed"))[0]

    def write_a_run() -> str:
        execution_id = f"landed-{len(written)}"
        sdk.put(template.model_copy(update={"execution_id": execution_id, "checkpoint_id": ""}))
        written.append(execution_id)
        return execution_id

    written: list[str] = []
    catch_ups: list[str] = []

    def traced(statement: str) -> None:
        # A catch-up begins by reading the store's newest row; a run lands as it does,
        # as it would while a fleet writes.
        if statement.startswith("SELECT COALESCE(MAX(rowid), 0) FROM s.checkpoints"):
            catch_ups.append(statement)
            if len(catch_ups) == 1:
                write_a_run()

    write_a_run()
    index.conn.set_trace_callback(traced)
    readers = [threading.Thread(target=store.list_runs, args=(RunQuery(),)) for _ in range(8)]
    with index.lock:  # every reader asks while the index is busy
        for reader in readers:
            reader.start()
        while not all(_waiting_in_refresh(reader) for reader in readers):
            time.sleep(0.01)
    for reader in readers:
        reader.join(30)
    # One catch-up for the eight (the run that landed during it is the next one's).
    assert len(catch_ups) == 1
    listed = {f.execution_id for f in store.list_runs(RunQuery(limit=500)).runs}
    assert set(written) <= listed
    assert len(catch_ups) == 2
    index.conn.set_trace_callback(None)
    sdk.close()
    store.close()


def test_text_search_looks_matches_up_and_never_scans_every_run(
    store_copy: Path, tmp_path: Path
) -> None:
    """A search is answered from the trigram index (and the rowid range past it), in
    every statement: an OR of the two made SQLite scan the whole index, 330 ms at a
    million runs."""
    from contextlib import closing

    from localui.backends.sqlite.index import query, schema

    store = SQLiteStore(store_copy, index_dir=tmp_path / "index")
    some_run = store.list_runs(RunQuery(limit=1)).runs[0].execution_id
    assert [f.execution_id for f in store.list_runs(RunQuery(text=some_run[2:14])).runs] == [
        some_run
    ]
    store.close()
    index_file = schema.index_path(store_copy.resolve(), tmp_path / "index")
    with closing(sqlite3.connect(f"file:{index_file}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        assert schema.text_complete(conn)
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        page = query.list_runs(conn, RunQuery(text=some_run[2:14]), has_text_index=True)
        conn.set_trace_callback(None)
        assert [f.execution_id for f in page.runs] == [some_run]
        searched = [s for s in statements if "run_text MATCH" in s]
        assert len(searched) == 2  # the counts, then the page
        for statement in searched:
            plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}")]
            assert not any(step.startswith("SCAN runs") for step in plan), plan


def test_a_build_reads_the_store_file_in_order_first_and_stops_when_told(
    store_copy: Path, tmp_path: Path
) -> None:
    """Before a background build, the store's file is read once in file order, so the
    build's reads all over it come from the kernel's cache; a shutdown stops it."""
    from localui.backends.sqlite.index.sync import READ_AHEAD_CHUNK, read_ahead

    assert read_ahead(store_copy, lambda: False) == store_copy.stat().st_size
    large = tmp_path / "large.db"
    large.write_bytes(os.urandom(3 * READ_AHEAD_CHUNK))
    assert read_ahead(large, lambda: True) == 0
    # Nothing there: nothing to warm.
    assert read_ahead(tmp_path / "gone.db", lambda: False) == 0


def test_reading_the_store_ahead_keeps_this_process_s_locks_on_it(store_copy: Path) -> None:
    """Closing a file of the store in this process would drop every POSIX lock the
    process holds on it, SQLite's too: an agent's connection closing next would take
    itself for the last one and delete the write-ahead log under this process's open
    connections, whose reads then found the store "malformed" (seen under 300 runs a
    second written by another process). With the read done by a child process, the
    log an agent leaves behind stays while this process reads the store."""
    from localui.backends.sqlite.index.sync import read_ahead

    wal = store_copy.with_name(store_copy.name + "-wal")
    reader = sqlite3.connect(f"file:{store_copy}?mode=ro", uri=True)
    try:
        assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        reader.execute("SELECT count(*) FROM checkpoints").fetchone()
        assert read_ahead(store_copy, lambda: False) > 0
        agent = (
            "import sqlite3, sys\n"
            "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "conn.execute('CREATE TABLE agent_wrote (x)')\n"
            "conn.close()\n"
        )
        subprocess.run([sys.executable, "-c", agent, str(store_copy)], check=True)
        # Not the last connection: it left the log to this process's reader.
        assert wal.exists()
        assert reader.execute("SELECT count(*) FROM agent_wrote").fetchone() == (0,)
    finally:
        reader.close()
