"""What a person does with the demo: find the run that died, read why, open a row."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import STOP_TIMEOUT_S, wait_until_seeded
from helpers import start_localui
from playwright.sync_api import Page, expect

from localui.demo.edits import EDITED
from localui.demo.scenarios import ALL_SCENARIOS
from localui.shortids import shortest_unique

#: The demo's runs: its scenarios and the branches it edits of two of them.
DEMO_RUNS = len(ALL_SCENARIOS) + len(EDITED)


def test_find_the_run_that_died_in_its_tool_and_read_why(
    page: Page, page_errors: list[str], screenshot: Callable[[str], Path]
) -> None:
    page.goto("/")
    runs = page.locator("table.runs tbody tr")
    expect(page.locator("#runs-table .tab.state-all")).to_have_text(
        re.compile(rf"^\s*All\s+{DEMO_RUNS}\s*$")
    )
    expect(runs).to_have_count(DEMO_RUNS)
    for state in ("paused", "unfinished", "completed", "failed"):
        expect(runs.locator(f"span.state.state-{state}").first).to_have_text(state)
    screenshot("1-runs")

    page.get_by_label("Search").fill("A-1006")
    expect(runs).to_have_count(1)
    expect(page).to_have_url(re.compile(r"q=A-1006"))
    crashed = runs.first
    expect(crashed.locator("td").first).to_have_text(re.compile(r"^\s*unfinished\s+at a tool\s*$"))
    expect(crashed).to_contain_text("turn:0/tool:refund")
    screenshot("2-search")

    crashed.get_by_role("link").click()
    expect(page).to_have_url(re.compile(r"/runs/[0-9a-f-]{36}$"))
    verdict = page.locator("#verdict")
    expect(verdict).to_contain_text("No end marker")
    expect(verdict).to_contain_text(re.compile(r"\btool\W+refund\b"))
    expect(verdict).to_contain_text("the model is not called again")
    screenshot("3-run")

    # The first model call: its saved messages start with what the user asked.
    first_turn = page.locator("details.row").filter(
        has=page.locator("code.node", has_text=re.compile(r"^turn:0$"))
    )
    expect(first_turn).to_have_count(1)
    first_turn.locator("summary").click()
    detail = first_turn.locator(".row-body .row-detail")
    expect(detail).to_be_visible()
    expect(detail).to_contain_text("Messages")
    expect(detail.locator(".msg.role-user")).to_contain_text("Refund order A-1006 for 80.00")
    screenshot("4-row")

    assert page_errors == []


def test_runs_json_and_page_agree(
    page: Page, base_url: str, screenshot: Callable[[str], Path]
) -> None:
    with urllib.request.urlopen(base_url + "runs.json", timeout=10) as response:
        listing = json.load(response)
    assert listing["next"] is None, "the demo's runs should fit on one page"
    assert len(listing["runs"]) == DEMO_RUNS
    assert sum(listing["counts"].values()) == DEMO_RUNS

    page.goto("/")
    runs = page.locator("table.runs tbody tr")
    expect(runs).to_have_count(len(listing["runs"]))
    expect(page.locator("#runs-table .tab.state-all .count")).to_have_text(str(DEMO_RUNS))
    for state, count in listing["counts"].items():
        expect(page.locator(f"#runs-table .tab.state-{state} .count")).to_have_text(str(count))
        expect(runs.locator(f"span.state.state-{state}")).to_have_count(count)
    page_ids = [
        row_id.removeprefix("run-") for row_id in runs.evaluate_all("rs => rs.map(r => r.id)")
    ]
    assert page_ids == [run["execution_id"] for run in listing["runs"]]
    screenshot("runs")


def test_demo_writes_nothing_into_its_working_directory(demo_workdir: Path) -> None:
    # The SDK writes traces into ./.fastaiagent of the working directory unless told not to.
    assert list(demo_workdir.iterdir()) == []


def test_a_runs_short_id_copies_as_the_full_id(page: Page, page_errors: list[str]) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto("/")
    rows = page.locator("table.runs tbody tr")
    row = rows.first
    full_id = (row.get_attribute("id") or "").removeprefix("run-")
    page_ids = [i.removeprefix("run-") for i in rows.evaluate_all("rs => rs.map(r => r.id)")]
    # The demo's ids are uuids: each shows as the shortest prefix no other run on the
    # page starts with, at least 8 characters.
    shown = shortest_unique(page_ids)[full_id]
    assert 8 <= len(shown) < len(full_id) and full_id.startswith(shown)
    expect(row.locator("code.short-id")).to_have_text(shown)
    expect(row.get_by_role("link", name=shown)).to_have_attribute("title", full_id)
    copy = row.get_by_role("button", name=f"Copy the id of run {shown}")
    copy.click()
    # A live update may redraw the table as the server renders it (every button "copy")
    # right after the click: the note stays on the redrawn button until its moment ends.
    page.evaluate(
        """() => {
            const table = document.querySelector('#runs-table');
            const fresh = table.outerHTML.replaceAll('>copied<', '>copy<');
            htmx.swap(table, fresh, {swapStyle: 'outerHTML'});
        }"""
    )
    expect(copy).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == full_id
    expect(copy).to_have_text("copy", timeout=5_000)
    assert page_errors == []


def test_an_open_runs_list_fills_as_the_demo_seeds(
    page: Page,
    page_errors: list[str],
    screenshot: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A person opens the demo the moment it serves: the list says how far the seeding
    got, and the runs arrive on the open page, without a reload, until all are there."""
    workdir = tmp_path_factory.mktemp("arriving-cwd")
    store = tmp_path_factory.mktemp("arriving-store") / "local.db"
    server = start_localui(
        ["demo", "--store", str(store), "--no-auth"],
        cwd=workdir,
        log=workdir.parent / f"{workdir.name}.log",
        ready="/",
    )
    try:
        page.goto(server.url + "/")
        seeding = page.locator("#seeding")
        expect(seeding).to_contain_text(re.compile(rf"seeding the demo: \d+ of {DEMO_RUNS}"))
        runs = page.locator("table.runs tbody tr")
        first_seen = runs.count()
        assert first_seen < DEMO_RUNS
        screenshot("1-arriving")
        # Marked now: a reload would drop the mark, so its survival proves no reload.
        page.evaluate("document.body.dataset.openedOnce = 'yes'")
        expect(runs).to_have_count(DEMO_RUNS, timeout=120_000)
        expect(seeding).to_have_count(0)
        expect(page.locator("#runs-table .tab.state-all .count")).to_have_text(str(DEMO_RUNS))
        assert page.evaluate("document.body.dataset.openedOnce") == "yes"
        screenshot("2-all-arrived")
        wait_until_seeded(server)
    finally:
        server.stop(timeout=STOP_TIMEOUT_S)
    assert page_errors == []


def test_compare_two_ticked_runs_then_a_fork_with_its_source(
    page: Page, base_url: str, page_errors: list[str], screenshot: Callable[[str], Path]
) -> None:
    page.goto("/")
    runs = page.locator("table.runs tbody tr")
    expect(runs).to_have_count(DEMO_RUNS)
    picked = [runs.nth(0), runs.nth(1)]
    ids = [(row.get_attribute("id") or "").removeprefix("run-") for row in picked]
    for row in picked:
        row.get_by_role("checkbox").check()
    page.get_by_role("button", name="Compare the two ticked runs").click()
    expect(page).to_have_url(re.compile(r"/compare\?a=[^&]+&b=[^&]+$"))
    table = page.locator("#compare-runs")
    for execution_id in ids:
        expect(table).to_contain_text(execution_id)
    screenshot("1-ticked")

    # The fork that asked a new question: its page compares it with its source, and the
    # comparison opens at the step where the branch went its own way.
    with urllib.request.urlopen(base_url + "runs.json", timeout=10) as response:
        listing = json.load(response)
    fork = next(r for r in listing["runs"] if r["fork_of"] and r["state"] == "failed")
    page.goto(fork["url"])
    page.get_by_role("link", name="Compare with its source").click()
    expect(page).to_have_url(re.compile(r"/compare\?a="))
    opened = page.locator("details.compare-pair[open]")
    expect(opened).to_have_count(1)
    expect(opened).to_contain_text("Only in B: turn:0")
    expect(page.locator("details.compare-same").first).not_to_have_attribute("open", "")
    page.locator("#first-difference-link").click()
    expect(page).to_have_url(re.compile(r"#pair-\d+$"))
    expect(opened).to_be_in_viewport()
    # The steps after it are shown closed; one reads its differences when it is opened:
    # the two runs' end rows, one completed and one failed.
    ends = page.locator("details.compare-pair.differs").last
    expect(ends).not_to_have_attribute("open", "")
    expect(ends.locator(".pair-body")).to_have_text("Its differences are read when it is opened.")
    ends.locator("summary").click()
    expect(ends.locator(".pair-body .diff-summary")).to_contain_text("Status completed → failed.")
    expect(ends.locator(".pair-body section.diff-section").first).to_be_visible()
    screenshot("2-fork")
    assert page_errors == []
