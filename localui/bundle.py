"""A run you can hand to someone: one file with everything its pages show.

``localui export RUN_ID`` (and ``GET /runs/{id}/bundle``) writes a gzipped JSON
file with the run's checkpoint rows, its pause, its cache entries, the decisions
localui recorded for it, its forks' ids and its trace spans. ``localui open
FILE…`` loads one or more bundles into a fresh SQLite file laid out as the SDK's
store, and serves it read-only with the same pages. ``--redact KEY`` replaces the
values of those keys everywhere, JSON held inside strings included.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localui import runs
from localui.backends.base import DecisionLog, NoteLog, Store
from localui.backends.notes import TABLE as NOTES_TABLE
from localui.backends.sqlite.connect import connect
from localui.backends.traces import SpanIndex
from localui.errors import LocalUIError, NotFound, no_such_run
from localui.records import IDEMPOTENT_ENVELOPE

#: The bundle format this localui writes; it reads this one and older.
FORMAT = 1
#: What a redacted value becomes.
REDACTED = "[redacted]"
_MAGIC = "localui-bundle"


class BundleError(LocalUIError):
    """A file that is not a bundle this localui can read, said in one line."""

    status_code = 400
    title = "Unreadable bundle"


def _checkpoint(store: Store, checkpoint_id: str) -> dict[str, Any]:
    detail = store.get_row(checkpoint_id)
    if detail is None:
        raise NotFound(f"row {checkpoint_id!r} left the store while it was exported")
    h = detail.header
    return {
        "id": h.checkpoint_id,
        "checkpoint_id": h.checkpoint_id,
        "chain_name": h.agent,
        "execution_id": h.execution_id,
        "node_id": h.node_id,
        "node_index": h.node_index,
        "status": h.status,
        "step_type": h.step_type,
        "parent_checkpoint_id": h.parent_checkpoint_id,
        "interrupt_reason": h.interrupt_reason,
        "agent_path": h.agent_path,
        "created_at": h.created_at,
        "synced": h.synced,
        "sync_error": h.sync_error,
        "iteration": detail.iteration,
        **{name: detail.raw.get(name) for name in _PAYLOADS},
    }


_PAYLOADS = ("state_snapshot", "node_input", "node_output", "interrupt_context")


def run_record(
    store: Store,
    execution_id: str,
    decisions: DecisionLog | None,
    traces: SpanIndex | None,
    notes: NoteLog | None = None,
) -> dict[str, Any]:
    """One run as a bundle holds it."""
    headers = store.list_rows(execution_id)
    if not headers:
        raise no_such_run(execution_id, listed=store.listed(execution_id))
    pending = store.get_pending(execution_id)
    attempts = traces.attempts(execution_id) if traces is not None else None
    spans = []
    for attempt in attempts or ():
        for span in (attempt.root, *attempt.children):
            spans.append(
                {
                    "span_id": span.span_id,
                    "trace_id": span.trace_id,
                    "parent_span_id": span.parent_span_id,
                    "name": span.name,
                    "start_time": span.start_time,
                    "end_time": span.end_time,
                    "status": span.status,
                    "attributes": span.raw_attributes,
                    "events": span.raw_events,
                }
            )
    facts = store.get_run(execution_id)
    return {
        "execution_id": execution_id,
        # How the run ended as this store reads it, and why when the SDK stopped it on
        # purpose (its run-end row's ``run_reason``: ``cancelled``, ``timeout``).
        "state": runs.state_of(facts) if facts is not None else None,
        "run_reason": facts.run_reason if facts is not None else None,
        "checkpoints": [_checkpoint(store, h.checkpoint_id) for h in headers],
        "pending": None
        if pending is None
        else {
            "execution_id": pending.execution_id,
            "chain_name": pending.agent,
            "node_id": pending.node_id,
            "reason": pending.reason,
            "context": json.dumps(pending.context),
            "agent_path": pending.agent_path,
            "created_at": pending.created_at,
        },
        "cache": [
            {
                "function_key": e.function_key,
                "result": json.dumps({IDEMPOTENT_ENVELOPE: e.value} if e.enveloped else e.value),
                "created_at": e.created_at,
            }
            for e in store.list_cache(execution_id)
        ],
        "decisions": [
            {
                "kind": d.kind,
                "checkpoint_id": d.checkpoint_id,
                "approved": d.approved,
                "actor": d.actor,
                "reason": d.reason,
                "decided_at": d.decided_at,
                "outcome": d.outcome,
                "detail": d.detail,
                "finished_at": d.finished_at,
            }
            for d in (decisions.list_for_run(execution_id) if decisions is not None else ())
        ],
        # Notes people left on its pauses (``localui.backends.notes``): no decisions.
        "notes": [
            {
                "checkpoint_id": n.checkpoint_id,
                "author": n.author,
                "text": n.text,
                "created_at": n.created_at,
            }
            for n in (notes.for_run(execution_id) if notes is not None else ())
        ],
        "forks": [link.execution_id for link in store.list_forks(execution_id)],
        "traced": attempts is not None,
        "spans": spans,
    }


def redact(value: Any, keys: frozenset[str]) -> Any:
    """``value`` with the values of ``keys`` replaced, in JSON text inside strings too."""
    if not keys:
        return value
    if isinstance(value, dict):
        return {k: REDACTED if k in keys else redact(v, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, keys) for v in value]
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            inner = json.loads(value)
        except (ValueError, RecursionError):
            return value
        return json.dumps(redact(inner, keys))
    return value


#: Where a run's payloads are, per part of a run record: redaction looks only there,
#: so a key named like a column (``status``, ``execution_id``) keeps the bundle whole.
_PAYLOAD_FIELDS = {
    "checkpoints": _PAYLOADS,
    "cache": ("result",),
    "spans": ("attributes", "events"),
}


def redact_run(run: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    if not keys:
        return run
    out = dict(run)
    for part, fields in _PAYLOAD_FIELDS.items():
        out[part] = [
            {k: redact(v, keys) if k in fields else v for k, v in item.items()}
            for item in run.get(part) or ()
        ]
    if run.get("pending"):
        out["pending"] = {**run["pending"], "context": redact(run["pending"]["context"], keys)}
    return out


def build_bundle(
    store: Store,
    execution_ids: Sequence[str],
    *,
    decisions: DecisionLog | None = None,
    traces: SpanIndex | None = None,
    redact_keys: Iterable[str] = (),
    notes: NoteLog | None = None,
) -> bytes:
    """The bundle file's bytes for ``execution_ids``."""
    keys = frozenset(redact_keys)
    runs = [
        redact_run(run_record(store, eid, decisions, traces, notes), keys) for eid in execution_ids
    ]
    document = {
        "format": _MAGIC,
        "version": FORMAT,
        "exported_at": datetime.now(UTC).isoformat(),
        "redacted_keys": sorted(keys),
        "runs": runs,
    }
    return gzip.compress(json.dumps(document).encode(), compresslevel=6)


@dataclass(frozen=True, slots=True)
class Bundle:
    path: Path
    runs: tuple[dict[str, Any], ...]


def read_bundle(path: Path) -> Bundle:
    """The bundle at ``path``; raises :class:`BundleError` with a one-line reason."""
    try:
        data = gzip.decompress(path.read_bytes())
        document = json.loads(data)
    except OSError as exc:
        raise BundleError(f"{path}: cannot be read as a localui bundle ({exc})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise BundleError(f"{path}: damaged or truncated ({exc})") from None
    except (ValueError, RecursionError) as exc:
        raise BundleError(f"{path}: damaged, its content is not JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != _MAGIC:
        raise BundleError(f"{path}: not a localui bundle")
    version = document.get("version")
    if not isinstance(version, int):
        raise BundleError(f"{path}: damaged, it names no bundle version")
    if version > FORMAT:
        raise BundleError(
            f"{path}: written by a newer localui (bundle format {version}; this one reads "
            f"up to {FORMAT}): upgrade localui to open it"
        )
    runs = document.get("runs")
    if not isinstance(runs, list) or not all(
        isinstance(r, dict) and isinstance(r.get("checkpoints"), list) for r in runs
    ):
        raise BundleError(f"{path}: damaged, its runs are not readable")
    return Bundle(path=path, runs=tuple(runs))


_TABLES = """
CREATE TABLE checkpoints (
    id TEXT PRIMARY KEY, chain_name TEXT NOT NULL, execution_id TEXT NOT NULL,
    node_id TEXT NOT NULL, node_index INTEGER, status TEXT DEFAULT 'completed',
    state_snapshot TEXT DEFAULT '{}', node_input TEXT DEFAULT '{}',
    node_output TEXT DEFAULT '{}', iteration INTEGER DEFAULT 0,
    iteration_counters TEXT DEFAULT '{}', created_at TEXT, checkpoint_id TEXT,
    parent_checkpoint_id TEXT, interrupt_reason TEXT, interrupt_context TEXT DEFAULT '{}',
    agent_path TEXT, project_id TEXT NOT NULL DEFAULT '', synced INTEGER NOT NULL DEFAULT 0,
    sync_error TEXT, step_type TEXT
);
CREATE INDEX idx_cp_exec ON checkpoints (execution_id);
CREATE INDEX idx_cp_checkpoint_id ON checkpoints (checkpoint_id);
CREATE TABLE pending_interrupts (
    execution_id TEXT NOT NULL PRIMARY KEY, chain_name TEXT NOT NULL, node_id TEXT NOT NULL,
    reason TEXT NOT NULL, context TEXT NOT NULL, agent_path TEXT, created_at TEXT NOT NULL,
    project_id TEXT NOT NULL DEFAULT ''
);
CREATE TABLE idempotency_cache (
    execution_id TEXT NOT NULL, function_key TEXT NOT NULL, result TEXT NOT NULL,
    created_at TEXT NOT NULL, project_id TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (execution_id, function_key)
);
"""
_SPANS = """
CREATE TABLE spans (
    span_id TEXT PRIMARY KEY, trace_id TEXT NOT NULL, parent_span_id TEXT, name TEXT,
    start_time TEXT, end_time TEXT, status TEXT DEFAULT 'OK', attributes TEXT DEFAULT '{}',
    events TEXT DEFAULT '[]', project_id TEXT NOT NULL DEFAULT '',
    synced INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX idx_spans_trace_id ON spans (trace_id);
"""
_DECISIONS = """INSERT INTO localui_decisions (kind, execution_id, checkpoint_id, approved,
    actor, reason, decided_at, outcome, detail, finished_at)
    VALUES (:kind, :execution_id, :checkpoint_id, :approved, :actor, :reason, :decided_at,
    :outcome, :detail, :finished_at)"""
_NOTES = f"""INSERT INTO {NOTES_TABLE} (execution_id, checkpoint_id, author, text, created_at)
    VALUES (:execution_id, :checkpoint_id, :author, :text, :created_at)"""


#: The columns a bundle may fill, per table: names come from the file, so only these
#: ever reach the SQL.
_COLUMNS = {
    "checkpoints": frozenset(
        ("id", "checkpoint_id", "chain_name", "execution_id", "node_id", "node_index")
        + ("status", "step_type", "parent_checkpoint_id", "interrupt_reason", "agent_path")
        + ("created_at", "synced", "sync_error", "iteration")
        + _PAYLOADS
    ),
    "pending_interrupts": frozenset(
        ("execution_id", "chain_name", "node_id", "reason", "context", "agent_path", "created_at")
    ),
    "idempotency_cache": frozenset(("execution_id", "function_key", "result", "created_at")),
    "spans": frozenset(
        ("span_id", "trace_id", "parent_span_id", "name", "start_time", "end_time", "status")
        + ("attributes", "events")
    ),
}


def _insert(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    unknown = set(row) - _COLUMNS[table]
    if unknown:
        raise BundleError(f"damaged bundle: unknown {table} columns {sorted(unknown)}")
    names = ", ".join(row)
    marks = ", ".join(f":{name}" for name in row)
    conn.execute(f"INSERT OR REPLACE INTO {table} ({names}) VALUES ({marks})", row)


def load_bundles(bundles: Sequence[Bundle], target: Path) -> None:
    """Write the bundles' runs into a new SQLite store at ``target``, laid out as the
    SDK's (with the spans table only when a run was traced), and localui's decisions
    and notes."""
    from localui.backends.sqlite.decisions import SQLiteDecisionLog
    from localui.backends.sqlite.notes import SQLiteNotes

    traced = any(r.get("traced") for b in bundles for r in b.runs)
    conn = connect(target, "rwc")
    try:
        with conn:
            conn.executescript(_TABLES + (_SPANS if traced else ""))
            for bundle in bundles:
                for run in bundle.runs:
                    _load_run(conn, run, bundle.path)
    except (sqlite3.Error, KeyError, TypeError, AttributeError) as exc:
        raise BundleError(f"damaged bundle: a run cannot be loaded ({exc})") from None
    finally:
        conn.close()
    SQLiteDecisionLog(target, writable=True).close()
    SQLiteNotes(target, writable=True).close()
    conn = connect(target, "rwc")
    try:
        with conn:
            for bundle in bundles:
                for run in bundle.runs:
                    for decision in run.get("decisions") or ():
                        conn.execute(_DECISIONS, {**decision, "execution_id": run["execution_id"]})
                    for note in run.get("notes") or ():
                        conn.execute(_NOTES, {**note, "execution_id": run["execution_id"]})
    except (sqlite3.Error, KeyError, TypeError) as exc:
        raise BundleError(
            f"damaged bundle: its decisions or notes cannot be loaded ({exc})"
        ) from None
    finally:
        conn.close()


def _load_run(conn: sqlite3.Connection, run: dict[str, Any], path: Path) -> None:
    execution_id = run["execution_id"]
    if not isinstance(execution_id, str):
        raise BundleError(f"{path}: damaged, a run has no execution id")
    for row in run["checkpoints"]:
        _insert(conn, "checkpoints", dict(row))
    if run.get("pending"):
        _insert(conn, "pending_interrupts", dict(run["pending"]))
    for entry in run.get("cache") or ():
        _insert(conn, "idempotency_cache", {**entry, "execution_id": execution_id})
    for span in run.get("spans") or ():
        _insert(conn, "spans", dict(span))
