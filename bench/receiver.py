"""A loopback HTTP receiver for the notification tests and the bench: it keeps every
request it is sent, and can answer 503 (down), or hold a request unanswered."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)

    def form(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.body.decode()).items()}


@dataclass
class Receiver:
    """``with Receiver(port) as r``: listening on 127.0.0.1:port until the block ends."""

    port: int = 0
    #: Answer 503 to everything while true.
    down: bool = False
    #: Keep requests unanswered until this is set (after recording them).
    hold: threading.Event | None = None
    received: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def __enter__(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.received.append(
                        Received(
                            path=self.path,
                            headers={k.lower(): v for k, v in self.headers.items()},
                            body=body,
                            at=time.time(),
                        )
                    )
                if receiver.hold is not None:
                    receiver.hold.wait(60)
                self.send_response(503 if receiver.down else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.hold is not None:
            self.hold.set()
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.received if path is None or r.path.startswith(path)]

    def wait_for(
        self, done: Callable[[list[Received]], bool], timeout: float = 30.0, path: str | None = None
    ) -> list[Received]:
        """The requests so far once ``done`` says they are enough; fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.requests(path)
            if done(got):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"the receiver got {len(got)} requests: {got!r}"[:3000])
            time.sleep(0.05)
