"""A target URL's secrets stay secret: a webhook's ``user:password@`` is sent as Basic
authorization (never resolved as part of the host), and everywhere a target is shown or
kept (``/notifications``, its errors, ``localui notifications list``, the outbox's
target column, a refusal at start) only its scheme, host and fingerprint appear, never
its password, path or query. Rows an older localui recorded under the path-showing id
are moved to the masked one, announced once all the same. Against a real local
receiver, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from helpers import run_cli
from test_notify import (
    BASE_URL,
    SECRET,
    SEEDED_PAUSES,
    Where,
    running,
    until,
    verified,
    webhook_settings,
    where,
)

from bench.receiver import Receiver
from localui.app import create_app
from localui.cli import main
from localui.notify.targets import webhook_target

__all__ = ["where"]  # the fixture, used by name below

#: What must never be shown: the password, a token in the path, one in the query, the user.
SECRETS = ("s3cr@t", "s3cr%40t", "T0KEN-in-path", "Q5ecret", "hookuser")


def secret_url(receiver: Receiver) -> str:
    return f"http://hookuser:s3cr%40t@127.0.0.1:{receiver.port}/hook/T0KEN-in-path?sig=Q5ecret"


def outbox_rows(where: Where) -> list[dict[str, Any]]:
    sql = "SELECT target, state, last_error FROM {s}localui_notifications ORDER BY id"
    if where.pg is not None:
        return where.pg.app_raw.query(sql.format(s="{s}."))
    from conftest import Raw

    return [dict(r) for r in Raw(Path(where.store)).query(sql.format(s=""))]


def outbox_sql(where: Where, sql: str, params: tuple[Any, ...] = ()) -> int:
    if where.pg is not None:
        return where.pg.app_raw.execute(sql.format(s="{s}.").replace("?", "%s"), params)
    from conftest import Raw

    return Raw(Path(where.store)).execute(sql.format(s=""), params)


def listed(where: Where) -> str:
    done = run_cli("notifications", "list", *cli_store(where))
    assert done.returncode == 0, done.stderr
    return done.stdout


def cli_store(where: Where) -> list[str]:
    if where.pg is None:
        return ["--store", where.store]
    return ["--store", where.pg.dsn, "--pg-app-schema", where.pg.app_schema]


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, (secret, text)


@pytest.mark.anyio
async def test_credentials_are_basic_auth_and_no_secret_is_shown_anywhere(where: Where) -> None:
    with Receiver(down=True) as receiver:
        url = secret_url(receiver)
        target = webhook_target(url)
        settings = where.settings(webhook_settings(receiver, webhooks=(url,)))
        app = create_app(settings)
        async with running(app):
            # Refused a few times first, so there is an error to show.
            await until(receiver, lambda r: len(r) >= 2 * SEEDED_PAUSES)
            receiver.down = False
            await until(receiver, lambda r: sum(1 for x in r if x is not None) >= 3 * SEEDED_PAUSES)
            await anyio.sleep(0.5)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=BASE_URL
            ) as client:
                page = await client.get("/notifications.json")
                html = await client.get("/notifications")
    got = receiver.requests()
    basic = "Basic " + base64.b64encode(b"hookuser:s3cr@t").decode()
    assert {r.headers.get("authorization") for r in got} == {basic}
    assert {r.path for r in got} == {"/hook/T0KEN-in-path?sig=Q5ecret"}
    assert all(verified(r)["type"] for r in got)

    [shown] = page.json()["targets"]
    assert shown["label"] == target.label == f"http://127.0.0.1:{receiver.port}/…#{target.id[-10:]}"
    assert shown["sent"] == SEEDED_PAUSES
    assert shown["last_error"] is None or "answered HTTP 503" in shown["last_error"]
    assert_no_secret(page.text)
    assert_no_secret(html.text)
    rows = outbox_rows(where)
    assert {r["target"] for r in rows} == {target.id}
    assert all(r["state"] == "sent" for r in rows)
    assert any(r["last_error"] for r in rows)  # the 503s were recorded, masked
    assert_no_secret(repr(rows))
    assert_no_secret(listed(where))


def test_a_refused_target_at_start_names_no_secret(
    store_copy: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    base = ["serve", "--store", str(store_copy), "--no-auth", "--webhook-secret-file", str(secret)]
    for bad in (
        "https://hookuser:s3cr%40t@/T0KEN-in-path",
        "http://hookuser:s3cr%40t@127.0.0.1:99999/T0KEN-in-path?sig=Q5ecret",
        "http://hookuser:s3cr%40t@127.0.0.1:port/T0KEN-in-path",
        "ftp://hookuser:s3cr%40t@127.0.0.1/T0KEN-in-path?sig=Q5ecret",
    ):
        assert main([*base, "--webhook", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("localui: --webhook ") and err.count("\n") == 1, err
        assert_no_secret(err)


@pytest.mark.anyio
async def test_rows_recorded_under_the_former_id_are_moved_and_announced_once(
    where: Where,
) -> None:
    with Receiver() as receiver:
        url = secret_url(receiver)
        target = webhook_target(url)
        settings = where.settings(webhook_settings(receiver, webhooks=(url,)))
        async with running(create_app(settings)):
            await until(receiver, lambda r: len(r) >= SEEDED_PAUSES)
            await anyio.sleep(0.5)
        # As a localui before the ids were masked left them: the path in the target
        # column and in an error, one announcement still to send.
        former = target.former_id
        assert "T0KEN-in-path" in former
        quoted = former.rpartition("#")[0]
        outbox_sql(
            where,
            "UPDATE {s}localui_notifications SET target = ?, last_error = ?",
            (former, f"{quoted} answered HTTP 503"),
        )
        outbox_sql(
            where,
            "UPDATE {s}localui_notifications SET state = 'pending', next_at = 0, sent_at = NULL"
            " WHERE id = (SELECT MIN(id) FROM {s}localui_notifications)",
        )
        async with running(create_app(settings)):
            await until(receiver, lambda r: len(r) >= SEEDED_PAUSES + 1)
            await anyio.sleep(1.0)  # sweeps and polls more: nothing is announced anew
        assert len(receiver.requests()) == SEEDED_PAUSES + 1
        rows = outbox_rows(where)
    assert len(rows) == SEEDED_PAUSES
    assert {r["target"] for r in rows} == {target.id} and {r["state"] for r in rows} == {"sent"}
    assert {r["last_error"] for r in rows} == {
        f"{target.label.rpartition('#')[0]} answered HTTP 503"
    }
    assert_no_secret(repr(rows))
