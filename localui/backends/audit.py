"""The audit log's table: ``localui_audit``, beside ``localui_decisions``.

Both backends keep the rows of :mod:`localui.audit` here: the name, the columns in
the order every SELECT lists them, the row mapper, and the indexes the ``/audit``
filters use. Each backend serialises its appends (SQLite's write lock, PostgreSQL's
advisory lock) so every row reads the true last hash, however many processes append.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from localui.audit import AuditEntry, AuditQuery

TABLE = "localui_audit"

COLUMN_NAMES = (
    "id",
    "at",
    "actor",
    "via",
    "address",
    "action",
    "method",
    "path",
    "execution_id",
    "detail",
    "status",
    "outcome",
    "prev_hash",
    "hash",
)
COLUMNS = ", ".join(COLUMN_NAMES)
#: (index name suffix, columns): one per filter of ``/audit``, each ending in ``id`` so
#: a filtered page reads its rows newest first straight from the index.
INDEXES = (
    ("actor", "actor, id"),
    ("action", "action, id"),
    ("run", "execution_id, id"),
    ("at", "at"),
)
#: Rows ``localui audit verify`` and ``export`` read at a time.
WALK_BATCH = 5000


def entry_from_values(values: Sequence[Any]) -> AuditEntry:
    """A row of :data:`COLUMNS` (by position, ``at`` as the text that was hashed) as an
    :class:`AuditEntry`; taken as it comes: ``localui audit verify`` makes a million."""
    return AuditEntry(*values)


def entry_values(entry: AuditEntry) -> tuple[Any, ...]:
    """An entry's values in the order of :data:`COLUMNS`, for an INSERT."""
    return tuple(getattr(entry, name) for name in COLUMN_NAMES)


def filters(query: AuditQuery, placeholder: str) -> tuple[str, list[Any]]:
    """The WHERE clause of a page (``TRUE`` when there is no filter) and its values."""
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("actor", query.actor),
        ("action", query.action),
        ("execution_id", query.execution_id),
    ):
        if value is not None:
            clauses.append(f"{column} = {placeholder}")
            params.append(value)
    if query.since is not None:
        clauses.append(f"at >= {placeholder}")
        params.append(query.since)
    if query.until is not None:
        clauses.append(f"at < {placeholder}")
        params.append(query.until)
    if query.after is not None:
        clauses.append(f"id < {placeholder}")
        params.append(query.after)
    return (" AND ".join(clauses) or "TRUE"), params
