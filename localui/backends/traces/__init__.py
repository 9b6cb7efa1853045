"""The SDK's trace spans of a run, found through an index of the app's own.

When tracing is on the SDK writes one root span per attempt of a run (the first
run, each resume, each fork): ``agent.<name>``, ``chain.<name>``, ``swarm.<name>``
or ``supervisor.<name>``, with the run's execution id in its attributes, and the
attempt's model and tool calls (and a chain's or team's agents) under it. The
``spans`` table has no index on that attribute, and the app may not add one,
so :class:`SpanIndex` keeps ``(execution_id, trace_id, span_id)`` of every
such span in a file of its own, folded in by rowid as spans are written: a run
page then reads its attempts' traces through the SDK's own ``trace_id`` index.
"""

from __future__ import annotations

from localui.backends.traces.index import LEDGER, TRACE, Resolution, RunSummary, SpanIndex
from localui.backends.traces.spans import Attempt, Span

__all__ = ["LEDGER", "TRACE", "Attempt", "Resolution", "RunSummary", "Span", "SpanIndex"]
