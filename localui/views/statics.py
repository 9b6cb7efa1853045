"""The static files (the stylesheet, the page scripts, the vendored htmx), served small.

Every page loads all of them, and the project holds them to 80 KB as received and
30 KB on the wire. So each file is prepared once per version on disk (its mtime and
size), not per request:

- our own CSS and JS are minified: their comments and indentation are for readers of
  the source in ``static/``, not for the wire (files named ``*.min.*`` come minified);
- the result is gzipped at level 9, which costs a few milliseconds once instead of
  level 1's larger answer on every request (pages are gzipped at level 1 as they are
  made, :class:`PageCompression`);
- each answer carries a strong ETag and ``Vary: Accept-Encoding``, and a matching
  ``If-None-Match`` is answered 304, so a reload revalidates instead of downloading.

Only plain files directly in the directory are served: no subfolders, no dot files,
no links out of it.
"""

from __future__ import annotations

import gzip
import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path

import rcssmin
import rjsmin
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.gzip import GZipMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from localui.auth import is_loopback_client
from localui.offloop import off_loop

#: Browsers only revalidate (a cheap 304): the files are not versioned by name.
CACHE_CONTROL = "no-cache"


@dataclass(frozen=True, slots=True)
class PreparedFile:
    """One static file as served: its body as a browser reads it, and gzipped."""

    version: tuple[int, int]  # (mtime_ns, size) of the file it was made from
    media_type: str
    body: bytes
    gzipped: bytes
    digest: str

    @property
    def etag(self) -> str:
        return f'"{self.digest}"'

    @property
    def gzip_etag(self) -> str:
        # A strong ETag names one representation: the gzipped bytes get their own.
        return f'"{self.digest}-gz"'


def minified(name: str, text: str) -> str:
    """The text a browser needs of our own CSS or JS; anything else as it is."""
    if ".min." in name:
        return text
    if name.endswith(".css"):
        return str(rcssmin.cssmin(text))
    if name.endswith(".js"):
        return str(rjsmin.jsmin(text))
    return text


def prepare(path: Path, version: tuple[int, int]) -> PreparedFile:
    raw = path.read_bytes()
    media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if media_type.startswith("text/") or media_type == "application/javascript":
        body = minified(path.name, raw.decode("utf-8")).encode("utf-8")
        media_type += "; charset=utf-8"
    else:
        body = raw
    return PreparedFile(
        version=version,
        media_type=media_type,
        body=body,
        gzipped=gzip.compress(body, compresslevel=9, mtime=0),
        digest=hashlib.sha256(body).hexdigest()[:20],
    )


def accepts_gzip(headers: Headers) -> bool:
    """Whether ``Accept-Encoding`` lists gzip (or ``*``) without ``q=0``."""
    for part in headers.get("accept-encoding", "").split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() not in ("gzip", "*"):
            continue
        q = params.strip().lower().removeprefix("q=")
        try:
            return not params.strip() or float(q) > 0
        except ValueError:
            return False
    return False


def matches(if_none_match: str, etags: tuple[str, ...]) -> bool:
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return "*" in tags or any(etag in tags for etag in etags)


class PrecompressedStatics:
    """An ASGI app for a flat directory of static files, mounted with a ``{path}``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._prepared: dict[str, PreparedFile] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise HTTPException(404)
        if scope["method"] not in ("GET", "HEAD"):
            raise HTTPException(405, headers={"Allow": "GET, HEAD"})
        # Mounted: the part of the path below the mount point (Starlette's own rule).
        path, mounted_at = str(scope["path"]), str(scope.get("root_path", ""))
        name = path.removeprefix(mounted_at).removeprefix("/")
        prepared = await self.prepared(name)
        headers = Headers(scope=scope)
        common = {"Vary": "Accept-Encoding", "Cache-Control": CACHE_CONTROL}
        gzipped = accepts_gzip(headers) and len(prepared.gzipped) < len(prepared.body)
        etag = prepared.gzip_etag if gzipped else prepared.etag
        if matches(headers.get("if-none-match", ""), (etag,)):
            response = Response(status_code=304, headers={**common, "ETag": etag})
        else:
            body = prepared.gzipped if gzipped else prepared.body
            extra = {"Content-Encoding": "gzip"} if gzipped else {}
            response = Response(
                body if scope["method"] == "GET" else b"",
                media_type=prepared.media_type,
                headers={**common, **extra, "ETag": etag, "Content-Length": str(len(body))},
            )
        await response(scope, receive, send)

    async def prepared(self, name: str) -> PreparedFile:
        """The file ``name`` as served, remade when the file on disk changed."""
        if not name or name.startswith(".") or Path(name).name != name or "\\" in name:
            raise HTTPException(404)
        path = self.directory / name
        try:
            stat = path.stat()
        except (OSError, ValueError):  # missing, or a name the OS refuses (a NUL byte)
            raise HTTPException(404) from None
        # A link out of the folder is not served (as Starlette's StaticFiles does).
        if not path.is_file() or path.resolve().parent != self.directory.resolve():
            raise HTTPException(404)
        version = (stat.st_mtime_ns, stat.st_size)
        known = self._prepared.get(name)
        if known is not None and known.version == version:
            return known
        try:
            made = await off_loop(prepare, path, version)
        except (OSError, UnicodeDecodeError):
            raise HTTPException(404) from None
        self._prepared[name] = made
        return made


class PageCompression(GZipMiddleware):
    """Pages gzipped as they are made (level 1: level 9 spends ~300 ms on a 2 MB diff
    page for a few % smaller), for a client on another machine. A client on this
    machine (the browser beside the agents, or a reverse proxy, which compresses for
    its own clients) gets them as they are: over loopback compressing only spends CPU,
    about 0.3 ms of the approvals page's 4. Event streams are left alone, and static
    files come gzipped already, so pass through."""

    def __init__(self, app: ASGIApp) -> None:
        super().__init__(app, minimum_size=512, compresslevel=1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_loopback_client(scope):
            await self.app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
