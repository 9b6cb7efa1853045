"""What the tests and the browser tests share: a free port, a real ``localui``
server process, the requests a person makes on the approvals queue, and how a
test signs in (or turns sign-in off).

``pyproject.toml`` puts this folder on pytest's ``pythonpath``, so both suites
``from helpers import ...`` the one copy.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import httpx
import pytest

from localui.settings import SignIn

#: The console script installed beside this interpreter, as a user would type it.
LOCALUI = Path(sys.executable).with_name("localui")
JSON = {"Accept": "application/json"}


#: Where the app tests' requests come from: a loopback client, as a browser on this
#: machine is (the server accepts loopback Host names from loopback clients only).
LOOPBACK_CLIENT = ("127.0.0.1", 50000)
#: Sign-in off (``--no-auth``), for the app tests that are not about who may act.
NO_SIGN_IN = SignIn(required=False)
#: The start-up token of app tests that sign in (``sign_in_settings``).
TEST_TOKEN = "start-up-token-of-the-tests"


def sign_in_settings(**changes: Any) -> SignIn:
    """Sign-in on, with the tests' known start-up token and quick lockouts."""
    values: dict[str, Any] = {"token": TEST_TOKEN, "owner": "the-owner"}
    values.update(changes)
    return SignIn(**values)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``localui ARGS`` in a process of its own, as a person runs it; its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "localui", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LocalServer:
    """One real ``localui serve`` (or ``localui demo``) child on loopback; everything it
    prints goes to ``log``, outside its working directory."""

    url: str
    command: list[str]
    process: subprocess.Popen[bytes]
    log: Path
    _log_file: IO[bytes] = field(repr=False)

    def output(self) -> str:
        if not self._log_file.closed:
            self._log_file.flush()
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> int:
        """Stop it (SIGTERM, then SIGKILL after ``timeout``); its exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()
        return int(self.process.returncode)


def start_localui(
    args: Sequence[str],
    *,
    cwd: Path,
    log: Path,
    env: Mapping[str, str] | None = None,
    ready: str = "/runs.json",
    timeout: float = 30.0,
    port: int | None = None,
    prefix: Sequence[str] = (),
) -> LocalServer:
    """``localui ARGS --port N`` started in ``cwd`` (run by ``prefix``, such as a command
    that drops privileges, when given), returned once ``ready`` answers 200; a test
    failure with the server's output when it does not within ``timeout``. ``port`` when
    the test must know it before the server starts (a link printed for it)."""
    port = free_port() if port is None else port
    command = [*prefix, str(LOCALUI), *args, "--port", str(port)]
    log_file = log.open("wb")
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=dict(os.environ if env is None else env),
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    server = LocalServer(f"http://127.0.0.1:{port}", command, process, log, log_file)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(server.url + ready, timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    code = server.stop()
    pytest.fail(
        f"`{' '.join(command)}` did not answer on {ready} (exit code {code}):\n{server.output()}",
        pytrace=False,
    )


# --- the approvals queue, as a person uses it ------------------------------------------


def wait_until_seeded(server: LocalServer, within: float = 120.0) -> None:
    """Hold on until ``localui demo`` has written all its runs (it serves while it
    writes); a scenario that failed fails the test with its reason."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        seeding = httpx.get(server.url + "/runs.json", timeout=10).json()["seeding"]
        if seeding is None:
            return
        if seeding["finished"]:
            pytest.fail(f"the demo failed to seed: {seeding['failures']}", pytrace=False)
        time.sleep(0.2)
    pytest.fail(f"the demo was still seeding after {within:.0f} s:\n{server.output()}")


class Poster(Protocol):
    """A Starlette ``TestClient`` or an ``httpx.Client`` with a base URL."""

    def get(self, url: str, **kwargs: Any) -> httpx.Response: ...

    def post(self, url: str, **kwargs: Any) -> httpx.Response: ...


def card(client: Poster, execution_id: str) -> dict[str, Any]:
    """The approval card the queue shows for a run (the JSON of it)."""
    for item in client.get("/approvals.json").json()["approvals"]:
        if item["execution_id"] == execution_id:
            return dict(item)
    raise AssertionError(f"{execution_id} is not in the approvals queue")


def decide(
    client: Poster,
    execution_id: str,
    checkpoint_id: str,
    *,
    verb: str = "approve",
    approver: str = "Ann Approver",
    reason: str = "within policy",
    headers: Mapping[str, str] | None = None,
) -> httpx.Response:
    """Approve (or ``verb="reject"``) the pause at ``checkpoint_id``, as the card's form
    does; answered in JSON unless ``headers`` say otherwise."""
    return client.post(
        f"/approvals/{execution_id}/{verb}",
        data={"approver": approver, "reason": reason, "checkpoint_id": checkpoint_id},
        headers=dict(JSON if headers is None else headers),
    )


def all_at_once(n: int, act: Callable[[int], httpx.Response]) -> list[httpx.Response]:
    """``act(0)`` … ``act(n - 1)`` on ``n`` threads, released together."""
    barrier = threading.Barrier(n)

    def one(i: int) -> httpx.Response:
        barrier.wait(timeout=30)
        return act(i)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, range(n)))
