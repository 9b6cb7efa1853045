"""What is measured: the pages and endpoints, their URLs, and the figures kept per server."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.browser import PageWeight
from bench.latency import Timing
from bench.speed import SpeedReading
from bench.stores import BuiltStore
from localui.views.approvals import QUEUE_PAGE

#: Pages followed through ``next`` before the deep page is timed.
DEEP_PAGES = 20

#: Not a page: ``POST /runs/{id}/fork`` with an edited conversation, timed to the
#: branch's first row (``bench.edits``).
EDIT_BRANCH = "edit_branch"

#: Timed on a store with spans only (``localui_urls``).
TRACED_ONLY = ("chain50_html", "chain50_json")

#: What each localui measurement is, in the table's words.
LOCALUI_METRICS: Mapping[str, str] = {
    "runs_first": "runs list, first page (HTML)",
    "runs_first_json": "runs list, first page (JSON)",
    "runs_state": "runs list, state=paused (HTML)",
    "runs_search": "runs list, q=ORDER-ID (HTML)",
    "runs_deep": f"runs list, page {DEEP_PAGES + 1} via next (HTML)¹",
    "run_typical": "run page, 4 rows (HTML)",
    "run50_html": "run page, 50 rows (HTML)",
    "run50_json": "run page, 50 rows (JSON)",
    "run2000_html": "run page, 2,000 rows (HTML)",
    "run2000_json": "run page, 2,000 rows (JSON)",
    "chain50_html": "run page, traced chain of 50 tool nodes (HTML)³",
    "chain50_json": "run page, traced chain of 50 tool nodes (JSON)³",
    "approvals_html": "approvals queue (HTML)",
    "approvals_json": "approvals queue (JSON)",
    "diff_html": "diff of two 1 MB rows, next step (HTML)",
    "diff_json": "diff of two 1 MB rows, next step (JSON)",
    "diff_far_html": "diff of two 1 MB rows, other conversation (HTML)",
    "attention_html": "needs attention, first page (HTML)",
    "attention_json": "needs attention, first page (JSON)",
    "decisions_html": "decision record, first page, a decision per run up to 100,000 (HTML)",
    "decisions_json": "decision record, first page, a decision per run up to 100,000 (JSON)",
    "decisions_csv": "decision record as CSV, every decision, streamed",
    "metrics": "/metrics (Prometheus text)",
    "fork_html": "fork preview, 2,000-row run, from its first row (HTML)",
    "fork_json": "fork preview, 2,000-row run, from its first row (JSON)",
    "compare2000_html": "compare two 2,000-row runs, first page (HTML)",
    "compare2000_json": "compare two 2,000-row runs, first page (JSON)",
    "compare50_html": "compare two 50-row runs (HTML)",
    "compare50_json": "compare two 50-row runs (JSON)",
    EDIT_BRANCH: "an edit's branch: POST to its first row in the store²",
}
SDK_METRICS: Mapping[str, str] = {
    "sdk_run_typical": "/api/executions/{id}, 4 rows",
    "sdk_run50": "/api/executions/{id}, 50 rows",
    "sdk_run2000": "/api/executions/{id}, 2,000 rows (it returns the first 500)",
    "sdk_pending": "/api/pending-interrupts?limit=100 (what its queue asks for)",
    "sdk_pending_page": f"/api/pending-interrupts?limit={QUEUE_PAGE} (our queue page's count)",
}
LOCALUI_PAGES: Mapping[str, str] = {
    "runs": "runs list /",
    "run50": "run page, 50 rows",
    "run2000": "run page, 2,000 rows",
    "approvals": "approvals queue",
    "diff": "diff of two 1 MB rows, next step",
}
SDK_PAGES: Mapping[str, str] = {
    "overview": "home /",
    "run50": "execution page, 50 rows",
    "approvals": "approvals page",
}


def localui_urls(store: BuiltStore, deep_cursor: str | None) -> dict[str, str]:
    diff = f"a={store.big_a}&b={store.big_b}"
    fork = f"checkpoint_id={store.fork_row}"
    compare2000 = f"a={store.run_2000}&b={store.run_2000_b}"
    compare50 = f"a={store.run_50}&b={store.run_50_b}"
    urls = {
        "runs_first": "/",
        "runs_first_json": "/runs.json",
        "runs_state": "/?state=paused",
        "runs_search": f"/?q={store.search}",
        "run_typical": f"/runs/{store.run_typical}",
        "run50_html": f"/runs/{store.run_50}",
        "run50_json": f"/runs/{store.run_50}.json",
        "run2000_html": f"/runs/{store.run_2000}",
        "run2000_json": f"/runs/{store.run_2000}.json",
        "approvals_html": "/approvals",
        "approvals_json": "/approvals.json",
        "diff_html": f"/diff?{diff}",
        "diff_json": f"/diff.json?{diff}",
        "diff_far_html": f"/diff?a={store.big_a}&b={store.big_c}",
        "attention_html": "/attention",
        "attention_json": "/attention.json",
        "decisions_html": "/decisions",
        "decisions_json": "/decisions.json",
        "decisions_csv": "/decisions.csv",
        "metrics": "/metrics",
        "fork_html": f"/runs/{store.run_2000}/fork?{fork}",
        "fork_json": f"/runs/{store.run_2000}/fork.json?{fork}",
        "compare2000_html": f"/compare?{compare2000}",
        "compare2000_json": f"/compare.json?{compare2000}",
        "compare50_html": f"/compare?{compare50}",
        "compare50_json": f"/compare.json?{compare50}",
    }
    if deep_cursor:
        urls["runs_deep"] = f"/?after={deep_cursor}"
    if store.spans:
        # Its spans are in the store with spans only: elsewhere it is an untraced chain.
        urls["chain50_html"] = f"/runs/{store.run_chain50}"
        urls["chain50_json"] = f"/runs/{store.run_chain50}.json"
    return {k: urls[k] for k in LOCALUI_METRICS if k in urls}


#: What the SDK UI's own approvals queue asks for.
SDK_QUEUE = "/api/pending-interrupts?limit=100"


def sdk_urls(store: BuiltStore) -> dict[str, str]:
    return {
        "sdk_run_typical": f"/api/executions/{store.run_typical}",
        "sdk_run50": f"/api/executions/{store.run_50}",
        "sdk_run2000": f"/api/executions/{store.run_2000}",
        "sdk_pending": SDK_QUEUE,
        "sdk_pending_page": f"/api/pending-interrupts?limit={QUEUE_PAGE}",
    }


def median_start(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The median of timed starts, by wall time, with that start's CPU (the lower middle
    one of an even count: a figure that was measured, not an average of two)."""
    ordered = sorted(samples)
    return ordered[(len(ordered) - 1) // 2]


@dataclass
class ServerRun:
    """One server's figures on one store."""

    timings: dict[str, Timing] = field(default_factory=dict)
    inproc: dict[str, dict[str, Any]] = field(default_factory=dict)
    startup_cold_s: float | None = None
    startup_warm_s: float | None = None
    #: Cold start to the runs list answering from the complete runs index.
    indexed_s: float | None = None
    #: On PostgreSQL, cold start to the trigram index for text search (made after).
    search_indexed_s: float | None = None
    memory_kb: dict[str, int] = field(default_factory=dict)
    #: VmRSS of a bare Python that imports the same agent module: the agents' own cost.
    agent_alone_kb: int | None = None
    #: localui again without ``--agents`` (a viewer): a later start, and its memory
    #: after the same warm-up.
    viewer_startup_s: float | None = None
    viewer_memory_kb: dict[str, int] = field(default_factory=dict)
    #: CPU seconds each start had used at its first 200: ``cold``, ``warm``, ``viewer``
    #: (of the median start, when several were timed).
    startup_cpu: dict[str, float] = field(default_factory=dict)
    #: Every timed start of each kind, ``(seconds to the first 200, CPU seconds)``: the
    #: ``startup_*`` figures are their medians (``--starts``).
    start_samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    pages: dict[str, PageWeight] = field(default_factory=dict)
    #: The page number the deep-page timing opened (smaller when the list is short).
    deep_page: int = 0
    #: The 1-minute load average as the timed requests began and as they ended: the
    #: machine is shared, and a busy one slows every figure.
    load: list[float] = field(default_factory=list)
    #: ``bench.speed``'s readings as the timed requests began and as they ended: a
    #: machine that runs Python slower slows every figure, with no load to show it.
    speed: list[SpeedReading] = field(default_factory=list)
    #: Our approvals page (``approvals_html``) and the SDK UI's queue JSON
    #: (``sdk_pending``) timed in turns, both servers up at once (``bench.latency``).
    side_by_side: dict[str, Timing] = field(default_factory=dict)
    #: With targets configured (``--notify-targets``): the server's CPU with no request
    #: made, its watcher alone at work, in per cent of a core.
    watcher_idle_pct: float | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class FleetRun:
    """Two localui processes on one PostgreSQL store while a third process writes runs."""

    #: The runs list on each process (``a``, ``b``) while the writer writes.
    timings: dict[str, Timing] = field(default_factory=dict)
    rate_asked: float = 0.0
    runs_written: int = 0
    runs_completed: int = 0
    write_seconds: float = 0.0
    load: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class StoreRun:
    store: BuiltStore
    localui: ServerRun
    sdk: ServerRun | None
    fleet: FleetRun | None = None
