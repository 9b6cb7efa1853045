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


#: The runners whose root span names a run: ``agent.<name>``, ``chain.<name>``,
#: ``swarm.<name>``, ``supervisor.<name>``. Each stamps the run's id as
#: ``<runner>.execution_id`` (``resumed_execution_id`` on a resume,
#: ``forked_execution_id`` on a fork).
RUNNERS = ("agent", "chain", "swarm", "supervisor")


def runner_of(span: Span) -> str | None:
    """``chain`` for a ``chain.<name>`` span; None for a span no runner opens."""
    runner = span.name.split(".", 1)[0]
    return runner if runner in RUNNERS and "." in span.name else None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One root span of a run (an agent's, a chain's or a team's) and the spans
    under it, in start order."""

    root: Span
    children: tuple[Span, ...]

    @property
    def runner(self) -> str:
        """``agent``, ``chain``, ``swarm`` or ``supervisor``."""
        return runner_of(self.root) or "agent"

    def text(self, key: str) -> str | None:
        """The root's ``<runner>.<key>``: ``chain.input`` of a chain's attempt."""
        return self.root.text(f"{self.runner}.{key}")

    def value(self, key: str) -> Any:
        return self.root.attributes.get(f"{self.runner}.{key}")


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


def attempts_of(spans: list[Span], root_span_ids: set[str]) -> tuple[Attempt, ...]:
    """The attempts whose root spans are ``root_span_ids``, each with its subtree.

    A span of the run under another of the run's spans (a supervisor's worker, a
    swarm's agents, all filed under the team's run id) is part of that attempt, not
    one of its own. A trace can hold more than one run: under an *agent's* span, a
    nested agent span with an execution id of its own (an agent called from a tool)
    starts another run and is left out. Under a chain's or a team's span everything
    is the run's own: the agents of a chain's nodes carry ids of their own, and they
    are what the chain ran.
    """
    children: dict[str, list[Span]] = {}
    by_id: dict[str, Span] = {}
    for span in spans:
        by_id[span.span_id] = span
        if span.parent_span_id:
            children.setdefault(span.parent_span_id, []).append(span)

    def nested(span: Span) -> bool:
        """Under another root span of the same run (a supervisor's worker)."""
        parent = by_id.get(span.parent_span_id or "")
        while parent is not None:
            if parent.span_id in root_span_ids:
                return True
            parent = by_id.get(parent.parent_span_id or "")
        return False

    attempts = []
    for span_id in root_span_ids:
        root = by_id.get(span_id)
        if root is None or nested(root):
            continue
        of_agent = runner_of(root) == "agent"
        found: list[Span] = []
        stack = list(children.get(span_id, ()))
        while stack:
            span = stack.pop()
            if (
                of_agent
                and span.span_id not in root_span_ids
                and span.attributes.get("agent.execution_id")
            ):
                continue
            found.append(span)
            stack.extend(children.get(span.span_id, ()))
        found.sort(key=lambda s: s.start_time or "")
        attempts.append(Attempt(root=root, children=tuple(found)))
    attempts.sort(key=lambda a: a.root.start_time or "")
    return tuple(attempts)
