"""Every URL comes from a route name, with ids encoded: runs whose ids a caller chose.

The SDK lets the caller of ``arun`` pick ``execution_id``. These tests write paused
and failed runs under ids holding ``/ ? # % \\`` and text outside Latin-1 (the real
SDK, in a child process), on SQLite and on PostgreSQL, then open their pages and
press their buttons the way a browser does: by following the URLs the pages give.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from starlette.testclient import TestClient

from localui.views.urls import dom_id, tilde_decode, tilde_encode

#: The card of this run once sent ``POST /prune?older_than=0s&x=/approve``: a real prune.
PRUNE_LOOKALIKE = "../../prune?older_than=0s&x="
ODD_IDS = (PRUNE_LOOKALIKE, "a/b", "a?b", "a#b", "a%2Fb", "王", "back\\slash", "x.json")
FAILED_ID = "王/failed run"
HTMX = {"HX-Request": "true", "Sec-Fetch-Site": "same-origin"}
JSON = {"Accept": "application/json"}
TESTS_DIR = Path(__file__).resolve().parent


def test_tilde_encoding_round_trips_and_leaves_plain_ids_alone() -> None:
    for value in (*ODD_IDS, FAILED_ID, "~7E", "%", "a~b", "3f1c-uuid_like"):
        encoded = tilde_encode(value)
        assert re.fullmatch(r"[A-Za-z0-9_~-]+", encoded), encoded
        assert tilde_decode(encoded) == value
    assert tilde_encode("2b6f0a3c-7d2e-4f9b-905c-62f9297ef805") == (
        "2b6f0a3c-7d2e-4f9b-905c-62f9297ef805"
    )
    assert tilde_encode("a/b") == "a~2Fb" and tilde_encode("王") == "~E7~8E~8B"
    # A hand-typed URL with a plain id still names that id.
    assert tilde_decode("run.1+x%") == "run.1+x%"


def test_element_ids_are_safe_in_selectors_and_never_collide() -> None:
    made = {dom_id(v) for v in (*ODD_IDS, "a_2Fb", "a-b", "a_b")}
    assert len(made) == len(ODD_IDS) + 3
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", m) for m in made)


def test_links_come_from_each_apps_own_routes_including_ones_added_later() -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import NoMatchFound, Route

    from localui.views.urls import ID, Urls

    def page(request: Request) -> PlainTextResponse:
        return PlainTextResponse("")

    app = Starlette(routes=[Route(f"/runs/{{run:{ID}}}", page, name="run")])
    urls = Urls(router=app.router)
    assert urls.path("run", run="a/b") == "/runs/a~2Fb"
    with pytest.raises(NoMatchFound):
        urls.path("run", other="x")
    app.router.routes.append(Route("/later", page, name="later"))
    assert urls.path("later") == "/later"
    other = Starlette(routes=[Route(f"/elsewhere/{{run:{ID}}}", page, name="run")])
    assert Urls(router=other.router, prefix="/p").path("run", run="x") == "/p/elsewhere/x"
    assert urls.path("run", run="x") == "/runs/x"


# --- runs under odd ids, on both stores ----------------------------------------------


@dataclass(frozen=True)
class OddStore:
    client: TestClient
    backend: str


def write_odd_runs(store: str, workdir: Path, pg_schema: str | None = None) -> None:
    command = [sys.executable, str(TESTS_DIR / "odd_id_runs.py"), "--store", store]
    if pg_schema is not None:
        command += ["--pg-schema", pg_schema]
    for execution_id in ODD_IDS:
        command += ["--paused", execution_id]
    command += ["--failed", FAILED_ID]
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"}
    # With a PostgreSQL store the SDK still wants a SQLite path for its other files.
    env["FASTAIAGENT_LOCAL_DB"] = store if pg_schema is None else str(workdir / "local.db")
    done = subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(params=["sqlite", "postgres"])
def odd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OddStore]:
    """The seeded runs plus paused runs under every id of ``ODD_IDS`` and a failed one
    under ``FAILED_ID``, served by an app with the refund-bot registered."""
    if request.param == "sqlite":
        path = request.getfixturevalue("copy_store")()
        write_odd_runs(str(path), tmp_path)
        client = request.getfixturevalue("make_acting_client")(path)
        yield OddStore(client=client, backend="sqlite")
        return
    from conftest import PgStore, copy_pg_store, pg_name

    seeded = request.getfixturevalue("pg_seeded")
    # Asked for before make_pg_client, so the schemas go after its apps have closed.
    to_drop: list[Any] = request.getfixturevalue("pg_schemas_to_drop")
    made = PgStore(seeded.dsn, pg_name("fastaiagent"), pg_name("localui"))
    to_drop.extend((made.raw, made.app_raw))
    copy_pg_store(seeded.dsn, seeded.schema, made.dsn, made.schema)
    write_odd_runs(made.dsn, tmp_path, pg_schema=made.schema)
    make_pg_client: Callable[..., TestClient] = request.getfixturevalue("make_pg_client")
    yield OddStore(client=make_pg_client(made), backend="postgres")


@pytest.fixture
def pg_schemas_to_drop() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for raw in made:
        raw.drop()


def runs_by_id(client: TestClient) -> dict[str, dict[str, Any]]:
    body = client.get("/runs.json").json()
    assert body["next"] is None
    return {r["execution_id"]: r for r in body["runs"]}


def attr(html: str, name: str, pattern: str) -> list[str]:
    """Values of attribute ``name`` matching ``pattern``, unescaped as a browser reads them."""
    return [unescape(v) for v in re.findall(rf'{name}="([^"]*)"', html) if re.search(pattern, v)]


def test_runs_with_odd_ids_open_with_all_their_parts(odd: OddStore) -> None:
    client = odd.client
    listed = runs_by_id(client)
    for execution_id in (*ODD_IDS, FAILED_ID):
        run_url = listed[execution_id]["url"]
        assert "%" not in run_url and "?" not in run_url and "#" not in run_url
        page = client.get(run_url, headers=JSON)
        assert page.status_code == 200, (execution_id, run_url)
        body = page.json()
        assert body["execution_id"] == execution_id
        # The .json twin of the same URL, and the page a person reads.
        assert client.get(f"{run_url}.json").json()["execution_id"] == execution_id
        html = client.get(run_url).text
        assert f"Run <code>{execution_id}</code>" in unescape(html)
        # Every row opens from the link the timeline gives it, for this run.
        for row in body["rows"]:
            opened = client.get(row["detail_url"], headers=JSON)
            assert opened.status_code == 200, row["detail_url"]
            assert opened.json()["execution_id"] == execution_id
        # The diff links of the timeline and its A/B form stay on this run.
        (diff_form,) = attr(html, "action", r"/diff$")
        assert (
            client.get(
                diff_form,
                params={
                    "a": body["rows"][0]["checkpoint_id"],
                    "b": body["rows"][-1]["checkpoint_id"],
                },
            ).status_code
            == 200
        )
        for link in attr(html, "href", r"/diff\?"):
            assert client.get(link, headers=JSON).json()["execution_id"] == execution_id
        # The live stream of the page is this run's.
        (stream,) = attr(html, "sse-connect", r".")
        assert tilde_decode(urlsplit(stream).path.rsplit("/", 1)[1]) == execution_id
    for execution_id in ODD_IDS:
        item = client.get(listed[execution_id]["url"], headers=JSON).json()
        assert item["state"] == "paused"
        card = client.get(f"/approvals/{tilde_encode(execution_id)}.json").json()
        assert card["execution_id"] == execution_id and card["pending"] is not None
        assert client.get(card["pending"]["url"]).status_code == 200


def test_each_card_decides_its_own_run_and_nothing_else(odd: OddStore) -> None:
    client = odd.client
    before = runs_by_id(client)
    for n, execution_id in enumerate(ODD_IDS):
        html = client.get("/approvals").text
        card_id = f"approval-{dom_id(execution_id)}"
        card = re.search(rf'<article class="approval" id="{card_id}">.*?</article>', html, re.S)
        assert card is not None, execution_id
        # The form posts to Approve, for htmx and without it; Reject names its own URL.
        (approve,) = attr(card.group(0), "hx-post", r"/approve$")
        assert attr(card.group(0), " action", r"/approve$") == [approve]
        (reject,) = attr(card.group(0), "formaction", r"/reject$")
        assert reject == approve.removesuffix("/approve") + "/reject"
        # The decision's answer goes to the card's result (its notes' form to its notes).
        (target,) = attr(card.group(0), "hx-target", r"-result$")
        assert target == f"#{card_id}-result"
        # Both forms, the decision's and the note's, bind to the one paused row shown.
        (checkpoint_id,) = set(re.findall(r'name="checkpoint_id" value="([^"]*)"', card.group(0)))
        form = {"approver": "Ann Approver", "reason": "ok", "checkpoint_id": checkpoint_id}
        if n % 2:
            # A browser without JavaScript: the form posts, then follows the 303.
            answer = client.post(approve, data=form, follow_redirects=False)
            assert answer.status_code == 303
            location = answer.headers["location"]
            assert location == before[execution_id]["url"].replace("/runs/", "/approvals/")
            assert client.get(location).status_code == 200
        else:
            answer = client.post(approve, data=form, headers=HTMX)
            assert answer.status_code == 200, answer.text
            assert f'id="outcome-{dom_id(execution_id)}"' in answer.text
        after = runs_by_id(client)
        # This run completed; every other run is as it was (a prune would have
        # taken the completed ones, a wrong id would have decided another).
        assert after[execution_id]["state"] == "completed"
        assert set(after) == set(before)
        for other, facts in after.items():
            if other != execution_id and other not in ODD_IDS[:n]:
                assert facts["state"] == before[other]["state"], other
        decisions = client.get(before[execution_id]["url"], headers=JSON).json()["decisions"]
        assert [(d["approver"], d["outcome"]) for d in decisions] == [("Ann Approver", "completed")]


def test_an_htmx_resume_of_a_run_with_a_non_latin1_id_redirects(odd: OddStore) -> None:
    client = odd.client
    run_url = runs_by_id(odd.client)[FAILED_ID]["url"]
    html = client.get(run_url).text
    (resume,) = attr(html, "hx-post", r"/resume$")
    page = client.get(run_url, headers=JSON).json()
    answer = client.post(
        resume,
        data={"checkpoint_id": page["resume"]["checkpoint_id"], "confirm": "yes"},
        headers=HTMX,
    )
    assert answer.status_code == 204, answer.text
    redirect = answer.headers["hx-redirect"]
    assert redirect.isascii() and redirect == f"{run_url}#outcome"
    assert client.get(redirect.split("#")[0], headers=JSON).json()["state"] == "completed"


@pytest.mark.parametrize("approver", ["王小明", "Łukasz", "Zoë; path=/"])
def test_an_approver_outside_latin1_gets_the_success_answer_and_is_remembered(
    approver: str, make_acting_client: Any, copy_store: Callable[[], Path]
) -> None:
    client: TestClient = make_acting_client(copy_store())
    queue = client.get("/approvals.json").json()["approvals"]
    first, second = queue[0], queue[1]
    answer = client.post(
        f"{first['url']}/approve",
        data={"approver": approver, "reason": "", "checkpoint_id": first["checkpoint_id"]},
        headers=HTMX,
    )
    assert answer.status_code == 200, answer.text
    assert "the run completed" in answer.text
    cookie = answer.headers["set-cookie"]
    assert cookie.isascii() and "Path=/" in cookie.replace("path=/", "Path=/")
    assert unquote(client.cookies["localui_approver"]) == approver
    html = client.get(second["url"]).text
    field = re.search(r'<input name="approver" value="([^"]*)"', html)
    assert field is not None and unescape(field.group(1)) == approver
    run = client.get(first["run_url"], headers=JSON).json()
    assert run["decisions"][0]["approver"] == approver
