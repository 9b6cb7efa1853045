"""Every page, light and dark, as axe-core sees it: no serious or critical finding;
and on a 390 px phone no page scrolls sideways.

The pages: the runs list, a run in every state the demo writes, a run with a row
opened, the diff, the approvals queue, one approval, the cache, prune and an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe
from conftest import DemoServer
from playwright.sync_api import Browser, BrowserContext, Page, expect

SCREENSHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
PHONE_WIDTH = 390
NARROW_PHONE_WIDTH = 360
SHOT_ON_A_PHONE = ("runs list", "run paused", "run diff", "approvals")
FAILING_IMPACTS = ("serious", "critical")


@dataclass(frozen=True)
class Shown:
    """A page to check, and what to do on it once loaded (open a row)."""

    name: str
    path: str
    open_first_row: bool = False


def compare_fork(runs: list[dict[str, Any]]) -> str:
    """``/compare`` of a finished run and the demo's failed fork: pairs that differ, one open."""
    fork = next(r for r in runs if r["fork_of"] and r["state"] == "failed")
    source = next(
        r for r in runs if r["execution_id"] != fork["execution_id"] and r["state"] == "completed"
    )
    return f"/compare?a={source['execution_id']}&b={fork['execution_id']}"


def pages_of(context: BrowserContext) -> list[Shown]:
    """The pages of the seeded demo store, found through its JSON."""
    api = context.request
    runs: list[dict[str, Any]] = api.get("/runs.json").json()["runs"]
    by_state: dict[str, str] = {}
    for run in runs:
        by_state.setdefault(run["state"], run["url"])
    paused = next(run for run in runs if run["state"] == "paused")
    completed = by_state["completed"]
    shown = [Shown("runs list", "/"), Shown("runs list, paused", "/?state=paused")]
    shown += [Shown(f"run {state}", url) for state, url in sorted(by_state.items())]
    shown += [
        Shown("run, a row opened", completed, open_first_row=True),
        Shown("run diff", f"{completed}/diff"),
        Shown("compare two runs", compare_fork(runs)),
        Shown("approvals", "/approvals"),
        Shown("one approval", f"/approvals/{paused['execution_id']}"),
        Shown("cache", "/cache"),
        Shown("prune", "/prune"),
        Shown("error", "/runs/no-such-run"),
    ]
    return shown


@pytest.fixture
def context(browser: Browser, demo_server: DemoServer) -> Iterator[BrowserContext]:
    context = browser.new_context(base_url=demo_server.url)
    try:
        yield context
    finally:
        context.close()


def load(page: Page, shown: Shown) -> None:
    page.goto(shown.path)
    if shown.open_first_row:
        row = page.locator("#timeline details.row").first
        row.locator("summary").click()
        expect(row.locator(".row-detail")).to_be_visible()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_no_serious_axe_findings_on_any_page(context: BrowserContext, scheme: str) -> None:
    axe = Axe()
    page = context.new_page()
    page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
    table: list[str] = []
    failing: list[str] = []
    background = {"light": "rgb(255, 255, 255)", "dark": "rgb(20, 23, 29)"}[scheme]
    for shown in pages_of(context):
        load(page, shown)
        # The scheme took: the page is drawn in it (axe checks its contrast below).
        assert page.evaluate("getComputedStyle(document.body).backgroundColor") == background
        if scheme == "dark" and shown.name in ("runs list", "run paused", "run diff", "approvals"):
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            name = shown.name.replace(" ", "-")
            page.screenshot(path=str(SCREENSHOTS / f"dark-{name}.png"), full_page=True)
        results = axe.run(page)
        counts = {impact: 0 for impact in ("critical", "serious", "moderate", "minor")}
        for violation in results.response["violations"]:
            impact = violation.get("impact") or "minor"
            counts[impact] += len(violation["nodes"])
            if impact in FAILING_IMPACTS:
                failing.append(f"{shown.name}: {violation['id']} ({len(violation['nodes'])})")
            elif violation["id"]:
                table.append(f"    {shown.name}: {impact} {violation['id']}")
        table.append(
            f"{scheme:5} | {shown.name:24} | "
            + " | ".join(f"{counts[i]}" for i in ("critical", "serious", "moderate", "minor"))
        )
    print("\n" + "\n".join(table))
    assert failing == []


def every_run(context: BrowserContext, shown: list[Shown]) -> list[Shown]:
    """The page of each run of the demo store that ``shown`` does not hold already:
    which run of a state comes first changes with the seeding's timing, and each has
    its own rows, fork choices and verdict to lay out."""
    runs: list[dict[str, Any]] = context.request.get("/runs.json").json()["runs"]
    paths = {s.path for s in shown}
    return [
        Shown(f"run {run['state']} {run['execution_id'][:8]}", run["url"])
        for run in runs
        if run["url"] not in paths
    ]


def test_no_page_scrolls_sideways_on_a_phone(context: BrowserContext) -> None:
    page = context.new_page()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shown_first = pages_of(context)
    every = [*shown_first, *every_run(context, shown_first)]
    wider: dict[str, int] = {}
    # A 390 px phone, and the narrowest in common use (360 px).
    for width in (PHONE_WIDTH, NARROW_PHONE_WIDTH):
        page.set_viewport_size({"width": width, "height": 844})
        widths: dict[str, int] = {}
        for shown in every:
            load(page, shown)
            widths[shown.name] = page.evaluate("document.documentElement.scrollWidth")
            if width == PHONE_WIDTH and shown.name in SHOT_ON_A_PHONE:
                name = shown.name.replace(" ", "-")
                page.screenshot(path=str(SCREENSHOTS / f"phone-390-{name}.png"), full_page=True)
        print(f"\n{width} px wide:\n" + "\n".join(f"{n:24} {w} px" for n, w in widths.items()))
        wider.update({f"{name} at {width}": w for name, w in widths.items() if w > width})
    assert wider == {}


def test_the_theme_toggle_is_remembered(context: BrowserContext) -> None:
    page = context.new_page()
    page.emulate_media(color_scheme="light")
    page.goto("/")
    toggle = page.get_by_role("button", name="Dark theme")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(20, 23, 29)"
    # Another page, and a reload: still dark, before and after the scripts ran.
    page.goto("/approvals")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(20, 23, 29)"
    page.get_by_role("button", name="Dark theme").click()
    page.reload()
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(255, 255, 255)"


def test_a_run_page_is_usable_by_keyboard(context: BrowserContext) -> None:
    """Tab reaches the pickers, the diff links and every row, each with a visible focus
    ring; Enter opens a row, and Space picks A."""
    page = context.new_page()
    completed = next(shown for shown in pages_of(context) if shown.name == "run completed")
    page.goto(completed.path)
    reached: list[str] = []
    for _ in range(80):
        page.keyboard.press("Tab")
        focused = page.evaluate(
            """() => { const e = document.activeElement;
                 const s = getComputedStyle(e);
                 return [e.tagName.toLowerCase() + (e.name ? ':' + e.name : '')
                         + (e.className ? '.' + e.className : ''),
                         s.outlineStyle, s.outlineWidth]; }"""
        )
        what, style, width = focused
        assert style != "none" and width != "0px", f"{what} has no visible focus"
        reached.append(what)
        if "a.diff-prev" in reached and what == "summary":
            break
    assert "input:a" in reached and "input:b" in reached
    assert "a.diff-prev" in reached and reached[-1] == "summary"
    page.keyboard.press("Enter")
    opened = page.locator("#timeline details.row[open]")
    expect(opened.locator(".row-detail")).to_be_visible()
    page.locator("#timeline .row-tools input[name=a]").first.focus()
    page.keyboard.press("Space")
    expect(page.locator("#timeline .row-tools input[name=a]").first).to_be_checked()
