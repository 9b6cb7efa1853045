"""Notes on a pause, in a real browser: one approver leaves a note from the queue, and
another, who is typing a note of their own on the card's own page, sees it arrive
without losing what they typed. A note decides nothing: the card stays in the queue.

It writes notes, so it starts a demo server of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STOP_TIMEOUT_S, DemoServer, start_demo
from playwright.sync_api import Browser, expect
from test_desk import approver, open_queue, pending_in_store

SCREENSHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
LIVE_TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def notes_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    demo = start_demo(tmp_path_factory, "notes-demo")
    try:
        yield demo
    finally:
        demo.server.stop(timeout=STOP_TIMEOUT_S)


def test_a_note_from_the_queue_reaches_the_card_page_and_keeps_what_is_typed(
    browser: Browser, notes_server: DemoServer
) -> None:
    errors: list[str] = []
    ada = approver(browser, notes_server, "Ada Manager")
    bob = approver(browser, notes_server, "Bob Finance")
    try:
        queue = open_queue(ada, "/approvals", errors)
        card = queue.locator("article.approval").filter(has_text="A-1002")
        run = card.locator("header p a[title]").get_attribute("title", timeout=LIVE_TIMEOUT_MS)
        href = card.locator("header p a").first.get_attribute("href")
        assert run and href
        page = open_queue(bob, href, errors)
        typing = page.locator(".pause-notes textarea")
        typing.fill("half a thought")

        notes = card.locator(".pause-notes")
        expect(notes).to_contain_text("No notes yet.")
        notes.locator("textarea").fill("called the customer, <b>waiting</b> for the invoice")
        notes.get_by_role("button", name="Add note").click()
        expect(card.locator(".pause-notes .notes-list")).to_contain_text(
            "Ada Manager", timeout=LIVE_TIMEOUT_MS
        )
        expect(card.locator(".note-text")).to_have_text(
            "called the customer, <b>waiting</b> for the invoice"
        )
        # A note is not a decision: the card is still waiting, in place, not "deciding".
        item = queue.locator(".queue-item").filter(has=card)
        expect(item).not_to_have_class(re.compile(r"\bdeciding\b"))
        expect(card.get_by_role("button", name="Approve")).to_have_count(1)
        assert run in pending_in_store(notes_server.store)

        # The card's own page hears it, and what Bob typed is still there.
        expect(page.locator(".pause-notes .notes-list")).to_contain_text(
            "waiting", timeout=LIVE_TIMEOUT_MS
        )
        expect(typing).to_have_value("half a thought")
        page.screenshot(path=str(SCREENSHOTS / "test_pause_notes-card.png"), full_page=True)

        # Bob's note reaches Ada's queue, whose card stays as it was drawn otherwise.
        card.locator("input[name=reason]").fill("typed by Ada")
        page.locator(".pause-notes").get_by_role("button", name="Add note").click()
        expect(card.locator(".pause-notes .notes-list")).to_contain_text(
            "Bob Finance", timeout=LIVE_TIMEOUT_MS
        )
        expect(card.locator("input[name=reason]")).to_have_value("typed by Ada")
        queue.screenshot(path=str(SCREENSHOTS / "test_pause_notes-queue.png"), full_page=True)
        assert errors == []
    finally:
        ada.close()
        bob.close()
