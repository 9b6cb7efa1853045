"""Sessions shared by every ``localui serve`` of a store, and kept across restarts.

Two real server processes on one store (a SQLite file, or one PostgreSQL database),
each on its own port, as they would stand behind a load balancer: a session opened
on one is accepted by the other and by the first after a restart; signing out, a
role changed with ``localui users set``, and ``localui keys rotate`` are honoured by
both. The cookie is sent by hand to each port, as one origin's cookie would be.
"""

# The ``served_store`` fixture is imported from test_auth_cli, and tests name it as a
# parameter, which pyflakes takes for a redefinition.
# ruff: noqa: F811

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from helpers import LocalServer, free_port, start_localui
from test_auth_cli import LINK, served_store, users_cli  # noqa: F401  (a fixture)
from test_cli import LOCALUI, assert_one_line_error, child_env, run_cli

#: How long a change made elsewhere may take to be honoured in these tests: the
#: server believes the users table for 2 s and the keys for 1 s; the rest is room
#: for a slow machine.
HONOURED_WITHIN_S = 8.0


def start(store: Sequence[str], cwd: Path, port: int, name: str, *extra: str) -> LocalServer:
    return start_localui(
        ["serve", *store, *extra],
        cwd=cwd,
        log=cwd / f"{name}.log",
        env=child_env(),
        ready="/static/localui.css",
        port=port,
    )


@contextmanager
def two_servers(store: Sequence[str], cwd: Path) -> Iterator[list[LocalServer]]:
    servers = [start(store, cwd, free_port(), f"server-{i}") for i in (1, 2)]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def app_flags(store: Sequence[str]) -> list[str]:
    """The store flags ``localui users`` and ``localui keys`` take (no SDK schema)."""
    flags = list(store)
    if "--pg-schema" in flags:
        at = flags.index("--pg-schema")
        del flags[at : at + 2]
    return flags


def sign_in(server: LocalServer, token: str) -> tuple[str, str]:
    """The session cookie (name, value) a sign-in link sets on ``server``."""
    opened = httpx.get(f"{server.url}/?token={token}", follow_redirects=False, trust_env=False)
    assert opened.status_code == 303, opened.text
    name, _, rest = opened.headers["set-cookie"].partition("=")
    return name, rest.partition(";")[0]


def page(server: LocalServer, cookie: tuple[str, str], path: str = "/approvals") -> httpx.Response:
    return httpx.get(
        server.url + path, headers={"Cookie": f"{cookie[0]}={cookie[1]}"}, trust_env=False
    )


def post(server: LocalServer, cookie: tuple[str, str], path: str, **data: str) -> httpx.Response:
    return httpx.post(
        server.url + path,
        data=data,
        headers={"Cookie": f"{cookie[0]}={cookie[1]}"},
        follow_redirects=False,
        trust_env=False,
    )


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HONOURED_WITHIN_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {HONOURED_WITHIN_S} s: {what}")
        time.sleep(0.1)


def signed_in_as(who: str) -> Callable[[httpx.Response], bool]:
    return lambda answer: answer.status_code == 200 and who in answer.text


def test_one_session_for_every_server_of_the_store(served_store: list[str], tmp_path: Path) -> None:
    flags = app_flags(served_store)
    added = users_cli(served_store, "add", "Ada", "--role", "approver", cwd=tmp_path)
    ada = LINK.search(added.stdout)
    assert ada is not None, added.stdout
    with two_servers(served_store, tmp_path) as (first, second):
        cookie = sign_in(first, ada.group(2))
        # One name on every server of the store, whatever its port: a balancer's one origin.
        assert re.fullmatch(r"localui_session_[0-9a-f]{8}", cookie[0]), cookie
        assert sign_in(second, ada.group(2))[0] == cookie[0]
        assert signed_in_as("Ada · approver")(page(second, cookie))

        # A restart keeps the session.
        port = int(first.url.rsplit(":", 1)[1])
        first.stop()
        first = start(served_store, tmp_path, port, "server-1-again")
        try:
            assert signed_in_as("Ada · approver")(page(first, cookie))

            # A role changed on the command line: both servers honour it.
            done = run_cli([LOCALUI, "users", "set", "Ada", "--role", "viewer", *flags], tmp_path)
            assert done.returncode == 0, done.stderr
            assert "Ada is viewer" in done.stdout
            for server in (first, second):
                eventually(
                    lambda s=server: signed_in_as("Ada · viewer")(page(s, cookie)),
                    "the new role shown",
                )
                refused = post(server, cookie, "/prune", older_than="2w")
                assert refused.status_code == 403, refused.text

            # Signed out on one server: the same cookie, kept elsewhere, ends on both.
            out = post(second, cookie, "/signout")
            assert out.status_code == 303
            for server in (second, first):
                eventually(lambda s=server: page(s, cookie).status_code == 401, "signed out")
        finally:
            first.stop()


def test_a_rotated_key_keeps_sessions_for_the_grace_only(
    served_store: list[str], tmp_path: Path
) -> None:
    flags = app_flags(served_store)
    added = users_cli(served_store, "add", "Bo", "--role", "operator", cwd=tmp_path)
    bo = LINK.search(added.stdout)
    assert bo is not None, added.stdout
    with two_servers(served_store, tmp_path) as (first, second):
        before = sign_in(first, bo.group(2))
        listed = run_cli([LOCALUI, "keys", "list", *flags], tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert re.fullmatch(r"key 1\tmade \S+\tsigns now\n", listed.stdout), listed.stdout

        rotated = run_cli([LOCALUI, "keys", "rotate", "--grace", "1d", *flags], tmp_path)
        assert rotated.returncode == 0, rotated.stderr
        lines = rotated.stdout.splitlines()
        assert lines[0].startswith("key 1\t") and "accepted until" in lines[0]
        assert lines[1].startswith("key 2\t") and lines[1].endswith("signs now")
        # Within the grace, the older key's session goes on everywhere, and a session
        # one server signs with the newer key is accepted by the other at once.
        for server in (first, second):
            assert signed_in_as("Bo · operator")(page(server, before))
        after = [sign_in(second, bo.group(2))]
        assert signed_in_as("Bo · operator")(page(first, after[0]))

        # A preview signed by one server is pruned by the other (the prune signer's keys).
        preview = httpx.get(
            f"{first.url}/prune.json?older_than=2w",
            headers={"Cookie": f"{after[0][0]}={after[0][1]}"},
            trust_env=False,
        ).json()
        pruned = post(
            second,
            after[0],
            "/prune",
            older_than="2w",
            cutoff=preview["cutoff"],
            prune_token=preview["prune_token"],
        )
        assert pruned.status_code == 200, pruned.text

        # No grace: every session signed before ends on both servers.
        now = run_cli([LOCALUI, "keys", "rotate", "--grace", "0s", *flags], tmp_path)
        assert now.returncode == 0, now.stderr
        assert [line.split("\t")[0] for line in now.stdout.splitlines()[:-1]] == ["key 3"]
        for server in (first, second):
            for cookie in (before, after[0]):
                eventually(lambda s=server, c=cookie: page(s, c).status_code == 401, "ended")
        assert signed_in_as("Bo · operator")(page(first, sign_in(second, bo.group(2))))


def test_keys_refuse_a_bad_grace_and_a_missing_store(tmp_path: Path, store_copy: Path) -> None:
    bad = run_cli(
        [LOCALUI, "keys", "rotate", "--grace", "soon", "--store", str(store_copy)], tmp_path
    )
    assert_one_line_error(bad, "--grace='soon'")
    missing = run_cli([LOCALUI, "keys", "list", "--store", str(tmp_path / "none.db")], tmp_path)
    assert_one_line_error(missing, "no store at")
    # Listing writes nothing: a store no server has served has no keys yet.
    fresh = run_cli([LOCALUI, "keys", "list", "--store", str(store_copy)], tmp_path)
    assert fresh.returncode == 0 and "no keys yet" in fresh.stdout


def test_a_read_only_server_of_a_store_without_keys_keeps_its_own(
    tmp_path: Path, store_copy: Path
) -> None:
    added = users_cli(["--store", str(store_copy)], "add", "Cy", "--role", "viewer", cwd=tmp_path)
    cy = LINK.search(added.stdout)
    assert cy is not None
    port = free_port()
    server = start(["--store", str(store_copy)], tmp_path, port, "read-only", "--read-only")
    try:
        cookie = sign_in(server, cy.group(2))
        # Named after its port, as before keys were shared: no other server accepts it.
        assert cookie[0] == f"localui_session_{port}"
        assert signed_in_as("Cy · viewer")(page(server, cookie))
        assert "sessions last as long as this process" in server.output()
    finally:
        server.stop()
    keys = run_cli([LOCALUI, "keys", "list", "--store", str(store_copy)], tmp_path)
    assert "no keys yet" in keys.stdout  # the read-only server wrote nothing


@pytest.mark.parametrize("grace", ["-1d", "1y", ""])
def test_rotate_takes_only_an_age(grace: str, tmp_path: Path, store_copy: Path) -> None:
    done = run_cli(
        [LOCALUI, "keys", "rotate", f"--grace={grace}", "--store", str(store_copy)], tmp_path
    )
    assert_one_line_error(done, "--grace")
