"""Sign-in as people meet it: ``localui users``, the printed link, and binding beyond
loopback, with real server processes and real sockets.

The binding test serves on 0.0.0.0 and connects from this machine's own
non-loopback address (``hostname -I``), so the server sees a client that is not
on loopback, as a neighbour on the network would be; nothing leaves the machine.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from helpers import LocalServer, free_port, start_localui
from test_cli import LOCALUI, assert_one_line_error, child_env, run_cli

from localui.demo.scenarios import ALL_SCENARIOS

if TYPE_CHECKING:
    from conftest import PgStore, Seeded

LINK = re.compile(r"(http://\S+/\?token=(\S+))")


def store_args(kind: str, path: Path, pg: PgStore | None) -> list[str]:
    if kind == "sqlite":
        return ["--store", str(path)]
    assert pg is not None
    return ["--store", pg.dsn, "--pg-schema", pg.schema, "--pg-app-schema", pg.app_schema]


@pytest.fixture(params=["sqlite", "postgres"])
def served_store(request: pytest.FixtureRequest, store_copy: Path) -> list[str]:
    """``--store ...`` arguments naming a fresh copy of the seeded runs on either backend."""
    if request.param == "sqlite":
        return store_args("sqlite", store_copy, None)
    pg: PgStore = request.getfixturevalue("pg_store")
    return store_args("postgres", store_copy, pg)


def users_cli(store: Sequence[str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # users takes the store and the app schema; the SDK's schema is not its business.
    flags = list(store)
    if "--pg-schema" in flags:
        at = flags.index("--pg-schema")
        del flags[at : at + 2]
    return run_cli([LOCALUI, "users", *args, *flags], cwd)


def test_users_add_list_reset_remove(served_store: list[str], tmp_path: Path) -> None:
    added = users_cli(
        served_store, "add", "王小明", "--role", "approver", "--url", "http://h:1", cwd=tmp_path
    )
    assert added.returncode == 0, added.stderr
    link = LINK.search(added.stdout)
    assert link is not None and link.group(1).startswith("http://h:1/?token=")
    token = link.group(2)
    assert f"Authorization: Bearer {token}" in added.stdout

    again = users_cli(served_store, "add", "王小明", "--role", "viewer", cwd=tmp_path)
    assert_one_line_error(again, "already a user")
    wrong = run_cli([LOCALUI, "users", "add", "x", "--role", "admin", *served_store], tmp_path)
    assert wrong.returncode == 2 and "invalid choice" in wrong.stderr

    listed = users_cli(served_store, "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split("\t")[:2] == ["王小明", "approver"]
    assert token not in listed.stdout  # only its hash is kept

    reset = users_cli(served_store, "reset", "王小明", cwd=tmp_path)
    new = LINK.search(reset.stdout)
    assert reset.returncode == 0 and new is not None and new.group(2) != token
    # Without --url, the link is on localui's own name, as serve prints its own.
    assert new.group(1).startswith("http://localui.localhost:8765/?token=")

    removed = users_cli(served_store, "remove", "王小明", cwd=tmp_path)
    assert removed.returncode == 0, removed.stderr
    assert users_cli(served_store, "list", cwd=tmp_path).stdout == ""
    assert_one_line_error(users_cli(served_store, "remove", "王小明", cwd=tmp_path), "no user")


@dataclass
class Running:
    server: LocalServer

    def line(self, pattern: str) -> re.Match[str]:
        lines = self.server.output().splitlines()
        for text in lines:
            if match := re.search(pattern, text):
                return match
        raise AssertionError(f"no line matching {pattern!r} in {lines}")


@contextmanager
def server(
    args: Sequence[str], cwd: Path, port: int, command: str = "serve", *, within: float = 30
) -> Iterator[Running]:
    """A real ``localui serve`` (or ``demo``) on ``port``, up once it answers within
    ``within`` seconds; it prints its sign-in lines before it listens."""
    started = start_localui(
        [command, *args],
        cwd=cwd,
        log=cwd / f"{command}.log",
        env=child_env(),
        # Answered with sign-in on or off, from any address.
        ready="/static/localui.css",
        port=port,
        timeout=within,
    )
    try:
        yield Running(started)
    finally:
        started.stop()


def test_serve_prints_a_link_that_signs_in(served_store: list[str], tmp_path: Path) -> None:
    port = free_port()
    person = users_cli(
        served_store,
        "add",
        "Ada",
        "--role",
        "viewer",
        "--url",
        f"http://127.0.0.1:{port}",
        cwd=tmp_path,
    )
    personal = LINK.search(person.stdout)
    assert personal is not None
    with server(served_store, tmp_path, port) as running:
        # Printed on localui's own name, whose cookies no other local server receives.
        link = running.line(
            r"sign in at (http://localui\.localhost:(\d+)/\?token=(\S+)) \(as (.+), operator\)"
        )
        assert int(link.group(2)) == port
        running.line(rf"scripts send the header: Authorization: Bearer {link.group(3)}")
        base = f"http://127.0.0.1:{port}"
        # Python resolves no *.localhost name, as browsers do: reach it on 127.0.0.1.
        named = httpx.get(
            f"{base}/signin", headers={"Host": f"localui.localhost:{port}"}, trust_env=False
        )
        assert named.status_code == 200
        with httpx.Client(base_url=base, trust_env=False, follow_redirects=True) as browser:
            page = browser.get("/")
            assert page.status_code == 401 and "<table" not in page.text
            opened = browser.get(f"/?token={link.group(3)}")
            # Followed to the runs page, signed in, without the token in the URL.
            assert opened.status_code == 200
            assert str(opened.url) == f"{base}/"
            assert [r.status_code for r in opened.history] == [303]
            assert f"{link.group(4)} · operator" in opened.text
            assert len(browser.get("/runs.json").json()["runs"]) == 10
        bearer = {"Authorization": f"Bearer {link.group(3)}"}
        assert httpx.get(f"{base}/runs.json", headers=bearer, trust_env=False).status_code == 200
        with httpx.Client(base_url=base, trust_env=False, follow_redirects=True) as ada:
            page = ada.get(personal.group(1))
            assert page.status_code == 200 and "Ada · viewer" in page.text
            assert ada.post("/prune", data={"older_than": "0s"}).status_code == 403


def test_no_auth_is_refused_beyond_loopback(tmp_path: Path, store_copy: Path) -> None:
    for host in ("0.0.0.0", "::", "192.0.2.7"):
        done = run_cli(
            [LOCALUI, "serve", "--store", str(store_copy), "--host", host, "--no-auth"], tmp_path
        )
        assert done.returncode == 2
        assert_one_line_error(done, "--no-auth", host)
    proxy = run_cli(
        [LOCALUI, "serve", "--store", str(store_copy), "--auth-proxy-header", "X-Forwarded-User"],
        tmp_path,
    )
    assert_one_line_error(proxy, "--trusted-proxy")
    bad = run_cli(
        [LOCALUI, "serve", "--store", str(store_copy), "--trusted-proxy", "10.0.0.300"], tmp_path
    )
    assert_one_line_error(bad, "--trusted-proxy '10.0.0.300'")


def test_no_auth_on_loopback_says_so_at_start(tmp_path: Path, store_copy: Path) -> None:
    port = free_port()
    with server(["--store", str(store_copy), "--no-auth"], tmp_path, port) as running:
        running.line(r"sign-in is OFF \(--no-auth\)")
        page = httpx.get(f"http://127.0.0.1:{port}/", trust_env=False)
        assert page.status_code == 200 and "sign-in off" in page.text


def machine_address() -> str:
    """An IPv4 address of this machine that is not loopback (``hostname -I``)."""
    words = subprocess.run(
        ["hostname", "-I"], capture_output=True, text=True, check=True
    ).stdout.split()
    for word in words:
        address = ipaddress.ip_address(word)
        if address.version == 4 and not address.is_loopback:
            return word
    pytest.fail(f"this machine has no non-loopback IPv4 address to test from: {words}")


def test_beyond_loopback_every_request_signs_in(
    tmp_path: Path, store_copy: Path, seeded: Seeded
) -> None:
    address = machine_address()
    port = free_port()
    paused = seeded.id("paused-1")
    args = ["--store", str(store_copy), "--host", "0.0.0.0", "--allow-host", address]
    with server(args, tmp_path, port) as running:
        running.line(r"listening on 0\.0\.0\.0, beyond this machine: every request must sign in")
        token = running.line(r"\?token=(\S+)").group(1)
        remote = f"http://{address}:{port}"

        def get(path: str, **headers: str) -> httpx.Response:
            return httpx.get(remote + path, headers=headers, trust_env=False, timeout=10)

        # Connected to a non-loopback address, so the server sees that address as the
        # client: saying "localhost" proves nothing, with or without a token.
        for host in ("localhost", "127.0.0.1", f"localhost:{port}"):
            refused = get("/runs.json", Host=host)
            assert refused.status_code == 400 and paused not in refused.text, host
            assert get("/", Host=host, Authorization=f"Bearer {token}").status_code == 400
        posted = httpx.post(
            f"{remote}/prune", data={"older_than": "0s"}, headers={"Host": "localhost"},
            trust_env=False,
        )  # fmt: skip
        assert posted.status_code == 400

        # The machine's own name for itself: sign-in first.
        page = get("/")
        assert page.status_code == 401 and paused not in page.text
        assert get("/runs.json").status_code == 401
        pruned = httpx.post(f"{remote}/prune", data={"older_than": "0s"}, trust_env=False)
        assert pruned.status_code == 401
        listed = get("/runs.json", Authorization=f"Bearer {token}")
        assert listed.status_code == 200 and paused in listed.text

        # And over loopback, the loopback name is fine, but still no data without a session.
        local = httpx.get(f"http://127.0.0.1:{port}/runs.json", trust_env=False)
        assert local.status_code == 401
    # Nothing was pruned by any of it.
    from conftest import Raw

    assert (
        Raw(store_copy).query("SELECT COUNT(*) AS n FROM checkpoints")[0]["n"]
        == Raw(seeded.path).query("SELECT COUNT(*) AS n FROM checkpoints")[0]["n"]
    )


def test_the_demo_prints_its_sign_in_link(tmp_path: Path) -> None:
    port = free_port()
    # The demo serves at once and seeds every runner shape behind it, 550 rows among them.
    with server([], tmp_path, port, command="demo", within=120) as running:
        token = running.line(r"sign in at http://localui\.localhost:\d+/\?token=(\S+)").group(1)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/runs.json", trust_env=False).status_code == 401
        with httpx.Client(trust_env=False, follow_redirects=True) as browser:
            assert browser.get(f"{base}/?token={token}").status_code == 200
            deadline = time.monotonic() + 180
            while len(browser.get(f"{base}/runs.json").json()["runs"]) < len(ALL_SCENARIOS):
                assert time.monotonic() < deadline, "the demo's runs never all landed"
                time.sleep(0.5)
