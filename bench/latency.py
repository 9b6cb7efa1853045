"""Request timing: p50 and p95 of sequential GETs after warm-up.

Two clocks, for the same URLs:

* **loopback**: an ``httpx.Client`` with keep-alive times each request against
  the real server process, from sending to the last byte of the body. This is
  what the budgets are judged on: it holds everything the server does
  (uvicorn, the app, the store), plus a loopback round trip.
* **in-process**: the app built as ``localui serve`` builds it, called through
  ``httpx.ASGITransport`` with its lifespan running (``bench.inproc``): the
  app and the store alone, without the HTTP server.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

#: Warm-up stops early once it has taken this long.
WARMUP_BUDGET_S = 1.0


@dataclass(frozen=True, slots=True)
class Timing:
    """Milliseconds per request, with the response size and status of the last one."""

    samples_ms: tuple[float, ...]
    status: int
    bytes: int
    error: str | None = None
    #: CPU the server process spent per timed request (user + system, all threads,
    #: mean): what a page costs whatever else the machine is doing.
    cpu_ms: float | None = None

    @property
    def p50(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else math.nan

    @property
    def p95(self) -> float:
        if not self.samples_ms:
            return math.nan
        ordered = sorted(self.samples_ms)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.samples_ms)

    def as_json(self) -> dict[str, object]:
        return {
            "p50_ms": self.p50,
            "p95_ms": self.p95,
            "n": len(self.samples_ms),
            "status": self.status,
            "bytes": self.bytes,
            "error": self.error,
            "cpu_ms": self.cpu_ms,
            "samples_ms": list(self.samples_ms),
        }


def failed(error: str) -> Timing:
    return Timing(samples_ms=(), status=0, bytes=0, error=error)


def warm_up(
    client: httpx.Client, url: str, *, times: int, headers: Mapping[str, str] | None = None
) -> str | None:
    """Up to ``times`` untimed GETs (fewer once they have taken ``WARMUP_BUDGET_S``: a
    slow page has warmed its caches by then). The error, if one did not answer 200."""
    warming = time.perf_counter()
    for _ in range(times):
        try:
            response = client.get(url, headers=headers)
        except httpx.HTTPError as exc:
            return f"GET {url}: {type(exc).__name__}: {exc}"
        if response.status_code != 200:
            return f"GET {url} answered {response.status_code}: {response.content[:300]!r}"
        if time.perf_counter() - warming > WARMUP_BUDGET_S:
            break
    return None


def time_get(
    client: httpx.Client,
    url: str,
    *,
    requests: int,
    headers: Mapping[str, str] | None = None,
) -> Timing:
    """Time ``requests`` GETs of ``url``, one after another; every one must answer 200."""
    samples: list[float] = []
    status = 0
    size = 0
    for _ in range(requests):
        started = time.perf_counter()
        try:
            response = client.get(url, headers=headers)
            body = response.content
        except httpx.HTTPError as exc:
            return failed(f"GET {url}: {type(exc).__name__}: {exc}")
        elapsed = (time.perf_counter() - started) * 1000
        status, size = response.status_code, len(body)
        if status != 200:
            return failed(f"GET {url} answered {status}: {body[:300]!r}")
        samples.append(elapsed)
    return Timing(samples_ms=tuple(samples), status=status, bytes=size)


def time_in_turns(
    clients: Mapping[str, tuple[httpx.Client, str]], *, requests: int
) -> dict[str, Timing]:
    """Time each named ``(client, url)`` ``requests`` times, one GET of each in turn:
    whatever else the machine is doing falls on every URL alike, so their ratio holds
    on a busy machine where figures taken minutes apart do not."""
    samples: dict[str, list[float]] = {name: [] for name in clients}
    last: dict[str, tuple[int, int]] = {}
    for _ in range(requests):
        for name, (client, url) in clients.items():
            started = time.perf_counter()
            try:
                response = client.get(url)
                body = response.content
            except httpx.HTTPError as exc:
                return {name: failed(f"GET {url}: {type(exc).__name__}: {exc}")}
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code != 200:
                return {name: failed(f"GET {url} answered {response.status_code}")}
            samples[name].append(elapsed)
            last[name] = (response.status_code, len(body))
    return {
        name: Timing(samples_ms=tuple(s), status=last[name][0], bytes=last[name][1])
        for name, s in samples.items()
    }


def follow_next(client: httpx.Client, first_url: str, *, pages: int) -> tuple[str | None, int]:
    """Follow ``next`` from the JSON of ``first_url`` up to ``pages`` times (fewer when the
    list ends first); return the last cursor and the number of the page it opens."""
    cursor: str | None = None
    page = 1
    url = first_url
    for _ in range(pages):
        response = client.get(url)
        response.raise_for_status()
        following = response.json().get("next")
        if not following:
            break
        cursor, page = following, page + 1
        separator = "&" if "?" in first_url else "?"
        url = f"{first_url}{separator}after={cursor}"
    return cursor, page
