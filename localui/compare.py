"""Two runs side by side: their rows aligned step by step, and which pairs differ.

Pure: rows in, aligned pairs out, no I/O. A step is known by where it sits in its
runner (``agent_path``), its node id (``turn:N``, ``turn:N/tool:X``, a chain's node,
``run_end``'s) and its ``step_type``, so a pause row pairs with a pause row and not
with the row written before the same tool. The runs' step keys are aligned as
``difflib`` aligns lines: equal stretches pair up, and every other row is a step one
run took and the other did not.

A fork starts with a ``__fork_origin__`` row whose ``parent_checkpoint_id`` names the
source row it branched from, and carries that row's state: compared with its source,
the origin pairs with that row, and the source's rows before it are the fork's own
history (it started from their conversation), not a difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from localui.diff import SECTIONS
from localui.records import RowDetail, RowHeader, Unreadable
from localui.runs import is_fork_origin

#: Both runs have the step.
STEP = "step"
#: The fork's origin row beside the source row it branched from.
ORIGIN = "origin"
#: A source row before the branch point: the fork started from it, so shares it.
INHERITED = "inherited"
#: Only one of the runs has the step.
ONLY_A = "only_a"
ONLY_B = "only_b"

StepKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Aligned:
    """One step of the comparison: A's row and B's (null on the side that lacks it)."""

    kind: str
    a: RowHeader | None
    b: RowHeader | None

    @property
    def same_row(self) -> bool:
        """One row on both sides (a run compared with itself)."""
        a, b = self.a, self.b
        return a is not None and b is not None and a.checkpoint_id == b.checkpoint_id

    @property
    def both_rows(self) -> bool:
        """Two different rows, one of each run, side by side."""
        return self.a is not None and self.b is not None and not self.same_row

    @property
    def needs_payloads(self) -> bool:
        """Whether the rows' payloads decide if the pair differs (see :func:`differs`)."""
        if self.kind not in (STEP, ORIGIN) or self.same_row:
            return False
        return self.kind == ORIGIN or not headers_differ(self)


def step_key(row: RowHeader) -> StepKey:
    return (row.agent_path or "", row.node_id, row.step_type or "")


def align(a: Sequence[RowHeader], b: Sequence[RowHeader]) -> tuple[Aligned, ...]:
    """The rows of run ``a`` and run ``b`` paired step by step, in order."""
    anchor = _anchor(a, b)
    if anchor is not None:
        i, j = anchor
        before = tuple(
            Aligned(INHERITED, p.a, None) if p.kind == ONLY_A else p for p in _match(a[:i], b[:j])
        )
        return (*before, *_from_origin(a, b, i, j))
    anchor = _anchor(b, a)
    if anchor is not None:
        j, i = anchor
        before = tuple(
            Aligned(INHERITED, None, p.b) if p.kind == ONLY_B else p for p in _match(a[:i], b[:j])
        )
        return (*before, *_from_origin(a, b, i, j))
    return _match(a, b)


def _from_origin(
    a: Sequence[RowHeader], b: Sequence[RowHeader], i: int, j: int
) -> tuple[Aligned, ...]:
    """The origin beside the row it names (``a[i]``, ``b[j]``, either being the fork's),
    then the rest. An agent's branch re-enters at the turn or tool of the row it was
    forked from and writes that step again, so the source row also pairs with the
    fork's next row when that is the same step; a chain's branch goes on at the next
    node, and its next row pairs as any other."""
    origin = Aligned(ORIGIN, a[i], b[j])
    source, fork, at = (a, b, j) if is_fork_origin(b[j]) else (b, a, i)
    base = source[i if source is a else j]
    if at + 1 < len(fork) and step_key(fork[at + 1]) == step_key(base):
        again = Aligned(STEP, a[i], b[j + 1]) if fork is b else Aligned(STEP, a[i + 1], b[j])
        return (origin, again, *_match(a[i + 1 + (fork is a) :], b[j + 1 + (fork is b) :]))
    return (origin, *_match(a[i + 1 :], b[j + 1 :]))


def _anchor(source: Sequence[RowHeader], fork: Sequence[RowHeader]) -> tuple[int, int] | None:
    """``(i, j)`` when ``fork[j]`` is a fork origin pointing at ``source[i]``."""
    positions = {row.checkpoint_id: i for i, row in enumerate(source)}
    for j, row in enumerate(fork):
        if is_fork_origin(row) and row.parent_checkpoint_id in positions:
            return positions[row.parent_checkpoint_id], j
    return None


def _match(a: Sequence[RowHeader], b: Sequence[RowHeader]) -> tuple[Aligned, ...]:
    # autojunk off: in a long agent run every ``run_end`` or tool name repeats, and
    # difflib would otherwise stop matching the most frequent keys past 200 rows.
    matcher = SequenceMatcher(None, [step_key(r) for r in a], [step_key(r) for r in b], False)
    pairs: list[Aligned] = []
    for tag, a1, a2, b1, b2 in matcher.get_opcodes():
        if tag == "equal":
            pairs.extend(Aligned(STEP, a[a1 + k], b[b1 + k]) for k in range(a2 - a1))
            continue
        # A replaced stretch is steps each run took and the other did not (turn 1 of
        # one run is no counterpart of another's tool call): each on its own side.
        pairs.extend(Aligned(ONLY_A, row, None) for row in a[a1:a2])
        pairs.extend(Aligned(ONLY_B, None, row) for row in b[b1:b2])
    return tuple(pairs)


def headers_differ(pair: Aligned) -> bool:
    """The two rows are different steps, or ended differently (status)."""
    if pair.a is None or pair.b is None:
        return True
    return step_key(pair.a) != step_key(pair.b) or pair.a.status != pair.b.status


def payloads_same(a: RowDetail, b: RowDetail) -> bool:
    """Every payload column the diff compares is equal; an unreadable one never is."""
    for name, _ in SECTIONS:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, Unreadable) or isinstance(y, Unreadable) or x != y:
            return False
    return True


def differs(pair: Aligned, details: Mapping[str, RowDetail]) -> bool:
    """Whether the pair is a difference, given the rows' payloads by checkpoint id.

    A step one run lacks differs; a fork's inherited history does not. An origin row
    differs from its source row only in what it carries (its node id, step and
    status are the SDK's marker). A row missing from ``details`` (gone since the
    alignment was read) counts as a difference rather than as the same.
    """
    if pair.kind == INHERITED or pair.same_row:
        return False
    if pair.kind in (ONLY_A, ONLY_B) or pair.a is None or pair.b is None:
        return True
    if pair.kind == STEP and headers_differ(pair):
        return True
    a, b = details.get(pair.a.checkpoint_id), details.get(pair.b.checkpoint_id)
    return a is None or b is None or not payloads_same(a, b)


def stretches(flags: Sequence[bool]) -> tuple[tuple[int, int, bool], ...]:
    """``(start, end, differs)`` of each run of equal flags, in order."""
    found: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[start]:
            found.append((start, i, flags[start]))
            start = i
    return tuple(found)
