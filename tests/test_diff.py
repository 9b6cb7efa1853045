"""Two rows compared: over HTTP on runs the real SDK wrote, and the rules by themselves."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localui.backends.sqlite.store import SQLiteStore
from localui.diff import MAX_CHANGES, diff_section, readable_path
from localui.records import RowHeader, Unreadable

if TYPE_CHECKING:
    from conftest import ClientFactory, Raw, Seeded
    from starlette.testclient import TestClient

JSON = {"accept": "application/json"}


def row_ids(store: SQLiteStore, execution_id: str) -> dict[str, str]:
    """``{node_id: checkpoint_id}`` of a run, the newest row winning a repeated node id."""
    return {h.node_id: h.checkpoint_id for h in store.list_rows(execution_id)}


def headers(store: SQLiteStore, execution_id: str) -> list[RowHeader]:
    return list(store.list_rows(execution_id))


def section(data: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(s for s in data["sections"] if s["name"] == name)
    return found


def diff_links(page: str) -> list[str]:
    """The "diff with previous" and "diff with source row" links, unescaped."""
    return [html.unescape(h) for h in re.findall(r'class="diff-prev" href="([^"]+)"', page)]


# --- the completed run, row after row ---------------------------------------


def test_appended_messages_show_as_transcript_turns(
    client: TestClient, store: SQLiteStore, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("completed")
    ids = row_ids(store, run)
    url = f"/runs/{run}/diff?a={ids['turn:0']}&b={ids['turn:1']}"

    data = client.get(url, headers=JSON).json()
    snapshot = section(data, "state_snapshot")
    appended = snapshot["appended_messages"]
    assert [m["role"] for m in appended] == ["assistant", "tool"]
    assert appended[0]["tool_calls"][0]["name"] == "refund"
    assert appended[1]["content"] == "refunded 40.00 on A-1001"
    # The growth is told as turns, never as list indices.
    assert not [c for c in snapshot["changes"] if c["path"].startswith("messages")]
    assert {"kind": "changed", "path": "turn", "old": 0, "new": 1} in snapshot["changes"]
    assert snapshot["unchanged"] == ["messages[0]–[1] (2 messages)"]

    response = client.get(url)
    assert response.status_code == 200
    text = page_text(response.text, "diff-state_snapshot")
    assert "New in B: messages appended to the conversation" in text
    assert "assistant calls refund call_0_refund" in text
    assert '"order_id": "A-1001"' in text
    assert "tool answering call_0_refund refunded 40.00 on A-1001" in text
    assert "changed turn : 0 → 1" in text
    assert "messages[2]" not in text
    assert "root[" not in response.text


def test_a_later_row_against_an_earlier_one_names_the_messages_only_in_a(
    client: TestClient, store: SQLiteStore, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("completed")
    ids = row_ids(store, run)
    response = client.get(f"/runs/{run}/diff?a={ids['turn:1']}&b={ids['turn:0']}")
    text = page_text(response.text, "diff-state_snapshot")
    assert "Only in A" in text
    assert "refunded 40.00 on A-1001" in text
    data = client.get(f"/runs/{run}/diff.json?a={ids['turn:1']}&b={ids['turn:0']}").json()
    snapshot = section(data, "state_snapshot")
    assert [m["role"] for m in snapshot["removed_messages"]] == ["assistant", "tool"]
    assert snapshot["appended_messages"] == []


def test_added_and_removed_keys_are_marked(
    client: TestClient, store: SQLiteStore, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("completed")
    ids = row_ids(store, run)
    data = client.get(
        f"/runs/{run}/diff.json?a={ids['turn:0']}&b={ids['turn:0/tool:refund']}"
    ).json()
    assert section(data, "node_input")["changes"] == [
        {"kind": "added", "path": "amount", "old": None, "new": 40.0},
        {"kind": "added", "path": "order_id", "old": None, "new": "A-1001"},
    ]
    back = client.get(f"/runs/{run}/diff?a={ids['turn:0/tool:refund']}&b={ids['turn:1']}")
    text = page_text(back.text, "diff-node_input")
    assert 'removed amount : 40.0 removed order_id : "A-1001"' in text


def test_same_row_and_same_payloads_say_no_change(
    client: TestClient, store: SQLiteStore, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("completed")
    ids = row_ids(store, run)
    response = client.get(f"/runs/{run}/diff?a={ids['turn:1']}&b={ids['turn:1']}")
    assert "A and B are the same row. No change:" in page_text(response.text, "diff")
    for name in ("state_snapshot", "node_input", "node_output", "interrupt_context"):
        assert page_text(response.text, f"diff-{name}").endswith("no change No change.")
    assert client.get(response.url, headers=JSON).json()["same"] is True


# --- across runs --------------------------------------------------------------


def test_a_fork_against_its_source_across_runs(
    client: TestClient, store: SQLiteStore, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    source, fork = seeded.id("completed"), seeded.id("fork-of-completed")
    origin = headers(store, fork)[0]
    assert origin.node_id == "__fork_origin__" and origin.parent_checkpoint_id

    # The fork's first row links to the source row it branched from.
    run_page = client.get(f"/runs/{fork}").text
    link = diff_links(run_page)[0]
    assert link == f"/diff?a={origin.parent_checkpoint_id}&b={origin.checkpoint_id}"
    response = client.get(link)
    assert response.status_code == 200
    assert "diff with source row" in run_page
    data = client.get(link, headers=JSON).json()
    assert data["a"]["execution_id"] == source and data["b"]["execution_id"] == fork
    assert data["a"]["node_id"] == "turn:1" and data["b"]["node_id"] == "__fork_origin__"
    assert data["same"] is True
    assert "No change" in page_text(response.text, "diff")

    # The source's first turn against the fork's: the conversation grew across runs.
    fork_ids, source_ids = row_ids(store, fork), row_ids(store, source)
    grown = client.get(f"/diff.json?a={source_ids['turn:0']}&b={fork_ids['turn:1']}").json()
    assert [m["role"] for m in section(grown, "state_snapshot")["appended_messages"]] == [
        "assistant",
        "tool",
    ]

    # A run-scoped diff only takes that run's rows.
    wrong = client.get(
        f"/runs/{fork}/diff?a={origin.parent_checkpoint_id}&b={origin.checkpoint_id}",
        headers=JSON,
    )
    assert wrong.status_code == 404
    assert "has no row" in wrong.json()["error"]["message"]


# --- from the run page -------------------------------------------------------


def test_every_row_after_the_first_links_a_diff_with_the_previous_row(
    client: TestClient, store: SQLiteStore, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("completed")
    rows = headers(store, run)
    links = diff_links(client.get(f"/runs/{run}").text)
    assert links == [
        f"/runs/{run}/diff?a={before.checkpoint_id}&b={after.checkpoint_id}"
        for before, after in zip(rows, rows[1:], strict=False)
    ]
    # turn:0/tool:refund -> turn:1: the tool's result joined the conversation.
    response = client.get(links[1])
    assert response.status_code == 200
    text = page_text(response.text, "diff-state_snapshot")
    assert "1 new message in B" in text
    assert "refunded 40.00 on A-1001" in text


def test_the_timeline_has_an_ab_form_that_works_without_javascript(
    client: TestClient, store: SQLiteStore, seeded: Seeded
) -> None:
    run = seeded.id("completed")
    page = client.get(f"/runs/{run}").text
    form = re.search(r"<form[^>]*id=\"diff-pick\"[^>]*>", page)
    assert form is not None
    assert 'method="get"' in form.group(0)
    assert f'action="/runs/{run}/diff"' in form.group(0)
    for row in headers(store, run):
        for side in ("a", "b"):
            assert (
                f'<input type="radio" name="{side}" value="{row.checkpoint_id}" form="diff-pick"'
            ) in page

    # What the browser sends when A and B are picked: a stable, shareable URL.
    rows = headers(store, run)
    response = client.get(
        f"/runs/{run}/diff", params={"a": rows[0].checkpoint_id, "b": rows[-1].checkpoint_id}
    )
    assert response.status_code == 200
    share = re.search(r'<a href="([^"]+)" rel="bookmark">', response.text)
    assert share is not None
    query = parse_qs(urlsplit(html.unescape(share.group(1))).query)
    assert query == {"a": [rows[0].checkpoint_id], "b": [rows[-1].checkpoint_id]}


def test_the_run_page_ships_no_snapshot(client: TestClient, seeded: Seeded) -> None:
    page = client.get(f"/runs/{seeded.id('completed')}").text
    assert "You are refund-bot" not in page
    # The tool's result is in the snapshot; the page shows it only inside the final
    # answer, which comes from the trace.
    assert page.count("refunded 40.00 on A-1001") == page.count("Done: refunded 40.00 on A-1001.")


# --- damage and mistakes -----------------------------------------------------


def test_a_corrupt_snapshot_on_one_side_is_named_not_a_500(
    make_client: ClientFactory,
    copy_store: Callable[[], Path],
    raw: Callable[[Path], Raw],
    seeded: Seeded,
    store: SQLiteStore,
    page_text: Callable[..., str],
) -> None:
    run = seeded.id("completed")
    ids = row_ids(store, run)
    path = copy_store()
    changed = raw(path).execute(
        "UPDATE checkpoints SET state_snapshot = '{broken' WHERE checkpoint_id = ?",
        (ids["turn:1"],),
    )
    assert changed == 1
    client = make_client(path)

    response = client.get(f"/runs/{run}/diff?a={ids['turn:0']}&b={ids['turn:1']}")
    assert response.status_code == 200
    text = page_text(response.text, "diff-state_snapshot")
    assert "state_snapshot cannot be compared: on B (turn:1) it is not valid JSON" in text
    assert "{broken" in text
    # The other columns are still compared.
    assert page_text(response.text, "diff-node_input").endswith("No change.")

    data = client.get(response.url, headers=JSON).json()
    snapshot = section(data, "state_snapshot")
    assert snapshot["same"] is False and "on B (turn:1)" in snapshot["unreadable"]
    assert data["same"] is False
    assert section(data, "node_input")["unreadable"] is None


@pytest.mark.parametrize(
    "query, missing",
    [("", "a and b are missing"), ("?a=x", "b is missing"), ("?b=x&a=", "a is missing")],
)
def test_a_missing_row_parameter_is_a_400_that_says_which(
    client: TestClient, seeded: Seeded, query: str, missing: str
) -> None:
    for path in ("/diff", f"/runs/{seeded.id('completed')}/diff"):
        response = client.get(f"{path}.json{query}")
        assert response.status_code == 400
        assert missing in response.json()["error"]["message"]
        page = client.get(f"{path}{query}")
        assert page.status_code == 400
        assert missing in page.text


def test_unknown_ids_are_404(client: TestClient, store: SQLiteStore, seeded: Seeded) -> None:
    run = seeded.id("completed")
    real = headers(store, run)[0].checkpoint_id
    for url in (
        f"/diff?a=no-such-row&b={real}",
        f"/diff?a={real}&b=no-such-row",
        f"/runs/{run}/diff?a={real}&b=no-such-row",
        f"/runs/no-such-run/diff?a={real}&b={real}",
    ):
        response = client.get(url, headers=JSON)
        assert response.status_code == 404, url
        assert response.json()["error"]["title"] == "Not found"
    assert client.get(f"/diff?a=no-such-row&b={real}").status_code == 404


def test_values_from_the_store_are_escaped(
    make_client: ClientFactory,
    copy_store: Callable[[], Path],
    raw: Callable[[Path], Raw],
    seeded: Seeded,
    store: SQLiteStore,
) -> None:
    run = seeded.id("completed")
    ids = row_ids(store, run)
    path = copy_store()
    raw(path).execute(
        "UPDATE checkpoints SET node_input = ? WHERE checkpoint_id = ?",
        ('{"<b>key</b>": "<script>alert(1)</script>"}', ids["turn:1"]),
    )
    response = make_client(path).get(f"/runs/{run}/diff?a={ids['turn:0']}&b={ids['turn:1']}")
    assert response.status_code == 200
    assert "<script>alert(1)</script>" not in response.text
    assert "<b>key</b>" not in response.text
    assert "&#34;&lt;script&gt;alert(1)&lt;/script&gt;&#34;" in response.text
    assert "[&#34;&lt;b&gt;key&lt;/b&gt;&#34;]" in response.text


# --- JSON -----------------------------------------------------------------------


def test_json_shape_by_suffix_and_by_accept_header(
    client: TestClient, store: SQLiteStore, seeded: Seeded
) -> None:
    run = seeded.id("completed")
    ids = row_ids(store, run)
    query = f"?a={ids['turn:0']}&b={ids['turn:0/tool:refund']}"
    by_suffix = client.get(f"/runs/{run}/diff.json{query}")
    by_header = client.get(f"/runs/{run}/diff{query}", headers=JSON)
    assert by_suffix.headers["content-type"] == "application/json"
    data = by_suffix.json()
    assert data == by_header.json()

    assert set(data) == {"execution_id", "a", "b", "same", "sections"}
    assert data["execution_id"] == run
    assert data["a"]["checkpoint_id"] == ids["turn:0"]
    assert data["b"]["checkpoint_id"] == ids["turn:0/tool:refund"]
    assert {"checkpoint_id", "execution_id", "node_id", "step_type", "status"} <= set(data["a"])
    assert data["b"]["node_id"] == "turn:0/tool:refund"
    assert data["same"] is False
    assert [s["name"] for s in data["sections"]] == [
        "state_snapshot",
        "node_input",
        "node_output",
        "interrupt_context",
    ]
    for s in data["sections"]:
        assert set(s) == {
            "name",
            "same",
            "unreadable",
            "changes",
            "appended_messages",
            "removed_messages",
            "unchanged",
            "truncated",
        }
        for change in s["changes"]:
            assert set(change) == {"kind", "path", "old", "new"}
            assert change["kind"] in {"added", "removed", "changed", "type_changed"}
    assert section(data, "node_output")["same"] is True

    across = client.get(f"/diff.json{query}").json()
    assert across["execution_id"] is None
    assert across["sections"] == data["sections"]


def test_htmx_gets_the_fragment(client: TestClient, store: SQLiteStore, seeded: Seeded) -> None:
    run = seeded.id("completed")
    ids = row_ids(store, run)
    response = client.get(
        f"/runs/{run}/diff?a={ids['turn:0']}&b={ids['turn:1']}", headers={"hx-request": "true"}
    )
    assert response.status_code == 200
    assert '<div class="diff" id="diff">' in response.text
    assert "<html" not in response.text


# --- the rules, on values -----------------------------------------------------


@pytest.mark.parametrize(
    "path, text",
    [
        ((), "(whole value)"),
        (("turn",), "turn"),
        (("messages", 2, "content"), "messages[2].content"),
        (("policy", "requires", "role"), "policy.requires.role"),
        (("a key", 0), '["a key"][0]'),
        ((0, "x"), "[0].x"),
    ],
)
def test_readable_paths(path: tuple[str | int, ...], text: str) -> None:
    assert readable_path(path) == text


def conversation(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": t} for t in texts]


def test_a_message_changed_in_place_shows_its_path() -> None:
    a = {"messages": conversation("one", "two", "three"), "turn": 2}
    b = {"messages": conversation("one", "TWO", "three"), "turn": 2}
    result = diff_section("state_snapshot", a, b)
    assert [(c.kind, c.path, c.old, c.new) for c in result.changes] == [
        ("changed", "messages[1].content", "two", "TWO")
    ]
    assert result.appended_messages == ()
    assert result.unchanged == ("messages[0] (1 message)", "the last message", "turn")


def test_a_message_inserted_in_the_middle_is_one_added_item() -> None:
    a = {"messages": conversation("one", "three")}
    b = {"messages": conversation("one", "two", "three")}
    result = diff_section("state_snapshot", a, b)
    assert [(c.kind, c.path, c.new) for c in result.changes] == [
        ("added", "messages[1]", {"role": "user", "content": "two"})
    ]


def test_list_items_and_types() -> None:
    result = diff_section(
        "node_output",
        {"items": [1, 2], "amount": 40, "total": 40, "note": None},
        {"items": [1, 2, 3], "amount": "40", "total": 40.0, "note": "x"},
    )
    # Numbers compare by value: 40 and 40.0 are the same amount.
    assert [(c.kind, c.path, c.label) for c in result.changes] == [
        ("type_changed", "amount", "type changed (integer → string)"),
        ("added", "items[2]", "added"),
        ("type_changed", "note", "type changed (null → string)"),
    ]


def test_a_whole_value_of_another_type() -> None:
    result = diff_section("node_output", {}, ["x"])
    assert [(c.kind, c.path) for c in result.changes] == [("type_changed", "(whole value)")]


def test_long_values_are_blocks_and_short_ones_inline() -> None:
    long = "line one\nline two"
    result = diff_section("node_input", {"a": "short", "b": "x"}, {"a": "shorter", "b": long})
    by_path = {c.path: c for c in result.changes}
    assert not by_path["a"].block and by_path["a"].new_text == '"shorter"'
    assert by_path["b"].block and by_path["b"].new_text == long


def test_changes_past_the_cap_are_cut_and_said_so() -> None:
    a = {"messages": conversation(*(f"m{i}" for i in range(MAX_CHANGES + 50)))}
    b = {"messages": conversation(*(f"M{i}" for i in range(MAX_CHANGES + 50)))}
    result = diff_section("state_snapshot", a, b)
    assert len(result.changes) == MAX_CHANGES
    assert result.truncated
    assert "Only the first" in result.truncated_text
    assert result.summary == f"more than {MAX_CHANGES} changes"


def test_exactly_the_cap_is_not_called_cut() -> None:
    a = {"messages": conversation(*(f"m{i}" for i in range(MAX_CHANGES))), "turn": 1}
    b = {"messages": conversation(*(f"M{i}" for i in range(MAX_CHANGES))), "turn": 1}
    result = diff_section("state_snapshot", a, b)
    assert len(result.changes) == MAX_CHANGES
    assert not result.truncated


def test_unreadable_on_both_sides_names_both() -> None:
    result = diff_section(
        "node_output",
        Unreadable(error="bad", raw="{x"),
        Unreadable(error="worse", raw="{y"),
        sides=("A (turn:0)", "B (turn:1)"),
    )
    assert not result.same
    assert result.unreadable == (
        "node_output cannot be compared: on A (turn:0) it is not valid JSON (bad);"
        " on B (turn:1) it is not valid JSON (worse)."
    )
    assert [r.side for r in result.unreadable_raw] == ["A (turn:0)", "B (turn:1)"]


def test_a_memo_shared_by_many_diffs_changes_none_of_them() -> None:
    """A page that diffs many steps of two conversations hands every diff one memo: each
    diff says exactly what it says without it, a change repeated at every step included."""
    from localui.diff import DiffMemo

    def conversation(order: str, turns: int) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Refund {order}"}]
        for turn in range(turns):
            messages.append(
                {
                    "role": "assistant",
                    "tool_calls": [{"name": "lookup", "arguments": {"order": order, "n": turn}}],
                }
            )
            messages.append({"role": "tool", "content": f"order {order}: step {turn}"})
        return messages

    memo = DiffMemo()
    for turns in range(1, 12):
        a = {"messages": conversation("A-1", turns), "amount": 10}
        b = {"messages": conversation("B-2", turns), "amount": 10.0 if turns % 2 else 11}
        plain = diff_section("state_snapshot", a, b)
        shared = diff_section("state_snapshot", a, b, memo=memo)
        assert shared == plain, turns
        assert len(plain.changes) == 1 + 2 * turns + (0 if turns % 2 else 1), plain.changes


# --- flat objects: found without DeepDiff, as DeepDiff finds them -------------------

_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats()
    | st.text(max_size=6)
)
_FLAT = st.dictionaries(st.sampled_from("abcdef"), _SCALAR, max_size=6)


def _as_set(findings: tuple[Any, ...]) -> set[str]:
    """As the diff reads them (an added value has no old one, a removed one no new one),
    by repr: NaN is not equal to itself, and 1 == 1.0 == True."""
    from localui.diff import ADDED, REMOVED

    return {
        repr((kind, p, q, None if kind == ADDED else old, None if kind == REMOVED else new))
        for kind, p, q, old, new in findings
    }


@given(_FLAT, _FLAT)
def test_two_flat_objects_differ_as_deepdiff_says(a: dict[str, Any], b: dict[str, Any]) -> None:
    from localui.diff import _deepdiff_findings, _flat_findings

    flat = _flat_findings(a, b)
    if flat is not None:
        assert _as_set(flat) == _as_set(_deepdiff_findings(a, b) if a != b else ())


def test_a_message_and_a_tool_s_arguments_are_found_without_deepdiff() -> None:
    from localui.diff import CHANGED, _flat_findings

    user = {"role": "user", "content": "Refund A-1001", "name": None, "tool_calls": None}
    assert _flat_findings(user, {**user, "content": "Refund A-1999"}) == (
        (CHANGED, ("content",), ("content",), "Refund A-1001", "Refund A-1999"),
    )
    arguments = {"order_id": "A-1", "amount": 40.0}
    assert _flat_findings(arguments, {**arguments, "amount": 40}) == ()
    # Nested values and a number against a string go to DeepDiff.
    assert _flat_findings({"tool_calls": [{"id": 1}]}, {"tool_calls": []}) is None
    assert _flat_findings({"amount": 40}, {"amount": "40"}) is None
