"""A live session's state is bounded (``state.bound``): the records of its last two turns, not its
whole history; what is older is read from the log when asked (``actors.session.history``)."""

from __future__ import annotations

import glob
import os

import pytest
from click.testing import CliRunner

from sessionloop.actors.api.host import Host
from sessionloop.actors.session.state import (
    HISTORY_CHUNK,
    KEPT_TURNS,
    SessionState,
    bound,
    copy_state,
    decode_state,
    encode_state,
    evolve,
    fold,
    new_state,
)
from sessionloop.cli.main import main as cli_main
from tests.actors.gateway_harness import wait_until

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fixtures")
SESSIONS = sorted(glob.glob(os.path.join(FIXTURES, "sessions", "*.jsonl")))
TOOL = '!tool list_files {"path": "."}'


def whole(host: Host, session_id: str, upto: int | None = None) -> SessionState:
    events = host.store.read_stream(f"session-{session_id}")
    return fold((r.event for r in events[:upto]), new_state(session_id))


def stored_snapshot(host: Host, session_id: str) -> SessionState:
    snap = host.store.load_snapshot(f"session-{session_id}")
    assert snap is not None
    state = decode_state(snap.state, snap.parts)
    assert state is not None and state.version == snap.version
    return state


def imported(path: str, data_dir: str) -> None:
    result = CliRunner().invoke(cli_main, ["import", path, "--data", data_dir])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("path", SESSIONS, ids=[os.path.basename(p) for p in SESSIONS])
def test_the_bounded_fold_is_the_whole_fold_bounded_after_every_event_before_a_rewind(path: str, tmp_path) -> None:
    data_dir = str(tmp_path / "data")
    imported(path, data_dir)
    with Host.open(data_dir, durability="nosync") as host:
        for info in host.list():
            events = [r.event for r in host.store.read_stream(f"session-{info.id}")]
            bounded, full = new_state(info.id, bounded=True), new_state(info.id)
            for event in events:
                if type(event).__name__ == "TurnRewound":
                    break  # the shell bounds the whole fold read from the log again (tested below)
                evolve(bounded, event)
                evolve(full, event)
                assert bounded == bound(copy_state(full)), f"{info.id} differs after {type(event).__name__}"
                assert decode_state(encode_state(bounded)) == bounded  # what its snapshot keeps
                assert len(bounded.turns) <= KEPT_TURNS


def test_a_long_session_keeps_two_turns_live_and_answers_reads_of_older_ones_from_the_log(open_host) -> None:
    host = open_host(permission_mode="acceptCalls", snapshot_every=20, idle_timeout_s=0.1)
    s = host.create()
    results = [s.run(TOOL if i % 2 else f"m{i}") for i in range(12)]
    assert wait_until(lambda: host.rt.directory.live_count() == 0)  # passivated: its snapshot is the live state
    snap = stored_snapshot(host, s.id)
    assert snap.bounded and len(snap.turns) == KEPT_TURNS and len(snap.turn_order) == 12
    assert {c.turn_id for c in snap.tool_calls.values()} <= set(snap.turns)
    assert snap == bound(whole(host, s.id))
    copy = s.snapshot()  # a copy is the whole fold, read from the log
    assert not copy.bounded and len(copy.turns) == 12 and copy == whole(host, s.id)
    first = s.wait(results[0].turn_id, 5)  # an old turn's outcome, rebuilt from the log
    assert (first.state, first.output_text) == ("completed", "echo: m0")
    fork = host.fork(s.id, turns=3)
    assert [m.content for m in fork.snapshot().messages][:2] == ["m0", "echo: m0"]


def test_a_history_past_a_chunk_is_snapshotted_in_parts_and_activates_to_the_same_state(tmp_path) -> None:
    """Over ``HISTORY_CHUNK`` messages the snapshot keeps the full chunks as snapshot parts of the
    store, written once: a reopened session activates from them to the fold of its log, and its
    next snapshots add parts without rewriting the first."""
    data_dir = str(tmp_path / "data")
    options = {"durability": "nosync", "permission_mode": "acceptCalls", "snapshot_every": 40}
    with Host.open(data_dir, **options) as host:
        s = host.create()
        for i in range(HISTORY_CHUNK // 2 + 20):  # two messages a turn: past the first chunk
            s.run(f"m{i}")
        first = host.store.load_snapshot(f"session-{s.id}")
        assert len(first.parts) == 1 and len(first.state) < len(first.parts[0])
    with Host.open(data_dir, **options) as host:
        session = host.session(s.id)
        assert session.run("after the reopen").output_text == "echo: after the reopen"
        at = host.store.load_snapshot(f"session-{s.id}").version
        assert stored_snapshot(host, s.id) == bound(whole(host, s.id, at))
        for i in range(HISTORY_CHUNK // 2):
            session.run(f"n{i}")
        later = host.store.load_snapshot(f"session-{s.id}")
        assert len(later.parts) == 2 and later.parts[0] == first.parts[0]
        assert stored_snapshot(host, s.id) == bound(whole(host, s.id, later.version))


def test_an_old_turns_outcome_is_found_after_a_reopen(tmp_path) -> None:
    data_dir = str(tmp_path / "data")
    with Host.open(data_dir, durability="nosync", permission_mode="acceptCalls") as host:
        s = host.create()
        turns = [s.run(f"m{i}").turn_id for i in range(5)]
    with Host.open(data_dir, durability="nosync", permission_mode="acceptCalls") as host:
        outcome = host.session(s.id).wait(turns[1], 5)
        assert (outcome.state, outcome.output_text) == ("completed", "echo: m1")


def test_a_rewind_to_a_turn_the_live_state_keeps_no_record_of_deletes_its_chat(open_host) -> None:
    host = open_host(permission_mode="acceptCalls", idle_timeout_s=0.1)
    s = host.create()
    turns = [s.run(TOOL if i % 2 else f"m{i}").turn_id for i in range(6)]
    s.rewind(turns[2], scope="code-and-chat")
    after = s.run("again")
    assert after.output_text == "echo: again"
    contents = [m.content for m in s.snapshot().messages]
    assert contents[:2] == ["m0", "echo: m0"] and contents[-2:] == ["again", "echo: again"]
    assert "m2" not in contents and "m4" not in contents
    assert wait_until(lambda: host.rt.directory.live_count() == 0)
    assert stored_snapshot(host, s.id) == bound(whole(host, s.id))
    assert s.run("once more").output_text == "echo: once more"  # reactivated from that snapshot


def test_a_format_2_snapshot_still_loads_and_is_replaced_by_a_bounded_one(tmp_path) -> None:
    """``snapshot_v2_tool_calls.msgpack`` was written by the code before the bounded state
    (``tests/fixtures/snapshot_v2.py``): the whole state of ``sessions/tool_calls.jsonl``."""
    with open(os.path.join(FIXTURES, "snapshot_v2_tool_calls.msgpack"), "rb") as f:
        old = f.read()
    state = decode_state(old)
    assert state is not None and not state.bounded and len(state.turns) > KEPT_TURNS
    data_dir = str(tmp_path / "data")
    imported(os.path.join(FIXTURES, "sessions", "tool_calls.jsonl"), data_dir)
    with Host.open(data_dir, durability="nosync", idle_timeout_s=0.1) as host:
        stream = f"session-{state.session_id}"
        assert host.store.stream_version(stream) == state.version
        host.store.save_snapshot(stream, state.version, old)
    with Host.open(data_dir, durability="nosync", idle_timeout_s=0.1) as host:
        session = host.session(state.session_id)
        assert session.snapshot() == whole(host, state.session_id) == state
        assert wait_until(lambda: host.rt.directory.live_count() == 0)  # passivation writes a bounded snapshot
        snap = stored_snapshot(host, state.session_id)
        assert snap.bounded and snap == bound(copy_state(state))
