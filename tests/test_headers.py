"""Security headers on every kind of response, and the body cap, through the app."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from localui.app import LocalUIApp
from localui.paths import static_dir
from localui.security import CONTENT_SECURITY_POLICY, MAX_BODY_BYTES

if TYPE_CHECKING:
    from conftest import ClientFactory, Seeded

EXPECTED = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'; "
        "form-action 'self'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def assert_secured(response: httpx.Response, *, no_store: bool) -> None:
    for name, value in EXPECTED.items():
        assert response.headers.get(name) == value, (name, response.request.url)
        assert len(response.headers.get_list(name)) == 1, name
    assert "server" not in response.headers
    if no_store:
        assert response.headers.get("cache-control") == "no-store", response.request.url


def test_the_policy_is_the_one_documented() -> None:
    assert CONTENT_SECURITY_POLICY == EXPECTED["content-security-policy"]


def _static_file() -> str:
    return next(p.name for p in static_dir().iterdir() if p.suffix == ".js")


@pytest.mark.parametrize(
    ("url", "headers", "no_store"),
    [
        ("/", {}, False),
        ("/runs/{completed}", {}, False),
        ("/runs/{completed}", {"HX-Request": "true"}, False),
        ("/approvals", {}, False),
        ("/prune?older_than=7d", {}, False),
        ("/runs.json", {}, True),
        ("/approvals", {"Accept": "application/json"}, True),
        ("/runs/no-such-run", {}, False),
        ("/runs/no-such-run.json", {}, True),
        ("/no/such/page", {}, False),
        ("/prune?older_than=%C2%B2d", {}, False),
        ("/static/{static}", {}, False),
    ],
)
def test_every_get_carries_the_headers(
    client: TestClient, seeded: Seeded, url: str, headers: dict[str, str], no_store: bool
) -> None:
    response = client.get(
        url.format(completed=seeded.id("completed"), static=_static_file()), headers=headers
    )
    assert response.status_code in (200, 400, 404)
    assert_secured(response, no_store=no_store)


def test_guard_refusals_carry_the_headers(client: TestClient) -> None:
    foreign = client.get("/", headers={"Host": "evil.example"})
    assert foreign.status_code == 400
    assert_secured(foreign, no_store=False)
    cross = client.post("/prune", headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403
    assert_secured(cross, no_store=True)


def test_actions_answer_no_store(client: TestClient, seeded: Seeded) -> None:
    # No agent is registered here: the approval is refused, and the refusal is an action's.
    response = client.post(
        f"/approvals/{seeded.id('paused-1')}/approve",
        data={"approver": "Ann", "reason": "ok", "checkpoint_id": "x"},
        follow_redirects=False,
    )
    assert 300 <= response.status_code < 500
    assert_secured(response, no_store=True)


def test_event_streams_carry_the_headers(make_client: ClientFactory, app_store: Path) -> None:
    client = make_client(app_store)
    # A finite stream: the app ends it when the client says it has gone.
    with client.stream("GET", "/live/nav", headers={"Accept": "text/event-stream"}) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert_secured(stream, no_store=False)  # type: ignore[arg-type]


def test_the_server_error_page_carries_the_headers() -> None:
    async def broken(request: object) -> None:
        raise RuntimeError("a bug")

    app = LocalUIApp(routes=[Route("/broken", broken)])
    response = TestClient(app, raise_server_exceptions=False).get("/broken")
    assert response.status_code == 500
    assert_secured(response, no_store=False)


@pytest.mark.parametrize("size", [MAX_BODY_BYTES + 1, 20 * MAX_BODY_BYTES])
def test_a_body_over_the_cap_is_a_413(client: TestClient, seeded: Seeded, size: int) -> None:
    response = client.post(
        f"/approvals/{seeded.id('paused-1')}/approve",
        content=b"approver=" + b"x" * (size - 9),
        headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"},
    )
    assert response.status_code == 413
    assert "1,000,000 bytes" in response.json()["error"]["message"]
    assert_secured(response, no_store=True)


def test_a_body_under_the_cap_is_read(client: TestClient, seeded: Seeded) -> None:
    response = client.post(
        f"/runs/{seeded.id('completed')}/fork",
        data={"input": "x" * 20_001},
        headers={"Accept": "application/json"},
    )
    # Read and refused by the fork's own rule, not by the cap.
    assert response.status_code == 400
    assert "20,000 characters" in response.json()["error"]["message"]


def test_chunked_bodies_are_counted(client: TestClient, seeded: Seeded) -> None:
    response = client.post(
        f"/runs/{seeded.id('completed')}/fork",
        content=(b"x" * 100_000 for _ in range(11)),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 413


# --- JSON: never stored, and varied by Accept where Accept chose it ---------------------


@pytest.mark.parametrize(
    ("url", "headers", "status"),
    [
        ("/no/such/page.json", {}, 404),
        ("/no/such/page", {"Accept": "application/json"}, 404),
        ("/runs/no-such-run", {"Accept": "application/json"}, 404),
        ("/approvals/no-such-run.json", {}, 404),
        ("/diff.json?a=x&b=y", {}, 404),
        ("/compare.json?a=x&b=y", {}, 404),
        ("/compare?a=x", {"Accept": "application/json"}, 400),
        ("/runs/x.json?after=not-a-cursor", {}, 404),
        ("/?after=not-a-cursor", {"Accept": "application/json"}, 400),
        ("/prune.json?older_than=soon", {}, 400),
    ],
)
def test_every_json_error_is_no_store(
    client: TestClient, url: str, headers: dict[str, str], status: int
) -> None:
    response = client.get(url, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.text
    assert_secured(response, no_store=True)


@pytest.mark.parametrize(
    ("url", "accept"),
    [
        ("/", "application/json"),
        ("/", "text/html"),
        ("/approvals", "application/json"),
        ("/approvals", "text/html"),
        ("/runs/{completed}", "application/json"),
        ("/runs/{completed}", "text/html"),
        ("/runs/no-such-run", "application/json"),
        ("/runs/no-such-run", "text/html"),
    ],
)
def test_pages_chosen_by_accept_vary_on_it(
    client: TestClient, seeded: Seeded, url: str, accept: str
) -> None:
    # Both answers of one URL must say so, or a cache hands the JSON to a browser.
    response = client.get(url.format(completed=seeded.id("completed")), headers={"Accept": accept})
    assert response.status_code in (200, 404)
    vary = {v.strip().lower() for v in response.headers.get("vary", "").split(",")}
    assert "accept" in vary, response.headers
