"""The PostgreSQL backend: the SDK's ``PostgresCheckpointer`` schema, read through a
pool, with the decision record and the users table in a schema of the app's own."""

from __future__ import annotations

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
from localui.backends.postgres.changes import PostgresChangeSource
from localui.backends.postgres.decisions import PostgresDecisionLog
from localui.backends.postgres.prune import PostgresPrune
from localui.backends.postgres.store import PostgresStore
from localui.backends.postgres.users import PostgresUsers
from localui.backends.urls import redact


class PostgresBackend:
    """:class:`localui.backends.base.Backend` over one schema of a PostgreSQL database."""

    kind = runs.POSTGRES

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "fastaiagent",
        app_schema: str = "localui",
        runs_index: bool = True,
        store: PostgresStore | None = None,
    ):
        """``runs_index``: keep the runs index in ``app_schema`` (a read-only app
        creates nothing there and reads the SDK's tables directly). ``store``: one
        opened already over the same schemas, as :class:`SQLiteBackend` takes one."""
        self.dsn = dsn
        self.store = (
            store
            if store is not None
            else PostgresStore(dsn, schema=schema, app_schema=app_schema, runs_index=runs_index)
        )
        self.schema = self.store.schema
        self.app_schema = self.store.app_schema
        self.label = f"{redact(dsn)} (schema {self.schema})"
        self.target = StoreTarget(pg_dsn=dsn, pg_schema=schema)

    def change_source(self) -> ChangeSource:
        return PostgresChangeSource(self.dsn, schema=self.schema, app_schema=self.app_schema)

    def decision_log(
        self, *, writable: bool, lease_seconds: float = ABANDONED_AFTER_SECONDS
    ) -> DecisionLog:
        return PostgresDecisionLog(
            self.dsn,
            schema=self.app_schema,
            writable=writable,
            store_schema=self.schema,
            lease_seconds=lease_seconds,
        )

    def outbox(self) -> Outbox:
        from localui.backends.postgres.notifications import PostgresOutbox

        return PostgresOutbox(self.dsn, schema=self.app_schema)

    def session_keys(self, *, writable: bool) -> SessionKeys:
        from localui.backends.postgres.keys import PostgresKeys

        return PostgresKeys(self.dsn, schema=self.app_schema, writable=writable)

    def users(self, *, writable: bool) -> UserDirectory:
        return PostgresUsers(self.dsn, schema=self.app_schema, writable=writable)

    def audit_log(self, *, writable: bool) -> AuditLog:
        from localui.backends.postgres.audit import PostgresAuditLog

        return PostgresAuditLog(self.dsn, schema=self.app_schema, writable=writable)

    def notes(self, *, writable: bool) -> NoteLog:
        from localui.backends.postgres.notes import PostgresNotes

        return PostgresNotes(self.dsn, schema=self.app_schema, writable=writable)

    def deadlines(self, *, writable: bool) -> Deadlines:
        from localui.backends.postgres.deadlines import PostgresDeadlines

        return PostgresDeadlines(self.dsn, schema=self.app_schema, writable=writable)

    def checkpointer(self) -> Prunes:
        return PostgresPrune(self.dsn, schema=self.schema)

    def close(self) -> None:
        self.store.close()
