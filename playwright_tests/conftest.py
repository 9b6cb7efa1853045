"""Browser tests: the real ``localui demo`` process, driven by Debian's Chromium.

pytest-playwright supplies ``page``; these fixtures point it at /usr/bin/chromium
(Playwright's own browser download is unavailable here) and at the demo server
through ``base_url``, so tests navigate with paths like ``page.goto("/")``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import LocalServer, start_localui
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

#: The demo serves at once and seeds in about 10 s on two cores; one that is not done
#: by then is stuck.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class DemoServer:
    """``localui demo`` on a store of its own, started from an empty directory."""

    server: LocalServer
    store: Path
    workdir: Path

    @property
    def url(self) -> str:
        return self.server.url


def start_demo(tmp_path_factory: pytest.TempPathFactory, name: str) -> DemoServer:
    """``localui demo`` as a person starts it; its output goes beside its directory.
    Sign-in is off: these tests are about the pages (test_signin is about signing in)."""
    workdir = tmp_path_factory.mktemp(f"{name}-cwd")
    store = tmp_path_factory.mktemp(f"{name}-store") / "local.db"
    server = start_localui(
        ["demo", "--store", str(store), "--no-auth"],
        cwd=workdir,
        log=workdir.parent / f"{workdir.name}.log",
        ready="/",
        timeout=START_TIMEOUT_S,
    )
    wait_until_seeded(server)
    return DemoServer(server=server, store=store, workdir=workdir)


def wait_until_seeded(server: LocalServer, within: float = START_TIMEOUT_S) -> None:
    """Hold on until the demo has written all its runs (it serves while it writes)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        seeding = httpx.get(server.url + "/runs.json", timeout=10).json()["seeding"]
        if seeding is None:
            return
        if seeding["finished"]:
            pytest.fail(f"the demo failed to seed: {seeding['failures']}", pytrace=False)
        time.sleep(0.2)
    pytest.fail(f"the demo was still seeding after {within:.0f} s:\n{server.output()}")


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    """The demo the browser tests that only read share."""
    demo = start_demo(tmp_path_factory, "demo")
    try:
        yield demo
    finally:
        demo.server.stop(timeout=STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def base_url(demo_server: DemoServer) -> str:
    """The demo's address as it prints it, ending in ``/``."""
    return demo_server.url + "/"


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
