"""fastjson drives the C scanner/encoder directly; it must agree with :mod:`json`."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oci_gpu_hook import fastjson


def _reject(name: str) -> Any:
    raise ValueError(name)


def strict_json_loads(text: str) -> Any:
    return json.loads(text, parse_constant=_reject)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**300), max_value=10**300),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.text(alphabet=st.characters(codec="utf-8")),
    st.sampled_from(["", "é", "日本語", "🎉", "\x00", "\u2028", '"\\/', "\ud800"]),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children), st.dictionaries(st.text(), children)),
    max_leaves=30,
)


def same(a: Any, b: Any) -> bool:
    """Equality that also tells 1 from 1.0 and True from 1."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_dumps_matches_json(value: Any) -> None:
    assert fastjson.dumps(value) == json.dumps(value, separators=(",", ":"), allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans(), st.sampled_from([None, 1, 2]))
def test_loads_matches_json(value: Any, ensure_ascii: bool, indent: int | None) -> None:
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)
    assert same(fastjson.loads(text), json.loads(text))


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_round_trip(value: Any) -> None:
    assert same(fastjson.loads(fastjson.dumps(value)), value)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet='{}[]":,0123456789.eE+-tfrueanlsNIinfy \t\n\r\\u', max_size=25)))
def test_accepts_exactly_what_json_accepts(text: str) -> None:
    try:
        expected = strict_json_loads(text)
    except ValueError:
        with pytest.raises(ValueError):
            fastjson.loads(text)
        return
    assert same(fastjson.loads(text), expected)


def test_dumps_is_ascii_and_compact() -> None:
    text = fastjson.dumps({"a": [1, 2.5, None, True], "é": "日"})
    assert text == '{"a":[1,2.5,null,true],"\\u00e9":"\\u65e5"}'
    assert text.isascii()


def test_dumps_keeps_key_order() -> None:
    assert fastjson.dumps({"b": 1, "a": 2}) == '{"b":1,"a":2}'


def test_big_ints() -> None:
    big = 2**200 + 1
    assert fastjson.loads(str(big)) == big
    assert fastjson.dumps([big, -big]) == f"[{big},{-big}]"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), [1, {"x": float("nan")}]])
def test_dumps_rejects_non_finite(value: Any) -> None:
    with pytest.raises(ValueError):
        fastjson.dumps(value)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "[NaN]", '{"a": Infinity}', "[1, -Infinity]"])
def test_loads_rejects_non_finite_constants(text: str) -> None:
    with pytest.raises(ValueError):
        fastjson.loads(text)


@pytest.mark.parametrize("text", ["1 2", "{} {}", "[]]", '{"a": 1}x', "null,", "true false"])
def test_loads_rejects_trailing_data(text: str) -> None:
    with pytest.raises(ValueError, match="extra data"):
        fastjson.loads(text)


@pytest.mark.parametrize("text", ["", " ", "\n\t\r "])
def test_loads_rejects_empty_input(text: str) -> None:
    with pytest.raises(ValueError):
        fastjson.loads(text)


@pytest.mark.parametrize("text", ["{", "[1,", '"abc', "tru", '{"a" 1}', "{'a': 1}", '"\\x"', '"\x01"', "01", "+1"])
def test_loads_rejects_invalid_json(text: str) -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        fastjson.loads(text)


def test_loads_allows_surrounding_json_whitespace() -> None:
    assert fastjson.loads(' \n\t{"a": [1]}\r\n ') == {"a": [1]}


def test_loads_does_not_share_state_between_calls() -> None:
    first = fastjson.loads('{"key": 1}')
    second = fastjson.loads('{"key": 2}')
    assert first == {"key": 1}
    assert second == {"key": 2}
