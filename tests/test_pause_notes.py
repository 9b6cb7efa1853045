"""Notes on a pause, on SQLite and on PostgreSQL, with sign-in on.

People who may decide a pause leave notes on it ("called the customer, waiting for the
invoice"); the notes show on the card (queue and card page), the run page, their JSON
and the run's bundle, and are announced as ``pause.noted``. A note is no decision: the
run keeps waiting and the decision record stays empty.

Each test serves a fresh copy of the runs the real SDK wrote, with the refund-bot
registered; people sign in with personal tokens from the store's own users table.
"""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from helpers import JSON, NO_SIGN_IN, TEST_TOKEN, run_cli, sign_in_settings
from test_live import http, open_stream, running

from bench.receiver import Receiver
from localui.app import create_app
from localui.backends.base import NoteLog
from localui.backends.sqlite.notes import SQLiteNotes
from localui.backends.users import token_hash
from localui.bundle import load_bundles, read_bundle
from localui.notify import events as ev
from localui.policy import parse_policy
from localui.settings import Notifications, Settings
from localui.views.urls import dom_id

if TYPE_CHECKING:
    from conftest import PgStore
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

#: Refunds are decided by finance and by ada; carl is an approver the rule leaves out.
RULE = """
[[rule]]
name = "refunds"
agent = "refund-*"
approvers = ["group:finance", "user:ada"]
"""
NOTE = "called the customer, waiting for the invoice"


@dataclass
class Desk:
    """An app over a fresh copy of the seeded runs, its users, its notes table opened
    as another process would, and plain SQL on the app's own tables and the run's rows."""

    kind: str
    client: TestClient
    ids: Callable[[str], str]
    users: Any
    #: The notes table, written as another localui process would write it.
    notes: NoteLog
    query: Callable[[str, tuple[Any, ...]], list[dict[str, Any]]]
    export_args: list[str]
    client_with: Callable[..., TestClient]
    #: The app over the same store, its lifespan not started (no runner registered).
    app_with: Callable[..., Starlette]

    def add(self, name: str, role: str = "approver", *groups: str) -> dict[str, str]:
        """A person in the users table; the headers their scripts sign in with."""
        token = f"token-of-{name}-0123456789abcdef"
        self.users.add(name, role, token_hash(token), groups)
        return {**JSON, "Authorization": f"Bearer {token}"}

    def checkpoint_of(self, run: str, headers: dict[str, str]) -> str:
        for item in self.client.get("/approvals.json", headers=headers).json()["approvals"]:
            if item["execution_id"] == run:
                return str(item["checkpoint_id"])
        raise AssertionError(f"{run} is not in the queue")

    def stored_notes(self, run: str) -> list[dict[str, Any]]:
        return self.query(
            "SELECT author, text, checkpoint_id FROM {app}localui_notes WHERE execution_id = ?"
            " ORDER BY id",
            (run,),
        )

    def decisions(self, run: str) -> list[dict[str, Any]]:
        return self.query(
            "SELECT actor FROM {app}localui_decisions WHERE execution_id = ?", (run,)
        ) + self.query("SELECT actor FROM {app}localui_votes WHERE execution_id = ?", (run,))

    def run_ends(self, run: str) -> list[str]:
        rows = self.query(
            "SELECT status FROM {sdk}checkpoints WHERE execution_id = ? AND step_type = 'run_end'",
            (run,),
        )
        return [r["status"] for r in rows]


@pytest.fixture(params=["sqlite", "postgres"])
def open_desk(request: pytest.FixtureRequest) -> Iterator[Callable[..., Desk]]:
    """``open_desk(**settings)``: a :class:`Desk` with sign-in on and :data:`RULE`."""
    closing: list[Any] = []

    def make(**settings: Any) -> Desk:
        settings.setdefault("sign_in", sign_in_settings())
        settings.setdefault("policy", parse_policy(RULE, "policy.toml"))
        if request.param == "sqlite":
            from conftest import Raw

            from localui.backends.sqlite.notes import SQLiteNotes
            from localui.backends.sqlite.users import SQLiteUsers

            path: Path = request.getfixturevalue("copy_store")()
            make_client = request.getfixturevalue("make_acting_client")

            def client_with(**more: Any) -> TestClient:
                return make_client(path, raise_server_exceptions=False, **(settings | more))

            client = client_with()
            raw = Raw(path)

            def query(sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
                rows = raw.query(sql.format(app="", sdk=""), params)
                return [dict(zip(r.keys(), r, strict=True)) for r in rows]

            desk = Desk(
                "sqlite",
                client,
                request.getfixturevalue("seeded").id,
                SQLiteUsers(path, writable=True),
                SQLiteNotes(path, writable=True),
                query,
                ["--store", str(path)],
                client_with,
                lambda **more: create_app(Settings(store=str(path), **(settings | more))),
            )
        else:
            from localui.backends.postgres.notes import PostgresNotes
            from localui.backends.postgres.users import PostgresUsers

            store: PgStore = request.getfixturevalue("pg_store")
            make_pg = request.getfixturevalue("make_pg_client")

            def pg_client_with(**more: Any) -> TestClient:
                return make_pg(store, raise_server_exceptions=False, **(settings | more))

            client = pg_client_with()

            def pg_query(sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
                text = sql.format(app=f"{store.app_schema}.", sdk=f"{store.schema}.")
                return store.raw.query(text.replace("?", "%s"), params)

            desk = Desk(
                "postgres",
                client,
                request.getfixturevalue("pg_seeded").id,
                PostgresUsers(store.dsn, schema=store.app_schema, writable=True),
                PostgresNotes(store.dsn, schema=store.app_schema, writable=True),
                pg_query,
                [
                    "--store",
                    store.dsn,
                    "--pg-schema",
                    store.schema,
                    "--pg-app-schema",
                    store.app_schema,
                ],
                pg_client_with,
                lambda **more: create_app(store.settings(**(settings | more))),
            )
        closing.extend([desk.users, desk.notes])
        return desk

    yield make
    for opened in closing:
        opened.close()


def leave(
    desk: Desk,
    run: str,
    checkpoint_id: str,
    text: str,
    headers: dict[str, str],
    client: TestClient | None = None,
) -> httpx.Response:
    """A note as the card's form posts it (by ``client``, else the desk's own)."""
    return (client or desk.client).post(
        f"/approvals/{run}/notes",
        data={"checkpoint_id": checkpoint_id, "text": text},
        headers=headers,
        follow_redirects=False,
    )


def html_of(headers: dict[str, str]) -> dict[str, str]:
    """The same person, asking for pages as a browser does."""
    return {"Authorization": headers["Authorization"]}


def error_of(response: httpx.Response) -> str:
    return str(response.json()["error"]["message"])


def test_an_approver_leaves_a_note_and_everyone_sees_it_where_the_pause_is(
    open_desk: Callable[..., Desk], page_text: Callable[..., str], tmp_path: Path
) -> None:
    desk = open_desk()
    ada = desk.add("ada", "approver")
    bob = desk.add("bob", "approver", "finance")
    viewer = desk.add("vera", "viewer")
    run = desk.ids("paused-1")
    checkpoint_id = desk.checkpoint_of(run, ada)
    # The queue's card is drawn (and kept) before the note: the note must still show.
    before = desk.client.get("/approvals", headers=html_of(viewer))
    assert "No notes yet." in before.text and NOTE not in before.text

    answer = leave(desk, run, checkpoint_id, NOTE, ada)
    assert answer.status_code == 201, answer.text
    note = answer.json()
    assert (note["author"], note["text"], note["checkpoint_id"]) == ("ada", NOTE, checkpoint_id)
    assert desk.stored_notes(run) == [
        {"author": "ada", "text": NOTE, "checkpoint_id": checkpoint_id}
    ]

    # The queue, as JSON and as the page a viewer reads (who may not write one).
    card = next(
        item
        for item in desk.client.get("/approvals.json", headers=viewer).json()["approvals"]
        if item["execution_id"] == run
    )
    assert [(n["author"], n["text"]) for n in card["notes"]["notes"]] == [("ada", NOTE)]
    assert card["notes"]["may_write"] is False
    queue = desk.client.get("/approvals", headers=html_of(viewer)).text
    notes_id = f"notes-{dom_id(run)}-{dom_id(checkpoint_id)}"
    assert f"ada {card['notes']['notes'][0]['created_at'][:10]}" in page_text(queue, notes_id)
    assert NOTE in page_text(queue, notes_id)
    assert "Add note" not in page_text(queue, f"approval-{dom_id(run)}")
    # Bob may decide, so his card has the form; a second note shows on the cached card.
    assert "Add note" in page_text(
        desk.client.get("/approvals", headers=html_of(bob)).text, f"approval-{dom_id(run)}"
    )
    assert leave(desk, run, checkpoint_id, "invoice is in", bob).status_code == 201
    queue = desk.client.get("/approvals", headers=html_of(viewer)).text
    shown = page_text(queue, notes_id)
    assert shown.index(NOTE) < shown.index("invoice is in"), shown

    # The card's own page and its JSON.
    assert "invoice is in" in page_text(
        desk.client.get(f"/approvals/{run}", headers=html_of(viewer)).text, notes_id
    )
    pending = desk.client.get(f"/approvals/{run}.json", headers=viewer).json()["pending"]
    assert [n["author"] for n in pending["notes"]["notes"]] == ["ada", "bob"]

    # The run page, beside the pause, and its JSON.
    assert NOTE in page_text(
        desk.client.get(f"/runs/{run}", headers=html_of(viewer)).text, notes_id
    )
    on_run = desk.client.get(f"/runs/{run}.json", headers=viewer).json()
    assert [(n["author"], n["text"]) for n in on_run["notes"]] == [
        ("ada", NOTE),
        ("bob", "invoice is in"),
    ]

    # The bundle, served and exported.
    served = desk.client.get(f"/runs/{run}/bundle", headers=html_of(viewer))
    assert served.status_code == 200
    bundled = json.loads(gzip.decompress(served.content))["runs"][0]["notes"]
    assert [(n["author"], n["text"], n["checkpoint_id"]) for n in bundled] == [
        ("ada", NOTE, checkpoint_id),
        ("bob", "invoice is in", checkpoint_id),
    ]
    target = tmp_path / "run.localui.gz"
    done = run_cli("export", run, *desk.export_args, "--output", str(target))
    assert done.returncode == 0, done.stderr
    exported = json.loads(gzip.decompress(target.read_bytes()))["runs"][0]["notes"]
    assert [n["text"] for n in exported] == [NOTE, "invoice is in"]
    # ``localui open`` shows them again, beside the pause they were left on.
    opened = tmp_path / "opened.db"
    load_bundles([read_bundle(target)], opened)
    reread = SQLiteNotes(opened, writable=False)
    try:
        assert [(n.author, n.checkpoint_id) for n in reread.for_run(run)] == [
            ("ada", checkpoint_id),
            ("bob", checkpoint_id),
        ]
    finally:
        reread.close()

    # A note decides nothing: the run still waits, and no decision or vote was recorded.
    assert desk.decisions(run) == []
    assert desk.run_ends(run) == []
    assert desk.client.get(f"/runs/{run}.json", headers=viewer).json()["state"] == "paused"
    assert desk.client.get(f"/runs/{run}.json", headers=viewer).json()["decisions"] == []
    assert desk.client.get("/decisions.json", headers=viewer).json()["decisions"] == []

    # Audited like every change: who, what, on which run.
    rows = desk.query(
        "SELECT actor, action, status, execution_id FROM {app}localui_audit WHERE action = ?",
        ("note",),
    )
    assert [(r["actor"], r["status"], r["execution_id"]) for r in rows] == [
        ("ada", 201, run),
        ("bob", 201, run),
    ]


def test_a_plain_form_goes_back_and_htmx_gets_the_notes_again(
    open_desk: Callable[..., Desk], page_text: Callable[..., str]
) -> None:
    desk = open_desk()
    ada = desk.add("ada", "approver")
    run = desk.ids("paused-2")
    checkpoint_id = desk.checkpoint_of(run, ada)
    signed = html_of(ada)
    back = f"http://127.0.0.1:8765/runs/{run}"
    form = leave(desk, run, checkpoint_id, "first", {**signed, "referer": back})
    assert form.status_code == 303 and form.headers["location"] == back
    # A page elsewhere is not where the form came from: the card's own page is.
    elsewhere = leave(desk, run, checkpoint_id, "second", {**signed, "referer": "https://x.test/"})
    assert elsewhere.headers["location"] == f"/approvals/{run}"
    fragment = leave(desk, run, checkpoint_id, "third", {**signed, "hx-request": "true"})
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith('<section class="pause-notes"')
    assert page_text(fragment.text).count("ada") == 3
    assert "Add note" in fragment.text


def test_with_sign_in_off_the_writer_names_themselves(
    open_desk: Callable[..., Desk], page_text: Callable[..., str]
) -> None:
    desk = open_desk(sign_in=NO_SIGN_IN)
    run = desk.ids("paused-1")
    checkpoint_id = desk.checkpoint_of(run, JSON)
    # The card's form asks the name, offering the one this browser last gave.
    desk.client.cookies.set("localui_approver", "Ann")
    html = desk.client.get(f"/approvals/{run}").text
    notes_id = f"notes-{dom_id(run)}-{dom_id(checkpoint_id)}"
    assert 'name="author" value="Ann"' in html and "Add note" in page_text(html, notes_id)
    nameless = leave(desk, run, checkpoint_id, NOTE, JSON)
    assert nameless.status_code == 400 and "author is required" in error_of(nameless)
    named = desk.client.post(
        f"/approvals/{run}/notes",
        data={"checkpoint_id": checkpoint_id, "text": NOTE, "author": " Ann Approver "},
        headers=JSON,
    )
    assert named.status_code == 201, named.text
    assert named.json()["author"] == "Ann Approver"
    assert "localui_approver=Ann%20Approver" in named.headers["set-cookie"]
    assert [n["author"] for n in desk.stored_notes(run)] == ["Ann Approver"]


def test_who_may_not_leave_a_note_is_refused_and_nothing_is_kept(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk()
    ada = desk.add("ada", "approver")
    viewer = desk.add("vera", "viewer")
    carl = desk.add("carl", "approver")  # an approver, but the rule names finance and ada
    owner = {**JSON, "Authorization": f"Bearer {TEST_TOKEN}"}  # an operator, not named either
    run = desk.ids("paused-1")
    checkpoint_id = desk.checkpoint_of(run, ada)

    refused = leave(desk, run, checkpoint_id, NOTE, viewer)
    assert refused.status_code == 403
    assert "viewer" in error_of(refused)
    for person in (carl, owner):
        refused = leave(desk, run, checkpoint_id, NOTE, person)
        assert refused.status_code == 403, refused.text
        assert "Rule 'refunds': only finance or ada may decide this pause" in error_of(refused)
    card = next(
        item
        for item in desk.client.get("/approvals.json", headers=carl).json()["approvals"]
        if item["execution_id"] == run
    )
    assert card["notes"]["may_write"] is False
    assert "Add note" not in desk.client.get(f"/approvals/{run}", headers=html_of(carl)).text
    assert desk.stored_notes(run) == []


def test_bad_notes_are_refused_saying_why_and_nothing_is_kept(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk()
    ada = desk.add("ada", "approver")
    run = desk.ids("paused-1")
    checkpoint_id = desk.checkpoint_of(run, ada)

    stale = leave(desk, run, "a-row-the-run-does-not-wait-at", NOTE, ada)
    assert stale.status_code == 409
    assert f"the run now waits at row {checkpoint_id}" in error_of(stale)
    assert stale.json()["error"]["details"]["current_checkpoint_id"] == checkpoint_id
    done = desk.ids("completed")
    ended = leave(desk, done, checkpoint_id, NOTE, ada)
    assert ended.status_code == 409 and "not waiting for a person" in error_of(ended)
    assert leave(desk, "no-such-run", checkpoint_id, NOTE, ada).status_code == 404

    for text, says in (
        ("", "a note needs text"),
        ("   \n ", "a note needs text"),
        ("x" * 2001, "note is longer than 2,000 characters (2,001)"),
        ("clear \x1b[2J the screen", "note holds a control character (U+001B"),
        ("reversed \u202e text", "note holds a bidirectional override (U+202E"),
    ):
        refused = leave(desk, run, checkpoint_id, text, ada)
        assert refused.status_code == 400, (text, refused.text)
        assert says in error_of(refused)
    missing = desk.client.post(f"/approvals/{run}/notes", data={"text": NOTE}, headers=ada)
    assert missing.status_code == 400 and "checkpoint_id" in error_of(missing)
    # Exactly the limit is taken, and a browser's CR LF is a newline.
    assert leave(desk, run, checkpoint_id, "y" * 2000, ada).status_code == 201
    assert leave(desk, run, checkpoint_id, "two\r\nlines", ada).status_code == 201
    assert [n["text"] for n in desk.stored_notes(run)] == ["y" * 2000, "two\nlines"]


def test_a_read_only_server_refuses_notes_and_offers_no_form(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk()
    ada = desk.add("ada", "approver")
    run = desk.ids("paused-1")
    checkpoint_id = desk.checkpoint_of(run, ada)
    # Another process's note, before the read-only server starts: it is shown.
    desk.notes.add(run, checkpoint_id, "bob", NOTE)
    reader = desk.client_with(read_only=True)
    refused = reader.post(
        f"/approvals/{run}/notes", data={"checkpoint_id": checkpoint_id, "text": "x"}, headers=ada
    )
    assert refused.status_code == 403
    assert "read-only" in error_of(refused)
    card = next(
        item
        for item in reader.get("/approvals.json", headers=ada).json()["approvals"]
        if item["execution_id"] == run
    )
    assert [n["text"] for n in card["notes"]["notes"]] == [NOTE]
    assert "Add note" not in reader.get(f"/approvals/{run}", headers=html_of(ada)).text
    assert [n["author"] for n in desk.stored_notes(run)] == ["bob"]


def test_the_run_page_keeps_the_notes_once_the_pause_is_decided(
    open_desk: Callable[..., Desk], page_text: Callable[..., str]
) -> None:
    desk = open_desk()
    ada = desk.add("ada", "approver")
    run = desk.ids("paused-1")
    checkpoint_id = desk.checkpoint_of(run, ada)
    assert leave(desk, run, checkpoint_id, NOTE, ada).status_code == 201
    decided = desk.client.post(
        f"/approvals/{run}/approve",
        data={"checkpoint_id": checkpoint_id, "reason": "invoice seen"},
        headers=ada,
    )
    assert decided.status_code == 200, decided.text
    assert decided.json()["status"] == "completed"
    # The decision is the approval alone: the note added no vote and no decision.
    assert [d["actor"] for d in desk.decisions(run)] == ["ada"]
    page = desk.client.get(f"/runs/{run}", headers=html_of(ada)).text
    earlier = page_text(page, "run-notes")
    assert "Notes on earlier pauses" in earlier and NOTE in earlier and checkpoint_id in earlier
    assert "Add note" not in earlier
    assert [
        n["text"] for n in desk.client.get(f"/runs/{run}.json", headers=ada).json()["notes"]
    ] == [NOTE]
    # The pause is gone: a note on it now is refused.
    late = leave(desk, run, checkpoint_id, "too late", ada)
    assert late.status_code == 409 and "not waiting for a person" in error_of(late)


def test_a_note_is_escaped_wherever_it_shows(open_desk: Callable[..., Desk]) -> None:
    desk = open_desk()
    ada = desk.add("ada", "approver")
    run = desk.ids("paused-1")
    checkpoint_id = desk.checkpoint_of(run, ada)
    attack = '<script>alert("note")</script><img src=x onerror=alert(1)>'
    assert leave(desk, run, checkpoint_id, attack, ada).status_code == 201
    for path in ("/approvals", f"/approvals/{run}", f"/runs/{run}"):
        html = desk.client.get(path, headers=html_of(ada)).text
        assert "&lt;script&gt;alert(&#34;note&#34;)&lt;/script&gt;&lt;img" in html, path
        assert "<script>alert(" not in html and "<img src=x" not in html, path


def test_pause_noted_is_recorded_once_and_delivered_to_the_webhook(
    open_desk: Callable[..., Desk],
) -> None:
    from test_notify import SECRET, verified

    desk = open_desk()
    ada = desk.add("ada", "approver")
    run = desk.ids("paused-1")
    with Receiver() as receiver:
        notifications = Notifications(
            webhooks=(receiver.url + "/hook",),
            webhook_secret=SECRET,
            events=(ev.NOTED,),
            retry_initial=0.1,
            retry_max=0.4,
            # One sweep at the start and none after: what is announced below comes at
            # once (a note written here) or through the change feed (another process's).
            sweep_interval=600.0,
            first_sweep_after=0.1,
        )
        # The rule's own target is told of its pauses' notes too (Apprise's json://).
        told = RULE + f'notify = ["json://127.0.0.1:{receiver.port}/rule"]\n'
        client = desk.client_with(
            notifications=notifications,
            poll_interval=0.1,
            policy=parse_policy(told, "policy.toml"),
        )
        state = client.app.state.localui  # type: ignore[attr-defined]
        watcher = state.watcher
        deadline = time.monotonic() + 30
        while watcher.swept_at is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the first sweep is done: no later one comes
        assert watcher.swept_at is not None
        checkpoint_id = desk.checkpoint_of(run, ada)
        posted = leave(desk, run, checkpoint_id, NOTE, ada, client)
        assert posted.status_code == 201
        # Written by another process (its notes table): the feed tells this one.
        other = desk.notes.add(run, checkpoint_id, "bob", "invoice is in")

        def noted(received: list[Any]) -> list[dict[str, Any]]:
            hooks = [r for r in received if r.path == "/hook"]
            return [b for b in map(verified, hooks) if b["type"] == ev.NOTED]

        def chat(received: list[Any]) -> str:
            return " ".join(r.json()["message"] for r in received if r.path == "/rule")

        got = receiver.wait_for(lambda r: len(noted(r)) >= 2, 30)
        said = chat(receiver.wait_for(lambda r: "invoice is in" in chat(r) and NOTE in chat(r), 30))
        assert f"ada left a note on node turn:0/tool:refund of run {run}" in said
        by_author = {b["data"]["author"]: b["data"] for b in noted(got)}
        assert set(by_author) == {"ada", "bob"}
        data = by_author["ada"]
        assert (data["text"], data["rule"], data["execution_id"]) == (NOTE, "refunds", run)
        assert data["checkpoint_id"] == checkpoint_id
        assert data["note_id"] == str(posted.json()["id"])
        assert data["url"].endswith(f"/approvals/{run}")
        assert by_author["bob"]["note_id"] == str(other.id)

        # Offered again (at once and by the sweeps): recorded and sent once all the same.
        pending = state.store.get_pending(run)
        note = next(n for n in desk.notes.for_run(run) if n.author == "ada")
        again = ev.noted(note, pending, "refunds")
        client.portal.call(watcher.offer, [again])
        client.portal.call(watcher.offer, [again])
        # A sweep reads both notes, finds both announced, and records nothing.
        assert watcher.sweep() == 0
        time.sleep(1.0)  # a few sending rounds more: nothing else comes
        rows = desk.query(
            "SELECT event_key FROM {app}localui_notifications WHERE event_type = ?", (ev.NOTED,)
        )
        # Once for each of the two targets, the server's webhook and the rule's chat.
        assert sorted(Counter(r["event_key"] for r in rows).values()) == [2, 2]
        ids = Counter(r.headers["webhook-id"] for r in receiver.requests("/hook"))
        assert len(ids) == 2 and max(ids.values()) == 1
    # Not a decision: nothing was decided because of it.
    assert desk.decisions(run) == []


@pytest.mark.anyio
async def test_a_note_reaches_an_open_queue_and_run_page(
    open_desk: Callable[..., Desk], page_text: Callable[..., str]
) -> None:
    desk = open_desk()
    ada = desk.add("ada", "approver")
    run = desk.ids("paused-1")
    checkpoint_id = desk.checkpoint_of(run, ada)
    app = desk.app_with(poll_interval=0.05)
    heard = ((b"authorization", ada["Authorization"].encode()),)
    notes_id = f"notes-{dom_id(run)}-{dom_id(checkpoint_id)}"
    async with (
        running(app),
        http(app) as client,
        open_stream(app, "/live/approvals", headers=heard) as queue,
        open_stream(app, f"/live/runs/{run}", headers=heard) as run_page,
        open_stream(app, f"/live/approvals/{run}", headers=heard) as card_page,
    ):
        await queue.first("queue")
        await run_page.first("run-state")
        opening = (await card_page.first("pause-notes"))["pause-notes"].data
        assert "No notes yet." in page_text(opening, notes_id)
        # The card's own page listens for them, for desk.js to take the notes alone.
        html = (await client.get(f"/approvals/{run}", headers=html_of(ada))).text
        assert f'sse-swap="pause-notes" hx-target="#{notes_id}"' in html
        posted = await client.post(
            f"/approvals/{run}/notes",
            data={"checkpoint_id": checkpoint_id, "text": NOTE},
            headers=ada,
        )
        assert posted.status_code == 201, posted.text

        def says(e: Any) -> bool:
            return NOTE in e.data

        pushed = (await queue.each({"queue": says}))["queue"].data
        assert NOTE in page_text(pushed, notes_id)
        on_run = (await run_page.each({"run-state": says}))["run-state"].data
        assert NOTE in page_text(on_run, notes_id)
        on_card = (await card_page.each({"pause-notes": says}))["pause-notes"].data
        assert NOTE in page_text(on_card, notes_id)

        # A note another process writes reaches them too, through the change feed.
        desk.notes.add(run, checkpoint_id, "bob", "invoice is in")

        def says_bob(e: Any) -> bool:
            return "invoice is in" in e.data

        pushed = (await queue.each({"queue": says_bob}))["queue"].data
        assert "invoice is in" in page_text(pushed, notes_id)
        on_run = (await run_page.each({"run-state": says_bob}))["run-state"].data
        assert "invoice is in" in page_text(on_run, notes_id)
        on_card = (await card_page.each({"pause-notes": says_bob}))["pause-notes"].data
        assert "invoice is in" in page_text(on_card, notes_id)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_read_only_server_shows_no_notes_and_makes_no_table(
    kind: str, request: pytest.FixtureRequest
) -> None:
    owner = {**JSON, "Authorization": f"Bearer {TEST_TOKEN}"}
    if kind == "sqlite":
        from conftest import Raw

        path: Path = request.getfixturevalue("copy_store")()
        reader = request.getfixturevalue("make_client")(
            path, read_only=True, sign_in=sign_in_settings()
        )
        run = request.getfixturevalue("seeded").id("paused-1")

        def has_table() -> bool:
            found = Raw(path).query(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'localui_notes'"
            )
            return bool(found)

    else:
        store: PgStore = request.getfixturevalue("pg_store")
        reader = request.getfixturevalue("make_pg_client")(
            store, agents=[], read_only=True, sign_in=sign_in_settings()
        )
        run = request.getfixturevalue("pg_seeded").id("paused-1")

        def has_table() -> bool:
            found = store.raw.query(
                "SELECT to_regclass(%s) AS t", (f"{store.app_schema}.localui_notes",)
            )
            return found[0]["t"] is not None

    card = reader.get(f"/approvals/{run}.json", headers=owner).json()["pending"]
    assert card["notes"]["notes"] == []
    assert reader.get(f"/runs/{run}.json", headers=owner).json()["notes"] == []
    assert not has_table()


def test_pause_noted_reads_as_a_note_in_chat_and_in_a_webhook() -> None:
    from datetime import UTC, datetime

    from localui.backends.notes import Note
    from localui.notify import formats
    from localui.records import Pending

    note = Note(7, "run-1", "ckpt-9", "ada", "called the customer", "2026-12-07T00:30:00+00:00")
    pending = Pending(
        execution_id="run-1",
        agent="refund-bot",
        node_id="turn:0/tool:refund",
        reason="manager_approval",
        context={},
        agent_path=None,
        created_at="2026-12-07T00:00:00+00:00",
        checkpoint_id="ckpt-9",
    )
    event = ev.noted(note, pending, "refunds")
    assert event.key == ev.event_key(ev.NOTED, "run-1", "7")
    assert ev.parse_notify_on("noted") == {ev.NOTED}
    links = formats.Links(approval=lambda e: f"https://desk/approvals/{e}", run=lambda e: e)
    title, body = formats.message([event], links, datetime(2026, 12, 7, 1, tzinfo=UTC))
    assert title == "Note from ada: node turn:0/tool:refund"
    assert body == (
        "ada left a note on node turn:0/tool:refund of run run-1 — refund-bot (Agent"
        " 'refund-bot'): \"called the customer\"\nhttps://desk/approvals/run-1"
    )
    data = formats.webhook_body(event, links, frozenset())["data"]
    assert (data["author"], data["text"], data["note_id"], data["rule"]) == (
        "ada",
        "called the customer",
        "7",
        "refunds",
    )
    # A note on a row the run no longer waits at still names its run and author.
    later = ev.noted(note, None, "")
    assert (later.agent, later.rule, later.actor) == ("", "", "ada")


def test_a_decision_link_s_page_shows_the_notes_and_offers_no_note_form(
    open_desk: Callable[..., Desk], page_text: Callable[..., str]
) -> None:
    from test_decision_links import form_of, mint, page_of

    desk = open_desk()
    ada = desk.add("ada", "approver")
    run = desk.ids("paused-1")
    checkpoint_id = desk.checkpoint_of(run, ada)
    assert leave(desk, run, checkpoint_id, NOTE, ada).status_code == 201
    page = page_of(desk, run, mint(desk, "ada", run, checkpoint_id))
    assert page.status_code == 200, page.text
    notes_id = f"notes-{dom_id(run)}-{dom_id(checkpoint_id)}"
    assert NOTE in page_text(page.text, notes_id)
    # The page signs nobody in: a note is left on the desk, so its form is not here
    # (and the decision's form keeps only its own hidden values).
    assert "Add note" not in page.text and "<textarea" not in page.text
    assert set(form_of(page)) == {"link", "form_key"}


def test_whoever_decides_for_an_away_person_may_leave_notes_for_them(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk()
    ada = desk.add("ada", "approver")
    carl = desk.add("carl", "approver")  # the rule names finance and ada, not carl
    run = desk.ids("paused-1")
    checkpoint_id = desk.checkpoint_of(run, ada)
    assert leave(desk, run, checkpoint_id, "before", carl).status_code == 403
    desk.users.set_away("ada", "carl", "")
    time.sleep(2.2)  # the users table is read again within two seconds
    assert leave(desk, run, checkpoint_id, NOTE, carl).status_code == 201
    desk.users.set_away("ada", "", "")
    time.sleep(2.2)
    assert leave(desk, run, checkpoint_id, "after", carl).status_code == 403
    assert [(n["author"], n["text"]) for n in desk.stored_notes(run)] == [("carl", NOTE)]
