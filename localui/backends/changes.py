"""What both change sources compare the same way: which pauses appeared or went."""

from __future__ import annotations

from collections.abc import Mapping


def pause_changes(
    before: Mapping[str, str], now: Mapping[str, str]
) -> tuple[frozenset[str], frozenset[str]]:
    """``(added, removed)`` between two reads of the pending table (execution id -> the
    pause's ``created_at``). A pause whose time changed was claimed and paused again in
    between: it went and came back, so it is in both."""
    moved = {eid for eid, at in now.items() if before.get(eid) not in (None, at)}
    added = moved | (now.keys() - before.keys())
    removed = moved | (before.keys() - now.keys())
    return frozenset(added), frozenset(removed)
