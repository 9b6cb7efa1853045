"""The decision record's shape, shared by the SQLite and PostgreSQL logs.

It lives in a table of the app's own (``localui_decisions``) inside the store's
database, never in the SDK's tables, so it travels with the store and outlives
pruned checkpoints and disabled traces. It is also the app's lock: a decision is
claimed by inserting its row, and the unique key ``(kind, execution_id,
checkpoint_id)`` lets exactly one claim win across threads and processes,
before the SDK is asked to do anything.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from localui.backends.shared import NamedRow
from localui.errors import BadRequest
from localui.records import (
    APPROVAL,
    VOTE,
    Decision,
    DecisionEntry,
    DecisionPage,
    ExportPage,
    Vote,
)
from localui.settings import CLAIM_LEASE_SECONDS

R = TypeVar("R", bound=NamedRow)

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

#: The run's agent (its owner, as the runs list names it), recorded with each decision
#: and vote when it is written, so the listing and the export need not look every run
#: up in the runs index. Entries written before the column existed hold NULL: theirs
#: comes from the runs index, as before.
AGENT_COLUMN = "agent"
#: Columns added to the votes table after its first release, as ``ADDED_COLUMNS``.
ADDED_VOTE_COLUMNS: dict[str, tuple[str, str]] = {AGENT_COLUMN: ("TEXT", "TEXT")}

#: A claim whose row has no outcome, and whose process has not said it is alive for
#: this long, was left by a process that died: another may take it over. The
#: process carrying a decision out renews its heartbeat several times within it
#: (``HEARTBEATS_PER_LEASE``), however long the tool runs.
ABANDONED_AFTER_SECONDS = CLAIM_LEASE_SECONDS
HEARTBEATS_PER_LEASE = 4

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
    "heartbeat_at",
    "rearmed_checkpoint_id",
)
#: Columns added after the table's first release, with their SQLite and PostgreSQL
#: types: a writable log adds those missing, a read-only one reads them as NULL.
ADDED_COLUMNS: dict[str, tuple[str, str]] = {
    "metadata": ("TEXT", "JSONB"),
    "heartbeat_at": ("TEXT", "TIMESTAMPTZ"),
    "rearmed_checkpoint_id": ("TEXT", "TEXT"),
    # Read by the listing and the export only (``agent_sql``), never into a Decision.
    AGENT_COLUMN: ("TEXT", "TEXT"),
}
COLUMNS = ", ".join(COLUMN_NAMES)


def columns_of(present: set[str]) -> str:
    """The select list for a table holding the columns ``present``; missing added
    columns read as NULL."""
    return ", ".join(
        c if c in present or c not in ADDED_COLUMNS else f"NULL AS {c}" for c in COLUMN_NAMES
    )


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
        heartbeat_at=None if row["heartbeat_at"] is None else instant(row["heartbeat_at"]),
        rearmed_checkpoint_id=(
            None if row["rearmed_checkpoint_id"] is None else str(row["rearmed_checkpoint_id"])
        ),
    )


#: What ``/decisions?outcome=`` lists a claim the SDK is still carrying out as.
PENDING_OUTCOME = "pending"


#: What the listing says a vote's outcome is: it was counted, and changed nothing yet.
VOTE_OUTCOME = "voted"
#: The id half of a listing cursor that points at a vote: votes count their ids apart
#: from the decisions, so an entry is named by its kind and id together.
VOTE_CURSOR_PREFIX = "vote-"

#: The listing is one order over both tables, newest first: ``(time, source, id)``,
#: a decision's source 0 and a vote's 1, so entries of the same instant keep an order.
DECISION_SOURCE, VOTE_SOURCE = 0, 1


def listing_key(entry: DecisionEntry) -> tuple[str, str]:
    """Where the listing continues: ``(decided_at, id)`` of the page's last entry, the
    id of a vote written ``vote-<id>``."""
    d = entry.decision
    prefix = VOTE_CURSOR_PREFIX if d.kind == VOTE else ""
    return (d.decided_at, f"{prefix}{d.id}")


#: The largest id either database keeps (a signed 64-bit integer).
MAX_ID = 2**63 - 1


def cursor_id(text: str) -> int:
    """The id half of a listing cursor: an id either database can compare, in ASCII
    digits; anything else (a sign, ``²``, past 64 bits) is a 400."""
    digits = len(str(MAX_ID))
    if not (0 < len(text) <= digits and text.isascii() and text.isdigit()) or int(text) > MAX_ID:
        raise BadRequest(f"after: {text[:40]!r} is not a cursor this server gave out")
    return int(text)


def cursor_position(text: str) -> tuple[int, int]:
    """The id half of a listing cursor as ``(source, id)``; anything else is a 400."""
    if text.startswith(VOTE_CURSOR_PREFIX):
        return VOTE_SOURCE, cursor_id(text[len(VOTE_CURSOR_PREFIX) :])
    return DECISION_SOURCE, cursor_id(text)


def listing_sources(kind: str | None, outcome: str | None) -> tuple[bool, bool]:
    """Whether a listing under these filters reads the decisions, and the votes."""
    decisions = kind != VOTE and outcome != VOTE_OUTCOME
    votes = kind in (None, VOTE) and outcome in (None, VOTE_OUTCOME)
    return decisions, votes


def keyset_sql(time: str, id_: str, source: int, after_source: int, at: str, after_id: str) -> str:
    """The condition that continues a table of ``source`` (columns ``time``, ``id_``)
    after a cursor of ``after_source`` (placeholders ``at``, ``after_id``): the same
    source compares the pair; the other the time alone, ``<=`` when this table sorts
    below the cursor's at the same instant. ``after_id`` appears only for the first."""
    if source == after_source:
        return f"({time}, {id_}) < ({at}, {after_id})"
    return f"{time} {'<=' if source < after_source else '<'} {at}"


def agent_lookup(alias: str, *, stored: bool, runs: str | None) -> str | None:
    """The entry's agent over the table as ``alias``, NULL when nothing names it: the
    recorded one (``stored``: the table has the column), else the runs index's
    (``runs``: its table) for an entry written before agents were recorded. COALESCE
    evaluates its arguments in order and stops at the first not null, on both
    databases: the index is read only for the entries that record no agent. None when
    neither is there to read."""
    found = [f"{alias}.{AGENT_COLUMN}"] if stored else []
    if runs is not None:
        found.append(f"(SELECT r.agent FROM {runs} r WHERE r.execution_id = {alias}.execution_id)")
    if not found:
        return None
    return found[0] if len(found) == 1 else f"COALESCE({', '.join(found)})"


def agent_sql(alias: str, *, stored: bool, runs: str | None) -> str:
    """:func:`agent_lookup` as the listing shows it: empty when nothing names one."""
    lookup = agent_lookup(alias, stored=stored, runs=runs)
    return "''" if lookup is None else f"COALESCE({lookup}, '')"


#: Votes the listing leaves out: the one that completed its rule's count is the
#: approval that follows it, listed once, as that (as the run page shows it).
COMPLETED_BY_DECISION = (
    "NOT EXISTS (SELECT 1 FROM {table} x WHERE x.kind = '" + APPROVAL + "'"
    " AND x.execution_id = v.execution_id AND x.checkpoint_id = v.checkpoint_id"
    " AND x.actor = v.actor)"
)


def merged_page(
    decisions: Sequence[R],
    votes: Sequence[R],
    limit: int,
    time_of: Callable[[R, str], Any],
    decision_entry: Callable[[R], DecisionEntry],
    vote_entry: Callable[[R], DecisionEntry],
) -> DecisionPage:
    """One page of the listing from each table's first ``limit + 1`` rows under the
    same cursor, newest first across both; only the rows kept become entries."""
    keyed = [(time_of(r, "decided_at"), DECISION_SOURCE, int(r["id"]), r) for r in decisions]
    keyed += [(time_of(r, "voted_at"), VOTE_SOURCE, int(r["id"]), r) for r in votes]
    if votes and decisions:
        keyed.sort(key=lambda k: k[:3], reverse=True)
    entries = tuple(
        (vote_entry if source == VOTE_SOURCE else decision_entry)(row)
        for _, source, _, row in keyed[:limit]
    )
    next_key = listing_key(entries[-1]) if len(keyed) > limit and entries else None
    return DecisionPage(entries=entries, next_key=next_key)


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


def abandoned(decision: Decision, lease_seconds: float = ABANDONED_AFTER_SECONDS) -> bool:
    """Whether a claim with no outcome has gone quiet long enough to be taken over."""
    if decision.outcome is None:
        try:
            started = datetime.fromisoformat(decision.heartbeat_at or decision.decided_at)
        except ValueError:
            return False
        return (datetime.now(UTC) - started).total_seconds() > lease_seconds
    return False


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


def vote_as_decision(row: NamedRow, instant: Callable[[Any], str] = str) -> Decision:
    """A row of ``VOTE_COLUMNS`` as an entry of the record: an approval (kind
    ``vote``) whose outcome is that it was counted; ``metadata`` holds the fields
    the person filled in."""
    at = instant(row["voted_at"])
    return Decision(
        id=int(row["id"]),
        kind=VOTE,
        execution_id=str(row["execution_id"]),
        checkpoint_id=str(row["checkpoint_id"]),
        approved=True,
        actor=str(row["actor"]),
        reason=str(row["reason"] or ""),
        decided_at=at,
        outcome=VOTE_OUTCOME,
        detail=None,
        finished_at=at,
        metadata=metadata_of(row["fields"]),
    )


#: An exported entry's fields, in order (``DecisionLog.list_export``): ``approved`` is
#: true or false (1 or 0 from SQLite), None for a resume; ``outcome`` is ``pending``
#: while the SDK is still going.
EXPORT_FIELDS = (
    "id",
    "kind",
    "execution_id",
    "checkpoint_id",
    "agent",
    "approved",
    "approver",
    "reason",
    "decided_at",
    "outcome",
    "detail",
    "finished_at",
)
_EXPORT_ID = EXPORT_FIELDS.index("id")
_EXPORT_KIND = EXPORT_FIELDS.index("kind")
_EXPORT_AT = EXPORT_FIELDS.index("decided_at")
_EXPORT_FINISHED = EXPORT_FIELDS.index("finished_at")


def export_select(source: int, alias: str, agent: str, outcome: str) -> str:
    """The select list of :data:`EXPORT_FIELDS` over the decisions (``DECISION_SOURCE``)
    or the votes, as ``alias``; ``agent`` is the run's agent expression and
    ``outcome`` the placeholder of the pending outcome (or the vote's)."""
    if source == VOTE_SOURCE:
        return (
            f"{alias}.id, '{VOTE}', {alias}.execution_id, {alias}.checkpoint_id, {agent}, 1,"
            f" {alias}.actor, {alias}.reason, {alias}.voted_at, {outcome}, NULL,"
            f" {alias}.voted_at"
        )
    return (
        f"{alias}.id, {alias}.kind, {alias}.execution_id, {alias}.checkpoint_id, {agent},"
        f" {alias}.approved, {alias}.actor, {alias}.reason, {alias}.decided_at,"
        f" COALESCE({alias}.outcome, {outcome}), {alias}.detail, {alias}.finished_at"
    )


def merged_export(
    decisions: Sequence[tuple[Any, ...]],
    votes: Sequence[tuple[Any, ...]],
    limit: int,
    instant: Callable[[Any], str] | None = None,
) -> ExportPage:
    """One export page from each table's first ``limit + 1`` rows (newest first, both),
    merged in the listing's order; ``instant`` turns the database's time values into
    ISO text (PostgreSQL's), after the merge ordered them as they are."""

    if votes and decisions:
        merged: Iterator[tuple[Any, ...]] = heapq.merge(
            decisions,
            votes,
            key=lambda row: (
                row[_EXPORT_AT],
                VOTE_SOURCE if row[_EXPORT_KIND] == VOTE else DECISION_SOURCE,
                row[_EXPORT_ID],
            ),
            reverse=True,
        )
        rows = list(itertools.islice(merged, limit + 1))
    else:
        rows = list(decisions or votes)
    more = len(rows) > limit
    del rows[limit:]
    if instant is not None:
        at, finished = _EXPORT_AT, _EXPORT_FINISHED
        rows = [
            (
                *row[:at],
                instant(row[at]),
                *row[at + 1 : finished],
                None if row[finished] is None else instant(row[finished]),
                *row[finished + 1 :],
            )
            for row in rows
        ]
    next_key = None
    if more and rows:
        last = rows[-1]
        prefix = VOTE_CURSOR_PREFIX if last[_EXPORT_KIND] == VOTE else ""
        next_key = (str(last[_EXPORT_AT]), f"{prefix}{last[_EXPORT_ID]}")
    return ExportPage(rows=tuple(rows), next_key=next_key)
