"""People's names are compared by their normal form (NFKC, case folded) and their
confusables skeleton: ``localui users add`` refuses a name that looks like an existing
person's, ``localui users list --check`` lists the look-alikes already there, and a
two-person rule is never completed by two names that look alike (``Ada`` and ``ada``, a
fullwidth ``Ａda``, a Cyrillic ``Аda``). On SQLite and on PostgreSQL, with real pauses
the SDK wrote.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from helpers import JSON, run_cli
from test_approval_policy import TWO_FROM_FINANCE, Desk, approve, message, open_desk

from localui.backends.users import token_hash

__all__ = ["open_desk"]  # the fixture, used by name below

#: Names a reader takes for ``Ada``: its case, fullwidth letters, a Cyrillic A (U+0410).
LOOK_LIKE_ADA = ("ada", "ＡＤＡ", "Ａda", "\u0410da", " Ada ")


def test_names_are_one_persons_by_normal_form_and_skeleton() -> None:
    from localui import names

    for other in LOOK_LIKE_ADA:
        assert names.one_person("Ada", other), other
    for pair in (("paypal", "p\u0430yp\u0430l"), ("bob", "b0b"), ("ﬁona", "fiona")):
        assert names.one_person(*pair), pair
    for pair in (("Ada", "Adam"), ("Ada", "Ida"), ("alice", "bob"), ("王小明", "王小朋")):
        assert not names.one_person(*pair), pair
    assert names.look_alike_pairs(["Ada", "bob", "ada", "\u0410da"]) == [
        ("Ada", "ada"),
        ("Ada", "\u0410da"),
        ("ada", "\u0410da"),
    ]


def add(desk: Desk, name: str, *groups: str) -> dict[str, str]:
    """A person straight into the users table, as before the rule; their headers."""
    token = f"token-{token_hash(name)[:16]}-0123456789abcdef"
    desk.users.add(name, "approver", token_hash(token), groups)
    return {**JSON, "Authorization": f"Bearer {token}"}


def users_cli(desk: Desk, *args: str) -> subprocess.CompletedProcess[str]:
    # ``users`` takes the store and the app schema, not the SDK's schema.
    where = list(desk.export_args)
    if "--pg-schema" in where:
        at = where.index("--pg-schema")
        del where[at : at + 2]
    return run_cli("users", *args, *where)


def test_users_add_refuses_a_name_that_looks_like_someone_elses(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    added = users_cli(desk, "add", "Ada", "--role", "approver")
    assert added.returncode == 0, added.stderr
    for other in LOOK_LIKE_ADA[:-1]:
        refused = users_cli(desk, "add", other, "--role", "approver")
        assert refused.returncode != 0, other
        assert f"{other!r} looks like 'Ada', who is already a user" in refused.stderr
    assert users_cli(desk, "add", "Adam", "--role", "approver").returncode == 0
    assert sorted(u.name for u in desk.users.list_users()) == ["Ada", "Adam"]

    clean = users_cli(desk, "list", "--check")
    assert clean.returncode == 0 and "look alike" not in clean.stdout
    # Look-alikes added before the rule (straight into the table) are listed.
    add(desk, "\u0410da")
    found = users_cli(desk, "list", "--check")
    assert found.returncode == 1, found.stdout
    assert "'Ada' and 'Аda' look alike" in found.stdout


@pytest.mark.parametrize("other", LOOK_LIKE_ADA[:-1])
def test_two_names_that_look_alike_never_complete_a_two_person_rule(
    open_desk: Callable[..., Desk], other: str
) -> None:
    desk = open_desk(TWO_FROM_FINANCE)
    # Both in the table from before the rule: the vote must still count them once.
    first = add(desk, "Ada", "finance")
    second = add(desk, other, "finance")
    run = desk.ids("paused-1")
    items = desk.client.get("/approvals.json", headers=first).json()["approvals"]
    checkpoint_id = next(i for i in items if i["execution_id"] == run)["checkpoint_id"]
    assert approve(desk, run, checkpoint_id, first, amount=250).json()["status"] == "voted"

    again = approve(desk, run, checkpoint_id, second, amount=250)
    assert again.status_code == 409, again.text
    assert message(again).startswith("Ada already approved this pause at "), message(again)
    assert f"({other} looks like them)" in message(again)
    assert desk.votes(run) == ["Ada"] and desk.decisions(run) == [] and desk.run_ends(run) == []
