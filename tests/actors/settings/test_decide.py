"""The decisions of setting writes (``actors/settings/decide.py``), pure: what each write records,
and what it refuses, naming the field and what is wrong.

Every decided event is round-tripped through the store's codec (what is decided is what a reload
reads); a session's events are also folded into a session's state, which then holds the value.
"""

from __future__ import annotations

from typing import Any

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.events import decode_event, encode_event
from sessionloop.actors.session.state import evolve, new_state
from sessionloop.actors.settings.context import PlaceFacts
from sessionloop.actors.settings.decide import (
    InvalidSetting,
    check_layer_write,
    check_value,
    decide_place_registration,
    decide_place_setting,
    decide_session_setting,
    same_value,
)
from sessionloop.actors.settings.fields import MISSING, SettingField

NOW = 1_700_000_000_000

STEPS = SettingField("agent", "maxSteps", "integer", "Max steps", minimum=0, maximum=100)
MODE = SettingField("tools", "permissionMode", "enum", "Permission mode", options=("ask", "acceptCalls", "deny"))
PROMPT = SettingField("agent", "systemPrompt", "text", "System prompt", max_length=10)
RATIO = SettingField("agent", "ratio", "number", "Ratio")
YIELD = SettingField("tools", "execYieldSeconds", "number", "Exec yield", minimum=0, maximum=3600,
                     applies_to=("owner", "task"), narrowest="place")
REPLY = SettingField("im", "replyInGroups", "boolean", "Reply in groups", applies_to=("room",))
MODEL = SettingField("llm", "model", "llm-ref", "Model",
                     check=lambda value: None if value == "mock/m1" else f"no configured model {value!r}")

WORKSPACE = PlaceFacts(key="workspace:/src/app", kind="workspace", name="app")
WINDOW = PlaceFacts(key="onebot:group:42", kind="window", name="Team", platform="onebot", type="group")


def stored(events: list[E.Event]) -> list[E.Event]:
    """The events as a reload reads them; they must be what was decided."""
    decoded = [decode_event(encode_event(e)) for e in events]
    assert decoded == events
    return decoded


def session_write(f: SettingField | None, value: Any, current: Any = MISSING, kind: str = "owner",
                  plugin: str | None = None, key: str | None = None) -> list[E.Event]:
    """Decide a write to an owner session's own layer; check the events round-trip and fold."""
    plugin = plugin if plugin is not None else f.plugin if f is not None else "im"
    key = key if key is not None else f.key if f is not None else "nope"
    events = stored(decide_session_setting(f, plugin, key, kind, current, value, NOW))
    state = new_state("s1")
    if current is not MISSING:
        state.settings[f"{plugin}/{key}"] = current
    for event in events:
        evolve(state, event)
    assert state.settings.get(f"{plugin}/{key}", MISSING) == (current if not events else
                                                               MISSING if value is None else value)
    return events


def refusal(call: Any) -> str:
    with pytest.raises(InvalidSetting) as raised:
        call()
    return str(raised.value)


# --- a session's own layer ------------------------------------------------------------------------


def test_a_session_write_records_the_value_it_sets() -> None:
    assert session_write(STEPS, 5) == [
        E.SessionSettingChanged(at=NOW, plugin="agent", key="maxSteps", value=5)]
    assert session_write(MODE, "deny", current="ask") == [
        E.SessionSettingChanged(at=NOW, plugin="tools", key="permissionMode", value="deny")]


def test_a_session_delete_records_a_deletion_only_when_a_value_is_there() -> None:
    assert session_write(STEPS, None, current=5) == [
        E.SessionSettingChanged(at=NOW, plugin="agent", key="maxSteps", deleted=True)]
    assert session_write(STEPS, None) == []


def test_writing_the_value_already_there_records_nothing_but_another_type_is_a_change() -> None:
    assert session_write(STEPS, 5, current=5) == []
    assert session_write(RATIO, 1.0, current=1) == [
        E.SessionSettingChanged(at=NOW, plugin="agent", key="ratio", value=1.0)]


def test_a_session_write_to_an_unknown_field_is_refused_naming_it() -> None:
    message = refusal(lambda: session_write(None, True, plugin="im", key="nope"))
    assert "params.key" in message and "im/nope" in message
    # a delete of an unknown field is refused too: there is nothing it could delete
    assert "im/nope" in refusal(lambda: session_write(None, None, plugin="im", key="nope"))


def test_a_session_value_for_a_field_set_on_places_at_the_narrowest_is_refused() -> None:
    message = refusal(lambda: session_write(YIELD, 5))
    assert "tools/execYieldSeconds" in message and "place" in message


def test_a_session_value_for_a_field_of_other_session_kinds_is_refused_naming_the_kind() -> None:
    message = refusal(lambda: session_write(REPLY, True, kind="owner"))
    assert "im/replyInGroups" in message and "owner" in message
    assert session_write(REPLY, True, kind="room") == [
        E.SessionSettingChanged(at=NOW, plugin="im", key="replyInGroups", value=True)]


def test_a_delete_skips_the_scope_rules() -> None:
    assert session_write(YIELD, None, current=5) == [
        E.SessionSettingChanged(at=NOW, plugin="tools", key="execYieldSeconds", deleted=True)]
    assert session_write(REPLY, None, current=True, kind="owner") == [
        E.SessionSettingChanged(at=NOW, plugin="im", key="replyInGroups", deleted=True)]


@pytest.mark.parametrize(("f", "value", "why"), [
    (STEPS, "5", "expected an integer"),
    (STEPS, True, "expected an integer"),  # a boolean is not a number here
    (STEPS, 2.5, "expected an integer"),
    (STEPS, -1, "at least 0"),
    (STEPS, 101, "at most 100"),
    (RATIO, float("inf"), "expected a number"),
    (RATIO, 2**63, "expected a number from -2**63 to 2**63-1"),
    (MODE, "always", "expected one of ask, acceptCalls, deny"),
    (PROMPT, 7, "expected a string"),
    (PROMPT, "x" * 11, "at most 10 characters"),
    (MODEL, "  ", "expected a model id"),
    (MODEL, "mock/none", "no configured model 'mock/none'"),
])
def test_a_value_that_does_not_fit_the_field_is_refused_naming_the_field_and_why(
        f: SettingField, value: Any, why: str) -> None:
    message = refusal(lambda: session_write(f, value))
    assert message.startswith("params.value: ")
    assert f"{f.plugin}/{f.key}: {why}" in message


def test_check_value_accepts_what_fits_and_asks_the_field_s_own_check() -> None:
    assert check_value(STEPS, 0) is None and check_value(STEPS, 100) is None
    assert check_value(RATIO, 0.5) is None
    assert check_value(MODEL, "mock/m1") is None
    assert check_value(MODEL, "mock/m2") == "llm/model: no configured model 'mock/m2'"
    assert str(check_value(SettingField("x", "y", "colour", "Colour"), "red")) == "x/y: unknown field type 'colour'"


def test_same_value_is_a_delete_of_nothing_or_the_same_value_of_the_same_type() -> None:
    assert same_value(MISSING, None)
    assert not same_value(5, None)
    assert same_value("ask", "ask")
    assert not same_value(MISSING, "ask")
    assert not same_value(1, True) and not same_value(1, 1.0)


# --- layers of the configuration document -------------------------------------------------------


def test_a_layer_write_returns_the_field_it_is_allowed_for() -> None:
    assert check_layer_write(STEPS, "agent", "maxSteps", None, 5) is STEPS
    assert check_layer_write(REPLY, "im", "replyInGroups", frozenset({"room", "task"}), True) is REPLY


def test_a_layer_write_refuses_an_unknown_field_a_field_not_for_the_layer_and_a_bad_value() -> None:
    assert "im/nope" in refusal(lambda: check_layer_write(None, "im", "nope", None, True))
    message = refusal(lambda: check_layer_write(YIELD, "tools", "execYieldSeconds", frozenset({"room"}), 5))
    assert "tools/execYieldSeconds does not apply to this layer" in message
    assert "agent/maxSteps: at most 100" in refusal(lambda: check_layer_write(STEPS, "agent", "maxSteps", None, 500))
    # a delete skips the scope and value rules
    assert check_layer_write(YIELD, "tools", "execYieldSeconds", frozenset({"room"}), None) is YIELD


# --- places ---------------------------------------------------------------------------------------


def test_an_unrecorded_place_is_registered_and_a_recorded_one_is_not() -> None:
    assert stored(decide_place_registration(WINDOW, False, NOW)) == [
        E.PlaceRegistered(at=NOW, key="onebot:group:42", kind="window", name="Team")]
    assert decide_place_registration(WINDOW, True, NOW) == []


def test_the_first_value_on_an_unrecorded_place_registers_it_in_the_same_append() -> None:
    events = stored(decide_place_setting(YIELD, "tools", "execYieldSeconds", WORKSPACE, False, MISSING, 30, NOW))
    assert events == [E.PlaceRegistered(at=NOW, key="workspace:/src/app", kind="workspace", name="app"),
                      E.PlaceSettingChanged(at=NOW, plugin="tools", key="execYieldSeconds", value=30)]


def test_a_value_on_a_recorded_place_records_only_the_change_and_a_delete_records_a_deletion() -> None:
    assert stored(decide_place_setting(YIELD, "tools", "execYieldSeconds", WORKSPACE, True, 30, 60, NOW)) == [
        E.PlaceSettingChanged(at=NOW, plugin="tools", key="execYieldSeconds", value=60)]
    assert stored(decide_place_setting(YIELD, "tools", "execYieldSeconds", WORKSPACE, True, 60, None, NOW)) == [
        E.PlaceSettingChanged(at=NOW, plugin="tools", key="execYieldSeconds", deleted=True)]


def test_a_place_write_that_changes_nothing_records_nothing_not_even_the_registration() -> None:
    assert decide_place_setting(YIELD, "tools", "execYieldSeconds", WORKSPACE, True, 30, 30, NOW) == []
    assert decide_place_setting(YIELD, "tools", "execYieldSeconds", WORKSPACE, False, MISSING, None, NOW) == []


def test_a_place_write_refuses_a_field_for_other_sessions_than_the_place_s() -> None:
    # a workspace place's rows are for owner sessions, a window place's for rooms
    message = refusal(lambda: decide_place_setting(REPLY, "im", "replyInGroups", WORKSPACE, True, MISSING, True, NOW))
    assert "params.key" in message and "im/replyInGroups does not apply to this layer" in message
    assert "tools/execYieldSeconds" in refusal(
        lambda: decide_place_setting(YIELD, "tools", "execYieldSeconds", WINDOW, True, MISSING, 5, NOW))
    assert stored(decide_place_setting(REPLY, "im", "replyInGroups", WINDOW, True, MISSING, True, NOW)) == [
        E.PlaceSettingChanged(at=NOW, plugin="im", key="replyInGroups", value=True)]


def test_a_place_write_refuses_an_unknown_field_and_a_value_that_does_not_fit() -> None:
    assert "im/nope" in refusal(lambda: decide_place_setting(None, "im", "nope", WINDOW, True, MISSING, True, NOW))
    message = refusal(lambda: decide_place_setting(YIELD, "tools", "execYieldSeconds", WORKSPACE, False, MISSING,
                                                   -1, NOW))
    assert message == "params.value: tools/execYieldSeconds: at least 0"
