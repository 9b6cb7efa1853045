"""Stores shaped as the SDK writes them, built in seconds from runs the SDK wrote.

The SDK runs once: ``localui.demo.scenarios.seed`` writes one run of every kind
(completed, paused, crashed in a tool, crashed waiting on the model, failed, an
``@idempotent`` charge then resumed, a fork), and ``bench.traced`` writes a
completed and a paused run and a chain of 50 tool nodes with tracing on, for
their spans. A store of N runs is those rows copied under new execution ids,
checkpoint ids, span ids, order ids and timestamps, with plain SQL in one
transaction, into a copy of the seeded file (so the schema, indexes and FTS
triggers are the SDK's own).

Every store also holds the runs the budgets name: one of 50 rows, one of 2,000
rows (turns of a model call and a tool call, cut from the completed run), each
with a sibling of as many rows that goes the same way until its middle row and
asks about another order from there (the pair the compare page is timed on),
one whose two rows carry state snapshots of about 1 MB each (a long
conversation, the second row two messages longer), and one more 1 MB row of
another conversation, for a diff where every message differs; and a copy of the
traced chain, whose spans the store with spans carries (its run page is timed there).
"""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.traced import CHAIN

#: Scenarios copied into the bulk of a store, and how often (percent). Paused
#: runs come on top, evenly spread, as many as the store's pending count says;
#: ``orphaned`` is a paused run whose pending row is gone.
MIX: Mapping[str, int] = {
    "completed": 60,
    "idempotent-resumed": 20,
    "failed": 5,
    "crashed-in-tool": 5,
    "crashed-waiting-on-model": 5,
    "fork-of-completed": 4,
    "orphaned": 1,
}
PAUSED_TEMPLATES = ("paused-1", "two-tools-first-pauses")
#: Runs start this far apart: 100,000 runs span about 35 days.
RUN_INTERVAL = timedelta(seconds=30)
#: Rows of the runs the run-page budgets name; each has a sibling to compare it with.
LONG_RUNS = (50, 2000)
#: The order a long run's sibling asks about from its middle row on.
SIBLING_ORDER = "A-1999"
#: Each of the two big rows carries about this many bytes of state snapshot.
BIG_SNAPSHOT_BYTES = 1_000_000

_ORDER = re.compile(r"A-10\d\d")
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%f+00:00"

Log = Callable[[str], None]


def _iso(at: datetime) -> str:
    # Always with microseconds: isoformat() drops them when they are 0, and
    # these strings are compared as text.
    return at.strftime(_TIME_FORMAT)


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text)


@dataclass(frozen=True, slots=True)
class TemplateRun:
    """One run the SDK wrote: its checkpoint rows, pending row and cache rows."""

    name: str
    execution_id: str
    rows: tuple[Mapping[str, Any], ...]
    pending: Mapping[str, Any] | None
    cache: tuple[Mapping[str, Any], ...]

    @property
    def first_at(self) -> datetime:
        return _parse(self.rows[0]["created_at"])


@dataclass(frozen=True, slots=True)
class TemplateSpans:
    """The spans of one traced run, and where its checkpoints start in time."""

    execution_id: str
    #: The order the run was about, replaced by each copy's own.
    order_id: str
    first_at: datetime
    spans: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Templates:
    #: The seeded store: its schema is the one every built store starts from.
    schema_store: Path
    checkpoint_columns: tuple[str, ...]
    span_columns: tuple[str, ...]
    runs: Mapping[str, TemplateRun]
    #: ``completed``, ``paused`` and ``chain``: spans copied onto runs of that shape.
    spans: Mapping[str, TemplateSpans]
    #: The traced chain of 50 tool nodes (``bench.traced``): its checkpoint rows.
    chain: TemplateRun
    seconds: float


def _rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    return tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))


def make_templates(workdir: Path, log: Log) -> Templates:
    """Run the SDK: every demo scenario, then the traced runs; read their rows back."""
    from localui.demo.scenarios import seed

    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    seeded = workdir / "template-seed.db"
    traced = workdir / "template-traced.db"
    for path in (seeded, traced):
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    report = seed(seeded)
    log(f"templates: {len(report.runs)} demo runs seeded in {report.seconds:.1f} s")
    with tempfile.TemporaryDirectory(prefix="localui-bench-traced-") as cwd:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        done = subprocess.run(
            [sys.executable, "-m", "bench.traced", str(traced)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"bench.traced failed ({done.returncode}): {done.stderr[-2000:]}")
    traced_runs = {
        line["kind"]: (line["execution_id"], line["order_id"])
        for line in (json.loads(x) for x in done.stdout.splitlines() if x.startswith("{"))
    }

    conn = sqlite3.connect(seeded)
    try:
        checkpoint_columns = _columns(conn, "checkpoints")
        runs = {
            name: _template_run(conn, name, execution_id)
            for name, execution_id in report.runs.items()
        }
    finally:
        conn.close()

    if CHAIN not in traced_runs:
        raise RuntimeError("bench.traced wrote no chain")
    conn = sqlite3.connect(traced)
    try:
        span_columns = _columns(conn, "spans")
        chain = _template_run(conn, CHAIN, traced_runs[CHAIN][0])
        spans: dict[str, TemplateSpans] = {}
        for kind, (execution_id, order_id) in traced_runs.items():
            first = conn.execute(
                "SELECT MIN(created_at) FROM checkpoints WHERE execution_id = ?", (execution_id,)
            ).fetchone()[0]
            # A run's spans are the trace whose root span names its execution id.
            trace_ids = [
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT trace_id FROM spans WHERE attributes LIKE ?",
                    (f"%{execution_id}%",),
                )
            ]
            marks = ",".join("?" * len(trace_ids))
            rows = _rows(
                conn,
                f"SELECT * FROM spans WHERE trace_id IN ({marks}) ORDER BY rowid",
                trace_ids,
            )
            if not rows:
                raise RuntimeError(f"the traced {kind} run wrote no spans")
            spans[kind] = TemplateSpans(
                execution_id=execution_id,
                order_id=order_id,
                first_at=_parse(first),
                spans=tuple(rows),
            )
    finally:
        conn.close()
    missing = {"completed", "paused", CHAIN} - set(spans)
    if missing:
        raise RuntimeError(f"no traced template for {', '.join(sorted(missing))}")
    seconds = time.monotonic() - started
    log(f"templates: traced runs with {sum(len(s.spans) for s in spans.values())} spans")
    return Templates(
        schema_store=seeded,
        checkpoint_columns=checkpoint_columns,
        span_columns=span_columns,
        runs=runs,
        spans=spans,
        chain=chain,
        seconds=seconds,
    )


def _template_run(conn: sqlite3.Connection, name: str, execution_id: str) -> TemplateRun:
    """One run's rows as the SDK wrote them into the store ``conn`` reads."""
    pending = _rows(
        conn, "SELECT * FROM pending_interrupts WHERE execution_id = ?", (execution_id,)
    )
    return TemplateRun(
        name=name,
        execution_id=execution_id,
        rows=tuple(
            _rows(
                conn,
                "SELECT * FROM checkpoints WHERE execution_id = ? ORDER BY rowid",
                (execution_id,),
            )
        ),
        pending=pending[0] if pending else None,
        cache=tuple(
            _rows(
                conn,
                "SELECT * FROM idempotency_cache WHERE execution_id = ? ORDER BY rowid",
                (execution_id,),
            )
        ),
    )


# --- building ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunCopy:
    """What the span pass needs to know about one copied run."""

    execution_id: str
    order_id: str
    shape: str
    start: datetime


@dataclass(frozen=True, slots=True)
class BuiltStore:
    path: Path
    runs: int
    rows: int
    pending: int
    spans: int
    seconds: float
    bytes: int
    #: Execution ids of the runs the budgets name.
    run_50: str
    run_2000: str
    #: The long runs' siblings: as many rows, the same until the middle row.
    run_50_b: str
    run_2000_b: str
    #: The 2,000-row run's row the fork preview is timed from: its first, so every
    #: later row is ahead of the branch.
    fork_row: str
    run_typical: str
    #: A completed run of the usual four rows, and its row whose conversation ends
    #: with a tool's result: the row an edit's branch goes on from.
    edit_run: str
    edit_row: str
    big_run: str
    #: Checkpoint ids of the rows with 1 MB state snapshots: A, then B two messages
    #: longer (the next step of the same run), and C from another conversation.
    big_a: str
    big_b: str
    big_c: str
    big_bytes: tuple[int, ...]
    #: A ``q=`` that matches exactly one run (its order id, in its tool arguments).
    search: str
    #: The copy of the traced chain of 50 tool nodes (traced where the store has spans).
    run_chain50: str
    manifest: tuple[RunCopy, ...] = field(repr=False, default=())

    @property
    def label(self) -> str:
        return f"{self.runs:,} runs" + (" + spans" if self.spans else "")


def _empty_store(templates: Templates, path: Path) -> None:
    """A copy of the seeded store with no runs in it: the SDK's schema, nothing else."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    src = sqlite3.connect(templates.schema_store)
    dst = sqlite3.connect(path)
    try:
        src.backup(dst)
    finally:
        src.close()
    try:
        for table in ("checkpoints", "pending_interrupts", "idempotency_cache", "spans"):
            dst.execute(f"DELETE FROM {table}")
        dst.commit()
        dst.execute("VACUUM")
    finally:
        dst.close()


class _Writer:
    """Collects rows for one store and writes them in one transaction."""

    def __init__(self, templates: Templates) -> None:
        self.columns = templates.checkpoint_columns
        self.checkpoints: list[tuple[Any, ...]] = []
        self.pending: list[tuple[Any, ...]] = []
        self.pending_columns: tuple[str, ...] = ()
        self.cache: list[tuple[Any, ...]] = []
        self.cache_columns: tuple[str, ...] = ()

    def add_row(self, row: Mapping[str, Any]) -> None:
        self.checkpoints.append(tuple(row[c] for c in self.columns))

    def add_pending(self, row: Mapping[str, Any]) -> None:
        self.pending_columns = tuple(row)
        self.pending.append(tuple(row.values()))

    def add_cache(self, row: Mapping[str, Any]) -> None:
        self.cache_columns = tuple(row)
        self.cache.append(tuple(row.values()))

    def write(self, conn: sqlite3.Connection) -> None:
        def insert(table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
            if rows:
                marks = ", ".join("?" * len(columns))
                conn.executemany(
                    f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows
                )

        insert("checkpoints", self.columns, self.checkpoints)
        insert("pending_interrupts", self.pending_columns, self.pending)
        insert("idempotency_cache", self.cache_columns, self.cache)


@contextmanager
def _bulk(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection for one big write: no journal, a large page cache, WAL again after.

    Written through WAL, every page would be written twice (log, then
    checkpoint); and random uuid keys thrash the default 2 MB cache.
    """
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("PRAGMA cache_size = -1000000")
        conn.execute("BEGIN")
        yield conn
        conn.execute("COMMIT")
        # The SDK's stores are WAL files; leave this one as the SDK would find it.
        conn.execute("PRAGMA journal_mode = WAL")
    finally:
        conn.close()


def _order_of(run: TemplateRun) -> str:
    for row in run.rows:
        found = _ORDER.search(row["state_snapshot"] or "")
        if found:
            return found.group(0)
    raise RuntimeError(f"template run {run.name} names no order")


def _copy_run(
    writer: _Writer,
    run: TemplateRun,
    *,
    start: datetime,
    order_id: str,
    with_pending: bool,
    fork_source: Mapping[str, str] | None,
) -> dict[str, str]:
    """Write one copy of ``run``; return its checkpoint ids keyed by the template's."""
    execution_id = str(uuid.uuid4())
    old_order = _order_of(run)
    first = run.first_at
    ids: dict[str, str] = {}
    for row in run.rows:
        new = dict(row)
        checkpoint_id = str(uuid.uuid4())
        ids[row["checkpoint_id"]] = checkpoint_id
        new["id"] = checkpoint_id
        new["checkpoint_id"] = checkpoint_id
        new["execution_id"] = execution_id
        new["created_at"] = _iso(start + (_parse(row["created_at"]) - first))
        new["project_id"] = "bench"
        parent = row["parent_checkpoint_id"]
        if parent:
            new["parent_checkpoint_id"] = (fork_source or ids).get(parent, parent)
        for column in ("state_snapshot", "node_input", "node_output", "interrupt_context"):
            if new[column]:
                new[column] = new[column].replace(old_order, order_id)
        writer.add_row(new)
    if with_pending and run.pending is not None:
        pending = dict(run.pending)
        pending["execution_id"] = execution_id
        pending["context"] = pending["context"].replace(old_order, order_id)
        pending["created_at"] = _iso(start + (_parse(run.pending["created_at"]) - first))
        pending["project_id"] = "bench"
        writer.add_pending(pending)
    for entry in run.cache:
        cached = dict(entry)
        cached["execution_id"] = execution_id
        cached["result"] = cached["result"].replace(old_order, order_id)
        cached["created_at"] = _iso(start + (_parse(entry["created_at"]) - first))
        cached["project_id"] = "bench"
        writer.add_cache(cached)
    ids["__execution_id__"] = execution_id
    return ids


@dataclass(frozen=True, slots=True)
class _LongRun:
    execution_id: str
    checkpoint_ids: tuple[str, ...]


def _long_run(
    writer: _Writer,
    run: TemplateRun,
    *,
    start: datetime,
    rows: int,
    other_order_from: int | None = None,
) -> _LongRun:
    """A completed run of ``rows`` rows: turns of a model call and a tool call, then the end.
    From row ``other_order_from`` on, its payloads name :data:`SIBLING_ORDER` instead of
    the template's order (a sibling that went another way halfway)."""
    old_order = _order_of(run)
    by_node = {r["node_id"]: r for r in run.rows}
    llm, tool, last_turn, end = (
        by_node["turn:0"],
        by_node["turn:0/tool:refund"],
        by_node["turn:1"],
        by_node["run_end"],
    )
    execution_id = str(uuid.uuid4())
    ids: list[str] = []
    turns = (rows - 2) // 2
    plan: list[tuple[Mapping[str, Any], int]] = []
    for turn in range(turns):
        plan += [(llm, turn), (tool, turn)]
    plan += [(last_turn, turns), (end, turns)]
    for i, (template, turn) in enumerate(plan):
        new = dict(template)
        checkpoint_id = str(uuid.uuid4())
        node = template["node_id"]
        if node.startswith("turn:"):
            node = re.sub(r"^turn:\d+", f"turn:{turn}", node)
        snapshot = json.loads(template["state_snapshot"])
        snapshot["turn"] = turn
        new.update(
            id=checkpoint_id,
            checkpoint_id=checkpoint_id,
            execution_id=execution_id,
            node_id=node,
            node_index=turn,
            state_snapshot=json.dumps(snapshot),
            created_at=_iso(start + timedelta(milliseconds=3 * i)),
            project_id="bench",
        )
        if other_order_from is not None and i >= other_order_from:
            for column in ("state_snapshot", "node_input", "node_output"):
                if new[column]:
                    new[column] = new[column].replace(old_order, SIBLING_ORDER)
        writer.add_row(new)
        ids.append(checkpoint_id)
    return _LongRun(execution_id, tuple(ids))


def _big_messages(count: int, seed: int) -> list[dict[str, Any]]:
    """A long tool-using conversation: each tool result is a ~4 KB document."""
    rng = random.Random(seed)
    words = "refund order policy amount customer ledger manager approval invoice".split()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are refund-bot.", "name": None},
        {"role": "user", "content": "Audit every refund of last quarter.", "name": None},
    ]
    for i in range(count):
        call_id = f"call_{i}_lookup"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "name": "lookup", "arguments": {"order_id": f"A-{5000 + i}"}}
                ],
            }
        )
        document = " ".join(rng.choice(words) for _ in range(600))
        messages.append({"role": "tool", "content": document, "tool_call_id": call_id})
    return messages


@dataclass(frozen=True, slots=True)
class _BigRun:
    execution_id: str
    checkpoint_ids: tuple[str, ...]
    sizes: tuple[int, ...]


def _big_run(
    writer: _Writer, run: TemplateRun, *, start: datetime, rows: int, seed: int
) -> _BigRun:
    """Model-call rows whose snapshots are about 1 MB, each two messages longer than the
    one before: a long tool-using conversation (``seed`` picks its documents)."""
    llm = next(r for r in run.rows if r["node_id"] == "turn:0")
    execution_id = str(uuid.uuid4())
    # About 4.4 KB per assistant+tool pair once serialised.
    pairs = BIG_SNAPSHOT_BYTES // 4_400
    messages = _big_messages(pairs + rows, seed=seed)
    ids: list[str] = []
    sizes: list[int] = []
    for turn in range(rows):
        checkpoint_id = str(uuid.uuid4())
        snapshot = json.dumps({"messages": messages[: 2 + 2 * (pairs + turn)], "turn": turn})
        new = dict(llm)
        new.update(
            id=checkpoint_id,
            checkpoint_id=checkpoint_id,
            execution_id=execution_id,
            node_id=f"turn:{turn}",
            node_index=turn,
            state_snapshot=snapshot,
            created_at=_iso(start + timedelta(seconds=turn)),
            project_id="bench",
        )
        writer.add_row(new)
        ids.append(checkpoint_id)
        sizes.append(len(snapshot))
    return _BigRun(execution_id, tuple(ids), tuple(sizes))


def _ends_with_tool_result(run: TemplateRun) -> str:
    """The checkpoint id of ``run``'s first row whose conversation ends with a tool's
    result (the model is asked next): the row an edit changes that result on."""
    for row in run.rows:
        if row["step_type"] == "run_end" or not row["state_snapshot"]:
            continue
        messages = json.loads(row["state_snapshot"]).get("messages") or []
        if messages and messages[-1].get("role") == "tool":
            return str(row["checkpoint_id"])
    raise RuntimeError(f"template run {run.name} has no row after a tool's result")


def _shapes(runs: int, pending: int, rng: random.Random) -> Iterator[str]:
    """The scenario each copied run takes: pauses spread evenly, the rest by ``MIX``."""
    step = runs / pending if pending else 0.0
    paused_at = {int(step * k + step / 2) for k in range(pending)} if pending else set()
    names = list(MIX)
    weights = [MIX[n] for n in names]
    paused = 0
    for i in range(runs):
        if i in paused_at:
            yield PAUSED_TEMPLATES[paused % len(PAUSED_TEMPLATES)]
            paused += 1
        else:
            yield rng.choices(names, weights)[0]


#: Entries of the decision record a store carries: one per run, up to this many
#: (``/decisions``, its CSV and ``/metrics`` are timed over them).
DECISIONS = 100_000


def _add_decisions(path: Path, manifest: Sequence[RunCopy], count: int) -> None:
    """``count`` decisions in the app's own record, on the store's runs in turn: the
    table and indexes as localui makes them, the rows loaded in one transaction (the
    record's own claim takes a write transaction per decision, an hour for these)."""
    from localui.backends.decisions import TABLE
    from localui.backends.sqlite.decisions import INDEX, LISTING_INDEXES, SCHEMA

    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute(SCHEMA)
            conn.execute(INDEX)
            for statement in LISTING_INDEXES:
                conn.execute(statement)
            base = datetime.now(UTC) - timedelta(days=30)
            rows = []
            for i in range(count):
                run = manifest[i % len(manifest)]
                kind = "approval" if i % 3 else "resume"
                at = base + timedelta(seconds=20 * i)
                rows.append(
                    (
                        kind,
                        run.execution_id,
                        f"bench-decision-{i}",
                        None if kind == "resume" else int(i % 5 != 0),
                        f"person-{i % 17}",
                        "" if i % 5 else "over budget",
                        at.isoformat(),
                        ("completed", "paused", "failed")[i % 3],
                        None,
                        (at + timedelta(seconds=2)).isoformat(),
                    )
                )
            conn.executemany(
                f"INSERT INTO {TABLE} (kind, execution_id, checkpoint_id, approved, actor,"
                " reason, decided_at, outcome, detail, finished_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
    finally:
        conn.close()


def add_record(path: Path, manifest: Sequence[RunCopy], runs: int) -> None:
    """The decision record a store is built with: a decision per run up to
    :data:`DECISIONS`, its votes, and each entry's agent."""
    _add_decisions(path, manifest, min(runs, DECISIONS))
    add_votes(path)
    add_agents(path)


#: One vote (a two-person rule's first approval) for every this many decisions, ten
#: seconds after it: the record's listing is timed across both of its tables.
DECISIONS_PER_VOTE = 50
_VOTE_CHECKPOINT = "bench-vote-"


def add_votes(path: Path) -> int:
    """Votes beside the store's decisions, once (a store built before the bench gave
    them gets them at its next run): the votes table as localui makes it, the rows in
    one transaction. Only localui's own tables change. Returns the votes added."""
    from localui.backends.decisions import TABLE, VOTES_TABLE
    from localui.backends.sqlite.decisions import VOTE_LISTING_INDEXES, VOTES_SCHEMA

    conn = sqlite3.connect(path, timeout=60)
    try:
        with conn:
            has_record = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
            ).fetchone()
            if has_record is None:
                return 0
            conn.execute(VOTES_SCHEMA)
            for statement in VOTE_LISTING_INDEXES:
                conn.execute(statement)
            seeded = conn.execute(
                f"SELECT 1 FROM {VOTES_TABLE} WHERE checkpoint_id LIKE ? LIMIT 1",
                (f"{_VOTE_CHECKPOINT}%",),
            ).fetchone()
            if seeded is not None:
                return 0
            rows = [
                (
                    execution_id,
                    f"{_VOTE_CHECKPOINT}{n}",
                    f"person-{(n + 5) % 17}",
                    "" if n % 4 else "checked the order",
                    json.dumps({"amount": 100 + n % 400}),
                    (datetime.fromisoformat(at) + timedelta(seconds=10)).isoformat(),
                )
                for n, (execution_id, at) in enumerate(
                    conn.execute(
                        f"SELECT execution_id, decided_at FROM {TABLE}"
                        f" WHERE checkpoint_id LIKE 'bench-decision-%' AND id % ? = 0"
                        " ORDER BY id",
                        (DECISIONS_PER_VOTE,),
                    ).fetchall()
                )
            ]
            conn.executemany(
                f"INSERT INTO {VOTES_TABLE}"
                " (execution_id, checkpoint_id, actor, reason, fields, voted_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            return len(rows)
    finally:
        conn.close()


def add_agents(path: Path) -> int:
    """The run's agent on each seeded decision and vote, as localui records it when it
    writes them (the run's owner, ``localui.runs``), once: a store whose record was
    seeded before entries carried agents gets the column (as a writable localui adds
    it) and the agents, in one transaction. Only localui's own tables change, and only
    the bench's own entries: any other keeps what its writer recorded. Returns the
    entries given an agent."""
    from localui import runs
    from localui.backends.decisions import AGENT_COLUMN, TABLE, VOTES_TABLE

    seeded = ((TABLE, "bench-decision-%"), (VOTES_TABLE, f"{_VOTE_CHECKPOINT}%"))
    conn = sqlite3.connect(path, timeout=60)
    try:
        with conn:
            tables = [
                (table, pattern)
                for table, pattern in seeded
                if conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
                ).fetchone()
            ]
            for table, _ in tables:
                present = {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}
                if AGENT_COLUMN not in present:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {AGENT_COLUMN} TEXT")
            owners: dict[str, str] = {}
            filled = 0
            for table, pattern in tables:
                missing = conn.execute(
                    f"SELECT DISTINCT execution_id FROM {table}"
                    f" WHERE {AGENT_COLUMN} IS NULL AND checkpoint_id LIKE ?",
                    (pattern,),
                ).fetchall()
                for (execution_id,) in missing:
                    if execution_id not in owners:
                        rows = conn.execute(
                            "SELECT agent_path, chain_name FROM checkpoints"
                            " WHERE execution_id = ? ORDER BY rowid",
                            (execution_id,),
                        ).fetchall()
                        # The runs list's name for the run: the owner its shallowest
                        # path names, else its first row's agent.
                        named = runs.path_owner_name(runs.owner_path([r[0] for r in rows]))
                        owners[execution_id] = named or (rows[0][1] if rows else "") or ""
                filled += conn.executemany(
                    f"UPDATE {table} SET {AGENT_COLUMN} = ? WHERE execution_id = ?"
                    f" AND {AGENT_COLUMN} IS NULL AND checkpoint_id LIKE ?",
                    [(owners[eid], eid, pattern) for (eid,) in missing],
                ).rowcount
            return filled
    finally:
        conn.close()


def build_store(templates: Templates, path: Path, *, runs: int, pending: int) -> BuiltStore:
    """A store of ``runs`` runs (seven of them the budgets' long runs, their siblings, the
    big runs and the chain)."""
    started = time.monotonic()
    _empty_store(templates, path)
    rng = random.Random(runs)
    writer = _Writer(templates)
    base = datetime.now(UTC) - RUN_INTERVAL * runs - timedelta(hours=1)
    # Each long run, then its sibling; then the two big runs, then the chain.
    long_plan = [(rows, other) for rows in LONG_RUNS for other in (None, rows // 2)]
    bulk = runs - len(long_plan) - 3
    specials = {bulk // 2 + k: k for k in range(len(long_plan) + 3)}
    manifest: list[RunCopy] = []
    last_completed: dict[str, str] | None = None
    long_runs: list[_LongRun] = []
    big: list[_BigRun] = []
    typical = search = edit_run = edit_row = chain = ""
    completed = templates.runs["completed"]
    to_edit = _ends_with_tool_result(completed)
    i = 0
    shapes = _shapes(bulk, pending, rng)
    for slot in range(runs):
        start = base + RUN_INTERVAL * slot
        if slot in specials:
            k = specials[slot]
            if k < len(long_plan):
                rows, other = long_plan[k]
                long_runs.append(
                    _long_run(writer, completed, start=start, rows=rows, other_order_from=other)
                )
                # Traced too, so the run page with trace is timed on a long run.
                manifest.append(RunCopy(long_runs[-1].execution_id, "A-1001", "completed", start))
            elif k < len(long_plan) + 2:
                # Two rows of one conversation, then one row of another.
                rows, seed = (2, 7) if not big else (1, 8)
                big.append(
                    _big_run(writer, templates.runs["completed"], start=start, rows=rows, seed=seed)
                )
            else:
                # Traced in the store with spans: the chain's run page is timed there.
                order_id = templates.spans[CHAIN].order_id
                chain = _copy_run(
                    writer,
                    templates.chain,
                    start=start,
                    order_id=order_id,
                    with_pending=False,
                    fork_source=None,
                )["__execution_id__"]
                manifest.append(RunCopy(chain, order_id, CHAIN, start))
            continue
        shape = next(shapes)
        order_id = f"A-{100000 + i}"
        i += 1
        template_name = "paused-1" if shape == "orphaned" else shape
        if shape == "fork-of-completed" and last_completed is None:
            template_name = shape = "completed"
        ids = _copy_run(
            writer,
            templates.runs[template_name],
            start=start,
            order_id=order_id,
            with_pending=shape != "orphaned",
            fork_source=last_completed if shape == "fork-of-completed" else None,
        )
        if shape == "completed":
            last_completed = ids
            if typical and not edit_run:
                edit_run, edit_row = ids["__execution_id__"], ids[to_edit]
            if not typical and slot > bulk // 3:
                typical, search = ids["__execution_id__"], order_id
        span_shape = "paused" if shape in PAUSED_TEMPLATES or shape == "orphaned" else "completed"
        manifest.append(RunCopy(ids["__execution_id__"], order_id, span_shape, start))
    if len(big) != 2 or len(long_runs) != len(long_plan) or not (typical and edit_run and chain):
        raise RuntimeError(f"a store of {runs} runs is too small for the benchmark's runs")

    with _bulk(path) as conn:
        writer.write(conn)
    add_record(path, manifest, runs)
    return BuiltStore(
        path=path,
        runs=runs,
        rows=len(writer.checkpoints),
        pending=len(writer.pending),
        spans=0,
        seconds=time.monotonic() - started,
        bytes=path.stat().st_size,
        run_50=long_runs[0].execution_id,
        run_50_b=long_runs[1].execution_id,
        run_2000=long_runs[2].execution_id,
        run_2000_b=long_runs[3].execution_id,
        fork_row=long_runs[2].checkpoint_ids[0],
        run_typical=typical,
        edit_run=edit_run,
        edit_row=edit_row,
        big_run=big[0].execution_id,
        big_a=big[0].checkpoint_ids[0],
        big_b=big[0].checkpoint_ids[1],
        big_c=big[1].checkpoint_ids[0],
        big_bytes=(*big[0].sizes, *big[1].sizes),
        search=search,
        run_chain50=chain,
        manifest=tuple(manifest),
    )


def add_spans(templates: Templates, store: BuiltStore, path: Path) -> BuiltStore:
    """A copy of ``store`` with the spans the SDK writes for each of its runs."""
    started = time.monotonic()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    src = sqlite3.connect(store.path)
    dst = sqlite3.connect(path)
    try:
        src.backup(dst)
    finally:
        src.close()
    columns = templates.span_columns
    rows: list[tuple[Any, ...]] = []
    getrandbits = random.Random(store.runs).getrandbits
    for run in store.manifest:
        template = templates.spans[run.shape]
        old_order = template.order_id
        trace_ids: dict[str, str] = {}
        span_ids: dict[str, str] = {}
        for span in template.spans:
            span_ids[span["span_id"]] = f"{getrandbits(64):016x}"
            trace_ids.setdefault(span["trace_id"], f"{getrandbits(128):032x}")
        for span in template.spans:
            new = dict(span)
            new["span_id"] = span_ids[span["span_id"]]
            new["trace_id"] = trace_ids[span["trace_id"]]
            parent = span["parent_span_id"]
            new["parent_span_id"] = span_ids.get(parent, parent) if parent else parent
            for column in ("start_time", "end_time"):
                if span[column]:
                    new[column] = _iso(run.start + (_parse(span[column]) - template.first_at))
            new["attributes"] = (
                (span["attributes"] or "")
                .replace(template.execution_id, run.execution_id)
                .replace(old_order, run.order_id)
            )
            new["project_id"] = "bench"
            rows.append(tuple(new[c] for c in columns))
    dst.close()
    with _bulk(path) as conn:
        marks = ", ".join("?" * len(columns))
        conn.executemany(f"INSERT INTO spans ({', '.join(columns)}) VALUES ({marks})", rows)
    return BuiltStore(
        path=path,
        runs=store.runs,
        rows=store.rows,
        pending=store.pending,
        spans=len(rows),
        seconds=time.monotonic() - started,
        bytes=path.stat().st_size,
        run_50=store.run_50,
        run_2000=store.run_2000,
        run_50_b=store.run_50_b,
        run_2000_b=store.run_2000_b,
        fork_row=store.fork_row,
        run_typical=store.run_typical,
        edit_run=store.edit_run,
        edit_row=store.edit_row,
        big_run=store.big_run,
        big_a=store.big_a,
        big_b=store.big_b,
        big_c=store.big_c,
        big_bytes=store.big_bytes,
        search=store.search,
        run_chain50=store.run_chain50,
    )
