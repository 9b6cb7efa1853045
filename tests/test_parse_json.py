"""The store's JSON columns as ``localui.records.parse_json`` reads them: as Python's
json reads them (NaN and Infinity as the SDK writes them, integers of any size), with
damage and deep nesting as :class:`Unreadable` values rather than errors."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localui.records import MAX_JSON_DEPTH, Unreadable, parse_json


@pytest.mark.parametrize(
    "text",
    [
        '{"order_id": "A-1001", "amount": 40.0}',
        '{"big": 123456789012345678901234567890}',
        '{"low": -9223372036854775809, "edge": 9223372036854775807}',
        "[0.12345678901234567890123, 1e-7, -0.0]",
        '{"a": 1, "a": 2}',
        '"\\ud800 a lone surrogate"',
        '{"emoji": "\\ud83d\\ude00", "text": "café"}',
    ],
)
def test_a_column_reads_as_pythons_json_reads_it(text: str) -> None:
    value = parse_json(text, {})
    assert value == json.loads(text)
    assert json.dumps(value) == json.dumps(json.loads(text))


def test_nan_and_infinity_as_the_sdk_writes_them_read_as_numbers() -> None:
    value = parse_json('{"x": NaN, "y": Infinity, "z": -Infinity, "w": 1e400}', {})
    assert math.isnan(value["x"]) and value["y"] == math.inf and value["z"] == -math.inf
    assert value["w"] == math.inf


@pytest.mark.parametrize("text", ['{"a":', "[1, 2,]", "{'single': 1}", "nul"])
def test_damage_reads_as_unreadable_with_pythons_words(text: str) -> None:
    value = parse_json(text, {})
    assert isinstance(value, Unreadable)
    with pytest.raises(json.JSONDecodeError) as raised:
        json.loads(text)
    assert value.error == str(raised.value)


def test_deep_nesting_reads_as_unreadable() -> None:
    depth = MAX_JSON_DEPTH + 5
    value = parse_json("[" * depth + "]" * depth, {})
    assert isinstance(value, Unreadable) and "nested deeper" in value.error


def test_nothing_stored_reads_as_the_default() -> None:
    assert parse_json(None, {"d": 1}) == {"d": 1}
    assert parse_json("", []) == []


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(min_value=-(10**30), max_value=10**30)
        | st.floats(allow_nan=False)
        | st.text(),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_any_json_value_reads_back_as_it_was_written(value: object) -> None:
    text = json.dumps(value)
    assert json.dumps(parse_json(text, {})) == json.dumps(json.loads(text))
