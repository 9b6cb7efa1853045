"""An edited conversation: what a person may change in a row's messages, and what changed.

A developer asks "what if the tool had answered X", "what if the model had said Y". The
editor hands back the row's conversation (``state_snapshot["messages"]``, in the shape
the row's ``.json`` shows) with some of it changed; a branch then goes on from the
edited conversation (``localui.actions``). This module reads that conversation before
the SDK does, so a mistake gets a sentence naming the message at fault rather than a
validation dump from deep inside a run, and it says what changed, for the branch's
page and the decision record.

Pure: plain dicts in, plain values out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localui.errors import BadRequest

ROLES = ("system", "user", "assistant", "tool")
#: The most messages an edited conversation may hold (a row holds what a run sent the
#: model; this bounds what a form may make the app load).
MAX_MESSAGES = 2_000
#: The longest text one edited message may hold.
MAX_TEXT = 200_000

TEXT = "text"
ARGUMENTS = "arguments"
RESULT = "result"
ADDED = "added"
REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class MessageChange:
    """One message the edit changed, added or removed (``index`` counts from 0)."""

    index: int
    #: ``text``, ``arguments`` (of a tool call), ``result`` (of a tool), ``added``,
    #: ``removed``.
    what: str
    role: str
    before: Any
    after: Any
    #: For ``arguments``: the call's tool.
    tool: str | None = None


#: The longest JSON an edit's field may hold.
MAX_JSON = 5_000_000


def load_json(name: str, text: str) -> Any:
    """A JSON field, or a :class:`BadRequest` that names it (nesting too deep for the
    parser and numbers too long for Python's are not JSON this app takes either)."""
    if len(text) > MAX_JSON:
        raise BadRequest(f"{name} is longer than {MAX_JSON:,} characters")
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise BadRequest(f"{name} is not JSON this app reads: it nests too deep") from exc
    except ValueError as exc:
        raise BadRequest(f"{name} is not JSON: {str(exc)[:200]}") from exc


def storable(name: str, value: Any) -> None:
    """A :class:`BadRequest` when ``value`` holds text no store keeps: a NUL character
    (PostgreSQL text has none) or half of a UTF-16 pair."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                raise BadRequest(f"{name} holds a NUL character, which no store keeps")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise BadRequest(f"{name} holds text that is not Unicode (half a pair)") from exc


def parse_messages(text: str) -> list[dict[str, Any]]:
    """The ``messages`` field of a form or API call: a JSON list of messages."""
    return check_messages(load_json("messages", text))


def check_messages(raw: Any) -> list[dict[str, Any]]:
    """The conversation, if the SDK could load it; a :class:`BadRequest` naming the
    first message at fault otherwise."""
    if not isinstance(raw, list):
        raise BadRequest("messages must be a JSON list of messages, as the row's .json shows")
    if not raw:
        raise BadRequest("an edited conversation needs at least one message")
    if len(raw) > MAX_MESSAGES:
        raise BadRequest(f"an edited conversation holds at most {MAX_MESSAGES} messages")
    calls: set[str] = set()
    for index, message in enumerate(raw):
        where = f"message {index + 1}"
        if not isinstance(message, dict):
            raise BadRequest(f"{where} is not an object with a role and content")
        role = message.get("role")
        if role not in ROLES:
            raise BadRequest(f"{where}: role must be one of {', '.join(ROLES)}, not {role!r}")
        _check_content(where, message.get("content"))
        for call in message.get("tool_calls") or ():
            if role != "assistant":
                raise BadRequest(f"{where}: only an assistant message calls tools")
            calls.add(_check_call(where, call))
        if message.get("tool_calls") is not None and not isinstance(message["tool_calls"], list):
            raise BadRequest(f"{where}: tool_calls must be a list")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise BadRequest(f"{where}: a tool result needs the tool_call_id it answers")
            if call_id not in calls:
                raise BadRequest(
                    f"{where}: it answers tool call {call_id!r}, which no earlier "
                    "assistant message makes"
                )
    storable("messages", raw)
    return [dict(m) for m in raw]


def _check_content(where: str, content: Any) -> None:
    if content is None:
        return
    if isinstance(content, str):
        if len(content) > MAX_TEXT:
            raise BadRequest(f"{where}: the text is longer than {MAX_TEXT:,} characters")
        return
    if not isinstance(content, list):
        raise BadRequest(f"{where}: content must be text, a list of parts, or null")


def _check_call(where: str, call: Any) -> str:
    if not isinstance(call, dict):
        raise BadRequest(f"{where}: each tool call is an object with id, name and arguments")
    call_id, name, arguments = call.get("id"), call.get("name"), call.get("arguments", {})
    if not isinstance(call_id, str) or not call_id:
        raise BadRequest(f"{where}: a tool call needs an id")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}: tool call {call_id!r} needs the name of a tool")
    if not isinstance(arguments, dict):
        raise BadRequest(
            f"{where}: the arguments of {name} must be an object (name: value), "
            f"not {type(arguments).__name__}"
        )
    return call_id


def tools_called(messages: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Each tool the conversation's assistant messages call, once, in order."""
    seen: dict[str, None] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            seen.setdefault(str(call.get("name")), None)
    return tuple(seen)


def changes(
    source: Sequence[Mapping[str, Any]], edited: Sequence[Mapping[str, Any]]
) -> tuple[MessageChange, ...]:
    """What the edit changed, message by message (then the messages added or removed
    at the end)."""
    found: list[MessageChange] = []
    for index, (before, after) in enumerate(zip(source, edited, strict=False)):
        found.extend(_changed(index, before, after))
    for index in range(len(edited), len(source)):
        gone = source[index]
        found.append(MessageChange(index, REMOVED, str(gone.get("role")), _said(gone), None))
    for index in range(len(source), len(edited)):
        new = edited[index]
        found.append(MessageChange(index, ADDED, str(new.get("role")), None, _said(new)))
    return tuple(found)


def _changed(
    index: int, before: Mapping[str, Any], after: Mapping[str, Any]
) -> list[MessageChange]:
    role = str(after.get("role"))
    if before.get("role") != after.get("role") or before.get("tool_call_id") != after.get(
        "tool_call_id"
    ):
        # Not an edit of this message: another one stands in its place.
        return [
            MessageChange(index, REMOVED, str(before.get("role")), _said(before), None),
            MessageChange(index, ADDED, role, None, _said(after)),
        ]
    found: list[MessageChange] = []
    if before.get("content") != after.get("content"):
        what = RESULT if role == "tool" else TEXT
        found.append(MessageChange(index, what, role, before.get("content"), after.get("content")))
    calls_before = {c.get("id"): c for c in before.get("tool_calls") or ()}
    for call in after.get("tool_calls") or ():
        old = calls_before.get(call.get("id"))
        if old is None or old.get("name") != call.get("name"):
            found.append(
                MessageChange(index, ADDED, role, None, _call_text(call), tool=call.get("name"))
            )
        elif old.get("arguments", {}) != call.get("arguments", {}):
            found.append(
                MessageChange(
                    index,
                    ARGUMENTS,
                    role,
                    old.get("arguments", {}),
                    call.get("arguments", {}),
                    tool=str(call.get("name")),
                )
            )
    ids_after = {c.get("id") for c in after.get("tool_calls") or ()}
    for call_id, old in calls_before.items():
        if call_id not in ids_after:
            found.append(
                MessageChange(index, REMOVED, role, _call_text(old), None, tool=old.get("name"))
            )
    return found


def _call_text(call: Mapping[str, Any]) -> str:
    return f"{call.get('name')}({json.dumps(call.get('arguments', {}), sort_keys=True)})"


def _said(message: Mapping[str, Any]) -> Any:
    """A message in brief: its text, or the calls it makes."""
    calls = message.get("tool_calls") or ()
    if calls and not message.get("content"):
        return ", ".join(_call_text(c) for c in calls)
    return message.get("content")


def apply_fields(
    source: Sequence[Mapping[str, Any]], fields: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The conversation the editor's form describes, built on the row's own.

    The form (``pages/edit.html``) has, per message N: ``content.N`` (its text, or a
    tool's result), for each of its tool calls K ``arguments.N.K`` (a JSON object);
    ``remove_from`` drops message N and every later one; ``add_role`` with
    ``add_content`` appends one message. A field left as it was changes nothing.
    """
    edited: list[dict[str, Any]] = [
        {**m, "tool_calls": [dict(c) for c in m["tool_calls"]]} if m.get("tool_calls") else dict(m)
        for m in source
    ]
    for index, message in enumerate(edited):
        typed = fields.get(f"content.{index}")
        if typed is not None and isinstance(message.get("content"), (str, type(None))):
            text = typed.replace("\r\n", "\n")
            if text != (message.get("content") or ""):
                message["content"] = text
        for k, call in enumerate(message.get("tool_calls") or ()):
            typed_args = fields.get(f"arguments.{index}.{k}")
            if typed_args is None:
                continue
            call["arguments"] = load_json(
                f"message {index + 1}: the arguments of {call.get('name')}", typed_args
            )
    remove_from = (fields.get("remove_from") or "").strip()
    if remove_from:
        if not remove_from.isdigit() or not 0 < int(remove_from) <= len(edited):
            raise BadRequest(
                f"remove_from must be a message number from 1 to {len(edited)}, not {remove_from!r}"
            )
        del edited[int(remove_from) - 1 :]
    add_role = (fields.get("add_role") or "").strip()
    if add_role:
        if add_role not in ("user", "assistant"):
            raise BadRequest(
                f"a message added at the end is a user or assistant one, not {add_role!r}"
            )
        edited.append(
            {"role": add_role, "content": (fields.get("add_content") or "").replace("\r\n", "\n")}
        )
    return check_messages(edited)


#: How many changes the decision record keeps of one edit (it counts the rest).
MAX_RECORDED_CHANGES = 100


@dataclass(frozen=True, slots=True)
class StateChange:
    """One key of a chain's state the edit changed or added."""

    key: str
    before: Any
    after: Any
    added: bool


def parse_state(text: str) -> dict[str, Any]:
    """The ``state`` field of a form or API call: a JSON object."""
    raw = load_json("state", text)
    storable("state", raw)
    if not isinstance(raw, dict):
        raise BadRequest(f"state must be a JSON object (name: value), not {type(raw).__name__}")
    return raw


def state_changes(source: Mapping[str, Any], edited: Mapping[str, Any]) -> tuple[StateChange, ...]:
    """What an edited chain state changes, key by key, or a :class:`BadRequest`.

    The SDK merges the edit into the row's state (``Chain.afork(modified_state=)``
    updates it), so a key cannot be taken out; and a key the row holds keeps its type
    (a count stays a number), as the nodes after the row read it: a mistyped value
    would fail them or, worse, be read as something else."""
    if not isinstance(edited, Mapping):
        raise BadRequest(f"state must be an object (name: value), not {type(edited).__name__}")
    gone = [k for k in source if k not in edited]
    if gone:
        raise BadRequest(
            f"the state lacks {', '.join(sorted(gone)[:5])}: the SDK merges an edit into the "
            "row's state, so a key cannot be taken out (set it to null instead)"
        )
    found: list[StateChange] = []
    for key, after in edited.items():
        if key not in source:
            found.append(StateChange(key, None, after, added=True))
            continue
        before = source[key]
        if before == after and type(before) is type(after):
            continue
        if before is not None and after is not None and _kind(before) != _kind(after):
            raise BadRequest(
                f"state.{key} holds {_kind(before)} in the row, so it stays {_kind(before)} "
                f"(the edit gives it {_kind(after)})"
            )
        found.append(StateChange(key, before, after, added=False))
    return tuple(found)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a true/false value"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def edit_record(execution_id: str, checkpoint_id: str, found: tuple[Any, ...]) -> dict[str, Any]:
    """What the decision record keeps of an edit: the source row and each change."""
    return {
        "source_execution_id": execution_id,
        "source_checkpoint_id": checkpoint_id,
        "changes": [{k: getattr(c, k) for k in c.__slots__} for c in found[:MAX_RECORDED_CHANGES]],
        "changed": len(found),
    }
