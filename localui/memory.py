"""Giving the memory a page freed back to the operating system.

``localui serve`` stays up for days beside the agents it can resume, often on a
laptop or a small VM, so what it keeps resident is what it costs its user. Pages
of big runs (a 2,000-row timeline, a diff of two 1 MB snapshots) allocate tens of
MB that are freed once the response is sent, but glibc's malloc keeps freed memory
for reuse rather than return it, in two ways this module turns off:

- its mmap threshold grows to the size of the largest block freed so far, so after
  the first 1 MB snapshot every later one is carved from the heap, where one live
  neighbour keeps the freed pages resident for the life of the process;
- it returns only the free space at the top of a heap, never free pages between
  live blocks, unless asked to with ``malloc_trim``.

Other C libraries (musl, macOS) have neither knob: there nothing here is used.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys

from starlette.types import ASGIApp, Receive, Scope, Send

#: ``mallopt`` parameters, from glibc's ``malloc.h``.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc's default for both. Set explicitly, neither grows any more: blocks this
#: big or bigger are mapped on their own and unmapped as soon as they are freed.
THRESHOLD_BYTES = 128 * 1024
#: Freed memory is handed back once the process holds this much more than it did
#: right after it last did so: small pages pass without any work (memory handed
#: back is faulted in again when next used), big ones give back what they freed.
RELEASE_STEP_BYTES = 2 * 1024 * 1024


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc, the only one with these knobs."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc's own symbol: musl lacks it)
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def keep_thresholds() -> bool:
    """Stop malloc from raising its mmap and trim thresholds as big blocks are freed.

    True when they are now fixed; False where the C library has no such setting.
    """
    libc = _glibc()
    if libc is None:
        return False
    mapped = libc.mallopt(_M_MMAP_THRESHOLD, THRESHOLD_BYTES)
    trimmed = libc.mallopt(_M_TRIM_THRESHOLD, THRESHOLD_BYTES)
    return bool(mapped and trimmed)


def release_freed_memory() -> bool:
    """Return the free pages of every malloc arena to the OS; True when there were any."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


def resident_bytes() -> int:
    """This process's resident set size, as ``/proc`` counts it (Linux)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * mmap.PAGESIZE


def release_due(resident: int, after_last_release: int | None, step: int) -> bool:
    """Whether memory is to be handed back: at first, then once it has grown by ``step``."""
    return after_last_release is None or resident - after_last_release >= step


class ReleaseFreedMemory:
    """ASGI middleware: once an HTTP request is answered, give back what it freed.

    A request's garbage is freed by the time its response is sent, so that is when
    there is most to return, and the person who asked already has the page. Live
    streams count when they end. Only where :func:`keep_thresholds` took effect.
    """

    def __init__(self, app: ASGIApp, step_bytes: int = RELEASE_STEP_BYTES) -> None:
        self.app = app
        self.step_bytes = step_bytes
        #: Resident bytes right after the last release; None before the first.
        self.resident_after_release: int | None = None
        self.releases = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._release_if_grown()

    def _release_if_grown(self) -> None:
        if release_due(resident_bytes(), self.resident_after_release, self.step_bytes):
            release_freed_memory()
            self.releases += 1
            self.resident_after_release = resident_bytes()
