"""The fleet in Prometheus's text format, for the monitoring a team runs (``/metrics``).

Every value comes from what localui already keeps: run counts per state, the
attention counts and the outbox totals from the runs index (one catch-up and one
statement a scrape), the pause count from the SDK's small pending table, and the
decision record folded in a little at a time (each scrape reads only the decisions
finished since the one before). The exposition is ``prometheus_client``'s, over a
registry of this app's own.

Metric names (``docs/monitoring.md`` has the scrape config, a dashboard and alerts):

- ``localui_runs{state}``: runs per state, as the runs list counts them;
- ``localui_pending_approvals``: pauses waiting for a person;
- ``localui_oldest_pause_age_seconds``: how long the oldest of them has waited (0: none);
- ``localui_stalled_runs``: unfinished runs with no row for longer than ``--stale-after``;
- ``localui_attention_runs{reason}``: runs that need a person, per reason;
- ``localui_outbox_rows{state}``: rows ``waiting`` for the plane, or ``quarantined``;
- ``localui_decisions_total{kind,outcome}``: decisions localui recorded, by how they ended;
- ``localui_decision_latency_seconds``: from the pause to its decision (a histogram);
- ``localui_request_duration_seconds{route}``: how long this server took to answer.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from starlette.types import ASGIApp, Receive, Scope, Send

from localui import runs
from localui.backends.base import STATES, DecisionLog, Store
from localui.errors import Unavailable
from localui.offloop import read_ahead
from localui.records import APPROVAL, FleetCounts
from localui.settings import Settings

#: Upper bounds of the decision latency histogram, in seconds: a minute to a day.
LATENCY_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0)
#: Upper bounds of the request duration histogram, in seconds: the budgets pages are
#: held to (5 ms for a scrape, 15 ms for a page, 100 ms for a long run) and beyond.
REQUEST_BUCKETS = (0.005, 0.015, 0.05, 0.1, 0.5, 2.5)
REQUEST_BUCKET_NAMES = tuple(str(bound) for bound in REQUEST_BUCKETS)
#: Decisions read per step of a fold.
FOLD_CHUNK = 1000
#: Decisions finished this close to the newest one seen are read again on the next
#: fold: SQLite processes stamp ``finished_at`` from their own clocks, and one that
#: stamped earlier may commit later. Ids already counted are skipped.
FOLD_OVERLAP = timedelta(seconds=10)


@dataclass(slots=True)
class DecisionTally:
    """The decision record's counts and latencies, kept up to date by folding in the
    decisions finished since the last fold (each counted once, by id)."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Observations per bucket of :data:`LATENCY_BUCKETS` (and one past the last).
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0
    #: ``(finished_at, id)`` of the newest decision folded in.
    water: tuple[str, int] | None = None
    #: Ids folded in whose ``finished_at`` is within :data:`FOLD_OVERLAP` of the water.
    recent: dict[int, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fold(self, log: DecisionLog, store: Store) -> None:
        with self.lock:
            after = self._reread_from()
            while True:
                found = log.finished_since(after, FOLD_CHUNK)
                fresh = [d for d in found if d.id not in self.recent]
                pauses = store.row_times(
                    [d.checkpoint_id for d in fresh if d.kind == APPROVAL and d.outcome]
                )
                for d in fresh:
                    outcome = d.outcome or "pending"
                    self.counts[(d.kind, outcome)] = self.counts.get((d.kind, outcome), 0) + 1
                    if d.kind == APPROVAL and d.checkpoint_id in pauses:
                        self._observe(pauses[d.checkpoint_id], d.decided_at)
                    self.recent[d.id] = d.finished_at or ""
                if found:
                    last = found[-1]
                    after = (last.finished_at or "", last.id)
                    if self.water is None or after > self.water:
                        self.water = after
                # Forgotten a chunk at a time: a first fold reads the whole record.
                self._forget_old()
                if len(found) < FOLD_CHUNK:
                    break

    def _reread_from(self) -> tuple[str, int] | None:
        if self.water is None:
            return None
        newest = runs.parse_time(self.water[0])
        if newest is None:
            return self.water
        return ((newest - FOLD_OVERLAP).isoformat(), 0)

    def _forget_old(self) -> None:
        if self.water is None:
            return
        newest = runs.parse_time(self.water[0])
        if newest is None:
            return
        keep_from = newest - FOLD_OVERLAP
        # Made anew rather than deleted from: a dict keeps the size it once grew to.
        self.recent = {
            decision_id: finished
            for decision_id, finished in self.recent.items()
            if (at := runs.parse_time(finished)) is None or at >= keep_from
        }

    def _observe(self, paused_at: str, decided_at: str) -> None:
        start, end = runs.parse_time(paused_at), runs.parse_time(decided_at)
        if start is None or end is None:
            return
        seconds = max(0.0, (end - start).total_seconds())
        self.latency_sum += seconds
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1
                return
        self.buckets[-1] += 1

    def histogram(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative buckets as Prometheus wants them, and the sum."""
        cumulative, running = [], 0
        for bound, n in zip((*LATENCY_BUCKETS, float("inf")), self.buckets, strict=True):
            running += n
            cumulative.append(("+Inf" if bound == float("inf") else str(bound), float(running)))
        return cumulative, self.latency_sum


class FleetCollector:
    """What a scrape reads from the store and the decision record, in one pass. The app's
    lifespan opens the fleet (:meth:`open`) and closes it; between, a scrape reads nothing."""

    def __init__(self, settings: Settings, tally: DecisionTally) -> None:
        self._settings = settings
        self._tally = tally
        self._fleet: tuple[Store, DecisionLog] | None = None

    def open(self, store: Store, log: DecisionLog) -> None:
        self._fleet = (store, log)

    def close(self) -> None:
        self._fleet = None

    def describe(self) -> list[Metric]:
        # Nothing to describe up front: collecting needs the store, opened by the lifespan.
        return []

    def collect(self) -> Iterator[Metric]:
        fleet = self._fleet
        if fleet is None:
            return
        store, log = fleet
        yield from fleet_metrics(store, log, self._settings, self._tally)


def fleet_metrics(
    store: Store, log: DecisionLog, settings: Settings, tally: DecisionTally
) -> Iterator[Metric]:
    """Everything a scrape reports. The runs index is brought up to date once and its
    counts (with the SDK's small pending table) read in one statement; the decisions
    are folded in since the last scrape. Nothing counts a long range, so
    a scrape costs the same at a million runs as at a thousand."""
    now = datetime.now(UTC)
    stale_before, overdue_before = settings.attention_cutoffs(now)
    # The decisions are folded in meanwhile: on PostgreSQL each read is a round trip.
    folded = read_ahead(tally.fold, log, store)
    # None while a first build of the runs index runs: what it counts is left out then.
    fleet = store.fleet_counts(stale_before, overdue_before)
    if fleet is not None:
        by_state = GaugeMetricFamily(
            "localui_runs", "Runs per state, as the runs list counts them.", labels=["state"]
        )
        for state in STATES:
            by_state.add_metric([state], fleet.states.get(state, 0))
        yield by_state
    pending = fleet.pending if fleet is not None else store.count_pending()
    yield GaugeMetricFamily(
        "localui_pending_approvals", "Pauses waiting for a person.", value=pending
    )
    if fleet is not None:
        yield from _index_metrics(fleet, now)
    folded.result()
    with tally.lock:
        # A counter: the record only grows (prune never touches it).
        decisions = CounterMetricFamily(
            "localui_decisions",
            "Decisions localui recorded, by kind and how they ended.",
            labels=["kind", "outcome"],
        )
        for (kind, outcome), n in sorted(tally.counts.items()):
            decisions.add_metric([kind, outcome], n)
        yield decisions
        buckets, total = tally.histogram()
        latency = HistogramMetricFamily(
            "localui_decision_latency_seconds",
            "From a pause to its approval or rejection.",
        )
        latency.add_metric([], buckets, total)
        yield latency


def _index_metrics(fleet: FleetCounts, now: datetime) -> Iterator[Metric]:
    """What the runs index counts: attention, the oldest pause, the outbox."""
    counts = fleet.attention
    oldest = runs.parse_time(counts.oldest_pause_at) if counts.oldest_pause_at else None
    yield GaugeMetricFamily(
        "localui_oldest_pause_age_seconds",
        "How long the oldest pause has waited for a person (0 when none waits).",
        value=max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0,
    )
    yield GaugeMetricFamily(
        "localui_stalled_runs",
        "Unfinished runs with no new row for longer than --stale-after.",
        value=counts.stalled,
    )
    attention = GaugeMetricFamily(
        "localui_attention_runs", "Runs that need a person, per reason.", labels=["reason"]
    )
    for reason, n in counts.by_reason().items():
        attention.add_metric([reason], n)
    yield attention
    outbox = GaugeMetricFamily(
        "localui_outbox_rows", "Rows waiting for the plane, or quarantined by it.", labels=["state"]
    )
    outbox.add_metric(["waiting"], fleet.rows_waiting)
    outbox.add_metric(["quarantined"], fleet.rows_quarantined)
    yield outbox


@dataclass(slots=True, eq=False)
class RequestDurations:
    """How long this server took to answer, by route name: a histogram kept here
    rather than in a ``prometheus_client.Histogram``, whose 15 default buckets and
    ``_created`` series make 18 lines a route. The exposition costs per line, and a
    scrape renders every route ever answered: these buckets make it 9."""

    #: Per route: the observations in each bucket of :data:`REQUEST_BUCKETS` (and one
    #: past the last), then the sum of the durations.
    routes: dict[str, list[float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, route: str, seconds: float) -> None:
        with self.lock:
            counts = self.routes.get(route)
            if counts is None:
                counts = self.routes[route] = [0.0] * (len(REQUEST_BUCKETS) + 2)
            counts[bisect_left(REQUEST_BUCKETS, seconds)] += 1
            counts[-1] += seconds

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "localui_request_duration_seconds",
            "How long this server took to answer, by route name.",
            labels=["route"],
        )
        with self.lock:
            found = sorted((route, list(counts)) for route, counts in self.routes.items())
        for route, counts in found:
            cumulative, running = [], 0.0
            for bound, n in zip((*REQUEST_BUCKET_NAMES, "+Inf"), counts[:-1], strict=True):
                running += n
                cumulative.append((bound, running))
            family.add_metric([route], cumulative, counts[-1])
        yield family


@dataclass(slots=True)
class AppMetrics:
    """One app's registry: the request timer, and the fleet read at each scrape."""

    registry: CollectorRegistry
    requests: RequestDurations
    fleet: FleetCollector
    #: The Bearer token a scraper sends (``--metrics-token-file``), or empty.
    token: str = ""


def app_metrics(settings: Settings) -> AppMetrics:
    registry = CollectorRegistry(auto_describe=False)
    requests = RequestDurations()
    registry.register(requests)
    fleet = FleetCollector(settings, DecisionTally())
    registry.register(fleet)
    return AppMetrics(
        registry=registry, requests=requests, fleet=fleet, token=scraper_token(settings)
    )


def scraper_token(settings: Settings) -> str:
    """The token in ``--metrics-token-file``, read once at start."""
    if not settings.metrics_token_file:
        return ""
    try:
        token = Path(settings.metrics_token_file).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise Unavailable(
            f"--metrics-token-file {settings.metrics_token_file} cannot be read: {exc.strerror}"
        ) from exc
    if not token:
        raise Unavailable(f"--metrics-token-file {settings.metrics_token_file} is empty")
    return token


class RequestTiming:
    """Times every request by the name of the route that answered it."""

    def __init__(self, app: ASGIApp, *, metrics: AppMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            route = scope.get("route")
            name = getattr(route, "name", None) or "unmatched"
            self.metrics.requests.observe(name, time.perf_counter() - started)
