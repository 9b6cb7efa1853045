"""Blocking work off the event loop: the one way views and services do it."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run blocking store work in the thread pool, never on the event loop."""
    return await run_in_threadpool(fn, *args)


#: Threads for :func:`read_ahead`: a page's independent reads at once, a few per page.
_AHEAD = ThreadPoolExecutor(max_workers=8, thread_name_prefix="localui-read-ahead")


def read_ahead(fn: Callable[..., T], *args: Any) -> Future[T]:
    """Start a read that does not depend on what the caller does meanwhile, from a
    thread that is already off the loop (a page's build); ``.result()`` takes it, or
    raises what it raised. On PostgreSQL each read is a round trip: started together,
    they are answered while the caller works, rather than one after another."""
    return _AHEAD.submit(fn, *args)
