"""Every CSV localui writes opens in a spreadsheet as data: a cell that would start a
formula (``=``, ``+``, ``-``, ``@``, or one of them after a tab) starts with ``'``. Checked
on ``/decisions.csv`` and ``localui decisions export``, on SQLite and on PostgreSQL, with
reasons an approver typed and a name that starts with ``-``, on real pauses the SDK
wrote.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable

from helpers import JSON, TEST_TOKEN, run_cli
from test_approval_policy import OTHER_TOOL, Desk, open_desk

__all__ = ["open_desk"]  # the fixture, used by name below

OWNER = {"Authorization": f"Bearer {TEST_TOKEN}"}
#: What a person may type as a reason that a spreadsheet would run.
FORMULAS = (
    '=HYPERLINK("http://evil.example","x")',
    "@SUM(1+1)",
    "+cmd|' /C calc'!A0",
)
STARTS = ("=", "+", "-", "@", "\t", "\r")


def test_a_cell_is_quoted_only_when_it_would_start_a_formula() -> None:
    from localui import csvsafe

    assert [csvsafe.cell(v) for v in ("=1", "+1", "-1", "@a", "\t=1", "\r=1")] == [
        "'=1",
        "'+1",
        "'-1",
        "'@a",
        "'\t=1",
        "'\r=1",
    ]
    assert [csvsafe.cell(v) for v in ("a=1", " =1", "", None, -1, 2.5)] == [
        "a=1",
        " =1",
        "",
        None,
        -1,
        2.5,
    ]


def test_decisions_csv_and_the_export_never_start_a_cell_with_a_formula(
    open_desk: Callable[..., Desk],
) -> None:
    desk = open_desk(OTHER_TOOL)
    eve = desk.add("-eve", "approver")
    queue = desk.client.get("/approvals.json", headers=eve).json()["approvals"]
    assert len(queue) >= len(FORMULAS)
    for item, reason in zip(queue, FORMULAS, strict=False):
        done = desk.client.post(
            f"/approvals/{item['execution_id']}/reject",
            data={"checkpoint_id": item["checkpoint_id"], "reason": reason},
            headers=eve,
        )
        assert done.status_code == 200, done.text

    listed = desk.client.get("/decisions.json", headers={**JSON, **OWNER}).json()["decisions"]
    # The record keeps what was typed; only the CSV cell is changed.
    assert sorted(e["reason"] for e in listed) == sorted(FORMULAS)
    assert {e["approver"] for e in listed} == {"-eve"}

    served = desk.client.get("/decisions.csv", headers=OWNER)
    assert served.status_code == 200
    exported = run_cli("decisions", "export", *desk.export_args)
    assert exported.returncode == 0, exported.stderr
    for text in (served.text, exported.stdout):
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
        assert sorted(r["reason"] for r in rows) == sorted("'" + r for r in FORMULAS)
        assert {r["approver"] for r in rows} == {"'-eve"}
        for row in rows:
            for value in row.values():
                assert not value.startswith(STARTS), row
