"""The content security policy in a real Chromium: pages work under it, with no
violation reported, and a page of another site cannot frame them."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import ConsoleMessage, Page, expect

#: How Chromium reports what a content security policy blocked.
VIOLATION = re.compile(r"Content Security Policy|Refused to (apply|execute|load|display|frame)")


@pytest.fixture
def console(page: Page) -> list[str]:
    """Every console message of ``page``, as Chromium words it."""
    messages: list[str] = []

    def keep(message: ConsoleMessage) -> None:
        messages.append(f"{message.type}: {message.text}")

    page.on("console", keep)
    return messages


def _json(base_url: str, path: str) -> dict[str, object]:
    with urllib.request.urlopen(base_url.rstrip("/") + path, timeout=10) as response:
        body: dict[str, object] = json.loads(response.read())
        return body


def test_pages_work_under_the_policy_with_no_violation(
    page: Page,
    base_url: str,
    console: list[str],
    page_errors: list[str],
    screenshot: Callable[[str], Path],
) -> None:
    runs = _json(base_url, "/runs.json")["runs"]
    assert isinstance(runs, list)
    run = next(r["execution_id"] for r in runs if r["state"] == "completed")
    rows = _json(base_url, f"/runs/{run}.json")["rows"]
    assert isinstance(rows, list) and len(rows) >= 2
    first, last = rows[0]["checkpoint_id"], rows[-1]["checkpoint_id"]

    page.goto("/")
    assert page.evaluate("typeof htmx") == "object"
    # htmx at work: typing filters the table in place.
    table = page.locator("table.runs tbody tr")
    expect(table).to_have_count(len(runs))
    page.get_by_label("Search").fill("A-1006")
    expect(table).to_have_count(1)
    screenshot("csp-runs")

    for path in (
        f"/runs/{run}",
        f"/runs/{run}/rows/{last}",
        f"/runs/{run}/diff?a={first}&b={last}",
        "/approvals",
        "/prune?older_than=0s",
        "/cache?older_than=0s",
    ):
        response = page.goto(path)
        assert response is not None and response.status == 200, path
        expect(page.locator("main")).to_be_visible()
    # The live stream connected under the policy: the approvals page keeps its badge.
    expect(page.locator("#nav-pending")).to_have_count(1)
    page.wait_for_timeout(500)  # let late reports (event stream, styles) arrive

    assert [m for m in console if VIOLATION.search(m)] == []
    assert page_errors == []


class _FramingSite(BaseHTTPRequestHandler):
    """Another site, framing the app's runs page as a clickjacking page would."""

    target = ""

    def do_GET(self) -> None:
        body = (
            "<!doctype html><title>decoy</title><p>Win a prize!</p>"
            f'<iframe id="victim" src="{self.target}" width="800" height="600"></iframe>'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def framing_site(base_url: str) -> Iterator[str]:
    handler = type("Framing", (_FramingSite,), {"target": base_url.rstrip("/") + "/"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_framed_page_does_not_render(
    page: Page, framing_site: str, console: list[str], screenshot: Callable[[str], Path]
) -> None:
    page.goto(framing_site)
    expect(page.locator("p")).to_have_text("Win a prize!")
    frame_element = page.locator("#victim")
    expect(frame_element).to_be_visible()
    page.wait_for_timeout(1000)
    screenshot("framed")

    framed = [f for f in page.frames if f is not page.main_frame]
    assert len(framed) == 1
    # Chromium shows its own error page in place of the app.
    assert not framed[0].url.startswith("http"), framed[0].url
    assert framed[0].locator("table.runs").count() == 0
    assert any("frame-ancestors" in m for m in console), console
