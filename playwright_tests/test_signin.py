"""Signing in as a person does, in Chromium, on a SQLite store and on PostgreSQL.

``localui serve`` with sign-in on (the default), the refund-bot registered; a
person added with ``localui users add`` opens their link: the session cookie is
set, the token leaves the URL, the pages work, and their approval records their
name — no name is typed anywhere.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SCREENSHOTS, START_TIMEOUT_S, STOP_TIMEOUT_S
from helpers import LOCALUI, LocalServer, start_localui
from playwright.sync_api import Browser, expect

LINK = re.compile(r"(http://\S+/\?token=\S+)")
#: Bound by ``localui serve`` to whichever store it serves.
AGENTS = """from localui.demo.agent import build_agent


def refund_bot():
    return build_agent(None)
"""


@dataclass(frozen=True)
class SignInServer:
    url: str
    store_args: list[str]
    workdir: Path
    #: The start-up link ``localui serve`` printed (the owner's, an operator).
    owner_link: str


def _env() -> dict[str, str]:
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"}
    env.pop("FASTAIAGENT_LOCAL_DB", None)
    return env


def seed(store: str | Path, workdir: Path, pg_schema: str = "fastaiagent") -> None:
    """The demo's runs, written by the real SDK from a process of their own."""
    code = (
        "import sys; from localui.demo.scenarios import seed;"
        " seed(sys.argv[1], pg_schema=sys.argv[2])"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(store), pg_schema],
        cwd=workdir,
        env=_env(),
        check=True,
        timeout=START_TIMEOUT_S,
    )


def _answering(dsn: str) -> None:
    """Fail at once, and say so, when the test command's PostgreSQL is gone: seeding
    would otherwise fail later as a worker's connection error (its server was seen
    to stop mid-run on a shared machine, taking the seed with it)."""
    import psycopg

    try:
        psycopg.connect(dsn, connect_timeout=10).close()
    except psycopg.OperationalError as exc:
        pytest.fail(f"the test PostgreSQL at {dsn} does not answer: {exc}", pytrace=False)


@pytest.fixture(params=["sqlite", "postgres"])
def signin_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SignInServer]:
    workdir = tmp_path_factory.mktemp(f"signin-{request.param}")
    (workdir / "agents.py").write_text(AGENTS)
    drop_schemas: list[str] = []
    dsn = ""
    if request.param == "sqlite":
        store = workdir / "local.db"
        seed(store, workdir)
        store_args = ["--store", str(store)]
    else:
        dsn = os.environ.get("LOCALUI_TEST_PG_DSN", "")
        if not dsn:
            pytest.fail("LOCALUI_TEST_PG_DSN is not set: run scripts/test.sh", pytrace=False)
        _answering(dsn)
        schema, app_schema = (f"{p}_{uuid.uuid4().hex[:10]}" for p in ("fa", "localui"))
        drop_schemas += [schema, app_schema]
        seed(dsn, workdir, pg_schema=schema)
        store_args = ["--store", dsn, "--pg-schema", schema, "--pg-app-schema", app_schema]
    command = ["serve", *store_args, "--agents", f"{workdir / 'agents.py'}:refund_bot"]
    server: LocalServer | None = None
    try:
        # Ready when the sign-in page answers: nothing else does without a session.
        server = start_localui(
            command,
            cwd=workdir,
            log=workdir / "serve.log",
            env=_env(),
            ready="/signin",
            timeout=START_TIMEOUT_S,
        )
        printed = LINK.search(server.output())
        assert printed is not None and "sign in at" in server.output(), server.output()
        yield SignInServer(
            url=server.url, store_args=store_args, workdir=workdir, owner_link=printed.group(1)
        )
    finally:
        if server is not None:
            server.stop(timeout=STOP_TIMEOUT_S)
        if drop_schemas:
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                for schema in drop_schemas:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def add_person(server: SignInServer, name: str, role: str, url: str = "") -> str:
    """A person added with ``localui users add``; the link it printed for ``url`` (by
    default the server's 127.0.0.1 address)."""
    args = list(server.store_args)
    if "--pg-schema" in args:
        at = args.index("--pg-schema")
        del args[at : at + 2]
    done = subprocess.run(
        [str(LOCALUI), "users", "add", name, "--role", role, *args, "--url", url or server.url],
        cwd=server.workdir,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    link = LINK.search(done.stdout)
    assert link is not None, done.stdout
    return link.group(1)


def test_a_person_signs_in_by_link_and_approves_as_themselves(
    browser: Browser, signin_server: SignInServer, request: pytest.FixtureRequest
) -> None:
    backend = request.node.callspec.params["signin_server"]
    link = add_person(signin_server, "Ada Lovelace", "approver")
    stranger = browser.new_context(base_url=signin_server.url)
    context = browser.new_context(base_url=signin_server.url)
    errors: list[str] = []
    try:
        # Without the link: the sign-in page, and nothing of the store.
        cold = stranger.new_page()
        response = cold.goto("/approvals")
        assert response is not None and response.status == 401
        expect(cold.locator("h1")).to_have_text("Sign in")
        expect(cold.locator("article.approval")).to_have_count(0)

        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(link)
        # Redirected to the same place without the token, signed in by a cookie.
        assert page.url == f"{signin_server.url}/"
        [cookie] = [c for c in context.cookies() if c["name"].startswith("localui_session_")]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
        assert not cookie["secure"]  # plain HTTP on loopback
        expect(page.locator("header.top")).to_contain_text("Ada Lovelace · approver")
        expect(page.locator("table")).to_be_visible()

        page.goto("/approvals")
        card = (
            page.locator("article.approval")
            .filter(has=page.get_by_role("button", name="Approve"))
            .first
        )
        card_id = card.get_attribute("id")
        assert card_id is not None
        run = card_id.removeprefix("approval-")
        expect(card.get_by_label("Approver")).to_have_count(0)
        expect(card).to_contain_text("Deciding as Ada Lovelace")
        page.screenshot(path=str(SCREENSHOTS / f"signin-{backend}-1-queue.png"), full_page=True)

        card.get_by_role("button", name="Approve").click()
        outcome = page.locator(f"#approval-{run}-result")
        expect(outcome).to_contain_text("Ada Lovelace approved it at", timeout=20_000)
        page.screenshot(path=str(SCREENSHOTS / f"signin-{backend}-2-approved.png"), full_page=True)

        decided = page.request.get(f"/runs/{run}.json")
        assert decided.status == 200
        [decision] = [d for d in decided.json()["decisions"] if d["kind"] == "approval"]
        assert decision["approver"] == "Ada Lovelace"

        # A prune is an operator's: refused on the server, not only hidden.
        page.goto("/prune?older_than=0s")
        expect(page.get_by_role("button", name=re.compile("Prune these"))).to_have_count(0)
        assert page.request.post("/prune", form={"older_than": "0s"}).status == 403

        page.get_by_role("button", name="Sign out").click()
        expect(page.locator("h1")).to_have_text("Sign in")
        assert errors == []
    finally:
        stranger.close()
        context.close()
