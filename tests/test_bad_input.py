"""What the app answers to wrong addresses, bad parameters and damaged stores."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from localui.backends.base import STATES
from localui.errors import StoreMissing

if TYPE_CHECKING:
    from conftest import ClientFactory, Raw, Seeded
    from starlette.testclient import TestClient


def cursor(value: object) -> str:
    """Text shaped like the app's cursors: url-safe base64 of JSON, unpadded."""
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def assert_json_error(response: object, status: int, *fragments: str) -> None:
    from httpx import Response

    assert isinstance(response, Response)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["status"] == status
    assert error["title"]
    for fragment in fragments:
        assert fragment in error["message"], (fragment, error["message"])


# --- things that are not there ----------------------------------------------


def test_unknown_run_is_a_404_page(client: TestClient, page_text: Callable[..., str]) -> None:
    response = client.get("/runs/no-such-run")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("text/html")
    error = page_text(response.text, "error")
    assert error.startswith("404 · Not found")
    assert "no run with execution id 'no-such-run' in this store" in error


def test_unknown_run_is_a_404_json_error(client: TestClient) -> None:
    assert_json_error(client.get("/runs/no-such-run.json"), 404, "no-such-run")
    assert_json_error(
        client.get("/runs/no-such-run", headers={"Accept": "application/json"}), 404, "no-such-run"
    )


def test_unknown_run_htmx_gets_the_error_fragment(client: TestClient) -> None:
    response = client.get("/runs/no-such-run", headers={"HX-Request": "true"})
    assert response.status_code == 404
    assert response.text.lstrip().startswith('<section class="error" id="error"')
    assert "<html" not in response.text


def test_unknown_row_is_a_404(client: TestClient, seeded: Seeded) -> None:
    run = seeded.id("completed")
    assert client.get(f"/runs/{run}/rows/no-such-row").status_code == 404
    assert_json_error(client.get(f"/runs/{run}/rows/no-such-row.json"), 404, "no-such-row")


def test_a_row_of_another_run_is_a_404(client: TestClient, seeded: Seeded) -> None:
    other = client.get(f"/runs/{seeded.id('completed')}.json").json()["rows"][0]["checkpoint_id"]
    failed = seeded.id("failed")
    assert client.get(f"/runs/{seeded.id('completed')}/rows/{other}").status_code == 200
    response = client.get(f"/runs/{failed}/rows/{other}")
    assert response.status_code == 404
    assert_json_error(client.get(f"/runs/{failed}/rows/{other}.json"), 404, other, failed)


def test_unknown_url_is_a_404_page(client: TestClient, page_text: Callable[..., str]) -> None:
    response = client.get("/no/such/page")
    assert response.status_code == 404
    assert "nothing at /no/such/page" in page_text(response.text, "error")


# --- bad parameters ---------------------------------------------------------------


def test_bad_state_is_a_400(client: TestClient, page_text: Callable[..., str]) -> None:
    response = client.get("/", params={"state": "bogus"})
    assert response.status_code == 400
    message = f"state='bogus' is not one of {', '.join(STATES)}"
    assert message in page_text(response.text, "error")
    assert_json_error(client.get("/runs.json", params={"state": "bogus"}), 400, message)


def test_every_real_state_is_accepted(client: TestClient) -> None:
    for state in STATES:
        assert client.get("/runs.json", params={"state": state}).status_code == 200


def test_bad_outbox_is_a_400(client: TestClient) -> None:
    response = client.get("/", params={"outbox": "lost"})
    assert response.status_code == 400
    assert_json_error(
        client.get("/runs.json", params={"outbox": "lost"}),
        400,
        "outbox='lost' is not one of waiting, quarantined",
    )


@pytest.mark.parametrize(
    "after",
    [
        "not a cursor!",
        "%%%",
        cursor(b"\xff\xfe\x00"),  # not UTF-8
        cursor(b"{not json"),
        cursor(["only-one"]),
        cursor(["a", 1]),
        cursor(["a", "b", "c"]),
        cursor({"last_at": "a", "execution_id": "b"}),
        cursor("a string"),
    ],
)
def test_malformed_cursor_is_a_400(client: TestClient, after: str) -> None:
    assert_json_error(
        client.get("/runs.json", params={"after": after}),
        400,
        "is not a cursor this server gave out",
    )
    assert client.get("/", params={"after": after}).status_code == 400


def test_deeply_nested_cursor_is_a_400(make_client: ClientFactory, app_store: Path) -> None:
    client = make_client(app_store, raise_server_exceptions=False)
    response = client.get("/runs.json", params={"after": cursor(b"[" * 5000)})
    assert response.status_code == 400


def test_over_long_q_is_a_400(client: TestClient) -> None:
    assert client.get("/runs.json", params={"q": "x" * 200}).status_code == 200
    assert_json_error(
        client.get("/runs.json", params={"q": "x" * 201}), 400, "longer than 200 characters"
    )
    assert client.get("/", params={"q": "x" * 201}).status_code == 400


# --- damaged stores -----------------------------------------------------------


def test_a_corrupt_snapshot_renders_as_unreadable(
    make_client: ClientFactory,
    store_copy: Path,
    seeded: Seeded,
    raw: Callable[[Path], Raw],
    page_text: Callable[..., str],
) -> None:
    run = seeded.id("crashed-in-tool")
    target = raw(store_copy).rows(run)[-1]["checkpoint_id"]
    raw(store_copy).execute(
        "UPDATE checkpoints SET state_snapshot = '{broken' WHERE checkpoint_id = ?", (target,)
    )
    client = make_client(store_copy)

    page = client.get(f"/runs/{run}")
    assert page.status_code == 200
    assert "inside tool refund" in page_text(page.text, "verdict")
    listed = {r["execution_id"]: r for r in client.get("/runs.json").json()["runs"]}
    assert listed[run]["state"] == "unfinished"

    detail = client.get(f"/runs/{run}/rows/{target}")
    assert detail.status_code == 200
    words = page_text(detail.text, f"row-detail-{target}")
    assert "Unreadable: state_snapshot could not be parsed as JSON" in words
    assert "{broken" in words  # the stored text is still there to read
    body = client.get(f"/runs/{run}/rows/{target}.json").json()
    assert body["unreadable"] == ["state_snapshot"]
    assert set(body["state_snapshot"]) == {"unreadable"}
    assert body["transcript"] is None
    assert body["node_input"] == {"order_id": "A-1006", "amount": 80.0}


def test_corrupt_tool_args_render_in_the_verdict(
    make_client: ClientFactory,
    store_copy: Path,
    seeded: Seeded,
    raw: Callable[[Path], Raw],
    page_text: Callable[..., str],
) -> None:
    run = seeded.id("crashed-in-tool")
    target = raw(store_copy).rows(run)[-1]["checkpoint_id"]
    raw(store_copy).execute(
        "UPDATE checkpoints SET node_input = '{\"order_id\": ' WHERE checkpoint_id = ?", (target,)
    )
    client = make_client(store_copy)
    page = client.get(f"/runs/{run}")
    assert page.status_code == 200
    assert "with the saved arguments (unreadable)" in page_text(page.text, "verdict")
    resume = client.get(f"/runs/{run}.json").json()["resume"]
    assert resume["shape"] == "tool" and set(resume["saved_args"]) == {"unreadable"}


def test_corrupt_pause_context_and_cache_render(
    make_client: ClientFactory,
    store_copy: Path,
    seeded: Seeded,
    raw: Callable[[Path], Raw],
    page_text: Callable[..., str],
) -> None:
    run = seeded.id("paused-1")
    raw(store_copy).execute(
        "UPDATE pending_interrupts SET context = 'not json' WHERE execution_id = ?", (run,)
    )
    raw(store_copy).execute(
        "UPDATE idempotency_cache SET result = '{\"__fa_idem__\": ' WHERE execution_id = ?", (run,)
    )
    client = make_client(store_copy)
    page = client.get(f"/runs/{run}")
    assert page.status_code == 200
    assert "unreadable" in page_text(page.text, "pending").lower()
    body = client.get(f"/runs/{run}.json").json()
    assert body["state"] == "paused"
    (entry,) = body["idempotency"]
    assert set(entry["value"]) == {"unreadable"} and entry["enveloped"] is False


@pytest.fixture
def odd_store(store_copy: Path) -> Path:
    """Rows the SDK writes when a caller hands it such values: a NaN tool argument
    (the SDK's json.dumps writes ``NaN``), and a snapshot whose ``tool_calls`` is
    not a list."""
    from fastaiagent.chain.checkpoint import Checkpoint
    from fastaiagent.checkpointers import SQLiteCheckpointer

    sdk = SQLiteCheckpointer(str(store_copy))
    try:
        sdk.put(
            Checkpoint(
                checkpoint_id="nan-1",
                chain_name="odd-bot",
                execution_id="nan-run",
                node_id="turn:0/tool:refund",
                step_type="tool_call",
                node_input={"order_id": "A-1", "amount": float("nan")},
            )
        )
        sdk.put(
            Checkpoint(
                checkpoint_id="calls-1",
                chain_name="odd-bot",
                execution_id="calls-run",
                node_id="turn:0",
                step_type="llm_call",
                state_snapshot={"messages": [{"role": "assistant", "tool_calls": 5}]},
            )
        )
    finally:
        sdk.close()
    return store_copy


def test_odd_rows_render_as_html(make_client: ClientFactory, odd_store: Path) -> None:
    client = make_client(odd_store, raise_server_exceptions=False)
    assert client.get("/runs/nan-run").status_code == 200
    assert client.get("/runs/nan-run/rows/nan-1").status_code == 200
    assert client.get("/runs/calls-run").status_code == 200


@pytest.mark.parametrize("url", ["/runs/nan-run.json", "/runs/nan-run/rows/nan-1.json"])
def test_a_nan_in_a_row_does_not_break_json(
    make_client: ClientFactory, odd_store: Path, url: str
) -> None:
    client = make_client(odd_store, raise_server_exceptions=False)
    assert client.get(url).status_code == 200


@pytest.mark.parametrize(
    "url", ["/runs/calls-run/rows/calls-1", "/runs/calls-run/rows/calls-1.json"]
)
def test_a_snapshot_of_an_odd_shape_does_not_break_the_row(
    make_client: ClientFactory, odd_store: Path, url: str
) -> None:
    client = make_client(odd_store, raise_server_exceptions=False)
    assert client.get(url).status_code == 200


@pytest.mark.parametrize(
    "url",
    [
        "/",
        "/runs.json",
        "/runs/old-at-tool",
        "/runs/old-at-tool.json",
        "/runs/old-interrupted",
        "/runs/old-at-tool/rows/v1-b",
        "/runs/old-at-tool/rows/v1-b.json",
    ],
)
def test_a_first_schema_store_renders(make_client: ClientFactory, v1_store: Path, url: str) -> None:
    response = make_client(v1_store).get(url)
    assert response.status_code == 200


def test_a_first_schema_store_says_what_it_cannot_know(
    make_client: ClientFactory, v1_store: Path, page_text: Callable[..., str]
) -> None:
    client = make_client(v1_store)
    body = client.get("/runs/old-at-tool.json").json()
    assert (body["state"], body["resume"]["shape"], body["resume"]["tool"]) == (
        "unfinished",
        "tool",
        "lookup",
    )
    assert body["resume"]["saved_args"] == {"sku": "Z-42"}
    assert [r["step_type"] for r in body["rows"]] == [None, None]
    assert {r["outbox"] for r in body["rows"]} == {"unknown"}
    timeline = page_text(client.get("/runs/old-at-tool").text, "timeline")
    assert "2 from a store too old to say" in timeline
    listed = {r["execution_id"]: r["state"] for r in client.get("/runs.json").json()["runs"]}
    assert listed == {
        "old-at-tool": "unfinished",
        "old-at-turn": "unfinished",
        "old-interrupted": "orphaned",
    }


@pytest.mark.parametrize(
    "url",
    ["/", "/runs.json", "/runs/old-paused", "/runs/old-paused.json", "/runs/old-fork",
     "/runs/old-paused/rows/v2-a"],
)  # fmt: skip
def test_a_pre_step_type_store_renders(
    make_client: ClientFactory, v2_store: Path, url: str
) -> None:
    assert make_client(v2_store).get(url).status_code == 200


def test_a_pre_step_type_store_shows_its_pause_and_fork(
    make_client: ClientFactory, v2_store: Path
) -> None:
    client = make_client(v2_store)
    paused = client.get("/runs/old-paused.json").json()
    assert paused["state"] == "paused"
    assert paused["resume"]["shape"] == "approval"
    fork = client.get("/runs/old-fork.json").json()
    assert fork["fork_of"]["source_execution_id"] == "old-done"
    assert 'href="/runs/old-done#row-v2-c"' in client.get("/runs/old-fork").text


# --- stores that are not there ----------------------------------------------------


def test_app_refuses_to_start_on_a_missing_store(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    with pytest.raises(StoreMissing, match="nope.db"):
        make_client(tmp_path / "nope.db")


def test_app_refuses_to_start_on_a_file_that_is_not_sqlite(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.db"
    notes.write_text("these are my notes, not a database\n" * 40)
    with pytest.raises(StoreMissing, match="not a SQLite store"):
        make_client(notes)


STORE_URLS = ["/", "/runs.json", "/runs/{completed}", "/runs/{completed}.json"]


def _delete_store(path: Path) -> None:
    path.unlink()
    assert not path.exists()


def test_a_store_deleted_while_serving_is_not_a_500(
    make_client: ClientFactory, store_copy: Path, seeded: Seeded
) -> None:
    client = make_client(store_copy, raise_server_exceptions=False)
    urls = [u.format(completed=seeded.id("completed")) for u in STORE_URLS]
    assert all(client.get(u).status_code == 200 for u in urls)
    _delete_store(store_copy)
    for url in urls:
        response = client.get(url)
        assert response.status_code in (200, 404, 503), (url, response.status_code)
        assert "Traceback" not in response.text


def test_a_store_deleted_while_serving_says_so(
    make_client: ClientFactory, store_copy: Path, seeded: Seeded
) -> None:
    client = make_client(store_copy, raise_server_exceptions=False)
    urls = [u.format(completed=seeded.id("completed")) for u in STORE_URLS]
    assert all(client.get(u).status_code == 200 for u in urls)
    _delete_store(store_copy)
    for url in urls:
        response = client.get(url)
        assert response.status_code == 503, (url, response.status_code)
        if url.endswith(".json"):
            assert str(store_copy) in response.json()["error"]["message"]
