"""protocol.nesting: the depth of a JSON text, found without parsing it, equals the parsed value's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionloop.protocol.nesting import nesting_depth, nests_deeper

# Strings full of what could fool a scan: brackets, quotes, runs of backslashes.
tricky = st.text(alphabet='[]{}"\\\\ aé\u2028', max_size=12)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky, inner, max_size=4),
    max_leaves=60,
)


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


@settings(max_examples=600, deadline=None)
@given(values, st.booleans(), st.booleans())
def test_the_depth_of_any_json_text_is_the_depth_of_its_value(value: Any, ascii_only: bool, as_bytes: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert nesting_depth(text.encode() if as_bytes else text) == depth_of(value)


@pytest.mark.parametrize(("text", "depth"), [
    ('"[[["', 0),
    ('["\\\\", [[]]]', 3),          # an escaped backslash ends before the quote
    ('["\\"[[", [[]]]', 3),         # an escaped quote does not end the string
    ('{"a": {"b": [{}]}}', 4),
    ("[]" * 1000, 1),
    ("[" * 600 + "]" * 600 + "[[]]", 600),
    ("[" * 300 + "[]" * 5000 + "]" * 300, 301),
])
def test_the_depth_of_hand_made_texts(text: str, depth: int) -> None:
    assert nesting_depth(text) == depth


def test_nests_deeper_is_strict_about_the_limit() -> None:
    assert not nests_deeper("[" * 40 + "]" * 40, 40)
    assert nests_deeper("[" * 41 + "]" * 41, 40)
    assert not nests_deeper('["' + "[" * 100 + '"]', 40)


@pytest.mark.parametrize("text", ["]]]][[", '"\\', "\ud800[[[", b"\xff\xfe[[", "[" * 5000])
def test_text_that_is_not_json_never_raises(text: str | bytes) -> None:
    assert nesting_depth(text) >= 0
