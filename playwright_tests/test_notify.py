""" "Notify me": a pause written by another process shows one browser notification (one
per browser, not one per tab) and every tab's title counts what waits.

It writes runs, so it serves a store of its own: two runs the demo agent wrote
(one paused), not the whole demo, whose seeding is slow on a busy machine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from conftest import STOP_TIMEOUT_S, DemoServer
from helpers import start_localui
from playwright.sync_api import Browser, Page, expect
from test_live import LIVE_TIMEOUT_MS, shoot, start_agent

from localui.demo.scenarios import get_scenario, seed

SEEDED_PAUSES = 1

#: Records what the page shows with the Notification API, which Chromium would draw
#: outside the page where the test cannot see it; it still calls the real one.
RECORD_NOTIFICATIONS = """
(() => {
  const Real = window.Notification;
  window.shownNotifications = [];
  function Recorded(title, options) {
    window.shownNotifications.push({ title: title, body: (options || {}).body });
    return new Real(title, options);
  }
  Object.defineProperty(Recorded, "permission", { get: () => Real.permission });
  Recorded.requestPermission = (...args) => Real.requestPermission(...args);
  window.Notification = Recorded;
})();
"""


@pytest.fixture(scope="module")
def notify_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    workdir = tmp_path_factory.mktemp("notify-cwd")
    store = tmp_path_factory.mktemp("notify-store") / "local.db"
    seed(store, scenarios=(get_scenario("completed"), get_scenario("paused-1")))
    server = start_localui(
        ["serve", "--store", str(store), "--no-auth"],
        cwd=workdir,
        log=workdir.parent / f"{workdir.name}.log",
    )
    demo = DemoServer(server=server, store=store, workdir=workdir)
    try:
        yield demo
    finally:
        demo.server.stop(timeout=STOP_TIMEOUT_S)


def shown(page: Page) -> list[dict[str, str]]:
    notes: list[dict[str, str]] = page.evaluate("window.shownNotifications")
    return notes


def test_a_pause_from_another_process_notifies_once_per_browser_and_counts_in_the_title(
    browser: Browser, notify_server: DemoServer
) -> None:
    context = browser.new_context(base_url=notify_server.url)
    context.grant_permissions(["notifications"], origin=notify_server.url)
    context.add_init_script(RECORD_NOTIFICATIONS)
    try:
        tabs = [context.new_page(), context.new_page()]
        for tab in tabs:
            tab.goto("/approvals")
            expect(tab.locator("html")).to_have_attribute("data-live", "open")
            expect(tab).to_have_title(f"({SEEDED_PAUSES}) Approvals · localui")
        button = tabs[0].locator("#notify-toggle")
        expect(button).to_have_text("Notify me")
        button.click()
        expect(button).to_have_text("Notifying")
        expect(button).to_have_attribute("aria-pressed", "true")
        tabs[1].reload()
        expect(tabs[1].locator("#notify-toggle")).to_have_text("Notifying")
        expect(tabs[1].locator("html")).to_have_attribute("data-live", "open")

        start_agent(notify_server)

        for tab in tabs:
            expect(tab).to_have_title(
                f"({SEEDED_PAUSES + 1}) Approvals · localui", timeout=LIVE_TIMEOUT_MS
            )
        deadline = time.monotonic() + LIVE_TIMEOUT_MS / 1000
        while time.monotonic() < deadline and not any(shown(t) for t in tabs):
            time.sleep(0.1)
        time.sleep(1.0)  # both tabs had their pushes: still one notification
        notes = [n for t in tabs for n in shown(t)]
        assert notes == [
            {
                "title": f"{SEEDED_PAUSES + 1} runs wait for a person",
                "body": "A new pause is in the approvals queue.",
            }
        ]
        shoot(tabs[0], "notify-1-title-count")
    finally:
        context.close()
