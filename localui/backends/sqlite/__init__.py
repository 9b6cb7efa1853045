"""The SQLite backend: the SDK's ``local.db`` file, with the app's runs index beside
it and the decision record and users table inside it."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from localui import runs
from localui.backends.base import (
    AuditLog,
    ChangeSource,
    Deadlines,
    DecisionLog,
    NoteLog,
    Outbox,
    Prunes,
    SessionKeys,
    StoreTarget,
    UserDirectory,
)
from localui.backends.decisions import ABANDONED_AFTER_SECONDS
from localui.backends.sqlite.changes import SQLiteChangeSource
from localui.backends.sqlite.decisions import SQLiteDecisionLog
from localui.backends.sqlite.store import SQLiteStore
from localui.backends.sqlite.users import SQLiteUsers


class SQLiteBackend:
    """:class:`localui.backends.base.Backend` over one SQLite file."""

    kind = runs.SQLITE

    def __init__(self, path: str | Path, *, store: SQLiteStore | None = None) -> None:
        self.path = Path(path)
        self.store = store if store is not None else SQLiteStore(self.path)
        self.label = str(self.path)
        self.target = StoreTarget(sqlite_path=self.path)

    def change_source(self) -> ChangeSource:
        return SQLiteChangeSource(self.store.path)

    def decision_log(
        self, *, writable: bool, lease_seconds: float = ABANDONED_AFTER_SECONDS
    ) -> DecisionLog:
        return SQLiteDecisionLog(
            self.path,
            writable=writable,
            runs_index=self.store.index_path,
            lease_seconds=lease_seconds,
        )

    def outbox(self) -> Outbox:
        from localui.backends.sqlite.notifications import SQLiteOutbox

        return SQLiteOutbox(self.path)

    def session_keys(self, *, writable: bool) -> SessionKeys:
        from localui.backends.sqlite.keys import SQLiteKeys

        return SQLiteKeys(self.path, writable=writable)

    def users(self, *, writable: bool) -> UserDirectory:
        return SQLiteUsers(self.path, writable=writable)

    def audit_log(self, *, writable: bool) -> AuditLog:
        from localui.backends.sqlite.audit import SQLiteAuditLog

        return SQLiteAuditLog(self.path, writable=writable)

    def notes(self, *, writable: bool) -> NoteLog:
        from localui.backends.sqlite.notes import SQLiteNotes

        return SQLiteNotes(self.path, writable=writable)

    def deadlines(self, *, writable: bool) -> Deadlines:
        from localui.backends.sqlite.deadlines import SQLiteDeadlines

        return SQLiteDeadlines(self.path, writable=writable)

    def checkpointer(self) -> Prunes:
        from fastaiagent.checkpointers import SQLiteCheckpointer

        return cast(Prunes, SQLiteCheckpointer(str(self.path)))

    def close(self) -> None:
        self.store.close()
