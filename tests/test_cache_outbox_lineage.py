"""The idempotency cache, the outbox and fork lineage, on stores the SDK wrote."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastaiagent.checkpointers import SQLiteCheckpointer

from localui.demo.agent import build_agent

ClientFactory = Callable[..., Any]


def test_cache_entry_names_the_tool_row_that_wrote_it(client: Any, seeded: Any) -> None:
    run = seeded.id("idempotent-resumed")
    page = client.get(f"/runs/{run}.json").json()
    (entry,) = page["idempotency"]
    assert entry["enveloped"] is True
    assert entry["value"] == "cb-A-1009-450.00"
    assert entry["written_by_node"] == "turn:0/tool:refund"
    tool_rows = [r["checkpoint_id"] for r in page["rows"] if r["node_id"] == "turn:0/tool:refund"]
    # The pre-tool row, written before the tool charged; not the pause row after it.
    assert entry["written_by"] == tool_rows[0]
    html = client.get(f"/runs/{run}").text
    assert "these 1 @idempotent calls are answered from the cache" in html
    assert f'href="#row-{tool_rows[0]}"' in html


def test_bare_cache_value_from_an_sdk_before_the_envelope(
    make_client: ClientFactory, store_copy: Path, seeded: Any
) -> None:
    run = seeded.id("completed")
    # Before 1.92 the SDK stored the result itself; put_idempotent stores what it is given.
    SQLiteCheckpointer(str(store_copy)).put_idempotent(run, "legacy-key", {"charge_id": "old"})
    client = make_client(store_copy)
    entries = {e["function_key"]: e for e in client.get(f"/runs/{run}.json").json()["idempotency"]}
    assert entries["legacy-key"]["value"] == {"charge_id": "old"}
    assert entries["legacy-key"]["enveloped"] is False
    assert "stored bare, by an SDK before 1.92" in client.get(f"/runs/{run}").text


def test_store_wide_cache_lists_what_prune_would_remove(
    make_client: ClientFactory, store_copy: Path
) -> None:
    client = make_client(store_copy)
    everything = client.get("/cache.json?older_than=0s").json()
    preview = client.get("/prune.json?older_than=0s").json()
    assert everything["total"] == preview["cache_rows"] >= 1
    assert len(everything["entries"]) == everything["total"]
    assert seeded_runs_with_cache(store_copy) == {e["execution_id"] for e in everything["entries"]}
    assert client.get("/cache.json?older_than=30d").json()["total"] == 0
    assert client.get("/cache.json?older_than=soon").status_code == 400


def seeded_runs_with_cache(path: Path) -> set[str]:
    import sqlite3

    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT execution_id FROM idempotency_cache")}


def test_outbox_states_come_from_the_sdks_own_marks(
    make_client: ClientFactory, store_copy: Path, seeded: Any
) -> None:
    run = seeded.id("completed")
    other = seeded.id("failed")
    sdk = SQLiteCheckpointer(str(store_copy))
    rows = sdk.list(run)
    sdk.mark_synced([rows[0].checkpoint_id])
    sdk.mark_quarantined({rows[1].checkpoint_id: "state_snapshot over the plane's 256 KB cap"})
    client = make_client(store_copy)

    page = client.get(f"/runs/{run}.json").json()
    outbox = {r["checkpoint_id"]: r["outbox"] for r in page["rows"]}
    assert outbox[rows[0].checkpoint_id] == "synced"
    assert outbox[rows[1].checkpoint_id] == "quarantined"
    assert outbox[rows[2].checkpoint_id] == "waiting"
    assert page["outbox"] == {
        "synced": 1,
        "waiting": len(rows) - 2,
        "quarantined": 1,
        "unknown": 0,
    }
    assert "state_snapshot over the plane&#39;s 256 KB cap" in client.get(f"/runs/{run}").text

    quarantined = client.get("/runs.json?outbox=quarantined").json()
    assert [r["execution_id"] for r in quarantined["runs"]] == [run]
    assert quarantined["totals"]["rows_quarantined"] == 1
    waiting = {r["execution_id"] for r in client.get("/runs.json?outbox=waiting").json()["runs"]}
    assert other in waiting and run in waiting


def test_lineage_walks_forks_of_forks(
    make_client: ClientFactory, copy_store: Callable[[], Path], seeded: Any
) -> None:
    path = copy_store()
    agent = build_agent(SQLiteCheckpointer(str(path)))
    first_fork = seeded.id("fork-of-completed")
    grand = agent.fork(first_fork, input="Refund order A-1001 for 10.00").execution_id
    client = make_client(path)

    source = client.get(f"/runs/{seeded.id('completed')}.json").json()
    (fork,) = source["forks"]
    assert fork["execution_id"] == first_fork
    assert [f["execution_id"] for f in fork["forks"]] == [grand]

    grand_page = client.get(f"/runs/{grand}.json").json()
    assert grand_page["fork_of"]["source_execution_id"] == first_fork
    html = client.get(f"/runs/{grand}").text
    origin = grand_page["fork_of"]["source_checkpoint_id"]
    assert f'href="/runs/{first_fork}#row-{origin}"' in html


def test_prune_preview_warns_before_deleting_the_cache_of_a_paused_run(
    make_client: ClientFactory, store_copy: Path, seeded: Any
) -> None:
    """A completed run's cache is history; a paused run's is a double charge waiting."""
    import sqlite3

    with sqlite3.connect(store_copy) as conn:
        cached = {r[0] for r in conn.execute("SELECT execution_id FROM idempotency_cache")}
    can_resume = seeded.ids("paused") | seeded.ids("unfinished") | seeded.ids("failed")
    at_risk = cached & can_resume
    # The demo charges before it pauses: every paused run has its charge cached.
    assert seeded.ids("paused") <= at_risk
    assert seeded.id("idempotent-resumed") in cached - at_risk

    client = make_client(store_copy)
    preview = client.get("/prune.json?older_than=0s").json()
    assert preview["resumable_cache"] == {run: 1 for run in at_risk}
    html = client.get("/prune?older_than=0s").text
    assert "Side effects may run twice" in html
    for run in at_risk:
        assert f'href="/runs/{run}#idempotency"' in html
    assert client.get("/prune.json?older_than=30d").json()["resumable_cache"] == {}
