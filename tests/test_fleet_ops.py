"""Operating a fleet, on both backends: what needs attention, the decision record as
data, and ``/metrics``, each held to the SDK's own rows and to each other.

Every test works on its own copy of the seeded runs (the real SDK wrote them in child
processes), changed only the ways a fleet changes: the SDK's own checkpointer claims a
pause and dies (an orphaned pause), the plane quarantines a row (``mark_quarantined``),
people decide through the app.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import ActingClientFactory, Ledger, PgStore, Raw, Seeded, text_of
from helpers import JSON, card, decide
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from localui.demo.agent import EXIT_DIED_IN_TOOL

#: Which runs of the seeded store each test changes, and how.
ORPHAN = "paused-2"
QUARANTINE = "completed"


@dataclass
class Fleet:
    """One backend's copy of the seeded runs: the app over it, the SDK's checkpointer on
    it, and its rows read plainly (the ground truth)."""

    kind: str
    client: Callable[..., TestClient]
    checkpointer: Any
    ids: Callable[[str], str]
    #: ``(execution_id, created_at, step_type, status, checkpoint_id)`` of every row.
    rows: Callable[[], list[tuple[str, datetime, str | None, str, str]]]
    #: Execution ids with a pending row.
    pending: Callable[[], set[str]]
    #: ``--store`` (and ``--pg-schema``) as the CLI and the demo worker take them.
    store_args: list[str]
    export_args: list[str]

    def crash_one_more(self) -> str:
        """The demo agent in a child process of its own dies inside its refund tool."""
        import os

        env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"}
        done = subprocess.run(
            [sys.executable, "-m", "localui.demo.worker", *self.store_args]
            + ["--scenario", "crashed-in-tool"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == EXIT_DIED_IN_TOOL, done.stderr
        return done.stdout.strip().splitlines()[-1]


def _parsed(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fleet(request: pytest.FixtureRequest, seeded: Seeded, ledger: Ledger) -> Iterator[Fleet]:
    if request.param == "sqlite":
        from fastaiagent.checkpointers import SQLiteCheckpointer

        path: Path = request.getfixturevalue("store_copy")
        raw: Raw = request.getfixturevalue("raw")(path)
        make: ActingClientFactory = request.getfixturevalue("make_acting_client")
        checkpointer = SQLiteCheckpointer(str(path))
        try:
            yield Fleet(
                kind="sqlite",
                client=lambda **settings: make(path, ledger, **settings),
                checkpointer=checkpointer,
                ids=seeded.id,
                rows=lambda: [
                    (r[0], _parsed(r[1]), r[2], r[3], r[4])
                    for r in raw.query(
                        "SELECT execution_id, created_at, step_type, status, checkpoint_id"
                        " FROM checkpoints ORDER BY created_at, rowid"
                    )
                ],
                pending=lambda: {
                    r[0] for r in raw.query("SELECT execution_id FROM pending_interrupts")
                },
                store_args=["--store", str(path)],
                export_args=["--store", str(path)],
            )
        finally:
            checkpointer.close()
        return
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    store: PgStore = request.getfixturevalue("pg_store")
    pg_seeded = request.getfixturevalue("pg_seeded")
    make_pg = request.getfixturevalue("make_pg_client")
    checkpointer = PostgresCheckpointer(store.dsn, schema=store.schema)
    try:
        yield Fleet(
            kind="postgres",
            client=lambda **settings: make_pg(store, ledger, **settings),
            checkpointer=checkpointer,
            ids=pg_seeded.id,
            rows=lambda: [
                (
                    r["execution_id"],
                    _parsed(r["created_at"]),
                    r["step_type"],
                    r["status"],
                    r["checkpoint_id"],
                )
                for r in store.raw.query(
                    "SELECT execution_id, created_at, step_type, status, checkpoint_id"
                    " FROM {s}.checkpoints ORDER BY created_at, node_index, checkpoint_id"
                )
            ],
            pending=lambda: {
                r["execution_id"]
                for r in store.raw.query("SELECT execution_id FROM {s}.pending_interrupts")
            },
            store_args=["--store", store.dsn, "--pg-schema", store.schema],
            export_args=[
                "--store",
                store.dsn,
                "--pg-schema",
                store.schema,
                "--pg-app-schema",
                store.app_schema,
            ],
        )
    finally:
        checkpointer.close()


def newest_rows(fleet: Fleet) -> dict[str, tuple[datetime, str | None, str]]:
    newest: dict[str, tuple[datetime, str | None, str]] = {}
    for execution_id, at, step, status, _ in fleet.rows():
        newest[execution_id] = (at, step, status)
    return newest


def expected_attention(
    fleet: Fleet, now: datetime, stale_after: float, remind_after: float, quarantined: set[str]
) -> dict[str, set[str]]:
    """What the SDK's rows say needs a person, worked out from the rows themselves."""
    pending = fleet.pending()
    found: dict[str, set[str]] = {}
    for execution_id, (at, step, status) in newest_rows(fleet).items():
        age = (now - at).total_seconds()
        why = set()
        if step == "run_end" and status == "failed":
            why.add("failed")
        elif step != "run_end" and status == "interrupted":
            if execution_id not in pending:
                why.add("orphaned")
            elif age > remind_after:
                why.add("overdue")
        elif step != "run_end" and age > stale_after:
            why.add("stalled")
        if execution_id in quarantined:
            why.add("quarantined")
        if why:
            found[execution_id] = why
    return found


def orphan_and_quarantine(fleet: Fleet) -> tuple[str, str]:
    """A process claims a pause through the SDK and dies before it goes on; the plane
    refuses a row of a finished run."""
    orphan = fleet.ids(ORPHAN)
    assert fleet.checkpointer.delete_pending_interrupt_atomic(orphan) is not None
    quarantined = fleet.ids(QUARANTINE)
    row = next(r for r in fleet.rows() if r[0] == quarantined)
    fleet.checkpointer.mark_quarantined({row[4]: "state_snapshot over the plane's cap"})
    return orphan, quarantined


def walk_attention(client: TestClient) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every page of ``/attention.json``, following ``next``."""
    found: list[dict[str, Any]] = []
    url = "/attention.json"
    counts: dict[str, int] = {}
    while True:
        page = client.get(url).json()
        found.extend(page["runs"])
        counts = page["counts"]
        if page["next"] is None:
            return found, counts
        url = f"/attention.json?after={page['next']}"


def test_attention_lists_exactly_the_runs_the_sdk_rows_say(fleet: Fleet) -> None:
    orphan, quarantined = orphan_and_quarantine(fleet)
    seeded_at = max(at for at, _, _ in newest_rows(fleet).values())
    # A run that dies now: a cutoff between it and the seeded runs makes the seeded
    # crashes stalled and this one not yet.
    fresh = fleet.crash_one_more()
    newest = newest_rows(fleet)
    now = datetime.now(UTC)
    gap = (newest[fresh][0] - seeded_at).total_seconds()
    assert gap > 0.5, "the fresh crash was written as the seeded runs were"
    stale_after = (now - seeded_at).total_seconds() - gap / 2
    older = fleet.ids("crashed-in-tool")
    # Every pause counts as overdue at once; the page size makes the walk take pages.
    client = fleet.client(stale_after=stale_after, remind_after=0.0, page_size=2)

    runs, counts = walk_attention(client)

    expected = expected_attention(fleet, now, stale_after, 0.0, {quarantined})
    assert {r["execution_id"]: set(r["why"]) for r in runs} == expected
    assert expected[older] == {"stalled"} and fresh not in expected
    assert expected[orphan] == {"orphaned"}
    assert "quarantined" in expected[quarantined]
    assert len(runs) == len({r["execution_id"] for r in runs}), "a run listed twice"
    assert [r["since"] for r in runs] == sorted((r["since"] for r in runs), reverse=True)
    for reason in ("stalled", "failed", "orphaned", "overdue", "quarantined"):
        assert counts[reason] == sum(reason in why for why in expected.values()), reason
    assert counts["total"] == len(expected)
    stalled = next(r for r in runs if r["execution_id"] == older)
    assert stalled["checkpoint_id"] and stalled["url"].endswith(older)
    run_page = client.get(f"/runs/{older}.json").json()
    assert stalled["checkpoint_id"] == run_page["resume"]["checkpoint_id"]
    failed = next(r for r in runs if r["execution_id"] == fleet.ids("failed"))
    assert (failed["detail"] or "").startswith("error: ")


def test_attention_page_says_why_and_what_a_resume_does(fleet: Fleet) -> None:
    client = fleet.client(stale_after=0.0, remind_after=0.0)
    html = client.get("/attention").text
    crashed = fleet.ids("crashed-in-tool")
    page = client.get(f"/runs/{crashed}.json").json()
    assert f'id="attention-{crashed}"' in html
    assert "Resume re-invokes <code>refund</code>" in html
    assert page["resume"]["shape"] == "tool"
    # The nav badge counts them on every page.
    total = client.get("/attention.json").json()["counts"]["total"]
    assert text_of(client.get("/").text, "nav-attention") == str(total)


def metric_values(
    client: TestClient, **headers: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    values = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def test_metrics_agree_with_the_pages_counts(fleet: Fleet) -> None:
    orphan_and_quarantine(fleet)
    client = fleet.client(stale_after=0.0, remind_after=0.0)
    first = card(client, fleet.ids("paused-1"))
    assert decide(client, fleet.ids("paused-1"), first["checkpoint_id"]).status_code == 200
    third = card(client, fleet.ids("paused-3"))
    assert (
        decide(
            client, fleet.ids("paused-3"), third["checkpoint_id"], verb="reject", reason="no"
        ).status_code
        == 200
    )

    metrics = metric_values(client)
    runs_page = client.get("/runs.json").json()
    attention = client.get("/attention.json").json()["counts"]
    approvals = client.get("/approvals.json").json()
    decisions = client.get("/decisions.json").json()["decisions"]

    for state, n in runs_page["counts"].items():
        assert metrics[("localui_runs", (("state", state),))] == n, state
    assert metrics[("localui_pending_approvals", ())] == approvals["total"]
    assert metrics[("localui_stalled_runs", ())] == attention["stalled"]
    for reason in ("stalled", "failed", "orphaned", "overdue", "quarantined"):
        assert metrics[("localui_attention_runs", (("reason", reason),))] == attention[reason]
    assert (
        metrics[("localui_outbox_rows", (("state", "waiting"),))]
        == runs_page["totals"]["rows_waiting"]
    )
    assert (
        metrics[("localui_outbox_rows", (("state", "quarantined"),))]
        == runs_page["totals"]["rows_quarantined"]
        == 1
    )
    by_kind: dict[tuple[str, str], int] = {}
    for d in decisions:
        by_kind[(d["kind"], d["outcome"])] = by_kind.get((d["kind"], d["outcome"]), 0) + 1
    exposed = {
        dict(labels)["kind"] + "/" + dict(labels)["outcome"]: v
        for (name, labels), v in metrics.items()
        if name == "localui_decisions_total"
    }
    assert exposed == {f"{k}/{o}": n for (k, o), n in by_kind.items()}
    assert metrics[("localui_decision_latency_seconds_count", ())] == 2
    oldest = min(datetime.fromisoformat(a["created_at"]) for a in approvals["approvals"])
    age = (datetime.now(UTC) - oldest).total_seconds()
    assert 0 < metrics[("localui_oldest_pause_age_seconds", ())] <= age + 1
    # A second scrape counts nothing twice.
    again = metric_values(client)
    assert {k: v for k, v in again.items() if k[0] == "localui_decisions_total"} == {
        k: v for k, v in metrics.items() if k[0] == "localui_decisions_total"
    }
    assert again[("localui_request_duration_seconds_count", (("route", "decisions_json"),))] == 1


def test_metrics_answer_a_scraper_token_and_no_one_else(fleet: Fleet, tmp_path: Path) -> None:
    from helpers import sign_in_settings

    token_file = tmp_path / "scraper-token"
    token_file.write_text("the-scraper's-token\n")
    client = fleet.client(sign_in=sign_in_settings(), metrics_token_file=str(token_file))
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    scraped = client.get("/metrics", headers={"Authorization": "Bearer the-scraper's-token"})
    assert scraped.status_code == 200 and "localui_runs" in scraped.text
    # The scraper's token opens nothing else.
    assert (
        client.get(
            "/runs.json", headers={"Authorization": "Bearer the-scraper's-token"}
        ).status_code
        == 401
    )
    # A person signed in reads it too.
    from helpers import TEST_TOKEN

    assert (
        client.get("/metrics", headers={"Authorization": f"Bearer {TEST_TOKEN}"}).status_code == 200
    )


def make_decisions(fleet: Fleet, client: TestClient) -> list[str]:
    """An approval, a rejection and a resume, through the app as people make them."""
    first, third = fleet.ids("paused-1"), fleet.ids("paused-3")
    assert decide(client, first, card(client, first)["checkpoint_id"], approver="Ann").is_success
    assert decide(
        client,
        third,
        card(client, third)["checkpoint_id"],
        verb="reject",
        approver="Bob",
        reason="over budget",
    ).is_success
    crashed = fleet.ids("crashed-waiting-on-model")
    plan = client.get(f"/runs/{crashed}.json").json()["resume"]
    resumed = client.post(
        f"/runs/{crashed}/resume",
        data={"checkpoint_id": plan["checkpoint_id"], "actor": "Cy", "confirm": "yes"},
        headers=JSON,
    )
    assert resumed.status_code == 200, resumed.text
    return [first, third, crashed]


def test_the_decision_record_lists_filters_and_pages(fleet: Fleet) -> None:
    first, third, crashed = make_decisions(fleet, fleet.client())
    # A page of one entry, so every filter below is read across pages.
    client = fleet.client(page_size=1)

    entries, url = [], "/decisions.json"
    while url:
        page = client.get(url).json()
        entries.extend(page["decisions"])
        url = f"/decisions.json?after={page['next']}" if page["next"] else ""

    assert [e["execution_id"] for e in entries] == [crashed, third, first]
    assert [(e["kind"], e["approved"], e["approver"]) for e in entries] == [
        ("resume", None, "Cy"),
        ("approval", False, "Bob"),
        ("approval", True, "Ann"),
    ]
    assert {e["agent"] for e in entries} == {"refund-bot"}
    assert all(e["url"].endswith(e["execution_id"]) for e in entries)

    def ids(**filters: str) -> list[str]:
        query = "&".join(f"{k}={v}" for k, v in filters.items())
        found, url = [], f"/decisions.json?{query}"
        while url:
            page = client.get(url).json()
            found.extend(d["execution_id"] for d in page["decisions"])
            url = f"/decisions.json?{query}&after={page['next']}" if page["next"] else ""
        return found

    assert ids(approver="Bob") == [third]
    assert ids(kind="approval") == [third, first]
    assert ids(agent="refund-bot") == [crashed, third, first]
    assert ids(agent="no-such-agent") == []
    assert ids(outcome="completed") == [
        e["execution_id"] for e in entries if e["outcome"] == "completed"
    ]
    assert ids(since="1h") == [crashed, third, first]
    assert ids(until=entries[1]["decided_at"].replace("+", "%2B")) == [first]
    assert client.get("/decisions.json?since=yesterday").status_code == 400
    assert client.get("/decisions.json?after=bm90LWEtY3Vyc29y").status_code == 400
    html = client.get("/decisions?approver=Bob").text
    assert f'href="/runs/{third}"' in html and "over budget" in html


def test_csv_and_jsonl_exports_round_trip_the_record(fleet: Fleet) -> None:
    client = fleet.client()
    make_decisions(fleet, client)
    listed = client.get("/decisions.json").json()["decisions"]

    served = client.get("/decisions.csv")
    assert served.status_code == 200 and served.headers["content-type"].startswith("text/csv")
    from_csv = list(csv.DictReader(io.StringIO(served.text)))
    exported = subprocess.run(
        [
            sys.executable,
            "-m",
            "localui",
            "decisions",
            "export",
            *fleet.export_args,
            "--since",
            "1d",
            "--format",
            "jsonl",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert exported.returncode == 0, exported.stderr
    from_jsonl = [json.loads(line) for line in exported.stdout.splitlines()]
    cli_csv = subprocess.run(
        [sys.executable, "-m", "localui", "decisions", "export", *fleet.export_args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli_csv.returncode == 0, cli_csv.stderr

    def as_text(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    columns = list(from_csv[0].keys())
    assert [
        {k: as_text(e[k if k != "url" else "url"]) for k in columns} for e in listed
    ] == from_csv
    assert [{k: as_text(v) for k, v in row.items()} for row in from_jsonl] == from_csv
    assert list(csv.DictReader(io.StringIO(cli_csv.stdout))) == from_csv


def test_request_durations_are_a_cumulative_histogram_by_route() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from localui.metrics import RequestDurations

    durations = RequestDurations()
    for route, seconds in (("runs", 0.005), ("runs", 0.02), ("runs", 9.0), ("run", 0.001)):
        durations.observe(route, seconds)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(durations)
    text = generate_latest(registry).decode()

    [family] = list(text_string_to_metric_families(text))
    assert (family.name, family.type) == ("localui_request_duration_seconds", "histogram")
    samples = {(s.name, s.labels["route"], s.labels.get("le")): s.value for s in family.samples}
    runs = {le: v for (name, route, le), v in samples.items() if route == "runs" and le}
    # An answer that took exactly a bound is in that bucket (le: less or equal).
    assert runs == {"0.005": 1, "0.015": 1, "0.05": 2, "0.1": 2, "0.5": 2, "2.5": 2, "+Inf": 3}
    assert samples[("localui_request_duration_seconds_count", "runs", None)] == 3
    assert samples[("localui_request_duration_seconds_sum", "runs", None)] == pytest.approx(9.025)
    assert samples[("localui_request_duration_seconds_count", "run", None)] == 1
    assert "_created" not in text


def test_a_first_scrape_of_a_long_record_counts_each_entry_once_and_keeps_only_the_newest(
    store_copy: Path, raw: Callable[[Path], Raw], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server started on a record of a hundred thousand decisions folds them all at its
    first scrape: each is counted once, and what it keeps to skip those it may read
    again is only the entries near the newest (not every one it read, which held 5 MB
    at 100,000). The chunk is made small so a few dozen entries span several chunks."""
    from datetime import timedelta

    from localui import metrics
    from localui.backends.decisions import TABLE
    from localui.backends.sqlite.decisions import SQLiteDecisionLog
    from localui.backends.sqlite.store import SQLiteStore

    monkeypatch.setattr(metrics, "FOLD_CHUNK", 10)
    log = SQLiteDecisionLog(store_copy)
    store = SQLiteStore(store_copy, index_dir=store_copy.parent / "index")
    try:
        base = datetime.now(UTC) - timedelta(days=2)
        for i in range(35):
            at = (base + timedelta(minutes=i)).isoformat()
            raw(store_copy).execute(
                f"INSERT INTO {TABLE} (kind, execution_id, checkpoint_id, approved, actor,"
                " reason, decided_at, outcome, detail, finished_at)"
                " VALUES ('resume', ?, ?, NULL, 'ops', '', ?, ?, NULL, ?)",
                (f"run-{i}", f"row-{i}", at, ("completed", "failed")[i % 2], at),
            )
        tally = metrics.DecisionTally()
        tally.fold(log, store)
        assert tally.counts == {("resume", "completed"): 18, ("resume", "failed"): 17}
        # A minute apart, so only the newest is within the overlap read again; and the
        # table behind it never grew past a chunk's entries (a dict keeps its size).
        assert len(tally.recent) == 1
        assert sys.getsizeof(tally.recent) < sys.getsizeof({i: "" for i in range(11)})
        tally.fold(log, store)
        assert sum(tally.counts.values()) == 35
    finally:
        store.close()
        log.close()
