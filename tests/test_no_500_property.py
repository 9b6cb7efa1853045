"""No input answers 5xx: generated values for every query parameter and form field of
every route, on stores the real SDK wrote: SQLite with sign-in on (as an operator, by
Bearer token), and PostgreSQL with sign-in off (so the typed ``approver`` and ``actor``
fields are read too). An approval policy with a field of every type governs the seeded
pauses, so the typed fields are parsed as well.

The routes come from the app itself; each must have an entry in ``PARAMETERS`` (the
names its endpoint reads), so a new route fails here until its inputs are listed
and tried. Every request also carries one made-up name, since endpoints must ignore
what they do not read.

Requests go straight to the ASGI app on the test client's event loop, so an event
stream is seen to start and is then told the client has gone, like a closed tab.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_from_bytes, unquote

import anyio
import pytest
from helpers import LOOPBACK_CLIENT, NO_SIGN_IN, TEST_TOKEN, sign_in_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from localui.app import create_app
from localui.policy import parse_policy
from localui.settings import Settings

if TYPE_CHECKING:
    from conftest import PgSeeded, Seeded

RUNS_FILTERS = ("state", "agent", "q", "after", "outbox")
QUEUE = ("order", "after")
DECISION_FILTERS = ("approver", "agent", "outcome", "kind", "since", "until", "after")
AUDIT_FILTERS = ("person", "action", "run", "since", "until", "after")
#: The policy's typed fields, as a form sends them.
FIELDS = tuple(f"field.{n}" for n in ("amount", "count", "channel", "note", "urgent"))

#: A rule over every seeded pause, with a field of every type (``FIELDS``).
POLICY = """
[[rule]]
name = "every refund"
agent = "refund-*"
approvers = ["role:approver"]

[[rule.field]]
name = "amount"
type = "number"
min = 0
max = "context.amount"

[[rule.field]]
name = "count"
type = "integer"
max = 10

[[rule.field]]
name = "channel"
type = "choice"
choices = ["card", "bank transfer"]

[[rule.field]]
name = "note"
type = "text"

[[rule.field]]
name = "urgent"
type = "boolean"
"""

#: Route name -> (query parameters, form fields) its endpoint reads.
PARAMETERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "runs": (RUNS_FILTERS, ()),
    "runs_json": (RUNS_FILTERS, ()),
    "runs_alias": (RUNS_FILTERS, ()),
    "row_detail": ((), ()),
    "row_detail_json": ((), ()),
    "run_diff": (("a", "b"), ()),
    "run_diff_json": (("a", "b"), ()),
    "diff": (("a", "b"), ()),
    "diff_json": (("a", "b"), ()),
    "compare": (("a", "b", "from", "run"), ()),
    "compare_json": (("a", "b", "from", "run"), ()),
    "compare_pair": (("a", "b", "pair"), ()),
    "run": (("from", "rows"), ()),
    "run_json": (("from", "rows"), ()),
    "run_bundle": (("redact",), ()),
    "resume_run": ((), ("checkpoint_id", "actor", "confirm")),
    "reopen_pause": ((), ("checkpoint_id", "actor")),
    "fork_run": (
        (),
        (
            "checkpoint_id",
            "input",
            "messages",
            "state",
            "edit",
            "content.0",
            "arguments.0.0",
            "remove_from",
            "add_role",
            "add_content",
            "actor",
        ),
    ),
    "edit_row": (("checkpoint_id",), ()),
    "edit_preview": (
        (),
        ("checkpoint_id", "messages", "content.0", "arguments.0.0", "remove_from", "add_role"),
    ),
    "edit_row_json": (("checkpoint_id",), ()),
    "fork_preview": (("checkpoint_id", "input"), ()),
    "fork_preview_json": (("checkpoint_id", "input"), ()),
    "approvals": (QUEUE, ()),
    "approvals_json": (QUEUE, ()),
    "approval": ((), ()),
    "approval_json": ((), ()),
    "approve": ((), ("approver", "reason", "checkpoint_id", *FIELDS)),
    "decision_link": ((), ()),
    "decide_by_link": ((), ("link", "form_key", "decision", "reason", *FIELDS)),
    "reject": ((), ("approver", "reason", "checkpoint_id", *FIELDS)),
    "bulk_decide": ((), ("verb", "approver", "reason", "pick", *FIELDS)),
    "add_note": ((), ("checkpoint_id", "text", "author")),
    "approval_context": ((), ()),
    "cache": (("older_than", "after"), ()),
    "cache_json": (("older_than", "after"), ()),
    "notifications": ((), ()),
    "notifications_json": ((), ()),
    "live_nav": ((), ()),
    "live_runs": (RUNS_FILTERS, ()),
    "live_run": ((), ()),
    "live_approvals": (QUEUE, ()),
    "live_approval": ((), ()),
    "live_mux": (("s",), ()),
    "prune": (("older_than",), ()),
    "prune_json": (("older_than",), ()),
    "prune_now": ((), ("older_than", "cutoff", "prune_token")),
    "static": ((), ()),
    "signin": (("next", "token"), ("token", "next")),
    "signout": ((), ()),
    "me_away": ((), ("to", "until", "next")),
    "me_back": ((), ("next",)),
    "signin_oidc": (("next",), ()),
    "signin_oidc_callback": (("code", "state", "iss", "error", "error_description"), ()),
    "attention": (("after",), ()),
    "attention_json": (("after",), ()),
    "bulk_resume": ((), ("pick", "confirm", "actor")),
    "decisions": (DECISION_FILTERS, ()),
    "decisions_json": (DECISION_FILTERS, ()),
    "decisions_csv": (DECISION_FILTERS, ()),
    "audit": (AUDIT_FILTERS, ()),
    "audit_json": (AUDIT_FILTERS, ()),
    "audit_csv": (AUDIT_FILTERS, ()),
    "metrics": ((), ()),
}


@dataclass(frozen=True)
class Endpoint:
    name: str
    method: str
    path: str
    query: tuple[str, ...]
    form: tuple[str, ...]


def endpoints(app: Any) -> list[Endpoint]:
    found: list[Endpoint] = []
    for route in app.routes:
        if isinstance(route, Mount):
            found.append(Endpoint(str(route.name), "GET", route.path + "/{path}", (), ()))
            continue
        assert isinstance(route, Route)
        query, form = PARAMETERS.get(route.name, ((), ()))
        for method in sorted(route.methods or {"GET"}):
            if method != "HEAD":
                found.append(Endpoint(route.name, method, route.path, query, form))
    return found


@dataclass(frozen=True)
class Served:
    client: TestClient
    endpoints: tuple[Endpoint, ...]
    execution_ids: tuple[str, ...]
    checkpoint_ids: tuple[str, ...]
    #: A waiting pause: ``(execution_id, checkpoint_id)``.
    paused: tuple[str, str]
    #: What every request carries to sign in (nothing with sign-in off).
    headers: tuple[tuple[bytes, bytes], ...] = ()


def record_some_decisions(
    settings: Settings, paused: tuple[str, str], done: tuple[str, str]
) -> None:
    """A finished resume and a vote in the record, through the app's own decision log, so
    a listing's cursors reach both tables' SQL."""
    from localui.backends import open_backend
    from localui.records import RESUME

    backend = open_backend(settings)
    log = backend.decision_log(writable=True)
    try:
        claim = log.claim(
            kind=RESUME,
            execution_id=done[0],
            checkpoint_id=done[1],
            approved=None,
            actor="ada",
            reason="",
            still_pending=lambda: True,
        )
        log.finish(claim.decision.id, "completed", None)
        log.cast_vote(
            execution_id=paused[0],
            checkpoint_id=paused[1],
            actor="bob",
            reason="checked",
            fields_json="{}",
            needed=2,
        )
    finally:
        log.close()
        backend.close()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    from conftest import BASE_URL

    policy = parse_policy(POLICY, "policy.toml")
    bearer: dict[str, str] = {}
    pending = "SELECT execution_id, node_id FROM {s}pending_interrupts ORDER BY execution_id"
    rows_sql = "SELECT execution_id, checkpoint_id, node_id, status FROM {s}checkpoints"
    if request.param == "sqlite":
        from conftest import Raw, backup

        seeded: Seeded = request.getfixturevalue("seeded")
        # A copy of its own: no agent is registered, so no action can change it, but the
        # app keeps its decision table in the store's database.
        path = backup(seeded.path, tmp_path_factory.mktemp("property") / "local.db")
        raw = Raw(path)
        rows = [dict(r) for r in raw.query(rows_sql.format(s=""))]
        waiting = [dict(r) for r in raw.query(pending.format(s=""))]
        # Sign-in on, as an operator by Bearer token: the sign-in check is a route's first
        # reader of its input too. Never locked out, per address or overall (drawn requests
        # carry bad tokens by the hundred), or every later answer would be a 429.
        sign_in = sign_in_settings(lock_after=10**9, slow_after=10**9, global_lock_after=10**9)
        settings = Settings(store=str(path), sign_in=sign_in, policy=policy)
        bearer = {"Authorization": f"Bearer {TEST_TOKEN}"}
        drop = None
    else:
        from conftest import PgRaw, PgStore, pg_name

        pg: PgSeeded = request.getfixturevalue("pg_seeded")
        # The seeded runs, read only (no agent is registered), with an app schema of its own.
        serving = PgStore(pg.dsn, pg.schema, pg_name("localui"))
        sdk = PgRaw(pg.dsn, pg.schema)
        rows = sdk.query(rows_sql.format(s="{s}."))
        waiting = sdk.query(pending.format(s="{s}."))
        settings = serving.settings(sign_in=NO_SIGN_IN, policy=policy)
        drop = serving.app_raw
    first = waiting[0]
    paused = next(
        (r["execution_id"], r["checkpoint_id"])
        for r in rows
        if r["execution_id"] == first["execution_id"]
        and r["node_id"] == first["node_id"]
        and r["status"] == "interrupted"
    )
    done = next((r["execution_id"], r["checkpoint_id"]) for r in rows if r["status"] == "completed")
    record_some_decisions(settings, paused, done)
    app = create_app(settings)
    try:
        with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT, headers=bearer) as client:
            yield Served(
                client=client,
                endpoints=tuple(endpoints(app)),
                execution_ids=tuple(sorted({r["execution_id"] for r in rows})),
                checkpoint_ids=tuple(sorted({r["checkpoint_id"] for r in rows}))[:20],
                paused=paused,
                headers=tuple((k.lower().encode(), v.encode()) for k, v in bearer.items()),
            )
    finally:
        if drop is not None:
            drop.drop()


def test_every_route_has_its_inputs_listed(served: Served) -> None:
    names = {e.name for e in served.endpoints}
    assert names == set(PARAMETERS), (
        f"routes without inputs listed here: {sorted(names - set(PARAMETERS))}; "
        f"listed but gone: {sorted(set(PARAMETERS) - names)}"
    )


def cursor(*values: Any) -> str:
    """A cursor as the pages write one, around any JSON."""
    raw = json.dumps(list(values)).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


#: Values that have broken parsers before, beside anything Hypothesis makes up: among
#: them cursors and bulk picks whose ids no store can compare or hold.
TRICKY_VALUES = (
    "",
    "²",
    "²d",
    "7d",
    "0s",
    "1" * 5000,
    "1" * 5000 + "d",
    "-1",
    "1e9",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-14:00",
    "2026-01-01T00:00:00",
    "all",
    "paused",
    "newest",
    "waiting",
    "yes",
    "[" * 5000,
    "%00",
    "\x00",
    "../../prune?older_than=0s&x=",
    "王小明",
    "\ud800",
    "[" * 200_000,
    '["\\ud800","x"]',
    '["x","\\u0000"]',
    '["x","y"]',
    cursor("x", "99999999999999999999"),
    cursor("x", "vote-99999999999999999999"),
    cursor("x", "-99999999999999999999"),
    cursor("x", "vote--1"),
    cursor("2026-01-01T00:00:00+00:00", "99999999999999999999"),
    cursor("2026-01-01T00:00:00+00:00", "vote-99999999999999999999"),
    cursor("2026-01-01T00:00:00+00:00", "-99999999999999999999"),
    cursor("\ud800", "x"),
    cursor("x\u0000", "1"),
    base64.urlsafe_b64encode(b"[" * 700).decode(),
)
TRICKY = st.sampled_from(TRICKY_VALUES)
TEXT = st.one_of(
    TRICKY, st.text(max_size=60), st.from_regex(r"[0-9]{1,25}[smhdw]?", fullmatch=True)
)
RAW_BYTES = st.binary(max_size=40)


def encode_pairs(pairs: list[tuple[str, str | bytes]]) -> bytes:
    parts = []
    for name, value in pairs:
        encoded = (
            quote_from_bytes(value)
            if isinstance(value, bytes)
            else quote(value.encode("utf-8", "surrogatepass"), safe="")
        )
        parts.append(f"{quote(name, safe='')}={encoded}")
    return "&".join(parts).encode()


def some_of(names: tuple[str, ...]) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(names), unique=True) if names else st.just([])


@st.composite
def requests(draw: st.DrawFn, served: Served) -> tuple[Endpoint, dict[str, Any]]:
    endpoint = draw(st.sampled_from(served.endpoints))
    path_values: dict[str, str] = {}
    for name in ("execution_id", "checkpoint_id", "path"):
        if "{" + name + "}" in endpoint.path:
            known = {
                "execution_id": served.execution_ids,
                "checkpoint_id": served.checkpoint_ids,
                "path": ("localui.css", "htmx-2.0.11.min.js"),
            }[name]
            path_values[name] = draw(st.one_of(st.sampled_from(known), TEXT))
    ids = [st.sampled_from(served.checkpoint_ids)]
    if endpoint.name.startswith("compare"):
        # Runs that exist, so the drawn requests reach past the lookup into the alignment.
        ids.append(st.sampled_from(served.execution_ids))
    value = st.one_of(TEXT, RAW_BYTES, *ids)
    chosen_query = (
        draw(st.lists(st.sampled_from(endpoint.query), unique=True)) if endpoint.query else []
    )
    chosen_form = (
        draw(st.lists(st.sampled_from(endpoint.form), unique=True)) if endpoint.form else []
    )
    query = [(n, draw(value)) for n in chosen_query] + [(draw(st.text(max_size=8)), draw(value))]
    form = [(n, draw(value)) for n in chosen_form]
    accept = draw(st.sampled_from(["text/html", "application/json", "*/*"]))
    htmx = draw(st.booleans())
    return endpoint, {
        "path_values": path_values,
        "query": query,
        "form": form,
        "accept": accept,
        "htmx": htmx,
    }


async def status_of(app: Any, scope: dict[str, Any], body: bytes) -> int:
    """The status the app answers with; an event stream is closed once it has started."""
    started = anyio.Event()
    statuses: list[int] = []
    body_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await started.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
            started.set()

    with anyio.fail_after(20):
        try:
            await app(scope, receive, send)
        except Exception:
            # The server-error middleware answers 500 and raises again: a 500 all the same.
            return statuses[0] if statuses else 500
    return statuses[0] if statuses else 500


def build_scope(
    endpoint: Endpoint,
    request: dict[str, Any],
    body: bytes,
    signed: tuple[tuple[bytes, bytes], ...],
) -> dict[str, Any]:
    raw_path = endpoint.path
    for name, value in request["path_values"].items():
        raw_path = raw_path.replace(
            "{" + name + "}", quote(value.encode("utf-8", "surrogatepass"), safe="")
        )
    # As uvicorn makes the path from the request target: bytes that are not UTF-8 become U+FFFD.
    path = unquote(raw_path)
    headers = [
        (b"host", b"127.0.0.1:8765"),
        (b"accept", request["accept"].encode()),
        (b"content-length", str(len(body)).encode()),
        *signed,
    ]
    if endpoint.method == "POST":
        headers.append((b"content-type", b"application/x-www-form-urlencoded"))
    if request["htmx"]:
        headers.append((b"hx-request", b"true"))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": endpoint.method,
        "scheme": "http",
        "path": path,
        "raw_path": raw_path.encode(),
        "root_path": "",
        "query_string": encode_pairs(request["query"]),
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8765),
        "state": {},
    }


#: The app's endpoints, known when tests are collected (building the app opens nothing).
ENDPOINTS = endpoints(create_app(Settings(store="collected-only.db")))


def plausible(served: Served) -> dict[str, str]:
    """A value each input takes when another is being tried: each route goes as deep as
    it can (a known verb, a reason, the pause's own row, a pick of it), so the tried
    value reaches its parser rather than an earlier refusal."""
    execution_id, checkpoint_id = served.paused
    return {
        "execution_id": execution_id,
        "checkpoint_id": checkpoint_id,
        "path": "localui.css",
        "verb": "approve",
        "approver": "ada",
        "actor": "ada",
        "reason": "checked the order",
        "pick": json.dumps([execution_id, checkpoint_id]),
        "confirm": "yes",
        "input": "hello",
        "older_than": "7d",
        "field.amount": "1",
        "field.count": "1",
        "field.channel": "card",
        "field.note": "a note",
        "field.urgent": "true",
    }


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
def test_every_tricky_value_in_every_input(served: Served, endpoint: Endpoint) -> None:
    """Each value that broke a parser once, in each input of each route, one at a time,
    the route's other form fields plausible."""
    usual = plausible(served)
    path_values = {
        name: usual[name]
        for name in ("execution_id", "checkpoint_id", "path")
        if "{" + name + "}" in endpoint.path
    }
    form = [(name, usual[name]) for name in endpoint.form if name in usual]

    def beside(name: str, value: str) -> list[tuple[str, str]]:
        return [(n, v) for n, v in form if n != name] + [(name, value)]

    trials: list[dict[str, Any]] = [
        {"path_values": {**path_values, name: value}, "query": [], "form": form}
        for name in path_values
        for value in TRICKY_VALUES
    ]
    trials += [
        {"path_values": path_values, "query": [(name, value)], "form": form}
        for name in endpoint.query
        for value in TRICKY_VALUES
    ]
    trials += [
        {"path_values": path_values, "query": [], "form": beside(name, value)}
        for name in endpoint.form
        for value in TRICKY_VALUES
    ]
    for trial in trials:
        for accept in ("text/html", "application/json"):
            request = {**trial, "accept": accept, "htmx": False}
            status = answer(served, endpoint, request)
            assert status < 500, (endpoint.method, endpoint.path, trial)


def answer(served: Served, endpoint: Endpoint, request: dict[str, Any]) -> int:
    body = encode_pairs(request["form"]) if endpoint.method == "POST" else b""
    scope = build_scope(endpoint, request, body, served.headers)
    assert served.client.portal is not None
    return served.client.portal.call(status_of, served.client.app, scope, body)


def test_no_generated_input_answers_5xx(served: Served) -> None:
    before = served.client.get("/runs.json").json()

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(requests(served))
    def check(drawn: tuple[Endpoint, dict[str, Any]]) -> None:
        endpoint, request = drawn
        assert answer(served, endpoint, request) < 500

    check()
    # No agent is registered and no prune token was forged: nothing was changed.
    after = served.client.get("/runs.json").json()
    assert (after["counts"], after["runs"]) == (before["counts"], before["runs"])
