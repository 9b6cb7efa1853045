"""One look at the runs index per page.

A page asks the runs index several things (a run's forks, the nav's counts), and
each question first brings the index up to date: on PostgreSQL a round trip to the
server every time. Within one page the index is brought up to date once, and every
later question of that page reads it as of that look, so a page also shows one
moment of the store rather than two.

A page is a read (GET or HEAD) until its answer starts: the scope ends there, so a
stream that goes on answering (the live feed) looks afresh each time, and an action
(a POST) always looks afresh after what it did.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class _Look:
    __slots__ = ("fresh", "open")

    def __init__(self) -> None:
        #: The indexes brought up to date in this look.
        self.fresh: set[object] = set()
        self.open = True


_current: ContextVar[_Look | None] = ContextVar("localui_look", default=None)


@contextmanager
def one_look() -> Iterator[_Look]:
    """A scope in which each index is brought up to date at most once (the worker
    threads a page's reads run in share it: they copy the context)."""
    look = _Look()
    token = _current.set(look)
    try:
        yield look
    finally:
        look.open = False
        _current.reset(token)


def up_to_date(index: object) -> bool:
    """Whether ``index`` was brought up to date in the current look."""
    look = _current.get()
    return look is not None and look.open and index in look.fresh


def brought_up_to_date(index: object) -> None:
    """``index`` is up to date as of now, for the rest of the current look."""
    look = _current.get()
    if look is not None and look.open:
        look.fresh.add(index)
