"""Blocking work off the event loop: the one way views and services do it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run blocking store work in the thread pool, never on the event loop."""
    return await run_in_threadpool(fn, *args)
