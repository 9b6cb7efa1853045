"""The approvals desk without JavaScript: plain forms decide, the page after a decision
leads with its outcome, a decided run says who decided and why, a card says what a
decision does, and a bad prune age comes back in its form with the forms accepted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from helpers import card

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import ActingClientFactory, Ledger, Seeded


def test_a_plain_form_reject_leads_with_its_outcome_and_the_run_says_who(
    store_copy: Path,
    ledger: Ledger,
    make_acting_client: ActingClientFactory,
    seeded: Seeded,
    page_text: Callable[..., str],
) -> None:
    client = make_acting_client(store_copy, ledger)
    run = seeded.id("paused-2")
    checkpoint = card(client, run)["checkpoint_id"]

    posted = client.post(
        f"/approvals/{run}/reject",
        data={"approver": "Ada", "reason": "over budget", "checkpoint_id": checkpoint},
        follow_redirects=False,
    )
    assert posted.status_code == 303
    landing = client.get(posted.headers["location"]).text
    main = page_text(landing, "decided")
    assert re.fullmatch(
        r"Ada rejected it at \S+: the run completed\. Reason: “over budget”\."
        r" Open the run · Back to the queue",
        main,
    ), main
    # The outcome comes before the line saying the run no longer waits.
    assert landing.index('id="decided"') < landing.index("not waiting for a person now")

    verdict = page_text(client.get(f"/runs/{run}").text, "run-state")
    assert verdict.startswith("completed · rejected by Ada: over budget · "), verdict


def test_a_plain_form_approve_decides(
    store_copy: Path, ledger: Ledger, make_acting_client: ActingClientFactory, seeded: Seeded
) -> None:
    client = make_acting_client(store_copy, ledger)
    run = seeded.id("paused-1")
    checkpoint = card(client, run)["checkpoint_id"]
    posted = client.post(
        f"/approvals/{run}/approve",
        data={"approver": "Ada", "reason": "", "checkpoint_id": checkpoint},
    )
    assert posted.status_code == 200  # followed the 303 to the approval page
    assert "Ada approved it at" in posted.text
    assert client.get(f"/runs/{run}.json").json()["state"] == "completed"


def test_a_card_names_the_call_and_the_calls_that_will_not_run(
    store_copy: Path, ledger: Ledger, make_acting_client: ActingClientFactory, seeded: Seeded
) -> None:
    client = make_acting_client(store_copy, ledger)
    one = card(client, seeded.id("paused-1"))["effects"]
    assert one == {
        "call": 'refund(order_id="A-1002", amount=250.0)',
        "tool": "refund",
        "skipped": [],
        "reused": 1,
    }
    two = card(client, seeded.id("two-tools-first-pauses"))["effects"]
    assert two["call"] == 'refund(order_id="A-1005", amount=700.0)'
    assert two["skipped"] == ["notify_customer"]


def test_a_bad_prune_age_keeps_the_form_and_says_what_it_accepts(
    store_copy: Path,
    ledger: Ledger,
    make_acting_client: ActingClientFactory,
    page_text: Callable[..., str],
) -> None:
    client = make_acting_client(store_copy, ledger)
    answer = client.get("/prune", params={"older_than": "1 hour"})
    assert answer.status_code == 400
    assert 'name="older_than" value="1 hour"' in answer.text
    assert page_text(answer.text, "prune-error") == (
        "older_than='1 hour': give a whole number and a unit, like 90s, 30m, 12h, 7d or 2w,"
        " up to 10 years."
    )
    assert "Prune these" not in answer.text
    assert client.get("/prune.json", params={"older_than": "1 hour"}).status_code == 400


def _cards(html: str) -> dict[str, str]:
    """Each card by run, its age text left out: a slow test may see a card's "4 min ago"
    turn into "5 min ago" between two pages, which draws it anew, as it should."""
    return {
        m.group(1): re.sub(r"(<time [^>]*>)[^<]*(</time>)", r"\1\2", m.group(0))
        for m in re.finditer(
            r'<article class="approval" id="approval-([^"]+)">.*?</article>', html, re.S
        )
    }


def test_a_queue_card_is_drawn_again_when_anything_it_shows_changes(
    store_copy: Path, ledger: Ledger, make_acting_client: ActingClientFactory
) -> None:
    """Queue cards are kept once drawn (views/approvals.py, QueueCards): the first page
    draws each with the macro and the next gives the same cards; a card whose name to
    fill in or read-only state differs is drawn anew."""
    client = make_acting_client(store_copy, ledger)
    first = _cards(client.get("/approvals").text)
    assert first and _cards(client.get("/approvals").text) == first
    client.cookies.set("localui_approver", "Grace%20Hopper")
    named = _cards(client.get("/approvals").text)
    assert named.keys() == first.keys()
    for run, drawn in named.items():
        assert 'name="approver" value="Grace Hopper"' in drawn, run
        assert 'name="approver" value=""' in first[run], run
    viewer = make_acting_client(store_copy, ledger, read_only=True)
    read_only = _cards(viewer.get("/approvals").text)
    assert read_only.keys() == first.keys()
    assert all("Read-only: decisions are made elsewhere." in c for c in read_only.values())
    assert all("Read-only" not in c for c in first.values())
