"""Built stores kept between runs of the benchmark, and found again by what they hold.

A store of a million runs takes about five minutes to build and as long again to
copy into PostgreSQL; neither depends on the code being measured. So a built
store stays in ``--workdir`` with a description beside it (``<store>.json``),
and a PostgreSQL copy carries its key as the schema's comment (set once the copy
has committed, so a copy cut short is never reused). The key names what makes
two stores the same: runs, paused runs, spans or not, the store format below and
the SDK version whose schema the stores start from.
"""

from __future__ import annotations

import dataclasses
import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench.stores import BuiltStore, RunCopy

#: Bump whenever ``bench.stores`` builds different rows for the same size: every
#: cached store of another format is built again.
#: 3: each long run has a sibling to compare it with; a run is named for the edits.
#: 4: a traced chain of 50 tool nodes, its spans in the store with spans.
STORE_FORMAT = "4"


def store_key(*, runs: int, pending: int, spans: bool) -> str:
    sdk = version("fastaiagent")
    return f"format {STORE_FORMAT}, fastaiagent {sdk}, {runs} runs, {pending} paused" + (
        ", spans" if spans else ""
    )


def _description(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _manifest(path: Path) -> Path:
    return path.with_name(path.name + ".runs.tsv")


def load(path: Path, key: str) -> BuiltStore | None:
    """The store at ``path`` when it was built (to the end) for ``key``, else None."""
    described = _description(path)
    if not path.is_file() or not described.is_file():
        return None
    try:
        saved = json.loads(described.read_text())
    except (OSError, ValueError):
        return None
    if saved.get("key") != key:
        return None
    fields: dict[str, Any] = saved["store"]
    fields.pop("built_seconds", None)
    fields["path"] = path
    fields["big_bytes"] = tuple(fields["big_bytes"])
    # A store found again: it took no time to build this run.
    fields["seconds"] = 0.0
    fields["manifest"] = _read_manifest(path)
    return BuiltStore(**fields)


def _read_manifest(path: Path) -> tuple[RunCopy, ...]:
    """What the span pass needs of each run (empty when this store never had it)."""
    from datetime import datetime

    listed = _manifest(path)
    if not listed.is_file():
        return ()
    with listed.open() as lines:
        return tuple(
            RunCopy(eid, order, shape, datetime.fromisoformat(start))
            for eid, order, shape, start in (line.rstrip("\n").split("\t") for line in lines)
        )


def save(store: BuiltStore, key: str) -> None:
    """Describe ``store`` beside it, after it is complete on disk."""
    fields = {
        f.name: getattr(store, f.name)
        for f in dataclasses.fields(store)
        if f.name not in ("path", "manifest")
    }
    fields["built_seconds"] = store.seconds
    if store.manifest:
        with _manifest(store.path).open("w") as out:
            for run in store.manifest:
                out.write(f"{run.execution_id}\t{run.order_id}\t{run.shape}\t")
                out.write(f"{run.start.isoformat()}\n")
    _description(store.path).write_text(json.dumps({"key": key, "store": fields}, indent=1))


def built_seconds(path: Path) -> float | None:
    """How long the cached store at ``path`` took to build when it was built."""
    try:
        return float(json.loads(_description(path).read_text())["store"]["built_seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_of(path: Path) -> str:
    """Which build the store at ``path`` is (a digest of its description, which names
    its sample runs): a PostgreSQL copy of another build of the same size holds other
    ids, so it is copied again rather than reused (two workdirs, one server)."""
    import hashlib

    try:
        return hashlib.sha256(_description(path).read_bytes()).hexdigest()[:12]
    except OSError:
        return "unsaved"


def forget(path: Path) -> None:
    """Drop the description first: a store half rewritten is then never reused."""
    _description(path).unlink(missing_ok=True)
    _manifest(path).unlink(missing_ok=True)
