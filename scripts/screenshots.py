"""The README's screenshots, taken from a fresh ``localui demo`` in a real Chromium.

``bash scripts/screenshots.sh`` runs this: it starts the demo on a store of its own
(sign-in off, in an empty directory), waits until every run has landed, and writes
``docs/*.png``: the runs list, a run page (the run that died in its tool), a diff
of two of its rows, the approvals queue, the editor of a row and a comparison of the
branch it made with its source, the runs list in the dark theme, and a run page on a
phone. Debian's Chromium is used, as in the browser tests.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import Browser, sync_playwright

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
GIVE_UP_S = 180.0


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="localui-screenshots-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    localui = str(Path(sys.executable).with_name("localui"))
    log = (workdir / "demo.log").open("wb")
    demo = subprocess.Popen(
        [localui, "demo", "--no-auth", "--port", str(port)],
        cwd=workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        runs = seeded_runs(url, demo)
        DOCS.mkdir(exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            take_all(browser, url, runs)
            browser.close()
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait(timeout=30)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)
    for png in sorted(DOCS.glob("*.png")):
        print(f"screenshots: {png.relative_to(REPO)} ({png.stat().st_size // 1000} KB)")
    return 0


def seeded_runs(url: str, demo: subprocess.Popen[bytes]) -> list[dict[str, object]]:
    """The demo's runs once every scenario has landed."""
    deadline = time.monotonic() + GIVE_UP_S
    while time.monotonic() < deadline:
        if demo.poll() is not None:
            raise SystemExit(f"screenshots: the demo exited with {demo.returncode}")
        try:
            listing = httpx.get(f"{url}/runs.json", timeout=10).json()
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        seeding = listing["seeding"]
        if seeding is None:
            return list(listing["runs"])
        if seeding["finished"]:
            raise SystemExit(f"screenshots: the demo failed to seed: {seeding['failures']}")
        time.sleep(0.2)
    raise SystemExit(f"screenshots: the demo was still seeding after {GIVE_UP_S:.0f} s")


def take_all(browser: Browser, url: str, runs: list[dict[str, object]]) -> None:
    crashed = next(
        str(r["execution_id"])
        for r in runs
        if (r["state"], r["agent"], r.get("stopped_at")) == ("unfinished", "refund-bot", "tool")
    )
    detail = httpx.get(f"{url}/runs/{crashed}.json", timeout=10).json()
    rows = detail["rows"]

    page = browser.new_page(viewport=DESKTOP, color_scheme="light")
    page.goto(f"{url}/")
    page.wait_for_selector("table.runs tbody tr")
    page.screenshot(path=str(DOCS / "runs-list.png"))

    page.goto(f"{url}/runs/{crashed}")
    page.wait_for_selector("#verdict")
    page.screenshot(path=str(DOCS / "run-page.png"))

    page.goto(
        f"{url}/runs/{crashed}/diff?a={rows[0]['checkpoint_id']}&b={rows[-1]['checkpoint_id']}"
    )
    page.wait_for_selector("main")
    page.screenshot(path=str(DOCS / "diff.png"))

    page.goto(f"{url}/approvals")
    page.wait_for_selector("article.approval")
    page.screenshot(path=str(DOCS / "approvals.png"))

    # Time travel: the demo's refund edited at its tool's result, and that branch beside it.
    edits = httpx.get(f"{url}/decisions.json", params={"kind": "edit"}, timeout=10).json()
    for decision in edits["decisions"]:
        branch = httpx.get(f"{url}/runs/{decision['execution_id']}.json", timeout=10).json()
        if branch["agent"] != "refund-bot":
            continue
        source = branch["fork_of"]["source_execution_id"]
        page.goto(f"{url}/runs/{source}/edit?checkpoint_id={decision['checkpoint_id']}")
        page.wait_for_selector("form.edit-row")
        page.screenshot(path=str(DOCS / "editor.png"))
        page.goto(f"{url}/compare?a={source}&b={decision['execution_id']}")
        page.wait_for_selector("details.compare-pair[open]")
        page.screenshot(path=str(DOCS / "compare.png"))
    page.close()

    dark = browser.new_page(viewport=DESKTOP, color_scheme="dark")
    dark.goto(f"{url}/")
    dark.wait_for_selector("table.runs tbody tr")
    dark.screenshot(path=str(DOCS / "dark.png"))
    dark.close()

    phone = browser.new_page(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
    phone.goto(f"{url}/runs/{crashed}")
    phone.wait_for_selector("#verdict")
    phone.screenshot(path=str(DOCS / "phone.png"))
    phone.close()


if __name__ == "__main__":
    sys.exit(main())
