"""The budgets and how a set of measurements is judged against them.

Latency budgets are judged on the loopback p50 (``bench.latency``) of every
page they name, at the largest store size measured, with and without spans:
the worst figure is the one that counts. Some hold at one size only (text
search may take 25 ms at a million runs; the runs index must be complete
within 60 s there), one is relative: the approvals page against the SDK
UI's own JSON of the queue, on the same store, when the SDK UI was measured,
and one is judged only where a store with spans was measured: the run page of
the traced chain, whose trace is in that store alone.
Sizes are decimal: 1 KB = 1,000 bytes, 1 MB = 1,000,000 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Budget:
    key: str
    what: str
    limit: float
    unit: str
    #: The measurements it judges (metric keys; see ``bench.__main__``).
    metrics: tuple[str, ...]
    #: Judged when the largest store has at least ``min_runs`` runs and fewer than
    #: ``below_runs`` (None: no upper bound).
    min_runs: int = 0
    below_runs: int | None = None
    #: Judged only when the SDK UI was measured beside localui.
    needs_sdk_ui: bool = False
    #: Judged only when ``localui demo`` was started (``--demo-starts``).
    needs_demo: bool = False
    #: Judged only when a store with spans was measured (``--span-sizes``; SQLite).
    needs_spans: bool = False

    def applies(
        self, runs: int, *, with_sdk_ui: bool, with_demo: bool = False, with_spans: bool = False
    ) -> bool:
        below = self.below_runs is None or runs < self.below_runs
        return (
            self.min_runs <= runs
            and below
            and (with_sdk_ui or not self.needs_sdk_ui)
            and (with_demo or not self.needs_demo)
            and (with_spans or not self.needs_spans)
        )


#: Where the budgets for a million runs begin.
MILLION = 1_000_000


BUDGETS: tuple[Budget, ...] = (
    Budget(
        "runs_list",
        "runs list p50 (first page, state filter, page 21)",
        15,
        "ms",
        ("runs_first", "runs_first_json", "runs_state", "runs_deep"),
    ),
    Budget(
        "runs_search",
        "runs list p50, text search (q=), under a million runs",
        15,
        "ms",
        ("runs_search",),
        below_runs=MILLION,
    ),
    Budget(
        "runs_search_1m",
        "runs list p50, text search (q=), a million runs",
        25,
        "ms",
        ("runs_search",),
        min_runs=MILLION,
    ),
    Budget("run_50", "run page p50, 50 rows", 10, "ms", ("run50_html", "run50_json")),
    Budget("run_2000", "run page p50, 2,000 rows", 100, "ms", ("run2000_html", "run2000_json")),
    Budget(
        "run_chain_50",
        "run page p50, a traced chain of 50 tool nodes (store with spans)",
        15,
        "ms",
        ("chain50_html", "chain50_json"),
        needs_spans=True,
    ),
    Budget(
        "approvals", "approvals p50, 1,000 pending", 20, "ms", ("approvals_html", "approvals_json")
    ),
    Budget(
        "approvals_vs_sdk_ui",
        "approvals page p50 over the SDK UI's /api/pending-interrupts?limit=100 p50, same store",
        1,
        "×",
        ("approvals_vs_sdk_ui",),
        needs_sdk_ui=True,
    ),
    Budget(
        "diff",
        "diff of two 1 MB snapshots, p50",
        300,
        "ms",
        ("diff_html", "diff_json", "diff_far_html"),
    ),
    Budget(
        "rss",
        "RSS after warm-up, demo agent and chain registered (--agents), minus a bare Python "
        "importing the same agent module",
        80,
        "MB",
        ("rss_mb",),
    ),
    Budget("rss_viewer", "RSS after warm-up, no agents registered", 80, "MB", ("rss_viewer_mb",)),
    Budget(
        "startup",
        "process start to first 200 on /, first start on a store",
        1,
        "s",
        ("startup_cold_s",),
    ),
    Budget(
        "startup_warm",
        "process start to first 200 on /, later starts",
        1,
        "s",
        ("startup_warm_s", "startup_viewer_s"),
    ),
    Budget(
        "indexed",
        "runs index complete after a first start, a million runs",
        60,
        "s",
        ("indexed_s",),
        min_runs=MILLION,
    ),
    Budget(
        "attention",
        "needs attention p50, first page",
        15,
        "ms",
        ("attention_html", "attention_json"),
    ),
    Budget(
        "decisions",
        "decision record p50, first page, a decision per run (100,000 at 100k runs)",
        15,
        "ms",
        ("decisions_html", "decisions_json"),
    ),
    Budget(
        "decisions_csv",
        "decision record as CSV, streamed in full, p50 (100,000 decisions at 100k runs)",
        3000,
        "ms",
        ("decisions_csv",),
    ),
    Budget("metrics", "/metrics p50", 5, "ms", ("metrics",)),
    Budget("fork", "fork preview p50, 2,000-row run", 30, "ms", ("fork_html", "fork_json")),
    Budget(
        "compare_2000",
        "compare p50, two 2,000-row runs, first page",
        150,
        "ms",
        ("compare2000_html", "compare2000_json"),
    ),
    Budget(
        "compare_50", "compare p50, two 50-row runs", 15, "ms", ("compare50_html", "compare50_json")
    ),
    Budget(
        "edit_branch",
        "an edit's branch: POST /runs/{id}/fork with messages to the branch's first row in"
        " the store, p50",
        1000,
        "ms",
        ("edit_branch",),
    ),
    Budget(
        "demo_first_page",
        "localui demo: process start to first 200 on /, median of several starts",
        3,
        "s",
        ("demo_first_page_s",),
        needs_demo=True,
    ),
    Budget(
        "demo_seeded",
        "localui demo: process start to every demo run seeded, median of several starts",
        20,
        "s",
        ("demo_seeded_s",),
        needs_demo=True,
    ),
    # 80 KB until "Notify me", the title's waiting count and the one-tab notification
    # (1.6 KB of live-shared.js) came; 82 KB until notes on a pause (kept live on the
    # queue and the card's page, 1.3 KB of desk.js and CSS) and the person's own menu
    # (away and back, 0.4 KB of CSS). The design's bar is the one on the wire, below.
    Budget("js_css", "JS + CSS per page, uncompressed", 84, "KB", ("js_css_kb",)),
    Budget("js_css_wire", "JS + CSS per page, on the wire", 30, "KB", ("js_css_wire_kb",)),
)


#: Bulk resume after an outage (``bench/bulk_resume.py``), judged on its own figures: a
#: fresh store of crashed runs, whatever the sizes of the other rows.
BULK_RESUME_BUDGETS: tuple[Budget, ...] = (
    Budget(
        "bulk_resume",
        "bulk resume after an outage: 1,000 crashed runs (unless told), first post to last answer",
        120,
        "s",
        ("bulk_resume_s",),
    ),
    Budget(
        "bulk_resume_once",
        "bulk resume: runs not ended as one resume would end them (read from the store)",
        0,
        "",
        ("bulk_resume_not_once",),
    ),
    Budget(
        "bulk_resume_twice",
        "bulk resume: runs resumed twice or a tool run twice (the ledger of effects)",
        0,
        "",
        ("bulk_resume_twice",),
    ),
    Budget(
        "bulk_resume_again",
        "bulk resume: runs resumed again by the same picks posted again",
        0,
        "",
        ("bulk_resume_again",),
    ),
)


@dataclass(frozen=True, slots=True)
class Verdict:
    budget: Budget
    #: The worst figure, and where it was measured (``store / metric``).
    worst: float
    where: str
    #: Every figure judged, by ``store / metric``.
    figures: Mapping[str, float]
    missing: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.missing and not math.isnan(self.worst) and self.worst <= self.budget.limit


def applicable(
    runs: int, *, with_sdk_ui: bool, with_demo: bool = False, with_spans: bool = False
) -> tuple[Budget, ...]:
    """The budgets that hold for a largest store of ``runs`` runs."""
    return tuple(
        b
        for b in BUDGETS
        if b.applies(runs, with_sdk_ui=with_sdk_ui, with_demo=with_demo, with_spans=with_spans)
    )


def judge(
    figures_by_store: Mapping[str, Mapping[str, float]],
    *,
    runs: int,
    with_sdk_ui: bool,
    with_demo: bool = False,
    with_spans: bool = False,
    budgets: Sequence[Budget] | None = None,
) -> list[Verdict]:
    """Each budget that holds at ``runs`` runs against the figures of every store judged;
    a metric that no store has a figure for is a failure (page weight, say, is measured
    on one store only)."""
    verdicts = []
    chosen = (
        applicable(runs, with_sdk_ui=with_sdk_ui, with_demo=with_demo, with_spans=with_spans)
        if budgets is None
        else budgets
    )
    for budget in chosen:
        figures: dict[str, float] = {}
        for store, figures_of_store in figures_by_store.items():
            for metric in budget.metrics:
                value = figures_of_store.get(metric)
                if value is not None and not math.isnan(value):
                    figures[f"{store} / {metric}"] = value
        missing = [m for m in budget.metrics if not any(k.endswith(f" / {m}") for k in figures)]
        where, worst = max(figures.items(), key=lambda kv: kv[1], default=("", math.nan))
        verdicts.append(
            Verdict(
                budget=budget, worst=worst, where=where, figures=figures, missing=tuple(missing)
            )
        )
    return verdicts


def all_passed(verdicts: Sequence[Verdict]) -> bool:
    return all(v.passed for v in verdicts)


#: Several replicas behind a load balancer (``bench.team``; PostgreSQL only).
TEAM_BUDGETS: tuple[Budget, ...] = (
    Budget(
        "team_pages",
        "runs list and run page p50 through HAProxy over two replicas, over one replica direct",
        1.3,
        "x",
        ("team_pages_ratio",),
    ),
    Budget(
        "team_seen",
        "a run written by another process, on the runs list of each replica (worst of 5)",
        1.0,
        "s",
        ("team_seen_s",),
    ),
    Budget(
        "team_restart",
        "people signed out by a replica's restart (5 signed in)",
        0,
        "",
        ("team_signed_out",),
    ),
)


#: The audit log at a million rows (``bench.audit``; both backends).
AUDIT_BUDGETS: tuple[Budget, ...] = (
    Budget(
        "audit_page", "/audit first page p50, a million audit rows", 15, "ms", ("audit_page_ms",)
    ),
    Budget("audit_verify", "localui audit verify of a million rows", 10, "s", ("audit_verify_s",)),
    Budget(
        "audit_append",
        "an audited action's extra work (one append to the chain) p50",
        2,
        "ms",
        ("audit_append_ms",),
    ),
)
