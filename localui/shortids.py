"""How an id is shown where there is no room for it whole: the one rule every page uses.

An id of ``whole_up_to`` characters or fewer (the names people give runs, such as
``refund-1042`` or ``run-pending-a``) is shown whole. A longer one (the SDK's uuids)
is shown as its shortest prefix that no other id on the same page starts with, and
never shorter than ``at_least``: ``run-pending-a-1f`` and ``run-pending-b-2e`` then
read apart, where a fixed cut would show both as ``run-pend``. The full id stays in
the element's title and its copy button; this only decides the visible text.
"""

from __future__ import annotations

from collections.abc import Iterable


def shortest_unique(
    ids: Iterable[str], *, whole_up_to: int = 16, at_least: int = 8
) -> dict[str, str]:
    """Each distinct id of ``ids`` -> the text to show for it on one page.

    A prefix is unique when no other id of the page starts with it, so a short id
    shown whole never reads as the start of a long one shown cut (``run-pending-abcd``
    beside ``run-pending-abcd-9``). An id that is itself the start of another is
    shown whole: no prefix of it is unique.
    """
    distinct = sorted(set(ids))
    shown: dict[str, str] = {}
    for index, current in enumerate(distinct):
        if len(current) <= whole_up_to:
            shown[current] = current
            continue
        # Sorted, the ids sharing the longest prefix with this one are its neighbours
        # (any id sharing k characters lies between them), so two comparisons suffice.
        shared = 0
        for neighbour in distinct[max(0, index - 1) : index] + distinct[index + 1 : index + 2]:
            shared = max(shared, _common_prefix(current, neighbour))
        shown[current] = current[: min(len(current), max(at_least, shared + 1))]
    return shown


def _common_prefix(a: str, b: str) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length
