"""The scripted and replay providers (SPEC §4 "Model providers", §9 ``rerun``)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from sessionloop.actors.events import LlmCompleted, Message, ToolCallSpec, TurnStarted, Usage
from sessionloop.actors.model import (
    ModelError,
    ModelRequest,
    ModelResponse,
    ReplayDivergence,
    ReplayProvider,
    ScriptedProvider,
    make_provider,
)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def request(*messages: Message) -> ModelRequest:
    return ModelRequest(messages=list(messages) or [Message(role="user", content="hi")])


def call(provider: Any, req: ModelRequest | None = None) -> tuple[ModelResponse, list[tuple[str, str]]]:
    deltas: list[tuple[str, str]] = []
    response = run(provider.generate(req or request(), lambda k, t: deltas.append((k, t))))
    return response, deltas


# --- scripted -----------------------------------------------------------------------------------


def test_scripted_answers_in_the_given_order() -> None:
    provider = ScriptedProvider(["one", "two"])
    assert call(provider)[0].text == "one"
    assert call(provider)[0].text == "two"
    assert provider.remaining == 0


def test_scripted_streams_reasoning_then_text_as_deltas() -> None:
    provider = ScriptedProvider([ModelResponse(text="a long enough answer", reasoning="thinking hard")])
    response, deltas = call(provider)
    assert "".join(t for k, t in deltas if k == "text") == response.text
    assert "".join(t for k, t in deltas if k == "reasoning") == response.reasoning
    assert deltas[0][0] == "reasoning"


def test_scripted_accepts_a_dict_with_tool_calls() -> None:
    provider = ScriptedProvider(
        [
            {
                "text": "",
                "tool_calls": [{"id": "c9", "name": "exec", "args": {"command": "ls"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4},
            }
        ]
    )
    response, _ = call(provider)
    assert response.tool_calls == [ToolCallSpec(call_id="c9", name="exec", args={"command": "ls"})]
    assert response.usage == Usage(prompt_tokens=3, completion_tokens=4)
    assert response.provider == "scripted"


def test_scripted_dict_tool_calls_without_ids_get_numbered_ids() -> None:
    response, _ = call(ScriptedProvider([{"tool_calls": [{"name": "a"}, {"name": "b"}]}]))
    assert [c.call_id for c in response.tool_calls] == ["call_1", "call_2"]


def test_scripted_dict_with_unknown_keys_is_refused_clearly() -> None:
    with pytest.raises(ModelError, match="unknown keys"):
        call(ScriptedProvider([{"txt": "typo"}]))


def test_scripted_raises_an_exception_entry() -> None:
    provider = ScriptedProvider([ModelError("rate limited"), "after"])
    with pytest.raises(ModelError, match="rate limited"):
        call(provider)
    assert call(provider)[0].text == "after"


def test_scripted_raises_an_exception_class_entry() -> None:
    with pytest.raises(RuntimeError):
        call(ScriptedProvider([RuntimeError]))
    with pytest.raises(ModelError, match="scripted failure"):
        call(ScriptedProvider([ModelError]))


def test_scripted_calls_a_callable_entry_with_the_request() -> None:
    provider = ScriptedProvider([lambda req: f"{len(req.messages)} messages"])
    assert (
        call(provider, request(Message(role="system"), Message(role="user", content="x")))[0].text
        == "2 messages"
    )


def test_scripted_fails_clearly_when_exhausted() -> None:
    provider = ScriptedProvider(["only"])
    call(provider)
    with pytest.raises(ModelError, match="exhausted: it had 1 answers and call 2 asked for another"):
        call(provider)


def test_scripted_records_every_request_and_can_be_extended() -> None:
    provider = ScriptedProvider([])
    provider.extend(["late"])
    req = request(Message(role="user", content="q"))
    assert call(provider, req)[0].text == "late"
    assert provider.requests == [req]


def test_scripted_delay_is_a_cancellation_point() -> None:
    async def scenario() -> None:
        task = asyncio.ensure_future(
            ScriptedProvider(["x"], delay_ms=10_000).generate(request(), lambda k, t: None)
        )
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())


def test_make_provider_builds_scripted_with_responses() -> None:
    provider = make_provider("scripted", responses=["hi"])
    assert call(provider)[0].text == "hi"


# --- replay -------------------------------------------------------------------------------------


def completed(step: str, text: str = "", calls: list[ToolCallSpec] | None = None) -> LlmCompleted:
    return LlmCompleted(
        turn_id="t1",
        step_id=step,
        text=text,
        reasoning="r" if text else "",
        tool_calls=calls or [],
        usage=Usage(prompt_tokens=5, completion_tokens=2),
        model="mock",
        provider="mock",
    )


def test_replay_answers_the_recorded_responses_in_order() -> None:
    calls = [ToolCallSpec(call_id="call_1", name="list_files", args={"path": "."})]
    provider = ReplayProvider([completed("s1", calls=calls), completed("s2", text="done: 1 tool calls")])
    first, _ = call(provider)
    assert first.tool_calls == calls
    second, deltas = call(
        provider,
        request(
            Message(role="user", content="q"),
            Message(role="assistant", tool_calls=calls),
            Message(role="tool", tool_call_id="call_1", content="[]"),
        ),
    )
    assert second.text == "done: 1 tool calls"
    assert "".join(t for k, t in deltas if k == "text") == second.text
    assert second.usage == Usage(prompt_tokens=5, completion_tokens=2)


def test_replay_keeps_the_recorded_model_and_provider_names() -> None:
    response, _ = call(ReplayProvider([completed("s1", text="x")]))
    assert (response.model, response.provider) == ("mock", "mock")
    assert ReplayProvider().name == "replay"


def test_replay_takes_a_whole_event_stream_and_uses_only_model_answers() -> None:
    provider = ReplayProvider([TurnStarted(turn_id="t1"), completed("s1", text="a")])
    assert provider.remaining == 1


def test_replay_reports_a_divergence_when_asked_for_more_calls_than_recorded() -> None:
    provider = ReplayProvider([completed("s1", text="a")])
    call(provider)
    with pytest.raises(ReplayDivergence) as e:
        call(provider, request(Message(role="user", content="one more")))
    assert isinstance(e.value, ModelError)
    assert e.value.call == 2
    assert e.value.expected == "no more model calls (1 recorded)"
    assert "one more" in e.value.got
    assert "diverged at model call 2" in str(e.value)


def test_replay_reports_a_divergence_when_tool_results_answer_other_calls() -> None:
    calls = [ToolCallSpec(call_id="call_1", name="a")]
    provider = ReplayProvider([completed("s1", calls=calls), completed("s2", text="x")])
    call(provider)
    with pytest.raises(ReplayDivergence) as e:
        call(
            provider,
            request(
                Message(role="user", content="q"),
                Message(role="assistant", tool_calls=[ToolCallSpec(call_id="call_7", name="b")]),
                Message(role="tool", tool_call_id="call_7", content="?"),
            ),
        )
    assert e.value.expected == "tool results for ['call_1']"
    assert e.value.got == "tool results for ['call_7']"


def test_replay_tool_result_check_can_be_turned_off() -> None:
    provider = ReplayProvider(
        [completed("s1", calls=[ToolCallSpec(call_id="c", name="a")]), completed("s2", text="x")],
        check_tool_results=False,
    )
    call(provider)
    assert call(provider, request(Message(role="tool", tool_call_id="other", content="")))[0].text == "x"


def test_make_provider_builds_replay_from_recorded_events() -> None:
    provider = make_provider("replay", recorded=[completed("s1", text="again")])
    assert call(provider)[0].text == "again"
