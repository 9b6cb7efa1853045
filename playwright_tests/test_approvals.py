"""An approver with the queue open in two tabs: the second click is told who decided.

This acts on its runs, so it starts a demo server of its own: the session demo
server of conftest.py serves the other browser tests, which expect its runs as
seeded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STOP_TIMEOUT_S, start_demo
from playwright.sync_api import Browser, Locator, Page, expect

from localui.demo.scenarios import ALL_SCENARIOS

SCREENSHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"

#: The runs the demo leaves waiting for a person.
DEMO_PAUSES = sum(s.ends == "paused" for s in ALL_SCENARIOS)


@pytest.fixture(scope="module")
def approvals_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``localui demo`` on a store of its own, started as a person starts it."""
    demo = start_demo(tmp_path_factory, "approvals-demo")
    try:
        yield demo.url
    finally:
        demo.server.stop(timeout=STOP_TIMEOUT_S)


#: Times, on the page's own clock, the click on Approve and the first frame whose
#: result area says how the run ended; Playwright's polling would blur both.
TIME_THE_OUTCOME = """(resultId) => {
  const result = document.getElementById(resultId);
  const timing = (window.approveTiming = {});
  document.addEventListener("click", () => { timing.clicked = performance.now(); },
                            {capture: true, once: true});
  new MutationObserver(() => {
    if (timing.shown === undefined && result.textContent.includes("completed")) {
      timing.shown = performance.now();
    }
  }).observe(result, {childList: true, subtree: true, characterData: true});
}"""


def shoot(page: Page, step: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"test_approve_in_two_tabs-{step}.png"), full_page=True)


def context_value(card: Locator, key: str) -> str:
    """The value shown for one key of the card's frozen context (a queue's card loads
    it when opened)."""
    frozen = card.locator("details.frozen")
    if frozen.count() and frozen.get_attribute("open") is None:
        frozen.locator("summary").click()
    entry = card.locator("table.context tr").filter(has=card.page.locator("> th", has_text=key))
    return entry.locator("> td > span.value").inner_text()


def test_approve_in_two_tabs(browser: Browser, approvals_server: str) -> None:
    context = browser.new_context(base_url=approvals_server)
    errors: list[str] = []
    try:
        tab1, tab2 = context.new_page(), context.new_page()
        # Tab 2 stands for a tab whose live stream is not there (a sleeping laptop, a
        # proxy that buffers streams): it keeps showing the card after the decision.
        # (Its tabs share one stream through a SharedWorker, so tab 2 goes without it.)
        tab2.route(re.compile(r"/live/|live-shared\.js"), lambda route: route.abort())
        for tab in (tab1, tab2):
            tab.on("pageerror", lambda error: errors.append(str(error)))
            tab.goto("/approvals")
            expect(tab.locator("#nav-pending")).to_have_text(str(DEMO_PAUSES))
        first = tab1.locator("article.approval").first
        card_id = first.get_attribute("id")
        assert card_id is not None and card_id.startswith("approval-")
        run = card_id.removeprefix("approval-")
        order, amount = context_value(first, "order_id"), float(context_value(first, "amount"))
        card1, card2 = tab1.locator(f"#{card_id}"), tab2.locator(f"#{card_id}")
        expect(card2).to_be_visible()
        shoot(tab1, "1-queue")

        card1.get_by_label("Approver").fill("Ada Manager")
        card1.get_by_label("Reason").fill("within policy")
        outcome1 = tab1.locator(f"#approval-{run}-result")
        tab1.evaluate(TIME_THE_OUTCOME, f"approval-{run}-result")
        card1.get_by_role("button", name="Approve").click()
        expect(outcome1).to_contain_text("completed", timeout=15_000)
        took = tab1.evaluate("window.approveTiming.shown - window.approveTiming.clicked")
        print(f"\napprove click to outcome on screen: {took:.0f} ms (browser clock)")
        expect(outcome1).to_contain_text(
            re.compile(r"Ada Manager approved it at \S+: the run completed\.")
        )
        expect(outcome1).to_contain_text(
            f"The run completed: Done: refunded {amount:.2f} on {order}"
        )
        expect(card1.get_by_role("button", name="Approve")).to_have_count(0)
        shoot(tab1, "2-approved")

        # Tab 2 still shows the card as it was: the person there decides too.
        card2.get_by_label("Approver").fill("Bob Builder")
        card2.get_by_role("button", name="Approve").click()
        outcome2 = tab2.locator(f"#approval-{run}-result")
        expect(outcome2).to_contain_text("already approved by Ada Manager", timeout=15_000)
        expect(outcome2).to_contain_text("409")
        shoot(tab2, "3-stale-tab")

        tab2.goto(f"/approvals/{run}")
        expect(tab2.locator("main")).to_contain_text("This run is not waiting for a person now.")
        expect(tab2.locator("#decisions")).to_contain_text("Ada Manager approved it at")
        expect(tab2.locator("#decisions")).to_contain_text("within policy")
        expect(tab2.locator("#nav-pending")).to_have_text(str(DEMO_PAUSES - 1))
        shoot(tab2, "4-decided")

        # Reject posts to its own URL (the button's formaction), not the form's Approve.
        tab1.goto("/approvals")
        other = tab1.locator("article.approval").first
        other_id = other.get_attribute("id")
        assert other_id is not None and other_id != card_id
        other.get_by_label("Approver").fill("Ada Manager")
        other.get_by_label("Reason").fill("over budget")
        other.get_by_role("button", name="Reject").click()
        expect(tab1.locator(f"#{other_id}-result")).to_contain_text(
            re.compile(r"Ada Manager rejected it at \S+: the run completed\."), timeout=15_000
        )
        expect(tab1.locator("#nav-pending")).to_have_text(str(DEMO_PAUSES - 2))
        assert errors == []
    finally:
        context.close()
