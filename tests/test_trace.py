"""The trace inside the run page: spans the SDK wrote while running the demo runs."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from conftest import ClientFactory, Seeded

from localui.backends.traces import SpanIndex
from localui.backends.traces.index import INDEXING
from localui.views.trace import NO_SPANS, TRACING_OFF


def run_json(client: object, execution_id: str) -> dict[str, object]:
    response = client.get(f"/runs/{execution_id}.json")  # type: ignore[attr-defined]
    assert response.status_code == 200, response.text
    page: dict[str, object] = response.json()
    return page


def test_completed_run_shows_its_input_answer_durations_tokens_and_waterfall(
    make_client: ClientFactory, app_store: Path, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    client = make_client(app_store)
    run_id = seeded.id("completed")
    trace = run_json(client, run_id)["trace"]
    assert isinstance(trace, dict)
    assert trace["traced"] is True
    assert trace["input"] == "Refund order A-1001 for 40.00"
    assert trace["answer"] == "Done: refunded 40.00 on A-1001."
    (attempt,) = trace["attempts"]
    assert attempt["kind"] == "first run"
    assert attempt["status"] == "completed"
    assert attempt["duration_ms"] is not None and attempt["duration_ms"] >= 0
    kinds = [(s["kind"], s["status"]) for s in attempt["steps"]]
    assert kinds == [("model", "ok"), ("tool", "ok"), ("model", "ok")]
    assert all(s["model"] == "refund-bot-demo" for s in attempt["steps"] if s["kind"] == "model")
    assert all(s["tokens_in"] is not None for s in attempt["steps"] if s["kind"] == "model")
    # Each call sits on the row the SDK wrote just before it.
    rows = {r["checkpoint_id"]: r for r in run_json(client, run_id)["rows"]}  # type: ignore[attr-defined]
    tool_step = attempt["steps"][1]
    assert rows[tool_step["checkpoint_id"]]["node_id"] == "turn:0/tool:refund"
    assert rows[tool_step["checkpoint_id"]]["calls"][0]["tool"] == "refund"
    html = client.get(f"/runs/{run_id}").text
    top = page_text(html, "trace")
    assert "Refund order A-1001 for 40.00" in top and "Done: refunded 40.00 on A-1001." in top
    assert '<svg class="waterfall"' in html and html.count("<rect ") == 3
    assert " style=" not in html  # the CSP forbids inline styles
    assert "tokens in" in page_text(html, "timeline")


def test_resumed_run_shows_two_attempts_and_who_resumed_it(
    make_client: ClientFactory, app_store: Path, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    client = make_client(app_store)
    run_id = seeded.id("idempotent-resumed")
    trace = run_json(client, run_id)["trace"]
    assert isinstance(trace, dict)
    first, resume = trace["attempts"]
    assert first["kind"] == "first run" and first["status"] == "paused"
    assert [s["status"] for s in first["steps"]] == ["ok", "paused"]
    assert "InterruptSignal" in first["steps"][1]["error"]
    assert resume["kind"] == "resume"
    assert resume["resume_node"] == "turn:0/tool:refund"
    assert resume["resumed_by"] == "demo-seed" and resume["approved"] is True
    assert trace["answer"] == "Done: refunded 450.00 on A-1009."
    html = client.get(f"/runs/{run_id}").text
    marker = "Attempt 2: resume at turn:0/tool:refund, approved by demo-seed"
    assert marker in page_text(html, "trace")
    # The timeline marks the row the resume re-entered at.
    rows = run_json(client, run_id)["rows"]
    assert isinstance(rows, list)
    (marked,) = [r for r in rows if r["reentry"]]
    assert marked["reentry"] == marker
    assert marker in page_text(html, f"reentry-{marked['checkpoint_id']}")


def test_fork_is_an_attempt_of_its_own_run(
    make_client: ClientFactory, app_store: Path, seeded: Seeded
) -> None:
    client = make_client(app_store)
    trace = run_json(client, seeded.id("fork-of-completed"))["trace"]
    assert isinstance(trace, dict)
    assert [a["kind"] for a in trace["attempts"]] == ["fork"]
    assert trace["answer"] == "Done: refunded 40.00 on A-1001."


def test_crashed_run_says_it_left_no_spans(
    make_client: ClientFactory, app_store: Path, seeded: Seeded
) -> None:
    client = make_client(app_store)
    trace = run_json(client, seeded.id("crashed-in-tool"))["trace"]
    assert trace == {
        "traced": True,
        "input": None,
        "answer": None,
        "attempts": [],
        "note": NO_SPANS,
    }


def test_store_without_spans_says_tracing_was_off(
    make_client: ClientFactory, store_copy: Path, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    with sqlite3.connect(store_copy) as conn:
        conn.execute("DROP TABLE spans")
    client = make_client(store_copy)
    run_id = seeded.id("completed")
    trace = run_json(client, run_id)["trace"]
    assert isinstance(trace, dict)
    assert trace["traced"] is False and trace["note"] == TRACING_OFF
    assert "FASTAIAGENT_TRACE_ENABLED=true" in page_text(
        client.get(f"/runs/{run_id}").text, "trace"
    )


def test_traces_option_reads_spans_from_another_file(
    make_client: ClientFactory, store_copy: Path, seeded: Seeded, tmp_path: Path
) -> None:
    """A PostgreSQL store's agents trace into a SQLite file of their own: ``--traces``."""
    traces = tmp_path / "traces.db"
    with sqlite3.connect(store_copy) as conn:
        conn.execute("ATTACH DATABASE ? AS t", (str(traces),))
        conn.execute("CREATE TABLE t.spans AS SELECT * FROM spans")
        conn.execute("DELETE FROM spans")
    plain = make_client(store_copy)
    assert run_json(plain, seeded.id("completed"))["trace"]["attempts"] == []  # type: ignore[index]
    client = make_client(store_copy, traces=str(traces))
    trace = run_json(client, seeded.id("completed"))["trace"]
    assert trace["answer"] == "Done: refunded 40.00 on A-1001."  # type: ignore[index]


def test_malformed_spans_render_and_new_spans_are_folded_in(
    make_client: ClientFactory, store_copy: Path, seeded: Seeded, tmp_path: Path
) -> None:
    """Hand-built spans the SDK cannot write: attributes that are not JSON, an agent
    span without an execution id; and spans written after the index was built."""
    run_id = seeded.id("completed")
    index = SpanIndex(store_copy, index_dir=tmp_path / "idx")
    try:
        before = index.attempts(run_id)
        assert before is not None and len(before) == 1
        with sqlite3.connect(store_copy) as conn:
            # The SDK's search trigger refuses malformed JSON; an older SDK's table,
            # or another writer's, has no such trigger.
            conn.execute("DROP TRIGGER spans_fts_ai")
            conn.executemany(
                "INSERT INTO spans (span_id, trace_id, parent_span_id, name, start_time,"
                " end_time, status, attributes, events) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    ("bad-agent", "tr-bad", None, "agent.x", "x", None, "OK", "{not json", "[]"),
                    ("anon", "tr-anon", None, "agent.x", None, None, "OK", "{}", "oops"),
                    (
                        "again",
                        "tr-again",
                        None,
                        "agent.refund-bot",
                        "2999-01-01T00:00:00+00:00",
                        "2999-01-01T00:00:01+00:00",
                        "OK",
                        json.dumps({"agent.execution_id": run_id, "agent.output": "later"}),
                        "[]",
                    ),
                    (
                        "child",
                        "tr-again",
                        "again",
                        "tool.refund",
                        "nope",
                        None,
                        "ERROR",
                        "[1]",
                        "[]",
                    ),
                ],
            )
        after = index.attempts(run_id)
        assert after is not None and len(after) == 2
        assert after[1].children[0].unreadable
    finally:
        index.close()
    client = make_client(store_copy)
    trace = run_json(client, run_id)["trace"]
    assert trace["answer"] == "later"  # type: ignore[index]
    step = trace["attempts"][1]["steps"][0]  # type: ignore[index]
    assert step["status"] == "error" and "unreadable" in step["error"]
    assert client.get(f"/runs/{run_id}").status_code == 200


def test_runs_list_tells_each_runs_story(
    make_client: ClientFactory, app_store: Path, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    client = make_client(app_store)
    rows = {r["execution_id"]: r for r in client.get("/runs.json").json()["runs"]}
    completed = rows[seeded.id("completed")]
    assert completed["input"] == "Refund order A-1001 for 40.00"
    assert completed["outcome"] == "Done: refunded 40.00 on A-1001."
    assert isinstance(completed["duration_ms"], int) and completed["duration_ms"] >= 0
    paused = rows[seeded.id("paused-1")]
    assert paused["outcome"] == "waiting for approval: manager_approval"
    failed = rows[seeded.id("failed")]
    assert failed["outcome"].startswith("error: ")
    html = client.get("/").text
    row_id = f"run-{seeded.id('paused-1')}"
    text = page_text(html, row_id)
    assert seeded.id("paused-1")[:8] in text and seeded.id("paused-1") not in text
    # The full id is on hover, the paused row links to its card, times are short.
    assert f'title="{seeded.id("paused-1")}"' in html
    assert f'href="/approvals/{seeded.id("paused-1")}"' in html
    assert "(UTC)" in html and ".000" not in text


def test_a_rejecting_resume_in_the_trace_names_who_rejected_it_on_the_run_page(
    make_client: ClientFactory, store_copy: Path, seeded: Seeded
) -> None:
    """The in-process SDK runs with tracing off in tests, so the rejecting resume's
    agent span is written by hand, with the attributes the SDK gives one. The runs
    list reads decisions from the decision record only (test_backends), so here it
    shows the answer and no second account of who decided."""
    run_id = seeded.id("completed")
    with sqlite3.connect(store_copy) as conn:
        conn.execute(
            "INSERT INTO spans (span_id, trace_id, parent_span_id, name, start_time, end_time,"
            " status, attributes, events) VALUES (?, ?, NULL, ?, ?, ?, 'OK', ?, '[]')",
            (
                "reject-1",
                "tr-reject",
                "agent.refund-bot",
                "2999-01-01T00:00:00+00:00",
                "2999-01-01T00:00:01+00:00",
                json.dumps(
                    {
                        "agent.execution_id": run_id,
                        "agent.resumed_execution_id": run_id,
                        "agent.resume.approved": False,
                        "agent.resume.resolver": "ann",
                        "agent.output": "Refund not made.",
                    }
                ),
            ),
        )
    client = make_client(store_copy)
    rows = {r["execution_id"]: r for r in client.get("/runs.json").json()["runs"]}
    assert rows[run_id]["outcome"] == "Refund not made."
    assert rows[run_id]["decided"] is None
    text = client.get(f"/runs/{run_id}").text
    assert "Attempt 2: resume, rejected by ann" in text


def test_timeline_reads_without_markup_and_explains_its_words(
    client: object, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    for scenario in ("paused-1", "crashed-in-tool", "fork-of-completed"):
        html = client.get(f"/runs/{seeded.id(scenario)}").text  # type: ignore[attr-defined]
        verdict = page_text(html, "verdict")
        assert "`" not in verdict, verdict
        if scenario != "fork-of-completed":
            # Node ids and tool names are set as code instead.
            assert "<code>" in html.split('id="verdict"', 1)[1].split("</section>", 1)[0]
        legend = page_text(html, "legend")
        for word in ("outbox", "waiting", "quarantined", "fork origin", "orphaned", "unfinished"):
            assert word in legend
    listing = client.get("/").text  # type: ignore[attr-defined]
    assert "orphaned" in page_text(listing, "legend")


def test_code_spans_escape_what_the_store_wrote() -> None:
    from localui.views.markup import code_spans

    assert str(code_spans("at `<b>x</b>` & `y`")) == (
        "at <code>&lt;b&gt;x&lt;/b&gt;</code> &amp; <code>y</code>"
    )


def test_a_replaced_trace_file_is_indexed_again(
    copy_store: Callable[[], Path], seeded: Seeded, tmp_path: Path
) -> None:
    first, second = copy_store(), copy_store()
    with sqlite3.connect(second) as conn:
        conn.execute("DELETE FROM spans")
    index = SpanIndex(first, index_dir=tmp_path / "idx")
    try:
        assert index.attempts(seeded.id("completed"))
        # Replaced as a new store would be: the old file's WAL files go with it.
        for suffix in ("", "-wal", "-shm"):
            Path(f"{first}{suffix}").unlink(missing_ok=True)
            if Path(f"{second}{suffix}").exists():
                Path(f"{second}{suffix}").replace(f"{first}{suffix}")
        assert index.attempts(seeded.id("completed")) == ()
    finally:
        index.close()


def test_a_large_backlog_is_indexed_in_the_background(
    store_copy: Path, seeded: Seeded, tmp_path: Path
) -> None:
    """Pages answer at once, without spans, while a large store's spans are first read."""
    index = SpanIndex(store_copy, index_dir=tmp_path / "idx", background_from=0)
    try:
        assert index.attempts(seeded.id("completed")) == ()
        index.wait(timeout=30)
        assert not index.indexing
        (attempt,) = index.attempts(seeded.id("completed")) or ()
        assert attempt.root.text("agent.output") == "Done: refunded 40.00 on A-1001."
    finally:
        index.close()


def test_pages_do_not_wait_for_a_batch_being_folded(
    store_copy: Path, seeded: Seeded, tmp_path: Path
) -> None:
    """While a large backlog is folded a batch at a time, under the index's lock, a page
    answers at once without spans instead of waiting for the batch."""
    import threading

    index = SpanIndex(store_copy, index_dir=tmp_path / "idx", background_from=0)
    run = seeded.id("completed")
    try:
        with index.lock:
            # What a page's first look does under the lock: it starts the fold, whose
            # first batch then waits for the lock, held here as a batch holds it.
            assert index._refresh() == INDEXING
            assert index.indexing
            answers: list[object] = []
            looking = threading.Thread(
                target=lambda: answers.extend(
                    [index.summaries([run]), index.attempts(run), index.resolutions(run)]
                )
            )
            looking.start()
            looking.join(timeout=5)
            assert not looking.is_alive(), "a page waited for the batch being folded"
        assert answers == [{}, (), ()]
        index.wait(timeout=30)
        assert run in (index.summaries([run]) or {})
    finally:
        index.close()


def test_the_runs_list_outcome_says_who_decided_and_then_what_the_run_answered() -> None:
    from localui.backends.traces import RunSummary
    from localui.records import RunFacts
    from localui.views.runs import outcome_of

    facts = RunFacts(
        execution_id="r1",
        agent="refund-bot",
        row_count=5,
        first_at="2026-01-01T00:00:00+00:00",
        last_at="2026-01-01T00:00:09+00:00",
        last_checkpoint_id="c5",
        last_node_id="run_end",
        last_step_type="run_end",
        last_status="completed",
        has_pending=False,
        pending_reason=None,
        fork_parent_checkpoint_id=None,
        rows_waiting=0,
        rows_quarantined=0,
    )
    answered = RunSummary("Refund A-1", "Refund not made.\nMore.", None, None, None)
    decided = "rejected by Ann: too large"
    assert outcome_of("completed", facts, answered, decided) == f"{decided} — Refund not made."
    assert outcome_of("completed", facts, None, decided) == decided
    assert outcome_of("completed", facts, answered, None) == "Refund not made."
    failed = RunSummary("Refund A-1", None, "model down", None, None)
    assert outcome_of("failed", facts, failed, None) == "error: model down"
    waiting = replace(facts, has_pending=True, pending_reason="manager_approval")
    assert outcome_of("paused", waiting, answered, None) == "waiting for approval: manager_approval"
