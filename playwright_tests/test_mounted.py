"""localui mounted at /ops/localui inside a parent Starlette app, in a real Chromium.

The server is ``mounted_app.py`` (a parent app that mounts ``create_app`` and enters
its lifespan, as the README shows) run by uvicorn in a child process, over a demo
store. A person walks every page, opens a row, runs a diff, approves a paused run and
watches a pause made by another process appear; the browser's own request log then
shows that no request left the prefix and that nothing answered 404 or 5xx.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from helpers import free_port
from playwright.sync_api import Browser, Page, Response, expect

from localui.demo.scenarios import ALL_SCENARIOS
from localui.views.urls import dom_id

HERE = Path(__file__).resolve().parent
PREFIX = "/ops/localui"
LIVE_TIMEOUT_MS = 10_000
#: How long the approvals queue ignores clicks after its cards move (static/desk.js).
DESK_GUARD_MS = 300
START_TIMEOUT_S = 120.0
#: A run id chosen by the SDK's caller that once made Approve send a real prune.
ODD_ID = "../../prune?older_than=0s&x=/王#1"
#: The sign-in token the mounted app's owner opens it with.
TOKEN = "token-of-the-mounted-app-owner"
SCREENSHOTS = HERE.parent / "artifacts" / "screenshots"
#: What ``localui demo --seed-only`` writes: every runner shape's runs, and those of them
#: that wait for a person or completed.
#: The demo's runs as ``localui demo --seed-only`` writes them (its edited branches are
#: made by a served demo, so none here).
DEMO_RUNS = len(ALL_SCENARIOS)
DEMO_PAUSES = sum(s.ends == "paused" for s in ALL_SCENARIOS)
DEMO_COMPLETED = sum(s.ends == "completed" for s in ALL_SCENARIOS)


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass(frozen=True)
class MountedServer:
    origin: str
    store: Path
    workdir: Path


def child_env(store: Path) -> dict[str, str]:
    return {
        **os.environ,
        "FASTAIAGENT_TRACE_ENABLED": "false",
        "FASTAIAGENT_LOCAL_DB": str(store),
    }


@pytest.fixture(scope="module")
def mounted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MountedServer]:
    workdir = tmp_path_factory.mktemp("mounted-cwd")
    store = tmp_path_factory.mktemp("mounted-store") / "local.db"
    localui = str(Path(sys.executable).parent / "localui")
    seeded = subprocess.run(
        [localui, "demo", "--seed-only", "--store", str(store)],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert seeded.returncode == 0, seeded.stderr
    odd = subprocess.run(
        [sys.executable, str(HERE.parent / "tests" / "odd_id_runs.py"), "--store", str(store)]
        + ["--paused", ODD_ID],
        cwd=workdir,
        env=child_env(store),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert odd.returncode == 0, odd.stderr
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    log_path = workdir.parent / f"{workdir.name}.log"
    command = [sys.executable, str(HERE / "mounted_app.py"), "--store", str(store)]
    command += ["--port", str(port), "--token", TOKEN]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=child_env(store),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not answers(f"{origin}/"):  # the parent answers once the lifespans ran
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"the mounted app did not serve:\n{log_path.read_text()}", pytrace=False
                    )
                time.sleep(0.1)
            yield MountedServer(origin=origin, store=store, workdir=workdir)
        finally:
            stop(process)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def pause_in_another_process(server: MountedServer) -> str:
    """The refund-bot asks, in a process of its own, for a refund that waits."""
    done = subprocess.run(
        [sys.executable, "-m", "localui.demo.worker", "--store", str(server.store)]
        + ["--scenario", "paused-1"],
        cwd=server.workdir,
        env=child_env(server.store),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def shoot(page: Page, step: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"test_mounted-{step}.png"), full_page=True)


def test_a_person_uses_every_part_of_localui_mounted_in_another_app(
    browser: Browser, mounted_server: MountedServer
) -> None:
    context = browser.new_context(base_url=mounted_server.origin)
    requested: list[str] = []
    answered: list[tuple[int, str]] = []
    errors: list[str] = []
    context.on("request", lambda request: requested.append(request.url))

    def on_response(response: Response) -> None:
        answered.append((response.status, response.url))

    context.on("response", on_response)
    context.on("weberror", lambda error: errors.append(str(error.error)))
    try:
        page = context.new_page()
        # Signing in by the owner's link, under the prefix: the token leaves the URL.
        page.goto(f"{PREFIX}/?token={TOKEN}")
        expect(page).to_have_url(f"{mounted_server.origin}{PREFIX}/")
        # The runs list, and every page the nav and the pages link to.
        # The demo's runs and the odd-id run.
        expect(page.locator("table.runs tbody tr")).to_have_count(DEMO_RUNS + 1)
        page.get_by_role("link", name="Paused").first.click()
        expect(page).to_have_url(f"{mounted_server.origin}{PREFIX}/?state=paused")
        page.locator("header nav").get_by_role("link", name="Prune").click()
        expect(page.locator("h1")).to_have_text("Prune")
        page.get_by_role("link", name="See the cache entries it removes.").click()
        expect(page.locator("h1")).to_have_text("Idempotency cache")
        page.locator("header nav").get_by_role("link", name="Runs").click()

        # A run: open its first row, then diff its first and last rows.
        page.get_by_label("Search").fill("A-1005")
        expect(page).to_have_url(re.compile(r"q=A-1005"))
        expect(page.locator("table.runs tbody tr")).to_have_count(1)
        page.locator("table.runs tbody tr a").first.click()
        expect(page.locator("#timeline")).to_be_visible()
        rows = page.locator("#timeline details.row")
        rows.first.locator("summary").click()
        expect(rows.first.locator(".row-detail")).to_be_visible()
        # The pickers sit beside each row's summary, one pair per row.
        page.locator("#timeline .row-tools input[name=a]").first.check()
        page.locator("#timeline .row-tools input[name=b]").last.check()
        page.get_by_role("button", name="Diff A → B").click()
        expect(page.locator("#diff")).to_be_visible()
        run_path = re.escape(f"{PREFIX}/runs/")
        expect(page).to_have_url(re.compile(rf"{run_path}[^/]+/diff\?a=.+&b=.+"))
        page.get_by_role("link", name="Swap A and B").click()
        expect(page.locator("#diff")).to_be_visible()
        shoot(page, "1-diff")
        page.get_by_role("link", name="in its run").first.click()
        expect(page.locator("#timeline")).to_be_visible()

        # The queue: a pause made by another process appears without a reload.
        page.locator("header nav").get_by_role("link", name="Approvals").click()
        expect(page).to_have_url(re.compile(r"/approvals$"))
        expect(page.locator("html")).to_have_attribute("data-live", "open")
        cards = page.locator("article.approval")
        expect(cards).to_have_count(DEMO_PAUSES + 1)
        new_run = pause_in_another_process(mounted_server)
        expect(page.locator("#nav-pending")).to_have_text(
            str(DEMO_PAUSES + 2), timeout=LIVE_TIMEOUT_MS
        )
        # It waits behind a banner, not pushed between the cards being read; asked for,
        # it shows.
        news = page.locator("#queue-news")
        expect(news).to_have_text("1 new waiting — show them", timeout=LIVE_TIMEOUT_MS)
        news.get_by_role("button", name="show them").click()
        card = page.locator(f"#approval-{dom_id(new_run)}")
        expect(card).to_be_visible()
        expect(cards).to_have_count(DEMO_PAUSES + 2)
        shoot(page, "2-queue")

        # Approve it: the decision goes to the mounted app, the outcome links under it.
        expect(card).to_contain_text("Mounted Owner")  # signed in: no name to type
        # For 300 ms after cards move the queue ignores clicks (desk.js's pointer rule);
        # a person takes longer than that to aim, and so does this test.
        page.wait_for_timeout(DESK_GUARD_MS + 200)
        card.get_by_role("button", name="Approve").click()
        outcome = page.locator(f"#approval-{dom_id(new_run)}-result")
        expect(outcome).to_contain_text("the run completed", timeout=LIVE_TIMEOUT_MS)
        expect(page.locator("#nav-pending")).to_have_text(
            str(DEMO_PAUSES + 1), timeout=LIVE_TIMEOUT_MS
        )
        outcome.get_by_role("link", name="Open the run").click()
        expect(page.locator("#run-state .meta .state")).to_have_text("completed")
        expect(page.locator("#decisions")).to_contain_text("Mounted Owner approved it")
        shoot(page, "3-approved")

        # The card of the run whose id looks like a prune URL decides that run only:
        # every run is still there, the completed ones a prune would have taken too.
        page.locator("header nav").get_by_role("link", name="Approvals").click()
        odd = page.locator(f"#approval-{dom_id(ODD_ID)}")
        odd.get_by_role("button", name="Approve").click()
        expect(page.locator(f"#approval-{dom_id(ODD_ID)}-result")).to_contain_text(
            "the run completed", timeout=LIVE_TIMEOUT_MS
        )
        page.locator(f"#approval-{dom_id(ODD_ID)}-result").get_by_role(
            "link", name="Open the run"
        ).click()
        expect(page.locator("h1 code")).to_have_text(ODD_ID)
        expect(page.locator("#decisions")).to_contain_text("Mounted Owner approved it")
        page.locator("header nav").get_by_role("link", name="Runs").click()
        expect(page.locator("table.runs tbody tr")).to_have_count(DEMO_RUNS + 2)
        expect(page.locator("#runs-table .tab.state-completed .count")).to_have_text(
            str(DEMO_COMPLETED + 2)
        )

        # The browser's own log: every request stayed under the prefix, none went unanswered.
        ours = [url for url in requested if url.startswith(mounted_server.origin)]
        assert len(ours) == len(requested), [u for u in requested if u not in ours]
        outside = [u for u in ours if not urlsplit(u).path.startswith(f"{PREFIX}/")]
        assert outside == []
        kinds = {urlsplit(u).path.split("/")[3] for u in ours}
        # The live stream is the tabs' SharedWorker's, outside any page's log; the queue
        # went live under the prefix above.
        assert {"static", "runs", "approvals", "prune", "cache"} <= kinds, kinds
        assert [(status, url) for status, url in answered if status == 404 or status >= 500] == []
        assert errors == []
    finally:
        context.close()
