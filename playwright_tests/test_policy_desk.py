"""Two people decide one card under a two-person rule, each in a browser of their own.

``localui serve --policy`` with sign-in on and the refund-bot registered; Ada and Bob,
both in the finance group, open their links. Ada's approval is a vote: the card stays,
and says who approved and that one more person is needed. Bob's approval, with the
amount he typed, resumes the run; the tool refunds that amount and names them both.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest
from conftest import SCREENSHOTS, START_TIMEOUT_S, STOP_TIMEOUT_S
from helpers import LOCALUI, start_localui
from playwright.sync_api import Browser, BrowserContext, expect
from test_signin import AGENTS, LINK, SignInServer, _env, seed

POLICY = """
[[rule]]
name = "large refunds"
agent = "refund-*"
reason = "manager_approval"
approvers = ["group:finance"]
approvals = 2

[[rule.field]]
name = "amount"
type = "number"
label = "Amount to refund"
default = "context.amount"
min = 1
max = "context.amount"
required = true
"""


@pytest.fixture
def policy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SignInServer]:
    workdir = tmp_path_factory.mktemp("policy-desk")
    (workdir / "agents.py").write_text(AGENTS)
    (workdir / "policy.toml").write_text(POLICY)
    store = workdir / "local.db"
    seed(store, workdir)
    server = start_localui(
        [
            "serve",
            "--store",
            str(store),
            "--agents",
            f"{workdir / 'agents.py'}:refund_bot",
            "--policy",
            str(workdir / "policy.toml"),
        ],
        cwd=workdir,
        log=workdir / "serve.log",
        env=_env(),
        ready="/signin",
        timeout=START_TIMEOUT_S,
    )
    try:
        assert "approval policy" in server.output(), server.output()
        printed = LINK.search(server.output())
        assert printed is not None, server.output()
        yield SignInServer(
            url=server.url,
            store_args=["--store", str(store)],
            workdir=workdir,
            owner_link=printed.group(1),
        )
    finally:
        server.stop(timeout=STOP_TIMEOUT_S)


def signed_in(browser: Browser, server: SignInServer, name: str) -> BrowserContext:
    done = subprocess.run(
        [str(LOCALUI), "users", "add", name, "--role", "approver", "--group", "finance"]
        + [*server.store_args, "--url", server.url],
        cwd=server.workdir,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    link = LINK.search(done.stdout)
    assert link is not None, done.stdout
    context = browser.new_context(base_url=server.url)
    context.new_page().goto(link.group(1))
    return context


def shoot(context: BrowserContext, step: str) -> None:
    context.pages[-1].screenshot(path=str(SCREENSHOTS / f"policy-desk-{step}.png"), full_page=True)


def test_two_people_in_two_browsers_decide_one_card(
    browser: Browser, policy_server: SignInServer
) -> None:
    ada = signed_in(browser, policy_server, "Ada")
    bob = signed_in(browser, policy_server, "Bob")
    errors: list[str] = []
    try:
        a = ada.pages[0]
        a.on("pageerror", lambda error: errors.append(str(error)))
        queue = a.request.get("/approvals.json").json()["approvals"]
        run = next(i["execution_id"] for i in queue if i["context"]["order_id"] == "A-1002")

        a.goto(f"/approvals/{run}")
        card = a.locator("article.approval")
        expect(card.locator("p.rule")).to_have_text(
            "Rule 'large refunds': 2 approvals from finance — none yet; 2 people needed"
        )
        amount = card.get_by_label("Amount to refund")
        expect(amount).to_have_value("250")  # filled in from the frozen context
        amount.fill("120.5")
        card.get_by_role("button", name="Approve").click()
        expect(card.locator(".result")).to_contain_text(
            "Your approval counts: approval 1 of 2 recorded (Ada); one more person needed",
            timeout=20_000,
        )
        shoot(ada, "1-ada-voted")

        b = bob.pages[0]
        b.on("pageerror", lambda error: errors.append(str(error)))
        b.goto(f"/approvals/{run}")
        card = b.locator("article.approval")
        expect(card.locator("p.rule")).to_have_text(
            re.compile(
                r"^Rule 'large refunds': 2 approvals from finance — Ada approved \d+ s ago;"
                r" one more person needed$"
            )
        )
        card.get_by_label("Amount to refund").fill("120.5")
        card.get_by_role("button", name="Approve").click()
        expect(card.locator(".result")).to_contain_text(
            "The run completed: Done: refunded 120.50 on A-1002, approved by Ada, Bob.",
            timeout=20_000,
        )
        shoot(bob, "2-bob-decided")

        decided = b.request.get(f"/runs/{run}.json").json()["decisions"]
        assert [(d["kind"], d["approver"]) for d in decided] == [
            ("vote", "Ada"),
            ("approval", "Bob"),
        ]
        # Ada's page, reloaded: nothing waits any more, and the decisions say who.
        a.goto(f"/approvals/{run}")
        expect(a.locator("#decided")).to_contain_text("Bob approved it at")
        expect(a.locator("#decisions")).to_contain_text("Ada approved it at")
        assert errors == []
    finally:
        ada.close()
        bob.close()


def test_a_vote_shows_on_the_other_persons_open_pages_without_a_reload(
    browser: Browser, policy_server: SignInServer
) -> None:
    """Bob has the queue and the card's page open, and has started typing on the card;
    Ada approves. Both of Bob's pages say so by themselves, and what he typed stays."""
    ada = signed_in(browser, policy_server, "Ada")
    bob = signed_in(browser, policy_server, "Bob")
    errors: list[str] = []
    try:
        a, b_queue = ada.pages[0], bob.pages[0]
        for page in (a, b_queue):
            page.on("pageerror", lambda error: errors.append(str(error)))
        queue = a.request.get("/approvals.json").json()["approvals"]
        run = next(i["execution_id"] for i in queue if i["context"]["order_id"] == "A-1002")
        none_yet = "Rule 'large refunds': 2 approvals from finance — none yet; 2 people needed"
        ada_voted = re.compile(
            r"^Rule 'large refunds': 2 approvals from finance — Ada approved \d+ s ago;"
            r" one more person needed$"
        )

        b_queue.goto("/approvals")
        queued = b_queue.locator(f"#approval-{run}")
        expect(queued.locator("p.rule")).to_have_text(none_yet)
        queued.get_by_label("Amount to refund").fill("99")
        queued.get_by_label("Reason").fill("checking the receipt")
        b_card = bob.new_page()
        b_card.on("pageerror", lambda error: errors.append(str(error)))
        b_card.goto(f"/approvals/{run}")
        on_card = b_card.locator("article.approval")
        expect(on_card.locator("p.rule")).to_have_text(none_yet)
        on_card.get_by_label("Reason").fill("half typed")
        expect(b_card.locator("#decisions")).to_contain_text("No decisions recorded")

        a.goto(f"/approvals/{run}")
        card = a.locator("article.approval")
        card.get_by_label("Amount to refund").fill("120.5")
        card.get_by_role("button", name="Approve").click()
        expect(card.locator(".result")).to_contain_text(
            "approval 1 of 2 recorded (Ada)", timeout=20_000
        )

        # Without a reload: the queue's card and the card's page say who approved.
        expect(queued.locator("p.rule")).to_have_text(ada_voted, timeout=20_000)
        expect(on_card.locator("p.rule")).to_have_text(ada_voted, timeout=20_000)
        expect(b_card.locator("#decisions")).to_contain_text("Ada approved it at")
        shoot(bob, "3-bob-sees-ada-vote")
        # The cards were not drawn again: what Bob typed is still there.
        expect(queued.get_by_label("Amount to refund")).to_have_value("99")
        expect(queued.get_by_label("Reason")).to_have_value("checking the receipt")
        expect(on_card.get_by_label("Reason")).to_have_value("half typed")
        assert errors == []
    finally:
        ada.close()
        bob.close()
