"""Notes on a pause: ``localui_notes``, a table localui owns, beside ``localui_decisions``.

A note is what one person who may decide a pause tells the others ("called the
customer, waiting for the invoice"): its text, who wrote it and when, bound to the
paused row (``checkpoint_id``) it was written about. It is no decision: it never
enters the decision record, never resumes anything and never counts as a vote.

The table lives in the SQLite store's own file and in the app schema on PostgreSQL,
so every process serving the store shows the same notes. A writable process makes it;
a read-only one (``--read-only``, ``localui export``) reads no notes until it exists.

This module holds what both backends' tables share: the name, the columns in the order
every SELECT lists them, the indexes, and the row mapping.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TABLE = "localui_notes"

COLUMN_NAMES = ("id", "execution_id", "checkpoint_id", "author", "text", "created_at")
COLUMNS = ", ".join(COLUMN_NAMES)
#: (index name suffix, columns): a pause's notes in order (cards, the run page), and
#: the notes written since a time (what the watcher offers).
INDEXES = (
    ("pause", "execution_id, checkpoint_id, id"),
    ("time", "created_at, id"),
)
#: The most notes one read hands back for a page of pauses or a run: a card shows a
#: conversation, not an archive, and a page must stay quick whatever was written.
MAX_NOTES = 200


@dataclass(frozen=True, slots=True)
class Note:
    """One note, as kept. ``created_at``: ISO 8601 in UTC."""

    id: int
    execution_id: str
    checkpoint_id: str
    author: str
    text: str
    created_at: str


def note_from_values(values: Sequence[Any]) -> Note:
    """A row of :data:`COLUMNS`, by position; ``created_at`` already as ISO text."""
    id, execution_id, checkpoint_id, author, text, created_at = values
    return Note(
        id=int(id),
        execution_id=str(execution_id),
        checkpoint_id=str(checkpoint_id),
        author=str(author),
        text=str(text),
        created_at=str(created_at),
    )


def by_pause(notes: Iterable[Note]) -> Mapping[tuple[str, str], tuple[Note, ...]]:
    """Notes grouped by ``(execution_id, checkpoint_id)``, each group in the order read."""
    grouped: dict[tuple[str, str], list[Note]] = {}
    for note in notes:
        grouped.setdefault((note.execution_id, note.checkpoint_id), []).append(note)
    return {key: tuple(group) for key, group in grouped.items()}
