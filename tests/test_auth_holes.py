"""The sign-in holes an attacker found, each held shut, on SQLite and PostgreSQL.

Redirects stay on this app; a link for someone else asks before it switches who is
signed in; the bad-token throttle counts every attempt before its look-up, per
address (an IPv6 /64 as one) and for all addresses together; a users table that
cannot be read is a 503 that says so; a live stream ends at the first change after
its person was removed or reset; ``localui open`` refuses an unsafe bind. What only
a browser decides (the cross-site link, the other port's cookie) is in
``playwright_tests/test_signin_holes.py``.
"""

# The suite's ``backend`` and ``served_store`` fixtures are imported, and tests name
# them as parameters, which pyflakes takes for a redefinition.
# ruff: noqa: F811

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

import anyio
import httpx
import pytest
from conftest import BASE_URL, copy_pg_store
from helpers import LOOPBACK_CLIENT, TEST_TOKEN, all_at_once, free_port, sign_in_settings
from starlette.testclient import TestClient
from test_auth import ELSEWHERE, PROXY, PUBLIC_HOST, add_user, bearer, other_client, serve, users_of
from test_auth_cli import LINK, served_store, server, users_cli  # noqa: F401
from test_backends import (  # noqa: F401  (fixtures the backend fixture needs)
    JSON,
    Backend,
    _pg_schemas_to_drop,
    backend,
    message,
    pg_seeded_store,
)
from test_cli import LOCALUI, assert_one_line_error, run_cli
from test_fleet_postgres import Cluster, cluster  # noqa: F401

from localui.app import create_app
from localui.auth import CACHE_SECONDS, safe_next
from localui.backends.users import new_token, token_hash
from localui.demo.scenarios import SCENARIOS, seed
from localui.settings import Settings

if TYPE_CHECKING:
    from conftest import PgSeeded


def lands_here(location: str) -> bool:
    """Whether a browser following ``location`` from a page of this app stays on it:
    read as Chromium reads it (a backslash is a slash; tabs and newlines vanish)."""
    as_read = location.replace("\\", "/").translate({9: None, 10: None, 13: None})
    return urlsplit(urljoin(f"{BASE_URL}/runs", as_read)).netloc == urlsplit(BASE_URL).netloc


# --- 1. redirects stay on this app -----------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "//evil.example/",
        "///evil.example/",
        "/\\evil.example/",
        "/%2F%2Fevil.example/",
        "/%5Cevil.example/",
        "/\\/evil.example/approvals",
    ],
)
def test_a_sign_in_link_redirects_only_to_a_path_of_this_app(backend: Backend, path: str) -> None:
    desk = serve(backend)
    opened = desk.client.get(f"{BASE_URL}{path}?token={TEST_TOKEN}", follow_redirects=False)
    assert opened.status_code == 303
    location = opened.headers["location"]
    assert location.startswith("/") and not location.startswith("//"), location
    assert "\\" not in location and lands_here(location), location
    # The session is set all the same, and the page it lands on is this app's.
    assert desk.client.get(location).status_code == 404


def test_after_signing_in_only_a_path_under_the_root_is_followed() -> None:
    for away in (
        "//evil.example/",
        "/\\evil.example/",
        "/\t/evil.example/",
        "/\n/evil.example/",
        "http://evil.example/",
        "https:evil.example",
        "/other-app/",
        "/opsx/",
    ):
        assert safe_next(away, "/ops") == "/ops/", away
    assert safe_next("/ops/approvals?order=newest", "/ops") == "/ops/approvals?order=newest"
    assert safe_next("/ops//runs/a%20b", "/ops") == "/ops/runs/a%20b"
    assert safe_next("/\t/evil.example/", "") == "/"


# --- 2 and 5. a link from another site signs in, and never switches who without asking -


def test_a_link_for_someone_else_asks_before_switching(backend: Backend) -> None:
    desk = serve(backend)
    mallory = add_user(desk, "Mallory", "approver")
    victim = other_client(desk, client=LOOPBACK_CLIENT, base_url=BASE_URL)
    assert victim.get(f"/?token={TEST_TOKEN}", follow_redirects=False).status_code == 303
    cross_site = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}

    # Someone else's link, followed from another site: the Lax cookie comes with it.
    asked = victim.get(f"/approvals?token={mallory}", headers=cross_site, follow_redirects=False)
    assert asked.status_code == 200
    assert "set-cookie" not in asked.headers
    assert "Switch who is signed in?" in asked.text
    assert "signed in as <strong>the-owner</strong>" in asked.text
    assert "signs in <strong>Mallory</strong>" in asked.text
    assert asked.headers["cache-control"] == "no-store"
    assert "the-owner · operator" in victim.get("/approvals").text

    # Another site cannot press the button for them...
    form = {"token": mallory, "next": "/approvals"}
    forged = victim.post("/signin", data=form, headers={"Sec-Fetch-Site": "cross-site"})
    assert forged.status_code == 403
    assert "the-owner · operator" in victim.get("/approvals").text
    # ...they can.
    switched = victim.post(
        "/signin", data=form, headers={"Sec-Fetch-Site": "same-origin"}, follow_redirects=False
    )
    assert (switched.status_code, switched.headers["location"]) == (303, "/approvals")
    assert "Mallory · approver" in victim.get("/approvals").text
    # Their own link again changes nothing, so it does not ask.
    again = victim.get(f"/?token={mallory}", headers=cross_site, follow_redirects=False)
    assert again.status_code == 303


def test_over_tls_the_session_is_a_host_only_cookie(backend: Backend) -> None:
    desk = serve(backend)
    tls = other_client(desk, client=LOOPBACK_CLIENT, base_url="https://127.0.0.1:8765")
    opened = tls.get(f"/approvals?token={TEST_TOKEN}", follow_redirects=False)
    assert opened.status_code == 303
    cookie = opened.headers["set-cookie"]
    name = cookie.partition("=")[0]
    assert re.fullmatch(r"__Host-localui_session_[0-9a-f]{8}", name), cookie
    attributes = {p.strip().lower() for p in cookie.split(";")}
    assert {"secure", "path=/", "samesite=lax", "httponly"} <= attributes
    assert not any(a.startswith("domain=") for a in attributes)
    assert "the-owner · operator" in tls.get("/approvals").text
    # Signing out clears that cookie, not a plain one of the same port.
    out = tls.post("/signout", follow_redirects=False)
    assert out.headers["set-cookie"].startswith(f'{name}=""')
    assert tls.get("/approvals").status_code == 401


def test_a_lax_session_still_changes_nothing_cross_site(backend: Backend) -> None:
    desk = serve(backend)
    opened = desk.client.get(f"/?token={TEST_TOKEN}", follow_redirects=False)
    attributes = {p.strip().lower() for p in opened.headers["set-cookie"].split(";")}
    assert "samesite=lax" in attributes and "httponly" in attributes
    before = desk.truth.fingerprint()
    for headers in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
    ):
        refused = desk.client.post("/prune", data={"older_than": "0s"}, headers=headers)
        assert refused.status_code == 403, headers
    assert desk.truth.fingerprint() == before


# --- 6. the throttle ------------------------------------------------------------------


def test_a_good_token_does_not_reset_the_count(backend: Backend) -> None:
    desk = serve(backend, slow_after=100, lock_after=4, lock_seconds=60)
    for attempt in range(3):
        assert desk.client.get("/runs.json", headers=bearer(f"guess-{attempt}")).status_code == 401
    # A good token in between is answered, and buys the bad ones nothing.
    assert desk.client.get("/runs.json", headers=bearer(TEST_TOKEN)).status_code == 200
    assert desk.client.get("/runs.json", headers=bearer("guess-3")).status_code == 429
    assert desk.client.get("/runs.json", headers=bearer(TEST_TOKEN)).status_code == 429


def test_concurrent_bad_tokens_are_counted_before_any_is_looked_up(backend: Backend) -> None:
    desk = serve(backend, slow_after=100, lock_after=5, lock_seconds=60)
    guesses = [new_token() for _ in range(40)]
    answers = all_at_once(
        len(guesses), lambda i: desk.client.get("/runs.json", headers=bearer(guesses[i]))
    )
    statuses = Counter(a.status_code for a in answers)
    assert set(statuses) <= {401, 429} and statuses[401] <= 5, statuses
    # Every token the users table was asked about is in the server's short cache.
    asked = desk.client.app.state.localui.auth._cache
    looked_up = [g for g in guesses if ("token", token_hash(g)) in asked]
    assert 1 <= len(looked_up) <= 5, len(looked_up)


def test_many_addresses_meet_one_ceiling(backend: Backend) -> None:
    desk = serve(backend, slow_after=100, lock_after=3, global_lock_after=12, global_window=60)
    assert desk.client.get(f"/?token={TEST_TOKEN}", follow_redirects=False).status_code == 303
    for n in range(6):
        spread = other_client(desk, client=(f"198.51.100.{n}", 40000), base_url=BASE_PUBLIC)
        for guess in range(2):
            answer = spread.get("/runs.json", headers=bearer(f"guess-{n}-{guess}"))
            assert answer.status_code == 401, (n, guess)
    fresh = other_client(desk, client=("203.0.113.9", 40000), base_url=BASE_PUBLIC)
    refused = fresh.get("/runs.json", headers=bearer(TEST_TOKEN))
    assert refused.status_code == 429
    assert "from many addresses" in message(refused)
    # A session opened before carries on: only tokens wait.
    assert desk.client.get("/runs.json").status_code == 200


def test_an_ipv6_slash_64_counts_as_one_address(backend: Backend) -> None:
    desk = serve(backend, slow_after=100, lock_after=3, lock_seconds=60)
    for n in range(1, 4):
        host = other_client(desk, client=(f"2001:db8:1:2::{n}", 40000), base_url=BASE_PUBLIC)
        expected = 401 if n < 3 else 429
        assert host.get("/runs.json", headers=bearer(f"guess-{n}")).status_code == expected
    same_net = other_client(desk, client=("2001:db8:1:2::99", 40000), base_url=BASE_PUBLIC)
    assert same_net.get("/runs.json", headers=bearer(TEST_TOKEN)).status_code == 429
    next_net = other_client(desk, client=("2001:db8:1:3::1", 40000), base_url=BASE_PUBLIC)
    assert next_net.get("/runs.json", headers=bearer(TEST_TOKEN)).status_code == 200
    assert (
        other_client(desk, client=ELSEWHERE, base_url=BASE_PUBLIC)
        .get("/runs.json", headers=bearer(TEST_TOKEN))
        .status_code
        == 200
    )


BASE_PUBLIC = f"http://{PUBLIC_HOST}"


# --- 7. a users table that cannot be read ---------------------------------------------


def assert_says_sign_in_is_down(response: httpx.Response, cause: str) -> None:
    assert response.status_code == 503, response.text
    text = message(response) if "json" in response.headers["content-type"] else response.text
    assert "Sign-in cannot be checked right now" in text and cause in text, text


def test_an_unreadable_sqlite_users_table_is_a_503(store_copy: Path) -> None:
    app = create_app(
        Settings(store=str(store_copy), sign_in=sign_in_settings()),
    )
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        users = app.state.localui.backend.users(writable=True)
        token = new_token()
        users.add("Ada", "approver", token_hash(token))
        users.close()
        assert client.get(f"/?token={token}", follow_redirects=False).status_code == 303
        with sqlite3.connect(store_copy) as conn:
            # The table is there but no longer what localui wrote: it cannot be read.
            conn.execute("ALTER TABLE localui_users RENAME COLUMN token_sha256 TO gone")
        time.sleep(CACHE_SECONDS + 0.2)
        cause = "users table cannot be read"
        assert_says_sign_in_is_down(client.get("/runs.json"), cause)
        assert_says_sign_in_is_down(client.get("/approvals"), cause)
        assert_says_sign_in_is_down(client.get("/runs.json", headers=bearer(token)), cause)
        new = TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT)
        assert_says_sign_in_is_down(new.get(f"/?token={new_token()}"), cause)


def test_postgres_down_is_a_503_for_user_tokens_and_sessions(
    cluster: Cluster, pg_seeded: PgSeeded
) -> None:
    copy_pg_store(pg_seeded.dsn, pg_seeded.schema, cluster.dsn, "fastaiagent")
    app = create_app(Settings(store=cluster.dsn, sign_in=sign_in_settings()))
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        users = app.state.localui.backend.users(writable=True)
        token = new_token()
        users.add("Ada", "approver", token_hash(token))
        users.close()
        assert client.get(f"/?token={token}", follow_redirects=False).status_code == 303
        assert client.get("/runs.json").status_code == 200

        cluster.stop()
        time.sleep(CACHE_SECONDS + 0.2)
        gone = f"PostgreSQL at 127.0.0.1:{cluster.port} is not answering"
        assert_says_sign_in_is_down(client.get("/runs.json"), gone)
        assert_says_sign_in_is_down(client.get("/approvals"), gone)
        assert_says_sign_in_is_down(client.get("/runs.json", headers=bearer(token)), gone)
        link = TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT)
        assert_says_sign_in_is_down(link.get(f"/?token={token}"), gone)

        cluster.start()
        deadline = time.monotonic() + 20
        while client.get("/runs.json").status_code != 200:
            assert time.monotonic() < deadline, "sign-in did not recover with the server"
            time.sleep(0.2)


# --- 3. live streams end with their person -----------------------------------------------


@dataclass
class Stream:
    """One SSE stream read in a thread: each event with when it came, and when it ended."""

    url: str
    headers: dict[str, str]
    events: list[tuple[float, str, str]] = field(default_factory=list)
    ended_at: float | None = None
    status: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self) -> None:
        event, data = "message", []
        try:
            timeout = httpx.Timeout(10, read=60)
            with httpx.stream(
                "GET", self.url, headers=self.headers, timeout=timeout, trust_env=False
            ) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].removeprefix(" "))
                    elif not line and data:
                        with self.lock:
                            self.events.append((time.monotonic(), event, "\n".join(data)))
                        event, data = "message", []
        except httpx.HTTPError:
            pass
        finally:
            self.ended_at = time.monotonic()

    def got(self, event: str, text: str = "", after: float = 0.0) -> bool:
        with self.lock:
            return any(e == event and text in d and t > after for t, e, d in self.events)


def write_a_run(store_args: list[str], workdir: Path) -> str:
    """A new completed run, written by the real SDK into the served store; its id."""
    completed = next(s for s in SCENARIOS if s.name == "completed")
    if store_args[1].startswith("postgresql://"):
        report = seed(store_args[1], pg_schema=store_args[3], scenarios=(completed,))
    else:
        report = seed(Path(store_args[1]), scenarios=(completed,))
    return report.run_id("completed")


def test_a_live_stream_ends_when_its_person_is_removed_or_reset(
    served_store: list[str], tmp_path: Path
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    tokens = {}
    for name in ("Ada", "Bo"):
        added = users_cli(served_store, "add", name, "--role", "approver", cwd=tmp_path)
        link = LINK.search(added.stdout)
        assert link is not None, added.stdout
        tokens[name] = link.group(2)
    with server(served_store, tmp_path, port) as running:
        owner = running.line(r"\?token=(\S+)").group(1)
        streams = {
            name: Stream(f"{base}/live/runs", {"Authorization": f"Bearer {token}"})
            for name, token in tokens.items()
        }
        streams["owner"] = Stream(f"{base}/live/runs", {"Authorization": f"Bearer {owner}"})
        readers = [threading.Thread(target=s.read, daemon=True) for s in streams.values()]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 20
        while not all(s.got("runs-table") for s in streams.values()):
            assert time.monotonic() < deadline, "the live streams did not start"
            time.sleep(0.05)

        users_cli(served_store, "remove", "Ada", cwd=tmp_path)
        users_cli(served_store, "reset", "Bo", cwd=tmp_path)
        changed_at = time.monotonic()
        new_run = write_a_run(served_store, tmp_path)

        # The owner's stream carries the new run; the others end without it.
        while not streams["owner"].got("runs-table", new_run):
            assert time.monotonic() - changed_at < 30, "the new run never reached the owner"
            time.sleep(0.05)
        for name in ("Ada", "Bo"):
            stream = streams[name]
            while stream.ended_at is None:
                assert time.monotonic() - changed_at < 10, f"{name}'s stream did not end"
                time.sleep(0.05)
            assert not stream.got("runs-table", new_run), name
            # Its reconnect is told to sign in.
            again = httpx.get(stream.url, headers=stream.headers, trust_env=False, timeout=10)
            assert again.status_code == 401, name
        assert streams["owner"].ended_at is None


def test_a_stream_is_asked_about_the_role_it_carries(backend: Backend) -> None:
    desk = serve(backend, **PROXY)
    add_user(desk, "Opal", "operator")
    auth = desk.client.app.state.localui.auth
    # A stream's request, as the trusted proxy sent it: the role comes from the table.
    scope = {
        "type": "http",
        "client": LOOPBACK_CLIENT,
        "headers": [(b"x-forwarded-user", b"Opal"), (b"accept", b"text/event-stream")],
    }
    opened = anyio.run(auth.person_now, scope, time.monotonic())
    assert (opened.name, opened.role) == ("Opal", "operator")
    users = users_of(desk)
    try:
        assert users.remove("Opal")
        users.add("Opal", "viewer", token_hash(new_token()))
    finally:
        users.close()
    # Asked after the change, the cache's older answer is not believed.
    now = anyio.run(auth.person_now, scope, time.monotonic())
    assert now is not None and now.role == "viewer" and now != opened


# --- 4. localui open binds as safely as serve --------------------------------------------


def test_open_refuses_no_auth_beyond_loopback(tmp_path: Path, store_copy: Path) -> None:
    from conftest import Raw

    run = Raw(store_copy).query("SELECT execution_id FROM checkpoints LIMIT 1")[0]["execution_id"]
    bundle = tmp_path / "run.localui.gz"
    exported = run_cli(
        [LOCALUI, "export", run, "--store", str(store_copy), "-o", str(bundle)], tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    for host in ("0.0.0.0", "::", "192.0.2.7"):
        done = run_cli([LOCALUI, "open", str(bundle), "--host", host, "--no-auth"], tmp_path)
        assert done.returncode == 2, done.stdout
        assert_one_line_error(done, "--no-auth", host)
