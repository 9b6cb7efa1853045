"""Two runs side by side (``/compare``), on runs the real SDK wrote, on both backends.

A fork beside its source (the origin row beside the row it branched from, the
source's earlier rows its history), two runs of one agent, a run beside itself,
two chain runs and a chain forked with a changed state; the errors; the JSON's
shape; what the page folds and opens; and the two ways people get there (the runs
list's boxes, a fork's "Compare with its source").
"""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from conftest import (
    BASE_URL,
    PgRaw,
    PgSeeded,
    PgStore,
    Seeded,
    pg_name,
)
from helpers import LOOPBACK_CLIENT, NO_SIGN_IN
from starlette.testclient import TestClient

from localui import compare
from localui.app import create_app
from localui.demo import teams
from localui.demo.scenarios import ALL_SCENARIOS, seed
from localui.records import RowHeader
from localui.settings import Settings

JSON = {"accept": "application/json"}


@dataclass(frozen=True, slots=True)
class Served:
    """The seeded refund-bot runs served by the app, on one backend."""

    client: TestClient
    id: Callable[[str], str]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, seeded: Seeded) -> Served:
    if request.param == "sqlite":
        return Served(client=request.getfixturevalue("client"), id=seeded.id)
    pg_seeded: PgSeeded = request.getfixturevalue("pg_seeded")
    pg_store: PgStore = request.getfixturevalue("pg_store")
    make: Callable[..., TestClient] = request.getfixturevalue("make_pg_client")
    return Served(client=make(pg_store, agents=[]), id=pg_seeded.id)


def compared(client: TestClient, a: str, b: str, **query: Any) -> dict[str, Any]:
    response = client.get("/compare.json", params={"a": a, "b": b, **query})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def nodes(body: dict[str, Any], side: str) -> list[str | None]:
    return [p[side]["node_id"] if p[side] else None for p in body["pairs"]]


# --- what the comparison says --------------------------------------------------------


def test_a_fork_beside_its_source(served: Served) -> None:
    """The demo's fork re-ran the source's last turn with no new input: its origin sits
    beside the row it names, its re-run of that turn beside the same row, and the
    model answered as before, so nothing differs."""
    source, fork = served.id("completed"), served.id("fork-of-completed")
    body = compared(served.client, source, fork)
    pairs = body["pairs"]
    kinds = [p["kind"] for p in pairs]
    assert kinds.count("origin") == 1
    at = kinds.index("origin")
    origin = pairs[at]
    assert origin["b"]["node_id"] == "__fork_origin__"
    assert origin["b"]["step_type"] == "fork_origin"
    # The origin pairs with the source row it branched from, and carries its state.
    fork_json = served.client.get(f"/runs/{fork}.json").json()
    assert origin["a"]["checkpoint_id"] == fork_json["fork_of"]["source_checkpoint_id"]
    assert origin["differs"] is False
    # The source's rows before it are the fork's history: B has none of them, and
    # none of them is a difference.
    assert at > 0
    assert all(p["kind"] == "inherited" and p["b"] is None for p in pairs[:at])
    # The branch wrote the turn it re-entered again: beside the same source row.
    again = pairs[at + 1]
    assert again["a"]["checkpoint_id"] == origin["a"]["checkpoint_id"]
    assert again["b"]["node_id"] == origin["a"]["node_id"]
    assert nodes(body, "a")[-1] == nodes(body, "b")[-1] == "run_end"
    assert body["first_difference"] is None
    assert body["a"]["execution_id"] == source and body["b"]["execution_id"] == fork
    assert body["b"]["fork_of"] == source and body["a"]["fork_of"] is None
    # The same runs the other way round align the same steps, sides swapped.
    swapped = compared(served.client, fork, source)
    flip = {"only_a": "only_b", "only_b": "only_a"}
    assert [flip.get(p["kind"], p["kind"]) for p in swapped["pairs"]] == kinds
    assert nodes(swapped, "b") == nodes(body, "a")
    assert nodes(swapped, "a") == nodes(body, "b")


def test_two_runs_of_one_agent_align_turn_by_turn(served: Served) -> None:
    a, b = served.id("completed"), served.id("idempotent-resumed")
    body = compared(served.client, a, b)
    pairs = body["pairs"]
    # Both start at turn 0, and the steps both have pair up by node id and step.
    assert pairs[0]["a"]["node_id"] == pairs[0]["b"]["node_id"] == "turn:0"
    for pair in pairs:
        if pair["a"] and pair["b"] and pair["kind"] == "step":
            assert pair["a"]["node_id"] == pair["b"]["node_id"], pair
    assert nodes(body, "a")[-1] == nodes(body, "b")[-1] == "run_end"
    # Different requests: the conversations differ from the first turn on.
    assert body["first_difference"] == 0
    first = pairs[0]
    assert first["differs"] is True
    snapshot = next(s for s in first["sections"] if s["name"] == "state_snapshot")
    assert not snapshot["same"]
    assert any("A-1001" in str(c["old"]) for c in snapshot["changes"]), snapshot["changes"]


def test_a_run_beside_itself_is_the_same_throughout(served: Served) -> None:
    run = served.id("idempotent-resumed")
    body = compared(served.client, run, run)
    assert body["first_difference"] is None
    assert body["pairs"] and not any(p["differs"] for p in body["pairs"])
    assert all(p["a"]["checkpoint_id"] == p["b"]["checkpoint_id"] for p in body["pairs"])
    page = served.client.get("/compare", params={"a": run, "b": run}).text
    assert "step for step the same" in page
    assert '<details class="compare-pair' not in page
    assert 'id="first-difference-link"' not in page


def test_the_json_names_both_rows_of_every_pair(served: Served) -> None:
    a, b = served.id("completed"), served.id("paused-1")
    response = served.client.get(f"/compare.json?a={a}&b={b}")
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert {"a", "b", "pairs", "first_difference"} <= body.keys()
    for run, side in ((a, body["a"]), (b, body["b"])):
        assert side["execution_id"] == run
        assert {"state", "agent", "rows", "answer", "duration_ms", "tokens"} <= side.keys()
    assert body["a"]["state"] == "completed" and body["b"]["state"] == "paused"
    one_sided = 0
    for n, pair in enumerate(body["pairs"]):
        assert pair["index"] == n
        assert isinstance(pair["differs"], bool)
        for side in ("a", "b"):
            if pair[side] is None:
                one_sided += 1
                assert pair["differs"] is True
            else:
                assert {"checkpoint_id", "node_id", "step_type", "status"} <= pair[side].keys()
    # The paused run has no run_end; the completed one has: a step only A has.
    assert one_sided >= 1
    ended = [p for p in body["pairs"] if p["a"] and p["a"]["node_id"] == "run_end"]
    assert [p["kind"] for p in ended] == ["only_a"]
    assert any(p["b"] and p["b"]["status"] == "interrupted" for p in body["pairs"])
    # The same through Accept.
    assert served.client.get(f"/compare?a={a}&b={b}", headers=JSON).json() == body


def test_unknown_runs_and_missing_or_bad_parameters(served: Served) -> None:
    client, run = served.client, served.id("completed")
    missing = client.get("/compare.json", params={"a": run, "b": "no-such-run"})
    assert missing.status_code == 404
    assert "b: no run with execution id 'no-such-run'" in missing.json()["error"]["message"]
    assert client.get("/compare", params={"a": "nope", "b": run}).status_code == 404
    for query in ({}, {"a": run}, {"b": run}, {"a": " ", "b": run}):
        response = client.get("/compare.json", params=query)
        assert response.status_code == 400, query
        assert "Pick two runs to compare" in response.json()["error"]["message"]
    for bad in ("-1", "x", "1e3", "²"):
        response = client.get("/compare.json", params={"a": run, "b": run, "from": bad})
        assert response.status_code == 400, bad
    one = client.get("/compare.json", params={"run": run})
    assert one.status_code == 400 and "exactly two" in one.json()["error"]["message"]
    odd = client.get("/compare.json", params={"a": "\x00", "b": "王/..?#%"})
    assert odd.status_code == 404


# --- how people get there -------------------------------------------------------------


def test_the_runs_list_compares_two_ticked_runs(served: Served) -> None:
    client = served.client
    a, b = served.id("completed"), served.id("failed")
    page = client.get("/").text
    (action,) = re.findall(r'<form id="compare-form"[^>]*action="([^"]+)"', page)
    assert 'method="get"' in re.search(r'<form id="compare-form"[^>]*>', page).group(0)  # type: ignore[union-attr]
    boxes = re.findall(
        r'<input type="checkbox" name="run" value="([^"]+)" form="compare-form"', page
    )
    assert {a, b} <= {html.unescape(v) for v in boxes}
    # What the browser sends when two boxes are ticked and Compare is pressed.
    answer = client.get(
        html.unescape(action), params=[("run", a), ("run", b)], follow_redirects=False
    )
    assert answer.status_code == 303
    query = parse_qs(urlsplit(answer.headers["location"]).query)
    assert query == {"a": [a], "b": [b]}
    opened = client.get(answer.headers["location"])
    assert opened.status_code == 200 and "Compare" in opened.text


def test_a_fork_page_links_to_its_comparison_with_its_source(served: Served) -> None:
    client = served.client
    source, fork = served.id("completed"), served.id("fork-of-completed")
    page = client.get(f"/runs/{fork}").text
    (link,) = re.findall(
        r'<a href="([^"]+)" id="compare-with-source">Compare with its source', page
    )
    link = html.unescape(link)
    assert parse_qs(urlsplit(link).query) == {"a": [source], "b": [fork]}
    assert client.get(link).status_code == 200
    # The source lists its forks, each with the same comparison.
    source_page = client.get(f"/runs/{source}").text
    assert html.escape(link) in source_page or link in html.unescape(source_page)


# --- chains: node by node, and a fork with a changed state -----------------------------

#: Two chain runs, and a fork with a new input from a finished run's second turn.
SHAPES = ("chain-paused", "chain-crashed", "completed", "fork-failed")
SHAPE_SCENARIOS = tuple(s for s in ALL_SCENARIOS if s.name in SHAPES)


@dataclass(frozen=True, slots=True)
class Chains:
    client: TestClient
    paused: str
    crashed: str
    fork: str
    id: Callable[[str], str]


def _fork_chain(checkpointer: Any, execution_id: str, rows: tuple[RowHeader, ...]) -> str:
    """The paused chain forked from its first node with another order id."""
    first = next(r for r in rows if r.node_id == "step_1_lookup")
    chain = teams.build_chain(checkpointer)
    result = asyncio.run(
        chain.afork(
            execution_id, checkpoint_id=first.checkpoint_id, modified_state={"order_id": "X-99"}
        )
    )
    return str(result.execution_id)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def chains(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Chains]:
    if request.param == "sqlite":
        from fastaiagent.checkpointers import SQLiteCheckpointer

        path = tmp_path_factory.mktemp("chains") / "local.db"
        report = seed(path, scenarios=SHAPE_SCENARIOS)
        settings = Settings(store=str(path), sign_in=NO_SIGN_IN)
        checkpointer: Any = SQLiteCheckpointer(str(path))
        cleanup: Callable[[], None] = lambda: None  # noqa: E731
    else:
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        dsn: str = request.getfixturevalue("pg_dsn")
        schema, app_schema = pg_name("fastaiagent_chains"), pg_name("localui")
        report = seed(dsn, pg_schema=schema, scenarios=SHAPE_SCENARIOS)
        settings = PgStore(dsn, schema, app_schema).settings()
        checkpointer = PostgresCheckpointer(dsn, schema=schema)

        def cleanup() -> None:
            PgRaw(dsn, schema).drop()
            PgRaw(dsn, app_schema).drop()

    try:
        app = create_app(settings)
        with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
            paused = report.run_id("chain-paused")
            rows = app.state.localui.store.list_rows(paused)
            fork = _fork_chain(checkpointer, paused, rows)
            yield Chains(client, paused, report.run_id("chain-crashed"), fork, report.run_id)
    finally:
        checkpointer.close()
        cleanup()


def test_two_chain_runs_align_node_by_node(chains: Chains) -> None:
    body = compared(chains.client, chains.paused, chains.crashed)
    paired = [p for p in body["pairs"] if p["a"] and p["b"]]
    assert paired and all(p["a"]["node_id"] == p["b"]["node_id"] for p in paired)
    assert nodes(body, "a")[0] == "step_1_lookup"
    assert body["first_difference"] is not None


def test_a_chain_fork_with_a_changed_state_differs_at_its_origin(chains: Chains) -> None:
    body = compared(chains.client, chains.paused, chains.fork)
    pairs = body["pairs"]
    origin = next(p for p in pairs if p["kind"] == "origin")
    assert origin["a"]["node_id"] == "step_1_lookup"
    assert origin["b"]["node_id"] == "__fork_origin__"
    # The origin carries the changed state: that is where the branch went its own way.
    assert origin["differs"] is True
    assert body["first_difference"] == origin["index"] == 0
    snapshot = next(s for s in origin["sections"] if s["name"] == "state_snapshot")
    assert any(c["path"] == "order_id" and c["new"] == "X-99" for c in snapshot["changes"])
    # After it, the chain's next node pairs with the source's.
    after = pairs[origin["index"] + 1]
    assert after["a"]["node_id"] == after["b"]["node_id"] == "step_2_plan"
    page = chains.client.get("/compare", params={"a": chains.paused, "b": chains.fork}).text
    assert "X-99" in page


def test_a_fork_with_a_new_input_differs_just_after_its_origin(
    chains: Chains, page_text: Callable[..., str]
) -> None:
    """``fork-failed`` asked the finished run's second turn a new request: a fresh
    conversation, so the branch starts again at turn 0 and its model call fails."""
    source, fork = chains.id("completed"), chains.id("fork-failed")
    body = compared(chains.client, source, fork)
    pairs = body["pairs"]
    at = next(p["index"] for p in pairs if p["kind"] == "origin")
    assert pairs[at]["a"]["node_id"] == "turn:1" and not pairs[at]["differs"]
    assert all(p["kind"] == "inherited" for p in pairs[:at])
    # Where the branch went its own way: a turn 0 of its own, right after the origin.
    assert body["first_difference"] == at + 1
    assert pairs[at + 1]["b"]["node_id"] == "turn:0"
    assert body["b"]["state"] == "failed" and body["a"]["state"] == "completed"
    # Both runs ended, one completed and one failed: their end rows differ, and say how.
    ends = pairs[-1]
    assert ends["a"]["node_id"] == ends["b"]["node_id"] == "run_end"
    assert ends["differs"] and ends["summary"].startswith("Status completed → failed.")
    assert any(not s["same"] for s in ends["sections"])

    page = chains.client.get("/compare", params={"a": source, "b": fork}).text
    first = body["first_difference"]
    # The history and the origin, the same on both sides, are folded shut.
    folded = re.search(r'<details class="compare-same">\s*<summary>([^<]*)</summary>', page)
    assert folded is not None and folded.group(1).startswith(f"{at + 1} identical steps")
    # The first difference is open, with an id the link on top goes to.
    assert re.search(rf'<details class="compare-pair differs" id="pair-{first}" open>', page)
    assert len(re.findall(r'<details class="compare-pair differs" id="pair-\d+" open>', page)) == 1
    (link,) = re.findall(r'href="([^"]+)" id="first-difference-link"', page)
    assert html.unescape(link).endswith(f"#pair-{first}")
    runs_table = page_text(page, "compare-runs")
    assert "completed" in runs_table and "failed" in runs_table
    assert f"first differ at step {first + 1}" in page_text(page, "compare-summary")


def test_the_page_diffs_the_pair_it_opens_and_the_others_when_opened(chains: Chains) -> None:
    """Each other pair that differs is shown closed, undiffed, and loads when opened
    the differences the JSON gives it; its link opened by itself is the diff page."""
    source, fork = chains.id("completed"), chains.id("fork-failed")
    body = compared(chains.client, source, fork)
    first = body["first_difference"]
    page = chains.client.get("/compare", params={"a": source, "b": fork}).text
    closed = re.findall(
        r'<details class="compare-pair differs" id="pair-(\d+)" hx-get="([^"]+)"'
        r' hx-trigger="toggle once" hx-target="find .pair-body"',
        page,
    )
    later = [
        p["index"]
        for p in body["pairs"]
        if p["differs"] and p["a"] and p["b"] and p["index"] != first
    ]
    assert later and [int(i) for i, _ in closed] == later
    # Only the open pair's differences are in the page.
    assert page.count('<p class="diff-summary diff-changed">') == 1
    assert len(re.findall(r'<section class="diff-section[^"]*" id="pair-(\d+)-', page)) == len(
        body["pairs"][first]["sections"]
    )
    ends = body["pairs"][-1]
    assert ends["index"] in later and ends["summary"].startswith("Status completed → failed.")
    (url,) = [html.unescape(u) for i, u in closed if int(i) == ends["index"]]
    opened = chains.client.get(url, headers={"HX-Request": "true"})
    assert opened.status_code == 200, opened.text
    assert "<html" not in opened.text
    text = html.unescape(opened.text)
    assert f'<p class="diff-summary diff-changed">{ends["summary"]}</p>' in text
    for section in ends["sections"]:
        assert f'id="pair-{ends["index"]}-{section["name"]}"' in opened.text
        for change in section["changes"]:
            assert str(change["path"]) in text
    # The link opened by itself (a new tab, no htmx): the two rows' diff page.
    plain = chains.client.get(url, follow_redirects=False)
    assert plain.status_code == 303
    target = urlsplit(plain.headers["location"])
    assert target.path == "/diff"
    assert parse_qs(target.query) == {
        "a": [ends["a"]["checkpoint_id"]],
        "b": [ends["b"]["checkpoint_id"]],
    }
    # Bad links get a clear error, as a fragment for the pair it was opened in.
    hx = {"HX-Request": "true"}
    a_row, b_row = ends["a"]["checkpoint_id"], ends["b"]["checkpoint_id"]
    gone = chains.client.get(
        "/compare/pair", params={"a": a_row, "b": "no-such-row", "pair": 3}, headers=hx
    )
    assert gone.status_code == 404 and "no-such-row" in html.unescape(gone.text)
    missing = chains.client.get("/compare/pair", params={"a": a_row}, headers=hx)
    assert missing.status_code == 400 and "b missing" in missing.text
    bad = chains.client.get(
        "/compare/pair", params={"a": a_row, "b": b_row, "pair": "x"}, headers=hx
    )
    assert bad.status_code == 400 and "pair" in bad.text


def test_the_page_reads_each_row_once(chains: Chains, monkeypatch: pytest.MonkeyPatch) -> None:
    """The open pair's rows are read for its diff only where the rows read to tell the
    pairs apart did not hold them: a fork's origin is told apart by its payloads, so
    the first read has both rows and they are not read again."""
    app: Any = chains.client.app
    store = app.state.localui.store
    asked: list[str] = []
    get_rows = store.get_rows

    def recording(ids: list[str]) -> Any:
        asked.extend(ids)
        return get_rows(ids)

    monkeypatch.setattr(store, "get_rows", recording)
    for a, b in (
        (chains.paused, chains.fork),
        (chains.paused, chains.crashed),
        (chains.id("completed"), chains.id("fork-failed")),
    ):
        asked.clear()
        page = chains.client.get("/compare", params={"a": a, "b": b})
        assert page.status_code == 200, page.text
        assert len(asked) == len(set(asked)), (a, b, asked)
        body = compared(chains.client, a, b)
        first = body["pairs"][body["first_difference"]]
        opened = rf'<details class="compare-pair differs" id="pair-{first["index"]}" open>'
        assert re.search(opened, page.text)
        if first["a"] and first["b"]:
            # The open pair was diffed from rows read for the page.
            assert {first["a"]["checkpoint_id"], first["b"]["checkpoint_id"]} <= set(asked)


def test_long_comparisons_come_a_window_at_a_time(
    chains: Chains, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localui.views import compare as compare_views

    monkeypatch.setattr(compare_views, "COMPARE_PAIRS", 2)
    monkeypatch.setattr(compare_views, "SCAN_CHUNK", 1)
    source, fork = chains.id("completed"), chains.id("fork-failed")
    first = compared(chains.client, source, fork)
    assert [p["index"] for p in first["pairs"]] == [0, 1]
    assert not any(p["differs"] for p in first["pairs"])
    # The first difference lies past the window shown: found, and linked with its window.
    found = first["first_difference"]
    assert found is not None and found >= 2
    later = compared(chains.client, source, fork, **{"from": found})
    assert later["pairs"][0]["index"] == found and later["pairs"][0]["differs"]
    assert later["first_difference"] == found
    assert later["window"]["earlier_url"] is not None
    past = compared(chains.client, source, fork, **{"from": 10**6})
    assert past["pairs"] and past["window"]["later_url"] is None
    page = chains.client.get("/compare", params={"a": source, "b": fork}).text
    (link,) = re.findall(r'href="([^"]+)" id="first-difference-link"', page)
    query = parse_qs(urlsplit(html.unescape(link)).query)
    assert int(query["from"][0]) <= found < int(query["from"][0]) + 2


# --- the alignment by itself ------------------------------------------------------------


def _row(cid: str, node: str, step: str | None, parent: str | None = None) -> RowHeader:
    return RowHeader(
        checkpoint_id=cid,
        execution_id="r",
        parent_checkpoint_id=parent,
        agent="bot",
        node_id=node,
        node_index=0,
        step_type=step,
        status="completed",
        interrupt_reason=None,
        agent_path=None,
        created_at="2026-01-01T00:00:00+00:00",
        synced=None,
        sync_error=None,
    )


def test_alignment_pairs_equal_steps_and_leaves_the_rest_one_sided() -> None:
    a = [_row("a0", "turn:0", "llm_call"), _row("a1", "turn:0/tool:x", "tool_call")]
    a.append(_row("a2", "run_end", "run_end"))
    b = [_row("b0", "turn:0", "llm_call"), _row("b1", "run_end", "run_end")]
    pairs = compare.align(a, b)
    assert [(p.kind, p.a and p.a.checkpoint_id, p.b and p.b.checkpoint_id) for p in pairs] == [
        ("step", "a0", "b0"),
        ("only_a", "a1", None),
        ("step", "a2", "b1"),
    ]
    assert compare.stretches([False, False, True, False]) == (
        (0, 2, False),
        (2, 3, True),
        (3, 4, False),
    )
    assert compare.stretches([]) == ()


def test_a_fork_origin_anchors_on_the_row_it_names_either_way_round() -> None:
    source = [_row("s0", "turn:0", "llm_call"), _row("s1", "turn:1", "llm_call")]
    source.append(_row("s2", "run_end", "run_end"))
    fork = [_row("f0", "__fork_origin__", "fork_origin", parent="s1")]
    fork += [_row("f1", "turn:1", "llm_call"), _row("f2", "run_end", "run_end")]
    ahead = compare.align(source, fork)
    # The branch wrote the turn it re-entered again: it pairs with the same source row.
    assert [p.kind for p in ahead] == ["inherited", "origin", "step", "step"]
    assert ahead[2].a is not None and ahead[2].a.checkpoint_id == "s1"
    assert ahead[1].a is not None and ahead[1].a.checkpoint_id == "s1"
    behind = compare.align(fork, source)
    assert [p.kind for p in behind] == ["inherited", "origin", "step", "step"]
    assert behind[2].b is not None and behind[2].b.checkpoint_id == "s1"
    assert not compare.differs(ahead[0], {})
    # A fork from a tool row starts its turn again: the model call is a step of its own.
    tool_fork = [_row("t0", "__fork_origin__", "fork_origin", parent="s0")]
    tool_fork.append(_row("t1", "turn:0/tool:x", "tool_call"))
    pairs = compare.align(source, tool_fork)
    assert [p.kind for p in pairs] == ["origin", "only_a", "only_a", "only_b"]
    assert compare.differs(pairs[3], {})
