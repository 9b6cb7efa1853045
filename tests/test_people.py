"""A person's own address (``localui users add|set --notify URL``, ``--no-notify``), on
both backends, through the real command line: checked as ``--notify`` targets are,
never printed in full, and a users table an older localui made (no address or away
columns) read as it is and brought up to date on the next write."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import sign_in_settings
from test_auth_cli import served_store, users_cli  # noqa: F401 - the fixture, shared
from test_cli import assert_one_line_error

from localui.backends.users import COLUMN_NAMES, token_hash
from localui.notify.targets import CHAT, fingerprint

if TYPE_CHECKING:
    from conftest import PgStore

#: The people of a users table an older localui made, with their tokens' hashes.
OLD_TOKEN = "token-of-old-0123456789abcdef"
PEOPLE = (("old", token_hash(OLD_TOKEN)), ("bob", token_hash("token-of-bob-0123456789abcdef")))
OLD_SIGNS_IN = {"Authorization": f"Bearer {OLD_TOKEN}"}

#: An address whose path and password are secrets: no output may show them.
SECRET_URL = "json://mailer:hunter2@127.0.0.1:9/secret-path-1234"
MAIL = "mailto://ada:pw-5678@example.com"


def rows(store: list[str], cwd: Path) -> dict[str, list[str]]:
    done = users_cli(store, "list", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return {line.split("\t")[0]: line.split("\t") for line in done.stdout.splitlines()}


def told_at(url: str) -> str:
    return f"told at json://127.0.0.1:9/…#{fingerprint(CHAT, url)}"


def test_an_address_is_set_changed_cleared_and_never_shown_in_full(
    served_store: list[str],  # noqa: F811
    tmp_path: Path,
) -> None:
    added = users_cli(
        served_store,
        *("add", "ada", "--role", "approver", "--group", "finance", "--notify", SECRET_URL),
        cwd=tmp_path,
    )
    assert added.returncode == 0, added.stderr
    assert told_at(SECRET_URL) in added.stdout
    assert "hunter2" not in added.stdout + added.stderr
    assert "secret-path" not in added.stdout + added.stderr
    listed = rows(served_store, tmp_path)
    assert listed["ada"][3] == told_at(SECRET_URL)
    assert "hunter2" not in "\t".join(listed["ada"])

    # Changed: the groups stay (only --notify was given).
    changed = users_cli(served_store, "set", "ada", "--notify", MAIL, cwd=tmp_path)
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout.startswith("localui: ada is approver, in groups: finance, told at ")
    assert "pw-5678" not in changed.stdout
    assert rows(served_store, tmp_path)["ada"][3] == (
        f"told at mailto://example.com/…#{fingerprint(CHAT, MAIL)}"
    )

    # Refused when malformed, in one line, and nothing changes.
    for bad in ("nonsense", "notaservice://x", "mailto://"):
        assert_one_line_error(
            users_cli(served_store, "set", "ada", "--notify", bad, cwd=tmp_path), "--notify"
        )
    refused_add = users_cli(
        served_store, "add", "bob", "--role", "approver", "--notify", "nope://", cwd=tmp_path
    )
    assert_one_line_error(refused_add, "--notify")
    assert "bob" not in rows(served_store, tmp_path)
    assert rows(served_store, tmp_path)["ada"][3].startswith("told at mailto://example.com/…#")

    cleared = users_cli(served_store, "set", "ada", "--no-notify", cwd=tmp_path)
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.strip() == (
        "localui: ada is approver, in groups: finance, with no address of their own"
    )
    assert rows(served_store, tmp_path)["ada"][3] == "told at -"
    both = users_cli(served_store, "set", "ada", "--notify", MAIL, "--no-notify", cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with" in both.stderr


OLD_USERS = """CREATE TABLE {table} (
    name         TEXT PRIMARY KEY,
    role         TEXT NOT NULL,
    token_sha256 TEXT NOT NULL UNIQUE,
    created_at   {time} NOT NULL,
    user_groups  TEXT NOT NULL DEFAULT ''
)"""


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_users_table_without_addresses_is_read_then_migrated(
    kind: str, store_copy: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A table of the localui before addresses (it has groups): served, read with no
    address and nobody away, and given the columns by the next write; a reader (and a
    server) opened before the write sees what the write set without being opened again."""
    from localui.backends import open_users
    from localui.settings import Settings

    if kind == "sqlite":
        import sqlite3

        conn = sqlite3.connect(store_copy)
        with conn:
            conn.execute(OLD_USERS.format(table="localui_users", time="TEXT"))
            for name, digest in PEOPLE:
                conn.execute(
                    "INSERT INTO localui_users VALUES (?, 'approver', ?, '2026-01-01', 'ops')",
                    (name, digest),
                )
        conn.close()
        store = ["--store", str(store_copy)]
        settings = Settings(store=str(store_copy))
        client = request.getfixturevalue("make_acting_client")(
            store_copy, agents=[], sign_in=sign_in_settings()
        )

        def columns() -> set[str]:
            conn = sqlite3.connect(store_copy)
            try:
                return {r[1] for r in conn.execute("PRAGMA table_info(localui_users)")}
            finally:
                conn.close()
    else:
        pg: PgStore = request.getfixturevalue("pg_store")
        pg.app_raw.execute("CREATE SCHEMA {s}")
        pg.app_raw.execute(OLD_USERS.format(table="{s}.localui_users", time="TIMESTAMPTZ"))
        for name, digest in PEOPLE:
            pg.app_raw.execute(
                "INSERT INTO {s}.localui_users VALUES (%s, 'approver', %s, now(), 'ops')",
                (name, digest),
            )
        store = ["--store", pg.dsn, "--pg-app-schema", pg.app_schema]
        settings = Settings(store=pg.dsn, pg_app_schema=pg.app_schema)
        client = request.getfixturevalue("make_pg_client")(
            pg, agents=[], sign_in=sign_in_settings()
        )

        def columns() -> set[str]:
            found = pg.app_raw.query(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = '{s}' AND table_name = 'localui_users'"
            )
            return {str(r["column_name"]) for r in found}

    assert "address" not in columns()
    # Served as it is: the person signs in, and is offered "I am away".
    page = client.get("/approvals", headers=OLD_SIGNS_IN)
    assert page.status_code == 200, page.text
    assert "old · approver" in page.text and "I am away…" in page.text
    reader = open_users(settings, writable=False)
    try:
        [_, old] = reader.list_users()  # by name: bob, old
        assert (old.name, old.groups, old.address, old.away_to, old.away_until) == (
            "old",
            ("ops",),
            "",
            "",
            "",
        )
        assert rows(store, tmp_path)["old"][2:4] == ["groups ops", "told at -"]

        done = users_cli(store, "set", "old", "--notify", MAIL, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert columns() >= set(COLUMN_NAMES)
        # The reader opened on the old table sees the new column's value at once.
        again = reader.by_name("old")
        assert again is not None and again.address == MAIL and again.groups == ("ops",)
    finally:
        reader.close()
    # And the server that started on the old table sees an away set since.
    away = users_cli(store, "away", "old", "--to", "bob", cwd=tmp_path)
    assert away.returncode == 0, away.stderr
    deadline = time.monotonic() + 3.5
    while "bob decides for you" not in client.get("/approvals", headers=OLD_SIGNS_IN).text:
        assert time.monotonic() < deadline, "the away did not reach the server within 2 s"
        time.sleep(0.1)
