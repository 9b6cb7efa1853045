"""A row's conversation as a transcript: the snapshot's ``messages``, as a person reads them.

The row page shows a row's whole conversation with it; the diff shows the messages
one row has and the other lacks. Both render it with the ``transcript`` macro of
``partials/_transcript.html``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from localui.diff import SectionDiff
from localui.views.respond import html_only, pretty_json


@dataclass(frozen=True, slots=True)
class ToolCallView:
    id: str
    name: str
    arguments: Any
    arguments_json: str = html_only("")


@dataclass(frozen=True, slots=True)
class MessageView:
    """One message of the conversation."""

    role: str
    text: str
    tool_calls: tuple[ToolCallView, ...]
    tool_call_id: str | None


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return str(content)


def _tool_calls(raw_calls: Any) -> tuple[ToolCallView, ...]:
    calls = []
    for call in raw_calls if isinstance(raw_calls, list) else []:
        if isinstance(call, dict):
            arguments = call.get("arguments")
            calls.append(
                ToolCallView(
                    id=str(call.get("id") or ""),
                    name=str(call.get("name") or "?"),
                    arguments=arguments,
                    arguments_json=pretty_json(arguments),
                )
            )
    return tuple(calls)


def message_view(message: Any) -> MessageView:
    if not isinstance(message, dict):
        return MessageView(role="?", text=str(message), tool_calls=(), tool_call_id=None)
    return MessageView(
        role=str(message.get("role") or "?"),
        text=_text_of(message.get("content")),
        tool_calls=_tool_calls(message.get("tool_calls")),
        tool_call_id=message.get("tool_call_id"),
    )


def transcript(snapshot: Any) -> tuple[MessageView, ...] | None:
    """The snapshot's ``messages`` as a transcript, or None when it holds none."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("messages"), list):
        return None
    return tuple(message_view(m) for m in snapshot["messages"])


def with_turns(section: SectionDiff) -> SectionDiff:
    """A diff's section with its appended and removed messages as transcript turns."""
    if not section.appended_messages and not section.removed_messages:
        return section
    return dataclasses.replace(
        section,
        appended_turns=transcript({"messages": list(section.appended_messages)}) or (),
        removed_turns=transcript({"messages": list(section.removed_messages)}) or (),
    )
