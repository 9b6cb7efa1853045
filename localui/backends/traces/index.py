"""The span index's file and its catch-up: which runners' spans belong to which run."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localui.backends.sqlite.connect import connect, transaction
from localui.backends.sqlite.files import file_uri
from localui.backends.traces.spans import (
    RUNNERS,
    Attempt,
    Span,
    attempts_of,
    decode_attributes,
    first_exception,
)
from localui.paths import cache_dir

#: Bump when the index's tables change: an index of another version is rebuilt.
VERSION = "5"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (
    execution_id TEXT NOT NULL,
    trace_id     TEXT NOT NULL,
    span_id      TEXT NOT NULL,
    -- agent, chain, swarm or supervisor: who opened the span.
    runner       TEXT NOT NULL,
    -- What the runs list shows of a run, kept here so a page of 50 runs is one query.
    started_at   TEXT,
    ended_at     TEXT,
    input        TEXT,
    output       TEXT,
    error        TEXT,
    PRIMARY KEY (execution_id, span_id)
) WITHOUT ROWID;
-- Who resolved a run's pauses, as the SDK recorded it wherever the resolution came
-- from: a resume's span (``agent.resume.resolver``, ``chain.resume.resolver``: one
-- per attempt, keyed by its trace) or a ``resolved`` event of its HITL ledger
-- (``hitl_events``, keyed by the event's id).
CREATE TABLE IF NOT EXISTS resolutions (
    id           INTEGER PRIMARY KEY,
    execution_id TEXT NOT NULL,
    source       TEXT NOT NULL,
    key          TEXT NOT NULL,
    resolver     TEXT,
    approved     INTEGER,
    node         TEXT,
    reason       TEXT,
    at           TEXT NOT NULL,
    UNIQUE (execution_id, source, key)
);
CREATE INDEX IF NOT EXISTS resolutions_by_time ON resolutions (at, id);
"""

#: Of a summary's texts, the runs list needs a first line: keep this much.
_SUMMARY_CHARS = 400


def _json_text(key: str) -> str:
    """A text attribute of a span, or null (malformed JSON, or not text)."""
    return f"""CASE WHEN json_type(attributes, '$."{key}"') = 'text'
        THEN json_extract(attributes, '$."{key}"') END"""


def _first_of(keys: Sequence[str]) -> str:
    """The first of the span's text attributes ``keys`` that it has; ``json_valid``
    first: one malformed row must not stop the whole fold."""
    found = ", ".join(_json_text(key) for key in keys)
    return f"CASE WHEN json_valid(attributes) THEN COALESCE({found}) END"


#: The run a runner's span belongs to: its own id, or the run it resumed or forked.
_RUN_OF = _first_of(
    [
        f"{runner}.{link}"
        for link in ("execution_id", "resumed_execution_id", "forked_execution_id")
        for runner in RUNNERS
    ]
)
_INPUT_OF = _first_of([f"{runner}.input" for runner in RUNNERS])
_OUTPUT_OF = _first_of([f"{runner}.output" for runner in RUNNERS])
#: The spans the runners open for a run (``agent.refund-bot``, ``chain.refund-chain``).
_ROOT_NAMES = " OR ".join(f"name LIKE '{runner}.%'" for runner in RUNNERS)
#: A resume's answer, as the SDK stamps it on the resume's span (a team's, on the
#: member's agent span that went on).
_RESOLVER_OF = _first_of([f"{runner}.resume.resolver" for runner in RUNNERS])
_RESUME_NODE_OF = _first_of([f"{runner}.resume.node_id" for runner in RUNNERS])
_RESUME_REASON_OF = _first_of([f"{runner}.resume.reason" for runner in RUNNERS])
_APPROVED_OF = (
    "CASE WHEN json_valid(attributes) THEN COALESCE("
    + ", ".join(
        f"""CASE json_type(attributes, '$."{runner}.resume.approved"')
            WHEN 'true' THEN 1 WHEN 'false' THEN 0 END"""
        for runner in RUNNERS
    )
    + ") END"
)
#: Where a resolution was read: a resume's span, or the SDK's HITL ledger.
TRACE, LEDGER = "trace", "ledger"
#: The first exception's message on a span that ended in error.
_ERROR_OF = """CASE WHEN status = 'ERROR' AND json_valid(events)
    THEN json_extract(events, '$[0].attributes."exception.message"') END"""

#: A backlog of more span rowids than this is folded in a thread: a first look at a
#: large traced store must not hold its first page for seconds.
BACKGROUND_FROM = 20_000
#: What :meth:`SpanIndex.refresh` says.
READY, OFF, INDEXING = "ready", "off", "indexing"

#: Spans folded per transaction while catching up, so a large first fold
#: holds the index's write lock only briefly at a time.
_BATCH = 10_000


def _index_dir() -> Path:
    for candidate in (cache_dir(), Path(tempfile.gettempdir()) / "localui"):
        try:
            candidate.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            return candidate
    return Path(tempfile.mkdtemp(prefix="localui-spans-"))


def _identity(path: Path) -> str:
    """Which file is at ``path`` (device and inode): a replaced trace file differs."""
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    return f"{st.st_dev}:{st.st_ino}"


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A run as its runners' spans sum it up: first input, last answer, last error."""

    input: str | None
    answer: str | None
    error: str | None
    started_at: str | None
    ended_at: str | None


@dataclass(frozen=True, slots=True)
class Resolution:
    """A pause's end as the SDK recorded it: who resolved it, how, where, when."""

    id: int
    execution_id: str
    #: :data:`TRACE` (a resume's span) or :data:`LEDGER` (the SDK's HITL ledger).
    source: str
    resolver: str | None
    approved: bool | None
    #: The paused node it answered (``turn:0/tool:refund``, ``step_3_refund``).
    node: str | None
    reason: str | None
    #: When the resume began (a span) or the resolution was recorded (the ledger).
    at: str


class SpanIndex:
    """Finds a run's spans in one SQLite file the SDK traced into."""

    def __init__(
        self,
        traces_path: str | Path,
        *,
        index_dir: Path | None = None,
        background_from: int = BACKGROUND_FROM,
    ) -> None:
        self.background_from = background_from
        self.traces_path = Path(traces_path).resolve()
        name = hashlib.sha256(str(self.traces_path).encode()).hexdigest()[:24]
        self.path = (index_dir or _index_dir()) / f"spans-{name}.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self._conn = connect(
            self.path,
            "rwc",
            timeout=10.0,
            check_same_thread=False,
            isolation_level=None,
        )
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        # A run page reads a few pages of each file: a small cache keeps the server lean.
        self._conn.execute("PRAGMA cache_size = -512")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
        )
        if self._meta("version") != VERSION:
            # Another version's tables: start again (the spans are all still there).
            self._conn.executescript(
                "DROP TABLE IF EXISTS attempts; DROP TABLE IF EXISTS resolutions; DELETE FROM meta;"
            )
            self._set_meta("version", VERSION)
        self._conn.executescript(_SCHEMA)
        #: The identity of the trace file attached as ``t``, or empty.
        self._attached = ""
        self._builder: threading.Thread | None = None
        self._closed = False

    def close(self) -> None:
        with self.lock:
            self._closed = True
        self.wait(timeout=10)
        with self.lock:
            self._conn.close()

    def _attach(self) -> bool:
        """The trace file, read-only, as schema ``t``; False while it does not exist.
        A file replaced at the same path (a new store) is attached again."""
        identity = _identity(self.traces_path)
        if self._attached == identity:
            return True
        if self._attached:
            self._conn.execute("DETACH DATABASE t")
            self._attached = ""
        if identity == "missing":
            return False
        self._conn.execute("ATTACH DATABASE ? AS t", (file_uri(self.traces_path, "ro"),))
        self._conn.execute("PRAGMA t.cache_size = -512")
        self._attached = identity
        return True

    def _has_spans(self) -> bool:
        # A file this process cannot read (a WAL store in a read-only directory
        # has no -shm to open) shows no spans rather than breaking the page.
        try:
            if not self._attach():
                return False
            found = self._conn.execute(
                "SELECT 1 FROM t.sqlite_master WHERE type = 'table' AND name = 'spans'"
            ).fetchone()
        except sqlite3.OperationalError:
            return False
        return found is not None

    def _meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else None

    def _set_meta(self, key: str, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def _refresh(self) -> str:
        """Fold in the spans written since the last call: ``ready``, ``off`` (no
        ``spans`` table: tracing was off) or ``indexing`` (a large backlog is being
        folded in a thread; pages answer without spans until it is done).

        The SDK writes spans with ``INSERT OR REPLACE``, so a written or rewritten
        span always gets a rowid above every earlier one: the rowid is the mark.
        A file that was replaced, or whose rowids went below the mark (pruned and
        vacuumed), is indexed again from the start.
        """
        if self._builder is not None:
            if self._builder.is_alive():
                return INDEXING
            self._builder = None
        if not self._has_spans():
            return OFF
        newest = self._conn.execute("SELECT max(rowid) FROM t.spans").fetchone()[0] or 0
        identity = f"{VERSION}/{_identity(self.traces_path)}"
        mark = int(self._meta("mark") or 0)
        if self._meta("identity") != identity or newest < mark:
            with transaction(self._conn):
                self._conn.execute("DELETE FROM attempts")
                self._conn.execute("DELETE FROM resolutions")
                self._set_meta("ledger_mark", "0")
                self._set_meta("identity", identity)
                self._set_meta("mark", "0")
            mark = 0
        if newest - mark > self.background_from:
            self._builder = threading.Thread(
                target=self._fold_in_background, args=(newest,), name="localui-spans", daemon=True
            )
            self._builder.start()
            return INDEXING
        while mark < newest:
            upto = min(newest, mark + _BATCH)
            self._fold(mark, upto)
            mark = upto
        self._fold_ledger()
        return READY

    def _fold_in_background(self, newest: int) -> None:
        """Fold up to ``newest`` a batch at a time, letting requests in between."""
        try:
            while True:
                with self.lock:
                    if self._closed:
                        return
                    mark = int(self._meta("mark") or 0)
                    if mark >= newest:
                        return
                    self._fold(mark, min(newest, mark + _BATCH))
        except sqlite3.Error:
            # The next request starts again from the mark the last batch left.
            return

    def _fold(self, mark: int, upto: int) -> None:
        with transaction(self._conn):
            self._conn.execute(
                f"""INSERT OR IGNORE INTO attempts
                    SELECT run_id, trace_id, span_id, runner, start_time, end_time,
                           substr(input, 1, {_SUMMARY_CHARS}),
                           substr(output, 1, {_SUMMARY_CHARS}),
                           substr(error, 1, {_SUMMARY_CHARS}) FROM (
                        SELECT {_RUN_OF} AS run_id, trace_id, span_id,
                               substr(name, 1, instr(name, '.') - 1) AS runner,
                               start_time, end_time,
                               {_INPUT_OF} AS input, {_OUTPUT_OF} AS output,
                               {_ERROR_OF} AS error
                        FROM t.spans
                        WHERE rowid > ? AND rowid <= ? AND ({_ROOT_NAMES})
                    ) WHERE run_id IS NOT NULL AND run_id != ''""",
                (mark, upto),
            )
            self._conn.execute(
                f"""INSERT OR IGNORE INTO resolutions
                        (execution_id, source, key, resolver, approved, node, reason, at)
                    SELECT run_id, '{TRACE}', trace_id, resolver, approved, node, reason,
                           start_time FROM (
                        SELECT {_RUN_OF} AS run_id, trace_id, start_time,
                               {_RESOLVER_OF} AS resolver, {_APPROVED_OF} AS approved,
                               {_RESUME_NODE_OF} AS node, {_RESUME_REASON_OF} AS reason
                        FROM t.spans
                        WHERE rowid > ? AND rowid <= ? AND ({_ROOT_NAMES})
                    ) WHERE run_id IS NOT NULL AND run_id != '' AND start_time IS NOT NULL
                      AND (resolver IS NOT NULL OR approved IS NOT NULL)""",
                (mark, upto),
            )
            self._set_meta("mark", str(upto))

    def _fold_ledger(self) -> None:
        """The ``resolved`` events of the SDK's HITL ledger written since the last
        call, when the traced file has one (the SDK writes it while connected to its
        platform). The ledger holds only pauses and their ends: a fold is small."""
        try:
            found = self._conn.execute(
                "SELECT 1 FROM t.sqlite_master WHERE type = 'table' AND name = 'hitl_events'"
            ).fetchone()
            if found is None:
                return
            newest = self._conn.execute("SELECT max(rowid) FROM t.hitl_events").fetchone()[0]
        except sqlite3.OperationalError:
            return
        newest = newest or 0
        mark = int(self._meta("ledger_mark") or 0)
        if newest < mark:
            # Pruned and vacuumed: fold it again from the start.
            with transaction(self._conn):
                self._conn.execute("DELETE FROM resolutions WHERE source = ?", (LEDGER,))
            mark = 0
        while mark < newest:
            upto = min(newest, mark + _BATCH)
            with transaction(self._conn):
                self._conn.execute(
                    f"""INSERT OR IGNORE INTO resolutions
                            (execution_id, source, key, resolver, approved, node, reason, at)
                        SELECT run_id, '{LEDGER}', event_id, resolver,
                               CASE status WHEN 'approved' THEN 1
                                           WHEN 'rejected' THEN 0 END,
                               node, NULL, COALESCE(occurred_at, created_at)
                        FROM t.hitl_events
                        WHERE rowid > ? AND rowid <= ? AND event_type = 'resolved'
                          AND typeof(run_id) = 'text' AND run_id != ''
                          AND COALESCE(occurred_at, created_at) IS NOT NULL""",
                    (mark, upto),
                )
                self._set_meta("ledger_mark", str(upto))
            mark = upto

    @property
    def indexing(self) -> bool:
        """A large backlog of spans is being folded in: pages show none until it is,
        and do not wait for it: a fold holds the lock a batch of spans at a time, and a
        runs list that waited for each batch answered in 200-280 ms instead of 7."""
        builder = self._builder
        return builder is not None and builder.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        """Until a background fold, if any, has finished (for tests and scripts)."""
        builder = self._builder
        if builder is not None:
            builder.join(timeout)

    def summaries(self, execution_ids: Sequence[str]) -> dict[str, RunSummary] | None:
        """What the runs list shows of each run that left spans; None without a
        ``spans`` table."""
        if self.indexing:
            return {}  # as below, without waiting for the batch being folded
        with self.lock:
            state = self._refresh()
            if state != READY:
                return None if state == OFF else {}
            marks = ", ".join("?" for _ in execution_ids)
            # A chain's or a team's run is summed up by its own spans, not by the
            # agents inside it (a supervisor's worker answers the supervisor, not
            # the user): where a run has such spans, its agents' are left out.
            rows = self._conn.execute(
                f"""SELECT execution_id, started_at, ended_at, input, output, error
                    FROM attempts AS a WHERE execution_id IN ({marks})
                    AND (runner != 'agent' OR NOT EXISTS (
                        SELECT 1 FROM attempts AS b WHERE b.execution_id = a.execution_id
                        AND b.runner != 'agent'))
                    ORDER BY execution_id, started_at""",
                tuple(execution_ids),
            ).fetchall()
        found: dict[str, RunSummary] = {}
        for execution_id, started, ended, text_in, text_out, error in rows:
            before = found.get(execution_id)
            found[execution_id] = RunSummary(
                input=before.input if before is not None and before.input else text_in,
                answer=text_out or (before.answer if before is not None else None),
                error=error,
                started_at=before.started_at if before is not None else started,
                ended_at=ended,
            )
        return found

    def resolutions(self, execution_id: str) -> tuple[Resolution, ...]:
        """Every resolution of the run's pauses the SDK recorded, oldest first."""
        if self.indexing:
            return ()
        with self.lock:
            if self._refresh() != READY:
                return ()
            rows = self._conn.execute(
                f"""SELECT {_RESOLUTION_COLUMNS} FROM resolutions
                    WHERE execution_id = ? ORDER BY at, id""",
                (execution_id,),
            ).fetchall()
        return tuple(_resolution(row) for row in rows)

    def resolutions_page(
        self,
        *,
        resolver: str | None = None,
        since: str | None = None,
        until: str | None = None,
        before: tuple[str, int] | None = None,
        limit: int = 50,
    ) -> tuple[Resolution, ...]:
        """Resolutions of every run, newest first (``at``, then ``id``), from before
        ``before`` on; ``resolver`` exactly, ``since`` and ``until`` as ISO instants."""
        where, params = ["1"], []
        if resolver is not None:
            where.append("resolver = ?")
            params.append(resolver)
        if since is not None:
            where.append("at >= ?")
            params.append(since)
        if until is not None:
            where.append("at < ?")
            params.append(until)
        if before is not None:
            where.append("(at < ? OR (at = ? AND id < ?))")
            params += [before[0], before[0], str(before[1])]
        if self.indexing:
            return ()
        with self.lock:
            if self._refresh() != READY:
                return ()
            rows = self._conn.execute(
                f"""SELECT {_RESOLUTION_COLUMNS} FROM resolutions
                    WHERE {" AND ".join(where)} ORDER BY at DESC, id DESC LIMIT ?""",
                (*params, limit),
            ).fetchall()
        return tuple(_resolution(row) for row in rows)

    def attempts(self, execution_id: str) -> tuple[Attempt, ...] | None:
        """The run's attempts with their spans, oldest first; None without a ``spans``
        table (tracing was off), empty when tracing was on but the run left no span."""
        if self.indexing:
            return ()
        with self.lock:
            state = self._refresh()
            if state != READY:
                return None if state == OFF else ()
            found = self._conn.execute(
                "SELECT trace_id, span_id FROM attempts WHERE execution_id = ?", (execution_id,)
            ).fetchall()
            traces = sorted({str(r[0]) for r in found})
            spans: list[Span] = []
            for trace_id in traces:
                rows = self._conn.execute(
                    """SELECT span_id, trace_id, parent_span_id, name, start_time, end_time,
                              status, attributes, events
                       FROM t.spans WHERE trace_id = ?""",
                    (trace_id,),
                ).fetchall()
                spans.extend(_span(row) for row in rows)
        return attempts_of(spans, {str(r[1]) for r in found})


_RESOLUTION_COLUMNS = "id, execution_id, source, resolver, approved, node, reason, at"


def _resolution(row: tuple[Any, ...]) -> Resolution:
    id_, execution_id, source, resolver, approved, node, reason, at = row
    return Resolution(
        id=int(id_),
        execution_id=str(execution_id),
        source=str(source),
        resolver=str(resolver) if resolver is not None else None,
        approved=None if approved is None else bool(approved),
        node=str(node) if node is not None else None,
        reason=str(reason) if reason is not None else None,
        at=str(at),
    )


def _span(row: tuple[object, ...]) -> Span:
    span_id, trace_id, parent, name, start, end, status, attributes, events = row
    decoded, unreadable = decode_attributes(attributes if isinstance(attributes, str) else None)
    return Span(
        span_id=str(span_id),
        trace_id=str(trace_id),
        parent_span_id=str(parent) if parent else None,
        name=str(name or ""),
        start_time=str(start) if start else None,
        end_time=str(end) if end else None,
        status=str(status or "UNSET"),
        attributes=decoded,
        unreadable=unreadable,
        error=first_exception(events if isinstance(events, str) else None),
        raw_attributes=attributes if isinstance(attributes, str) else None,
        raw_events=events if isinstance(events, str) else None,
    )
