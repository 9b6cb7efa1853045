"""CSV that a spreadsheet opens as data: the one writer of every CSV localui makes.

A spreadsheet runs a cell that starts with ``=``, ``+``, ``-`` or ``@`` as a formula
(``=HYPERLINK("http://evil.example","x")`` in a reason an approver typed, a name, a run
id an agent chose), and skips a leading tab or carriage return to find one. As OWASP's
"CSV Injection" page says, such a text cell is written with a ``'`` in front: the
spreadsheet shows it as text, and the quote tells a reader the cell was changed.
Numbers are written as they are.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from typing import Any, Protocol

#: What a spreadsheet reads as the start of a formula, or skips on its way to one.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class TextOut(Protocol):
    def write(self, text: str, /) -> Any: ...


def cell(value: Any) -> Any:
    """``value`` as a CSV cell no spreadsheet runs: text that would start a formula gets
    a leading ``'``; anything else is left as it is."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


class Writer:
    """``csv.writer`` whose text cells are :func:`cell`'s."""

    def __init__(self, out: TextOut) -> None:
        self._writer = csv.writer(out, lineterminator="\n")

    def writerow(self, row: Iterable[Any]) -> None:
        self._writer.writerow([cell(v) for v in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        self._writer.writerows([cell(v) for v in row] for row in rows)
