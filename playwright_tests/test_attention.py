"""Needs attention, in Chromium: an operator resumes a crashed and a failed run at once.

``localui serve`` with sign-in on and the refund-bot registered, on a SQLite store and
on PostgreSQL, where the
real SDK, in child processes, left a run that died inside ``refund`` and a run whose
model call failed. An operator (added with ``localui users add``) sees both on /attention with
why they are there, the nav's count agreeing; ticks both, confirms (their rows are
seconds old) and resumes the ticked; the page says what each would do, then each
outcome as it finishes; the runs list then shows both completed. An approver sees the
same runs and no way to resume them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from conftest import SCREENSHOTS, START_TIMEOUT_S, STOP_TIMEOUT_S
from helpers import start_localui
from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect
from test_signin import AGENTS, LINK, SignInServer, _answering, _env, add_person

#: The two runs that need a person: the demo's crash inside a tool and its failed run.
PICKED = ("crashed-in-tool", "failed")
#: Short enough that the crashed run counts as stalled seconds after it died.
STALE_AFTER_S = "1"
LISTED_TIMEOUT_MS = 30_000
#: A resume drives the agent on the server: give the outcomes time on a loaded machine.
RESUMED_TIMEOUT_MS = 60_000

SEED = """
import json, sys
from localui.demo.scenarios import ALL_SCENARIOS, seed
picked = tuple(s for s in ALL_SCENARIOS if s.name in sys.argv[2].split(","))
print(json.dumps(dict(seed(sys.argv[1], pg_schema=sys.argv[3], scenarios=picked).runs)))
"""


@dataclass(frozen=True)
class AttentionServer:
    served: SignInServer
    #: Execution ids by scenario name.
    runs: dict[str, str]
    backend: str


@pytest.fixture(params=["sqlite", "postgres"])
def attention_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AttentionServer]:
    workdir = tmp_path_factory.mktemp(f"attention-{request.param}")
    (workdir / "agents.py").write_text(AGENTS)
    dsn = ""
    schemas: list[str] = []
    if request.param == "sqlite":
        store, pg_schema = str(workdir / "local.db"), "fastaiagent"
        store_args = ["--store", store]
    else:
        dsn = os.environ.get("LOCALUI_TEST_PG_DSN", "")
        if not dsn:
            pytest.fail("LOCALUI_TEST_PG_DSN is not set: run scripts/test.sh", pytrace=False)
        _answering(dsn)
        pg_schema, app_schema = (f"{p}_{uuid.uuid4().hex[:10]}" for p in ("fa", "localui"))
        schemas = [pg_schema, app_schema]
        store = dsn
        store_args = ["--store", dsn, "--pg-schema", pg_schema, "--pg-app-schema", app_schema]
    server = None
    try:
        seeded = subprocess.run(
            [sys.executable, "-c", SEED, store, ",".join(PICKED), pg_schema],
            cwd=workdir,
            env=_env(),
            capture_output=True,
            text=True,
            check=True,
            timeout=START_TIMEOUT_S,
        )
        runs = json.loads(seeded.stdout.strip().splitlines()[-1])
        server = start_localui(
            ["serve", *store_args, "--agents", f"{workdir / 'agents.py'}:refund_bot"]
            + ["--stale-after", STALE_AFTER_S],
            cwd=workdir,
            log=workdir / "serve.log",
            env=_env(),
            ready="/signin",
            timeout=START_TIMEOUT_S,
        )
        printed = LINK.search(server.output())
        assert printed is not None, server.output()
        yield AttentionServer(
            SignInServer(
                url=server.url,
                store_args=store_args,
                workdir=workdir,
                owner_link=printed.group(1),
            ),
            runs,
            request.param,
        )
    finally:
        if server is not None:
            server.stop(timeout=STOP_TIMEOUT_S)
        if schemas:
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def person(browser: Browser, server: SignInServer, link: str) -> BrowserContext:
    context = browser.new_context(base_url=server.url)
    context.new_page().goto(link)
    return context


def row_of(page: Page, execution_id: str) -> Locator:
    return page.locator("table.attention tbody tr").filter(
        has=page.locator(f'a[title="{execution_id}"]')
    )


def open_attention(page: Page, expected: int) -> None:
    """/attention once it lists ``expected`` runs (the crash is stalled a second after
    its newest row)."""
    page.goto("/attention")
    rows = page.locator("table.attention tbody tr")
    for _ in range(30):
        if rows.count() >= expected:
            return
        page.wait_for_timeout(500)
        page.reload()
    expect(rows).to_have_count(expected, timeout=LISTED_TIMEOUT_MS)


def shoot(page: Page, step: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"test_attention-{step}.png"), full_page=True)


def test_an_operator_resumes_the_ticked_and_an_approver_cannot(
    browser: Browser, attention_server: AttentionServer
) -> None:
    served, runs = attention_server.served, attention_server.runs
    backend = attention_server.backend
    crashed, failed = runs["crashed-in-tool"], runs["failed"]
    errors: list[str] = []
    approver = person(browser, served, add_person(served, "Bea Approver", "approver"))
    try:
        page = approver.pages[0]
        page.on("pageerror", lambda error: errors.append(str(error)))
        open_attention(page, 2)
        expect(page.locator('input[name="pick"]')).to_have_count(0)
        expect(page.get_by_role("button", name="Resume the ticked")).to_have_count(0)
        expect(page.locator("#bulk-resume-form")).to_have_count(0)
        shoot(page, f"{backend}-approver")
    finally:
        approver.close()

    operator = person(browser, served, add_person(served, "Otto Operator", "operator"))
    try:
        page = operator.pages[0]
        page.on("pageerror", lambda error: errors.append(str(error)))
        open_attention(page, 2)
        expect(page.locator("p.totals")).to_contain_text(
            "2 runs need a person: 1 stalled · 1 failed"
        )
        expect(page.locator("#nav-attention")).to_have_text("2")
        crashed_row, failed_row = row_of(page, crashed), row_of(page, failed)
        expect(crashed_row.locator(".why-stalled")).to_have_text("stalled")
        expect(failed_row.locator(".why-failed")).to_have_text("failed")
        # Each row says what a resume would do, and the failed run's error.
        expect(crashed_row.locator("td").nth(5)).to_contain_text("refund")
        expect(failed_row).to_contain_text("error: RuntimeError: model provider returned 503")
        expect(crashed_row).to_contain_text("recent: needs confirming")
        shoot(page, f"{backend}-listed")

        crashed_row.locator('input[name="pick"]').check()
        failed_row.locator('input[name="pick"]').check()
        page.locator('#bulk-resume-form input[name="confirm"]').check()
        page.get_by_role("button", name="Resume the ticked").click()

        expect(page.locator("h1")).to_have_text("Bulk resume")
        preflight = page.locator("section.preflight li")
        expect(preflight).to_have_count(2)
        # Before anything starts: the crash re-runs refund, whose call no cache answers.
        expect(preflight.filter(has_text=crashed)).to_contain_text("repeats refund, not cached")
        expect(page.locator("section.preflight p.problem")).to_contain_text(
            "1 run will run a tool again that no cached result answers"
        )
        outcomes = page.locator("#bulk-resume-outcome li.bulk-resumed")
        expect(outcomes).to_have_count(2, timeout=RESUMED_TIMEOUT_MS)
        expect(outcomes.filter(has_text=crashed)).to_contain_text("resumed: the run completed")
        expect(outcomes.filter(has_text=failed)).to_contain_text("resumed: the run completed")
        expect(page.locator("li.bulk-tally")).to_contain_text("2 done: 2 resumed")
        shoot(page, f"{backend}-resumed")

        page.goto("/runs")
        for execution_id in (crashed, failed):
            row = page.locator("tr").filter(has=page.locator(f'a[title="{execution_id}"]'))
            expect(row.locator("span.state")).to_have_text("completed")
        page.goto("/attention")
        expect(page.locator("p.empty")).to_have_text("Nothing needs a person.")
        expect(page.locator("#nav-attention")).to_have_text("0")
        shoot(page, f"{backend}-after")
    finally:
        operator.close()
    assert errors == []
