"""Prune on PostgreSQL: the SDK's own ``PostgresCheckpointer.prune``, never our SQL."""

from __future__ import annotations

from datetime import timedelta

from localui.backends.postgres.pool import one_line, server_of
from localui.errors import Unavailable


class PostgresPrune:
    """The SDK's ``PostgresCheckpointer.prune``, with a pool only while it runs.

    The app prunes rarely; a checkpointer kept for it would hold a pool of
    connections (and its threads) for the life of the process.
    """

    def __init__(self, dsn: str, *, schema: str) -> None:
        self._dsn = dsn
        self._schema = schema

    def prune(self, older_than: timedelta) -> int:
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        checkpointer = PostgresCheckpointer(self._dsn, schema=self._schema, max_pool_size=1)
        try:
            deleted: int = checkpointer.prune(older_than)
        except Exception as exc:
            import psycopg
            from psycopg_pool import PoolTimeout

            if isinstance(exc, psycopg.OperationalError | PoolTimeout):
                raise Unavailable(
                    f"PostgreSQL at {server_of(self._dsn)} is not answering: {one_line(str(exc))}"
                ) from exc
            raise
        finally:
            checkpointer.close()
        return deleted
