"""Numbers, ages and times from URLs and forms: the inputs that once answered 500
are a 400 whose message says which forms are accepted."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pytest

from localui.views.params import MAX_AGE, parse_age, parse_count, parse_instant

if TYPE_CHECKING:
    from conftest import Seeded
    from starlette.testclient import TestClient

JSON = {"Accept": "application/json"}


def error_of(response: object) -> str:
    from httpx import Response

    assert isinstance(response, Response)
    assert response.status_code == 400, response.text
    message: str = response.json()["error"]["message"]
    return message


@pytest.mark.parametrize("value", ["²", "１２", "-1", "1e3", "1" * 5000, " ", "12x"])
def test_from_accepts_ascii_row_numbers_only(
    client: TestClient, seeded: Seeded, value: str
) -> None:
    run = seeded.id("completed")
    message = error_of(client.get(f"/runs/{run}.json", params={"from": value}))
    assert "give a whole number from 0 to 1,000,000,000" in message
    assert client.get(f"/runs/{run}", params={"from": value}).status_code == 400


def test_from_still_takes_a_row_number(client: TestClient, seeded: Seeded) -> None:
    assert client.get(f"/runs/{seeded.id('completed')}.json?from=0").status_code == 200


@pytest.mark.parametrize("path", ["/prune.json", "/cache.json", "/prune", "/cache"])
@pytest.mark.parametrize("value", ["²d", "1" * 5000, "1" * 5000 + "d", "7", "d", "7y", "٣d"])
def test_older_than_accepts_ascii_ages_only(client: TestClient, path: str, value: str) -> None:
    response = client.get(path, params={"older_than": value}, headers=JSON)
    assert "like 90s, 30m, 12h, 7d or 2w" in error_of(response)


def test_an_age_past_ten_years_is_refused(client: TestClient) -> None:
    assert client.get("/prune.json", params={"older_than": "520w"}).status_code == 200
    message = error_of(client.get("/prune.json", params={"older_than": "999999999d"}))
    assert "too large" in message


@pytest.mark.parametrize(
    "cutoff",
    ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2026-01-01T00:00:00", "soon"],
)
def test_a_cutoff_out_of_range_or_without_zone_is_a_400(client: TestClient, cutoff: str) -> None:
    before = client.get("/prune.json", params={"older_than": "0s"}).json()["would_delete"]
    response = client.post(
        "/prune", data={"older_than": "7d", "cutoff": cutoff, "prune_token": "x"}, headers=JSON
    )
    assert "ISO 8601 time with its zone" in error_of(response)
    assert client.get("/prune.json", params={"older_than": "0s"}).json()["would_delete"] == before


def test_the_parsers_themselves() -> None:
    assert parse_count("n", "42", maximum=100) == 42
    assert parse_age("2w").days == 14
    assert parse_age("520w") <= MAX_AGE
    yesterday = datetime.now(timezone(timedelta(hours=2))) - timedelta(days=1)
    assert parse_instant("t", yesterday.isoformat()) == yesterday
