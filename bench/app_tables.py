"""``--fresh-app-tables``: a reused store's app tables put back as the store was built.

A built store is reused run after run (``bench.store_cache``), and what a server writes
into the app's own tables stays with it: on SQLite they live in the store's file
(``localui_decisions``, ``localui_votes``, ``localui_users``,
``localui_notifications`` …), so a later run's watcher finds every pause announced
already and its decision record holds what the last run's edits added. Two runs on
the same cached store then measure different work.

With the flag, every table of the app's (named ``localui_…``; their indexes go with
them) is dropped from the store before any server starts, so the server makes them
anew as on a first start, and the bench's own decision record (a decision per run, its
votes) is loaded again as a build loads it: the record's pages are timed on the same
entries as on a store built this run. The SDK's tables are never touched. The runs
index is the app's too, but it never outlives a run: on SQLite it lives in each
measurement's fresh cache directory, and on PostgreSQL in an app schema of this run's
own that every cold start drops (its record is copied in from the SQLite file, so it
is the one loaded here).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

from bench.stores import RunCopy, add_record

#: What the app's own tables in a SQLite store are named (the SDK's never are).
PREFIX = "localui_"


def app_tables(path: Path) -> tuple[str, ...]:
    """The app's tables in the SQLite store at ``path``."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return tuple(
            str(r[0])
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND substr(name, 1, ?) = ?"
                " ORDER BY name",
                (len(PREFIX), PREFIX),
            )
        )


def fresh_app_tables(path: Path, manifest: Sequence[RunCopy], runs: int) -> tuple[str, ...]:
    """Drop the app's tables from the store at ``path`` and load the bench's decision
    record again (on ``manifest``'s runs); the tables dropped."""
    if not manifest:
        raise RuntimeError(f"{path}: no list of its runs to load the decision record on")
    dropped = app_tables(path)
    with closing(sqlite3.connect(path, timeout=60)) as conn, conn:
        for table in dropped:
            conn.execute(f'DROP TABLE "{table}"')
    add_record(path, manifest, runs)
    return dropped
