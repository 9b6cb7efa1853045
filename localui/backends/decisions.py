"""The decision record's shape, shared by the SQLite and PostgreSQL logs.

It lives in a table of the app's own (``localui_decisions``) inside the store's
database, never in the SDK's tables, so it travels with the store and outlives
pruned checkpoints and disabled traces. It is also the app's lock: a decision is
claimed by inserting its row, and the unique key ``(kind, execution_id,
checkpoint_id)`` lets exactly one claim win across threads and processes,
before the SDK is asked to do anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from localui.backends.shared import NamedRow
from localui.records import Decision, Vote

TABLE = "localui_decisions"
#: Approvals of pauses whose rule needs several people (``localui.policy``), beside
#: the decisions; unique per person and paused row, so nobody is counted twice, in
#: any process.
VOTES_TABLE = "localui_votes"
VOTE_COLUMN_NAMES = (
    "id",
    "execution_id",
    "checkpoint_id",
    "actor",
    "reason",
    "fields",
    "voted_at",
)
VOTE_COLUMNS = ", ".join(VOTE_COLUMN_NAMES)

#: A claim whose row has no outcome after this long, while the SDK's pending row
#: is still there, was left by a process that died before it reached the SDK:
#: the next person may take it over. The SDK's own claim follows ours within
#: milliseconds, so a live claim is never this old with its pending row intact.
ABANDONED_AFTER_SECONDS = 30.0

#: The record's columns, in the order every SELECT and RETURNING lists them.
COLUMN_NAMES = (
    "id",
    "kind",
    "execution_id",
    "checkpoint_id",
    "approved",
    "actor",
    "reason",
    "decided_at",
    "outcome",
    "detail",
    "finished_at",
    "metadata",
)
COLUMNS = ", ".join(COLUMN_NAMES)
#: The same list for a table made before ``metadata`` was kept, which a read-only log
#: may not migrate: its records read as having no metadata.
COLUMNS_BEFORE_METADATA = ", ".join((*COLUMN_NAMES[:-1], "NULL AS metadata"))


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def decision_from_row(row: NamedRow, instant: Callable[[Any], str] = str) -> Decision:
    """A row of ``COLUMNS`` (by name) as a :class:`Decision`; ``instant`` turns the
    database's time values into ISO text."""
    approved = row["approved"]
    return Decision(
        id=int(row["id"]),
        kind=str(row["kind"]),
        execution_id=str(row["execution_id"]),
        checkpoint_id=str(row["checkpoint_id"]),
        approved=None if approved is None else bool(approved),
        actor=str(row["actor"]),
        reason=str(row["reason"] or ""),
        decided_at=instant(row["decided_at"]),
        outcome=None if row["outcome"] is None else str(row["outcome"]),
        detail=None if row["detail"] is None else str(row["detail"]),
        finished_at=None if row["finished_at"] is None else instant(row["finished_at"]),
        metadata=metadata_of(row["metadata"]),
    )


def metadata_to_text(metadata: Mapping[str, Any] | None) -> str | None:
    """``metadata`` as the JSON text the SQLite column keeps (PostgreSQL keeps JSONB)."""
    return None if metadata is None else json.dumps(dict(metadata), sort_keys=True)


def metadata_of(value: Any) -> Mapping[str, Any] | None:
    """The stored metadata (JSON text, or the driver's decoded JSONB) as a mapping.

    A value that is not a JSON object reads as None: nothing the app wrote, so
    nothing it may hand a tool.
    """
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def abandoned(decision: Decision) -> bool:
    """Whether a claim with no outcome is old enough to be taken over."""
    if decision.outcome is not None:
        return False
    try:
        started = datetime.fromisoformat(decision.decided_at)
    except ValueError:
        return False
    return (datetime.now(UTC) - started).total_seconds() > ABANDONED_AFTER_SECONDS


def vote_from_row(row: NamedRow, instant: Callable[[Any], str] = str) -> Vote:
    """A row of ``VOTE_COLUMNS`` (by name) as a :class:`Vote`."""
    return Vote(
        id=int(row["id"]),
        execution_id=str(row["execution_id"]),
        checkpoint_id=str(row["checkpoint_id"]),
        actor=str(row["actor"]),
        reason=str(row["reason"] or ""),
        fields_json=str(row["fields"] or "{}"),
        voted_at=instant(row["voted_at"]),
    )
