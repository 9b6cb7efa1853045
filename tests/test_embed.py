"""localui mounted inside a parent app, and served behind a proxy with ``--root-path``.

The README's example (``examples/embed.py``) is run as it is; then an acting app is
mounted the same way and its pages, links and actions are checked to stay under the
prefix. ``--root-path`` is checked on the real ``localui demo`` process over HTTP.
"""

from __future__ import annotations

import contextlib
import re
import runpy
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import LOCALUI, LOOPBACK_CLIENT, TEST_TOKEN, sign_in_settings
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from localui.app import create_app, lifespan_of
from localui.settings import Settings

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "embed.py"
PREFIX = "/ops/localui"
BASE_URL = "http://127.0.0.1:8765"
LINK = re.compile(r'\s(href|action|formaction|src|hx-get|hx-post|sse-connect)="([^"]*)"')
HTMX = {"HX-Request": "true", "Sec-Fetch-Site": "same-origin"}
JSON = {"Accept": "application/json"}


def links(html: str) -> list[str]:
    """Every URL a page makes the browser request or offers to follow (in-page anchors
    aside), as the browser reads it."""
    return [unescape(url) for _, url in LINK.findall(html) if not url.startswith("#")]


def assert_under(prefix: str, html: str) -> list[str]:
    found = links(html)
    assert found, "a page without links"
    outside = [url for url in found if not url.startswith(prefix + "/")]
    assert outside == [], outside
    return found


def test_the_readme_shows_the_example_that_runs_here() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Embed it in your app", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    assert block.group(1) == EXAMPLE.read_text()


def test_the_readme_example_serves_localui_under_its_prefix(
    app_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FASTAIAGENT_LOCAL_DB", str(app_store))
    # Sign-in stays on in the example: Ann opens the link `localui users add` prints.
    added = subprocess.run(
        [str(LOCALUI), "users", "add", "Ann", "--role", "approver", "--store", str(app_store)]
        + ["--url", f"{BASE_URL}{PREFIX}/"],
        capture_output=True,
        text=True,
        check=True,
    )
    link = re.search(r"signs in at (\S+)", added.stdout)
    assert link is not None, added.stdout
    app = runpy.run_path(str(EXAMPLE))["app"]
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        assert client.get("/").text == "my app"
        assert client.get(f"{PREFIX}/").status_code == 401
        signed_in = client.get(link.group(1).removeprefix(BASE_URL), follow_redirects=False)
        assert signed_in.status_code == 303
        assert signed_in.headers["location"] == f"{PREFIX}/"
        page = client.get(f"{PREFIX}/")
        assert page.status_code == 200
        assert_under(PREFIX, page.text)
        assert client.get(f"{PREFIX}/runs.json").json()["runs"]


@pytest.fixture
def mounted(make_acting_client: Any, copy_store: Callable[[], Path]) -> Iterator[TestClient]:
    """An acting localui (the refund-bot registered) mounted at ``PREFIX`` of a parent."""
    from fastaiagent.checkpointers import SQLiteCheckpointer

    from localui.demo.agent import build_agent

    path = copy_store()
    checkpointer = SQLiteCheckpointer(str(path))
    settings = Settings(store=str(path), sign_in=sign_in_settings())
    ui = create_app(settings, agents=[build_agent(checkpointer)])

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with lifespan_of(ui):
            yield

    parent = Starlette(routes=[Mount(PREFIX, app=ui)], lifespan=lifespan)
    try:
        with TestClient(parent, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
            # Signing in works under the prefix too: the link's redirect and the
            # session cookie stay there.
            answer = client.get(f"{PREFIX}/?token={TEST_TOKEN}", follow_redirects=False)
            assert answer.status_code == 303
            assert answer.headers["location"] == f"{PREFIX}/"
            yield client
    finally:
        checkpointer.close()


def test_every_page_links_only_under_the_prefix(mounted: TestClient) -> None:
    client = mounted
    runs = client.get(f"{PREFIX}/runs.json").json()["runs"]
    pages = [f"{PREFIX}/", f"{PREFIX}/runs", f"{PREFIX}/approvals", f"{PREFIX}/prune"]
    pages += [f"{PREFIX}/cache", f"{PREFIX}/approvals?order=newest"]
    pages += [run["url"] for run in runs]
    seen: set[str] = set()
    for path in pages:
        assert path.startswith(PREFIX + "/"), path
        page = client.get(path)
        assert page.status_code == 200, path
        for url in assert_under(PREFIX, page.text):
            seen.add(url.split("?")[0].split("#")[0])
    # Each link that is a plain GET opens under the prefix: rows, diffs, statics,
    # forks' sources, the cache and prune pages, the live streams' paths aside (they
    # do not end, and TestClient waits for a whole response).
    for url in sorted(seen):
        if "/live/" in url or url.endswith(
            ("/approve", "/reject", "/bulk", "/resume", "/fork", "/signout", "/notes")
        ):
            continue
        answer = client.get(url, headers=JSON if "/static/" not in url else {})
        assert answer.status_code in (200, 400), url  # a diff without ?a=&b= is a 400
    css = client.get(f"{PREFIX}/static/localui.css")
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]


def test_actions_answer_and_redirect_under_the_prefix(mounted: TestClient) -> None:
    client = mounted
    queue = client.get(f"{PREFIX}/approvals.json").json()["approvals"]
    first, second = queue[0], queue[1]
    assert first["url"].startswith(f"{PREFIX}/approvals/")
    form = {"approver": "Ann", "reason": "ok", "checkpoint_id": first["checkpoint_id"]}
    # A cross-site POST is refused under the mount too.
    refused = client.post(
        f"{first['url']}/approve", data=form, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert refused.status_code == 403
    # A form without JavaScript: the 303 goes back under the prefix.
    answer = client.post(f"{first['url']}/approve", data=form, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == first["url"]
    # htmx: the outcome fragment's links stay under the prefix.
    form = {"approver": "Ann", "reason": "", "checkpoint_id": second["checkpoint_id"]}
    answer = client.post(f"{second['url']}/approve", data=form, headers=HTMX)
    assert answer.status_code == 200 and "the run completed" in answer.text
    assert_under(PREFIX, answer.text)
    # A fork through htmx redirects to the new run, under the prefix.
    run = client.get(first["run_url"], headers=JSON).json()
    fork = client.post(
        f"{first['run_url']}/fork",
        data={"checkpoint_id": run["rows"][0]["checkpoint_id"]},
        headers=HTMX,
    )
    assert fork.status_code == 204, fork.text
    new_run = fork.headers["hx-redirect"]
    assert new_run.startswith(f"{PREFIX}/runs/")
    assert client.get(new_run).status_code == 200


def test_a_parent_that_skips_the_lifespan_is_told_what_to_do(app_store: Path) -> None:
    ui = create_app(Settings(store=str(app_store)))
    parent = Starlette(routes=[Mount(PREFIX, app=ui)])
    with TestClient(parent, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        with pytest.raises(RuntimeError, match=r"lifespan_of"):
            client.get(f"{PREFIX}/")


# --- behind a proxy that strips the prefix: --root-path ------------------------------


@pytest.fixture(scope="module")
def behind_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``localui demo --root-path tools/localui/``, as a person starts it; its address."""
    from helpers import start_localui, wait_until_seeded

    store = tmp_path_factory.mktemp("root-path") / "local.db"
    args = ["demo", "--store", str(store), "--root-path", "tools/localui/", "--no-auth"]
    cwd = tmp_path_factory.mktemp("root-path-cwd")
    server = start_localui(args, cwd=cwd, log=cwd.parent / "root-path.log", timeout=120)
    try:
        # The demo serves while it seeds: the approvals below are among its runs.
        wait_until_seeded(server)
        yield server.url
    finally:
        server.stop()


def test_root_path_puts_the_prefix_on_links_and_redirects(behind_proxy: str) -> None:
    # The proxy strips /tools/localui, so requests arrive at the server's own paths.
    with httpx.Client(base_url=behind_proxy) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert_under("/tools/localui", page.text)
        approvals = client.get("/approvals.json").json()["approvals"]
        assert approvals and approvals[0]["url"].startswith("/tools/localui/approvals/")
        card = approvals[0]
        own_path = card["url"].removeprefix("/tools/localui")
        assert_under("/tools/localui", client.get(own_path).text)
        answer = client.post(
            f"{own_path}/approve",
            data={"approver": "Ann", "reason": "", "checkpoint_id": card["checkpoint_id"]},
        )
        assert answer.status_code == 303
        assert answer.headers["location"] == card["url"]
        assert client.get("/static/localui.css").status_code == 200


def test_root_path_is_normalised() -> None:
    from localui.cli import normal_root_path

    assert normal_root_path("tools/localui/") == "/tools/localui"
    assert normal_root_path("/tools/localui") == "/tools/localui"
    assert normal_root_path("") == "" and normal_root_path("/") == ""
