"""A store whose path holds the characters a ``file:`` URI reads as syntax.

localui hands SQLite every path as a ``file:`` URI, where ``?`` starts the query,
``#`` the fragment and ``%`` an escape (``%41`` reads as ``A``), and where a space
and a letter outside ASCII must be escaped too. The store here lies under such a
directory with such a name, a copy of the runs the real SDK wrote, and the app
serves and acts on it: the runs index beside it, the trace spans, the users table,
the decision record and the notifications outbox in it, and a bundle opened at such
a path.
"""

from __future__ import annotations

import base64
import sqlite3
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import backup
from helpers import JSON, card, decide, sign_in_settings

from bench.receiver import Received, Receiver
from localui.backends.users import new_token, token_hash
from localui.bundle import load_bundles, read_bundle
from localui.notify import targets
from localui.settings import Notifications

if TYPE_CHECKING:
    from conftest import ActingClientFactory, ClientFactory, Ledger, Seeded

#: Every character a ``file:`` URI treats specially, and a letter outside ASCII.
ODD = "odd ?#%41 é"
SECRET = "whsec_" + base64.b64encode(b"the store-path tests' webhook key").decode()
#: The seeded store's pauses (``paused-1``, ``-2``, ``-3``, ``two-tools-first-pauses``).
SEEDED_PAUSES = 4


@pytest.fixture
def odd_store(tmp_path: Path, seeded: Seeded) -> Path:
    """A copy of the seeded store named ``ODD`` in a directory named ``ODD``."""
    directory = tmp_path / f"stores {ODD}"
    directory.mkdir()
    return backup(seeded.path, directory / f"local {ODD}.db")


def ground_truth(store: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows read straight from the file, by a plain path (no URI)."""
    with closing(sqlite3.connect(store)) as conn:
        return [tuple(r) for r in conn.execute(sql, params)]


def announced(requests: list[Received], event_type: str) -> list[str]:
    """The execution ids of the events of one type the webhook received."""
    return [r.json()["data"]["execution_id"] for r in requests if r.json()["type"] == event_type]


def test_a_store_at_an_odd_path_is_served_and_an_approval_goes_through(
    odd_store: Path,
    seeded: Seeded,
    ledger: Ledger,
    make_acting_client: ActingClientFactory,
    page_text: Callable[..., str],
    tmp_path: Path,
) -> None:
    with Receiver() as receiver:
        client = make_acting_client(
            odd_store,
            ledger,
            sign_in=sign_in_settings(),
            poll_interval=0.1,
            stale_after=10.0**9,
            notifications=Notifications(
                webhooks=(receiver.url + "/hook",),
                webhook_secret=SECRET,
                first_sweep_after=0.1,
                retry_initial=0.1,
            ),
        )
        users = client.app.state.localui.backend.users(writable=True)  # type: ignore[attr-defined]
        token = new_token()
        try:
            users.add("ann", "operator", token_hash(token))
        finally:
            users.close()
        # Ann's token is looked up in the store's users table on every request (an
        # operator: the notifications page is theirs to see).
        client.headers["Authorization"] = f"Bearer {token}"

        listed = client.get("/runs.json", headers=JSON)
        assert listed.status_code == 200, listed.text
        assert {r["execution_id"] for r in listed.json()["runs"]} == set(
            seeded.report.runs.values()
        )
        paused = client.get("/runs.json?state=paused", headers=JSON).json()["runs"]
        assert {r["execution_id"] for r in paused} == seeded.ids("paused")

        completed = seeded.id("completed")
        run_page = client.get(f"/runs/{completed}")
        assert run_page.status_code == 200, run_page.text
        assert "Done: refunded 40.00 on A-1001." in page_text(run_page.text, "trace")
        assert client.get(f"/runs/{completed}.json").json()["state"] == "completed"

        # Each waiting pause announced (from the outbox in the store) before one is decided.
        got = receiver.wait_for(lambda got: len(announced(got, "run.paused")) >= SEEDED_PAUSES)
        assert set(announced(got, "run.paused")) == seeded.ids("paused")

        run = seeded.id("paused-1")
        shown = card(client, run)
        response = decide(client, run, shown["checkpoint_id"])
        assert response.status_code == 200, response.text
        outcome = response.json()
        assert (outcome["action"], outcome["status"]) == ("approve", "completed")
        assert outcome["decision"]["approver"] == "ann"
        # Recorded in the store file itself, as Ann is in its users table.
        assert ground_truth(
            odd_store,
            "SELECT kind, actor, outcome FROM localui_decisions WHERE execution_id = ?",
            (run,),
        ) == [("approval", "ann", "completed")]
        assert ground_truth(odd_store, "SELECT name, role FROM localui_users") == [
            ("ann", "operator")
        ]

        assert client.get(f"/runs/{run}.json").json()["state"] == "completed"
        paused = client.get("/runs.json?state=paused", headers=JSON).json()["runs"]
        assert {r["execution_id"] for r in paused} == seeded.ids("paused") - {run}
        entries = client.get("/decisions.json").json()["decisions"]
        assert [(e["execution_id"], e["approver"], e["approved"]) for e in entries] == [
            (run, "ann", True)
        ]

        got = receiver.wait_for(lambda got: len(announced(got, "run.decided")) >= 1)
        assert announced(got, "run.decided") == [run]
        notes = client.get("/notifications.json")
        assert notes.status_code == 200, notes.text
        (target,) = notes.json()["targets"]
        url = receiver.url + "/hook"
        assert target["label"] == targets.masked(url) + "#" + targets.fingerprint("webhook", url)
        recent = {(a["event_type"], a["execution_id"]) for a in notes.json()["recent"]}
        assert ("run.decided", run) in recent and ("run.paused", run) in recent

    # The paused run had charged before it paused: the approval took it from the cache.
    assert ledger.count() == 0
    outbox = ground_truth(odd_store, "SELECT event_type FROM localui_notifications")
    assert Counter(e for (e,) in outbox)["run.paused"] == SEEDED_PAUSES
    # Nothing was opened at a path cut short at its "?" or "#".
    assert {p.name for p in tmp_path.iterdir()} <= {odd_store.parent.name, "ledger.jsonl"}


def test_a_run_exported_from_an_odd_path_opens_at_one(
    make_client: ClientFactory, odd_store: Path, seeded: Seeded, tmp_path: Path
) -> None:
    run = seeded.id("paused-1")
    exported = make_client(odd_store).get(f"/runs/{run}/bundle")
    assert exported.status_code == 200, exported.text
    bundle = tmp_path / "run.localui.gz"
    bundle.write_bytes(exported.content)

    target = tmp_path / f"opened {ODD}" / f"local {ODD}.db"
    target.parent.mkdir()
    load_bundles([read_bundle(bundle)], target)

    opened = make_client(target, read_only=True)
    page = opened.get(f"/runs/{run}.json")
    assert page.status_code == 200, page.text
    assert page.json()["state"] == "paused"
    assert [a["execution_id"] for a in opened.get("/approvals.json").json()["approvals"]] == [run]
    assert {p.name for p in tmp_path.iterdir()} == {
        bundle.name,
        target.parent.name,
        "stores " + ODD,
    }
