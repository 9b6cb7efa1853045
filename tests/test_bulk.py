"""Bulk decisions on the approvals desk: one name and reason for several cards, each
still its own exactly-once claim bound to the paused row its card showed.

The app acts on a copy of the seeded store (plus one more pause written by the demo
agent in a child process), with the refund-bot writing its side effects to a fresh
ledger; the store's own rows are the ground truth.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from helpers import card, decide

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import ActingClientFactory, Ledger, Raw, Seeded

JSON = {"Accept": "application/json"}
HTMX = {"HX-Request": "true"}


def another_pause(store: Path) -> str:
    """The demo agent in a process of its own pauses one more refund in ``store``."""
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false", "FASTAIAGENT_LOCAL_DB": str(store)}
    done = subprocess.run(
        [sys.executable, "-m", "localui.demo.worker", "--store", str(store)]
        + ["--scenario", "paused-1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=store.parent,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def pick(execution_id: str, checkpoint_id: str) -> str:
    return json.dumps([execution_id, checkpoint_id])


def test_bulk_of_five_three_won_one_decided_elsewhere_one_stale(
    store_copy: Path,
    ledger: Ledger,
    make_acting_client: ActingClientFactory,
    raw: Callable[[Path], Raw],
    seeded: Seeded,
) -> None:
    fifth = another_pause(store_copy)
    client = make_acting_client(store_copy, ledger)
    db = raw(store_copy)
    runs = [seeded.id(n) for n in ("paused-1", "paused-2", "paused-3")] + [
        seeded.id("two-tools-first-pauses"),
        fifth,
    ]
    shown = {run: card(client, run)["checkpoint_id"] for run in runs}
    decided_elsewhere, stale = runs[1], runs[2]
    # Another approver decides one of the ticked cards first.
    assert decide(client, decided_elsewhere, shown[decided_elsewhere], approver="Ada").is_success
    # A card opened before its run's last pause shows an earlier row of the run: its
    # tick carries that row, which is not the one the run now waits at.
    earlier = db.query(
        "SELECT checkpoint_id FROM checkpoints WHERE execution_id = ? AND status = 'completed'"
        " ORDER BY created_at DESC LIMIT 1",
        (stale,),
    )[0]["checkpoint_id"]
    picks = [pick(run, earlier if run == stale else shown[run]) for run in runs]

    response = client.post(
        "/approvals/bulk",
        data={"verb": "approve", "approver": "Bob", "reason": "batch ok", "pick": picks},
        headers=JSON,
    )

    assert response.status_code == 200
    page = response.json()
    results = {item["execution_id"]: item for item in page["items"]}
    assert (page["won"], page["already_decided"], page["stale"], page["refused"]) == (3, 1, 1, 0)
    assert results[decided_elsewhere]["result"] == "already_decided"
    assert results[decided_elsewhere]["words"] == "already approved by Ada"
    assert results[stale]["result"] == "stale"
    assert shown[stale] in results[stale]["words"]
    won = [run for run in runs if run not in (decided_elsewhere, stale)]
    assert all(results[run]["result"] == "won" for run in won)
    assert all(results[run]["status"] == "completed" for run in won)

    # The store: the three won runs ended once each, the stale one still waits, and
    # the app's record has one decision per run it decided.
    ends = {
        r["execution_id"]: r["n"]
        for r in db.query(
            "SELECT execution_id, COUNT(*) AS n FROM checkpoints WHERE step_type = 'run_end'"
            " GROUP BY execution_id"
        )
    }
    assert all(ends.get(run) == 1 for run in won)
    pending = {r["execution_id"] for r in db.query("SELECT execution_id FROM pending_interrupts")}
    assert pending == {stale}
    decisions = db.query("SELECT execution_id, actor FROM localui_decisions ORDER BY id")
    assert [(d["execution_id"], d["actor"]) for d in decisions] == [
        (decided_elsewhere, "Ada"),
        *((run, "Bob") for run in won),
    ]
    # Each approval re-ran its refund once and reused the charge the run had stored
    # before it paused: no charge ran twice, and the skipped sibling did not run.
    assert ledger.count("charge_back") == 0
    assert ledger.count("notify_customer") == 0


def test_bulk_answers_each_way_a_person_reads_it(
    store_copy: Path, ledger: Ledger, make_acting_client: ActingClientFactory, seeded: Seeded
) -> None:
    client = make_acting_client(store_copy, ledger)
    run = seeded.id("paused-1")
    checkpoint = card(client, run)["checkpoint_id"]
    data = {"verb": "reject", "approver": "Bob", "reason": "", "pick": [pick(run, checkpoint)]}

    empty_reason = client.post("/approvals/bulk", data=data, headers=JSON)
    assert empty_reason.status_code == 400
    assert empty_reason.json()["error"]["message"] == "a reason is required to reject"
    nothing = client.post("/approvals/bulk", data={**data, "pick": [], "reason": "x"}, headers=JSON)
    assert nothing.status_code == 400
    assert "pick at least one card" in nothing.json()["error"]["message"]

    # A plain form (no JavaScript): a page that leads with each outcome.
    plain = client.post("/approvals/bulk", data={**data, "reason": "over budget"})
    assert plain.status_code == 200
    assert "Bob rejected 1 card (over budget)" in plain.text
    assert "1 won · 0 already decided · 0 stale · 0 refused" in plain.text
    assert f"{run}</code></a>: Bob rejected it: the run completed" in plain.text
    assert plain.cookies.get("localui_approver") == "Bob"

    again = client.post("/approvals/bulk", data={**data, "reason": "over budget"}, headers=HTMX)
    assert again.status_code == 200
    assert 'id="bulk-outcome"' in again.text and "<html" not in again.text
    assert "0 won · 1 already decided" in again.text
    assert "already rejected by Bob" in again.text
