"""Events written by the first release must keep decoding through the domain union
(actors/events.py: a tag is forever, new fields get defaults, old shapes are upcast on read)."""

from __future__ import annotations

import json
import os

import msgspec

from sessionloop.actors.events import DOMAIN_EVENTS, EVENT_TYPES, UnknownEvent, decode_event, event_to_builtins
from tests.fixtures.sample_events import samples

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")


def test_every_event_of_the_first_release_still_decodes_to_the_same_data():
    with open(os.path.join(FIXTURES, "events_v1.msgpack"), "rb") as f:
        payloads = msgspec.msgpack.decode(f.read(), type=list[msgspec.Raw])
    with open(os.path.join(FIXTURES, "events_v1.json")) as f:
        expected = json.load(f)
    decoded = [decode_event(bytes(p), "fixture", i + 1) for i, p in enumerate(payloads)]
    assert not any(isinstance(e, UnknownEvent) for e in decoded)
    assert [json.loads(json.dumps(event_to_builtins(e), sort_keys=True)) for e in decoded] == expected


def test_the_fixture_covers_every_event_type():
    assert {type(e) for e in samples()} == set(EVENT_TYPES)
    assert len(DOMAIN_EVENTS.tags) == len(EVENT_TYPES)


def test_a_payload_without_fields_added_later_decodes_with_their_defaults():
    old = msgspec.msgpack.encode({"type": "turn.started", "turn_id": "t"})  # no at, input_ids, source...
    event = decode_event(old)
    assert event.turn_id == "t" and event.at == 0 and event.input_ids == [] and event.max_steps is None


def test_unknown_fields_in_a_payload_are_ignored():
    newer = msgspec.msgpack.encode({"type": "turn.started", "turn_id": "t", "added_in_v9": [1, 2]})
    assert decode_event(newer).turn_id == "t"
