"""How fast this machine runs Python while the bench runs: a fixed workload, timed.

The budgets are milliseconds, and a page's milliseconds are the machine's as much as
the app's. On a shared virtual machine the same code on the same store has run twice
as slow from one day to the next, and its speed moves by half within a minute, with a
load average of 1 all the while: the load does not show it. So the bench times this
workload (what a page does most: JSON parsed, dicts compared, text escaped and
joined) before and after each server's pages and reports the medians beside the
figures. Two reports whose probes differ by a third were taken on machines that
differ by as much; a figure is judged against its budget on a machine whose probe
reads as the earlier reports' did.
"""

from __future__ import annotations

import html
import json
import statistics
import time
from dataclasses import dataclass

#: Times the workload runs for one reading; the median is the reading.
ROUNDS = 15


@dataclass(frozen=True, slots=True)
class SpeedReading:
    """One reading: the workload's median and fastest time, in ms."""

    median_ms: float
    fastest_ms: float

    def words(self) -> str:
        return f"{self.median_ms:.1f} ms (fastest {self.fastest_ms:.1f})"

    def as_json(self) -> dict[str, float]:
        return {"median_ms": self.median_ms, "fastest_ms": self.fastest_ms}


def _conversation(turns: int) -> list[dict[str, object]]:
    return [
        {
            "role": "user" if i % 2 else "assistant",
            "content": f"step {i}: the refund for order A-{i} <ok> & done. " * 8,
            "tool_calls": [{"name": "refund", "arguments": {"order": f"A-{i}", "cents": i}}],
        }
        for i in range(turns)
    ]


#: The workload's input, made once: what is timed is the work on it.
_TEXT = json.dumps({"messages": _conversation(1200)})
_EXPECTED = _conversation(1200)


def workload() -> int:
    """One pass: parse a 1,200-message conversation, compare it with the one it was made
    from, render each message escaped into a list, join it. Returns a count so the
    work cannot be skipped."""
    parsed = json.loads(_TEXT)["messages"]
    same = sum(1 for a, b in zip(parsed, _EXPECTED, strict=True) if a == b)
    items = [
        f"<li class={html.escape(str(m['role']))}>{html.escape(str(m['content']))}</li>"
        for m in parsed
    ]
    return same + len("".join(items))


def read_speed(rounds: int = ROUNDS) -> SpeedReading:
    """Time ``rounds`` passes of :func:`workload` (after one untimed pass)."""
    workload()
    samples: list[float] = []
    for _ in range(rounds):
        started = time.perf_counter()
        workload()
        samples.append((time.perf_counter() - started) * 1000)
    return SpeedReading(statistics.median(samples), min(samples))
