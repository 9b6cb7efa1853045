"""The notifications outbox's shape, shared by the SQLite and PostgreSQL outboxes.

``localui_notifications`` lives beside ``localui_decisions`` (the SQLite store's
file, or the PostgreSQL app schema). It holds one row per event and target: the
watcher records an event for every configured target with ``INSERT … ON CONFLICT
DO NOTHING`` on the unique key ``(event_key, target)``, so however many localui
processes watch the store, each event is recorded, and so sent, once.

A sender claims due rows by setting a lease on them (``lease_until``) in one
statement, and marks each sent or due again after it tried. A process that dies
after sending and before marking leaves its lease to run out; then another claims
the row and sends it once more, with the same id (``event_key``): receivers drop
the repeat, as the Standard Webhooks spec asks them to.

Times are seconds since the epoch as the sending process's clock reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from localui.backends.shared import NamedRow

TABLE = "localui_notifications"

PENDING = "pending"
SENT = "sent"
FAILED = "failed"

#: ``rename_target`` (its condition on every state lets it use the ``(state, target,
#: next_at)`` index): ``{table}`` and, in order, the new id, the old id's text and the new
#: one's (in the errors), the old id, the new id again. A row whose event the new id
#: already has (a process of the same store that renamed it first, or recorded it anew)
#: stays under the old id: moving it would break the unique key.
RENAME_SQL = (
    "UPDATE {table} AS o SET target = {mark}, last_error = REPLACE(last_error, {mark}, {mark})"
    f" WHERE state IN ('{PENDING}', '{SENT}', '{FAILED}') AND target = {{mark}}"
    " AND NOT EXISTS (SELECT 1 FROM {table} AS n WHERE n.event_key = o.event_key"
    " AND n.target = {mark})"
)


def shown_part(target_id: str) -> str:
    """The text of a target id before its fingerprint, as errors quote it."""
    return target_id.rpartition("#")[0] or target_id


#: The outbox's columns, in the order every SELECT and RETURNING lists them.
COLUMN_NAMES = (
    "id",
    "event_key",
    "target",
    "event_type",
    "execution_id",
    "payload",
    "created_at",
    "state",
    "attempts",
    "next_at",
    "give_up_at",
    "lease_until",
    "last_error",
    "sent_at",
)
COLUMNS = ", ".join(COLUMN_NAMES)


@dataclass(frozen=True, slots=True)
class Notice:
    """One event to record for every target: its key, type, run and JSON payload."""

    event_key: str
    event_type: str
    execution_id: str
    payload: str


@dataclass(frozen=True, slots=True)
class Notification:
    """One event for one target, and how its delivery went."""

    id: int
    event_key: str
    #: The target's id (``localui.notify.targets.Target.id``).
    target: str
    event_type: str
    execution_id: str
    #: The event as JSON (``localui.notify.outbox``).
    payload: str
    created_at: float
    state: str
    attempts: int
    next_at: float
    give_up_at: float
    lease_until: float | None
    last_error: str | None
    sent_at: float | None


@dataclass(frozen=True, slots=True)
class TargetStatus:
    """One target's deliveries so far."""

    target: str
    sent: int
    pending: int
    failed: int
    last_sent_at: float | None
    #: The newest error of a row still pending or given up on.
    last_error: str | None


def notification_from_row(row: NamedRow) -> Notification:
    """A row of ``COLUMNS`` (by name) as a :class:`Notification`."""
    lease = row["lease_until"]
    sent = row["sent_at"]
    return Notification(
        id=int(row["id"]),
        event_key=str(row["event_key"]),
        target=str(row["target"]),
        event_type=str(row["event_type"]),
        execution_id=str(row["execution_id"]),
        payload=str(row["payload"]),
        created_at=float(row["created_at"]),
        state=str(row["state"]),
        attempts=int(row["attempts"]),
        next_at=float(row["next_at"]),
        give_up_at=float(row["give_up_at"]),
        lease_until=None if lease is None else float(lease),
        last_error=None if row["last_error"] is None else str(row["last_error"]),
        sent_at=None if sent is None else float(sent),
    )


def status_from_row(row: NamedRow) -> TargetStatus:
    """A row of the per-target summary both outboxes select."""
    last = row["last_sent_at"]
    return TargetStatus(
        target=str(row["target"]),
        sent=int(row["sent"] or 0),
        pending=int(row["pending"] or 0),
        failed=int(row["failed"] or 0),
        last_sent_at=None if last is None else float(last),
        last_error=None if row["last_error"] is None else str(row["last_error"]),
    )


#: The per-target summary, in SQL both databases speak (``{table}`` filled in).
SUMMARY_SQL = (
    "SELECT target,"
    f" SUM(CASE WHEN state = '{SENT}' THEN 1 ELSE 0 END) AS sent,"
    f" SUM(CASE WHEN state = '{PENDING}' THEN 1 ELSE 0 END) AS pending,"
    f" SUM(CASE WHEN state = '{FAILED}' THEN 1 ELSE 0 END) AS failed,"
    " MAX(sent_at) AS last_sent_at,"
    " (SELECT e.last_error FROM {table} e WHERE e.target = t.target"
    "  AND e.last_error IS NOT NULL AND e.state <> 'sent'"
    "  ORDER BY e.id DESC LIMIT 1) AS last_error"
    " FROM {table} t GROUP BY target ORDER BY target"
)
