"""The results table: markdown for people, JSON (with every sample) beside it."""

from __future__ import annotations

import math
import os
import platform
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bench.budgets import Verdict
from bench.model import (
    DEEP_PAGES,
    LOCALUI_METRICS,
    LOCALUI_PAGES,
    SDK_METRICS,
    SDK_PAGES,
    FleetRun,
    ServerRun,
    StoreRun,
)
from bench.servers import REPO
from bench.speed import ROUNDS


@dataclass(frozen=True, slots=True)
class Context:
    command: str
    seconds: float
    templates_seconds: float
    sdk_note: str
    requests: int
    warmup: int
    #: The checkout's commit and whether its app files had changes, when the run began.
    code: str = ""
    #: Which localui was served: the checkout copied at start, or ``--localui-path``.
    app_note: str = ""


def budget_figures(run: StoreRun) -> dict[str, float]:
    """The figures ``bench.budgets`` judges, from localui's measurements on one store."""
    local = run.localui
    figures = {k: t.p50 for k, t in local.timings.items() if t.ok}
    if "VmRSS" in local.memory_kb:
        # localui's share: what a bare Python holding the same agent module does not.
        alone = local.agent_alone_kb or 0
        figures["rss_mb"] = (local.memory_kb["VmRSS"] - alone) * 1024 / 1e6
    if "VmRSS" in local.viewer_memory_kb:
        figures["rss_viewer_mb"] = local.viewer_memory_kb["VmRSS"] * 1024 / 1e6
    # Judged on the two timed in turns, both servers up: figures taken minutes apart
    # on a shared machine differ by more than the budget's margin.
    ours, theirs = (local.side_by_side.get(k) for k in ("approvals_html", "sdk_pending"))
    if ours is not None and theirs is not None and ours.ok and theirs.ok:
        figures["approvals_vs_sdk_ui"] = ours.p50 / theirs.p50
    if local.watcher_idle_pct is not None:
        figures["watcher_idle_pct"] = local.watcher_idle_pct
    for key in ("startup_cold_s", "startup_warm_s", "viewer_startup_s", "indexed_s"):
        value = getattr(local, key)
        if value is not None:
            figures[key.replace("viewer_startup_s", "startup_viewer_s")] = value
    weights = [w for w in local.pages.values() if w.error is None]
    if weights and len(weights) == len(local.pages):
        figures["js_css_kb"] = max(w.js_css_body for w in weights) / 1000
        figures["js_css_wire_kb"] = max(w.js_css_wire for w in weights) / 1000
    return figures


def _add_in_turns(add: Callable[[str], None], r: StoreRun, where: str = "") -> None:
    """The approvals page and the SDK UI's queue JSON, both up, timed in turns."""
    ours, theirs = (r.localui.side_by_side.get(k) for k in ("approvals_html", "sdk_pending"))
    if ours is not None and theirs is not None and ours.ok and theirs.ok:
        add(
            "| approvals: our HTML vs its /api/pending-interrupts, both up, timed in turns"
            f"{where} (p50 ms) | {r.store.label} | {_ms(ours.p50)} | {_ms(theirs.p50)} |"
            f" {_ratio(theirs.p50, ours.p50)} | {_kb(ours.bytes)} / {_kb(theirs.bytes)} |"
        )


def _search_indexed(server: ServerRun) -> str:
    """When the trigram index for text search followed the runs list."""
    if server.search_indexed_s is None:
        return ""
    return f" (trigram index {server.search_indexed_s:.1f} s)"


def _ms(value: float) -> str:
    if math.isnan(value):
        return "–"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _kb(value: int) -> str:
    return f"{value / 1000:,.1f}"


def _ratio(sdk: float | None, ours: float | None) -> str:
    if not sdk or not ours or math.isnan(sdk) or math.isnan(ours):
        return "–"
    return f"{sdk / ours:.1f}×"


def git_state() -> str:
    def run(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    head = run("rev-parse", "--short", "HEAD") or "?"
    dirty = [line for line in run("status", "--porcelain").splitlines() if line]
    app_dirty = [
        line for line in dirty if any(p in line for p in ("localui/", "templates/", "static/"))
    ]
    if app_dirty:
        return f"{head} + uncommitted changes in {len(app_dirty)} app files"
    return head


def _machine() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = ""
    try:
        with open("/proc/meminfo") as info:
            total_kb = int(info.readline().split()[1])
            memory = f", {total_kb / 1e6:.0f} GB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} CPUs ({cpu}){memory}, Python {platform.python_version()}"


def _timing_cell(server: ServerRun | None, key: str) -> str:
    if server is None or key not in server.timings:
        return "–"
    t = server.timings[key]
    if not t.ok:
        return "error"
    cpu = f" ({_ms(t.cpu_ms)})" if t.cpu_ms is not None else ""
    return f"{_ms(t.p50)} / {_ms(t.p95)}{cpu}"


def _speed_words(runs: Sequence[StoreRun]) -> str:
    """The range of ``bench.speed``'s readings over the run, in words."""
    readings = [x.median_ms for r in runs for s in (r.localui, r.sdk) if s for x in s.speed]
    if not readings:
        return "not read (no server's pages were timed)"
    return (
        f"a fixed Python workload (`bench/speed.py`) took {min(readings):.1f} to"
        f" {max(readings):.1f} ms (median of {ROUNDS}) before and after each server's pages;"
        " lower is faster. A machine that runs it slower runs every page slower, load or"
        " none: compare it with an earlier report's before comparing figures."
    )


def markdown(
    runs: Sequence[StoreRun],
    verdicts: Sequence[Verdict],
    errors: Sequence[str],
    ctx: Context,
) -> str:
    lines: list[str] = []
    add = lines.append
    add("# localui benchmark")
    add("")
    add(f"- When: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; took {ctx.seconds:.0f} s in all")
    add(f"- Command: `{ctx.command}`")
    add(f"- Code: {ctx.code}; served: {ctx.app_note}")
    add(f"- Machine: {_machine()}")
    add(f"- Machine speed: {_speed_words(runs)}")
    add(f"- SDK UI: {ctx.sdk_note}")
    add(
        f"- Latency: {ctx.requests} timed GETs per page after {ctx.warmup} warm-up GETs, one"
        " at a time, keep-alive, from an httpx client on loopback to the real server process"
        " (`localui serve`, `fastaiagent ui`); time to the last byte of the body. In-process:"
        " the same URLs through `httpx.ASGITransport` to the app `localui serve` builds, with"
        " its lifespan, no HTTP server."
    )
    add("")
    add("## Budgets")
    add("")
    add(
        "Judged on the loopback p50 at the largest store, with and without spans (the worst"
        " counts). Server CPU: what the server process spent per request, which the machine's"
        " other load does not inflate; when it is under the limit and the p50 is not, the"
        " machine was busy."
    )
    add("")
    add("| budget | limit | measured (worst) | where | server CPU per request | result |")
    add("|---|---|---|---|---|---|")
    by_label = {r.store.label: r for r in runs}
    for v in verdicts:
        b = v.budget
        measured = "not measured" if math.isnan(v.worst) else f"{v.worst:,.4g} {b.unit}"
        if b.unit == "×":
            measured = "not measured" if math.isnan(v.worst) else f"{v.worst:.2f}×"
        if v.missing:
            measured += f" (missing: {', '.join(v.missing)})"
        cpu = "–"
        store_label, _, metric = v.where.partition(" / ")
        # Figures of no store (the demo's starts, the bulk resume) have no page timing.
        run = by_label.get(store_label)
        timing = run.localui.timings.get(metric) if run is not None else None
        if timing is not None and timing.cpu_ms is not None:
            cpu = f"{timing.cpu_ms:,.1f} ms"
        result = "pass" if v.passed else "**MISSED**"
        limit = f"≤ {b.limit:g}×" if b.unit == "×" else f"≤ {b.limit:g} {b.unit}"
        add(f"| {b.what} | {limit} | {measured} | {v.where} | {cpu} | {result} |")
    add("")

    add("## Stores")
    add("")
    add(
        "Real SDK rows (the demo's ten scenarios, and three traced runs for spans: a completed and"
        " a paused agent run, a chain of 50 tool nodes) copied under new ids and times."
        f" Templates written by the SDK in {ctx.templates_seconds:.1f} s."
    )
    add("")
    add("| store | runs | checkpoint rows | pending | spans | file | built in |")
    add("|---|---|---|---|---|---|---|")
    for r in runs:
        s = r.store
        add(
            f"| {s.label} | {s.runs:,} | {s.rows:,} | {s.pending:,} | {s.spans:,} |"
            f" {s.bytes / 1e6:,.0f} MB | {s.seconds:.1f} s |"
        )
    big = runs[0].store.big_bytes if runs else (0, 0, 0)
    add("")
    add(
        "Every store also holds a run of 50 rows and one of 2,000 rows, each with a sibling"
        " of as many rows that asks about another order from its middle row on, one whose"
        " two rows carry"
        f" state snapshots of {big[0] / 1e6:.2f} MB and {big[1] / 1e6:.2f} MB (the next step of"
        f" one conversation), a {big[2] / 1e6:.2f} MB row of another conversation, and a"
        " chain of 50 tool nodes (a row per node, then the run's end) whose spans (the"
        " chain's, one per node) only the store with spans carries."
    )
    add("")

    add("## localui latency (ms, loopback p50 / p95 (server CPU per request))")
    add("")
    add("| page | " + " | ".join(r.store.label for r in runs) + " |")
    add("|---|" + "---|" * len(runs))
    for key, label in LOCALUI_METRICS.items():
        cells = [_timing_cell(r.localui, key) for r in runs]
        add(f"| {label} | " + " | ".join(cells) + " |")
    add("")
    deep = ", ".join(f"{r.store.label}: page {r.localui.deep_page}" for r in runs)
    add(f"¹ The page reached by following `next` (at most {DEEP_PAGES} times): {deep}.")
    add(
        "² From the POST (the row's conversation, its last tool result changed) to the"
        " branch's first row as the SDK stamped it in the store; the answer comes once the"
        " branch has run (offline model). CPU is the server's per edit."
    )
    add(
        "³ Timed on the store with spans only, where the chain's run page shows its trace:"
        " each tool node's call on the row the chain wrote after it."
    )
    add("")
    inproc_runs = [r for r in runs if r.localui.inproc]
    if inproc_runs:
        add("### In-process (ms, p50 / p95 (CPU per request)): the app without the HTTP server")
        add("")
        add("| page | " + " | ".join(r.store.label for r in inproc_runs) + " |")
        add("|---|" + "---|" * len(inproc_runs))
        for key, label in LOCALUI_METRICS.items():
            cells = []
            for r in inproc_runs:
                t = r.localui.inproc.get(key)
                if t is None:
                    cells.append("–")
                elif t.get("error"):
                    cells.append("error")
                else:
                    cpu = f" ({_ms(t['cpu_ms'])})" if t.get("cpu_ms") is not None else ""
                    cells.append(f"{_ms(t['p50_ms'])} / {_ms(t['p95_ms'])}{cpu}")
            add(f"| {label} | " + " | ".join(cells) + " |")
        add("")

    fleet_runs = [r for r in runs if r.fleet is not None]
    if fleet_runs:
        add("### Fleet: two localui processes on one PostgreSQL store while a third writes")
        add("")
        add(
            "Both serve the same store and share its runs index; `bench.fleet_writer` starts"
            " runs through the SDK at the rate asked, and the runs list's first page (HTML) is"
            " timed on one process, then the other, while it writes (so each request finds"
            " new rows to bring into the index, or the other process doing it)."
        )
        add("")
        add(
            "| store | process A runs list | process B runs list | runs written"
            " (asked / done) | load average |"
        )
        add("|---|---|---|---|---|")
        for r in fleet_runs:
            f = r.fleet
            assert f is not None
            cells = []
            for name in ("a", "b"):
                timing = f.timings.get(name)
                if timing is None or not timing.ok:
                    cells.append("error" if timing is not None else "–")
                    continue
                cpu = f" ({_ms(timing.cpu_ms)})" if timing.cpu_ms is not None else ""
                cells.append(f"{_ms(timing.p50)} / {_ms(timing.p95)}{cpu}")
            rate = f.runs_written / f.write_seconds if f.write_seconds else 0.0
            load = " → ".join(f"{x:.1f}" for x in f.load)
            add(
                f"| {r.store.label} | {cells[0]} | {cells[1]} | {f.rate_asked:g}/s /"
                f" {rate:.1f}/s ({f.runs_completed:,} of {f.runs_written:,} completed) | {load} |"
            )
        add("")

    sdk_runs = [r for r in runs if r.sdk is not None]
    add("## SDK UI latency (ms, loopback p50 / p95 (server CPU per request))")
    add("")
    if not sdk_runs:
        add(f"SDK UI {ctx.sdk_note}.")
        add("")
        add("| endpoint | – |")
        add("|---|---|")
        for label in SDK_METRICS.values():
            add(f"| {label} | not measured |")
    else:
        add("| endpoint | " + " | ".join(r.store.label for r in sdk_runs) + " |")
        add("|---|" + "---|" * len(sdk_runs))
        for key, label in SDK_METRICS.items():
            cells = [_timing_cell(r.sdk, key) for r in sdk_runs]
            add(f"| {label} | " + " | ".join(cells) + " |")
    add("")

    add("## Side by side (ratio = SDK UI ÷ localui: above 1× localui is faster or lighter)")
    add("")
    add("| comparison | store | localui | SDK UI | ratio | response KB (localui / SDK UI) |")
    add("|---|---|---|---|---|---|")
    for r in runs:
        if r.sdk is None:
            # On PostgreSQL: the SDK UI reads the SQLite file the same runs came from.
            _add_in_turns(add, r, " (its SQLite file of the same runs)")
    pairs = (
        ("run page, 4 rows: our HTML vs its /api/executions", "run_typical", "sdk_run_typical"),
        ("run page, 50 rows: our HTML vs its /api/executions", "run50_html", "sdk_run50"),
        ("run page, 50 rows: our JSON vs its /api/executions", "run50_json", "sdk_run50"),
        ("run page, 2,000 rows: our HTML vs its /api/executions", "run2000_html", "sdk_run2000"),
        ("run page, 2,000 rows: our JSON vs its /api/executions", "run2000_json", "sdk_run2000"),
        ("approvals: our HTML vs its /api/pending-interrupts", "approvals_html", "sdk_pending"),
        ("approvals: our JSON vs its /api/pending-interrupts", "approvals_json", "sdk_pending"),
        (
            "approvals: our HTML vs its /api/pending-interrupts, as many items",
            "approvals_html",
            "sdk_pending_page",
        ),
        (
            "approvals: our JSON vs its /api/pending-interrupts, as many items",
            "approvals_json",
            "sdk_pending_page",
        ),
    )
    for r in sdk_runs:
        assert r.sdk is not None
        for label, ours_key, sdk_key in pairs:
            ours = r.localui.timings.get(ours_key)
            theirs = r.sdk.timings.get(sdk_key)
            ours_ms = ours.p50 if ours is not None and ours.ok else math.nan
            sdk_ms = theirs.p50 if theirs is not None and theirs.ok else math.nan
            sizes = "–"
            if ours is not None and theirs is not None and ours.ok and theirs.ok:
                sizes = f"{_kb(ours.bytes)} / {_kb(theirs.bytes)}"
            add(
                f"| {label} (p50 ms) | {r.store.label} | {_ms(ours_ms)} | {_ms(sdk_ms)} |"
                f" {_ratio(sdk_ms, ours_ms)} | {sizes} |"
            )
        _add_in_turns(add, r)
        ours_mem = r.localui.memory_kb.get("VmRSS")
        sdk_mem = r.sdk.memory_kb.get("VmRSS")
        add(
            f"| RSS after warm-up (MB) | {r.store.label} |"
            f" {_num(ours_mem, 1024 / 1e6)} | {_num(sdk_mem, 1024 / 1e6)} |"
            f" {_ratio(sdk_mem, ours_mem)} | |"
        )
        add(
            f"| start to first 200 on / (s) | {r.store.label} |"
            f" {_num(r.localui.startup_cold_s)} | {_num(r.sdk.startup_cold_s)} |"
            f" {_ratio(r.sdk.startup_cold_s, r.localui.startup_cold_s)} | |"
        )
        for ours_page, sdk_page, what in (
            ("run50", "run50", "run page, 50 rows"),
            ("approvals", "approvals", "approvals page"),
        ):
            ow = r.localui.pages.get(ours_page)
            tw = r.sdk.pages.get(sdk_page)
            if ow is None or tw is None:
                continue
            for attr, unit in (
                ("js_css_body", "JS+CSS KB uncompressed"),
                ("js_css_wire", "JS+CSS KB on the wire"),
                ("total_body", "all bytes KB uncompressed"),
                ("total_wire", "all bytes KB on the wire"),
                ("requests", "requests"),
            ):
                o_v = getattr(ow, attr)
                t_v = getattr(tw, attr)
                shown = (str(o_v), str(t_v))
                if attr != "requests":
                    shown = (_num(o_v, 1 / 1000), _num(t_v, 1 / 1000))
                add(
                    f"| {what}, cold load, {unit} | {r.store.label} |"
                    f" {shown[0]} | {shown[1]} | {_ratio(t_v, o_v)} | |"
                )
    if not sdk_runs:
        add(f"| every comparison | – | – | {ctx.sdk_note} | – | |")
    add("")

    add("## Page weight (cold load in Chromium, KB; wire = encoded body bytes)")
    add("")
    add(
        "| server | page | requests | HTML | HTML wire | JS+CSS | JS+CSS wire | all | all wire"
        " | encoding |"
    )
    add("|---|---|---|---|---|---|---|---|---|---|")
    weighed = False
    for r in runs:
        for server_name, server, names in (
            ("localui", r.localui, LOCALUI_PAGES),
            ("SDK UI", r.sdk, SDK_PAGES),
        ):
            if server is None:
                continue
            for key, label in names.items():
                w = server.pages.get(key)
                if w is None:
                    continue
                weighed = True
                if w.error:
                    add(f"| {server_name} | {label} | error: {w.error} |" + " |" * 7)
                    continue
                add(
                    f"| {server_name} | {label} | {w.requests} | {_kb(w.html_body)} |"
                    f" {_kb(w.html_wire)} | {_kb(w.js_css_body)} | {_kb(w.js_css_wire)} |"
                    f" {_kb(w.total_body)} | {_kb(w.total_wire)} |"
                    f" {', '.join(sorted(w.encodings)) or 'none'} |"
                )
    if not weighed:
        add("| – | not measured | | | | | | | | |")
    add("")

    add("## Memory and start-up")
    add("")
    add(
        "| server | store | start to first 200, cold (CPU) | runs index complete, cold"
        " | warm (CPU) | VmRSS after warm-up | VmHWM | load average while timed"
        " | machine speed while timed |"
    )
    add("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        if r.localui.viewer_startup_s is not None:
            add(
                f"| localui without agents | {r.store.label} | – | – |"
                f" {_startup(r.localui.viewer_startup_s, r.localui.startup_cpu.get('viewer'))}"
                f"{_samples(r.localui, 'viewer')} |"
                f" {_num(r.localui.viewer_memory_kb.get('VmRSS'), 1024 / 1e6)} MB |"
                f" {_num(r.localui.viewer_memory_kb.get('VmHWM'), 1024 / 1e6)} MB | – | – |"
            )
        for name, server in (("localui", r.localui), ("SDK UI", r.sdk)):
            if server is None:
                continue
            add(
                f"| {name} | {r.store.label} |"
                f" {_startup(server.startup_cold_s, server.startup_cpu.get('cold'))}"
                f"{_samples(server, 'cold')} |"
                f" {_num(server.indexed_s)}{' s' if server.indexed_s is not None else ''}"
                f"{_search_indexed(server)} |"
                f" {_startup(server.startup_warm_s, server.startup_cpu.get('warm'))}"
                f"{_samples(server, 'warm')} |"
                f" {_num(server.memory_kb.get('VmRSS'), 1024 / 1e6)} MB |"
                f" {_num(server.memory_kb.get('VmHWM'), 1024 / 1e6)} MB |"
                f" {' → '.join(f'{x:.1f}' for x in server.load) or '–'} |"
                f" {' → '.join(f'{x.median_ms:.1f} ms' for x in server.speed) or '–'} |"
            )
    add("")
    add(
        "localui: `localui serve --store STORE --agents bench/agents.py:refund_bot"
        " bench/agents.py:audit_chain` (the demo agent the copied agent runs name and the chain"
        " the copied chain names, as a user registers theirs); without agents: the same"
        " without `--agents`. Cold: a fresh `XDG_CACHE_HOME` (localui keeps its runs index"
        " there), so the first start on the store; warm: served again with what the first"
        " start left. Each kind of localui start is timed `--starts` times (the medians"
        " count, and every start is listed). On a first start localui answers `/` at once"
        ' with the runs written to most recently and says it is indexing; "runs index'
        ' complete" is when its runs list, counts and filters answer from the whole index'
        " (the latency tables are timed after that). The SDK UI keeps nothing between"
        " starts. SDK UI `/` is its static single-page shell; localui `/` is the runs list."
        " VmHWM: the peak resident size."
    )
    add("")
    if errors:
        add("## Errors")
        add("")
        for e in errors:
            add(f"- {e}")
        add("")
    return "\n".join(lines)


def _samples(server: ServerRun, kind: str) -> str:
    """Every start of a kind, when several were timed (the figure before is their median)."""
    samples = server.start_samples.get(kind, [])
    if len(samples) < 2:
        return ""
    return f"; median of {', '.join(_num(wall) for wall, _cpu in samples)} s"


def _startup(wall: float | None, cpu: float | None) -> str:
    if wall is None:
        return "–"
    return f"{_num(wall)} s ({_num(cpu)} s)"


def _num(value: float | int | None, scale: float = 1.0) -> str:
    if value is None:
        return "–"
    scaled = value * scale
    if scaled >= 100:
        return f"{scaled:,.0f}"
    return f"{scaled:.2f}" if scaled < 10 else f"{scaled:.1f}"


def _server_json(server: ServerRun | None) -> Mapping[str, Any] | None:
    if server is None:
        return None
    return {
        "timings": {k: t.as_json() for k, t in server.timings.items()},
        "side_by_side": {k: t.as_json() for k, t in server.side_by_side.items()},
        "inproc": server.inproc,
        "startup_cold_s": server.startup_cold_s,
        "startup_warm_s": server.startup_warm_s,
        "indexed_s": server.indexed_s,
        "search_indexed_s": server.search_indexed_s,
        "memory_kb": server.memory_kb,
        "agent_alone_kb": server.agent_alone_kb,
        "viewer_startup_s": server.viewer_startup_s,
        "viewer_memory_kb": server.viewer_memory_kb,
        "startup_cpu_s": server.startup_cpu,
        "start_samples": server.start_samples,
        "load": server.load,
        "speed": [x.as_json() for x in server.speed],
        "deep_page": server.deep_page,
        "pages": {k: w.as_json() for k, w in server.pages.items()},
        "errors": server.errors,
    }


def as_json(
    runs: Sequence[StoreRun],
    verdicts: Sequence[Verdict],
    errors: Sequence[str],
    ctx: Context,
) -> dict[str, Any]:
    return {
        "command": ctx.command,
        "seconds": ctx.seconds,
        "code": ctx.code,
        "served": ctx.app_note,
        "machine": _machine(),
        "sdk_ui": ctx.sdk_note,
        "budgets": [
            {
                "what": v.budget.what,
                "limit": v.budget.limit,
                "unit": v.budget.unit,
                "worst": None if math.isnan(v.worst) else v.worst,
                "where": v.where,
                "figures": dict(v.figures),
                "missing": list(v.missing),
                "passed": v.passed,
            }
            for v in verdicts
        ],
        "stores": [
            {
                "label": r.store.label,
                "runs": r.store.runs,
                "rows": r.store.rows,
                "pending": r.store.pending,
                "spans": r.store.spans,
                "bytes": r.store.bytes,
                "build_s": r.store.seconds,
                "localui": _server_json(r.localui),
                "sdk_ui": _server_json(r.sdk),
                "fleet": _fleet_json(r.fleet),
            }
            for r in runs
        ],
        "errors": list(errors),
    }


def _fleet_json(fleet: FleetRun | None) -> dict[str, Any] | None:
    if fleet is None:
        return None
    return {
        "timings": {k: t.as_json() for k, t in fleet.timings.items()},
        "rate_asked": fleet.rate_asked,
        "runs_written": fleet.runs_written,
        "runs_completed": fleet.runs_completed,
        "write_seconds": fleet.write_seconds,
        "load": fleet.load,
        "errors": fleet.errors,
    }
