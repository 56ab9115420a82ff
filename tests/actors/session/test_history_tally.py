"""The session keeps counts of its history (characters, tool calls, messages with files) as it changes,
so a model call does not recount the whole history: the counts must equal a recount after every
kind of change, and the mock must answer the same with them as without."""

from __future__ import annotations

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.model.base import HistoryTally, ModelRequest, tally_of
from sessionloop.actors.model.mock import MockProvider
from sessionloop.actors.session.commands import StateCopy
from sessionloop.actors.session.messages import Ask
from sessionloop.actors.session.state import decode_state, encode_state

TOOL = '!tool list_files {"path": "."}'


def state_of(host, session_id: str):
    return host.rt.ask(session_id, lambda r: Ask(StateCopy(), r))


def assert_counts_hold(state) -> None:
    kept = HistoryTally(chars=state.history_chars, tool_calls=state.history_tool_calls,
                        attachments=state.history_attachments)
    assert kept == tally_of(state.messages)


def test_the_counts_follow_turns_tools_files_a_rewind_a_compaction_and_a_fork(open_host) -> None:
    host = open_host(permission_mode="acceptCalls")
    s = host.create(title="counted")
    s.run("hello")
    s.run(TOOL)
    first = state_of(host, s.id)
    assert_counts_hold(first)
    assert first.history_tool_calls == 1 and first.history_chars > 0
    image = E.AttachmentRef(name="a.png", kind="image", mime="image/png", size=3, sha256="0" * 64)
    receipt = s.send("look at this", attachments=[image])
    s.wait(receipt.turn_id, 30)
    with_file = state_of(host, s.id)
    assert_counts_hold(with_file)
    assert with_file.history_attachments == 1
    s.run(TOOL)
    s.rewind(receipt.turn_id, "code-and-chat")  # the file's turn and the later one leave the chat
    rewound = state_of(host, s.id)
    assert_counts_hold(rewound)
    assert rewound.history_attachments == 0 and rewound.history_tool_calls == 1
    s.compact()
    compacted = state_of(host, s.id)
    assert compacted.summaries == 1
    assert_counts_hold(compacted)
    fork = host.fork(s.id, title="copy")
    assert_counts_hold(state_of(host, fork.id))
    again = decode_state(encode_state(compacted))  # what a snapshot keeps
    assert again is not None
    assert_counts_hold(again)


def test_the_mock_answers_the_same_with_the_counts_as_when_it_counts_itself() -> None:
    messages = [E.Message(role="system", content="you are a test"),
                E.Message(role="user", content="hi", turn_id="t1"),
                E.Message(role="assistant", content="", tool_calls=(E.ToolCallSpec(call_id="call_1", name="x"),)),
                E.Message(role="tool", content="ok", tool_call_id="call_1"),
                E.Message(role="user", content=TOOL, turn_id="t2")]
    bare = ModelRequest(messages=messages)
    counted = msgspec.structs.replace(bare, tally=tally_of(messages))
    mock = MockProvider()
    a, b = mock.answer_now(bare, lambda *_: None), mock.answer_now(counted, lambda *_: None)
    assert a is not None and a == b
    assert a.tool_calls[0].call_id == "call_2" and a.usage.prompt_tokens == sum(len(m.content) for m in messages) // 4
