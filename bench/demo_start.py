"""``localui demo`` as a new user starts it: to its first page, and to every run seeded.

Each start is a fresh ``python -m localui demo`` in an empty directory of its own, on
a temporary store, with sign-in off (the timing is of the demo, not of signing in).
The first page is the first 200 on ``/``; all seeded is the first ``/runs.json``
whose ``seeding`` is null (every scenario landed) or finished (some failed: an
error, with the failures). A single start on a shared machine is noisy, so several
are made and their medians judged (``bench.budgets``: ``demo_first_page``,
``demo_seeded``).
"""

from __future__ import annotations

import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.servers import clean_env, free_port, pythonpath

Log = Callable[[str], None]

#: A demo that has not served or seeded by then is stuck, not slow.
_GIVE_UP_S = 180.0


@dataclass
class DemoStarts:
    """The figures of every start; the medians are what the budgets judge."""

    first_page_s: list[float] = field(default_factory=list)
    seeded_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        figures = {}
        if self.first_page_s:
            figures["demo_first_page_s"] = statistics.median(self.first_page_s)
        if self.seeded_s:
            figures["demo_seeded_s"] = statistics.median(self.seeded_s)
        return figures


def measure_demo(starts: int, log: Log, app_path: Path | None = None) -> DemoStarts:
    """Start the demo ``starts`` times, one after another, and time each."""
    result = DemoStarts()
    for n in range(1, starts + 1):
        try:
            first, seeded = _one_start(app_path)
        except _Failed as exc:
            result.errors.append(f"demo start {n}: {exc}")
            log(f"  demo start {n}: {exc}")
            continue
        result.first_page_s.append(first)
        result.seeded_s.append(seeded)
        log(f"  demo start {n}: first page {first:.2f} s, all runs seeded {seeded:.2f} s")
    return result


class _Failed(Exception):
    pass


def _one_start(app_path: Path | None) -> tuple[float, float]:
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-demo-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = workdir.parent / f"{workdir.name}.log"
    env = clean_env(PYTHONPATH=pythonpath(app_path))
    command = [sys.executable, "-m", "localui", "demo", "--no-auth", "--port", str(port)]
    with log_path.open("wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            first = _until(url, proc, started, log_path, lambda r: r.status_code == 200, "/")
            seeded = _until(url, proc, started, log_path, _seeded, "/runs.json")
            return first, seeded
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            shutil.rmtree(workdir, ignore_errors=True)
            log_path.unlink(missing_ok=True)


def _seeded(response: httpx.Response) -> bool:
    if response.status_code != 200:
        return False
    # A demo from before it served while seeding has no such key: serving is seeded.
    seeding = response.json().get("seeding")
    if seeding is not None and seeding["finished"]:
        raise _Failed(f"seeding failed: {seeding['failures']}")
    return seeding is None


def _until(
    url: str,
    proc: subprocess.Popen[bytes],
    started: float,
    log_path: Path,
    done: Callable[[httpx.Response], bool],
    path: str,
) -> float:
    """Seconds from ``started`` until ``done(response)`` holds for ``GET path``."""
    with httpx.Client(base_url=url, timeout=10) as client:
        while time.perf_counter() - started < _GIVE_UP_S:
            if proc.poll() is not None:
                raise _Failed(f"exited with {proc.returncode}:\n{log_path.read_text()[-2000:]}")
            try:
                if done(client.get(path)):
                    return time.perf_counter() - started
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    raise _Failed(f"no answer on {path} within {_GIVE_UP_S:.0f} s")
