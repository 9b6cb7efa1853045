"""People told at their own address, on SQLite and on PostgreSQL: each pause goes to
each person with an address who may decide it, with a decision link of their own; a
channel keeps getting the desk's link. The addresses are Apprise ``json://`` URLs of a
receiver on loopback, so Apprise itself delivers every message.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from helpers import JSON, sign_in_settings
from test_notify import QUICK_RETRIES, SEEDED_PAUSES, Where, acting_agents, running, until, where

from bench.receiver import Receiver
from localui.app import create_app
from localui.backends.users import token_hash
from localui.policy import parse_policy
from localui.settings import Notifications

__all__ = ["where"]  # the fixture, shared with the notification tests

ADA_ONLY = """
[[rule]]
name = "refunds"
agent = "refund-bot"
approvers = ["user:ada"]
"""

LINK = re.compile(r"(https?://\S+/decide/([^/\s]+)/(\S+))")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.contextmanager
def users_of(where: Where) -> Iterator[Any]:
    """The served store's users table, writable, as ``localui users`` opens it."""
    if where.pg is None:
        from localui.backends.sqlite.users import SQLiteUsers

        users: Any = SQLiteUsers(where.store, writable=True)
    else:
        from localui.backends.postgres.users import PostgresUsers

        users = PostgresUsers(where.pg.dsn, schema=where.pg.app_schema, writable=True)
    try:
        yield users
    finally:
        users.close()


def add(users: Any, name: str, role: str, address: str = "") -> None:
    users.add(name, role, token_hash(f"token-of-{name}-0123456789abcdef"), (), address)


def links_in(message: str) -> dict[str, str]:
    """Each personal decision link in a message, by run."""
    return {run: url for url, run, _ in LINK.findall(message)}


@pytest.mark.anyio
async def test_each_person_who_may_decide_gets_their_own_link_and_it_decides(where: Where) -> None:
    with Receiver() as receiver, contextlib.ExitStack() as stack:
        port = receiver.port
        with users_of(where) as users:
            add(users, "ada", "approver", f"json://127.0.0.1:{port}/ada")
            add(users, "bob", "approver", f"json://127.0.0.1:{port}/bob")
            add(users, "vic", "viewer", f"json://127.0.0.1:{port}/vic")
            add(users, "carl", "approver")
        notifications = Notifications(chat=(f"json://127.0.0.1:{port}/room",), **QUICK_RETRIES)
        settings = where.settings(
            notifications, sign_in=sign_in_settings(), policy=parse_policy(ADA_ONLY)
        )
        app = create_app(settings, agents=acting_agents(where, stack))
        async with running(app):
            await until(receiver, lambda r: any(x.path == "/ada" for x in r))
            await until(receiver, lambda r: any(x.path == "/room" for x in r))
            await anyio.sleep(1.0)  # a few polls and a sweep more: nothing else comes
            [to_ada] = receiver.requests("/ada")
            # The rule names ada alone: bob is not told, nor the viewer, nor carl (no address).
            assert receiver.requests("/bob") == [] and receiver.requests("/vic") == []
            message = to_ada.json()["message"]
            links = links_in(message)
            assert set(links) == set(where.seed.ids("paused")), message
            assert "You may decide it at your own link" in message
            # The room gets the desk's link, which asks to sign in.
            [to_room] = receiver.requests("/room")
            assert LINK.search(to_room.json()["message"]) is None
            assert "/approvals/" in to_room.json()["message"]

            run = where.seed.id("paused-1")
            path = links[run].split("://", 1)[1].split("/", 1)[1]
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 50000)),
                base_url="http://127.0.0.1:8765",
            ) as client:
                page = await client.get("/" + path)
                assert page.status_code == 200, page.text
                assert "Deciding as <strong>ada</strong>" in page.text
                form = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', page.text))
                pressed = await client.post(
                    f"/decide/{run}",
                    data={**form, "decision": "approve", "reason": "ok by mail"},
                )
                assert pressed.status_code == 303, pressed.text
                shown = await client.get("/" + path)
                assert "ada approved it at" in shown.text
            page_json = await _notifications_page(app)
        told = [t for t in page_json["recent"] if t["target"] == "person:ada"]
        assert len(told) == SEEDED_PAUSES and all(t["state"] == "sent" for t in told)


@pytest.mark.anyio
async def test_with_no_rule_every_approver_and_operator_is_told_and_no_viewer(
    where: Where,
) -> None:
    """No policy governs the pauses: each approver and operator with an address gets
    their own links to every one of them; a viewer, who decides nothing, gets nothing."""
    with Receiver() as receiver:
        port = receiver.port
        with users_of(where) as users:
            add(users, "ada", "approver", f"json://127.0.0.1:{port}/ada")
            add(users, "olga", "operator", f"json://127.0.0.1:{port}/olga")
            add(users, "vic", "viewer", f"json://127.0.0.1:{port}/vic")
        settings = where.settings(Notifications(**QUICK_RETRIES), sign_in=sign_in_settings())
        async with running(create_app(settings)):
            await until(receiver, lambda r: {x.path for x in r} >= {"/ada", "/olga"})
            await anyio.sleep(1.0)  # a few polls and a sweep more: nothing else comes
        assert receiver.requests("/vic") == []
        for name in ("ada", "olga"):
            [message] = [r.json()["message"] for r in receiver.requests(f"/{name}")]
            links = links_in(message)
            assert set(links) == set(where.seed.ids("paused")), message
        # Each link is its person's own: no two alike.
        every = [u for r in receiver.requests() for u in links_in(r.json()["message"]).values()]
        assert len(every) == len(set(every)) == 2 * SEEDED_PAUSES


@pytest.mark.anyio
async def test_someone_given_an_address_while_the_server_runs_is_told_of_what_waits(
    where: Where,
) -> None:
    """A server with no target of its own starts announcing once someone has an
    address, and tells them of the pauses already waiting."""
    with Receiver() as receiver:
        with users_of(where) as users:
            add(users, "ada", "approver")
        settings = where.settings(Notifications(**QUICK_RETRIES), sign_in=sign_in_settings())
        app = create_app(settings)
        async with running(app) as state:
            assert state.watcher is None
            with users_of(where) as users:
                users.set_address("ada", f"json://127.0.0.1:{receiver.port}/ada")
            await until(receiver, lambda r: len(r) >= 1)
            assert state.watcher is not None
        message = receiver.requests("/ada")[0].json()["message"]
        assert set(links_in(message)) == set(where.seed.ids("paused"))


@pytest.mark.anyio
async def test_links_point_at_the_public_url_or_under_the_root_path(where: Where) -> None:
    with Receiver() as receiver:
        with users_of(where) as users:
            add(users, "ada", "approver", f"json://127.0.0.1:{receiver.port}/ada")
        notifications = Notifications(public_url="https://desk.example/ops", **QUICK_RETRIES)
        settings = where.settings(notifications, sign_in=sign_in_settings())
        async with running(create_app(settings)):
            await until(receiver, lambda r: len(r) >= 1)
        message = receiver.requests("/ada")[0].json()["message"]
        for url in links_in(message).values():
            assert url.startswith("https://desk.example/ops/decide/"), url
    # Behind a proxy that strips --root-path, without --public-url: the server's own
    # address under the prefix.
    with Receiver() as receiver:
        # Someone else: ada was told of these pauses already, once.
        with users_of(where) as users:
            add(users, "bob", "approver", f"json://127.0.0.1:{receiver.port}/bob")
        settings = where.settings(
            Notifications(**QUICK_RETRIES), sign_in=sign_in_settings(), root_path="/ops"
        )
        async with running(create_app(settings)):
            await until(receiver, lambda r: len(r) >= 1)
        message = receiver.requests("/bob")[0].json()["message"]
        for url in links_in(message).values():
            assert url.startswith("http://localui.localhost:8765/ops/decide/"), url


@pytest.mark.anyio
async def test_a_link_behind_a_proxy_under_a_root_path_opens_and_decides(where: Where) -> None:
    """The whole way a link goes behind a proxy: the message names the public address,
    the proxy takes ``/ops`` off and the server is told it (``--root-path``, as uvicorn
    sets the scope: the full path, the root path beside it); the page's form posts under
    the prefix, from the public origin, and the decision answers with the page again
    under the prefix."""
    public = "https://desk.example/ops"
    with Receiver() as receiver, contextlib.ExitStack() as stack:
        with users_of(where) as users:
            add(users, "ada", "approver", f"json://127.0.0.1:{receiver.port}/ada")
        settings = where.settings(
            Notifications(public_url=public, **QUICK_RETRIES),
            sign_in=sign_in_settings(),
            root_path="/ops",
            allowed_hosts=("desk.example",),
        )
        app = create_app(settings, agents=acting_agents(where, stack))
        async with running(app):
            await until(receiver, lambda r: len(r) >= 1)
            links = links_in(receiver.requests("/ada")[0].json()["message"])
            run = where.seed.id("paused-1")
            assert links[run].startswith(public + "/decide/"), links[run]
            path = links[run].removeprefix("https://desk.example")
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(
                    app=app, root_path="/ops", client=("203.0.113.9", 40000)
                ),
                base_url="https://desk.example",
            ) as client:
                page = await client.get(path)
                assert page.status_code == 200, page.text
                assert f'action="/ops/decide/{run}"' in page.text, page.text
                assert 'href="/ops/static/' in page.text
                form = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', page.text))
                pressed = await client.post(
                    f"/ops/decide/{run}",
                    data={**form, "decision": "approve", "reason": "behind the proxy"},
                    headers={"Origin": "https://desk.example"},
                )
                assert pressed.status_code == 303, pressed.text
                assert pressed.headers["location"] == path
                shown = await client.get(path)
                assert "ada approved it at" in shown.text, shown.text
                assert 'id="decision-form"' not in shown.text


async def _notifications_page(app: Any) -> dict[str, Any]:
    from helpers import TEST_TOKEN

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 50000)),
        base_url="http://127.0.0.1:8765",
        headers={"Authorization": f"Bearer {TEST_TOKEN}", "Accept": "application/json"},
    ) as client:
        answer = await client.get("/notifications.json")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


@pytest.mark.anyio
async def test_an_escalation_tells_the_people_it_adds_with_links_that_decide(
    where: Where,
) -> None:
    """Past its rule's due a pause is escalated: the people ``escalate_to`` adds are told
    at their own address, and their own link decides it (the seeded pauses are long
    overdue, so they are escalated at once)."""
    with Receiver() as receiver, contextlib.ExitStack() as stack:
        port = receiver.port
        with users_of(where) as users:
            add(users, "ada", "approver", f"json://127.0.0.1:{port}/ada")
            users.add(
                "carl",
                "approver",
                token_hash("token-of-carl-0123456789abcdef"),
                ("managers",),
                f"json://127.0.0.1:{port}/carl",
            )
        policy = parse_policy(ADA_ONLY + 'due = "2s"\nescalate_to = ["group:managers"]\n')
        settings = where.settings(
            Notifications(**QUICK_RETRIES), sign_in=sign_in_settings(), policy=policy
        )
        app = create_app(settings, agents=acting_agents(where, stack))
        async with running(app):
            got = await until(
                receiver,
                lambda r: (
                    len(links_in(" ".join(x.json()["message"] for x in r if x.path == "/carl")))
                    >= SEEDED_PAUSES
                ),
            )
            told = " ".join(x.json()["message"] for x in got if x.path == "/carl")
            assert "waits past rule 'refunds'" in told and "You may decide it" in told
            links = links_in(told)
            assert set(links) == set(where.seed.ids("paused"))
            run = where.seed.id("paused-1")
            path = links[run].split("://", 1)[1].split("/", 1)[1]
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 50000)),
                base_url="http://127.0.0.1:8765",
            ) as client:
                page = await client.get("/" + path)
                assert "Deciding as <strong>carl</strong>" in page.text, page.text
                form = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', page.text))
                pressed = await client.post(
                    f"/decide/{run}", data={**form, "decision": "reject", "reason": "too late"}
                )
                assert pressed.status_code == 303, pressed.text
        # carl is not told of the pauses themselves: the rule names ada alone.
        assert all(
            "waits for a person" not in x.json()["message"] for x in receiver.requests("/carl")
        )


@pytest.mark.anyio
async def test_a_note_is_told_to_the_others_who_may_decide_not_its_author(where: Where) -> None:
    with Receiver() as receiver:
        port = receiver.port
        with users_of(where) as users:
            add(users, "ada", "approver", f"json://127.0.0.1:{port}/ada")
            add(users, "bob", "approver", f"json://127.0.0.1:{port}/bob")
        settings = where.settings(Notifications(**QUICK_RETRIES), sign_in=sign_in_settings())
        app = create_app(settings)
        run = where.seed.id("paused-1")
        async with running(app):
            await until(receiver, lambda r: {x.path for x in r} >= {"/ada", "/bob"})
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 50000)),
                base_url="http://127.0.0.1:8765",
                headers={"Authorization": "Bearer token-of-ada-0123456789abcdef", **JSON},
            ) as client:
                card = (await client.get(f"/approvals/{run}.json")).json()["pending"]
                wrote = await client.post(
                    f"/approvals/{run}/notes",
                    data={"checkpoint_id": card["checkpoint_id"], "text": "called the customer"},
                )
                assert wrote.status_code == 201, wrote.text

            def noted(r: list[Any]) -> bool:
                return any("left a note" in x.json()["message"] for x in r if x.path == "/bob")

            got = await until(receiver, noted)
            await anyio.sleep(1.0)  # a few polls more: ada is not told of her own note
        [to_bob] = [x for x in got if x.path == "/bob" and "left a note" in x.json()["message"]]
        message = to_bob.json()["message"]
        assert "ada left a note" in message and '"called the customer"' in message
        assert set(links_in(message)) == {run}
        told_ada = [x.json()["message"] for x in receiver.requests("/ada")]
        assert not any("left a note" in m for m in told_ada)
