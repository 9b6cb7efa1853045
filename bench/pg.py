"""The benchmark on PostgreSQL: a server to measure on, and the built stores copied into it.

The stores are built as SQLite files from rows the SDK wrote (``bench.stores``);
each is then copied into a schema the SDK's own ``PostgresCheckpointer.setup``
made, table by table with ``COPY``, so the PostgreSQL store holds the same runs
with the same ids. The server is the one in ``LOCALUI_TEST_PG_DSN`` when set
(the test command starts one), else a throwaway cluster started here the same
way (``initdb`` in a temp dir, fsync off, a free loopback port).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.servers import free_port

Log = Callable[[str], None]

#: The SDK's tables, in the order they are copied.
TABLES = ("checkpoints", "pending_interrupts", "idempotency_cache")


def _bin_dir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
    return found[-1].parent


@contextmanager
def server(log: Log) -> Iterator[str]:
    """A PostgreSQL server's DSN, for the length of the block."""
    dsn = os.environ.get("LOCALUI_TEST_PG_DSN", "")
    if dsn:
        yield dsn
        return
    bin_dir = _bin_dir()
    data = Path(tempfile.mkdtemp(prefix="localui-bench-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(data, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]

    def as_owner(*command: str) -> None:
        subprocess.run([*run_as, *command], cwd=data, check=True, capture_output=True, timeout=120)

    as_owner(
        str(bin_dir / "initdb"),
        "-D",
        f"{data}/data",
        "-A",
        "trust",
        "-U",
        "postgres",
        "--encoding=UTF8",
        "--locale=C",
        "--no-sync",
    )
    port = free_port()
    as_owner(
        str(bin_dir / "pg_ctl"),
        "-D",
        f"{data}/data",
        "-l",
        f"{data}/server.log",
        "-w",
        "-o",
        f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off",
        "start",
    )
    try:
        subprocess.run(
            [
                str(bin_dir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "postgres",
                "localui_bench",
            ],
            check=True,
            timeout=60,
        )
        dsn = f"postgresql://postgres@127.0.0.1:{port}/localui_bench"
        log(f"PostgreSQL started at {dsn}")
        yield dsn
    finally:
        as_owner(str(bin_dir / "pg_ctl"), "-D", f"{data}/data", "-m", "immediate", "-w", "stop")
        shutil.rmtree(data, ignore_errors=True)


def copy_store(sqlite_path: Path, dsn: str, schema: str) -> float:
    """The SDK's tables of ``sqlite_path`` into a new ``schema``; seconds it took."""
    import psycopg
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    sdk = PostgresCheckpointer(dsn, schema=schema, max_pool_size=1)
    try:
        sdk.setup()
    finally:
        sdk.close()
    src = sqlite3.connect(sqlite_path)
    try:
        with psycopg.connect(dsn) as dst:
            for table in TABLES:
                _copy_table(src, dst, schema, table)
            dst.execute(f"ANALYZE {schema}.checkpoints")
    finally:
        src.close()
    return time.perf_counter() - started


def _copy_table(src: sqlite3.Connection, dst: object, schema: str, table: str) -> None:
    from typing import Any

    conn: Any = dst
    pg_types = {
        str(name): str(kind)
        for name, kind in conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = %s",
            (schema, table),
        ).fetchall()
    }
    columns = [r[1] for r in src.execute(f"PRAGMA table_info({table})") if r[1] in pg_types]
    booleans = [i for i, c in enumerate(columns) if pg_types[c] == "boolean"]
    with conn.cursor().copy(f"COPY {schema}.{table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in src.execute(f"SELECT {', '.join(columns)} FROM {table}"):
            values = list(row)
            for i in booleans:
                if values[i] is not None:
                    values[i] = bool(values[i])
            copy.write_row(values)


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
