"""Every page and its JSON through the app with its lifespan running."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from localui.backends.sqlite.store import SQLiteStore
from localui.demo.scenarios import SCENARIO_NAMES
from localui.records import RunQuery

if TYPE_CHECKING:
    from conftest import ClientFactory, Seeded
    from starlette.testclient import TestClient

ROW_KEYS = {"checkpoint_id", "node_id", "step_type", "status", "created_at", "agent_path"}
RUN_KEYS = {"execution_id", "state", "agent", "resume", "rows", "idempotency", "fork_of", "forks"}
LIST_RUN_KEYS = {"execution_id", "state", "agent", "rows", "first_at", "last_at", "pending_reason"}
COUNTS = {
    "completed": 3,
    "failed": 1,
    "cancelled": 0,
    "timed_out": 0,
    "paused": 4,
    "orphaned": 0,
    "unfinished": 2,
}


def is_full_page(html: str) -> bool:
    return html.lstrip().lower().startswith("<!doctype html>") and "</html>" in html


# --- the runs list --------------------------------------------------------


def test_runs_page_lists_every_run_with_its_state(
    client: TestClient, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert is_full_page(html)
    for name, state in seeded.STATES.items():
        row = page_text(html, f"run-{seeded.id(name)}")
        assert row.startswith(state), (name, row)
        assert "refund-bot" in row
    assert page_text(html, f"run-{seeded.id('paused-1')}").count("waiting: manager_approval") == 1
    table = page_text(html, "runs-table")
    assert "31 rows in the store · 31 waiting for the plane · 0 quarantined" in table
    assert "Paused 4" in table and "All 10" in table and "Orphaned 0" in table


def test_runs_alias_serves_the_same_list(client: TestClient) -> None:
    assert client.get("/runs").status_code == 200
    assert (
        client.get("/runs", headers={"Accept": "application/json"}).json()
        == client.get("/runs.json").json()
    )


def test_runs_json(client: TestClient, seeded: Seeded, store: SQLiteStore) -> None:
    response = client.get("/runs.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["next"] is None
    assert body["counts"] == COUNTS
    listed = {r["execution_id"]: r for r in body["runs"]}
    assert {k: r["state"] for k, r in listed.items()} == {
        seeded.id(n): s for n, s in seeded.STATES.items()
    }
    for run in body["runs"]:
        assert LIST_RUN_KEYS <= set(run)
        assert "last_ago" not in run  # presentation stays out of the JSON
        facts = store.get_run(run["execution_id"])
        assert facts is not None
        assert (run["rows"], run["first_at"], run["last_at"]) == (
            facts.row_count,
            facts.first_at,
            facts.last_at,
        )
    assert listed[seeded.id("paused-2")]["pending_reason"] == "manager_approval"
    assert listed[seeded.id("completed")]["pending_reason"] is None
    assert listed[seeded.id("crashed-in-tool")]["stopped_at"] == "tool"
    assert listed[seeded.id("crashed-waiting-on-model")]["stopped_at"] == "turn"
    assert "tabs" not in body


def test_accept_json_on_the_root(client: TestClient) -> None:
    as_json = client.get("/", headers={"Accept": "application/json"})
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.json() == client.get("/runs.json").json()
    # A browser that accepts both gets the page.
    browser = client.get("/", headers={"Accept": "text/html,application/json;q=0.9"})
    assert is_full_page(browser.text)


def test_filters_through_the_query_string(client: TestClient, seeded: Seeded) -> None:
    paused = client.get("/runs.json", params={"state": "paused"}).json()
    assert {r["execution_id"] for r in paused["runs"]} == seeded.ids("paused")
    assert paused["counts"] == COUNTS
    found = client.get("/runs.json", params={"q": "A-1003"}).json()
    assert [r["execution_id"] for r in found["runs"]] == [seeded.id("paused-2")]
    assert client.get("/runs.json", params={"agent": "nobody"}).json()["runs"] == []
    quarantined = client.get("/runs.json", params={"outbox": "quarantined"}).json()
    assert quarantined["runs"] == []
    html = client.get("/", params={"q": "A-1003"}).text
    assert seeded.id("paused-2") in html and seeded.id("paused-1") not in html


def test_runs_list_pages_through_next(make_client: ClientFactory, app_store: Path) -> None:
    client = make_client(app_store, page_size=3)
    store = SQLiteStore(app_store)
    try:
        expected = [f.execution_id for f in store.list_runs(RunQuery()).runs]
    finally:
        store.close()
    seen: list[str] = []
    url: str | None = "/runs.json"
    pages = 0
    while url is not None and pages < 10:
        body = client.get(url).json()
        pages += 1
        seen.extend(r["execution_id"] for r in body["runs"])
        if body["next"] is None:
            assert body["next_url"] is None
            url = None
        else:
            assert body["next_url"].startswith("/?")
            assert f"after={body['next']}" in body["next_url"]
            url = f"/runs.json?after={body['next']}"
    assert pages == 4
    assert seen == expected and len(set(seen)) == 10


def test_runs_page_links_the_next_page(make_client: ClientFactory, app_store: Path) -> None:
    client = make_client(app_store, page_size=3)
    cursor = client.get("/runs.json").json()["next"]
    html = client.get("/").text
    assert f'href="/?after={cursor}" rel="next"' in html
    second = client.get("/", params={"after": cursor})
    assert second.status_code == 200
    # The filters ride along with the cursor.
    paused = client.get("/runs.json", params={"state": "paused"}).json()
    assert paused["next_url"] == f"/?state=paused&after={paused['next']}"
    last = client.get("/runs.json", params={"state": "paused", "after": paused["next"]}).json()
    assert len(last["runs"]) == 1 and last["next"] is None


def test_runs_list_htmx_partial(client: TestClient, seeded: Seeded) -> None:
    response = client.get("/", params={"state": "paused"}, headers={"HX-Request": "true"})
    assert response.status_code == 200
    html = response.text
    assert html.lstrip().startswith('<section id="runs-table">')
    assert "<html" not in html and "<form" not in html
    assert html.count('<tr id="run-') == 4
    for execution_id in seeded.ids("paused"):
        assert f'id="run-{execution_id}"' in html
    assert "HX-Request" in response.headers["vary"]


# --- one run ---------------------------------------------------------------


def without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_run_json_for_every_scenario(
    client: TestClient, seeded: Seeded, store: SQLiteStore, scenario: str
) -> None:
    execution_id = seeded.id(scenario)
    by_suffix = client.get(f"/runs/{execution_id}.json")
    by_accept = client.get(f"/runs/{execution_id}", headers={"Accept": "application/json"})
    assert by_suffix.status_code == by_accept.status_code == 200
    body = by_suffix.json()
    # The verdict says how long ago the last row was, which may tick between the two.
    assert without(body, "verdict") == without(by_accept.json(), "verdict")
    assert RUN_KEYS | {"decisions"} <= set(body)
    assert (body["execution_id"], body["state"], body["agent"]) == (
        execution_id,
        seeded.STATES[scenario],
        "refund-bot",
    )
    # The seeding approves this run by the SDK directly, not through localui: the run
    # shows it as decided outside localui, by whom its resume span names.
    outside = [(d["kind"], d["approver"]) for d in body["decisions"]]
    assert outside == ([("outside", "demo-seed")] if scenario == "idempotent-resumed" else [])
    expected_rows = [
        {
            "checkpoint_id": h.checkpoint_id,
            "node_id": h.node_id,
            "step_type": h.step_type,
            "status": h.status,
            "created_at": h.created_at,
            "agent_path": h.agent_path,
        }
        for h in store.list_rows(execution_id)
    ]
    assert [{k: r[k] for k in ROW_KEYS} for r in body["rows"]] == expected_rows
    assert "groups" not in body
    if seeded.STATES[scenario] == "completed":
        assert body["resume"] is None
        assert "AlreadyResumed" in body["resume_refusal"]
    else:
        assert body["resume"]["shape"] in ("tool", "turn", "approval")


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_run_page_for_every_scenario(
    client: TestClient, seeded: Seeded, store: SQLiteStore, scenario: str
) -> None:
    execution_id = seeded.id(scenario)
    response = client.get(f"/runs/{execution_id}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert is_full_page(html)
    state = seeded.STATES[scenario]
    assert f"<h1>Run <code>{execution_id}</code></h1>" in html
    assert f'<span class="state state-{state}">{state}</span>' in html
    assert f"{len(store.list_rows(execution_id))} rows" in html
    assert 'id="verdict"' in html and 'id="timeline"' in html and 'id="lineage"' in html
    assert ('id="pending"' in html) is (state == "paused")


RESUMES: dict[str, dict[str, Any]] = {
    "crashed-in-tool": {
        "shape": "tool",
        "node_id": "turn:0/tool:refund",
        "tool": "refund",
        "turn": 0,
        "saved_args": {"order_id": "A-1006", "amount": 80.0},
    },
    "crashed-waiting-on-model": {"shape": "turn", "node_id": "turn:1", "tool": None, "turn": 1},
    "failed": {"shape": "turn", "node_id": "turn:0", "tool": None, "turn": 0},
    "paused-1": {
        "shape": "approval",
        "node_id": "turn:0/tool:refund",
        "tool": "refund",
        "reason": "manager_approval",
    },
}


@pytest.mark.parametrize("scenario", sorted(RESUMES))
def test_run_json_resume(
    client: TestClient, seeded: Seeded, store: SQLiteStore, scenario: str
) -> None:
    resume = client.get(f"/runs/{seeded.id(scenario)}.json").json()["resume"]
    assert {k: resume[k] for k in RESUMES[scenario]} == RESUMES[scenario]
    last_real = [h for h in store.list_rows(seeded.id(scenario)) if h.step_type != "run_end"][-1]
    assert resume["checkpoint_id"] == last_real.checkpoint_id


def test_run_json_idempotency_and_lineage(client: TestClient, seeded: Seeded) -> None:
    resumed = client.get(f"/runs/{seeded.id('idempotent-resumed')}.json").json()
    (entry,) = resumed["idempotency"]
    assert (entry["value"], entry["enveloped"]) == ("cb-A-1009-450.00", True)
    assert "value_json" not in entry
    assert resumed["fork_of"] is None and resumed["forks"] == []

    source = client.get(f"/runs/{seeded.id('completed')}.json").json()
    fork = client.get(f"/runs/{seeded.id('fork-of-completed')}.json").json()
    turn1 = [r for r in source["rows"] if r["node_id"] == "turn:1"][0]
    assert fork["fork_of"]["execution_id"] == seeded.id("fork-of-completed")
    assert fork["fork_of"]["source_execution_id"] == seeded.id("completed")
    assert fork["fork_of"]["source_checkpoint_id"] == turn1["checkpoint_id"]
    assert fork["fork_of"]["source_node_id"] == "turn:1"
    assert [f["execution_id"] for f in source["forks"]] == [seeded.id("fork-of-completed")]
    assert fork["rows"][0]["parent_checkpoint_id"] == turn1["checkpoint_id"]


def test_fork_and_source_link_each_other(client: TestClient, seeded: Seeded) -> None:
    source_id, fork_id = seeded.id("completed"), seeded.id("fork-of-completed")
    source = client.get(f"/runs/{source_id}.json").json()
    turn1 = [r for r in source["rows"] if r["node_id"] == "turn:1"][0]["checkpoint_id"]
    fork_html = client.get(f"/runs/{fork_id}").text
    assert f'href="/runs/{source_id}#row-{turn1}"' in fork_html
    source_html = client.get(f"/runs/{source_id}").text
    assert f'id="row-{turn1}"' in source_html  # the anchor the fork points at exists
    assert f'href="/runs/{fork_id}"' in source_html


VERDICTS = {
    "crashed-in-tool": [
        "No end marker: still running, or its process died inside tool refund",
        'Resume: Resume re-invokes refund with the saved arguments {"amount": 80.0, '
        '"order_id": "A-1006"}; the model is not called again.',
    ],
    "failed": [
        ": RuntimeError: model provider returned 503.",
        "Resume: Resume re-issues the model call of turn 0 ( turn:0 ).",
    ],
    "paused-2": [
        "Paused for manager_approval at turn:0/tool:refund",
        "waiting for a person.",
        "Resume: Approve or reject to resume: the paused tool refund runs again",
    ],
    "completed": [
        "the run wrote its end marker.",
        "the SDK refuses to resume it (AlreadyResumed)",
        "Fork: Fork branches a new run from any executed row",
    ],
}


@pytest.mark.parametrize("scenario", sorted(VERDICTS))
def test_verdict_a_person_reads(
    client: TestClient, seeded: Seeded, page_text: Callable[..., str], scenario: str
) -> None:
    response = client.get(f"/runs/{seeded.id(scenario)}")
    assert response.status_code == 200
    assert is_full_page(response.text)
    banner = page_text(response.text, "verdict")
    for words in VERDICTS[scenario]:
        assert words in banner, (words, banner)
    if scenario == "failed":
        assert banner.startswith("Failed ")
    if scenario == "completed":
        assert banner.startswith("Completed ")


def test_run_page_shows_the_frozen_context_of_a_pause(
    client: TestClient, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    html = client.get(f"/runs/{seeded.id('paused-3')}").text
    pending = page_text(html, "pending")
    assert "Katherine Johnson" in pending and "1200.0" in pending
    assert "A-1004" in pending
    assert 'id="pending"' not in client.get(f"/runs/{seeded.id('completed')}").text


def test_the_queue_card_is_light_and_its_context_loads_when_opened(
    client: TestClient, seeded: Seeded, page_text: Callable[..., str]
) -> None:
    run = seeded.id("paused-3")
    queue = client.get("/approvals").text
    card_html = queue[queue.index(f'id="approval-{run}"') :]
    card_html = card_html[: card_html.index("</article>")]
    # The call and what a decision does are on the card; the context waits to be opened.
    assert "Katherine Johnson" not in card_html
    assert 'class="context"' not in card_html
    context_url = f"/approvals/{run}/context"
    assert f'hx-get="{context_url}" hx-trigger="toggle once"' in card_html
    assert f'<a href="/approvals/{run}">on the card\'s own page</a>' in card_html
    # Opened: the whole frozen context, as the card's own page shows it.
    opened = client.get(context_url)
    assert opened.status_code == 200
    assert "Katherine Johnson" in opened.text and "1200.0" in opened.text
    own_page = page_text(client.get(f"/approvals/{run}").text)
    assert "Katherine Johnson" in own_page
    # JSON keeps the context on every card (the contract scripts read).
    [item] = [
        a for a in client.get("/approvals.json").json()["approvals"] if a["execution_id"] == run
    ]
    assert item["context"]["order_id"] == "A-1004"
    assert client.get(f"/approvals/{seeded.id('completed')}/context").status_code == 404


def test_run_page_timeline_and_cache(
    client: TestClient, seeded: Seeded, page_text: Callable[..., str], store: SQLiteStore
) -> None:
    execution_id = seeded.id("idempotent-resumed")
    html = client.get(f"/runs/{execution_id}").text
    timeline = page_text(html, "timeline")
    for title in ("Turn 0", "Turn 1", "Run end"):
        assert title in timeline
    assert "Outbox: 0 synced, 5 waiting, 0 quarantined." in timeline
    for h in store.list_rows(execution_id):
        assert f'id="row-{h.checkpoint_id}"' in html
        assert f'href="/runs/{execution_id}/rows/{h.checkpoint_id}"' in html
    cache = page_text(html, "idempotency")
    assert '"cb-A-1009-450.00"' in cache
    assert "stored bare" not in cache


# --- one row -----------------------------------------------------------------


def pause_row(store: SQLiteStore, seeded: Seeded) -> tuple[str, str]:
    execution_id = seeded.id("paused-2")
    return execution_id, store.list_rows(execution_id)[-1].checkpoint_id


def test_row_detail_page(
    client: TestClient, seeded: Seeded, store: SQLiteStore, page_text: Callable[..., str]
) -> None:
    execution_id, cid = pause_row(store, seeded)
    response = client.get(f"/runs/{execution_id}/rows/{cid}")
    assert response.status_code == 200
    assert is_full_page(response.text)
    detail = page_text(response.text, f"row-detail-{cid}")
    assert "Interrupt: manager_approval" in detail
    assert "Alan Turing" in detail
    assert "Refund order A-1003 for 900.00" in detail  # the user's message, as a transcript
    assert "calls refund" in detail
    assert "Unreadable" not in detail
    assert f'href="/runs/{execution_id}#row-{cid}"' in response.text


def test_row_detail_htmx_fragment(client: TestClient, seeded: Seeded, store: SQLiteStore) -> None:
    execution_id, cid = pause_row(store, seeded)
    response = client.get(f"/runs/{execution_id}/rows/{cid}", headers={"HX-Request": "true"})
    assert response.status_code == 200
    html = response.text.strip()
    assert html.startswith(f'<div class="row-detail" id="row-detail-{cid}">')
    assert html.endswith("</div>")
    assert "<html" not in html and "<header" not in html
    assert "HX-Request" in response.headers["vary"]


def test_row_detail_json(client: TestClient, seeded: Seeded, store: SQLiteStore) -> None:
    execution_id, cid = pause_row(store, seeded)
    body = client.get(f"/runs/{execution_id}/rows/{cid}.json").json()
    assert (body["execution_id"], body["checkpoint_id"]) == (execution_id, cid)
    assert (body["node_id"], body["step_type"], body["status"]) == (
        "turn:0/tool:refund",
        "hitl_pause",
        "interrupted",
    )
    assert body["unreadable"] == []
    assert body["node_input"] == {"order_id": "A-1003", "amount": 900.0}
    assert body["interrupt_reason"] == "manager_approval"
    assert body["interrupt_context"]["customer"] == "Alan Turing"
    roles = [m["role"] for m in body["transcript"]]
    assert roles == ["system", "user", "assistant"]
    assert body["transcript"][1]["text"] == "Refund order A-1003 for 900.00"
    (call,) = body["transcript"][2]["tool_calls"]
    assert (call["name"], call["arguments"]) == ("refund", {"order_id": "A-1003", "amount": 900.0})
    assert "raw" not in body and "node_input_json" not in body


# --- escaping ----------------------------------------------------------------

HOSTILE = "<script>alert(1)</script>"
HOSTILE_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
HOSTILE_ID = 'x"><img src=x onerror=alert(2)>'


@pytest.fixture
def hostile_store(store_copy: Path) -> Path:
    """A run whose every free-text field is markup, written through the SDK's own
    checkpointer (agent names, reasons and tool args are whatever a caller passes)."""
    from fastaiagent.chain.checkpoint import Checkpoint
    from fastaiagent.checkpointers import SQLiteCheckpointer
    from fastaiagent.checkpointers.protocol import PendingInterrupt

    snapshot = {"messages": [{"role": "user", "content": HOSTILE}]}
    sdk = SQLiteCheckpointer(str(store_copy))
    try:
        sdk.put(
            Checkpoint(
                checkpoint_id="hostile-1",
                chain_name=HOSTILE,
                execution_id=HOSTILE_ID,
                node_id="turn:0",
                step_type="llm_call",
                state_snapshot=snapshot,
            )
        )
        sdk.put(
            Checkpoint(
                checkpoint_id="hostile-2",
                chain_name=HOSTILE,
                execution_id=HOSTILE_ID,
                node_id="turn:0/tool:refund",
                step_type="tool_call",
                node_input={"order_id": HOSTILE},
                state_snapshot=snapshot,
            )
        )
        sdk.record_interrupt(
            Checkpoint(
                checkpoint_id="hostile-3",
                chain_name=HOSTILE,
                execution_id=HOSTILE_ID,
                node_id="turn:0/tool:refund",
                step_type="hitl_pause",
                status="interrupted",
                node_input={"order_id": HOSTILE},
                interrupt_reason=HOSTILE,
                interrupt_context={"note": HOSTILE},
                state_snapshot=snapshot,
            ),
            PendingInterrupt(
                execution_id=HOSTILE_ID,
                chain_name=HOSTILE,
                node_id="turn:0/tool:refund",
                reason=HOSTILE,
                context={"note": HOSTILE},
            ),
        )
    finally:
        sdk.close()
    return store_copy


@pytest.mark.parametrize(
    "url",
    [
        "/",
        "/?q=script",
        f"/runs/{HOSTILE_ID}",
        f"/runs/{HOSTILE_ID}/rows/hostile-1",
        f"/runs/{HOSTILE_ID}/rows/hostile-2",
        f"/runs/{HOSTILE_ID}/rows/hostile-3",
    ],
)
def test_store_text_is_escaped(make_client: ClientFactory, hostile_store: Path, url: str) -> None:
    client = make_client(hostile_store)
    response = client.get(url)
    assert response.status_code == 200
    html = response.text
    assert HOSTILE not in html
    assert "<img src=x" not in html
    assert HOSTILE_ESCAPED in html


def test_hostile_run_json_keeps_the_text(make_client: ClientFactory, hostile_store: Path) -> None:
    client = make_client(hostile_store)
    listed = client.get("/runs.json").json()["runs"]
    (run,) = [r for r in listed if r["execution_id"] == HOSTILE_ID]
    assert (run["agent"], run["pending_reason"], run["state"]) == (HOSTILE, HOSTILE, "paused")
    row = client.get(f"/runs/{HOSTILE_ID}/rows/hostile-2.json").json()
    assert row["node_input"] == {"order_id": HOSTILE}


# --- who may talk to the server ------------------------------------------------


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8765", "localhost.evil.example", "127.0.0.2", ""]
)
def test_foreign_host_header_is_refused(client: TestClient, host: str) -> None:
    response = client.get("/", headers={"Host": host})
    assert response.status_code == 400
    assert f"Host {host!r} is not one this server answers to." in response.text
    as_json = client.get("/runs.json", headers={"Host": host})
    assert as_json.status_code == 400
    assert as_json.json()["error"]["status"] == 400


@pytest.mark.parametrize(
    "host", ["localhost:8765", "127.0.0.1", "127.0.0.1:8765", "LOCALHOST", "[::1]:8765"]
)
def test_loopback_host_headers_are_answered(client: TestClient, host: str) -> None:
    response = client.get("/runs.json", headers={"Host": host})
    assert response.status_code == 200
    assert response.json()["counts"] == COUNTS


def test_allowed_host_setting(make_client: ClientFactory, app_store: Path) -> None:
    client = make_client(app_store, allowed_hosts=("ui.internal",))
    assert client.get("/", headers={"Host": "ui.internal:8765"}).status_code == 200
    assert client.get("/", headers={"Host": "evil.example"}).status_code == 400


CROSS_SITE = [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Origin": "http://evil.example"},
    {"Origin": "null"},
    {"Origin": "http://localhost:8765"},  # another origin, even if also loopback
]


@pytest.mark.parametrize("headers", CROSS_SITE)
@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("POST", "/"),
        ("POST", "/no/such/page"),
        ("POST", "/runs/some-run/resume"),
        ("POST", "/approvals/some-run/approve"),
        ("PUT", "/runs.json"),
        ("DELETE", "/runs/some-run"),
    ],
)
def test_cross_site_unsafe_requests_are_refused_before_routing(
    client: TestClient, headers: dict[str, str], method: str, url: str
) -> None:
    response = client.request(method, url, headers=headers)
    assert response.status_code == 403
    assert "Cross-site request refused" in response.text


def test_cross_site_refusal_answers_json_when_asked(client: TestClient) -> None:
    response = client.post(
        "/", headers={"Origin": "http://evil.example", "Accept": "application/json"}
    )
    assert response.status_code == 403
    assert response.json()["error"]["status"] == 403


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "none"},
        {"Origin": "http://127.0.0.1:8765"},
        {},  # a script: no Origin, no Sec-Fetch-Site
    ],
)
@pytest.mark.parametrize(("url", "status"), [("/", 405), ("/no/such/page", 404)])
def test_same_origin_posts_pass_the_guard(
    client: TestClient, headers: dict[str, str], url: str, status: int
) -> None:
    response = client.post(url, headers=headers)
    assert response.status_code != 403
    assert response.status_code == status
    assert "Cross-site" not in response.text


def test_cross_site_get_is_answered(client: TestClient) -> None:
    response = client.get("/runs.json", headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    "path",
    ["/", "/approvals", "/cache", "/attention", "/decisions", "/prune", "/notifications", "/audit"],
)
def test_the_nav_leads_to_every_page_it_names(client: TestClient, path: str) -> None:
    """Every page's nav names the same pages (Notifications and Audit for operators, as
    the signed-in owner here is); each link answers 200."""
    html = client.get(path).text
    nav = html.split('<nav aria-label="Main">', 1)[1].split("</nav>", 1)[0]
    links = re.findall(r'<a href="([^"]+)">([A-Za-z]+)', nav)
    assert [name for _, name in links] == [
        "Runs",
        "Approvals",
        "Cache",
        "Attention",
        "Decisions",
        "Prune",
        "Notifications",
        "Audit",
    ]
    for href, _ in links:
        assert client.get(href).status_code == 200, href


def test_compiled_templates_are_kept_for_the_next_start_and_a_bad_cache_costs_a_compile(
    store_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start's first page compiled its templates (25 ms of it): they are kept in the
    cache directory for the next start. A cache that is junk, or cannot be made, only
    means compiling them again."""
    from helpers import LOOPBACK_CLIENT, NO_SIGN_IN
    from starlette.testclient import TestClient

    from localui.app import create_app
    from localui.settings import Settings

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    settings = Settings(store=str(store_copy), sign_in=NO_SIGN_IN)
    kept_in = tmp_path / "cache" / "localui" / "templates"

    def runs_table() -> str:
        app = create_app(settings)
        with TestClient(app, base_url="http://127.0.0.1:8765", client=LOOPBACK_CLIENT) as client:
            answer = client.get("/")
        assert answer.status_code == 200, answer.text
        found = re.search(r'<table class="runs">.*?</table>', answer.text, re.S)
        assert found is not None
        return re.sub(r"<time[^>]*>.*?</time>", "", found.group(0))

    first = runs_table()
    kept = sorted(kept_in.glob("__jinja2_*.cache"))
    assert len(kept) >= 3  # the page, base.html and the parts they include
    for path in kept:
        path.write_bytes(b"junk where a compiled template was")
    assert runs_table() == first
    for path in kept_in.iterdir():
        path.unlink()
    kept_in.rmdir()
    kept_in.write_text("a file where the cache directory would be")
    assert runs_table() == first
