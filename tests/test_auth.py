"""Sign-in, roles, the trusted proxy and the bad-token throttle, on SQLite and PostgreSQL.

Each test serves a fresh copy of the seeded runs with the demo refund-bot
registered (``backend.acting``) and sign-in on, with the tests' known start-up
token; people are added to the real ``localui_users`` table of that store.
"""

# The suite's ``backend`` fixture is imported from test_backends, and tests name it
# as a parameter, which pyflakes takes for a redefinition.
# ruff: noqa: F811

from __future__ import annotations

import re
import time
import warnings
from typing import TYPE_CHECKING, Any

import pytest
from conftest import BASE_URL
from helpers import LOOPBACK_CLIENT, TEST_TOKEN, sign_in_settings
from starlette.exceptions import StarletteDeprecationWarning
from test_backends import (  # noqa: F401  (fixtures the backend fixture needs)
    JSON,
    Backend,
    _pg_schemas_to_drop,
    backend,
    message,
    pg_seeded_store,
)

from localui.auth import CACHE_SECONDS, Locked, Throttle
from localui.backends.base import UserDirectory
from localui.backends.users import new_token, token_hash
from localui.settings import SignIn

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=StarletteDeprecationWarning)
    from starlette.testclient import TestClient

if TYPE_CHECKING:
    from conftest import Ledger
    from test_backends import Acting

#: A Host name the network-facing tests use (only loopback clients may say ``localhost``).
PUBLIC_HOST = "localui.example"
ELSEWHERE = ("192.0.2.50", 40000)


def bearer(token: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **JSON, **more}


def serve(backend: Backend, ledger: Ledger | None = None, **sign_in: Any) -> Acting:
    return backend.acting(ledger, sign_in=sign_in_settings(**sign_in), allowed_hosts=(PUBLIC_HOST,))


def users_of(desk: Acting) -> UserDirectory:
    """The served store's users table, as ``localui users`` writes it."""
    users: UserDirectory = desk.client.app.state.localui.backend.users(writable=True)
    return users


def add_user(desk: Acting, name: str, role: str) -> str:
    """A person added to the served store's users table; their token."""
    users = users_of(desk)
    try:
        token = new_token()
        users.add(name, role, token_hash(token))
        return token
    finally:
        users.close()


def reset_user(desk: Acting, name: str) -> str:
    users = users_of(desk)
    try:
        token = new_token()
        assert users.set_token(name, token_hash(token)) is not None
        return token
    finally:
        users.close()


def other_client(desk: Acting, *, client: tuple[str, int], base_url: str) -> TestClient:
    """Another client of the same running app (its lifespan already runs)."""
    return TestClient(desk.client.app, base_url=base_url, client=client)


def card(desk: Acting, execution_id: str) -> dict[str, Any]:
    """The approval card of a run, read with the start-up token."""
    listed = desk.client.get("/approvals.json", headers=bearer(TEST_TOKEN)).json()
    [item] = [i for i in listed["approvals"] if i["execution_id"] == execution_id]
    return dict(item)


def action_posts(backend: Backend, desk: Acting) -> list[tuple[str, dict[str, str]]]:
    seeded = backend.seeded
    paused, crashed, completed = (
        seeded.id(n) for n in ("paused-1", "crashed-in-tool", "completed")
    )
    paused_row = card(desk, paused)["checkpoint_id"]
    return [
        (f"/approvals/{paused}/approve", {"approver": "x", "checkpoint_id": paused_row}),
        (
            f"/approvals/{paused}/reject",
            {"approver": "x", "reason": "no", "checkpoint_id": paused_row},
        ),
        (
            f"/runs/{crashed}/resume",
            {"checkpoint_id": desk.truth.rows(crashed)[-1]["checkpoint_id"], "confirm": "yes"},
        ),
        (
            f"/runs/{completed}/fork",
            {"checkpoint_id": desk.truth.rows(completed)[0]["checkpoint_id"]},
        ),
        ("/prune", {"older_than": "0s"}),
    ]


# --- without a session --------------------------------------------------------------


def test_without_a_session_nothing_is_shown_and_nothing_done(backend: Backend) -> None:
    desk = serve(backend)
    paused = backend.seeded.id("paused-1")
    # Read with the start-up token first: what must not leak without it.
    posts = action_posts(backend, desk)
    before = desk.truth.fingerprint()

    page = desk.client.get("/")
    assert page.status_code == 401
    assert "Sign in" in page.text and paused not in page.text
    assert "localui_session" not in page.headers.get("set-cookie", "")

    listed = desk.client.get("/runs.json")
    assert listed.status_code == 401
    assert listed.headers["www-authenticate"].startswith("Bearer")
    assert "runs" not in listed.json()

    fragment = desk.client.get(f"/runs/{paused}", headers={"HX-Request": "true"})
    assert (fragment.status_code, fragment.headers["hx-refresh"]) == (401, "true")
    assert paused not in fragment.text

    stream = desk.client.get("/live/nav", headers={"Accept": "text/event-stream"})
    assert stream.status_code == 401

    # The page's own CSS is public: the sign-in page needs it.
    assert desk.client.get("/static/localui.css").status_code == 200

    for path, form in posts:
        response = desk.client.post(path, data=form)
        assert response.status_code == 401, path
    assert desk.truth.fingerprint() == before
    assert desk.truth.decisions(paused) == []


# --- the start-up link, the session, Bearer -------------------------------------------


def test_the_link_sets_a_session_and_redirects_without_the_token(
    backend: Backend, ledger: Ledger
) -> None:
    desk = serve(backend, ledger)
    run = backend.seeded.id("paused-1")

    opened = desk.client.get(f"/approvals?order=newest&token={TEST_TOKEN}", follow_redirects=False)

    assert opened.status_code == 303
    assert opened.headers["location"] == "/approvals?order=newest"
    cookie = opened.headers["set-cookie"]
    # Named after the store's keys, not the port: every server of the store uses it.
    assert re.match(r"localui_session_[0-9a-f]{8}=", cookie), cookie
    attributes = {part.strip().lower() for part in cookie.split(";")}
    # Lax, so a link opened from mail or chat signs in (test_auth_holes says why it is safe).
    assert {"httponly", "samesite=lax", "path=/"} <= attributes
    assert "secure" not in attributes  # plain HTTP: a Secure cookie would never come back
    assert TEST_TOKEN not in cookie

    page = desk.client.get("/approvals")
    assert page.status_code == 200
    assert "the-owner · operator" in page.text
    # Signed in: the card names who decides instead of asking.
    assert 'name="approver"' not in page.text
    assert "Deciding as" in page.text

    shown = card(desk, run)
    decided = desk.client.post(
        f"/approvals/{run}/approve",
        data={"approver": "Typed Name", "checkpoint_id": shown["checkpoint_id"]},
        follow_redirects=False,
    )
    assert decided.status_code == 303
    [row] = desk.truth.decisions(run)
    assert (row["actor"], row["outcome"]) == ("the-owner", "completed")
    # No approver cookie for a signed-in person: the name comes from the session.
    assert "localui_approver" not in decided.headers.get("set-cookie", "")


def test_the_cookie_is_secure_over_tls(backend: Backend) -> None:
    desk = serve(backend)
    tls = other_client(desk, client=LOOPBACK_CLIENT, base_url="https://127.0.0.1:8765")
    opened = tls.get(f"/?token={TEST_TOKEN}", follow_redirects=False)
    assert opened.status_code == 303
    assert "secure" in {p.strip().lower() for p in opened.headers["set-cookie"].split(";")}


def test_scripts_send_a_bearer_token(backend: Backend) -> None:
    desk = serve(backend)
    good = desk.client.get("/runs.json", headers=bearer(TEST_TOKEN))
    assert good.status_code == 200
    assert len(good.json()["runs"]) == 10
    bad = desk.client.get("/runs.json", headers=bearer("not-" + TEST_TOKEN))
    assert bad.status_code == 401
    assert message(bad) == "That token is not valid."


def test_the_sign_in_form_takes_a_pasted_token(backend: Backend) -> None:
    desk = serve(backend)
    assert desk.client.get("/signin").status_code == 200
    wrong = desk.client.post("/signin", data={"token": "nope", "next": "/approvals"})
    assert wrong.status_code == 401 and "not valid" in wrong.text
    # Only a path on this server is followed after signing in.
    away = desk.client.post(
        "/signin",
        data={"token": TEST_TOKEN, "next": "//evil.example/"},
        follow_redirects=False,
    )
    assert (away.status_code, away.headers["location"]) == (303, "/")
    signed = desk.client.post(
        "/signin", data={"token": TEST_TOKEN, "next": "/approvals"}, follow_redirects=False
    )
    assert (signed.status_code, signed.headers["location"]) == (303, "/approvals")
    assert desk.client.get("/approvals").status_code == 200
    out = desk.client.post("/signout", follow_redirects=False)
    assert out.status_code == 303
    assert desk.client.get("/approvals").status_code == 401


# --- roles ----------------------------------------------------------------------------


def test_a_viewer_sees_everything_and_changes_nothing(backend: Backend, ledger: Ledger) -> None:
    desk = serve(backend, ledger)
    viewer = add_user(desk, "Vic Viewer", "viewer")
    seeded = backend.seeded
    posts = action_posts(backend, desk)
    before = desk.truth.fingerprint()

    listed = desk.client.get("/runs.json", headers=bearer(viewer))
    assert listed.status_code == 200 and len(listed.json()["runs"]) == 10
    for path, form in posts:
        response = desk.client.post(path, data=form, headers=bearer(viewer))
        assert response.status_code == 403, path
        assert "viewer" in message(response), path

    assert desk.truth.fingerprint() == before
    assert desk.truth.decisions(seeded.id("paused-1")) == []
    assert ledger.count() == 0
    # The buttons are gone too.
    html = {"Authorization": f"Bearer {viewer}"}
    queue = desk.client.get("/approvals", headers=html).text
    assert "Approve</button>" not in queue and "approvers decide" in queue
    crashed = desk.client.get(f"/runs/{seeded.id('crashed-in-tool')}", headers=html).text
    assert "Resume at" not in crashed and "operators resume" in crashed
    prune = desk.client.get("/prune?older_than=0s", headers=html).text
    assert "Prune these" not in prune and "operators prune" in prune
    # Signing out is not a change a viewer is refused.
    browser = other_client(desk, client=LOOPBACK_CLIENT, base_url=BASE_URL)
    assert browser.get(f"/?token={viewer}", follow_redirects=False).status_code == 303
    assert browser.post("/signout", follow_redirects=False).status_code == 303
    assert browser.get("/").status_code == 401


def test_an_approver_decides_as_themselves_and_cannot_prune(
    backend: Backend, ledger: Ledger
) -> None:
    desk = serve(backend, ledger)
    approver = add_user(desk, "王小明", "approver")
    run = backend.seeded.id("paused-1")
    posts = dict(action_posts(backend, desk))
    before = desk.truth.fingerprint()

    for path in [p for p in posts if not p.startswith("/approvals/")]:
        refused = desk.client.post(path, data=posts[path], headers=bearer(approver))
        assert refused.status_code == 403, path
        assert "needs operator" in message(refused), path
    assert desk.truth.fingerprint() == before

    shown = card(desk, run)
    decided = desk.client.post(
        f"/approvals/{run}/approve",
        data={"approver": "Mallory", "checkpoint_id": shown["checkpoint_id"]},
        headers=bearer(approver),
    )
    assert decided.status_code == 200, decided.text
    assert decided.json()["decision"]["approver"] == "王小明"
    [row] = desk.truth.decisions(run)
    assert (row["actor"], row["outcome"]) == ("王小明", "completed")


def test_an_operator_also_prunes_and_resumes(backend: Backend, ledger: Ledger) -> None:
    desk = serve(backend, ledger)
    operator = add_user(desk, "Olu Operator", "operator")
    crashed = backend.seeded.id("crashed-in-tool")
    resumed = desk.client.post(
        f"/runs/{crashed}/resume",
        data={"checkpoint_id": desk.truth.rows(crashed)[-1]["checkpoint_id"], "confirm": "yes"},
        headers=bearer(operator),
    )
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["decision"]["approver"] == "Olu Operator"
    preview = desk.client.get(
        "/prune.json", params={"older_than": "0s"}, headers=bearer(operator)
    ).json()
    form = {"older_than": "0s", "cutoff": preview["cutoff"], "prune_token": preview["prune_token"]}
    pruned = desk.client.post("/prune", data=form, headers=bearer(operator))
    assert pruned.status_code == 200, pruned.text
    assert pruned.json()["deleted"] > 0


def test_removing_or_resetting_a_person_ends_their_sessions(backend: Backend) -> None:
    desk = serve(backend)
    old = add_user(desk, "Ada", "approver")
    gone = add_user(desk, "Bo", "viewer")
    ada = other_client(desk, client=LOOPBACK_CLIENT, base_url=BASE_URL)
    assert ada.get(f"/?token={old}", follow_redirects=False).status_code == 303
    bo = other_client(desk, client=LOOPBACK_CLIENT, base_url=BASE_URL)
    assert bo.get(f"/?token={gone}", follow_redirects=False).status_code == 303
    assert ada.get("/approvals").status_code == 200
    assert bo.get("/approvals").status_code == 200

    new = reset_user(desk, "Ada")
    users = users_of(desk)
    try:
        assert users.remove("Bo")
    finally:
        users.close()
    time.sleep(CACHE_SECONDS + 0.2)  # what the server believed about them expires

    assert ada.get("/approvals").status_code == 401
    assert bo.get("/approvals").status_code == 401
    assert desk.client.get("/runs.json", headers=bearer(old)).status_code == 401
    assert desk.client.get("/runs.json", headers=bearer(gone)).status_code == 401
    assert desk.client.get("/runs.json", headers=bearer(new)).status_code == 200


# --- bad tokens -----------------------------------------------------------------------


def test_bad_tokens_are_slowed_then_refused_for_a_while(backend: Backend) -> None:
    desk = serve(backend, slow_after=2, slow_seconds=0.4, lock_after=4, lock_seconds=60)
    took = []
    for attempt in range(3):
        started = time.monotonic()
        response = desk.client.get("/runs.json", headers=bearer(f"guess-{attempt}"))
        took.append(time.monotonic() - started)
        assert response.status_code == 401
    assert took[2] >= 0.4  # the third bad token waited before its answer

    locked = desk.client.get("/?token=guess-3", follow_redirects=False)
    assert locked.status_code == 429
    assert int(locked.headers["retry-after"]) > 50
    # Locked means locked: even the right token is refused from this address now.
    again = desk.client.get("/runs.json", headers=bearer(TEST_TOKEN))
    assert again.status_code == 429
    assert "too many bad tokens" in message(again)
    # Another address is not punished for it.
    elsewhere = other_client(desk, client=ELSEWHERE, base_url=f"http://{PUBLIC_HOST}")
    assert elsewhere.get("/runs.json", headers=bearer(TEST_TOKEN)).status_code == 200


def test_the_throttle_forgets_after_the_lockout() -> None:
    now = [0.0]
    throttle = Throttle(
        SignIn(slow_after=1, slow_seconds=1.0, lock_after=3, lock_seconds=100),
        clock=lambda: now[0],
    )

    def bad(client: str) -> float:
        throttle.begin(client)
        return throttle.failed(client)

    assert [bad("a") for _ in range(2)] == [0.0, 1.0]
    assert throttle.locked_for("a") == 0.0
    bad("a")
    assert throttle.locked_for("a") == 100.0
    with pytest.raises(Locked):
        throttle.begin("a")
    assert throttle.locked_for("b") == 0.0
    now[0] = 100.5
    assert throttle.locked_for("a") == 0.0
    now[0] = 300.0
    # A quiet while forgives the old failures: the next one starts the count again.
    assert bad("a") == 0.0


# --- the trusted proxy ----------------------------------------------------------------

PROXY = {
    "proxy_user_header": "X-Forwarded-User",
    "proxy_role_header": "X-Forwarded-Role",
    "trusted_proxies": ("127.0.0.0/8",),
}


def test_a_proxy_header_is_believed_from_the_trusted_address_only(
    backend: Backend, ledger: Ledger
) -> None:
    desk = serve(backend, ledger, **PROXY)
    run = backend.seeded.id("paused-1")
    add_user(desk, "Opal", "operator")
    shown = card(desk, run)
    before = desk.truth.fingerprint()

    def as_person(name: str, role: str | None = None) -> dict[str, Any]:
        headers: dict[str, Any] = {"X-Forwarded-User": name.encode(), **JSON}
        if role is not None:
            headers["X-Forwarded-Role"] = role
        return headers

    # From an address that is not the proxy, the header is nobody.
    stranger = other_client(desk, client=ELSEWHERE, base_url=f"http://{PUBLIC_HOST}")
    assert stranger.get("/runs.json", headers=as_person("Zoë", "operator")).status_code == 401
    forged = stranger.post(
        f"/approvals/{run}/approve",
        data={"checkpoint_id": shown["checkpoint_id"]},
        headers=as_person("Zoë", "operator"),
    )
    assert forged.status_code == 401
    assert desk.truth.fingerprint() == before

    # From the proxy: its name and role; without a role, the users table, then viewer.
    assert desk.client.get("/runs.json", headers=as_person("Zoë", "approver")).status_code == 200
    nobody = desk.client.post("/prune", data={"older_than": "0s"}, headers=as_person("Nemo"))
    assert nobody.status_code == 403 and "viewer" in message(nobody)
    page = desk.client.get("/", headers={"X-Forwarded-User": b"Opal"}).text
    assert "Opal · operator" in page and "Sign out" not in page
    decided = desk.client.post(
        f"/approvals/{run}/approve",
        data={"approver": "someone else", "checkpoint_id": shown["checkpoint_id"]},
        headers=as_person("Zoë", "approver"),
    )
    assert decided.status_code == 200, decided.text
    [row] = desk.truth.decisions(run)
    assert row["actor"] == "Zoë"


def test_with_sign_in_off_every_page_says_so(backend: Backend) -> None:
    desk = backend.acting(None, sign_in=SignIn(required=False))
    page = desk.client.get("/")
    assert page.status_code == 200
    assert 'id="no-auth"' in page.text and "sign-in off" in page.text
    queue = desk.client.get("/approvals").text
    assert 'name="approver"' in queue  # people name themselves


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]"])
def test_a_loopback_host_name_from_a_network_client_is_refused(backend: Backend, host: str) -> None:
    desk = serve(backend)
    remote = other_client(desk, client=ELSEWHERE, base_url=f"http://{host}:8765")
    response = remote.get("/runs.json", headers=bearer(TEST_TOKEN))
    assert response.status_code == 400
    assert "runs" not in response.text
    local = other_client(desk, client=LOOPBACK_CLIENT, base_url=f"http://{host}:8765")
    assert local.get("/runs.json", headers=bearer(TEST_TOKEN)).status_code == 200
