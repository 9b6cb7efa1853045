"""How far the notification watchers of a store have looked: ``localui_watch``, a
table localui owns beside ``localui_notifications``.

It holds one row per store (named :data:`SWEEP`): ``looked_at``, the time (seconds
since the epoch, on the watchers' clocks) up to which a watcher's sweep has offered
every run that failed and every approval decided to the outbox, and recorded them.
A watcher starting offers what came after it, so what happened while no localui ran
is announced once, and nothing older is offered again. A sweep moves it only after
its events are recorded, and only forward (:data:`ADVANCE_SQL`): every process on the
store shares it, and a slower one never takes it back.

This module holds what both backends' tables share; each backend has a small class
over it (``backends/sqlite/watch.py``, ``backends/postgres/watch.py``).
"""

from __future__ import annotations

from localui.backends.shared import NamedRow

TABLE = "localui_watch"
#: The row of the sweeps' look at failed runs and decisions.
SWEEP = "sweep"

COLUMN_NAMES = ("name", "looked_at")
COLUMNS = ", ".join(COLUMN_NAMES)

#: Moves a row forward, or makes it: ``{table}`` and ``{mark}`` filled in; the name, then
#: the time. A process that read less than another (it started its sweep earlier) leaves
#: the row where the other put it.
ADVANCE_SQL = (
    "INSERT INTO {table} AS w (name, looked_at) VALUES ({mark}, {mark})"
    " ON CONFLICT (name) DO UPDATE SET looked_at = excluded.looked_at"
    " WHERE w.looked_at < excluded.looked_at"
)


def looked_at_of(row: NamedRow | None) -> float | None:
    """A row's ``looked_at``, or None when the store has no row (a first start)."""
    return None if row is None else float(row["looked_at"])
