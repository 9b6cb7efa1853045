"""Delegation (``localui.delegation``): while ada is away, bob decides what she could.

The rules first, pure (who the delegate is, a chain, a circle, an until passed, who is
told of a pause); then on real pauses the SDK wrote, on SQLite and on PostgreSQL, with
sign-in on: away set with ``localui users away`` and from the person's own menu, bob
deciding a pause whose rule names only ``user:ada`` (recorded as "bob for ada", and the
tool told so in ``Resume.metadata``), refused before and after, a chain, a circle, and a
two-person rule counting ada and her delegate once.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from helpers import TEST_TOKEN, sign_in_settings
from test_approval_policy import Desk, approve, message, open_desk  # noqa: F401 - fixture
from test_auth_cli import users_cli
from test_cli import assert_one_line_error
from test_notify import QUICK_RETRIES, Where, acting_agents, running, until, where
from test_personal_announcements import add, links_in, users_of

from bench.receiver import Receiver
from localui import delegation
from localui.app import create_app
from localui.delegation import Decider, deciders, delegate_of
from localui.errors import BadRequest
from localui.names import same_voter
from localui.policy import parse_policy
from localui.records import User
from localui.settings import Notifications

__all__ = ["where"]  # the fixture, shared with the notification tests

NOW = datetime(2026, 12, 7, 1, 0, tzinfo=UTC)
LATER = (NOW + timedelta(days=1)).isoformat()
EARLIER = (NOW - timedelta(minutes=1)).isoformat()


def person(
    name: str,
    role: str = "approver",
    *groups: str,
    to: str = "",
    until: str = "",
    address: str = "",
) -> User:
    return User(
        name=name,
        role=role,
        token_sha256=f"hash-of-{name}",
        created_at=NOW.isoformat(),
        groups=groups,
        address=address or f"mailto://{name}@example.com",
        away_to=to,
        away_until=until,
    )


def rule_of(text: str) -> Any:
    return parse_policy(text).rules[0]


ONLY_ADA_RULE = rule_of('[[rule]]\nname = "ada"\napprovers = ["user:ada"]\n')

# --- the rules, pure ------------------------------------------------------------------


def test_the_delegate_is_whom_the_person_names_until_their_until_passes() -> None:
    people = [person("ada", to="bob", until=LATER), person("bob")]
    assert delegate_of("ada", people, NOW) == people[1]
    assert delegate_of("bob", people, NOW) is None  # not away
    # An until passed is no away; nor is one nobody can read; none at all lasts.
    assert delegate_of("ada", [person("ada", to="bob", until=EARLIER), people[1]], NOW) is None
    assert delegate_of("ada", [person("ada", to="bob", until="soon"), people[1]], NOW) is None
    assert delegate_of("ada", [person("ada", to="bob"), people[1]], NOW) == people[1]
    # Only someone who exists and may decide: else the person is taken as not away.
    assert delegate_of("ada", [person("ada", to="gone")], NOW) is None
    assert delegate_of("ada", [person("ada", to="vic"), person("vic", "viewer")], NOW) is None


def test_a_chain_is_followed_three_steps_and_never_back_to_anyone_on_it() -> None:
    chain = [
        person("ada", to="bob"),
        person("bob", to="carl"),
        person("carl", to="dan"),
        person("dan", to="eve"),
        person("eve"),
    ]
    found = delegate_of("ada", chain, NOW)
    assert found is not None and found.name == "dan"  # three steps, then it stops
    found = delegate_of("bob", chain, NOW)
    assert found is not None and found.name == "eve"
    # A circle (ada to bob to ada) stops at the last good delegate: nothing loops.
    circle = [person("ada", to="bob"), person("bob", to="ada")]
    assert [delegate_of(n, circle, NOW).name for n in ("ada", "bob")] == ["bob", "ada"]  # type: ignore[union-attr]
    longer = [person("ada", to="bob"), person("bob", to="carl"), person("carl", to="bob")]
    assert delegate_of("ada", longer, NOW).name == "carl"  # type: ignore[union-attr]
    # A viewer on the way stops it before them.
    stopped = [person("ada", to="bob"), person("bob", to="vic"), person("vic", "viewer")]
    assert delegate_of("ada", stopped, NOW).name == "bob"  # type: ignore[union-attr]


def test_an_away_that_would_make_a_circle_is_refused_when_set() -> None:
    people = [
        person("ada"),
        person("bob", to="carl"),
        person("carl", to="ada"),
        person("vic", "viewer"),
    ]
    assert "circle" in (delegation.away_problem("ada", "bob", people, NOW) or "")
    assert "circle" in (delegation.away_problem("ada", "carl", people, NOW) or "")
    assert "themselves" in (delegation.away_problem("ada", "ada", people, NOW) or "")
    assert "viewer" in (delegation.away_problem("ada", "vic", people, NOW) or "")
    assert "no user 'zed'" in (delegation.away_problem("ada", "zed", people, NOW) or "")
    assert "no user 'zed'" in (delegation.away_problem("zed", "ada", people, NOW) or "")
    assert delegation.away_problem("carl", "bob", [person("carl"), person("bob")], NOW) is None


def test_until_takes_a_length_or_an_iso_time_and_refuses_the_rest() -> None:
    assert delegation.until_of("", NOW) == ""
    assert delegation.until_of("3d", NOW) == (NOW + timedelta(days=3)).isoformat()
    assert delegation.until_of("12h", NOW) == (NOW + timedelta(hours=12)).isoformat()
    assert delegation.until_of("2026-12-24", NOW) == "2026-12-24T00:00:00+00:00"
    assert delegation.until_of("2026-12-24T18:00+01:00", NOW) == "2026-12-24T17:00:00+00:00"
    for bad, why in (
        ("tomorrow", "not a time"),
        ("2026-12-01", "passed"),
        ("0d", "above zero"),
        ("999w", "at most"),
        ("3²d", "not a time"),
        ("0001-01-01T00:00:00+14:00", "not a time"),
        ("9999-12-31T23:59:59-14:00", "not a time"),
    ):
        with pytest.raises(BadRequest, match=why):
            delegation.until_of(bad, NOW)


def test_deciders_are_the_rules_approvers_with_the_away_replaced_each_once() -> None:
    people = [
        person("ada", "approver", to="bob", until=LATER),
        person("bob", "approver"),
        person("cyd", "operator", "finance"),
        person("dan", "approver", "finance", to="bob"),
        person("vic", "viewer", "finance"),
        person("eve", "approver", to="gone", address="json://host/eve"),
    ]
    # No rule: every approver and operator, the away replaced by their delegate, and
    # bob, a decider in his own right, listed once as himself.
    assert deciders(None, people, NOW) == (
        Decider("bob", "mailto://bob@example.com"),
        Decider("cyd", "mailto://cyd@example.com"),
        Decider("eve", "json://host/eve"),  # her delegate is gone: she is told herself
    )
    # A rule naming ada only: her delegate, for her.
    assert deciders(ONLY_ADA_RULE, people, NOW) == (
        Decider("bob", "mailto://bob@example.com", "ada"),
    )
    # Finance: cyd; dan's delegate bob for dan; never the viewer.
    finance = rule_of('[[rule]]\nname = "f"\napprovers = ["group:finance"]\n')
    assert deciders(finance, people, NOW) == (
        Decider("cyd", "mailto://cyd@example.com"),
        Decider("bob", "mailto://bob@example.com", "dan"),
    )
    # Once ada's until has passed she is told herself.
    later = NOW + timedelta(days=2)
    assert deciders(ONLY_ADA_RULE, people, later) == (Decider("ada", "mailto://ada@example.com"),)
    # A chain: ada to bob to carl, bob away too: carl is told, for ada.
    chain = [person("ada", to="bob"), person("bob", to="carl"), person("carl")]
    assert deciders(ONLY_ADA_RULE, chain, NOW) == (
        Decider("carl", "mailto://carl@example.com", "ada"),
    )


def test_a_delegates_standing_is_what_the_away_person_could_do() -> None:
    people = [
        person("ada", "approver", "finance", to="bob"),
        person("bob"),
        person("vic", "viewer"),
    ]
    finance = rule_of('[[rule]]\nname = "f"\napprovers = ["group:finance"]\n')
    standing = delegation.standing(finance, "bob", "approver", (), people, NOW)
    assert (standing.own, standing.for_names, standing.may) == (False, ("ada",), True)
    assert delegation.standing(finance, "vic", "viewer", (), people, NOW).may is False
    # Not away: bob may not.
    back = [person("ada", "approver", "finance"), person("bob")]
    assert delegation.standing(finance, "bob", "approver", (), back, NOW).may is False
    # In his own right he decides as himself.
    own = delegation.standing(finance, "bob", "approver", ("finance",), people, NOW)
    assert (own.own, own.for_names) == (True, ())


def test_bob_for_ada_is_one_voter_with_ada_and_with_bob() -> None:
    assert same_voter("bob for ada", "ada") and same_voter("bob for ada", "bob")
    assert same_voter("bob for ada", "bob for carl") and same_voter("carl for ada", "bob for ada")
    assert same_voter("Ａda", "bob for ada")  # look-alikes too
    assert not same_voter("bob for ada", "cyd")
    assert not same_voter("bob", "cyd")


# --- on real pauses, both backends ---------------------------------------------------

ONLY_ADA = """
[[rule]]
name = "ada decides refunds"
agent = "refund-*"
tool = "refund"
approvers = ["user:ada"]
"""

TWO_OF_ADA_CARL_FINANCE = """
[[rule]]
name = "two for refunds"
agent = "refund-*"
tool = "refund"
approvers = ["user:ada", "user:carl", "group:finance"]
approvals = 2
"""


def checkpoint_of(desk: Desk, run: str, headers: dict[str, str]) -> str:
    items = desk.client.get("/approvals.json", headers=headers).json()["approvals"]
    return str(next(i for i in items if i["execution_id"] == run)["checkpoint_id"])


def mine(desk: Desk, headers: dict[str, str]) -> list[dict[str, Any]]:
    answer = desk.client.get("/approvals.json?mine=1", headers=headers)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["approvals"])


def within_two_seconds(check: Callable[[], bool]) -> None:
    """``check`` comes true within the users table's two-second cache (and a margin)."""
    deadline = time.monotonic() + 3.5
    while not check():
        assert time.monotonic() < deadline, "not seen within the users cache's 2 s"
        time.sleep(0.1)


def away(desk: Desk, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``localui users away ARGS`` on the desk's store, through the real command line."""
    return users_cli(desk.export_args, "away", *args, cwd=cwd)


def test_bob_decides_for_ada_while_she_is_away_and_not_before_or_after(
    open_desk: Callable[..., Desk],  # noqa: F811
    tmp_path: Path,
) -> None:
    desk = open_desk(ONLY_ADA)
    ada = desk.add("ada")
    bob = desk.add("bob")
    run, other = desk.ids("paused-1"), desk.ids("paused-2")
    checkpoint = checkpoint_of(desk, run, ada)

    before = approve(desk, run, checkpoint, bob)
    assert before.status_code == 403, before.text
    assert "only ada may decide" in message(before)
    assert mine(desk, bob) == []

    done = away(desk, tmp_path, "ada", "--to", "bob", "--until", "3d")
    assert done.returncode == 0, done.stderr
    assert re.match(r"localui: ada is away until \S+: bob decides for them", done.stdout)
    within_two_seconds(lambda: any(i["execution_id"] == run for i in mine(desk, bob)))
    card = next(i for i in mine(desk, bob) if i["execution_id"] == run)
    assert card["rule"]["may_decide"] is True and card["rule"]["deciding_for"] == ["ada"]
    page = desk.client.get(f"/approvals/{run}", headers={"Authorization": bob["Authorization"]})
    assert 'Deciding as <strong>bob</strong> <span class="for">for ada, who is away</span>' in (
        page.text
    )

    decided = approve(desk, run, checkpoint, bob)
    assert decided.status_code == 200, decided.text
    outcome = decided.json()
    # The tool was told in Resume.metadata: its answer names who approved, as recorded.
    assert outcome["output"] == "Done: refunded 250.00 on A-1002, approved by bob for ada."
    assert outcome["decision"]["approver"] == "bob for ada"
    [decision] = desk.decisions(run)
    assert decision["actor"] == "bob for ada"
    assert decision["metadata"] == {
        "approver": "bob for ada",
        "approvers": ["bob for ada"],
        "reason": "checked the order",
        "delegate": "bob",
        "for": "ada",
    }
    assert desk.run_ends(run) == ["completed"]

    back = users_cli(desk.export_args, "back", "ada", cwd=tmp_path)
    assert back.returncode == 0, back.stderr
    other_checkpoint = checkpoint_of(desk, other, ada)
    within_two_seconds(lambda: mine(desk, bob) == [])
    after = approve(desk, other, other_checkpoint, bob)
    assert after.status_code == 403, after.text

    # An until that has passed ends the away as "back" does (written directly: the
    # command line refuses an until in the past).
    desk.users.set_away("ada", "bob", (datetime.now(UTC) - timedelta(seconds=1)).isoformat())
    time.sleep(2.1)  # past the users cache: what the table says now is what counts
    assert mine(desk, bob) == []
    assert approve(desk, other, other_checkpoint, bob).status_code == 403
    assert desk.decisions(other) == []
    listed = users_cli(desk.export_args, "list", cwd=tmp_path).stdout
    assert "\tnot away (was away to bob until " in listed


def test_a_chain_decides_as_its_last_delegate_and_a_circle_is_refused(
    open_desk: Callable[..., Desk],  # noqa: F811
    tmp_path: Path,
) -> None:
    desk = open_desk(ONLY_ADA)
    ada = desk.add("ada")
    bob = desk.add("bob")
    carl = desk.add("carl")
    desk.add("vic", "viewer")
    run = desk.ids("paused-1")
    checkpoint = checkpoint_of(desk, run, ada)

    assert away(desk, tmp_path, "ada", "--to", "bob").returncode == 0
    assert away(desk, tmp_path, "bob", "--to", "carl", "--until", "5d").returncode == 0
    # Back to ada would be a circle; to oneself, to a viewer, to nobody: refused, one line.
    assert_one_line_error(away(desk, tmp_path, "carl", "--to", "ada"), "circle")
    assert_one_line_error(away(desk, tmp_path, "carl", "--to", "carl"), "themselves")
    assert_one_line_error(
        away(desk, tmp_path, "carl", "--to", "vic"), "only an approver or operator"
    )
    assert_one_line_error(away(desk, tmp_path, "carl", "--to", "nobody"), "no user 'nobody'")
    assert_one_line_error(
        away(desk, tmp_path, "carl", "--to", "bob", "--until", "someday"), "not a time"
    )
    listed = users_cli(desk.export_args, "list", cwd=tmp_path).stdout
    assert "\taway to bob until they are back\t" in listed
    assert "carl\tapprover\tgroups -\ttold at -\tnot away\t" in listed

    within_two_seconds(lambda: any(i["execution_id"] == run for i in mine(desk, carl)))
    # bob passed ada's pauses on: only the end of the chain decides them.
    assert approve(desk, run, checkpoint, bob).status_code == 403
    decided = approve(desk, run, checkpoint, carl)
    assert decided.status_code == 200, decided.text
    assert decided.json()["output"] == "Done: refunded 250.00 on A-1002, approved by carl for ada."
    assert [d["actor"] for d in desk.decisions(run)] == ["carl for ada"]


def test_a_circle_made_by_two_servers_at_once_never_loops(
    open_desk: Callable[..., Desk],  # noqa: F811
) -> None:
    """Two aways set at once (each checked before the other was written) can make a
    circle; the chain then stops before it comes back, and a decision is answered."""
    desk = open_desk(ONLY_ADA)
    ada = desk.add("ada")
    bob = desk.add("bob")
    desk.users.set_away("ada", "bob", "")
    desk.users.set_away("bob", "ada", "")
    run = desk.ids("paused-1")
    decided = approve(desk, run, checkpoint_of(desk, run, ada), bob)
    assert decided.status_code == 200, decided.text
    assert decided.json()["decision"]["approver"] == "bob for ada"


def test_under_a_two_person_rule_ada_and_her_delegate_count_once(
    open_desk: Callable[..., Desk],  # noqa: F811
) -> None:
    desk = open_desk(TWO_OF_ADA_CARL_FINANCE)
    ada = desk.add("ada")
    bob = desk.add("bob")
    desk.add("carl")
    cyd = desk.add("cyd", "approver", "finance")
    run = desk.ids("paused-1")
    checkpoint = checkpoint_of(desk, run, ada)
    desk.users.set_away("ada", "bob", "")
    desk.users.set_away("carl", "bob", "")

    # ada, though away, may still decide herself; her delegate then adds nothing.
    assert approve(desk, run, checkpoint, ada).json()["status"] == "voted"
    second = approve(desk, run, checkpoint, bob)
    # bob stands in for ada and carl: ada has voted, so he votes for carl.
    assert second.status_code == 200, second.text
    assert second.json()["status"] == "completed"
    assert second.json()["decision"]["approver"] == "bob for carl"
    [decision] = desk.decisions(run)
    assert decision["metadata"]["approvers"] == ["ada", "bob for carl"]
    assert decision["metadata"]["delegate"] == "bob" and decision["metadata"]["for"] == "carl"

    # On another pause: bob for ada first; then neither ada nor bob again counts.
    other = desk.ids("paused-2")
    other_checkpoint = checkpoint_of(desk, other, ada)
    desk.users.set_away("carl", "", "")
    time.sleep(2.1)  # past the users cache
    first = approve(desk, other, other_checkpoint, bob)
    assert first.json()["status"] == "voted" and first.json()["approvers"] == ["bob for ada"]
    for again in (ada, bob):
        twice = approve(desk, other, other_checkpoint, again)
        assert twice.status_code == 409, twice.text
        assert "bob for ada already approved this pause" in message(twice)
    assert desk.votes(other) == ["bob for ada"]
    completed = approve(desk, other, other_checkpoint, cyd)
    assert completed.json()["status"] == "completed"
    assert completed.json()["output"] == (
        "Done: refunded 900.00 on A-1003, approved by bob for ada, cyd."
    )


def test_i_am_away_from_my_own_menu(
    open_desk: Callable[..., Desk],  # noqa: F811
) -> None:
    desk = open_desk(ONLY_ADA)
    ada = desk.add("ada")
    bob = desk.add("bob")
    desk.add("vic", "viewer")
    vic = {"Authorization": "Bearer token-of-vic-0123456789abcdef"}
    page_as_ada = {"Authorization": ada["Authorization"]}

    menu = desk.client.get("/approvals", headers=page_as_ada).text
    assert "I am away…" in menu and 'name="to"' in menu and ">I am back</button>" not in menu
    # The start-up token's owner is nobody of the users table to be away.
    owner = {"Authorization": f"Bearer {TEST_TOKEN}"}
    assert "I am away…" not in desk.client.get("/approvals", headers=owner).text

    # Another site's form is refused before anything is read.
    cross = desk.client.post(
        "/me/away",
        data={"to": "bob"},
        headers={**page_as_ada, "Sec-Fetch-Site": "cross-site"},
    )
    assert cross.status_code == 403
    # Bad input: a clear 400, nothing changed.
    for data, why in (
        ({"to": "ada"}, "themselves"),
        ({"to": "vic"}, "only an approver or operator"),
        ({"to": "bob", "until": "whenever"}, "not a time"),
        ({"to": ""}, "say who decides"),
    ):
        bad = desk.client.post("/me/away", data=data, headers=ada)
        assert bad.status_code == 400, bad.text
        assert why in message(bad)
    assert desk.users.by_name("ada").away_to == ""
    # A viewer changes nothing.
    assert desk.client.post("/me/away", data={"to": "bob"}, headers=vic).status_code == 403

    went = desk.client.post("/me/away", data={"to": "bob", "until": "2d"}, headers=ada)
    assert went.status_code == 200, went.text
    assert went.json()["name"] == "ada" and went.json()["away_to"] == "bob"
    # Only one's own: the form names no one but the delegate.
    assert desk.users.by_name("bob").away_to == ""
    menu = desk.client.get("/approvals", headers=page_as_ada).text
    assert re.search(r"Away until \d{4}-\d\d-\d\d \d\d:\d\d UTC: bob decides for you\.", menu)
    assert ">I am back</button>" in menu
    # bob decides ada's pause, as bob for ada.
    run = desk.ids("paused-1")
    decided = approve(desk, run, checkpoint_of(desk, run, ada), bob)
    assert decided.status_code == 200, decided.text
    assert decided.json()["decision"]["approver"] == "bob for ada"

    # A browser's form comes back to the page it was sent from.
    back = desk.client.post(
        "/me/back",
        data={"next": "/approvals?order=newest"},
        headers=page_as_ada,
        follow_redirects=False,
    )
    assert back.status_code == 303 and back.headers["location"] == "/approvals?order=newest"
    assert desk.users.by_name("ada").away_to == ""
    assert "I am away…" in desk.client.get("/approvals", headers=page_as_ada).text

    read_only = desk.client_with(read_only=True)  # type: ignore[misc]
    refused = read_only.post("/me/away", data={"to": "bob"}, headers=ada)
    assert refused.status_code == 403, refused.text
    assert "read-only" in message(refused)
    assert desk.users.by_name("ada").away_to == ""
    assert "I am away…" not in read_only.get("/approvals", headers=page_as_ada).text


def test_the_away_column_reaches_a_running_server_within_two_seconds(
    open_desk: Callable[..., Desk],  # noqa: F811
) -> None:
    desk = open_desk(ONLY_ADA)
    desk.add("ada")
    bob = desk.add("bob")
    assert mine(desk, bob) == []  # read now, and cached
    desk.users.set_away("ada", "bob", "")
    within_two_seconds(lambda: len(mine(desk, bob)) > 0)


# --- announcements: while ada is away, bob is told, and his own link decides for her ---


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_an_away_persons_pauses_are_announced_to_the_delegate_whose_link_decides(
    where: Where,
) -> None:
    with Receiver() as receiver, contextlib.ExitStack() as stack:
        port = receiver.port
        with users_of(where) as users:
            add(users, "ada", "approver", f"json://127.0.0.1:{port}/ada")
            add(users, "bob", "approver", f"json://127.0.0.1:{port}/bob")
            users.set_away("ada", "bob", "")
        settings = where.settings(
            Notifications(**QUICK_RETRIES),
            sign_in=sign_in_settings(),
            policy=parse_policy(ONLY_ADA),
        )
        app = create_app(settings, agents=acting_agents(where, stack))
        async with running(app):
            await until(receiver, lambda r: any(x.path == "/bob" for x in r))
            await anyio.sleep(1.0)  # a few polls more: ada, who is away, is told nothing
            assert receiver.requests("/ada") == []
            [to_bob] = receiver.requests("/bob")
            said = to_bob.json()["message"]
            # bob is told whom he decides it for, and his page says so beside his name.
            assert "You may decide it for ada, who is away, at your own link" in said, said
            links = links_in(said)
            run = where.seed.id("paused-1")
            path = links[run].split("://", 1)[1].split("/", 1)[1]
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 50000)),
                base_url="http://127.0.0.1:8765",
            ) as client:
                page = await client.get("/" + path)
                assert page.status_code == 200, page.text
                assert re.search(
                    r'Deciding as <strong>bob</strong> <span class="for">for ada, who is away',
                    page.text,
                ), page.text
                form = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', page.text))
                pressed = await client.post(
                    f"/decide/{run}", data={**form, "decision": "approve", "reason": "for ada"}
                )
                assert pressed.status_code == 303, pressed.text
                shown = await client.get("/" + path)
                assert "bob for ada approved it at" in shown.text, shown.text
