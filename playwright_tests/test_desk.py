"""Two approvers on one queue: nothing moves under the pointer.

Approver B holds the pointer over card 1's Approve while approver A approves card 1
in another browser context; B's click at the same spot lands on the note that took
card 1's place, so card 2 is still waiting in the store. Newest first, a new pause
waits behind a banner instead of pushing the cards down.

It decides runs, so it starts a demo server of its own.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STOP_TIMEOUT_S, DemoServer, start_demo
from playwright.sync_api import Browser, BrowserContext, Page, expect
from test_live import start_agent

SCREENSHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
LIVE_TIMEOUT_MS = 15_000

#: The id of the queue item under a point, and whether a button is there.
UNDER = """([x, y]) => {
  const hit = document.elementFromPoint(x, y);
  const item = hit && hit.closest('.queue-item');
  const button = hit && hit.closest('button');
  return {item: item && item.id, button: button && button.textContent,
          gone: !!(item && item.classList.contains('gone'))};
}"""


@pytest.fixture(scope="module")
def desk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    demo = start_demo(tmp_path_factory, "desk-demo")
    try:
        yield demo
    finally:
        demo.server.stop(timeout=STOP_TIMEOUT_S)


def pending_in_store(store: Path) -> set[str]:
    """The runs the SDK's own table says are waiting, read from the file itself."""
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
        return {row[0] for row in conn.execute("SELECT execution_id FROM pending_interrupts")}


def approver(browser: Browser, server: DemoServer, name: str) -> BrowserContext:
    """A browser of its own whose approver name is remembered, as after a first decision."""
    # Tall enough for the whole queue: nothing scrolls, so a point on the screen stays
    # a point on the page (Playwright scrolls to fill a field, and a full-page
    # screenshot resets the scroll).
    context = browser.new_context(base_url=server.url, viewport={"width": 1200, "height": 2000})
    context.add_cookies(
        [{"name": "localui_approver", "value": name.replace(" ", "%20"), "url": server.url}]
    )
    return context


def open_queue(context: BrowserContext, path: str, errors: list[str]) -> Page:
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(path)
    # Live once the tabs' shared stream is open (it is the SharedWorker's request, not
    # the page's).
    expect(page.locator("html")).to_have_attribute("data-live", "open")
    return page


def center_of(page: Page, selector: str) -> tuple[float, float]:
    box = page.locator(selector).bounding_box()
    assert box is not None
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def shoot(page: Page, step: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"test_desk-{step}.png"), full_page=True)


def test_a_card_says_what_a_decision_does(browser: Browser, desk_server: DemoServer) -> None:
    errors: list[str] = []
    context = approver(browser, desk_server, "Ada Manager")
    try:
        page = open_queue(context, "/approvals", errors)
        one_tool = page.locator("article.approval").filter(has_text="A-1002")
        expect(one_tool.locator("h2 code.call")).to_have_text(
            'refund(order_id="A-1002", amount=250.0)'
        )
        effects = one_tool.locator("ul.effects")
        expect(effects).to_contain_text(
            "Approve → refund runs again with the answer approved=true, then the agent goes on;"
            " 1 @idempotent result is reused."
        )
        expect(effects).to_contain_text(
            "Reject → refund gets approved=false and your reason;"
            " what it does then is the agent's code."
        )
        expect(effects.locator("li.skipped")).to_have_count(0)
        # The queue's card is light: its frozen context loads when the person opens it.
        frozen = one_tool.locator("details.frozen")
        expect(frozen.locator("summary")).to_have_text(re.compile(r"^Frozen context · \d+ keys$"))
        expect(one_tool.locator("table.context")).to_have_count(0)
        frozen.locator("summary").click()
        # First-level values with their exact text, the nested policy folded.
        amount = one_tool.locator("table.context tr").filter(
            has=page.locator("th", has_text="amount")
        )
        expect(amount.locator("td")).to_have_text("250.0")
        policy = one_tool.locator("table.context tr").filter(
            has=page.locator("th", has_text="policy")
        )
        expect(policy.locator("details")).not_to_have_attribute("open", "")
        expect(policy.locator("summary")).to_have_text("5 entries")
        expect(policy.get_by_text("currency")).to_be_hidden()
        policy.locator("summary").click()
        expect(policy.locator("ul.tree")).to_contain_text("currency: EUR")
        expect(policy.locator("ul.tree")).to_contain_text("requiresrole: managerapprovals: 1")

        two_tools = page.locator("article.approval").filter(has_text="A-1005")
        expect(two_tools.locator("h2 code.call")).to_have_text(
            'refund(order_id="A-1005", amount=700.0)'
        )
        expect(two_tools.locator("ul.effects li.skipped")).to_have_text(
            "Will not run on resume: notify_customer, called in the same turn;"
            " the SDK tells the agent it was not run."
        )
        shoot(page, "0-cards")
        assert errors == []
    finally:
        context.close()


def test_a_card_decided_elsewhere_becomes_a_note_under_the_pointer(
    browser: Browser, desk_server: DemoServer
) -> None:
    errors: list[str] = []
    context_a = approver(browser, desk_server, "Ada Manager")
    context_b = approver(browser, desk_server, "Bob Builder")
    try:
        page_a = open_queue(context_a, "/approvals", errors)
        page_b = open_queue(context_b, "/approvals", errors)
        # The first three cards that can be decided here (the long run's says it cannot).
        items = page_b.locator("#approvals-queue .queue-item").filter(
            has=page_b.locator("button.approve")
        )
        expect(items.nth(2)).to_be_visible()
        item1, item2, item3 = (items.nth(i).get_attribute("id") for i in range(3))
        assert item1 and item2 and item3
        run1 = page_b.locator(f"#{item1}").get_attribute("data-run")
        run2_card = page_b.locator(f"#{item2} article.approval").get_attribute("id")
        assert run1 and run2_card
        # Demo ids are UUIDs: their element ids are the ids themselves.
        run2 = page_b.locator(f"#{item2}").get_attribute("data-run")
        assert run2
        # B is half-way through a reason on card 3, and holds the pointer over card 1's Approve.
        page_b.locator(f"#{item3}").get_by_label("Reason").fill("checking the invoice")
        x, y = center_of(page_b, f"#{item1} button.approve")
        height_before = page_b.locator(f"#{item1}").bounding_box()
        assert height_before is not None
        page_b.mouse.move(x, y)
        assert page_b.evaluate(UNDER, [x, y]) == {"item": item1, "button": "Approve", "gone": False}
        shoot(page_b, "1-before")

        card_a = page_a.locator(f"#{item1}")
        card_a.get_by_label("Reason").fill("within policy")
        card_a.get_by_role("button", name="Approve").click()
        expect(card_a.locator(".outcome")).to_contain_text("completed", timeout=LIVE_TIMEOUT_MS)

        # In B, card 1 turns into a note of the same height, saying who decided.
        note = page_b.locator(f"#{item1}")
        expect(note).to_have_class(re.compile(r"\bgone\b"), timeout=LIVE_TIMEOUT_MS)
        said = re.compile(r"approved by Ada Manager: within policy \d+ s ago")
        expect(note).to_contain_text(said)
        expect(note.get_by_role("link", name="see the run")).to_be_visible()
        height_after = note.bounding_box()
        assert height_after is not None
        assert abs(height_after["height"] - height_before["height"]) < 1
        assert abs(height_after["y"] - height_before["y"]) < 1
        shoot(page_b, "2-after")

        # B clicks where card 1's Approve was: the note is there, nothing else is decided.
        assert page_b.evaluate(UNDER, [x, y])["item"] == item1
        page_b.mouse.click(x, y)
        page_b.wait_for_timeout(1500)
        assert run1 not in pending_in_store(desk_server.store)
        assert run2 in pending_in_store(desk_server.store)
        expect(page_b.locator(f"#{run2_card}-result")).to_be_empty()
        # The half-typed reason on card 3 survived the live update.
        expect(page_b.locator(f"#{item3}").get_by_label("Reason")).to_have_value(
            "checking the invoice"
        )
        # The note stays until B dismisses it.
        note.get_by_role("button", name="Dismiss").click()
        expect(page_b.locator(f"#{item1}")).to_have_count(0)
        assert errors == []
    finally:
        context_a.close()
        context_b.close()


def test_newest_first_a_new_pause_waits_behind_a_banner(
    browser: Browser, desk_server: DemoServer
) -> None:
    errors: list[str] = []
    context_b = approver(browser, desk_server, "Bob Builder")
    try:
        page_b = open_queue(context_b, "/approvals?order=newest", errors)
        items = page_b.locator("#approvals-queue .queue-item")
        expect(items.first).to_be_visible()
        shown = items.count()
        # The newest card that can be decided here: a card whose approval the SDK would
        # lose (the long run's, past its 500 rows) says so and has no buttons.
        decidable = items.filter(has=page_b.locator("button.approve"))
        refused = items.filter(has_text="Cannot be decided here")
        assert decidable.count() + refused.count() == shown
        item1 = decidable.first.get_attribute("id")
        assert item1
        run1 = page_b.locator(f"#{item1}").get_attribute("data-run")
        x, y = center_of(page_b, f"#{item1} button.approve")
        page_b.mouse.move(x, y)

        new_run = start_agent(desk_server, "paused-1")
        news = page_b.locator("#queue-news")
        expect(news).to_have_text("1 new waiting — show them", timeout=LIVE_TIMEOUT_MS)
        expect(items).to_have_count(shown)
        expect(page_b.locator("#approvals-queue .queue-count")).to_contain_text(
            f"{shown + 1} waiting"
        )
        shoot(page_b, "3-new-waiting")

        # Under the pointer is still card 1's Approve: B's click decides what B aimed at.
        assert page_b.evaluate(UNDER, [x, y]) == {"item": item1, "button": "Approve", "gone": False}
        page_b.mouse.click(x, y)
        expect(page_b.locator(f"#{item1} .outcome")).to_contain_text(
            "Bob Builder approved it", timeout=LIVE_TIMEOUT_MS
        )
        pending = pending_in_store(desk_server.store)
        assert new_run in pending
        assert run1 not in pending

        # Asked for, the new card shows at the top; for the next 300 ms its buttons
        # ignore clicks (a click that was aimed before the cards moved).
        page_b.evaluate(
            "() => { document.querySelector('#queue-news .show-new').click();"
            " document.querySelector('#approvals-queue .queue-item button.approve').click(); }"
        )
        expect(news).to_have_text("")
        expect(items.first.locator("code").first).to_be_visible()
        page_b.wait_for_timeout(1500)
        assert new_run in pending_in_store(desk_server.store)
        expect(items.first.locator(".result")).to_be_empty()
        assert errors == []
    finally:
        context_b.close()


def test_keys_a_name_typed_once_and_a_bulk_reject(
    browser: Browser, desk_server: DemoServer
) -> None:
    errors: list[str] = []
    context = browser.new_context(base_url=desk_server.url, viewport={"width": 1200, "height": 900})
    try:
        page = open_queue(context, "/approvals", errors)
        cards = page.locator("#approvals-queue article.approval")
        waiting = cards.count()
        # A card whose approval the SDK would lose (the long run's) has no buttons: the
        # keys are tried on the first card that can be decided here.
        at = page.evaluate(
            "() => [...document.querySelectorAll('#approvals-queue article.approval')]"
            ".findIndex((card) => card.querySelector('button.approve'))"
        )
        assert 0 <= at and waiting >= at + 2
        card = cards.nth(at)
        decidable = cards.filter(has=page.locator("button.approve"))
        expect(page.locator("#desk-keys")).to_contain_text("j / k")

        # j moves to the next card, j again to the one after, k back; a focuses Approve
        # and decides nothing; ? opens the keys.
        page.locator("h1").click()
        for _ in range(at + 1):
            page.keyboard.press("j")
        expect(card).to_have_class(re.compile(r"\bcurrent\b"))
        page.keyboard.press("j")
        expect(cards.nth(at + 1)).to_have_class(re.compile(r"\bcurrent\b"))
        page.keyboard.press("k")
        expect(card).to_be_focused()
        page.keyboard.press("a")
        expect(card.get_by_role("button", name="Approve")).to_be_focused()
        page.keyboard.press("r")
        expect(card.get_by_role("button", name="Reject")).to_be_focused()
        page.wait_for_timeout(500)
        expect(card.locator(".result")).to_be_empty()
        page.locator("h1").click()
        page.keyboard.press("?")
        expect(page.locator("#desk-keys")).to_have_attribute("open", "")

        # The name typed once fills every card and the bulk form.
        card.get_by_label("Approver").fill("Grace Hopper")
        for i in range(decidable.count()):
            expect(decidable.nth(i).get_by_label("Approver")).to_have_value("Grace Hopper")
        bulk = page.locator("#bulk-form")
        expect(bulk.get_by_label("Approver")).to_have_value("Grace Hopper")

        # Reject with no reason is caught in the form: nothing is posted.
        card.get_by_role("button", name="Reject").click()
        reason = card.get_by_label("Reason")
        assert reason.evaluate("(input) => input.validationMessage") == (
            "Say why you reject: the agent gets your reason."
        )
        page.wait_for_timeout(500)
        expect(card.locator(".result")).to_be_empty()

        # Select all shown, one reason, Reject ticked: each card is reported, focus
        # moves to the answer, and the store holds no pause any more.
        bulk.get_by_label("select all shown").check()
        ticked = page.locator("input[name=pick]:checked").count()
        before = pending_in_store(desk_server.store)
        bulk.get_by_label("Reason").fill("quarter closed")
        bulk.get_by_role("button", name="Reject ticked").click()
        outcome = page.locator("#bulk-outcome")
        expect(outcome).to_contain_text(f"rejected {ticked} cards", timeout=30_000)
        expect(outcome).to_contain_text("0 already decided · 0 stale")
        # Each card is reported: won, or refused with why (a pause the SDK would lose).
        expect(outcome.locator("li")).to_have_count(ticked)
        won = outcome.locator("li.bulk-won").count()
        assert won + outcome.locator("li.bulk-refused").count() == ticked
        expect(outcome).to_be_focused()
        shoot(page, "4-bulk")
        assert len(before - pending_in_store(desk_server.store)) == won
        assert errors == []
    finally:
        context.close()
