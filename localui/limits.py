"""How long and how many: the server's read timeouts and connection cap.

uvicorn times out an idle kept-alive connection, but not a new one that never
sends its request headers: a few thousand of those held every worker slot
(``GET /`` stopped answering). :class:`HeaderDeadlineProtocol` gives each
request's headers a deadline from the moment the connection is idle.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

#: Seconds a connection may sit without a complete request head, new or kept alive.
HEADER_TIMEOUT = 10
#: Seconds uvicorn keeps an idle connection open after a response.
KEEP_ALIVE_TIMEOUT = 5
#: Connections and requests in flight at once; past it uvicorn answers 503. Twenty tabs
#: hold one event stream each, so this leaves ample room for people and scripts.
MAX_CONCURRENCY = 512
#: The largest request head (request line and headers) h11 buffers.
MAX_HEADER_BYTES = 64 * 1024


class HeaderDeadlineProtocol(H11Protocol):
    """h11 with a deadline for each request head: when it passes and no new request
    has started since the connection went idle, the connection is closed."""

    _deadline: asyncio.TimerHandle | None = None
    _cycle_when_idle: object = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    def _arm_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._cycle_when_idle = self.cycle
        self._deadline = self.loop.call_later(HEADER_TIMEOUT, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline = None
        # A new cycle means a request head arrived in time; its response re-arms us.
        if self.cycle is self._cycle_when_idle and not self.transport.is_closing():
            self.transport.close()


def server_limits() -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config``: every limit set here, none left default."""
    return {
        "http": HeaderDeadlineProtocol,
        "timeout_keep_alive": KEEP_ALIVE_TIMEOUT,
        "limit_concurrency": MAX_CONCURRENCY,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
        # No banner naming the server software and its version.
        "server_header": False,
    }
