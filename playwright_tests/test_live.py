"""Pages that keep themselves current: an agent in another process pauses, and the
open runs list, queue and run page show it without a reload; an approval in one
tab clears the queue in the others and completes the run page.

It writes runs, so it starts a demo server of its own: the session demo server
of conftest.py serves the other browser tests, which expect its runs as seeded.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STOP_TIMEOUT_S, DemoServer, start_demo
from playwright.sync_api import Browser, Page, expect

from localui.demo.edits import EDITED
from localui.demo.scenarios import ALL_SCENARIOS

SCREENSHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
#: A change shows up within about a second; this only bounds a broken page's wait.
LIVE_TIMEOUT_MS = 10_000
#: The demo's runs: its scenarios and the branches it edits of two of them.
SEEDED_RUNS = len(ALL_SCENARIOS) + len(EDITED)
SEEDED_PAUSES = sum(s.ends == "paused" for s in ALL_SCENARIOS)

#: Counts the live streams a page asks for (its tabs share one EventSource in a
#: SharedWorker, asked for with a "watch" message): a live push must not reconnect.
COUNT_EVENT_SOURCES = """
(() => {
  const original = MessagePort.prototype.postMessage;
  window.eventSourcesOpened = 0;
  MessagePort.prototype.postMessage = function (message, ...rest) {
    if (message && message.type === "watch") window.eventSourcesOpened += 1;
    return original.call(this, message, ...rest);
  };
})();
"""


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    """``localui demo`` on a store of its own, started as a person starts it."""
    demo = start_demo(tmp_path_factory, "live-demo")
    try:
        yield demo
    finally:
        demo.server.stop(timeout=STOP_TIMEOUT_S)


def start_agent(server: DemoServer, scenario: str = "paused-1") -> str:
    """The demo agent in a process of its own, as a user's agent runs; by default it
    asks for a refund that pauses for a manager's approval. Returns its execution id."""
    env = {
        **os.environ,
        "FASTAIAGENT_TRACE_ENABLED": "false",
        "FASTAIAGENT_LOCAL_DB": str(server.store),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "localui.demo.worker",
            "--store",
            str(server.store),
            "--scenario",
            scenario,
        ],
        cwd=server.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def shoot(page: Page, step: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"test_live-{step}.png"), full_page=True)


def live_tab(page: Page, path: str) -> Page:
    """Open ``path`` and wait until its stream is open."""
    page.add_init_script(COUNT_EVENT_SOURCES)
    page.goto(path)
    expect(page.locator("html")).to_have_attribute("data-live", "open")
    return page


def test_an_agent_in_another_process_shows_up_and_an_approval_clears_it(
    browser: Browser, live_server: DemoServer
) -> None:
    # Two people: one watching three tabs, one deciding (each browser has its own
    # connections, as two people's would: a browser holds six per server).
    context = browser.new_context(base_url=live_server.url)
    desk_context = browser.new_context(base_url=live_server.url)
    errors: list[str] = []
    for each in (context, desk_context):
        each.on("weberror", lambda error: errors.append(str(error.error)))
    try:
        runs_tab = live_tab(context.new_page(), "/")
        queue_tab = live_tab(context.new_page(), "/approvals")
        # The third tab lists paused runs, then opens the new run's page (it has none
        # before the agent starts).
        run_tab = live_tab(context.new_page(), "/?state=paused")
        rows = runs_tab.locator("table.runs tbody tr")
        expect(rows).to_have_count(SEEDED_RUNS)
        cards = queue_tab.locator("article.approval")
        expect(cards).to_have_count(SEEDED_PAUSES)
        # Someone is half-way through deciding another card: a live update keeps it.
        other = queue_tab.locator(f"#{cards.first.get_attribute('id')}")
        other.get_by_label("Reason").fill("checking the order first")

        new_run = start_agent(live_server)

        # The runs list: the new run at the top, paused, with the rows it wrote.
        row = runs_tab.locator(f"#run-{new_run}")
        expect(row).to_be_visible(timeout=LIVE_TIMEOUT_MS)
        expect(rows.first).to_have_id(f"run-{new_run}")
        expect(row.locator("span.state")).to_have_text("paused")
        expect(row).to_contain_text("waiting: manager_approval")
        expect(rows).to_have_count(SEEDED_RUNS + 1)
        expect(runs_tab.locator("#runs-table .tab.state-paused .count")).to_have_text(
            str(SEEDED_PAUSES + 1)
        )
        # The queue: someone is reading it, so the new pause waits behind a banner rather
        # than move the cards; asked for, its card shows. The badge is on every tab.
        news = queue_tab.locator("#queue-news")
        expect(news).to_have_text("1 new waiting — show them", timeout=LIVE_TIMEOUT_MS)
        expect(cards).to_have_count(SEEDED_PAUSES)
        card = queue_tab.locator(f"#approval-{new_run}")
        expect(card).to_have_count(0)
        news.get_by_role("button", name="show them").click()
        expect(card).to_be_visible()
        expect(card).to_contain_text("A-1002")
        expect(cards).to_have_count(SEEDED_PAUSES + 1)
        expect(news).to_have_text("")
        for tab in (runs_tab, queue_tab, run_tab):
            expect(tab.locator("#nav-pending")).to_have_text(
                str(SEEDED_PAUSES + 1), timeout=LIVE_TIMEOUT_MS
            )
        expect(other.get_by_label("Reason")).to_have_value("checking the order first")
        # The paused-runs view follows its own filter, not the whole list.
        expect(run_tab.locator(f"#run-{new_run}")).to_be_visible(timeout=LIVE_TIMEOUT_MS)
        expect(run_tab.locator("table.runs tbody tr")).to_have_count(SEEDED_PAUSES + 1)
        shoot(runs_tab, "1-runs")
        shoot(queue_tab, "2-queue")

        # Its run page, with its first row opened by the person reading it.
        run_tab.goto(f"/runs/{new_run}")
        expect(run_tab.locator("html")).to_have_attribute("data-live", "open")
        expect(run_tab.locator("#run-state .meta .state")).to_have_text("paused")
        timeline_rows = run_tab.locator("#timeline details.row")
        paused_rows = timeline_rows.count()
        first_row = timeline_rows.first
        first_row.locator("summary").click()
        expect(first_row.locator(".row-detail")).to_be_visible()

        # A manager approves it in a browser of their own.
        desk = live_tab(desk_context.new_page(), "/approvals")
        desk_card = desk.locator(f"#approval-{new_run}")
        desk_card.get_by_label("Approver").fill("Ada Manager")
        desk_card.get_by_role("button", name="Approve").click()
        outcome = desk.locator(f"#approval-{new_run}-result")
        expect(outcome).to_contain_text("the run completed", timeout=LIVE_TIMEOUT_MS)
        # The decided card keeps its place with the outcome in it, through the live update
        # that takes its pause off the queue, until the decider dismisses it.
        desk_item = desk.locator(f"#approvals-queue .queue-item[data-run='{new_run}']")
        expect(desk_item).to_have_class(re.compile(r"\bgone\b"), timeout=LIVE_TIMEOUT_MS)
        expect(outcome).to_be_visible()
        expect(desk_card.get_by_role("button", name="Approve")).to_have_count(0)
        shoot(desk, "3-decided")
        desk_item.get_by_role("button", name="Dismiss").click()
        expect(desk_item).to_have_count(0)

        # In the first tab's queue, without a reload, the card turns into a note in its
        # place saying who decided; the half-typed card is intact.
        note = queue_tab.locator(f"#approvals-queue .queue-item[data-run='{new_run}']")
        expect(note).to_contain_text("approved by Ada Manager", timeout=LIVE_TIMEOUT_MS)
        expect(card).to_have_count(0)
        expect(cards).to_have_count(SEEDED_PAUSES)
        expect(other.get_by_label("Reason")).to_have_value("checking the order first")
        expect(queue_tab.locator("#nav-pending")).to_have_text(str(SEEDED_PAUSES))
        # Its run page turns completed, with the rows the resume wrote.
        expect(run_tab.locator("#run-state .meta .state")).to_have_text(
            "completed", timeout=LIVE_TIMEOUT_MS
        )
        expect(run_tab.locator("#verdict")).to_contain_text("Completed")
        expect(run_tab.locator("#pending")).to_have_count(0)
        expect(run_tab.locator("#decisions")).to_contain_text(
            "Ada Manager approved it at", timeout=LIVE_TIMEOUT_MS
        )
        expect(run_tab.locator("#timeline details.kind-run_end")).to_have_count(1)
        assert timeline_rows.count() > paused_rows
        # The row the person opened is still open, its detail still loaded.
        expect(first_row).to_have_attribute("open", "")
        expect(first_row.locator(".row-detail")).to_be_visible()
        # And the runs list shows it completed, and who decided it.
        expect(row.locator("span.state")).to_have_text("completed", timeout=LIVE_TIMEOUT_MS)
        expect(row.locator("span.decided")).to_have_text(
            "approved by Ada Manager", timeout=LIVE_TIMEOUT_MS
        )
        shoot(run_tab, "4-run-completed")

        # Every update was a swap on the stream each page opened once.
        for tab in (runs_tab, queue_tab, run_tab, desk):
            assert tab.evaluate("window.eventSourcesOpened") == 1
        assert errors == []
    finally:
        context.close()
        desk_context.close()


def test_a_filtered_runs_list_stays_filtered_as_it_updates(
    browser: Browser, live_server: DemoServer
) -> None:
    """The search box swaps the table in place (htmx); its stream must follow the filter."""
    context = browser.new_context(base_url=live_server.url)
    errors: list[str] = []
    context.on("weberror", lambda error: errors.append(str(error.error)))
    try:
        page = live_tab(context.new_page(), "/")
        rows = page.locator("table.runs tbody tr")
        page.get_by_label("Search").fill("A-1002")
        expect(page).to_have_url(re.compile(r"q=A-1002"))
        # Polled with evaluate: the CSP forbids the eval that wait_for_function uses.
        for _ in range(100):
            if page.evaluate("window.eventSourcesOpened") == 2:
                break
            page.wait_for_timeout(100)
        matching = rows.count()
        assert 0 < matching < SEEDED_RUNS
        assert page.evaluate("window.eventSourcesOpened") == 2  # reconnected with the filter

        other_run = start_agent(live_server, "completed")  # refunds A-1001: no match
        new_run = start_agent(live_server)  # asks to refund A-1002 again
        expect(page.locator(f"#run-{new_run}")).to_be_visible(timeout=LIVE_TIMEOUT_MS)
        expect(rows).to_have_count(matching + 1)
        expect(page.locator(f"#run-{other_run}")).to_have_count(0)
        expect(page.get_by_label("Search")).to_have_value("A-1002")
        assert page.evaluate("window.eventSourcesOpened") == 2
        shoot(page, "5-filtered")
        assert errors == []
    finally:
        context.close()
