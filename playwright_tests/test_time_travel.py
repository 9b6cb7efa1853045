"""A developer's "what if?": edit a tool's result, preview, go on, compare with the source."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from conftest import STOP_TIMEOUT_S, DemoServer, start_demo
from playwright.sync_api import Browser, Page, expect

EDITED_RESULT = "refunded 7.00 (what if the refund had been partial?)"


@pytest.fixture(scope="module")
def edit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    """``localui demo`` on a store of its own: this test adds a branch to it."""
    demo = start_demo(tmp_path_factory, "edit-demo")
    try:
        yield demo
    finally:
        demo.server.stop(timeout=STOP_TIMEOUT_S)


def the_completed_refund(url: str) -> tuple[str, str]:
    """The demo's completed refund (the source of its edited branch), and its row after
    the tool's result."""
    edits = httpx.get(f"{url}/decisions.json", params={"kind": "edit"}, timeout=10).json()
    for decision in edits["decisions"]:
        branch = httpx.get(f"{url}/runs/{decision['execution_id']}.json", timeout=10).json()
        if branch["agent"] == "refund-bot":
            return branch["fork_of"]["source_execution_id"], decision["checkpoint_id"]
    raise AssertionError(f"the demo made no edited branch of its refund: {edits}")


def test_edit_a_tool_result_preview_go_on_and_compare(
    browser: Browser, edit_server: DemoServer, screenshot_folder: Path
) -> None:
    context = browser.new_context(base_url=edit_server.url)
    page: Page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    shots: Callable[[str], None] = lambda step: page.screenshot(  # noqa: E731
        path=str(screenshot_folder / f"test_time_travel-{step}.png"), full_page=True
    )
    try:
        source, row = the_completed_refund(edit_server.url)
        page.goto(f"/runs/{source}")
        panel = page.locator("#actions form").filter(
            has=page.get_by_role("button", name="Fork", exact=True)
        )
        panel.get_by_label("From row").select_option(row)
        panel.get_by_role("button", name="Edit the row and go on…").click()
        expect(page).to_have_url(re.compile(r"/edit\?checkpoint_id="))
        expect(page.locator("h1")).to_contain_text("and go on from there")
        result = page.locator("li.role-tool textarea").last
        result.fill(EDITED_RESULT)
        page.get_by_role("button", name="What would it do?").click()
        preview = page.locator("#edit-preview-here")
        expect(preview).to_contain_text("From the edited conversation")
        shots("1-editor")
        page.get_by_role("button", name="Go on from here").click()

        # The branch's page: what was edited, by whom, and its source.
        expect(page).to_have_url(re.compile(r"/runs/[^/?#]+$"))
        branch = page.url.rsplit("/", 1)[1]
        assert branch != source
        expect(page.locator("#decisions")).to_contain_text(EDITED_RESULT)
        expect(page.locator("#decisions")).to_contain_text("edited row")
        page.get_by_role("link", name="Compare with its source").click()
        expect(page).to_have_url(re.compile(r"/compare\?a="))
        opened = page.locator("details.compare-pair[open]")
        expect(opened).to_have_count(1)
        expect(opened).to_contain_text("refunded 7.00")
        shots("2-compare")

        # The source lists the branch, marked as edited.
        page.goto(f"/runs/{source}")
        expect(page.locator(f"#lineage a[href$='/runs/{branch}']")).to_have_count(1)
        expect(page.locator("#lineage")).to_contain_text("edited by")
    finally:
        context.close()
    assert errors == []
