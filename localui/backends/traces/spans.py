"""Spans as the app reads them: frozen records, attributes decoded once."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Span:
    """One span of the SDK's ``spans`` table."""

    span_id: str
    trace_id: str
    parent_span_id: str | None
    name: str
    start_time: str | None
    end_time: str | None
    status: str
    attributes: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    #: The attributes were not a JSON object: shown as unreadable, never a crash.
    unreadable: bool = False
    #: The first exception recorded on the span, as ``Type: message``.
    error: str | None = None
    #: The columns as stored, for a bundle that carries the span elsewhere.
    raw_attributes: str | None = None
    raw_events: str | None = None

    def text(self, key: str) -> str | None:
        value = self.attributes.get(key)
        if value is None:
            return None
        return value if isinstance(value, str) else json.dumps(value, default=str)

    def number(self, key: str) -> int | None:
        value = self.attributes.get(key)
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            return int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        return None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One ``agent.*`` span of a run and the spans under it, in start order."""

    agent: Span
    children: tuple[Span, ...]


def decode_attributes(text: str | None) -> tuple[Mapping[str, Any], bool]:
    """``(attributes, unreadable)`` from the column's JSON text."""
    if not text:
        return _EMPTY, False
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return _EMPTY, True
    if not isinstance(value, dict):
        return _EMPTY, True
    return MappingProxyType(value), False


def first_exception(text: str | None) -> str | None:
    """``Type: message`` of the first ``exception`` event in the events column."""
    if not text:
        return None
    try:
        events = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(events, list):
        return None
    for event in events:
        if not isinstance(event, dict) or event.get("name") != "exception":
            continue
        attributes = event.get("attributes")
        if not isinstance(attributes, dict):
            return "exception"
        kind = str(attributes.get("exception.type") or "exception").rsplit(".", 1)[-1]
        message = attributes.get("exception.message")
        return f"{kind}: {message}" if message else kind
    return None


def attempts_of(spans: list[Span], agent_span_ids: set[str]) -> tuple[Attempt, ...]:
    """The attempts whose agent spans are ``agent_span_ids``, each with its subtree.

    A trace can hold more than one run (an agent called inside another's span), so
    only the spans under the run's own agent spans belong to it; a nested agent
    span with an execution id of its own starts another run and is left out.
    """
    children: dict[str, list[Span]] = {}
    by_id: dict[str, Span] = {}
    for span in spans:
        by_id[span.span_id] = span
        if span.parent_span_id:
            children.setdefault(span.parent_span_id, []).append(span)

    def nested(span: Span) -> bool:
        """Under another agent span of the same run (a supervisor's worker)."""
        parent = by_id.get(span.parent_span_id or "")
        while parent is not None:
            if parent.span_id in agent_span_ids:
                return True
            parent = by_id.get(parent.parent_span_id or "")
        return False

    attempts = []
    for span_id in agent_span_ids:
        agent = by_id.get(span_id)
        if agent is None or nested(agent):
            continue
        found: list[Span] = []
        stack = list(children.get(span_id, ()))
        while stack:
            span = stack.pop()
            if span.span_id not in agent_span_ids and span.attributes.get("agent.execution_id"):
                continue
            found.append(span)
            stack.extend(children.get(span.span_id, ()))
        found.sort(key=lambda s: s.start_time or "")
        attempts.append(Attempt(agent=agent, children=tuple(found)))
    attempts.sort(key=lambda a: a.agent.start_time or "")
    return tuple(attempts)
