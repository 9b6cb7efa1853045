"""Twenty tabs in one browser stay live: they share one stream (a SharedWorker), so a
pause written by another process shows in every tab (the issue asks for two seconds;
the time is printed), and the browser still has connections for an approval made in
tab 1.

Browsers open at most six connections to one server; with a stream per tab, six
tabs left every request of that browser waiting.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from conftest import STOP_TIMEOUT_S, DemoServer, start_demo
from playwright.sync_api import Browser, Page, expect
from test_live import SCREENSHOTS, SEEDED_PAUSES, start_agent

TABS = 20
#: The bounds below tell an answer from none, not fast from slow (how fast is the
#: bench's to judge; these tests share two cores with the other test workers): with a
#: stream per tab, a tab past the sixth never showed the pause and the browser's
#: requests never answered. The issue asks for the pause in every tab within 2 s: the
#: time it took is printed.
#: A new pause in every open tab within this long.
ALL_TABS_S = 10.0
#: A decision (which resumes the run through the SDK) answers within this.
POST_S = 15.0
#: A page's request answers within this (20 ms with five tabs, none at all with six).
REQUEST_S = 10.0


@pytest.fixture(scope="module")
def tabs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    demo = start_demo(tmp_path_factory, "tabs-demo")
    try:
        yield demo
    finally:
        demo.server.stop(timeout=STOP_TIMEOUT_S)


def open_live(page: Page, path: str) -> Page:
    page.goto(path)
    expect(page.locator("html")).to_have_attribute("data-live", "open")
    return page


def test_twenty_tabs_show_a_new_pause_and_tab_one_still_acts(
    browser: Browser, tabs_server: DemoServer
) -> None:
    context = browser.new_context(base_url=tabs_server.url)
    errors: list[str] = []
    context.on("weberror", lambda error: errors.append(str(error.error)))
    try:
        first = open_live(context.new_page(), "/approvals")
        runs = [
            href
            for href in first.evaluate(
                "fetch('/').then(r => r.text()).then(t => [...new DOMParser()"
                ".parseFromString(t, 'text/html').querySelectorAll('table.runs tbody a')]"
                ".map(a => a.getAttribute('href')))"
            )
            if href.startswith("/runs/")
        ]
        pending = first.locator("article.approval a[href^='/approvals/']").first
        paths = [
            "/",
            "/?state=paused",
            "/?state=failed",
            "/?state=completed",
            "/approvals?order=newest",
            "/cache",
            "/prune",
            *[f"{run}" for run in runs[:10]],
            *[f"{run}/diff" for run in runs[:2]],
        ]
        approval = pending.get_attribute("href")
        if approval:
            paths.append(approval)
        paths = paths[: TABS - 1]
        assert len(paths) == TABS - 1
        tabs = [first] + [open_live(context.new_page(), path) for path in paths]
        for tab in tabs:
            expect(tab.locator("#nav-pending")).to_have_text(str(SEEDED_PAUSES))

        new_run = start_agent(tabs_server)
        written = time.monotonic()
        waiting = set(range(TABS))
        while waiting and time.monotonic() - written < ALL_TABS_S:
            for index in list(waiting):
                if tabs[index].locator("#nav-pending").inner_text() == str(SEEDED_PAUSES + 1):
                    waiting.discard(index)
        all_shown_s = time.monotonic() - written
        print(f"\n{TABS} tabs showed the new pause {all_shown_s:.2f} s after it was written")
        assert not waiting, f"tabs {sorted(waiting)} never showed the new pause"
        assert all_shown_s <= ALL_TABS_S
        # Tab 1 is a queue someone reads: the new pause waits behind its banner until asked.
        news = first.locator("#queue-news")
        expect(news).to_have_text("1 new waiting — show them")
        news.get_by_role("button", name="show them").click()
        card = first.locator(f"#approval-{new_run}")
        expect(card).to_be_visible()

        # Tab 1 asks and decides: the browser has connections to spare.
        started = time.monotonic()
        assert first.evaluate("fetch('/prune').then(r => r.status)") == 200
        request_s = time.monotonic() - started
        print(f"a request from tab 1 answered in {request_s:.2f} s with {TABS} tabs open")
        assert request_s <= REQUEST_S
        card.get_by_label("Approver").fill("Ada Manager")
        started = time.monotonic()
        card.get_by_role("button", name="Approve").click()
        expect(first.locator(f"#approval-{new_run}-result")).to_contain_text(
            "approved", timeout=POST_S * 1000
        )
        post_s = time.monotonic() - started
        print(f"an approval from tab 1 answered in {post_s:.2f} s with {TABS} tabs open")
        assert post_s <= POST_S
        for tab in tabs:
            expect(tab.locator("#nav-pending")).to_have_text(str(SEEDED_PAUSES))
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        tabs[-1].screenshot(path=str(SCREENSHOTS / "test_many_tabs-20th.png"), full_page=True)
        assert errors == []
    finally:
        context.close()


NO_SHARED_WORKER = "delete window.SharedWorker;"


def test_without_shared_workers_the_fifth_tab_says_it_is_paused(
    browser: Browser, tabs_server: DemoServer
) -> None:
    """A browser without SharedWorker keeps a stream per tab: the server refuses the
    fifth, that tab says its live updates are paused, and the others still act."""
    context = browser.new_context(base_url=tabs_server.url)
    context.add_init_script(NO_SHARED_WORKER)
    try:
        tabs = [open_live(context.new_page(), "/approvals") for _ in range(4)]
        fifth = context.new_page()
        fifth.goto("/")
        expect(fifth.locator("#live-paused")).to_be_visible()
        expect(fifth.locator("#live-paused")).to_contain_text("Live updates are paused")
        for tab in tabs:
            expect(tab.locator("#live-paused")).to_be_hidden()
        # Two connections are left for pages and actions.
        started = time.monotonic()
        status = tabs[0].evaluate("fetch('/cache').then(r => r.status)")
        assert status == 200 and time.monotonic() - started < REQUEST_S
        # One tab closes: the fifth takes its place when it tries again.
        tabs[3].close()
        expect(fifth.locator("#live-paused")).to_be_hidden(timeout=10_000)
    finally:
        context.close()
