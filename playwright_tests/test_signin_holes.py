"""What only a browser decides about signing in, in Chromium, on SQLite and PostgreSQL.

Another web site of this machine (a plain HTTP server on another port, as any local
dev server is) links to localui, the way mail or chat does:

- the link signs in, and the session survives a reload (a ``Strict`` cookie came with
  neither: the browser counts the redirect and the reload as the other site's);
- a link for someone else asks before it switches who is signed in;
- the session cookie ``localui serve`` sets through the link it prints never reaches
  that other server, whether the browser visits it as ``127.0.0.1`` or ``localhost``
  (cookies ignore ports, so a cookie of ``127.0.0.1:PORT`` went to every port).
"""

from __future__ import annotations

import html
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from conftest import SCREENSHOTS
from helpers import free_port
from playwright.sync_api import Browser, expect
from test_signin import SignInServer, add_person, signin_server  # noqa: F401

# The ``signin_server`` fixture is imported, and the test names it as a parameter,
# which pyflakes takes for a redefinition.
# ruff: noqa: F811


@dataclass
class OtherSite:
    """A web server on another port of this machine: ``/mail?to=URL`` is a message with
    a link to URL; every request's path and ``Cookie`` header are kept."""

    port: int
    cookies: list[tuple[str, str]] = field(default_factory=list)

    def mail(self, host: str, to: str) -> str:
        return f"http://{host}:{self.port}/mail?to={quote(to, safe='')}"


@pytest.fixture
def other_site() -> Iterator[OtherSite]:
    site = OtherSite(port=free_port())

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            site.cookies.append((self.path, self.headers.get("Cookie") or ""))
            to = parse_qs(urlsplit(self.path).query).get("to", [""])[0]
            body = (
                "<!doctype html><title>Mail</title><p>Your localui link: "
                f'<a id="link" href="{html.escape(to)}">open it</a></p>'
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", site.port), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def test_a_link_from_another_site_signs_in_and_its_cookie_stays_with_localui(
    browser: Browser,
    signin_server: SignInServer,
    other_site: OtherSite,
    request: pytest.FixtureRequest,
) -> None:
    backend = request.node.callspec.params["signin_server"]
    printed = urlsplit(signin_server.owner_link)
    # serve prints its link on localui's own name, which Chromium resolves to loopback.
    assert printed.hostname == "localui.localhost", signin_server.owner_link
    here = f"{printed.scheme}://{printed.netloc}"
    context = browser.new_context()
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))

        # The printed link, pointed at the queue, clicked in a message on another site.
        link = f"{here}/approvals?{printed.query}"
        page.goto(other_site.mail("127.0.0.1", link))
        page.locator("#link").click()
        page.wait_for_url(f"{here}/approvals")
        expect(page.locator("header.top")).to_contain_text("· operator")
        expect(page.locator("h1")).not_to_have_text("Sign in")
        page.reload()
        expect(page.locator("header.top")).to_contain_text("· operator")
        page.screenshot(path=str(SCREENSHOTS / f"signin-holes-{backend}-1-from-mail.png"))
        [cookie] = [c for c in context.cookies() if "localui_session_" in c["name"]]
        assert cookie["domain"] == "localui.localhost" and cookie["sameSite"] == "Lax"
        assert cookie["httpOnly"]

        # Another server of this machine, by either loopback name, gets none of it.
        for host in ("127.0.0.1", "localhost"):
            page.goto(f"http://{host}:{other_site.port}/probe-{host}")
        seen = {path: cookie for path, cookie in other_site.cookies if path.startswith("/probe")}
        assert set(seen) == {"/probe-127.0.0.1", "/probe-localhost"}, other_site.cookies
        assert not any("localui_session" in cookie for cookie in seen.values()), seen

        # Someone else's link, from the other site: asked, not switched.
        mallory = add_person(signin_server, "Mallory", "approver", url=f"{here}/")
        page.goto(other_site.mail("127.0.0.1", mallory))
        page.locator("#link").click()
        expect(page.locator("h1")).to_have_text("Switch who is signed in?")
        expect(page.locator("main")).to_contain_text("signs in Mallory")
        page.screenshot(path=str(SCREENSHOTS / f"signin-holes-{backend}-2-switch.png"))
        page.goto(f"{here}/approvals")
        expect(page.locator("header.top")).to_contain_text("· operator")
        expect(page.locator("header.top")).not_to_contain_text("Mallory")
        # The person chooses to switch: now it is Mallory.
        page.goto(other_site.mail("127.0.0.1", mallory))
        page.locator("#link").click()
        page.get_by_role("button", name="Sign in as Mallory").click()
        expect(page.locator("header.top")).to_contain_text("Mallory · approver")
        assert errors == []
    finally:
        context.close()
