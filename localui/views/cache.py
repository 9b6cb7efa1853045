"""``/cache?older_than=7d``: the idempotency cache across the store, by age.

These are the entries the next ``prune`` with the same age would remove; after
that a resume of their runs would run those side effects again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response

from localui.backends.base import Store
from localui.offloop import off_loop
from localui.records import CacheEntry
from localui.views.params import decode_cursor, encode_cursor, parse_age
from localui.views.respond import html_only, nav_ahead, pretty_json, respond
from localui.views.state import context
from localui.views.urls import Urls, urls_of


@dataclass(frozen=True, slots=True)
class CacheRow:
    execution_id: str
    function_key: str
    value: object
    enveloped: bool
    created_at: str
    run_url: str
    value_json: str = html_only("")


@dataclass(frozen=True, slots=True)
class StoreCachePage:
    older_than: str
    cutoff: str
    total: int
    entries: tuple[CacheRow, ...]
    next: str | None
    next_url: str | None = html_only(None)


def cache_row(entry: CacheEntry, urls: Urls) -> CacheRow:
    return CacheRow(
        execution_id=entry.execution_id,
        function_key=entry.function_key,
        value=entry.value,
        enveloped=entry.enveloped,
        created_at=entry.created_at,
        run_url=urls.run(entry.execution_id, fragment="idempotency"),
        value_json=pretty_json(entry.value),
    )


def build_cache_page(
    store: Store, older_than: str, after: tuple[str, str] | None, limit: int, urls: Urls
) -> StoreCachePage:
    cutoff = (datetime.now(UTC) - parse_age(older_than)).isoformat()
    page = store.list_cache_before(cutoff, after=after, limit=limit)
    cursor = encode_cursor(page.next_key) if page.next_key else None
    return StoreCachePage(
        older_than=older_than,
        cutoff=cutoff,
        total=page.total,
        entries=tuple(cache_row(e, urls) for e in page.entries),
        next=cursor,
        next_url=urls.path("cache", {"older_than": older_than, "after": cursor})
        if cursor
        else None,
    )


async def store_cache(request: Request) -> Response:
    ctx = context(request)
    older_than = (request.query_params.get("older_than") or "7d").strip()
    after_text = request.query_params.get("after")
    after = decode_cursor(after_text) if after_text else None
    nav_ahead(request)
    page = await off_loop(
        build_cache_page, ctx.store, older_than, after, ctx.settings.page_size, urls_of(request)
    )
    return await respond(request, "pages/cache.html", page)
