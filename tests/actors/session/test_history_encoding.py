"""What keeps a long session's turn from growing with its history: a model request views the
history instead of copying it (``effects.HistoryView``), and a snapshot encodes and writes only the
history's chunks filled since the last one (``state.EncodedHistory``, snapshot parts)."""

from __future__ import annotations

from sessionloop.actors import events as E
from sessionloop.actors.session.effects import HistoryView
from sessionloop.actors.session.state import (
    HISTORY_CHUNK,
    EncodedHistory,
    add_message,
    decode_state,
    encode_snapshot,
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


def test_a_state_copy_in_chunks_decodes_to_the_state() -> None:
    state = new_state("s", bounded=True)
    for i in range(2 * HISTORY_CHUNK + 10):
        add_message(state, message(i))
    add_message(state, message(-1, "system"), 3)  # an insert in the first chunk (a summary)
    assert decode_state(encode_state(state)) == state
    set_messages(state, state.messages[:HISTORY_CHUNK + 5])  # a rewind
    decoded = decode_state(encode_state(state))
    assert decoded == state and decoded is not None and len(decoded.messages) == HISTORY_CHUNK + 5


def _stored(history: EncodedHistory, state, store: dict[int, bytes]):
    """Save a format-4 snapshot into ``store`` (index -> part) as the event store would; what it wrote."""
    snap = encode_snapshot(state, history)
    store.update(snap.parts)
    history.stored(state.messages, snap.part_count)
    return snap


def test_a_live_snapshot_writes_each_full_chunk_once_and_decodes_to_the_state() -> None:
    state = new_state("s", bounded=True)
    history, parts = EncodedHistory(), {}
    written: list[list[int]] = []
    for i in range(3 * HISTORY_CHUNK + 7):
        add_message(state, message(i))
        if i % 400 == 0:
            snap = _stored(history, state, parts)
            written.append(sorted(snap.parts))
            assert decode_state(snap.state, [parts[k] for k in range(snap.part_count)]) == state
    snap = _stored(history, state, parts)
    written.append(sorted(snap.parts))
    # each chunk written by the first snapshot after it filled, never again
    assert [k for w in written for k in w] == [0, 1, 2]
    snap = _stored(history, state, parts)
    assert snap.parts == {} and snap.part_count == 3
    assert len(snap.state) < len(encode_state(state)) // 3  # the tail and the rest of the state only
    # a rewind makes a new history list: its chunks are written again
    set_messages(state, state.messages[:HISTORY_CHUNK + 5])
    snap = _stored(history, state, parts)
    assert sorted(snap.parts) == [0] and snap.part_count == 1
    assert decode_state(snap.state, [parts[0]]) == state


def test_a_history_adopted_from_a_loaded_snapshot_writes_only_chunks_filled_since() -> None:
    state = new_state("s", bounded=True)
    history, parts = EncodedHistory(), {}
    for i in range(2 * HISTORY_CHUNK + 3):
        add_message(state, message(i))
    snap = _stored(history, state, parts)
    loaded = decode_state(snap.state, [parts[0], parts[1]])
    assert loaded == state and loaded is not None
    again = EncodedHistory()
    again.adopt(loaded.messages, 2)
    for i in range(HISTORY_CHUNK):
        add_message(loaded, message(i))
    snap = _stored(again, loaded, parts)
    assert sorted(snap.parts) == [2] and decode_state(snap.state, [parts[k] for k in range(3)]) == loaded


def test_parts_given_to_a_snapshot_of_another_format_are_refused_not_misread() -> None:
    state = new_state("s", bounded=True)
    add_message(state, message(1))
    assert decode_state(encode_state(state)) == state
    assert decode_state(encode_state(state), [b"\x90"]) is None  # format 3 has no parts: replay instead
