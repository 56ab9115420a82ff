"""What keeps a long session's turn from growing with its history: a model request views the
history instead of copying it (``effects.HistoryView``), and a snapshot encodes only the history's
messages added since the last one (``state.EncodedHistory``)."""

from __future__ import annotations

from sessionloop.actors import events as E
from sessionloop.actors.session.effects import HistoryView
from sessionloop.actors.session.state import (
    HISTORY_CHUNK,
    EncodedHistory,
    add_message,
    decode_state,
    encode_state,
    new_state,
    set_messages,
)


def message(i: int, role: str = "user") -> E.Message:
    return E.Message(role=role, content=f"m{i}", turn_id=f"t{i // 3}")  # type: ignore[arg-type]


def test_a_request_sees_the_history_as_it_was_when_it_was_made() -> None:
    state = new_state("s", bounded=True)
    for i in range(5):
        add_message(state, message(i))
    system = [E.Message(role="system", content="be brief")]
    view = HistoryView(system, state.messages)
    expected = system + list(state.messages)
    add_message(state, message(5))  # the history grows: the view does not
    add_message(state, message(6, "system"), 2)  # an insert makes a new list
    assert list(view) == expected and view == expected and len(view) == 6
    assert [view[i] for i in range(-6, 6)] == expected + expected
    cuts = (slice(None), slice(1, None), slice(0, 1), slice(2, 4), slice(-2, None), slice(None, None, 2), slice(4, 1))
    for cut in cuts:
        assert view[cut] == expected[cut]


def test_a_snapshot_with_the_chunks_encoded_before_is_the_snapshot_encoded_whole() -> None:
    state = new_state("s", bounded=True)
    history = EncodedHistory()
    for i in range(2 * HISTORY_CHUNK + 10):
        add_message(state, message(i))
        if i % 500 == 0:
            assert encode_state(state, history) == encode_state(state)
    assert encode_state(state, history) == encode_state(state)
    add_message(state, message(-1, "system"), 3)  # an insert in the first chunk (a summary)
    assert encode_state(state, history) == encode_state(state)
    set_messages(state, state.messages[:HISTORY_CHUNK + 5])  # a rewind
    assert encode_state(state, history) == encode_state(state)
    decoded = decode_state(encode_state(state, history))
    assert decoded == state and decoded is not None and len(decoded.messages) == HISTORY_CHUNK + 5
