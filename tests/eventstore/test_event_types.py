"""The union a store is opened with (``EventTypes``): what it accepts, and that reads go through it."""

from __future__ import annotations

import msgspec
import pytest

from sessionloop.eventstore import EventDecodeError, EventStore, EventTypes, UnknownEvent
from tests.eventstore.union import TEST_EVENTS, Fact, Finished, Noted, Opened, Retitled, Stepped, open_test_store


class Untagged(msgspec.Struct, frozen=True):
    at: int = 0


class OtherField(msgspec.Struct, frozen=True, tag_field="kind", tag="x.other"):
    at: int = 0


class SameTag(Fact, tag="test.opened", frozen=True, kw_only=True):
    pass


def test_a_type_without_a_string_tag_in_the_type_field_is_refused_by_name():
    with pytest.raises(ValueError, match="Untagged needs a string tag"):
        EventTypes([Opened, Untagged])
    with pytest.raises(ValueError, match="OtherField needs a string tag in the field 'type'"):
        EventTypes([OtherField])


def test_two_types_with_one_tag_are_refused_by_name():
    with pytest.raises(ValueError, match="SameTag repeats the tag 'test.opened'"):
        EventTypes([Opened, SameTag])


def test_feed_types_and_upcasters_must_belong_to_the_union():
    with pytest.raises(ValueError, match="feed types not in the union: Stepped"):
        EventTypes([Opened], feed=[Stepped])
    with pytest.raises(ValueError, match="upcasters for tags not in the union: test.gone"):
        EventTypes([Opened], upcasters={"test.gone": dict})
    with pytest.raises(ValueError, match="at least one event type"):
        EventTypes([])


def test_the_feed_indexes_only_the_types_the_union_names(store):
    assert [TEST_EVENTS.in_feed(e) for e in (Stepped(step="s"), Finished(step="s"), Noted())] == [True, True, False]
    store.append("session-a", [Noted(key="n"), Stepped(step="s")], 0, feed="bot")
    assert [type(e.event) for e in store.read_feed("bot")] == [Stepped]


def test_a_store_decodes_through_the_union_it_was_opened_with(store_path):
    with open_test_store(store_path, durability="nosync") as s:
        s.append("session-a", [Opened(name="a"), Stepped(step="s")], 0)
    narrow: EventTypes[Fact] = EventTypes([Opened])
    with EventStore.open(store_path, events=narrow, readonly=True) as s:
        assert s.events is narrow
        first, second = (e.event for e in s.read_stream("session-a"))
    assert first == Opened(name="a")
    assert isinstance(second, UnknownEvent) and second.type == "test.stepped"


def test_an_upcaster_handed_in_rewrites_an_old_shape_on_read_and_leaves_the_bytes(store_path):
    old = msgspec.msgpack.encode({"type": "test.retitled", "at": 3, "name": "old"})  # "name" became "title"

    def rename(payload: dict) -> dict:
        if "name" in payload:
            payload = {**payload, "title": payload["name"]}
            del payload["name"]
        return payload

    upcasting: EventTypes[Fact] = EventTypes([Opened, Retitled], upcasters={"test.retitled": rename})
    with EventStore.open(store_path, events=upcasting, durability="nosync") as s:
        s.append_encoded("session-a", b"session-a", [old], [], 0)
        s.append("session-a", [Retitled(at=4, title="new")], 1)
        read = [e.event for e in s.read_stream("session-a")]
    assert read == [Retitled(at=3, title="old"), Retitled(at=4, title="new")]
    with open_test_store(store_path, readonly=True) as s:  # without the upcaster the old shape is broken
        with pytest.raises(EventDecodeError, match="title"):
            s.read_stream("session-a")


def test_the_json_form_decodes_through_the_union():
    assert TEST_EVENTS.from_builtins({"type": "test.stepped", "step": "s", "at": 1}) == Stepped(at=1, step="s")
    with pytest.raises(EventDecodeError, match="unknown event type 'turn.started'"):
        TEST_EVENTS.from_builtins({"type": "turn.started", "turn_id": "t"})
