"""The mock model's directive grammar (SPEC §4), rule by rule: tests and benchmarks depend on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from sessionloop.actors.events import Message, ToolCallSpec
from sessionloop.actors.model import (
    MockProvider,
    ModelError,
    ModelRequest,
    ModelResponse,
    Provider,
    make_provider,
)
from sessionloop.actors.model.mock import DELTA_CHARS, parse_script


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def user(text: str) -> Message:
    return Message(role="user", content=text)


def ask(
    *messages: Message, provider: MockProvider | None = None
) -> tuple[ModelResponse, list[tuple[str, str]]]:
    deltas: list[tuple[str, str]] = []
    response = run(
        (provider or MockProvider()).generate(
            ModelRequest(messages=list(messages)), lambda k, t: deltas.append((k, t))
        )
    )
    return response, deltas


def joined(deltas: list[tuple[str, str]], kind: str) -> str:
    return "".join(t for k, t in deltas if k == kind)


# --- echo ---------------------------------------------------------------------------------------


def test_plain_text_is_answered_with_echo() -> None:
    response, _ = ask(user("hello world"))
    assert response.text == "echo: hello world"
    assert response.tool_calls == []
    assert response.provider == "mock"
    assert response.model == "mock"


def test_echo_is_streamed_as_deltas_of_a_few_characters_that_add_up_to_the_text() -> None:
    response, deltas = ask(user("a somewhat longer message to stream"))
    assert len(deltas) > 3
    assert all(kind == "text" and 1 <= len(text) <= 8 for kind, text in deltas)
    assert all(len(text) == DELTA_CHARS for _, text in deltas[:-1])
    assert joined(deltas, "text") == response.text


def test_text_is_the_non_directive_lines_joined_and_stripped() -> None:
    response, _ = ask(user("  \nfirst\n!unknown thing\nsecond  \n\n"))
    assert response.text == "echo: first\nsecond"


def test_only_the_latest_user_message_is_read() -> None:
    response, _ = ask(user("!error old"), Message(role="assistant", content="x"), user("new"))
    assert response.text == "echo: new"


def test_a_request_without_a_user_message_echoes_empty_text() -> None:
    response, _ = ask(Message(role="system", content="sys"))
    assert response.text == "echo: "


def test_unknown_directives_are_ignored_and_not_echoed() -> None:
    response, _ = ask(user("!frobnicate 12\nhi"))
    assert response.text == "echo: hi"
    assert parse_script("!frobnicate 12\nhi").unknown == ("frobnicate",)


def test_the_same_request_always_gets_the_same_answer() -> None:
    first, d1 = ask(user("!reason r\nsame"))
    second, d2 = ask(user("!reason r\nsame"))
    assert first == second and d1 == d2


# --- !tool --------------------------------------------------------------------------------------


def test_tool_directive_returns_the_tool_call_with_no_text() -> None:
    response, deltas = ask(user('!tool read_file {"path": "a.txt"}'))
    assert response.text == ""
    assert deltas == []
    assert response.tool_calls == [ToolCallSpec(call_id="call_1", name="read_file", args={"path": "a.txt"})]


def test_several_tool_lines_return_their_calls_in_order() -> None:
    response, _ = ask(user('!tool a {"x": 1}\ntext\n!tool b {"y": 2}\n!tool c'))
    assert [(c.name, c.args) for c in response.tool_calls] == [("a", {"x": 1}), ("b", {"y": 2}), ("c", {})]
    assert [c.call_id for c in response.tool_calls] == ["call_1", "call_2", "call_3"]


def test_call_ids_count_the_tool_calls_already_in_the_history() -> None:
    earlier = Message(
        role="assistant",
        tool_calls=[ToolCallSpec(call_id="call_1", name="x"), ToolCallSpec(call_id="call_2", name="y")],
    )
    history = [
        user("!tool x\n!tool y"),
        earlier,
        Message(role="tool", tool_call_id="call_1", content="1"),
        Message(role="tool", tool_call_id="call_2", content="2"),
        Message(role="assistant", content="done"),
        user("!tool z"),
    ]
    response, _ = ask(*history)
    assert [c.call_id for c in response.tool_calls] == ["call_3"]


def test_once_tool_results_follow_the_call_answers_done_with_their_count() -> None:
    calls = [ToolCallSpec(call_id="call_1", name="a"), ToolCallSpec(call_id="call_2", name="b")]
    response, deltas = ask(
        user("!tool a\n!tool b"),
        Message(role="assistant", tool_calls=calls),
        Message(role="tool", tool_call_id="call_1", content="r1"),
        Message(role="tool", tool_call_id="call_2", content="r2"),
    )
    assert response.text == "done: 2 tool calls"
    assert response.tool_calls == []
    assert joined(deltas, "text") == "done: 2 tool calls"


def test_tool_results_before_the_latest_user_message_do_not_count() -> None:
    old = [
        Message(role="assistant", tool_calls=[ToolCallSpec(call_id="call_1", name="a")]),
        Message(role="tool", tool_call_id="call_1", content="r"),
    ]
    response, _ = ask(user("!tool a"), *old, user("!tool a"))
    assert [c.call_id for c in response.tool_calls] == ["call_2"]


def test_tool_directive_with_invalid_json_fails_naming_the_line() -> None:
    with pytest.raises(ModelError, match="invalid JSON"):
        ask(user("!tool a {nope"))


def test_tool_directive_without_a_name_fails() -> None:
    with pytest.raises(ModelError, match="needs a tool name"):
        ask(user("!tool"))


# --- !loop --------------------------------------------------------------------------------------


def test_loop_requests_list_files_on_every_call_even_after_results() -> None:
    first, _ = ask(user("!loop"))
    assert [(c.name, c.args) for c in first.tool_calls] == [("list_files", {"path": "."})]
    history = [
        user("!loop"),
        Message(role="assistant", tool_calls=first.tool_calls),
        Message(role="tool", tool_call_id=first.tool_calls[0].call_id, content="[]"),
    ]
    second, _ = ask(*history)
    assert [(c.call_id, c.name, c.args) for c in second.tool_calls] == [
        ("call_2", "list_files", {"path": "."})
    ]
    assert second.text == ""


def test_loop_wins_over_tool_directives() -> None:
    response, _ = ask(user("!tool other\n!loop"))
    assert [c.name for c in response.tool_calls] == ["list_files"]


# --- !error / !reason ---------------------------------------------------------------------------


def test_error_directive_fails_the_call_with_its_text() -> None:
    with pytest.raises(ModelError) as e:
        ask(user("!error the model is down\nhello"))
    assert str(e.value) == "the model is down"


def test_error_directive_without_text_still_fails() -> None:
    with pytest.raises(ModelError, match="mock error"):
        ask(user("!error"))


def test_error_wins_over_tool_and_loop() -> None:
    with pytest.raises(ModelError):
        ask(user("!loop\n!tool a\n!error boom"))


def test_reason_streams_a_reasoning_part_before_the_answer() -> None:
    response, deltas = ask(user("!reason let me think about it\nhi"))
    assert response.reasoning == "let me think about it"
    assert joined(deltas, "reasoning") == response.reasoning
    kinds = [k for k, _ in deltas]
    assert kinds.index("text") > max(i for i, k in enumerate(kinds) if k == "reasoning")
    assert response.text == "echo: hi"


def test_several_reason_lines_are_joined_with_newlines() -> None:
    response, _ = ask(user("!reason one\n!reason two"))
    assert response.reasoning == "one\ntwo"


def test_reasoning_is_streamed_before_an_error() -> None:
    deltas: list[tuple[str, str]] = []
    with pytest.raises(ModelError):
        run(
            MockProvider().generate(
                ModelRequest(messages=[user("!reason hmm\n!error no")]), lambda k, t: deltas.append((k, t))
            )
        )
    assert joined(deltas, "reasoning") == "hmm"


# --- !sleep and latency ------------------------------------------------------------------------


def test_sleep_streams_the_answer_over_the_given_time() -> None:
    stamps: list[float] = []
    start = time.monotonic()
    response = run(
        MockProvider().generate(
            ModelRequest(messages=[user("!sleep 300\n" + "x" * 30)]),
            lambda k, t: stamps.append(time.monotonic() - start),
        )
    )
    elapsed = time.monotonic() - start
    assert response.text == "echo: " + "x" * 30
    assert elapsed >= 0.29
    assert len(stamps) == len(response.text) // DELTA_CHARS + (1 if len(response.text) % DELTA_CHARS else 0)
    assert stamps[0] < 0.2, "the first delta comes early, not after the whole sleep"
    assert stamps[-1] >= 0.25


def test_sleep_is_abortable_at_any_moment_by_task_cancellation(paused_gc) -> None:
    deltas: list[str] = []

    async def scenario() -> float:
        task = asyncio.ensure_future(
            MockProvider().generate(
                ModelRequest(messages=[user("!sleep 1000\n" + "y" * 60)]), lambda k, t: deltas.append(t)
            )
        )
        await asyncio.sleep(0.3)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    assert run(scenario()) < 0.1
    assert 0 < len(deltas) < 11, "some deltas were streamed before the abort, not all"


def test_sleep_without_any_answer_text_still_waits() -> None:
    start = time.monotonic()
    response, _ = ask(user("!sleep 100\n!tool a"))
    assert time.monotonic() - start >= 0.09
    assert [c.name for c in response.tool_calls] == ["a"]


def test_sleep_lines_add_up() -> None:
    assert parse_script("!sleep 10\n!sleep 15").sleep_ms == 25


def test_sleep_needs_a_whole_non_negative_number() -> None:
    with pytest.raises(ModelError, match="whole number"):
        ask(user("!sleep soon"))
    with pytest.raises(ModelError, match="non-negative"):
        ask(user("!sleep -5"))


def test_latency_option_delays_every_call() -> None:
    provider = MockProvider(latency_ms=80)
    start = time.monotonic()
    ask(user("a"), provider=provider)
    ask(user("b"), provider=provider)
    assert time.monotonic() - start >= 0.16


def test_latency_must_not_be_negative() -> None:
    with pytest.raises(ModelError):
        MockProvider(latency_ms=-1)


def test_without_sleep_or_latency_a_call_never_yields_to_the_event_loop() -> None:
    deltas: list[str] = []
    coro = MockProvider().generate(ModelRequest(messages=[user("quick")]), lambda k, t: deltas.append(t))
    with pytest.raises(StopIteration) as done:
        coro.send(None)  # one step of the coroutine runs it to the end: no await suspended it
    assert done.value.value.text == "echo: quick"
    assert "".join(deltas) == "echo: quick"


# --- usage --------------------------------------------------------------------------------------


def test_usage_counts_characters_sent_and_produced_divided_by_four() -> None:
    history = [Message(role="system", content="s" * 10), user("!reason abcd\nhello there")]
    response, _ = ask(*history)
    assert response.usage.prompt_tokens == (10 + len(history[1].content)) // 4
    assert response.usage.completion_tokens == (len("echo: hello there") + len("abcd")) // 4


def test_usage_counts_tool_call_arguments_as_json() -> None:
    response, _ = ask(user('!tool write_file {"path": "a", "content": "0123456789"}'))
    produced = len('{"path":"a","content":"0123456789"}')
    assert response.usage.completion_tokens == produced // 4


# --- the factory --------------------------------------------------------------------------------


def test_make_provider_builds_the_mock_with_its_options() -> None:
    provider = make_provider("mock", latency_ms=5)
    assert isinstance(provider, MockProvider) and provider.latency_ms == 5
    assert isinstance(provider, Provider)


def test_make_provider_refuses_an_unknown_name_listing_the_known_ones() -> None:
    with pytest.raises(
        ModelError, match="unknown model provider 'gpt'; known: mock, scripted, replay, openai"
    ):
        make_provider("gpt")


def test_make_provider_turns_bad_options_into_a_model_error() -> None:
    with pytest.raises(ModelError, match="bad options"):
        make_provider("mock", temperature=1)


def test_request_model_overrides_the_provider_model_name() -> None:
    response = run(MockProvider().generate(ModelRequest(messages=[user("x")], model="m2"), lambda k, t: None))
    assert response.model == "m2"
