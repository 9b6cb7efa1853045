"""A personal decision link in a real Chromium: what a mail scanner does with it decides
nothing; the person it was sent to decides with one press.

``localui serve`` with sign-in on and the refund-bot registered; Ada has an address of
her own, Apprise's ``json://`` to a receiver on loopback, so her message (and its link)
comes the way a person's mail would. A scanner's browser opens the link as gateways
do: it loads the page and runs whatever scripts it has, follows no button, and fetches
it again with GET and HEAD. Then Ada opens it and presses Approve.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from conftest import SCREENSHOTS, START_TIMEOUT_S, STOP_TIMEOUT_S
from helpers import LOCALUI, LocalServer, start_localui
from playwright.sync_api import Browser, expect
from test_signin import AGENTS, LINK, _answering, _env, seed

from bench.receiver import Receiver

DECISION_LINK = re.compile(r"(http://\S+/decide/(\S+?)/\S+)")


@dataclass(frozen=True)
class LinkServer:
    url: str
    owner_link: str
    receiver: Receiver
    backend: str


@pytest.fixture(params=["sqlite", "postgres"])
def link_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LinkServer]:
    workdir = tmp_path_factory.mktemp(f"decision-links-{request.param}")
    (workdir / "agents.py").write_text(AGENTS)
    drop_schemas: list[str] = []
    dsn = ""
    if request.param == "sqlite":
        store = workdir / "local.db"
        seed(store, workdir)
        store_args = ["--store", str(store)]
        users_args = store_args
    else:
        dsn = os.environ.get("LOCALUI_TEST_PG_DSN", "")
        if not dsn:
            pytest.fail("LOCALUI_TEST_PG_DSN is not set: run scripts/test.sh", pytrace=False)
        _answering(dsn)
        schema, app_schema = (f"{p}_{uuid.uuid4().hex[:10]}" for p in ("fa", "localui"))
        drop_schemas += [schema, app_schema]
        seed(dsn, workdir, pg_schema=schema)
        users_args = ["--store", dsn, "--pg-app-schema", app_schema]
        store_args = [*users_args, "--pg-schema", schema]
    server: LocalServer | None = None
    try:
        with Receiver() as receiver:
            # Ada gets her address before the server starts: the pause is announced
            # at its first look, to the people the users table holds then.
            added = subprocess.run(
                [str(LOCALUI), "users", "add", "ada", "--role", "approver", *users_args]
                + ["--notify", f"json://127.0.0.1:{receiver.port}/ada"],
                cwd=workdir,
                env=_env(),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert added.returncode == 0, added.stderr
            server = start_localui(
                ["serve", *store_args, "--agents", f"{workdir / 'agents.py'}:refund_bot"],
                cwd=workdir,
                log=workdir / "serve.log",
                env=_env(),
                ready="/signin",
                timeout=START_TIMEOUT_S,
            )
            printed = LINK.search(server.output())
            assert printed is not None, server.output()
            yield LinkServer(server.url, printed.group(1), receiver, request.param)
    finally:
        if server is not None:
            server.stop(timeout=STOP_TIMEOUT_S)
        if drop_schemas:
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                for schema in drop_schemas:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_a_scanner_decides_nothing_and_the_person_decides_once(
    browser: Browser, link_server: LinkServer
) -> None:
    receiver = link_server.receiver
    got = receiver.wait_for(lambda r: any(x.path == "/ada" for x in r), 60.0)
    message = next(x for x in got if x.path == "/ada").json()["message"]
    links = DECISION_LINK.findall(message)
    assert links, message
    link, run = links[0]
    # The server answers at 127.0.0.1; its links name localui.localhost, which Chromium
    # resolves to loopback itself.
    assert "localui.localhost" in link

    token = link_server.owner_link.rpartition("?token=")[2]

    def waiting() -> bool:
        queue = httpx.get(
            link_server.url + "/approvals.json", headers={"Authorization": f"Bearer {token}"}
        ).json()["approvals"]
        return any(item["execution_id"] == run for item in queue)

    scanner = browser.new_context()
    try:
        for _ in range(5):
            page = scanner.new_page()
            page.goto(link, wait_until="networkidle")
            expect(page.locator("#decision-form")).to_be_visible()
            assert page.evaluate("document.scripts.length") == 0
            page.close()
        # Plain fetches, as a gateway's checker and a chat app's unfurler make them.
        plain = link.replace("localui.localhost", "127.0.0.1")
        unfurler = {"User-Agent": "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)"}
        for method in ("GET", "HEAD"):
            assert httpx.request(method, plain, headers=unfurler).status_code == 200
        assert waiting(), "a scanner's fetches decided the pause"
    finally:
        scanner.close()

    person = browser.new_context()
    errors: list[str] = []
    try:
        page = person.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(link)
        expect(page.locator("h1")).to_have_text("A decision for ada")
        page.screenshot(
            path=str(SCREENSHOTS / f"decision-link-1-open-{link_server.backend}.png"),
            full_page=True,
        )
        page.get_by_label("Reason").fill("checked with the customer")
        page.get_by_role("button", name="Approve").click()
        expect(page.locator("h1")).to_have_text("Decided", timeout=20_000)
        expect(page.locator("#link-words")).to_contain_text("ada approved it at")
        expect(page.locator("#decision-form")).to_have_count(0)
        page.screenshot(
            path=str(SCREENSHOTS / f"decision-link-2-decided-{link_server.backend}.png"),
            full_page=True,
        )
        # Signed in nowhere: the desk still asks who this is.
        page.goto(link.split("/decide/", 1)[0] + "/approvals")
        expect(page).to_have_title(re.compile("Sign in"))
    finally:
        person.close()
    assert not waiting()
    assert errors == []
