"""sanitize_for_card (seed 004, 审批的显示)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionloop.protocol.sanitize import REMOVED_CODEPOINTS, sanitize_for_card, sanitize_text

BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"


def test_control_characters_are_removed_except_newline_and_tab() -> None:
    assert sanitize_text("a\x00b\x1b[2Jc\rd\x7fe\x85f\tg\nh") == "ab[2Jcdef\tg\nh"


@pytest.mark.parametrize("char", list(BIDI))
def test_bidi_controls_are_removed(char: str) -> None:
    assert sanitize_text(f"rm -rf {char}/tmp/x") == "rm -rf /tmp/x"


@pytest.mark.parametrize("char", list(ZERO_WIDTH))
def test_zero_width_characters_are_removed(char: str) -> None:
    assert sanitize_text(f"c{char}url") == "curl"


def test_ordinary_text_in_any_script_is_kept() -> None:
    text = "部署 ✅ Ünïcödé — עברית 🙂 \t tab\nline"
    assert sanitize_text(text) == text


def test_strings_inside_dicts_lists_and_tuples_are_cleaned_and_others_kept() -> None:
    facts: dict[str, Any] = {"command": "ls\u202e", "args": ["-l\u200b", ("a\x00", 3)], "n": 1.5, "ok": None}
    assert sanitize_for_card(facts) == {"command": "ls", "args": ["-l", ("a", 3)], "n": 1.5, "ok": None}


def test_keys_are_left_alone_so_no_argument_can_hide_another() -> None:
    facts = {"cmd": "a", "c\u200bmd": "b"}
    assert sanitize_for_card(facts) == facts


def test_the_input_is_not_changed() -> None:
    facts = {"command": ["x\u202e"]}
    sanitize_for_card(facts)
    assert facts == {"command": ["x\u202e"]}


def test_very_deep_arguments_do_not_hit_the_recursion_limit() -> None:
    value: Any = "x\u200b"
    for _ in range(5000):
        value = [value]
    cleaned = sanitize_for_card(value)
    for _ in range(5000):
        cleaned = cleaned[0]
    assert cleaned == "x"


def test_nested_tuples_are_rebuilt_as_tuples() -> None:
    assert sanitize_for_card((("a\x00",), ["b", ("c\u202e",)])) == (("a",), ["b", ("c",)])


@given(
    st.recursive(
        st.text() | st.integers() | st.none(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    )
)
def test_no_removed_character_survives_anywhere(value: Any) -> None:
    def strings(v: Any) -> list[str]:
        if isinstance(v, str):
            return [v]
        if isinstance(v, dict):
            return [s for item in v.values() for s in strings(item)]
        if isinstance(v, list | tuple):
            return [s for item in v for s in strings(item)]
        return []

    for text in strings(sanitize_for_card(value)):
        assert not any(ord(c) in REMOVED_CODEPOINTS for c in text)
