"""The audit log (issue #42): every change made through localui is one hash-chained row.

Each test runs on SQLite and on PostgreSQL (``backend``, from ``test_backends``): an
app with the refund-bot registered over a fresh copy of the seeded runs, its requests
real, the rows read back from the store's own table and changed there with plain SQL.
"""

# The suite's ``backend`` fixture is imported from test_backends, and tests name it
# as a parameter, which pyflakes takes for a redefinition.
# ruff: noqa: F811

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest
from helpers import JSON, TEST_TOKEN, run_cli, sign_in_settings
from starlette.routing import BaseRoute, Mount, Route
from test_backends import (  # noqa: F401  (fixtures the backend fixture needs)
    Backend,
    _pg_schemas_to_drop,
    backend,
    pg_seeded_store,
)

from localui import audit
from localui.audit import AuditEntry, AuditEvent, ChainCheck
from localui.backends.base import AuditLog
from localui.backends.users import new_token, token_hash

if TYPE_CHECKING:
    from test_backends import Acting

BROWSER = {"Authorization": f"Bearer {TEST_TOKEN}"}
OWNER = {**BROWSER, **JSON}
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def serve(backend: Backend, **settings: Any) -> Acting:
    return backend.acting(sign_in=sign_in_settings(), **settings)


def log_of(desk: Acting) -> AuditLog:
    log: AuditLog | None = desk.client.app.state.localui.audit
    assert log is not None
    return log


def rows(desk: Acting) -> list[AuditEntry]:
    return list(log_of(desk).walk())


def check(desk: Acting) -> ChainCheck:
    checked = ChainCheck()
    for entry in log_of(desk).walk():
        checked.see(entry)
    return checked


def raw_sql(desk: Acting, statement: str) -> None:
    """``statement`` on the served store's audit table (``{t}``), as someone with the
    database in hand would run it."""
    opened = desk.client.app.state.localui.backend
    path = opened.target.sqlite_path
    if path is not None:
        with sqlite3.connect(path) as conn:
            conn.execute(statement.replace("{t}", audit_table()))
        return
    import psycopg

    with psycopg.connect(opened.dsn, autocommit=True) as conn:
        conn.execute(statement.replace("{t}", f"{opened.app_schema}.{audit_table()}"))


def audit_table() -> str:
    from localui.backends.audit import TABLE

    return TABLE


def add_user(desk: Acting, name: str, role: str) -> str:
    users = desk.client.app.state.localui.backend.users(writable=True)
    try:
        token = new_token()
        users.add(name, role, token_hash(token))
        return token
    finally:
        users.close()


def event(actor: str = "ann", action: str = "approve", run: str | None = "run-1") -> AuditEvent:
    return AuditEvent(
        actor=actor,
        via="user",
        address="127.0.0.1",
        action=action,
        method="POST",
        path="/x",
        execution_id=run,
        detail="{}",
        status=200,
        outcome="ok",
    )


# --- every change is a row ---------------------------------------------------------


def test_an_approval_is_one_row_saying_who_how_where_what_and_how_it_ended(
    backend: Backend,
) -> None:
    desk = serve(backend)
    paused = backend.seeded.id("paused-1")
    item = next(
        i
        for i in desk.client.get("/approvals.json", headers=OWNER).json()["approvals"]
        if i["execution_id"] == paused
    )
    form = {"approver": "x", "reason": "fine", "checkpoint_id": item["checkpoint_id"]}
    first = desk.client.post(f"/approvals/{paused}/approve", data=form, headers=OWNER)
    again = desk.client.post(f"/approvals/{paused}/approve", data=form, headers=OWNER)
    assert (first.status_code, again.status_code) == (200, 409)
    [done, refused] = rows(desk)
    assert (done.actor, done.via, done.address) == ("the-owner", "owner", "127.0.0.1")
    assert (done.action, done.method, done.path) == (
        "approve",
        "POST",
        f"/approvals/{paused}/approve",
    )
    assert (done.execution_id, done.status, done.outcome) == (paused, 200, "ok")
    assert (refused.action, refused.status, refused.outcome) == ("approve", 409, "refused")
    assert refused.prev_hash == done.hash and done.prev_hash == audit.GENESIS
    assert check(desk).intact and check(desk).count == 2


def _changing_routes(routes: list[BaseRoute], prefix: str = "") -> list[tuple[Route, str]]:
    """Every route, inside mounts too, that answers a method other than GET/HEAD."""
    found: list[tuple[Route, str]] = []
    for route in routes:
        if isinstance(route, Mount):
            found.extend(_changing_routes(route.routes, prefix + route.path))
        elif isinstance(route, Route) and (route.methods or set()) & UNSAFE:
            found.append((route, prefix))
    return found


def test_every_route_that_may_change_something_writes_its_row(backend: Backend) -> None:
    """A new POST route cannot forget its row: each is asked once, with no form at all
    (a refusal is a row as surely as a success), and must leave exactly one row naming it."""
    desk = serve(backend)
    run = backend.seeded.id("paused-1")
    changing = _changing_routes(desk.client.app.routes)
    names = {route.name for route, _ in changing}
    assert {"approve", "reject", "resume_run", "fork_run", "prune_now", "signout"} <= names
    assert len(changing) >= 11
    for route, prefix in changing:
        params = {name: run for name in route.param_convertors}
        path = prefix + route.url_path_for(route.name, **params)
        method = sorted((route.methods or set()) & UNSAFE)[0]
        before = len(rows(desk))
        response = desk.client.request(method, path, headers=OWNER, follow_redirects=False)
        after = rows(desk)
        assert len(after) == before + 1, f"{method} {path} wrote {len(after) - before} rows"
        row = after[-1]
        expected = audit.SIGNIN_FAILED if route.name == "signin" else audit.action_of(route.name)
        assert (row.action, row.method, row.path) == (expected, method, path)
        # A decision link's page signs in nobody, with a Bearer token or otherwise: the
        # row names whose link it was, and a request with none names no one.
        actor = "" if route.name == "decide_by_link" else "the-owner"
        assert (row.status, row.actor) == (response.status_code, actor)
        assert row.execution_id == (run if "execution_id" in params else None)
    assert check(desk).intact


def test_refusals_are_rows_with_whom_they_refused(backend: Backend) -> None:
    desk = serve(backend)
    viewer = add_user(desk, "Vic Viewer", "viewer")
    cross = desk.client.post("/prune", headers={**OWNER, "Origin": "http://evil.example"})
    looked = desk.client.post("/prune", headers={"Authorization": f"Bearer {viewer}", **JSON})
    nobody = desk.client.post("/prune", headers=JSON)
    assert [r.status_code for r in (cross, looked, nobody)] == [403, 403, 401]
    got = [(r.action, r.actor, r.via, r.status, r.outcome) for r in rows(desk)]
    assert got == [
        ("prune", "", "none", 403, "refused"),
        ("prune", "Vic Viewer", "user", 403, "refused"),
        ("prune", "", "none", 401, "refused"),
    ]


def test_sign_in_failed_sign_in_and_sign_out_are_rows(backend: Backend) -> None:
    desk = serve(backend)
    client = desk.client
    assert client.get("/approvals", follow_redirects=False).status_code == 401
    assert rows(desk) == []  # looking is not a change
    bad_link = client.get("/approvals?token=not-a-token", follow_redirects=False)
    bad_bearer = client.get("/runs.json", headers={"Authorization": "Bearer nope"})
    link = client.get(f"/approvals?token={TEST_TOKEN}", follow_redirects=False)
    assert (bad_link.status_code, bad_bearer.status_code, link.status_code) == (401, 401, 303)
    assert client.get("/approvals").status_code == 200  # the session: no row
    out = client.post("/signout", follow_redirects=False)
    form = client.post("/signin", data={"token": TEST_TOKEN}, follow_redirects=False)
    wrong = client.post("/signin", data={"token": "wrong"}, follow_redirects=False)
    assert (out.status_code, form.status_code, wrong.status_code) == (303, 303, 401)
    got = [(r.action, r.actor, r.via, r.method, r.detail, r.outcome) for r in rows(desk)]
    assert got == [
        ("signin_failed", "", "none", "GET", '{"by":"link"}', "refused"),
        ("signin_failed", "", "none", "GET", '{"by":"bearer"}', "refused"),
        ("signin", "the-owner", "owner", "GET", '{"by":"link"}', "ok"),
        ("signout", "the-owner", "owner", "POST", "{}", "ok"),
        ("signin", "the-owner", "owner", "POST", '{"by":"form"}', "ok"),
        # Sent from the browser signed in just before: the row says whose it was.
        ("signin_failed", "the-owner", "owner", "POST", '{"by":"form"}', "refused"),
    ]
    assert all("token" not in r.path for r in rows(desk))


def test_a_failed_audit_write_is_logged_and_the_action_still_answers(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    desk = serve(backend)
    raw_sql(desk, "DROP TABLE {t}")
    with caplog.at_level(logging.ERROR, logger="localui.audit"):
        response = desk.client.post("/prune", data={"older_than": "3650d"}, headers=OWNER)
    assert response.status_code in (200, 400)
    assert "the audit log could not record POST /prune" in caplog.text


# --- the chain -----------------------------------------------------------------------


def test_verify_names_a_changed_row_and_a_removed_one(backend: Backend) -> None:
    desk = serve(backend)
    log = log_of(desk)
    for i in range(6):
        log.append(event(actor=f"p{i}"))
    assert check(desk).intact and check(desk).count == 6
    raw_sql(desk, "UPDATE {t} SET actor = 'mallory' WHERE id = 2")
    raw_sql(desk, "DELETE FROM {t} WHERE id IN (4, 5)")
    problems = [(p.kind, p.id, p.first, p.last) for p in check(desk).problems]
    assert problems == [("changed", 2, None, None), ("removed", 6, 4, 5)]
    messages = [p.message for p in check(desk).problems]
    assert messages[1] == "rows 4 to 5 removed: row 6 follows row 3"


def test_a_row_rewritten_with_its_hash_redone_breaks_the_next_link(backend: Backend) -> None:
    desk = serve(backend)
    log = log_of(desk)
    entries = [log.append(event(actor=f"p{i}")) for i in range(3)]
    forged = audit.chained(event(actor="mallory"), 2, entries[1].at, entries[0].hash)
    raw_sql(desk, f"UPDATE {{t}} SET actor = 'mallory', hash = '{forged.hash}' WHERE id = 2")
    assert [(p.kind, p.id) for p in check(desk).problems] == [("relinked", 3)]


APPENDER = textwrap.dedent(
    """
    import sys
    from localui.audit import AuditEvent
    from localui.backends import open_audit
    from localui.settings import Settings

    store, app_schema, name, count = sys.argv[1:5]
    log = open_audit(Settings(store=store, pg_app_schema=app_schema), writable=True)
    for i in range(int(count)):
        log.append(AuditEvent(name, "cli", "here", "prune", "CLI", "x", None, "{}", 0, "ok"))
    log.close()
    """
)


def test_appends_from_two_processes_make_one_chain(backend: Backend) -> None:
    desk = serve(backend)
    opened = desk.client.app.state.localui.backend
    store = str(opened.target.sqlite_path or opened.dsn)
    app_schema = getattr(opened, "app_schema", "localui")
    children = [
        subprocess.Popen([sys.executable, "-c", APPENDER, store, app_schema, name, "150"])
        for name in ("one", "two")
    ]
    for child in children:
        assert child.wait(timeout=120) == 0
    checked = check(desk)
    assert checked.intact, [p.message for p in checked.problems]
    assert checked.count == 300
    assert {r.actor for r in rows(desk)} == {"one", "two"}


# --- /audit -------------------------------------------------------------------------


def test_audit_is_for_operators_only(backend: Backend) -> None:
    desk = serve(backend)
    approver = add_user(desk, "Ann Approver", "approver")
    refused = desk.client.get("/audit.json", headers={"Authorization": f"Bearer {approver}"})
    csv = desk.client.get("/audit.csv", headers={"Authorization": f"Bearer {approver}"})
    assert (refused.status_code, csv.status_code) == (403, 403)
    assert desk.client.get("/audit.json", headers=OWNER).status_code == 200
    page = desk.client.get("/approvals", headers={"Authorization": f"Bearer {approver}"}).text
    assert ">Audit</a>" not in page
    assert ">Audit</a>" in desk.client.get("/approvals", headers=BROWSER).text


def test_audit_filters_pages_and_json(backend: Backend) -> None:
    desk = serve(backend, page_size=2)
    log = log_of(desk)
    for actor, action, run in [
        ("ann", "approve", "r1"),
        ("bob", "fork", "r2"),
        ("ann", "fork", "r1"),
        ("ann", "approve", "r3"),
        ("cy", "prune", None),
    ]:
        log.append(event(actor, action, run))

    def ids(url: str) -> tuple[list[int], Any]:
        body = desk.client.get(url, headers=OWNER).json()
        return [e["id"] for e in body["entries"]], body["next"]

    assert ids("/audit.json") == ([5, 4], 4)
    assert ids("/audit.json?after=4") == ([3, 2], 2)
    assert ids("/audit.json?after=2") == ([1], None)
    assert ids("/audit.json?person=ann") == ([4, 3], 3)
    assert ids("/audit.json?person=ann&after=3") == ([1], None)
    assert ids("/audit.json?action=fork") == ([3, 2], None)
    assert ids("/audit.json?run=r1&action=approve") == ([1], None)
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert ids(f"/audit.json?since=1h&until={quote(soon)}")[0] == [5, 4]
    assert ids("/audit.json?until=1h") == ([], None)
    [newest] = desk.client.get("/audit.json?person=cy", headers=OWNER).json()["entries"]
    assert set(newest) == {
        "id", "at", "actor", "via", "address", "action", "method", "path", "execution_id",
        "detail", "status", "outcome", "prev_hash", "hash", "url",
    }  # fmt: skip
    bad = desk.client.get("/audit.json?after=x", headers=OWNER)
    assert bad.status_code == 400 and "after" in bad.json()["error"]["message"]
    html = desk.client.get("/audit?person=ann", headers=BROWSER).text
    assert 'rel="next"' in html and "person=ann" in html


def test_audit_page_escapes_and_csv_neutralises_formulas(backend: Backend) -> None:
    desk = serve(backend)
    log = log_of(desk)
    log.append(event(actor='=HYPERLINK("http://evil.example","x")', run=None))
    log.append(event(actor="<script>alert(1)</script>", run="<b>run</b>"))
    html = desk.client.get("/audit", headers=BROWSER).text
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    csv = desk.client.get("/audit.csv", headers=OWNER)
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
    lines = csv.text.splitlines()
    assert lines[0].startswith("id,at,actor,via,address,action,method,path,execution_id")
    assert len(lines) == 3
    assert "'=HYPERLINK" in csv.text and ",=HYPERLINK" not in csv.text


def test_a_read_only_server_reads_the_log_and_writes_none(backend: Backend) -> None:
    desk = serve(backend, read_only=True)
    assert desk.client.get("/audit.json", headers=OWNER).json()["entries"] == []
    assert desk.client.post("/prune", data={"older_than": "1d"}, headers=OWNER).status_code == 403
    assert desk.client.get("/audit.json", headers=OWNER).json()["entries"] == []


# --- the command line ----------------------------------------------------------------


def store_args(desk: Acting) -> list[str]:
    opened = desk.client.app.state.localui.backend
    if opened.target.sqlite_path is not None:
        return ["--store", str(opened.target.sqlite_path)]
    return ["--store", opened.dsn, "--pg-app-schema", opened.app_schema]


def test_cli_user_changes_are_rows_and_verify_and_export_read_the_chain(
    backend: Backend,
) -> None:
    desk = serve(backend)
    where = store_args(desk)
    assert run_cli("users", "add", "Ann", "--role", "approver", *where).returncode == 0
    assert run_cli("users", "set", "Ann", "--group", "finance", *where).returncode == 0
    assert run_cli("users", "remove", "Nobody", *where).returncode == 2
    assert run_cli("users", "reset", "Ann", *where).returncode == 0
    assert run_cli("users", "remove", "Ann", *where).returncode == 0
    got = [(r.action, r.via, r.method, r.outcome, r.detail) for r in rows(desk)]
    assert got == [
        ("user_add", "cli", "CLI", "ok", '{"groups":[],"role":"approver","user":"Ann"}'),
        ("user_groups", "cli", "CLI", "ok", '{"groups":["finance"],"user":"Ann"}'),
        ("user_remove", "cli", "CLI", "refused", '{"user":"Nobody"}'),
        ("user_reset", "cli", "CLI", "ok", '{"user":"Ann"}'),
        ("user_remove", "cli", "CLI", "ok", '{"user":"Ann"}'),
    ]
    assert all("token" not in r.detail for r in rows(desk))

    verified = run_cli("audit", "verify", *where)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("localui: 5 audit row(s), every hash and link intact")
    assert rows(desk)[-1].hash in verified.stdout
    exported = run_cli("audit", "export", "--format", "jsonl", *where)
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [line["id"] for line in lines] == [1, 2, 3, 4, 5]
    assert lines[2]["hash"] == rows(desk)[2].hash
    as_csv = run_cli("audit", "export", *where).stdout.splitlines()
    assert as_csv[0].startswith("id,at,actor") and len(as_csv) == 6

    raw_sql(desk, "UPDATE {t} SET outcome = 'ok' WHERE id = 3")
    raw_sql(desk, "DELETE FROM {t} WHERE id = 4")
    broken = run_cli("audit", "verify", *where)
    assert broken.returncode == 1
    assert "row 3 was changed" in broken.stderr
    assert "row 4 removed: row 5 follows row 3" in broken.stderr
