"""The navigation bar's badges: pauses waiting, and runs that need a person."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from localui.backends.base import Store
from localui.errors import LocalUIError
from localui.settings import Settings


@dataclass(frozen=True, slots=True)
class Nav:
    """What the navigation bar shows on every page: the approvals badge, and how many
    runs need a person (None when the runs index cannot say yet)."""

    pending: int
    attention: int | None = None


def attention_total(store: Store, settings: Settings) -> int | None:
    """The runs that need a person, each once; None when the runs index cannot say."""
    stale_before, overdue_before = settings.attention_cutoffs(datetime.now(UTC))
    try:
        return store.attention_counts(stale_before, overdue_before).total
    except LocalUIError:
        return None


def nav_counts(store: Store, settings: Settings | None = None) -> Nav:
    """The nav's badges; the attention badge only when ``settings`` says its cutoffs.
    Both from the fleet's counts when the runs index has them (one statement on
    PostgreSQL, where the nav is a round trip of every page)."""
    if settings is not None:
        stale_before, overdue_before = settings.attention_cutoffs(datetime.now(UTC))
        try:
            fleet = store.fleet_counts(stale_before, overdue_before)
        except LocalUIError:
            fleet = None
        if fleet is not None:
            return Nav(pending=fleet.pending, attention=fleet.attention.total)
    attention = attention_total(store, settings) if settings is not None else None
    try:
        return Nav(pending=store.count_pending(), attention=attention)
    except LocalUIError:
        return Nav(pending=0, attention=attention)
