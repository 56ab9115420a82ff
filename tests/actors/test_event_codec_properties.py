"""Property tests: every domain event survives msgpack and JSON round trips."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionloop.actors.events import (
    CheckpointRecorded,
    InputAccepted,
    LlmCompleted,
    NoticePosted,
    ToolCallSpec,
    ToolFinished,
    Usage,
    decode_event,
    encode_event,
    event_from_builtins,
    event_to_builtins,
)

text = st.text(max_size=50)
ids = st.text(min_size=1, max_size=12)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

events = st.one_of(
    st.builds(InputAccepted, input_id=ids, turn_id=ids, text=text, at=st.integers(0, 2**53)),
    st.builds(LlmCompleted, turn_id=ids, step_id=ids, text=text, reasoning=text,
              tool_calls=st.lists(st.builds(ToolCallSpec, call_id=ids, name=ids, args=json_value), max_size=3),
              usage=st.builds(Usage, prompt_tokens=st.integers(0, 10**9), completion_tokens=st.integers(0, 10**9))),
    st.builds(ToolFinished, turn_id=ids, call_id=ids,
              status=st.sampled_from(["completed", "failed", "denied", "aborted"]),
              output=json_value, exit_code=st.none() | st.integers(-255, 255)),
    st.builds(NoticePosted, notice_id=ids, topic=ids, text=text,
              facts=st.dictionaries(st.text(max_size=8), json_value, max_size=3)),
    st.builds(CheckpointRecorded, turn_id=ids, call_id=ids, path=ids, existed=st.booleans(),
              content=st.none() | st.binary(max_size=64)),
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_msgpack_round_trip_is_lossless(event):
    assert decode_event(encode_event(event)) == event


@settings(max_examples=300, deadline=None)
@given(events)
def test_json_export_round_trip_is_lossless(event):
    assert event_from_builtins(event_to_builtins(event)) == event
