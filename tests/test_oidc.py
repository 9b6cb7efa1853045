"""Sign-in with OpenID Connect, against a real OpenID Provider on loopback
(``tests/oidc_provider.py``: panva's ``oidc-provider``), never a fake.

The desk runs in this process over a real store; the provider in its own Node.js
process. A browser is two HTTP clients here: the desk's test client, which keeps the
desk's cookies, and a real one for the provider's pages, whose final redirect back to
the desk is handed to the desk's client, so a test can tamper with it or replay it.
"""

# The suite's ``backend`` fixture is imported from test_backends, and tests name it
# as a parameter, which pyflakes takes for a redefinition.
# ruff: noqa: F811

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pytest
from conftest import BASE_URL
from helpers import TEST_TOKEN
from oidc_provider import OpenIDProvider, new_key
from test_auth import serve
from test_backends import (  # noqa: F401  (fixtures the backend fixture needs)
    Backend,
    _pg_schemas_to_drop,
    backend,
    pg_seeded_store,
)
from test_cli import LOCALUI, assert_one_line_error, run_cli

from localui.settings import OpenIDConnect

if TYPE_CHECKING:
    from starlette.testclient import TestClient

ROLES = (("approvers", "approver"), ("viewers", "viewer"), ("ops", "operator"))
CALLBACK = f"{BASE_URL}/signin/oidc/callback"


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[OpenIDProvider]:
    with OpenIDProvider(tmp_path / "provider", redirect_uri=CALLBACK) as op:
        yield op


def oidc_of(op: OpenIDProvider, **more: Any) -> OpenIDConnect:
    return OpenIDConnect(
        issuer=op.issuer,
        client_id=op.client_id,
        client_secret=op.client_secret,
        roles=ROLES,
        **more,
    )


def desk_of(backend: Backend, op: OpenIDProvider) -> TestClient:
    return serve(backend, oidc=oidc_of(op)).client


def at_provider(desk: TestClient, op: OpenIDProvider, login: str, next_url: str = "/") -> str:
    """Start a sign-in on the desk and sign ``login`` in at the provider: the URL the
    provider sends the browser back to (not yet asked of the desk)."""
    started = desk.get(f"/signin/oidc?{urlencode({'next': next_url})}", follow_redirects=False)
    assert started.status_code == 303, started.text
    assert started.headers["location"].startswith(op.issuer)
    with httpx.Client(timeout=10) as browser:
        return op.sign_in(browser, started.headers["location"], login)


def shown(answer: httpx.Response) -> str:
    """A page's text as a person reads it (its apostrophes are escaped in the HTML)."""
    return html.unescape(answer.text)


def back_at_desk(desk: TestClient, url: str) -> httpx.Response:
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}" == BASE_URL, url
    return desk.get(f"{parts.path}?{parts.query}", follow_redirects=False)


def signed_in(desk: TestClient, op: OpenIDProvider, login: str, next_url: str = "/") -> None:
    came = back_at_desk(desk, at_provider(desk, op, login, next_url))
    assert came.status_code == 303, came.text
    assert came.headers["location"] == next_url


def test_people_sign_in_at_the_provider_with_their_groups_role(
    backend: Backend, provider: OpenIDProvider
) -> None:
    desk = desk_of(backend, provider)
    page = desk.get("/signin")
    assert f"Sign in with 127.0.0.1:{provider.port}" in page.text
    # Straight from a page that needs a session: the sign-in page offers the provider.
    assert "/signin/oidc?next=" in desk.get("/approvals").text

    signed_in(desk, provider, "ann", "/approvals?order=newest")
    queue = desk.get("/approvals")
    assert queue.status_code == 200 and "ann · approver" in queue.text
    # The flow's cookie is spent; the session cookie is the desk's usual one.
    assert not any(c.name.startswith("localui_oidc_") for c in desk.cookies.jar)
    assert any(re.fullmatch(r"localui_session_\w+", c.name) for c in desk.cookies.jar)

    viewer = serve(backend, oidc=oidc_of(provider)).client
    signed_in(viewer, provider, "vic")
    assert "vic · viewer" in viewer.get("/").text
    refused = viewer.post("/prune", data={"older_than": "2w"})
    assert refused.status_code == 403

    # Signing out ends it, as for any session.
    desk.post("/signout")
    assert desk.get("/approvals").status_code == 401
    # The audit log says who signed in at the provider, and who out.
    owner = {"Authorization": f"Bearer {TEST_TOKEN}"}
    entries = desk.get("/audit.json", headers=owner).json()["entries"]
    said = [(e["action"], e["actor"], e["via"], json.loads(e["detail"])) for e in entries]
    assert ("signin", "ann", "oidc", {"by": "oidc"}) in said
    assert ("signout", "ann", "oidc", {}) in said


def test_the_provider_down_is_said_plainly_and_open_sessions_go_on(
    backend: Backend, provider: OpenIDProvider
) -> None:
    desk = desk_of(backend, provider)
    signed_in(desk, provider, "ann")
    provider.stop()
    assert "ann · approver" in desk.get("/approvals").text
    other = serve(backend, oidc=oidc_of(provider)).client
    down = other.get("/signin/oidc", follow_redirects=False)
    assert down.status_code == 503
    assert f"The identity provider at {provider.issuer} cannot be reached" in shown(down)
    assert "sessions already open go on" in shown(down)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_wrong_state_and_a_replayed_code_are_refused(
    backend: Backend, provider: OpenIDProvider
) -> None:
    desk = desk_of(backend, provider)
    back = at_provider(desk, provider, "ann")
    query = dict(parse_qsl(urlsplit(back).query))
    wrong = back_at_desk(desk, f"{CALLBACK}?{urlencode({**query, 'state': 'not-the-state'})}")
    assert wrong.status_code == 400
    assert "not for the sign-in this browser started (its state differs)" in shown(wrong)
    assert desk.get("/approvals").status_code == 401

    # Once more from the start; the answer used, then brought back with the flow's
    # cookie as it was (someone who copied both): the provider refuses the code again.
    back = at_provider(desk, provider, "ann")
    flow = {c.name: c.value for c in desk.cookies.jar if c.name.startswith("localui_oidc_")}
    assert back_at_desk(desk, back).status_code == 303
    desk.post("/signout")
    for name, value in flow.items():
        desk.cookies.set(name, value, domain="127.0.0.1", path="/")
    again = back_at_desk(desk, back)
    assert again.status_code == 400
    assert "The identity provider refused the sign-in's code (invalid_grant" in shown(again)
    assert desk.get("/approvals").status_code == 401
    # The flow's cookie was spent by that answer too: now refused before the provider.
    bare = back_at_desk(desk, back)
    assert bare.status_code == 400 and "was not started in this browser" in shown(bare)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_someone_in_no_mapped_group_is_refused_and_told_why(
    backend: Backend, provider: OpenIDProvider
) -> None:
    desk = desk_of(backend, provider)
    came = back_at_desk(desk, at_provider(desk, provider, "nora"))
    assert came.status_code == 403
    assert "nora is signed in at the identity provider, but none of their groups" in shown(came)
    assert "--oidc-role GROUP=ROLE" in shown(came)
    assert desk.get("/approvals").status_code == 401
    owner = {"Authorization": f"Bearer {TEST_TOKEN}"}
    [refused] = desk.get("/audit.json?action=signin_failed", headers=owner).json()["entries"]
    assert (refused["status"], json.loads(refused["detail"])) == (403, {"by": "oidc"})


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_an_expired_id_token_is_refused(backend: Backend, tmp_path: Path) -> None:
    # The provider's clock two hours slow: every ID token it signs has expired already.
    with OpenIDProvider(
        tmp_path / "slow", redirect_uri=CALLBACK, clock_offset_seconds=-7200
    ) as provider:
        desk = desk_of(backend, provider)
        came = back_at_desk(desk, at_provider(desk, provider, "ann"))
    assert came.status_code == 401
    assert "The ID token has expired" in shown(came)
    assert desk.get("/approvals").status_code == 401


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_rotated_keys_are_fetched_and_a_wrongly_signed_token_is_refused(
    backend: Backend, provider: OpenIDProvider
) -> None:
    desk = desk_of(backend, provider)
    signed_in(desk, provider, "ann")  # the desk has read the provider's keys
    desk.post("/signout")
    # The provider rotates to a key the desk has not seen: the desk reads the keys again.
    time.sleep(1.1)  # the least time between two reads of the keys
    provider.restart(keys=[new_key("key-2")])
    signed_in(desk, provider, "vic")
    assert "vic · viewer" in desk.get("/").text
    desk.post("/signout")

    # Then a token signed by another key under a key id the desk knows: refused.
    provider.restart(keys=[new_key("key-2")])
    forged = back_at_desk(desk, at_provider(desk, provider, "ann"))
    assert forged.status_code == 401
    assert "signature does not verify with the identity provider's published keys" in shown(forged)


def test_oidc_options_are_checked_at_start(tmp_path: Path, store_copy: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    base = ["serve", "--store", str(store_copy)]
    cases = [
        (["--oidc-client-id", "x"], "need --oidc-issuer"),
        (["--oidc-issuer", "http://idp.example.com", "--oidc-client-id", "x"], "give an https://"),
        (["--oidc-issuer", "https://idp.example.com"], "needs --oidc-client-id"),
        (
            ["--oidc-issuer", "https://idp.example.com", "--oidc-client-id", "x",
             "--oidc-client-secret-file", str(tmp_path / "none")],
            "--oidc-client-secret-file",
        ),
        (
            ["--oidc-issuer", "https://idp.example.com", "--oidc-client-id", "x",
             "--oidc-client-secret-file", str(secret)],
            "at least one --oidc-role",
        ),
        (
            ["--oidc-issuer", "https://idp.example.com", "--oidc-client-id", "x",
             "--oidc-client-secret-file", str(secret), "--oidc-role", "ops=admin"],
            "--oidc-role 'ops=admin'",
        ),
        (["--oidc-issuer", "http://127.0.0.1:9", "--no-auth"], "contradict"),
    ]  # fmt: skip
    for flags, said in cases:
        done = run_cli([LOCALUI, *base, *flags], tmp_path)
        assert_one_line_error(done, said)
