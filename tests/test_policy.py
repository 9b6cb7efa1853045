"""The approval policy's pure rules (``localui.policy``): reading a file, matching a pause,
who may decide, and the typed fields; and every bad file refused in one line, exit 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import LOCALUI

from localui.cli import main
from localui.errors import BadRequest
from localui.policy import ContextPath, PolicyError, load_policy, parse_policy

POLICY = """
[[rule]]
name = "large refunds"
reason = "manager_*"
agent = "refund-*"
tool = "ref?nd"
approvers = ["group:finance", "user:ada"]
approvals = 2
reason_required = "always"
notify = ["mailto://finance@example.com"]

[[rule.field]]
name = "amount"
type = "number"
label = "Amount to refund"
default = "context.amount"
min = 1
max = "context.amount"
required = true

[[rule.field]]
name = "ticket"
type = "text"

[[rule.field]]
name = "tries"
type = "integer"
default = 1
max = 3

[[rule.field]]
name = "channel"
type = "choice"
choices = ["card", "bank"]
default = "card"

[[rule.field]]
name = "tell_customer"
type = "boolean"

[[rule]]
name = "operators decide chains"
agent = "nightly-*"
approvers = ["role:operator"]
"""


def test_a_policy_file_is_read_with_its_rules_fields_and_bounds(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    policy = load_policy(path)
    assert [r.name for r in policy.rules] == ["large refunds", "operators decide chains"]
    rule = policy.rules[0]
    assert rule.approvals == 2 and rule.reason_required == "always"
    assert rule.approvers == ("group:finance", "user:ada")
    assert [f.name for f in rule.fields] == [
        "amount",
        "ticket",
        "tries",
        "channel",
        "tell_customer",
    ]
    amount = rule.fields[0]
    assert amount.label == "Amount to refund" and amount.required
    assert amount.default == ContextPath("context.amount", ("amount",))
    assert amount.min == 1.0 and amount.max == ContextPath("context.amount", ("amount",))
    assert rule.fields[1].label == "ticket"  # the label defaults to the name
    assert rule.notify == ("mailto://finance@example.com",)
    assert policy.notify_urls == ("mailto://finance@example.com",)


def test_rules_match_in_order_by_agent_reason_and_tool_globs() -> None:
    policy = parse_policy(POLICY)
    pause = {"owner": "refund-bot", "agent": "refund-bot", "reason": "manager_approval"}
    assert policy.match(**pause, tool="refund").name == "large refunds"  # type: ignore[union-attr]
    # The glob is case-sensitive, as names in the store are.
    assert policy.match(**{**pause, "reason": "Manager_approval"}, tool="refund") is None
    assert policy.match(**pause, tool="notify_customer") is None
    # ``agent`` matches the run's owner or the agent that paused (a team's member).
    member = {"owner": "nightly-chain", "agent": "checker", "reason": "review", "tool": ""}
    assert policy.match(**member).name == "operators decide chains"  # type: ignore[union-attr]
    team = {"owner": "desk", "agent": "refund-worker", "reason": "manager_approval"}
    assert policy.match(**team, tool="refund").name == "large refunds"  # type: ignore[union-attr]
    # The first match wins, even when a later rule matches too.
    both = parse_policy('[[rule]]\nname = "a"\n[[rule]]\nname = "b"\n')
    assert both.match(owner="x", agent="x", reason="y", tool="z").name == "a"  # type: ignore[union-attr]


def test_who_may_decide_by_group_user_and_role() -> None:
    large, operators = parse_policy(POLICY).rules
    assert large.allows("bob", "approver", ("finance",))
    assert large.allows("ada", "approver", ())
    assert not large.allows("carol", "operator", ("sales",))  # an operator is not implied
    assert operators.allows("dan", "operator", ())
    assert not operators.allows("erin", "approver", ("finance",))
    assert large.who == "finance or ada" and operators.who == "operators"
    anyone = parse_policy('[[rule]]\nname = "fields only"\n').rules[0]
    assert anyone.allows("zoe", "approver", ()) and anyone.who == "any approver"


def test_fields_are_typed_checked_against_the_context_and_say_which_is_wrong() -> None:
    rule = parse_policy(POLICY).rules[0]
    context = {"amount": 250.0}
    values = rule.check_fields(
        {
            "amount": "120",
            "ticket": " T-9 ",
            "tries": "2",
            "channel": "bank",
            "tell_customer": "on",
        },
        context,
    )
    assert values == {
        "amount": 120.0,
        "ticket": "T-9",
        "tries": 2,
        "channel": "bank",
        "tell_customer": True,
    }
    assert isinstance(values["amount"], float) and isinstance(values["tries"], int)
    # Left out: defaults (read from the context or literal); an unticked box is false.
    assert rule.check_fields({"amount": 99}, context) == {
        "amount": 99.0,
        "ticket": None,
        "tries": 1,
        "channel": "card",
        "tell_customer": False,
    }
    problems = {
        "field 'amount' (Amount to refund) is required": {},
        "field 'amount': 251.0 is above the maximum 250": {"amount": "251"},
        "field 'amount': 0.5 is below the minimum 1": {"amount": "0.5"},
        "field 'amount': 'lots' is not a number": {"amount": "lots"},
        "field 'amount': the value must be a finite number": {"amount": float("nan")},
        "field 'tries': '2.5' is not a whole number": {"amount": "5", "tries": "2.5"},
        "field 'tries': 4 is above the maximum 3": {"amount": "5", "tries": 4},
        "field 'tries': the value must be a whole number": {"amount": "5", "tries": True},
        "field 'channel': 'cash' is not one of card, bank": {"amount": "5", "channel": "cash"},
        "field 'tell_customer': the value must be true or false": {
            "amount": "5",
            "tell_customer": "maybe",
        },
        "rule 'large refunds' has no field 'amuont' (its fields: amount, ticket, tries,"
        " channel, tell_customer)": {"amount": "5", "amuont": "5"},
    }
    for message, sent in problems.items():
        with pytest.raises(BadRequest) as caught:
            rule.check_fields(sent, context)
        assert str(caught.value) == message
    # A bound read from a context that does not hold it refuses rather than guesses.
    with pytest.raises(BadRequest, match="its max comes from context.amount, which this"):
        rule.check_fields({"amount": "5"}, {"order": "A-1"})


#: Every way a policy file can be wrong, and the one line that says so.
BAD_POLICIES = {
    "x = [": "policy.toml: not valid TOML: ",
    'title = "x"': "policy.toml: unknown top-level key 'title': a policy is a list of [[rule]]",
    'rule = "x"': "policy.toml: 'rule' must be written as [[rule]] tables",
    '[[rule]]\nagent = "a"': "policy.toml: rule 1: key 'name' is required (a non-empty string)",
    '[[rule]]\nname = ""': "policy.toml: rule 1: key 'name' must be a non-empty string, not ''",
    '[[rule]]\nname = "a"\n[[rule]]\nname = "a"': "policy.toml: rule 2: key 'name': 'a' is"
    " already the name of another rule",
    '[[rule]]\nname = "a"\nwho = 1': "policy.toml: rule 'a': unknown key 'who' (allowed: name,"
    " agent, reason, tool, approvers, approvals, reason_required, field, notify, due,"
    " remind_every, escalate_to, on_timeout, timeout_after, timeout_reason,"
    " allow_timeout_approve)",
    '[[rule]]\nname = "a"\nagent = 3': "policy.toml: rule 'a': key 'agent' must be a non-empty"
    " string, not 3",
    '[[rule]]\nname = "a"\napprovers = "group:x"': "policy.toml: rule 'a': key 'approvers' must"
    " be a list of non-empty strings",
    '[[rule]]\nname = "a"\napprovers = ["finance"]': "policy.toml: rule 'a': key 'approvers':"
    " 'finance' must be group:NAME, user:NAME or role:ROLE",
    '[[rule]]\nname = "a"\napprovers = ["team:x"]': "policy.toml: rule 'a': key 'approvers':"
    " 'team:x' must be group:NAME",
    '[[rule]]\nname = "a"\napprovers = ["role:viewer"]': "policy.toml: rule 'a': key"
    " 'approvers': 'role:viewer': the roles that decide are approver, operator",
    '[[rule]]\nname = "a"\napprovals = 0': "policy.toml: rule 'a': key 'approvals' must be a"
    " whole number of at least 1, not 0",
    '[[rule]]\nname = "a"\napprovals = "2"': "policy.toml: rule 'a': key 'approvals' must be a"
    " whole number of at least 1, not '2'",
    '[[rule]]\nname = "a"\napprovals = true': "policy.toml: rule 'a': key 'approvals' must be",
    '[[rule]]\nname = "a"\napprovers = ["user:ada"]\napprovals = 2': "policy.toml: rule 'a':"
    " key 'approvals' is 2, but 'approvers' names only 1 people: no pause could ever be approved",
    '[[rule]]\nname = "a"\nreason_required = "never"': "policy.toml: rule 'a': key"
    " 'reason_required' must be one of reject, always, not 'never'",
    '[[rule]]\nname = "a"\nnotify = "x"': "policy.toml: rule 'a': key 'notify' must be a list",
    '[[rule]]\nname = "a"\nfield = 1': "policy.toml: rule 'a': key 'field' must be written as"
    " [[rule.field]] tables",
    '[[rule]]\nname = "a"\n[[rule.field]]\ntype = "text"': "policy.toml: rule 'a': field 1:"
    " key 'name' is required",
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "date"': "policy.toml: rule 'a':"
    " field 'x': key 'type' must be one of text, number, integer, choice, boolean",
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"': "policy.toml: rule 'a': field 'x':"
    " key 'type' must be one of",
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "text"\nsize = 3': "policy.toml:"
    " rule 'a': field 'x': unknown key 'size' (allowed: name, type, label, default, min, max,"
    " required, choices)",
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "two words"\ntype = "text"': "policy.toml:"
    " rule 'a': field 'two words': key 'name' must be letters, digits and _",
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "approvers"\ntype = "text"': "policy.toml:"
    " rule 'a': field 'approvers': key 'name': 'approvers' is what localui itself sends",
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "text"\n[[rule.field]]\n'
    'name = "x"\ntype = "text"': "policy.toml: rule 'a': field 'x' is defined twice",
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "text"\nrequired = "yes"': (
        "policy.toml: rule 'a': field 'x': key 'required' must be true or false"
    ),
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "boolean"\nrequired = true': (
        "policy.toml: rule 'a': field 'x': key 'required' does not apply to a boolean"
    ),
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "choice"': "policy.toml: rule"
    " 'a': field 'x': key 'choices' is required for a choice field",
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "text"\nchoices = ["a"]': (
        "policy.toml: rule 'a': field 'x': key 'choices' is only for a choice field"
    ),
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "text"\nmax = 3': "policy.toml:"
    " rule 'a': field 'x': key 'max' is only for a number or integer field",
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "number"\nmin = "one"': (
        "policy.toml: rule 'a': field 'x': key 'min' must be a number or a path like"
    ),
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "number"\nmin = 5\nmax = 1': (
        "policy.toml: rule 'a': field 'x': key 'min' (5) is above 'max' (1)"
    ),
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "number"\nmax = "context."': (
        "policy.toml: rule 'a': field 'x': key 'max': 'context.' is not a path like"
    ),
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "integer"\ndefault = 1.5': (
        "policy.toml: rule 'a': field 'x': key 'default' must be a value of type integer or a path"
    ),
    '[[rule]]\nname = "a"\n[[rule.field]]\nname = "x"\ntype = "choice"\nchoices = ["a"]\n'
    'default = "b"': "policy.toml: rule 'a': field 'x': key 'default' must be a value of type",
}


@pytest.mark.parametrize("text", list(BAD_POLICIES), ids=range(len(BAD_POLICIES)))
def test_every_bad_policy_is_one_line_naming_the_rule_and_key(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(BAD_POLICIES[text].replace("policy.toml", str(path)))
    # The server refuses to start with it: the same line, exit code 2, before the store
    # is even looked at (there is none here).
    store = tmp_path / "no-store.db"
    assert main(["serve", "--store", str(store), "--policy", str(path)]) == 2
    assert capsys.readouterr().err == f"localui: {message}\n"


def test_a_missing_or_unreadable_policy_file_is_one_line_exit_2(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"^policy file .*nope.toml cannot be read: No such"):
        load_policy(tmp_path / "nope.toml")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PolicyError, match="cannot be read"):
        load_policy(binary)
    # The installed command, as a person types it, for both commands that take a policy.
    for command in ("serve", "demo"):
        done = subprocess.run(
            [str(LOCALUI), command, "--policy", str(tmp_path / "nope.toml")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1
        assert "cannot be read: No such file or directory" in done.stderr
