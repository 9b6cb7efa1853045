"""A run's fork lineage, both ways: the run it was forked from, and its forks and theirs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from localui.backends.base import Store
from localui.records import (
    Decision,
    ForkLink,
)
from localui.shortids import shortest_unique
from localui.views.respond import html_only
from localui.views.urls import Urls, dom_id

#: How many forks of forks the lineage walks before it stops listing.
MAX_LINEAGE = 200


@dataclass(frozen=True, slots=True)
class ForkView:
    execution_id: str
    source_execution_id: str | None
    source_checkpoint_id: str
    source_node_id: str | None
    created_at: str
    url: str
    source_url: str | None
    forks: tuple[ForkView, ...] = ()
    #: The ids as the lineage shows them (``localui.shortids``): the fork's, unique
    #: among the runs of this lineage, and its source run's.
    short_id: str = html_only("")
    source_short_id: str = html_only("")
    #: This fork beside its source run, step by step (``/compare``).
    compare_url: str | None = html_only(None)
    #: Who edited the row this fork went on from ("edited by Ada"), when one was.
    edited: str | None = html_only(None)


def fork_view(link: ForkLink, urls: Urls, children: tuple[ForkView, ...] = ()) -> ForkView:
    """One fork link, its ids shown as a page of these two runs would show them."""
    ids = [link.execution_id, *([link.source_execution_id] if link.source_execution_id else [])]
    shown = shortest_unique(ids)
    source_url = compare_url = None
    if link.source_execution_id:
        source_url = urls.run(
            link.source_execution_id, fragment=f"row-{dom_id(link.source_checkpoint_id)}"
        )
        compare_url = urls.path("compare", {"a": link.source_execution_id, "b": link.execution_id})
    return ForkView(
        execution_id=link.execution_id,
        source_execution_id=link.source_execution_id,
        source_checkpoint_id=link.source_checkpoint_id,
        source_node_id=link.source_node_id,
        created_at=link.created_at,
        url=urls.run(link.execution_id),
        source_url=source_url,
        forks=children,
        short_id=shown.get(link.execution_id, link.execution_id),
        source_short_id=shown.get(link.source_execution_id or "", ""),
        compare_url=compare_url,
    )


def lineage(
    store: Store,
    execution_id: str,
    urls: Urls,
    forks: tuple[ForkLink, ...],
    edits: Mapping[str, Decision] | None = None,
) -> tuple[ForkView, ...]:
    """This run's ``forks``, and theirs, depth first, at most ``MAX_LINEAGE`` in all;
    their ids shortened so that each reads apart from every other run of the lineage."""
    seen = {execution_id}

    def walk(run_id: str) -> tuple[ForkView, ...]:
        views = []
        for link in forks if run_id == execution_id else store.list_forks(run_id):
            if link.execution_id in seen or len(seen) > MAX_LINEAGE:
                continue
            seen.add(link.execution_id)
            views.append(fork_view(link, urls, walk(link.execution_id)))
        return tuple(views)

    tree = walk(execution_id)
    shown = shortest_unique(seen)

    def shorten(views: tuple[ForkView, ...]) -> tuple[ForkView, ...]:
        return tuple(
            dataclasses.replace(
                view,
                short_id=shown[view.execution_id],
                source_short_id=shown.get(view.source_execution_id or "", ""),
                forks=shorten(view.forks),
                edited=edited_words(edits or {}, view.execution_id),
            )
            for view in views
        )

    return shorten(tree)


def edited_words(edits: Mapping[str, Decision], execution_id: str) -> str | None:
    decision = edits.get(execution_id)
    if decision is None:
        return None
    return f"edited by {decision.actor} at {decision.decided_at}"
