"""The deadlines of pauses an approval policy's rule gives a ``due``: ``localui_deadlines``,
a table localui owns, shared by every process serving the store.

One row per pause (``execution_id``, ``checkpoint_id``: unique, so processes that find
the same new pause record it once), with when it paused, when it is overdue and when
its rule decides it, and when it was escalated and timed out. ``escalated_at`` and
``timed_out_at`` are set by an ``UPDATE ... WHERE ... IS NULL`` that one process wins:
that one tells people. Times are Unix seconds on the serving hosts' clocks, as the SDK
stamps its rows. Rows of pauses that no longer wait are deleted (the decision record
keeps what happened). Indexed on ``due_at``: the queue sorts by it.

This module holds what both backends' tables share.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

TABLE = "localui_deadlines"
#: The columns, in the order every SELECT lists them.
COLUMN_NAMES = (
    "execution_id",
    "checkpoint_id",
    "rule",
    "paused_at",
    "due_at",
    "timeout_at",
    "escalated_at",
    "timed_out_at",
)
COLUMNS = ", ".join(COLUMN_NAMES)


@dataclass(frozen=True, slots=True)
class Deadline:
    """One pause's deadline (Unix seconds)."""

    execution_id: str
    checkpoint_id: str
    #: The rule's name when the row was recorded.
    rule: str
    paused_at: float
    due_at: float
    #: When the rule decides it; None: its rule has no ``on_timeout``.
    timeout_at: float | None = None
    escalated_at: float | None = None
    timed_out_at: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.execution_id, self.checkpoint_id)

    def values(self) -> tuple[Any, ...]:
        """The row's values in :data:`COLUMN_NAMES` order."""
        return (
            self.execution_id,
            self.checkpoint_id,
            self.rule,
            self.paused_at,
            self.due_at,
            self.timeout_at,
            self.escalated_at,
            self.timed_out_at,
        )


def deadline_from_row(row: Any) -> Deadline:
    """A row of :data:`COLUMNS` (a tuple) as a :class:`Deadline`."""
    execution_id, checkpoint_id, rule, paused_at, due_at, timeout_at, escalated, timed_out = row
    return Deadline(
        execution_id=str(execution_id),
        checkpoint_id=str(checkpoint_id),
        rule=str(rule),
        paused_at=float(paused_at),
        due_at=float(due_at),
        timeout_at=None if timeout_at is None else float(timeout_at),
        escalated_at=None if escalated is None else float(escalated),
        timed_out_at=None if timed_out is None else float(timed_out),
    )


def iso(seconds: float) -> str:
    """Unix seconds as the ISO text pages and JSON show."""
    return datetime.fromtimestamp(seconds, UTC).isoformat()
