"""Picks and cursors are parsed in one place (``localui.views.params``), bounded before
JSON reads them and checked before the store sees them: a pick nested 200,000 deep, a
lone surrogate, a cursor id past 64 bits (and its ``vote-`` and negative forms) or a NUL
is a 400 that says what was wrong, on SQLite and on PostgreSQL.
"""

# The suite's ``backend`` fixture is imported from test_backends, and tests name it
# as a parameter: that is how pytest hands it over, not a redefinition.
# ruff: noqa: F811

from __future__ import annotations

import base64
import json

import pytest
from test_backends import (  # noqa: F401  (fixtures the backend fixture needs)
    Backend,
    _pg_schemas_to_drop,
    backend,
    message,
    pg_seeded_store,
)

JSON = {"Accept": "application/json"}


def cursor(*values: str) -> str:
    raw = json.dumps(list(values)).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


BAD_PICKS = {
    "[" * 200_000: "is longer than",
    '["\\ud800","x"]': "lone surrogate",
    '["x","\\u0000"]': "NUL",
    '["x"]': "is not a",
    '{"a": 1}': "is not a",
}
AT = "2026-01-01T00:00:00+00:00"
BAD_CURSORS = (
    cursor("x", "99999999999999999999"),
    cursor("x", "vote-99999999999999999999"),
    cursor("x", "-99999999999999999999"),
    cursor(AT, "99999999999999999999"),
    cursor(AT, "vote-99999999999999999999"),
    cursor(AT, "-99999999999999999999"),
    cursor(AT, "-1"),
    cursor(AT, "vote-²"),
    cursor("\ud800", "1"),
    cursor(AT + "\x00", "1"),
    base64.urlsafe_b64encode(b"[" * 700).decode(),
)


@pytest.mark.parametrize("route", ["/approvals/bulk", "/runs/bulk-resume"])
def test_a_malformed_pick_is_a_400_that_says_why(backend: Backend, route: str) -> None:
    client = backend.client()
    for pick, why in BAD_PICKS.items():
        done = client.post(
            route,
            data={"verb": "approve", "approver": "ada", "reason": "ok", "pick": pick},
            headers=JSON,
        )
        assert done.status_code == 400, (pick[:20], done.text)
        assert "pick" in message(done) and why in message(done), message(done)


def test_a_decision_cursor_past_64_bits_is_a_400(backend: Backend) -> None:
    client = backend.client()
    for url in ("/decisions.json", "/decisions", "/decisions.csv"):
        for after in BAD_CURSORS:
            got = client.get(f"{url}?after={after}", headers=JSON)
            # The CSV takes no cursor: it streams everything under the filters.
            assert got.status_code == (200 if url.endswith(".csv") else 400), (url, after)
            if got.status_code == 400:
                assert "after" in message(got), message(got)
    for url in ("/runs.json", "/approvals.json", "/attention.json", "/cache.json"):
        for after in BAD_CURSORS[-3:]:
            got = client.get(f"{url}?after={after}", headers=JSON)
            assert got.status_code == 400, (url, after, got.text)
