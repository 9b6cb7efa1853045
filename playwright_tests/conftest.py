"""Browser tests: the real ``localui demo`` process, driven by Debian's Chromium.

pytest-playwright supplies ``page``; these fixtures point it at /usr/bin/chromium
(Playwright's own browser download is unavailable here) and at the demo server
through ``base_url``, so tests navigate with paths like ``page.goto("/")``.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from playwright.sync_api import Page

REPO_ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO_ROOT / "artifacts" / "screenshots"

CHROMIUM = Path("/usr/bin/chromium")
# Without the networking flags Chromium keeps dialling hosts this machine cannot reach.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]

SERVING = re.compile(r"serving .* at (http://\S+)")
#: Seeding takes about 5 s on two cores; a demo that is not serving by then is stuck.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 5.0


@dataclass
class ProcessOutput:
    """Every line a child prints, read on a thread so its pipe never fills."""

    stream: IO[str]
    lines: list[str] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._read, name="demo-output", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str] | None:
        """The first line matching ``pattern``, or None when the time is up or output ended."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if match := pattern.search(line):
                        return match
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self._thread is not None and not self._thread.is_alive()):
                    return None
                self._changed.wait(min(left, 0.5))

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT_S)

    def text(self) -> str:
        with self._changed:
            return "\n".join(self.lines)


@dataclass(frozen=True)
class DemoServer:
    url: str
    store: Path
    workdir: Path
    output: ProcessOutput


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def answers_ok(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    """``localui demo`` as a user starts it, from an empty working directory."""
    workdir = tmp_path_factory.mktemp("demo-cwd")
    store = tmp_path_factory.mktemp("demo-store") / "local.db"
    command = [
        str(Path(sys.executable).parent / "localui"),
        "demo",
        "--store",
        str(store),
        "--port",
        str(free_port()),
        "--no-auth",
    ]
    process = subprocess.Popen(
        command,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    output = ProcessOutput(process.stdout)
    output.start()
    try:
        serving = output.wait_for(SERVING, START_TIMEOUT_S)
        if serving is None:
            pytest.fail(
                f"`{' '.join(command)}` did not say it was serving "
                f"(exit code {process.poll()}):\n{output.text()}",
                pytrace=False,
            )
        url = serving.group(1)
        if not answers_ok(url, timeout=30):
            pytest.fail(f"{url} never answered 200:\n{output.text()}", pytrace=False)
        yield DemoServer(url=url, store=store, workdir=workdir, output=output)
    finally:
        stop(process)
        output.join()
        process.stdout.close()


@pytest.fixture(scope="session")
def base_url(demo_server: DemoServer) -> str:
    return demo_server.url


@pytest.fixture(scope="session")
def demo_workdir(demo_server: DemoServer) -> Path:
    """The directory the demo was started in: empty when it started."""
    return demo_server.workdir


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    if not CHROMIUM.is_file():
        how = (
            "CI must install Debian's chromium before the tests (scripts/test.sh does)"
            if os.environ.get("CI") == "true"
            else "run scripts/test.sh, which installs Debian's chromium"
        )
        pytest.fail(f"no browser at {CHROMIUM}: {how}", pytrace=False)
    return {**browser_type_launch_args, "executable_path": str(CHROMIUM), "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session", autouse=True)
def screenshot_folder() -> Path:
    """artifacts/screenshots, emptied of an earlier run's pictures."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    return SCREENSHOTS


@pytest.fixture
def screenshot(page: Page, request: pytest.FixtureRequest) -> Callable[[str], Path]:
    """Save the whole page as ``<test name>-<step>.png`` in artifacts/screenshots."""

    def take(step: str) -> Path:
        path = SCREENSHOTS / f"{request.node.originalname}-{step}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture
def page_errors(page: Page) -> list[str]:
    """Uncaught JavaScript errors on ``page``; a test asserts it stayed empty."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors
