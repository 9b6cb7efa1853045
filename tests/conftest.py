"""Shared fixtures: a real store the real SDK wrote, copies to damage, and the app.

The seeded store is written once per session by ``localui.demo.scenarios.seed``
(real agents in real child processes, crashes included) and never changed:
tests that change a store take a copy (SQLite's backup API, so a WAL store is
copied whole). Rows are built by hand only for shapes the SDK cannot write:
an old schema, corrupt JSON, combinations no run produces.
"""

from __future__ import annotations

import json
import sqlite3
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import pytest
from helpers import LOOPBACK_CLIENT, NO_SIGN_IN
from starlette.exceptions import StarletteDeprecationWarning

# Starlette 1.x warns at import when the TestClient runs on ``httpx`` rather
# than ``httpx2``; the project pins ``httpx``, and warnings are errors here.
with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore",
        message="Using `httpx` with `starlette.testclient` is deprecated",
        category=StarletteDeprecationWarning,
    )
    from starlette.testclient import TestClient

from localui.app import create_app
from localui.backends.sqlite.store import SQLiteStore
from localui.demo.scenarios import SeedReport, seed
from localui.settings import Settings


def sdk_version() -> tuple[int, int]:
    """The installed fastaiagent's (major, minor): the floor run tests an older one."""
    from importlib.metadata import version

    major, minor = version("fastaiagent").split(".")[:2]
    return int(major), int(minor)


#: What every address in the app tests looks like: a loopback Host it answers to.
BASE_URL = "http://127.0.0.1:8765"


@dataclass(frozen=True, slots=True)
class Seeded:
    """The session's seeded store: where it is and which run each scenario wrote."""

    report: SeedReport
    path: Path

    #: The state each scenario's run must be in (DESIGN.md's table).
    STATES: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            "completed": "completed",
            "paused-1": "paused",
            "paused-2": "paused",
            "paused-3": "paused",
            "crashed-in-tool": "unfinished",
            "crashed-waiting-on-model": "unfinished",
            "failed": "failed",
            "two-tools-first-pauses": "paused",
            "idempotent-resumed": "completed",
            "fork-of-completed": "completed",
        }
    )

    def id(self, scenario: str) -> str:
        return self.report.run_id(scenario)

    def ids(self, state: str) -> set[str]:
        """Execution ids of the scenarios whose run must be in ``state``."""
        return {self.id(name) for name, s in self.STATES.items() if s == state}

    def name_of(self, execution_id: str) -> str:
        return {v: k for k, v in self.report.runs.items()}[execution_id]


@pytest.fixture(scope="session", autouse=True)
def _sdk_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep the SDK used in this process away from the working directory.

    It writes traces and ``.fastaiagent/config.toml`` into the cwd unless told
    otherwise, and caches its config on first use: this runs before any test.
    """
    from fastaiagent._internal import project

    sandbox = tmp_path_factory.mktemp("sdk-default")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTAIAGENT_TRACE_ENABLED", "false")
        mp.setenv("FASTAIAGENT_LOCAL_DB", str(sandbox / "local.db"))
        project.set_project_id("localui-tests")
        try:
            yield
        finally:
            project.reset_for_testing()


@pytest.fixture(scope="session")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    report = seed(tmp_path_factory.mktemp("seeded") / "local.db")
    return Seeded(report=report, path=report.store)


@pytest.fixture(scope="session")
def seed_report(seeded: Seeded) -> SeedReport:
    return seeded.report


@pytest.fixture(scope="session")
def store(seeded: Seeded) -> Iterator[SQLiteStore]:
    """The read model over the seeded store; shared, so never write through it."""
    opened = SQLiteStore(seeded.path)
    yield opened
    opened.close()


def backup(source: Path, target: Path) -> Path:
    """A consistent copy of a SQLite store, WAL content included."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return target


@pytest.fixture
def copy_store(tmp_path: Path, seeded: Seeded) -> Callable[[], Path]:
    """Make a fresh copy of the seeded store in this test's directory."""
    made: list[Path] = []

    def make() -> Path:
        target = tmp_path / f"copy-{len(made)}.db"
        made.append(backup(seeded.path, target))
        return target

    return make


@pytest.fixture(scope="session")
def session_copy(seeded: Seeded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the seeded store shared by the session, for readers that may take
    a write lock (the SDK's checkpointer runs its migrations on first use)."""
    return backup(seeded.path, tmp_path_factory.mktemp("session-copy") / "local.db")


@pytest.fixture
def store_copy(copy_store: Callable[[], Path]) -> Path:
    """One copy of the seeded store, for a test that changes it."""
    return copy_store()


class Raw:
    """Plain sqlite3 on a store: the ground truth tests compare against, and the
    hand for rows the SDK cannot write."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            return conn.execute(sql, tuple(params)).fetchall()
        finally:
            conn.close()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        conn = sqlite3.connect(self.path)
        try:
            with conn:
                return conn.execute(sql, tuple(params)).rowcount
        finally:
            conn.close()

    def rows(self, execution_id: str) -> list[sqlite3.Row]:
        """A run's rows in the order written (as the SDK's ``get_last`` sees it)."""
        return self.query(
            "SELECT * FROM checkpoints WHERE execution_id = ? ORDER BY created_at, rowid",
            (execution_id,),
        )

    def insert_checkpoint(self, **columns: Any) -> None:
        names = ", ".join(columns)
        marks = ", ".join("?" for _ in columns)
        self.execute(f"INSERT INTO checkpoints ({names}) VALUES ({marks})", list(columns.values()))


@pytest.fixture
def raw() -> Callable[[Path], Raw]:
    return Raw


#: ``checkpoints`` as the SDK first created it (``fastaiagent/ui/db.py``, migration 1):
#: no checkpoint_id, parent_checkpoint_id, interrupt_*, agent_path, synced,
#: sync_error or step_type, and neither pending_interrupts nor idempotency_cache.
V1_CHECKPOINTS = """CREATE TABLE checkpoints (
    id                 TEXT PRIMARY KEY,
    chain_name         TEXT NOT NULL,
    execution_id       TEXT NOT NULL,
    node_id            TEXT NOT NULL,
    node_index         INTEGER,
    status             TEXT DEFAULT 'completed',
    state_snapshot     TEXT DEFAULT '{}',
    node_input         TEXT DEFAULT '{}',
    node_output        TEXT DEFAULT '{}',
    iteration          INTEGER DEFAULT 0,
    iteration_counters TEXT DEFAULT '{}',
    created_at         TEXT
)"""

#: Migration 2 added these, and the two tables below, before synced/sync_error/step_type.
V2_COLUMNS = (
    "checkpoint_id TEXT",
    "parent_checkpoint_id TEXT",
    "interrupt_reason TEXT",
    "interrupt_context TEXT DEFAULT '{}'",
)
V2_TABLES = (
    """CREATE TABLE idempotency_cache (
        execution_id TEXT NOT NULL,
        function_key TEXT NOT NULL,
        result       TEXT NOT NULL,
        created_at   TEXT NOT NULL,
        PRIMARY KEY (execution_id, function_key)
    )""",
    """CREATE TABLE pending_interrupts (
        execution_id TEXT NOT NULL PRIMARY KEY,
        chain_name   TEXT NOT NULL,
        node_id      TEXT NOT NULL,
        reason       TEXT NOT NULL,
        context      TEXT NOT NULL,
        agent_path   TEXT,
        created_at   TEXT NOT NULL
    )""",
)


def _snapshot(*user_texts: str) -> str:
    return json.dumps(
        {"messages": [{"role": "user", "content": text} for text in user_texts], "turn": 0}
    )


def build_v1_store(path: Path) -> Path:
    """A store as the first SDK wrote it: three runs, no durability columns."""
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute(V1_CHECKPOINTS)
            rows = [
                ("v1-a", "old-bot", "old-at-tool", "turn:0", 0, "completed", "{}"),
                (
                    "v1-b",
                    "old-bot",
                    "old-at-tool",
                    "turn:0/tool:lookup",
                    0,
                    "completed",
                    '{"sku": "Z-42"}',
                ),
                ("v1-c", "old-bot", "old-at-turn", "turn:0", 0, "completed", "{}"),
                ("v1-d", "old-bot", "old-at-turn", "turn:1", 1, "completed", "{}"),
                ("v1-e", "old-chain", "old-interrupted", "review", 0, "interrupted", "{}"),
            ]
            for i, (cid, chain, run, node, index, status, node_input) in enumerate(rows):
                conn.execute(
                    "INSERT INTO checkpoints (id, chain_name, execution_id, node_id, node_index,"
                    " status, state_snapshot, node_input, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        cid,
                        chain,
                        run,
                        node,
                        index,
                        status,
                        _snapshot(f"old request {run}"),
                        node_input,
                        f"2024-01-01T00:00:0{i}+00:00",
                    ),
                )
    finally:
        conn.close()
    return path


def build_v2_store(path: Path) -> Path:
    """A store after migration 2 (a 1.0-era SDK): pauses and the cache exist, but
    no step_type, agent_path, synced or sync_error. One row predates the
    checkpoint_id backfill (NULL there, the id only in ``id``)."""
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute(V1_CHECKPOINTS)
            for column in V2_COLUMNS:
                conn.execute(f"ALTER TABLE checkpoints ADD COLUMN {column}")
            for table in V2_TABLES:
                conn.execute(table)
            rows = [
                # (id, checkpoint_id, parent, run, node, status, reason)
                ("v2-a", None, None, "old-paused", "turn:0", "completed", None),
                (
                    "v2-b",
                    "v2-b",
                    None,
                    "old-paused",
                    "turn:0/tool:refund",
                    "interrupted",
                    "manager_approval",
                ),
                ("v2-c", "v2-c", None, "old-done", "turn:0", "completed", None),
                ("v2-d", "v2-d", "v2-c", "old-fork", "__fork_origin__", "completed", None),
                ("v2-e", "v2-e", None, "old-fork", "turn:0", "completed", None),
            ]
            for i, (rid, cid, parent, run, node, status, reason) in enumerate(rows):
                conn.execute(
                    "INSERT INTO checkpoints (id, checkpoint_id, parent_checkpoint_id,"
                    " chain_name, execution_id, node_id, node_index, status, state_snapshot,"
                    " interrupt_reason, created_at) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?)",
                    (
                        rid,
                        cid,
                        parent,
                        "old-bot",
                        run,
                        node,
                        status,
                        _snapshot(f"old request {run}"),
                        reason,
                        f"2024-02-01T00:00:0{i}+00:00",
                    ),
                )
            conn.execute(
                "INSERT INTO pending_interrupts VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    "old-paused",
                    "old-bot",
                    "turn:0/tool:refund",
                    "manager_approval",
                    '{"order_id": "B-7"}',
                    None,
                    "2024-02-01T00:00:01+00:00",
                ),
            )
            conn.execute(
                "INSERT INTO idempotency_cache VALUES (?, ?, ?, ?)",
                ("old-paused", "k-old", '"bare-old-value"', "2024-02-01T00:00:01+00:00"),
            )
    finally:
        conn.close()
    return path


@pytest.fixture
def v1_store(tmp_path: Path) -> Path:
    return build_v1_store(tmp_path / "v1.db")


@pytest.fixture
def v2_store(tmp_path: Path) -> Path:
    return build_v2_store(tmp_path / "v2.db")


ClientFactory = Callable[..., TestClient]


@pytest.fixture
def make_client() -> Iterator[ClientFactory]:
    """``make_client(store_path, raise_server_exceptions=True, seeding=None, **settings)``:
    a TestClient with the app's lifespan running, closed when the test ends. Sign-in is
    off unless ``sign_in=sign_in_settings()`` is given."""
    with ExitStack() as stack:

        def make(
            store_path: Path,
            *,
            raise_server_exceptions: bool = True,
            seeding: Any = None,
            **settings: Any,
        ) -> TestClient:
            settings.setdefault("sign_in", NO_SIGN_IN)
            app = create_app(Settings(store=str(store_path), **settings), seeding=seeding)
            client = TestClient(
                app,
                base_url=BASE_URL,
                raise_server_exceptions=raise_server_exceptions,
                client=LOOPBACK_CLIENT,
            )
            return stack.enter_context(client)

        yield make


@pytest.fixture(scope="session")
def app_store(seeded: Seeded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seeded runs for the app to serve. A copy: the app keeps its own
    decision table in the store's database, and the seeded store stays as the SDK
    left it."""
    return backup(seeded.path, tmp_path_factory.mktemp("app-store") / "local.db")


@pytest.fixture
def client(make_client: ClientFactory, app_store: Path) -> TestClient:
    """The app over (a copy of) the seeded store."""
    return make_client(app_store)


class _TextOf(HTMLParser):
    """The text a person reads inside the element with a given id (or the whole page)."""

    VOID = frozenset({"br", "hr", "img", "input", "link", "meta", "source", "wbr"})

    def __init__(self, element_id: str | None) -> None:
        super().__init__(convert_charrefs=True)
        self.element_id = element_id
        self.depth = 0 if element_id is not None else 1
        self.found = element_id is None
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        if self.depth:
            self.depth += 1
        elif dict(attrs).get("id") == self.element_id:
            self.found = True
            self.depth = 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        if self.depth and self.element_id is not None:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.parts.append(data)


def text_of(html: str, element_id: str | None = None) -> str:
    """Whitespace-collapsed visible text of ``#element_id``; fails if it is absent."""
    parser = _TextOf(element_id)
    parser.feed(html)
    parser.close()
    assert parser.found, f"no element with id={element_id!r} in the page"
    return " ".join(" ".join(parser.parts).split())


@pytest.fixture
def page_text() -> Callable[..., str]:
    return text_of


# --- acting on a store: the demo agent registered, its side effects in a ledger ---


class Ledger:
    """The demo agent's side-effect ledger: one JSON line per real effect
    (``{"effect": "charge_back" | "notify_customer", "order_id": ...}``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def effects(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def count(self, effect: str | None = None, order_id: str | None = None) -> int:
        return sum(
            1
            for e in self.effects()
            if (effect is None or e["effect"] == effect)
            and (order_id is None or e["order_id"] == order_id)
        )


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    """A fresh, empty ledger for the agent an app serves: the seed's own effects are
    not in it, so every line is an effect the app caused."""
    return Ledger(tmp_path / "ledger.jsonl")


ActingClientFactory = Callable[..., TestClient]


@pytest.fixture
def make_acting_client() -> Iterator[ActingClientFactory]:
    """``make_acting_client(store_path, ledger, agents=None, raise_server_exceptions=True,
    **settings)``: a TestClient over ``store_path`` with the demo refund-bot registered,
    bound to that store and writing its side effects to ``ledger``. ``agents=[...]``
    registers those instead (``[]`` for none)."""
    from fastaiagent.checkpointers import SQLiteCheckpointer

    from localui.demo.agent import build_agent

    with ExitStack() as stack:

        def make(
            store_path: Path,
            ledger: Ledger | None = None,
            *,
            agents: Sequence[Any] | None = None,
            raise_server_exceptions: bool = True,
            **settings: Any,
        ) -> TestClient:
            if agents is None:
                checkpointer = SQLiteCheckpointer(str(store_path))
                stack.callback(checkpointer.close)
                agents = [
                    build_agent(checkpointer, ledger=ledger.path if ledger is not None else None)
                ]
            settings.setdefault("sign_in", NO_SIGN_IN)
            app = create_app(Settings(store=str(store_path), **settings), agents=agents)
            client = TestClient(
                app,
                base_url=BASE_URL,
                raise_server_exceptions=raise_server_exceptions,
                client=LOOPBACK_CLIENT,
            )
            return stack.enter_context(client)

        yield make


@pytest.fixture(scope="session", autouse=True)
def _runs_index_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The runs index files of this session's stores go to a temporary cache, not ~/.cache;
    servers started as child processes inherit it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


# --- PostgreSQL: the seeded runs in a fleet's kind of store (issue 6) ---

#: The test command (scripts/test.sh) starts a throwaway server and sets this.
PG_DSN_VARIABLE = "LOCALUI_TEST_PG_DSN"
PG_TABLES = ("checkpoints", "pending_interrupts", "idempotency_cache")


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The test server; missing is a failure, never a skip (in CI or not)."""
    import os

    dsn = os.environ.get(PG_DSN_VARIABLE, "")
    if not dsn:
        why = "CI=true needs it" if os.environ.get("CI") == "true" else "it is not set"
        pytest.fail(
            f"{PG_DSN_VARIABLE}: {why}; run the tests with scripts/test.sh, which starts a "
            "throwaway PostgreSQL and sets it",
            pytrace=False,
        )
    return dsn


def pg_name(prefix: str) -> str:
    import uuid

    return f"{prefix}_{uuid.uuid4().hex[:12]}"


class PgRaw:
    """Plain psycopg on one schema (``{s}`` in SQL): the PostgreSQL tests' ground truth."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row) as conn:
            conn.execute("SET TIME ZONE 'UTC'")
            return conn.execute(sql.replace("{s}", self.schema), tuple(params)).fetchall()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(sql.replace("{s}", self.schema), tuple(params)).rowcount

    def rows(self, execution_id: str) -> list[dict[str, Any]]:
        """A run's rows in the order written (``PostgresCheckpointer.list``'s order)."""
        return self.query(
            "SELECT * FROM {s}.checkpoints WHERE execution_id = %s"
            " ORDER BY created_at, node_index, checkpoint_id",
            (execution_id,),
        )

    def drop(self) -> None:
        self.execute("DROP SCHEMA IF EXISTS {s} CASCADE")


def copy_pg_store(source_dsn: str, source: str, target_dsn: str, target: str) -> None:
    """The SDK's tables of ``source`` into a new schema, made by the SDK's own setup."""
    import psycopg
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    sdk = PostgresCheckpointer(target_dsn, schema=target, max_pool_size=1)
    try:
        sdk.setup()
    finally:
        sdk.close()
    with psycopg.connect(source_dsn) as src, psycopg.connect(target_dsn) as dst:
        for table in PG_TABLES:
            with (
                src.cursor().copy(f"COPY {source}.{table} TO STDOUT") as out,
                dst.cursor().copy(f"COPY {target}.{table} FROM STDIN") as into,
            ):
                for data in out:
                    into.write(data)


@dataclass(frozen=True, slots=True)
class PgSeeded:
    """The session's seeded PostgreSQL store: never written to, copied by ``pg_store``."""

    report: SeedReport
    dsn: str
    schema: str

    def id(self, scenario: str) -> str:
        return self.report.run_id(scenario)

    def ids(self, state: str) -> set[str]:
        return {self.id(name) for name, s in Seeded.STATES.items() if s == state}


@pytest.fixture(scope="session")
def pg_seeded(pg_dsn: str) -> Iterator[PgSeeded]:
    """Every demo scenario run by the real SDK into ``PostgresCheckpointer`` tables."""
    schema = pg_name("fastaiagent_seed")
    try:
        yield PgSeeded(report=seed(pg_dsn, pg_schema=schema), dsn=pg_dsn, schema=schema)
    finally:
        PgRaw(pg_dsn, schema).drop()


@dataclass(frozen=True, slots=True)
class PgStore:
    """A test's own copy of the seeded runs: the SDK's schema and the app's, both fresh."""

    dsn: str
    schema: str
    app_schema: str

    @property
    def raw(self) -> PgRaw:
        return PgRaw(self.dsn, self.schema)

    @property
    def app_raw(self) -> PgRaw:
        return PgRaw(self.dsn, self.app_schema)

    def settings(self, **changes: Any) -> Settings:
        changes.setdefault("sign_in", NO_SIGN_IN)
        return Settings(
            store=self.dsn, pg_schema=self.schema, pg_app_schema=self.app_schema, **changes
        )


@pytest.fixture
def pg_store(pg_seeded: PgSeeded) -> Iterator[PgStore]:
    """A fresh copy of the seeded runs in schemas named for this test, dropped after it."""
    made = PgStore(pg_seeded.dsn, pg_name("fastaiagent"), pg_name("localui"))
    try:
        copy_pg_store(pg_seeded.dsn, pg_seeded.schema, made.dsn, made.schema)
        yield made
    finally:
        made.raw.drop()
        made.app_raw.drop()


@pytest.fixture
def make_pg_client() -> Iterator[Callable[..., TestClient]]:
    """``make_pg_client(pg_store, ledger=None, *, agents=None, raise_server_exceptions=True,
    **settings)``: the app over a PostgreSQL store with the refund-bot registered, bound
    to it through ``PostgresCheckpointer`` (``agents=[]`` for none)."""
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer

    from localui.demo.agent import build_agent

    with ExitStack() as stack:

        def make(
            store: PgStore,
            ledger: Ledger | None = None,
            *,
            agents: Sequence[Any] | None = None,
            raise_server_exceptions: bool = True,
            **settings: Any,
        ) -> TestClient:
            if agents is None:
                checkpointer = PostgresCheckpointer(store.dsn, schema=store.schema)
                stack.callback(checkpointer.close)
                agents = [
                    build_agent(checkpointer, ledger=ledger.path if ledger is not None else None)
                ]
            settings.setdefault("sign_in", NO_SIGN_IN)
            app = create_app(store.settings(**settings), agents=agents)
            client = TestClient(
                app,
                base_url=BASE_URL,
                raise_server_exceptions=raise_server_exceptions,
                client=LOOPBACK_CLIENT,
            )
            return stack.enter_context(client)

        yield make
