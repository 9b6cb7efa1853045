"""The benchmark on PostgreSQL: a server to measure on, and the built stores copied into it.

The stores are built as SQLite files from rows the SDK wrote (``bench.stores``);
each is then copied into a schema the SDK's own ``PostgresCheckpointer.setup``
made, table by table with ``COPY``, so the PostgreSQL store holds the same runs
with the same ids. The server is the one in ``LOCALUI_TEST_PG_DSN`` when set
(the test command starts one), else a throwaway cluster started here the same
way (``initdb`` in a temp dir, fsync off, a free loopback port).
"""

from __future__ import annotations

import hashlib
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
def server(log: Log, data: Path | None = None) -> Iterator[str]:
    """A PostgreSQL server's DSN, for the length of the block.

    ``data``: the cluster's directory, kept after the block (the stores copied
    into it are reused by the next run); None for a throwaway cluster."""
    dsn = os.environ.get("LOCALUI_TEST_PG_DSN", "")
    if dsn:
        yield dsn
        return
    bin_dir = _bin_dir()
    keep = data is not None
    run_as: list[str] = []
    if os.geteuid() == 0:
        run_as = ["runuser", "-u", "postgres", "--"]
    if data is None:
        data = Path(tempfile.mkdtemp(prefix="localui-bench-pg-"))
    elif run_as and not _reachable(data.parent, run_as):
        # The postgres user cannot reach --workdir (/tmp closed to other users, say).
        digest = hashlib.sha256(str(data).encode()).hexdigest()[:8]
        data = Path("/var/tmp") / f"localui-bench-postgres-{digest}"
    data.mkdir(parents=True, exist_ok=True)
    if run_as:
        shutil.chown(data, "postgres")

    def as_owner(*command: str) -> None:
        subprocess.run([*run_as, *command], cwd=data, check=True, capture_output=True, timeout=120)

    fresh = not (data / "data" / "PG_VERSION").is_file()
    if fresh:
        shutil.rmtree(data / "data", ignore_errors=True)
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
    else:
        # A cluster an earlier run left running (it was killed): stop it first.
        if (data / "data" / "postmaster.pid").is_file():
            subprocess.run(
                [*run_as, str(bin_dir / "pg_ctl"), "-D", f"{data}/data", "-m", "fast", "stop"],
                cwd=data,
                capture_output=True,
                timeout=120,
                check=False,
            )
    port = free_port()
    as_owner(
        str(bin_dir / "pg_ctl"),
        "-D",
        f"{data}/data",
        "-l",
        f"{data}/server.log",
        "-w",
        "-t",
        "300",
        "-o",
        f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off",
        "start",
    )
    try:
        if fresh:
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
        log(f"PostgreSQL {'started' if fresh else 'started again'} at {dsn} ({data})")
        yield dsn
    finally:
        # A clean stop: the next run finds its stores without crash recovery.
        as_owner(str(bin_dir / "pg_ctl"), "-D", f"{data}/data", "-m", "fast", "-w", "stop")
        if not keep:
            shutil.rmtree(data, ignore_errors=True)


def _reachable(directory: Path, run_as: list[str]) -> bool:
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([*run_as, "test", "-x", str(directory)], check=False, timeout=30)
    return done.returncode == 0


def copied_key(dsn: str, schema: str) -> str | None:
    """The key a finished copy left on ``schema`` (its comment), or None."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s",
            (schema,),
        ).fetchone()
    return str(row[0]) if row is not None and row[0] is not None else None


def copy_store(sqlite_path: Path, dsn: str, schema: str, key: str = "") -> float:
    """The SDK's tables of ``sqlite_path`` into a new ``schema``; seconds it took.
    ``key`` is left as the schema's comment, in the copy's own transaction."""
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
            if key:
                dst.execute(f"COMMENT ON SCHEMA {schema} IS {_literal(key)}")
        with psycopg.connect(dsn, autocommit=True) as dst:
            # Outside the copy's transaction, as autovacuum would do later: the planner's
            # statistics, and a visibility map so readers of the index skip the heap.
            dst.execute(f"VACUUM (ANALYZE) {schema}.checkpoints")
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


def copy_record(sqlite_path: Path, dsn: str, app_schema: str) -> int:
    """The decision record of ``sqlite_path`` (its decisions and votes) into the tables
    a localui server just made in ``app_schema``, which each cold start drops: the
    PostgreSQL bench lists, exports and counts the same record as the SQLite one.
    Returns the entries copied."""
    import psycopg

    from localui.backends.decisions import TABLE, VOTES_TABLE

    src = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    copied = 0
    try:
        with psycopg.connect(dsn) as dst:
            for table in (TABLE, VOTES_TABLE):
                has = src.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
                ).fetchone()
                if has is None:
                    continue
                copied += _copy_app_table(src, dst, app_schema, table)
        with psycopg.connect(dsn, autocommit=True) as dst:
            for table in (TABLE, VOTES_TABLE):
                dst.execute(f"VACUUM (ANALYZE) {app_schema}.{table}")
    finally:
        src.close()
    return copied


def _copy_app_table(src: sqlite3.Connection, dst: object, schema: str, table: str) -> int:
    """One of localui's tables, its rows in id order under new ids (the server's
    identity column gives them), the columns both sides have."""
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
    columns = [
        r[1]
        for r in src.execute(f"PRAGMA table_info({table})")
        if r[1] in pg_types and r[1] != "id"
    ]
    booleans = [i for i, c in enumerate(columns) if pg_types[c] == "boolean"]
    count = 0
    with conn.cursor().copy(f"COPY {schema}.{table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in src.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY id"):
            values = list(row)
            for i in booleans:
                if values[i] is not None:
                    values[i] = bool(values[i])
            copy.write_row(values)
            count += 1
    return count


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
