"""``bench.links`` on a small scale (SQLite): the scanners' fetches add up to what was
asked, are spread over every link, decide no run, and the table and figures are written
as the budgets read them. Timing is judged by the benchmark itself, never here."""

from __future__ import annotations

import json
from pathlib import Path

from bench.links import _shares, run_links


def test_the_fetches_are_split_three_ways_and_add_up() -> None:
    for fetches in range(1, 40):
        shares = _shares(fetches)
        assert sum(shares) == fetches and max(shares) - min(shares) <= 1, (fetches, shares)
    assert _shares(1000) == (334, 333, 333)


def test_a_small_run_decides_nothing_by_scanning_and_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "links.md"
    status = run_links(None, out, fetches=8, decisions=2, requests=3)
    figures = json.loads(out.with_suffix(".json").read_text())
    assert figures["runs_decided_by_scanners"] == 0
    assert (figures["fetches"], len(figures["page_ms"]), len(figures["click_s"])) == (8, 3, 2)
    table = out.read_text()
    assert "Scanners: 8 fetches of the links in turn (3 by a headless Chromium" in table
    assert "| runs decided by 8 scanner fetches | ≤ 0 | 0 | pass |" in table
    missed = "**MISSED**" in table
    assert status == (1 if missed else 0)
