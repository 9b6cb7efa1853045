"""Groups, as an approval policy's ``group:NAME`` reads them: ``localui users add --group``,
``users list``, ``users set``, on both backends, and a users table an older localui made
(no groups column) read as it is and migrated on the next write."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_auth_cli import served_store, users_cli  # noqa: F401 - the fixture, shared
from test_cli import assert_one_line_error

if TYPE_CHECKING:
    from conftest import PgStore


def listed(store: list[str], cwd: Path) -> list[list[str]]:
    done = users_cli(store, "list", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return [line.split("\t")[:3] for line in done.stdout.splitlines()]


def test_users_have_groups_that_add_sets_and_list_shows(
    served_store: list[str],  # noqa: F811
    tmp_path: Path,
) -> None:
    added = users_cli(
        served_store,
        *("add", "ada", "--role", "approver", "--group", "finance", "--group", "audit"),
        cwd=tmp_path,
    )
    assert added.returncode == 0, added.stderr
    assert "ada (approver, groups finance, audit) signs in at " in added.stdout
    plain = users_cli(served_store, "add", "bob", "--role", "viewer", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert listed(served_store, tmp_path) == [
        ["ada", "approver", "groups finance,audit"],
        ["bob", "viewer", "groups -"],
    ]

    changed = users_cli(served_store, "set", "bob", "--group", "finance", cwd=tmp_path)
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout.strip() == "localui: bob is viewer, in groups: finance"
    cleared = users_cli(served_store, "set", "ada", cwd=tmp_path)
    assert cleared.stdout.strip() == "localui: ada is approver, in groups: none"
    assert listed(served_store, tmp_path) == [
        ["ada", "approver", "groups -"],
        ["bob", "viewer", "groups finance"],
    ]
    # A role changed keeps the groups; with --group too, both change.
    promoted = users_cli(served_store, "set", "bob", "--role", "operator", cwd=tmp_path)
    assert promoted.stdout.strip() == "localui: bob is operator, in groups: finance"
    both = users_cli(served_store, "set", "ada", "--role", "viewer", "--group", "ops", cwd=tmp_path)
    assert both.stdout.strip() == "localui: ada is viewer, in groups: ops"
    missing = users_cli(served_store, "set", "nobody", "--role", "viewer", cwd=tmp_path)
    assert missing.returncode == 2 and "no user 'nobody'" in missing.stderr

    assert_one_line_error(
        users_cli(served_store, "set", "nobody", "--group", "x", cwd=tmp_path), "no user 'nobody'"
    )
    for bad in ("a,b", "two words", ""):
        assert_one_line_error(
            users_cli(served_store, "set", "bob", "--group", bad, cwd=tmp_path), "group"
        )
    assert listed(served_store, tmp_path)[1] == ["bob", "operator", "groups finance"]


OLD_USERS = """CREATE TABLE {table} (
    name         TEXT PRIMARY KEY,
    role         TEXT NOT NULL,
    token_sha256 TEXT NOT NULL UNIQUE,
    created_at   {time} NOT NULL
)"""


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_users_table_without_groups_is_read_then_migrated(
    kind: str, store_copy: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        import sqlite3

        conn = sqlite3.connect(store_copy)
        with conn:
            conn.execute(OLD_USERS.format(table="localui_users", time="TEXT"))
            conn.execute(
                "INSERT INTO localui_users VALUES ('old', 'approver', 'abc', '2026-01-01')"
            )
        conn.close()
        store = ["--store", str(store_copy)]
    else:
        pg: PgStore = request.getfixturevalue("pg_store")
        pg.app_raw.execute("CREATE SCHEMA {s}")
        pg.app_raw.execute(OLD_USERS.format(table="{s}.localui_users", time="TIMESTAMPTZ"))
        pg.app_raw.execute("INSERT INTO {s}.localui_users VALUES ('old', 'approver', 'abc', now())")
        store = ["--store", pg.dsn, "--pg-app-schema", pg.app_schema]

    # A reader (the server's kind of directory) sees the person, in no group.
    assert listed(store, tmp_path) == [["old", "approver", "groups -"]]
    # The next write adds the column, and the groups stick.
    done = users_cli(store, "set", "old", "--group", "finance", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert listed(store, tmp_path) == [["old", "approver", "groups finance"]]
