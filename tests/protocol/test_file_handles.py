"""File handle security (seed 004 文件句柄, RELIABILITY download_handle_security)."""

from __future__ import annotations

import hmac
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionloop.protocol.errors import ProtocolMisuse
from sessionloop.protocol.file_handles import HANDLE_SHAPE, derive_epoch_key, issue, new_epoch_key, resolve

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
ALPHABET = string.ascii_letters + string.digits + "-_"


def test_a_handle_resolves_to_its_file_in_its_session() -> None:
    handle = issue(KEY, "s1", "blob/abc.png")
    assert resolve(KEY, "s1", handle) == "blob/abc.png"


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=200))
def test_handles_have_the_seed_shape_for_any_ids(session_id: str, file_id: str) -> None:
    handle = issue(KEY, session_id, file_id.encode("utf-8", "replace").decode("utf-8"))
    assert HANDLE_SHAPE.fullmatch(handle) and handle.count(".") == 1


def test_a_handle_of_another_session_is_refused() -> None:
    assert resolve(KEY, "s2", issue(KEY, "s1", "f")) is None


def test_a_new_epoch_key_refuses_old_handles() -> None:
    old = issue(derive_epoch_key(KEY, 1), "s1", "f")
    assert resolve(derive_epoch_key(KEY, 1), "s1", old) == "f"
    assert resolve(derive_epoch_key(KEY, 2), "s1", old) is None
    assert resolve(new_epoch_key(), "s1", old) is None


def test_derived_epoch_keys_are_stable_and_distinct() -> None:
    assert derive_epoch_key(KEY, 7) == derive_epoch_key(KEY, 7)
    assert derive_epoch_key(KEY, 7) != derive_epoch_key(KEY, 8) != derive_epoch_key(OTHER_KEY, 8)


def test_every_single_character_change_is_refused() -> None:
    handle = issue(KEY, "s1", "file-1")
    for index, char in enumerate(handle):
        for replacement in ALPHABET + ".":
            if replacement != char:
                altered = handle[:index] + replacement + handle[index + 1 :]
                assert resolve(KEY, "s1", altered) is None, altered


def test_truncated_or_extended_handles_are_refused() -> None:
    handle = issue(KEY, "s1", "file-1")
    for cut in range(len(handle)):
        assert resolve(KEY, "s1", handle[:cut]) is None
    for extra in ("A", "-", "=", ".x", " "):
        assert resolve(KEY, "s1", handle + extra) is None


def test_swapping_payload_and_mac_between_handles_is_refused() -> None:
    a, b = issue(KEY, "s1", "a"), issue(KEY, "s1", "b")
    assert resolve(KEY, "s1", a.split(".")[0] + "." + b.split(".")[1]) is None


def test_a_handle_signed_with_another_key_is_refused() -> None:
    assert resolve(KEY, "s1", issue(OTHER_KEY, "s1", "f")) is None


@pytest.mark.parametrize("bad", ["", ".", "a.", ".b", "a.b.c", "a b.c", "a\n.b", "ä.b", "x" * 10_000 + ".y"])
def test_malformed_strings_are_refused(bad: str) -> None:
    assert resolve(KEY, "s1", bad) is None


@settings(max_examples=3000, deadline=None)  # RELIABILITY download_handle_security: thousands
@given(
    st.text(alphabet=ALPHABET, min_size=1, max_size=60), st.text(alphabet=ALPHABET, min_size=1, max_size=60)
)
def test_forged_handles_are_refused(payload: str, mac: str) -> None:
    assert resolve(KEY, "s1", f"{payload}.{mac}") is None


def test_the_mac_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: str, b: str) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    resolve(KEY, "s1", issue(KEY, "s1", "f"))
    assert len(calls) == 1


def test_a_short_key_is_our_misuse() -> None:
    with pytest.raises(ProtocolMisuse):
        issue(b"short", "s1", "f")
    with pytest.raises(ProtocolMisuse):
        resolve(b"", "s1", "a.b")
