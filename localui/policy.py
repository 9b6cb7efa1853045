"""Approval policies: who may decide which pause, how many people, what they tell the tool.

A policy file (``localui serve --policy policy.toml``) is a list of rules, read and
checked once at start. Each pause is matched against the rules in order: the run's
owner or the agent that paused (``agent``), the pause's reason (``reason``) and the
paused tool (``tool``), each a glob (``fnmatch.fnmatchcase``: case matters, as names
do in the store). The first rule that matches governs the pause; a pause no rule
matches is decided as it always was, by any approver, alone.

A rule says who may decide (``approvers``: ``group:NAME``, ``user:NAME``,
``role:ROLE``), how many different people must approve (``approvals``), whether a
reason is needed to approve too (``reason_required``), and the typed fields an
approver fills in (``[[rule.field]]``), which reach the tool in ``Resume.metadata``
(the SDK drops anything passed any other way), and where its pauses are announced
besides the server's own targets (``notify``: Apprise URLs).

A rule may give its pauses a deadline (``due``: "4h"): once a pause has waited that
long it is overdue, its reminders come every ``remind_every`` (instead of the server's
``--remind-after``), and the people of ``escalate_to`` may decide it too. With
``on_timeout`` the rule itself decides a pause nobody answered by ``timeout_after``
(``due`` unless given): ``"reject"`` with ``timeout_reason``, or ``"approve"`` only
where the rule also says ``allow_timeout_approve = true``; the fields then take their
defaults. Carrying that out is ``localui.deadlines``'s.

Everything here is pure: parsing, matching, who may decide and checking the fields.
The votes themselves live in each backend's decision log.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from localui import freetext, runs
from localui.errors import BadRequest
from localui.records import Pending
from localui.roles import ROLES

FIELD_TYPES = ("text", "number", "integer", "choice", "boolean")
REASON_REQUIRED = ("reject", "always")
#: What ``approvers`` entries start with.
WHO_KINDS = ("group", "user", "role")
#: Metadata keys localui writes itself; a field may not take one of these names
#: (``delegate`` and ``for``: a decision made for someone away, ``localui.delegation``).
RESERVED = ("approver", "approvers", "reason", "delegate", "for")
CONTEXT_PREFIX = "context."

RULE_KEYS = (
    "name",
    "agent",
    "reason",
    "tool",
    "approvers",
    "approvals",
    "reason_required",
    "field",
    "notify",
    "due",
    "remind_every",
    "escalate_to",
    "on_timeout",
    "timeout_after",
    "timeout_reason",
    "allow_timeout_approve",
)
#: What a rule may do with a pause nobody decided by its deadline.
ON_TIMEOUT = ("reject", "approve")
#: The units of a duration (``90s``, ``30m``, ``4h``, ``1d``), in seconds.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"([0-9]{1,7})([smhd])\Z")
#: The actor a timeout decision is recorded under: ``policy:NAME``.
POLICY_ACTOR = "policy:"
FIELD_KEYS = ("name", "type", "label", "default", "min", "max", "required", "choices")
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: The longest text an approver may type into a text field.
MAX_TEXT = 2000
_TRUE = ("true", "on", "1", "yes")
_FALSE = ("false", "off", "0", "no", "")

Value = str | int | float | bool


class PolicyError(ValueError):
    """A policy file that cannot be served: one line naming the rule, the key and
    what is allowed."""


@dataclass(frozen=True, slots=True)
class ContextPath:
    """``context.order.amount``: a value read from the pause's frozen context."""

    text: str
    parts: tuple[str, ...]

    def read(self, context: Any) -> Any:
        """The value at this path, or None when the context does not hold it."""
        value = context
        for part in self.parts:
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                return None
        return value


Source = Value | ContextPath


def _resolve(source: Source | None, context: Any) -> Any:
    return source.read(context) if isinstance(source, ContextPath) else source


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


@dataclass(frozen=True, slots=True)
class Field:
    """A typed input on the card, sent as ``field.<name>``."""

    name: str
    type: str
    label: str
    default: Source | None = None
    min: float | ContextPath | None = None
    max: float | ContextPath | None = None
    required: bool = False
    choices: tuple[str, ...] = ()

    def default_for(self, context: Any) -> Value | None:
        """The value the card fills in: the default, read from the context if a path,
        kept only when it is of the field's type."""
        value = _resolve(self.default, context)
        try:
            return self._typed(value, "the default") if value is not None else None
        except BadRequest:
            return None

    def bounds(self, context: Any) -> tuple[float | None, float | None]:
        """``min`` and ``max`` for this pause; a bound read from the context must be a
        number there, else the field cannot be checked and is refused."""
        found: list[float | None] = []
        for key, source in (("min", self.min), ("max", self.max)):
            value = _resolve(source, context)
            if isinstance(source, ContextPath) and not _is_number(value):
                raise BadRequest(
                    f"field {self.name!r}: its {key} comes from {source.text},"
                    " which this pause's context does not hold as a number"
                )
            found.append(float(value) if value is not None else None)
        return found[0], found[1]

    def _typed(self, value: Any, what: str) -> Value:
        """``value`` (form text or JSON) as this field's type; else a 400 saying why."""
        where = f"field {self.name!r}"
        if self.type in ("text", "choice"):
            if not isinstance(value, str):
                raise BadRequest(f"{where}: {what} must be text")
            text = freetext.check(where, value, limit=MAX_TEXT)
            if self.type == "choice" and text not in self.choices:
                raise BadRequest(f"{where}: {text!r} is not one of {', '.join(self.choices)}")
            return text
        if self.type == "boolean":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
                return value.strip().lower() in _TRUE
            raise BadRequest(f"{where}: {what} must be true or false")
        if isinstance(value, str):
            text = value.strip()
            try:
                value = int(text) if self.type == "integer" else float(text)
            except ValueError:
                kind = "a whole number" if self.type == "integer" else "a number"
                raise BadRequest(f"{where}: {text!r} is not {kind}") from None
        if self.type == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadRequest(f"{where}: {what} must be a whole number")
            return value
        if not _is_number(value):
            raise BadRequest(f"{where}: {what} must be a finite number")
        return float(value)

    def check(self, sent: Any, context: Any) -> Value | None:
        """The typed value of what an approver sent (None: nothing was sent)."""
        where = f"field {self.name!r}"
        if sent is None or (isinstance(sent, str) and not sent.strip()):
            if self.type == "boolean":
                return False  # an unticked box is not sent at all
            if self.required:
                raise BadRequest(f"{where} ({self.label}) is required")
            return self.default_for(context)
        value = self._typed(sent, "the value")
        if self.type in ("number", "integer"):
            low, high = self.bounds(context)
            assert not isinstance(value, str | bool)
            if low is not None and value < low:
                raise BadRequest(f"{where}: {value} is below the minimum {_number(low)}")
            if high is not None and value > high:
                raise BadRequest(f"{where}: {value} is above the maximum {_number(high)}")
        return value


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else str(value)


def _names(entries: Sequence[str], name: str, role: str, groups: Sequence[str]) -> bool:
    """Whether ``entries`` (``user:``, ``group:``, ``role:``) name this person."""
    for entry in entries:
        kind, _, value = entry.partition(":")
        if kind == "user" and value == name:
            return True
        if kind == "group" and value in groups:
            return True
        if kind == "role" and role in ROLES and ROLES.index(role) >= ROLES.index(value):
            return True
    return False


def _who(entries: Sequence[str]) -> str:
    names = []
    for entry in entries:
        kind, _, value = entry.partition(":")
        names.append(f"{value}s" if kind == "role" else value)
    return " or ".join(names)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    #: Globs; None matches anything.
    agent: str | None = None
    reason: str | None = None
    tool: str | None = None
    #: ``group:finance``, ``user:ada``, ``role:operator``; empty: any approver.
    approvers: tuple[str, ...] = ()
    approvals: int = 1
    #: ``reject`` (a reason only to reject) or ``always`` (to approve too).
    reason_required: str = "reject"
    fields: tuple[Field, ...] = ()
    #: Apprise URLs the rule's pauses (and their reminders) are announced to, besides
    #: the targets every event goes to.
    notify: tuple[str, ...] = ()
    #: Seconds after it paused that a pause is overdue; None: no deadline.
    due: float | None = None
    #: While overdue, remind this often (seconds); None: the server's ``--remind-after``.
    remind_every: float | None = None
    #: Entries like ``approvers``, who may decide a pause once it is overdue too.
    escalate_to: tuple[str, ...] = ()
    #: ``reject`` or ``approve``: what the rule decides at ``timeout_after``; None: nothing.
    on_timeout: str | None = None
    #: Seconds after it paused that the rule decides a pause (``on_timeout``).
    timeout_after: float | None = None
    timeout_reason: str = ""

    def matches(self, *, owner: str, agent: str, reason: str, tool: str) -> bool:
        if self.agent is not None and not (
            fnmatchcase(owner, self.agent) or fnmatchcase(agent, self.agent)
        ):
            return False
        if self.reason is not None and not fnmatchcase(reason, self.reason):
            return False
        return self.tool is None or fnmatchcase(tool, self.tool)

    def allows(self, name: str, role: str, groups: Sequence[str]) -> bool:
        """Whether this person is one the rule lets decide (their role must still
        allow deciding at all: the rule narrows who, it never widens it)."""
        return not self.approvers or _names(self.approvers, name, role, groups)

    def allows_escalated(self, name: str, role: str, groups: Sequence[str]) -> bool:
        """Whether this person is one ``escalate_to`` adds once a pause is overdue."""
        return _names(self.escalate_to, name, role, groups)

    @property
    def who(self) -> str:
        """Who may decide, as a person reads it: ``finance or ada``."""
        return _who(self.approvers) if self.approvers else "any approver"

    @property
    def escalated_who(self) -> str:
        """Who ``escalate_to`` adds, as a person reads it: ``managers or bob``."""
        return _who(self.escalate_to)

    @property
    def actor(self) -> str:
        """Who a timeout decision is recorded as: ``policy:NAME``."""
        return f"{POLICY_ACTOR}{self.name}"

    def due_at(self, paused_at: str) -> datetime | None:
        """When a pause that paused at ``paused_at`` (the SDK's time) is overdue."""
        then = runs.parse_time(paused_at)
        if self.due is None or then is None:
            return None
        return then + timedelta(seconds=self.due)

    def timeout_at(self, paused_at: str) -> datetime | None:
        """When the rule decides a pause that paused at ``paused_at``; None: never."""
        then = runs.parse_time(paused_at)
        if self.timeout_after is None or self.on_timeout is None or then is None:
            return None
        return then + timedelta(seconds=self.timeout_after)

    def is_overdue(self, paused_at: str, now: datetime) -> bool:
        due = self.due_at(paused_at)
        return due is not None and now >= due

    def timeout_fields(self, context: Any) -> dict[str, Value | None]:
        """The fields a timeout approval hands the tool: each one's default for this
        pause, checked as a person's would be (a 400 when one cannot be)."""
        sent = {f.name: v for f in self.fields if (v := f.default_for(context)) is not None}
        return self.check_fields(sent, context)

    def needs_reason(self, approved: bool) -> bool:
        return not approved or self.reason_required == "always"

    def check_fields(self, sent: Mapping[str, Any], context: Any) -> dict[str, Value | None]:
        """Every field's typed value from ``sent`` (keyed by field name), or a 400
        naming the first field that is wrong and why. Unknown names are refused too:
        a typo must not pass silently."""
        unknown = sorted(set(sent) - {f.name for f in self.fields})
        if unknown:
            known = ", ".join(f.name for f in self.fields) or "none"
            raise BadRequest(
                f"rule {self.name!r} has no field {unknown[0]!r} (its fields: {known})"
            )
        return {f.name: f.check(sent.get(f.name), context) for f in self.fields}


@dataclass(frozen=True, slots=True)
class Policy:
    rules: tuple[Rule, ...] = ()
    #: Where it was read from, for messages.
    source: str = ""

    def match(self, *, owner: str, agent: str, reason: str, tool: str) -> Rule | None:
        """The first rule that matches the pause, or None (decided as without a policy)."""
        for rule in self.rules:
            if rule.matches(owner=owner, agent=agent, reason=reason, tool=tool):
                return rule
        return None

    def rule_for(self, pending: Pending) -> Rule | None:
        """The rule for this pause: the first that matches its owner or agent, reason
        and tool (a chain's node is no tool); None when none does."""
        owner = runs.pause_owner(pending.agent_path, pending.agent, pending.node_id)
        tool = runs.parse_node(pending.node_id).tool if owner.kind != runs.CHAIN else None
        return self.match(
            owner=owner.name, agent=pending.agent, reason=pending.reason, tool=tool or ""
        )

    @property
    def has_deadlines(self) -> bool:
        """Whether any rule gives its pauses a deadline (``due``)."""
        return any(r.due is not None for r in self.rules)

    @property
    def notify_urls(self) -> tuple[str, ...]:
        """Every rule's ``notify`` URLs, each once, in the order the rules give them."""
        return tuple(dict.fromkeys(url for r in self.rules for url in r.notify))


# --- reading a policy file ------------------------------------------------------------


def load_policy(path: str | Path) -> Policy:
    """The policy in ``path``; :class:`PolicyError` with one line when it cannot be."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PolicyError(f"policy file {path} cannot be read: {reason}") from None
    return parse_policy(text, str(path))


def parse_policy(text: str, source: str = "policy") -> Policy:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from None
    extra = sorted(set(data) - {"rule"})
    if extra:
        raise PolicyError(
            f"{source}: unknown top-level key {extra[0]!r}: a policy is a list of [[rule]] tables"
        )
    raw_rules = data.get("rule", [])
    if not isinstance(raw_rules, list) or not all(isinstance(r, dict) for r in raw_rules):
        raise PolicyError(f"{source}: 'rule' must be written as [[rule]] tables")
    rules: list[Rule] = []
    for index, raw in enumerate(raw_rules, start=1):
        rule = _rule(raw, f"{source}: rule {index}")
        if any(r.name == rule.name for r in rules):
            raise PolicyError(
                f"{source}: rule {index}: key 'name': {rule.name!r} is already the name of"
                " another rule; each rule needs its own"
            )
        rules.append(rule)
    return Policy(rules=tuple(rules), source=source)


def _text(raw: Mapping[str, Any], key: str, where: str, *, needed: bool = False) -> str | None:
    value = raw.get(key)
    if value is None:
        if needed:
            raise PolicyError(f"{where}: key {key!r} is required (a non-empty string)")
        return None
    if not isinstance(value, str) or not value.strip():
        raise PolicyError(f"{where}: key {key!r} must be a non-empty string, not {value!r}")
    return value.strip()


def _strings(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise PolicyError(f"{where}: key {key!r} must be a list of non-empty strings")
    return tuple(v.strip() for v in value)


def _rule(raw: dict[str, Any], where: str) -> Rule:
    name = _text(raw, "name", where, needed=True)
    assert name is not None
    where = f"{where.rsplit(': ', 1)[0]}: rule {name!r}"
    extra = sorted(set(raw) - set(RULE_KEYS))
    if extra:
        raise PolicyError(f"{where}: unknown key {extra[0]!r} (allowed: {', '.join(RULE_KEYS)})")
    approvers = _who_entries(raw, "approvers", where)
    approvals = raw.get("approvals", 1)
    if isinstance(approvals, bool) or not isinstance(approvals, int) or approvals < 1:
        raise PolicyError(
            f"{where}: key 'approvals' must be a whole number of at least 1, not {approvals!r}"
        )
    users = [e for e in approvers if e.startswith("user:")]
    if approvers and len(users) == len(approvers) and approvals > len(set(users)):
        raise PolicyError(
            f"{where}: key 'approvals' is {approvals}, but 'approvers' names only"
            f" {len(set(users))} people: no pause could ever be approved"
        )
    reason_required = raw.get("reason_required", "reject")
    if reason_required not in REASON_REQUIRED:
        raise PolicyError(
            f"{where}: key 'reason_required' must be one of {', '.join(REASON_REQUIRED)},"
            f" not {reason_required!r}"
        )
    raw_fields = raw.get("field", [])
    if not isinstance(raw_fields, list) or not all(isinstance(f, dict) for f in raw_fields):
        raise PolicyError(f"{where}: key 'field' must be written as [[rule.field]] tables")
    fields: list[Field] = []
    for number, raw_field in enumerate(raw_fields, start=1):
        field = _field(raw_field, f"{where}: field {number}")
        if any(f.name == field.name for f in fields):
            raise PolicyError(f"{where}: field {field.name!r} is defined twice")
        fields.append(field)
    return Rule(
        name=name,
        agent=_text(raw, "agent", where),
        reason=_text(raw, "reason", where),
        tool=_text(raw, "tool", where),
        approvers=approvers,
        approvals=approvals,
        reason_required=str(reason_required),
        fields=tuple(fields),
        notify=_strings(raw, "notify", where),
        **_deadline(raw, where, fields),
    )


def _who_entries(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    entries = _strings(raw, key, where)
    for entry in entries:
        kind, colon, value = entry.partition(":")
        if not colon or kind not in WHO_KINDS or not value:
            raise PolicyError(
                f"{where}: key {key!r}: {entry!r} must be group:NAME, user:NAME or role:ROLE"
            )
        if kind == "role" and value not in ROLES[1:]:
            raise PolicyError(
                f"{where}: key {key!r}: {entry!r}: the roles that decide are {', '.join(ROLES[1:])}"
            )
    return entries


def _duration(raw: Mapping[str, Any], key: str, where: str) -> float | None:
    """A duration key (``90s``, ``30m``, ``4h``, ``1d``) in seconds; None when absent."""
    value = raw.get(key)
    if value is None:
        return None
    found = _DURATION.match(value.strip()) if isinstance(value, str) else None
    if found is None or int(found.group(1)) < 1:
        raise PolicyError(
            f'{where}: key {key!r} must be a duration such as "90s", "30m", "4h"'
            f' or "1d", not {value!r}'
        )
    return float(int(found.group(1)) * DURATION_UNITS[found.group(2)])


def _deadline(raw: Mapping[str, Any], where: str, fields: Sequence[Field]) -> dict[str, Any]:
    """The deadline keys of a rule (``due`` and those that need it), checked."""
    due = _duration(raw, "due", where)
    if due is None:
        for key in RULE_KEYS[RULE_KEYS.index("remind_every") :]:
            if key in raw:
                raise PolicyError(
                    f"{where}: key {key!r} needs 'due' (how long after it paused a pause is"
                    " overdue)"
                )
        return {}
    on_timeout = raw.get("on_timeout")
    if on_timeout is not None and on_timeout not in ON_TIMEOUT:
        raise PolicyError(
            f"{where}: key 'on_timeout' must be one of {', '.join(ON_TIMEOUT)}, not {on_timeout!r}"
        )
    timeout_after = _duration(raw, "timeout_after", where)
    reason = _text(raw, "timeout_reason", where)
    allow = raw.get("allow_timeout_approve", False)
    if not isinstance(allow, bool):
        raise PolicyError(f"{where}: key 'allow_timeout_approve' must be true or false")
    if on_timeout is None:
        for key in ("timeout_after", "timeout_reason", "allow_timeout_approve"):
            if key in raw:
                raise PolicyError(f"{where}: key {key!r} needs 'on_timeout' (reject or approve)")
    else:
        if reason is None:
            raise PolicyError(
                f"{where}: key 'timeout_reason' is required with 'on_timeout': the reason"
                " the run (and whoever it answers) is given"
            )
        if timeout_after is not None and timeout_after < due:
            raise PolicyError(
                f"{where}: key 'timeout_after' ({raw['timeout_after']}) must be at least"
                f" 'due' ({raw['due']})"
            )
        if on_timeout == "approve" and not allow:
            raise PolicyError(
                f"{where}: key 'on_timeout' = \"approve\" approves what nobody looked at:"
                " say so twice with allow_timeout_approve = true"
            )
        if on_timeout != "approve" and allow:
            raise PolicyError(
                f"{where}: key 'allow_timeout_approve' is only for on_timeout = \"approve\""
            )
        if on_timeout == "approve":
            for field in fields:
                if field.required and field.default is None:
                    raise PolicyError(
                        f"{where}: field {field.name!r} is required and has no default, so"
                        ' on_timeout = "approve" could not fill it in: give it a default'
                    )
    return {
        "due": due,
        "remind_every": _duration(raw, "remind_every", where),
        "escalate_to": _who_entries(raw, "escalate_to", where),
        "on_timeout": on_timeout,
        "timeout_after": None if on_timeout is None else (timeout_after or due),
        "timeout_reason": reason or "",
    }


def _path(text: str, where: str, key: str) -> ContextPath:
    parts = tuple(text[len(CONTEXT_PREFIX) :].split("."))
    if not all(parts):
        raise PolicyError(f"{where}: key {key!r}: {text!r} is not a path like context.amount")
    return ContextPath(text=text, parts=parts)


def _field(raw: dict[str, Any], where: str) -> Field:
    name = _text(raw, "name", where, needed=True)
    assert name is not None
    where = f"{where.rsplit(': ', 1)[0]}: field {name!r}"
    extra = sorted(set(raw) - set(FIELD_KEYS))
    if extra:
        raise PolicyError(f"{where}: unknown key {extra[0]!r} (allowed: {', '.join(FIELD_KEYS)})")
    if not _FIELD_NAME.match(name):
        raise PolicyError(
            f"{where}: key 'name' must be letters, digits and _ (not starting with a digit)"
        )
    if name in RESERVED:
        raise PolicyError(
            f"{where}: key 'name': {name!r} is what localui itself sends the tool;"
            f" pick another (taken: {', '.join(RESERVED)})"
        )
    kind = raw.get("type")
    if kind not in FIELD_TYPES:
        raise PolicyError(f"{where}: key 'type' must be one of {', '.join(FIELD_TYPES)}")
    required = raw.get("required", False)
    if not isinstance(required, bool):
        raise PolicyError(f"{where}: key 'required' must be true or false")
    if required and kind == "boolean":
        raise PolicyError(
            f"{where}: key 'required' does not apply to a boolean (unticked is false)"
        )
    choices = _strings(raw, "choices", where)
    if kind == "choice" and not choices:
        raise PolicyError(f"{where}: key 'choices' is required for a choice field (a list)")
    if kind != "choice" and "choices" in raw:
        raise PolicyError(f"{where}: key 'choices' is only for a choice field")
    bounds: dict[str, float | ContextPath | None] = {}
    for key in ("min", "max"):
        value = raw.get(key)
        if value is not None and kind not in ("number", "integer"):
            raise PolicyError(f"{where}: key {key!r} is only for a number or integer field")
        if isinstance(value, str) and value.startswith(CONTEXT_PREFIX):
            bounds[key] = _path(value, where, key)
        elif value is None or _is_number(value):
            bounds[key] = None if value is None else float(value)
        else:
            raise PolicyError(
                f"{where}: key {key!r} must be a number or a path like context.amount"
            )
    low, high = bounds["min"], bounds["max"]
    if isinstance(low, float) and isinstance(high, float) and low > high:
        raise PolicyError(f"{where}: key 'min' ({_number(low)}) is above 'max' ({_number(high)})")
    label = _text(raw, "label", where) or name
    field = Field(
        name=name,
        type=str(kind),
        label=label,
        min=low,
        max=high,
        required=required,
        choices=choices,
    )
    default = raw.get("default")
    if isinstance(default, str) and default.startswith(CONTEXT_PREFIX):
        source: Source | None = _path(default, where, "default")
    elif default is None:
        source = None
    else:
        try:
            source = field._typed(default, "the default")
        except BadRequest:
            raise PolicyError(
                f"{where}: key 'default' must be a value of type {kind} or a path like"
                f" context.amount, not {default!r}"
            ) from None
    return Field(
        name=field.name,
        type=field.type,
        label=field.label,
        default=source,
        min=field.min,
        max=field.max,
        required=field.required,
        choices=field.choices,
    )
