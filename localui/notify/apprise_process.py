"""Apprise in a child process of its own: the chat targets are checked and sent there.

Importing Apprise loads every one of its service plugins, and requests and oauthlib
with them: about 0.45 s of CPU and 18 MB in whichever process does it. In a child,
neither lands on the server: it starts as fast as without a chat target (the check
runs on the other core while the server opens its store), its memory stays its own,
and a service that hangs is ended with its child instead of holding the sender.

The protocol is one JSON object per line each way, answered in order:
``{"op": "check", "url": U}`` → ``{"label": L}`` or ``{"error": E}``, and
``{"op": "send", "url": U, "title": T, "body": B}`` → ``{"ok": true}`` or
``{"ok": false, "error": E}``. Written by hand: it is two requests over a pipe, and
the standard library's ``multiprocessing`` would import this package's parent in the
child (``spawn``) or copy the server's memory (``fork``).

Run as ``python -m localui.notify.apprise_process``; the server starts it itself.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import time
from typing import Any

#: How long one check or one message may take in the child before it is ended.
ANSWER_TIMEOUT = 120.0


class AppriseGone(Exception):
    """The child did not answer: it ended, or took longer than allowed."""


class AppriseProcess:
    """The parent's end: starts the child on first use (again after it ended)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        #: URLs whose check was asked for and whose answer is not read yet, in order.
        self._awaiting: list[str] = []
        #: Each checked URL: ("label", L) or ("error", E).
        self._checked: dict[str, tuple[str, str]] = {}

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._buffer = b""
            self._awaiting = []
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "localui.notify.apprise_process"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                # Its own session: Ctrl-C in the terminal stops the server, which
                # then ends the child; the child does not die mid-message first.
                start_new_session=True,
            )
        return self._proc

    def _write(self, request: dict[str, str]) -> None:
        proc = self._started()
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
        except OSError as exc:
            self._end()
            raise AppriseGone(f"the Apprise process ended ({exc.strerror})") from exc

    def _read(self, timeout: float) -> dict[str, Any]:
        proc = self._started()
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    self._end()
                    raise AppriseGone(f"Apprise did not answer in {timeout:.0f} s")
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    self._end()
                    raise AppriseGone("the Apprise process ended")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        answer = json.loads(line)
        assert isinstance(answer, dict)
        return answer

    def _end(self) -> None:
        proc, self._proc = self._proc, None
        self._awaiting = []
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def check_soon(self, urls: list[str]) -> None:
        """Ask for the checks of ``urls`` without waiting: the child imports Apprise
        while this process goes on starting. :meth:`label` reads the answers."""
        with self._lock:
            for url in urls:
                if url not in self._checked and url not in self._awaiting:
                    self._write({"op": "check", "url": url})
                    self._awaiting.append(url)

    def label(self, url: str, timeout: float = ANSWER_TIMEOUT) -> tuple[str, str]:
        """``("label", L)``: the URL with its secrets masked, as Apprise shows it; or
        ``("error", E)``: Apprise knows no such URL."""
        with self._lock:
            self.check_soon([url])
            while url not in self._checked:
                answered = self._awaiting[0]
                answer = self._read(timeout)
                self._awaiting.pop(0)
                if "label" in answer:
                    self._checked[answered] = ("label", str(answer["label"]))
                else:
                    self._checked[answered] = ("error", str(answer.get("error", "")))
            return self._checked[url]

    def send(self, url: str, title: str, body: str, timeout: float = ANSWER_TIMEOUT) -> None:
        """One message; raises :class:`AppriseGone`, or ``RuntimeError`` with what
        the service answered when it did not take it."""
        with self._lock:
            while self._awaiting:  # answers to checks nobody read yet come first
                self.label(self._awaiting[0], timeout)
            self._write({"op": "send", "url": url, "title": title, "body": body})
            answer = self._read(timeout)
        if not answer.get("ok"):
            raise RuntimeError(str(answer.get("error") or "the target did not take the message"))

    def close(self) -> None:
        with self._lock:
            self._end()

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs (the bench reads its memory)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None


_shared: AppriseProcess | None = None
_shared_lock = threading.Lock()


def shared() -> AppriseProcess:
    """The one child of this process: the start-up check and the sender share it."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = AppriseProcess()
            atexit.register(_shared.close)
        return _shared


# --- the child -------------------------------------------------------------------


def _answer(request: dict[str, Any], clients: dict[str, Any]) -> dict[str, Any]:
    import apprise

    url = str(request.get("url", ""))
    if request.get("op") == "check":
        plugin = apprise.Apprise.instantiate(url)
        if plugin is None:
            return {"error": "not a notification URL Apprise knows"}
        shown = str(plugin.url(privacy=True))  # type: ignore[no-untyped-call]
        return {"label": shown.split("?", 1)[0]}
    client = clients.get(url)
    if client is None:
        client = apprise.Apprise()
        client.add(url)
        clients[url] = client
    with apprise.LogCapture(level=logging.WARNING) as captured:  # type: ignore[no-untyped-call]
        delivered = client.notify(body=str(request["body"]), title=str(request["title"]))
    if delivered:
        return {"ok": True}
    said = [line for line in captured.getvalue().splitlines() if line.strip()]
    return {"ok": False, "error": said[-1] if said else ""}


def main() -> None:
    clients: dict[str, Any] = {}
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = _answer(json.loads(line), clients)
        except Exception as exc:
            text = str(exc).strip().splitlines()
            answer = {"ok": False, "error": text[0] if text else type(exc).__name__}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
