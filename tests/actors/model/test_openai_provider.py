"""The OpenAI-compatible provider (the official SDK underneath) against a fake server on
127.0.0.1: real HTTP, real streaming, never the internet."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from sessionloop.actors.events import Message, ToolCallSpec, Usage
from sessionloop.actors.model import ModelError, ModelRequest, OpenAIProvider, make_provider
from sessionloop.actors.model.base import ModelAttachment, RetryNotice
from sessionloop.actors.model.limits import ModelLimits, RetryPolicy
from sessionloop.actors.model.openai import request_body, response_from_chunks, to_openai_message
from tests.fake_openai import Exchange, FakeServer, chunk

FAST = RetryPolicy(attempts=3, base_s=0.01, max_wait_s=0.05, total_s=30)
HELLO = ModelRequest(messages=[Message(role="system", content="be brief"), Message(role="user", content="hi")])


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


class Listener:
    """An ``on_delta`` that also hears tool-call announcements and retries, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []
        self.announced = asyncio.Event()

    def __call__(self, kind: str, text: str) -> None:
        self.seen.append((kind, text))

    def tool_call(self, call_id: str, name: str) -> None:
        self.seen.append(("tool_call", (call_id, name)))
        self.announced.set()

    def retrying(self, notice: RetryNotice) -> None:
        self.seen.append(("retry", notice))

    @property
    def retries(self) -> list[RetryNotice]:
        return [v for k, v in self.seen if k == "retry"]

    @property
    def text(self) -> list[str]:
        return [v for k, v in self.seen if k == "text"]


def provider_for(server: FakeServer, **options: Any) -> OpenAIProvider:
    options.setdefault("retry", FAST)
    return OpenAIProvider(model="test-model", base_url=server.base_url, api_key="sk-test-key-1234", **options)


async def generate(server: FakeServer, req: ModelRequest = HELLO, listener: Listener | None = None,
                   **options: Any) -> tuple[Any, Listener]:
    listener = listener or Listener()
    provider = provider_for(server, **options)
    try:
        response = await provider.generate(req, listener)
    finally:
        await provider.aclose()
    return response, listener


# --- streaming ----------------------------------------------------------------------------------


def test_text_is_streamed_as_deltas_and_usage_is_taken_from_the_usage_chunk() -> None:
    async def script(x: Exchange) -> None:
        await x.answer(["Hel", "lo, ", "world"], usage={"prompt_tokens": 11, "completion_tokens": 7})

    async def scenario() -> None:
        async with FakeServer(script) as server:
            response, heard = await generate(server)
        assert heard.seen == [("text", "Hel"), ("text", "lo, "), ("text", "world")]
        assert response.text == "Hello, world"
        assert response.usage == Usage(prompt_tokens=11, completion_tokens=7)
        assert (response.model, response.provider) == ("fake-model", "openai")
        sent = server.exchanges[0]
        assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
        assert sent.headers["authorization"] == "Bearer sk-test-key-1234"
        assert sent.body["stream"] is True and sent.body["stream_options"] == {"include_usage": True}
        assert sent.body["model"] == "test-model"
        assert sent.body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]

    run(scenario())


def test_without_a_usage_chunk_the_usage_is_the_mock_estimate_of_characters_over_four() -> None:
    async def script(x: Exchange) -> None:
        await x.answer(["a" * 40])  # no usage chunk: an endpoint that ignores include_usage

    async def scenario() -> None:
        async with FakeServer(script) as server:
            response, _ = await generate(server)
        assert response.usage == Usage(prompt_tokens=len("be brief" + "hi") // 4, completion_tokens=10)

    run(scenario())


def test_reasoning_content_is_streamed_as_reasoning_deltas() -> None:
    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(chunk(reasoning="think"))
        await x.event(chunk("answer", finish="stop"))
        await x.event("[DONE]")
        await x.end()

    async def scenario() -> None:
        async with FakeServer(script) as server:
            response, heard = await generate(server)
        assert heard.seen == [("reasoning", "think"), ("text", "answer")]
        assert response.reasoning == "think"

    run(scenario())


def test_tool_call_arguments_split_across_chunks_are_joined_and_the_name_is_announced_before_they_end() -> None:
    listener = Listener()

    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(chunk(tool_calls=[{"index": 0, "id": "call_a", "type": "function",
                                         "function": {"name": "read_file", "arguments": ""}}]))
        await asyncio.wait_for(listener.announced.wait(), 5)  # the card is out before the arguments
        await x.event(chunk(tool_calls=[{"index": 1, "id": "call_b", "type": "function",
                                         "function": {"name": "exec", "arguments": '{"comm'}}]))
        await x.event(chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"path": '}}]))
        await x.event(chunk(tool_calls=[{"index": 0, "function": {"arguments": '"a.txt"}'}}]))
        await x.event(chunk(tool_calls=[{"index": 1, "function": {"arguments": 'and": "ls"}'}}]))
        await x.event(chunk(finish="tool_calls"))
        await x.event("[DONE]")
        await x.end()

    async def scenario() -> None:
        async with FakeServer(script) as server:
            response, heard = await generate(server, listener=listener)
        assert heard.seen == [("tool_call", ("call_a", "read_file")), ("tool_call", ("call_b", "exec"))]
        assert response.tool_calls == [
            ToolCallSpec(call_id="call_a", name="read_file", args={"path": "a.txt"}),
            ToolCallSpec(call_id="call_b", name="exec", args={"command": "ls"}),
        ]

    run(scenario())


def test_tool_call_arguments_that_are_not_json_are_kept_as_the_raw_string() -> None:
    response = response_from_chunks([
        chunk(tool_calls=[{"index": 0, "id": "c", "function": {"name": "x", "arguments": "{oops"}}], finish="stop"),
    ])
    assert response.tool_calls == [ToolCallSpec(call_id="c", name="x", args="{oops")]


def test_tools_and_history_are_sent_in_the_openai_shape() -> None:
    calls = [ToolCallSpec(call_id="call_1", name="exec", args={"command": "ls"})]
    req = ModelRequest(
        messages=[
            Message(role="user", content="go", name="Ann"),
            Message(role="assistant", tool_calls=calls),
            Message(role="tool", tool_call_id="call_1", content="a.txt"),
        ],
        tools=[{"name": "exec", "description": "run", "parameters": {"type": "object", "properties": {}}}],
        model="override",
    )
    body = request_body(req, "default")
    assert body["model"] == "override"
    assert body["messages"] == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "exec", "arguments": '{"command":"ls"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    ]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "exec", "description": "run", "parameters": {"type": "object", "properties": {}}}}]


def test_an_assistant_message_without_calls_sends_its_text() -> None:
    assert to_openai_message(Message(role="assistant", content="")) == {"role": "assistant", "content": ""}


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
PICTURE = ModelRequest(
    messages=[Message(role="user", content="what is this?")],
    attachments={0: [ModelAttachment(name="cat.png", kind="image", mime="image/png", data=PNG),
                     ModelAttachment(name="notes.pdf", kind="file", mime="application/octet-stream", data=b"%PDF")]},
)


def test_an_image_attachment_arrives_at_a_vision_model_as_an_image_url_content_part() -> None:
    async def script(x: Exchange) -> None:
        await x.answer(["a cat"])

    async def scenario() -> None:
        async with FakeServer(script) as server:
            await generate(server, PICTURE, vision=True)
        content = server.exchanges[0].body["messages"][0]["content"]
        assert content == [
            {"type": "text", "text": "what is this?\n[file notes.pdf (application/octet-stream, 4 bytes): "
                                     "not shown to the model]"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()}},
        ]

    run(scenario())


def test_a_model_without_vision_is_told_in_text_that_an_image_is_attached() -> None:
    body = request_body(PICTURE, "m", vision=False)
    parts = body["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text"]
    assert "[image cat.png (image/png, 24 bytes): this model does not see images]" in parts[0]["text"]


# --- errors -------------------------------------------------------------------------------------


def test_an_http_401_is_not_retried_and_fails_with_the_status_and_the_error_message() -> None:
    async def script(x: Exchange) -> None:
        await x.error(401, "Incorrect API key provided")

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError) as e:
                await generate(server)
        assert len(server.exchanges) == 1
        assert "HTTP 401" in str(e.value) and "Incorrect API key provided" in str(e.value)
        assert e.value.data["status"] == 401

    run(scenario())


def test_a_server_that_echoes_the_key_in_its_error_never_gets_the_key_into_the_message() -> None:
    async def script(x: Exchange) -> None:
        await x.error(401, f"Incorrect API key provided: {x.headers['authorization'][7:]}")

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError) as e:
                await generate(server)
        assert "sk-test-key-1234" not in str(e.value) and "[redacted]" in str(e.value)

    run(scenario())


def test_an_http_error_with_a_plain_text_body_shows_the_body() -> None:
    async def script(x: Exchange) -> None:
        await x.reply(400, "Bad Request", b"upstream exploded", "text/plain")

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError, match="HTTP 400 .*upstream exploded"):
                await generate(server)

    run(scenario())


def test_a_malformed_chunk_fails_the_call_at_once_quoting_it() -> None:
    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(chunk("fine"))
        await x.event("{not json")
        await x.end()

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError, match=r"malformed stream: a data line is not JSON.*\{not json"):
                await generate(server)
        assert len(server.exchanges) == 1  # not retried: the same server would send it again

    run(scenario())


@pytest.mark.parametrize("bad", ['[1, 2]', '{"choices": "x"}', '{"choices": [{"delta": {"content": 7}}]}',
                                 '{"choices": [{"delta": {"tool_calls": [{"index": "z"}]}}]}'])
def test_a_chunk_of_the_wrong_shape_is_a_malformed_stream_naming_what_is_wrong(bad: str) -> None:
    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(bad)
        await x.end()

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError, match="malformed stream: .* (is not|are not)"):
                await generate(server)

    run(scenario())


def test_an_error_object_inside_the_stream_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="mid-stream: overloaded"):
        response_from_chunks([{"error": {"message": "overloaded"}}])


def test_an_unreachable_server_is_a_model_error_naming_the_url() -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        provider = OpenAIProvider(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", retry=FAST)
        with pytest.raises(ModelError, match=f"cannot reach http://127.0.0.1:{port}/v1/chat/completions"):
            await provider.generate(HELLO, lambda k, t: None)
        await provider.aclose()

    run(scenario())


def test_a_server_that_stops_sending_times_out_and_each_attempt_is_retried_until_the_last() -> None:
    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(chunk("slow"))
        await asyncio.sleep(5)

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError, match=r"timed out .* no data for 0.2 s \(gave up after 2 attempts\)"):
                await generate(server, timeout=0.2, retry=RetryPolicy(attempts=2, base_s=0.01, max_wait_s=0.01))
        assert len(server.exchanges) == 2

    run(scenario())


def test_a_timeout_then_an_answer_succeeds_on_the_second_attempt() -> None:
    async def script(x: Exchange) -> None:
        if x.number == 1:
            await x.start_sse()
            await asyncio.sleep(5)
        await x.answer(["late but fine"])

    async def scenario() -> None:
        async with FakeServer(script) as server:
            response, heard = await generate(server, timeout=0.2)
        assert response.text == "late but fine"
        assert [(n.attempt, n.cause, n.status) for n in heard.retries] == [(1, "timeout", 0)]

    run(scenario())


# --- retries ------------------------------------------------------------------------------------


def test_a_429_is_retried_after_the_wait_its_retry_after_asks_for_and_then_succeeds() -> None:
    replied: list[float] = []
    arrived: list[float] = []

    async def script(x: Exchange) -> None:
        arrived.append(time.monotonic())
        if x.number == 1:
            await x.error(429, "Rate limit reached", headers={"retry-after-ms": "300"})
            replied.append(time.monotonic())
            return
        await x.answer(["ok"])

    async def scenario() -> None:
        async with FakeServer(script) as server:
            provider = provider_for(server)
            listener = Listener()
            response = await provider.generate(HELLO, listener)
            await provider.aclose()
        assert response.text == "ok"
        assert listener.retries == [RetryNotice(attempt=1, status=429, cause="http", wait_ms=300,
                                                error=listener.retries[0].error)]
        assert "HTTP 429" in listener.retries[0].error and "Rate limit reached" in listener.retries[0].error
        assert arrived[1] - replied[0] >= 0.29  # it waited what the server asked for
        assert provider.stats.retries == {"429": 1} and provider.stats.requests == 2

    run(scenario())


def test_a_500_in_the_middle_of_a_stream_is_retried_and_the_answer_is_the_second_attempts_only() -> None:
    async def script(x: Exchange) -> None:
        if x.number == 1:
            await x.start_sse()
            await x.event(chunk("Half an "))
            await x.event(chunk("answ"))
            await x.event({"error": {"message": "internal error", "type": "server_error", "code": 500}})
            await x.end()
            return
        await x.answer(["The whole ", "answer"])

    async def scenario() -> None:
        async with FakeServer(script) as server:
            response, heard = await generate(server)
        assert response.text == "The whole answer"
        kinds = [k for k, _ in heard.seen]
        assert kinds == ["text", "text", "retry", "text", "text"]  # the sink restarts between them
        notice = heard.retries[0]
        assert (notice.attempt, notice.status, notice.cause) == (1, 500, "stream")
        assert "internal error" in notice.error

    run(scenario())


def test_a_connection_dropped_mid_stream_is_retried_as_a_lost_connection() -> None:
    async def script(x: Exchange) -> None:
        if x.number == 1:
            await x.start_sse()
            await x.event(chunk("cut "))
            return  # closes the socket without the last chunk of the body
        await x.answer(["whole"])

    async def scenario() -> None:
        async with FakeServer(script) as server:
            response, heard = await generate(server)
        assert response.text == "whole"
        assert heard.retries[0].cause == "connection" and "lost the connection" in heard.retries[0].error

    run(scenario())


def test_a_stream_that_ends_without_finishing_is_retried_then_fails_after_the_last_attempt() -> None:
    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(chunk("partial"))
        await x.end()

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError, match=r"ended before the answer was finished .*gave up after 3 attempts"):
                await generate(server)
        assert len(server.exchanges) == 3

    run(scenario())


def test_retries_are_bounded_in_count() -> None:
    async def script(x: Exchange) -> None:
        await x.error(503, "overloaded")

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError, match=r"HTTP 503 .*overloaded \(gave up after 3 attempts\)") as e:
                await generate(server)
        assert len(server.exchanges) == 3
        assert e.value.data["status"] == 503

    run(scenario())


def test_a_retry_after_beyond_the_retry_time_budget_fails_now_instead_of_waiting() -> None:
    async def script(x: Exchange) -> None:
        await x.error(429, "come back in a minute", headers={"retry-after": "60"})

    async def scenario() -> None:
        async with FakeServer(script) as server:
            started = time.monotonic()
            with pytest.raises(ModelError, match="HTTP 429"):
                await generate(server, retry=RetryPolicy(attempts=5, total_s=5.0))
            assert time.monotonic() - started < 30  # not the 60 s it asked for
        assert len(server.exchanges) == 1

    run(scenario())


def test_a_400_is_not_retried() -> None:
    async def script(x: Exchange) -> None:
        await x.error(400, "bad messages")

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError, match="HTTP 400"):
                await generate(server)
        assert len(server.exchanges) == 1

    run(scenario())


# --- limits and cancellation ----------------------------------------------------------------------


def test_the_concurrency_limit_holds_for_many_calls_at_once() -> None:
    async def script(x: Exchange) -> None:
        await x.answer(["a", "b"], gap_s=0.01)

    async def scenario() -> None:
        async with FakeServer(script) as server:
            provider = provider_for(server, limits=ModelLimits(max_concurrency=3))
            answers = await asyncio.gather(*(provider.generate(HELLO, lambda k, t: None) for _ in range(20)))
            await provider.aclose()
        assert [a.text for a in answers] == ["ab"] * 20
        assert server.max_open == 3
        assert provider.stats.delayed > 0 and provider.stats.waiting == 0 and provider.stats.in_flight == 0

    run(scenario())


def test_a_call_cancelled_while_it_waits_for_a_slot_leaves_the_queue_and_never_reaches_the_server() -> None:
    release = asyncio.Event()

    async def script(x: Exchange) -> None:
        await release.wait()
        await x.answer(["first"])

    async def scenario() -> None:
        async with FakeServer(script) as server:
            provider = provider_for(server, limits=ModelLimits(max_concurrency=1))
            first = asyncio.ensure_future(provider.generate(HELLO, lambda k, t: None))
            while not server.exchanges:
                await asyncio.sleep(0.01)
            second = asyncio.ensure_future(provider.generate(HELLO, lambda k, t: None))
            while provider.stats.waiting == 0:
                await asyncio.sleep(0.01)
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            assert provider.stats.waiting == 0
            release.set()
            assert (await first).text == "first"
            await provider.aclose()
        assert len(server.exchanges) == 1

    run(scenario())


def test_cancelling_mid_stream_raises_cancelled_and_closes_the_connection() -> None:
    first_delta = asyncio.Event()

    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(chunk("first"))
        await x.wait_closed()  # returns when the client closes the connection

    async def scenario() -> None:
        async with FakeServer(script) as server:
            provider = provider_for(server)
            task = asyncio.ensure_future(provider.generate(HELLO, lambda k, t: first_delta.set()))
            await asyncio.wait_for(first_delta.wait(), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(server.exchanges[0].closed.wait(), 5)
            assert provider.stats.in_flight == 0
            await provider.aclose()

    run(scenario())


# --- configuration --------------------------------------------------------------------------------


def test_model_base_url_and_api_key_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    async def script(x: Exchange) -> None:
        await x.answer(["env"])

    async def scenario() -> None:
        async with FakeServer(script) as server:
            base_url = server.base_url
            monkeypatch.setenv("OPENAI_BASE_URL", base_url + "/")
            monkeypatch.setenv("OPENAI_API_KEY", "sk-env-key")
            monkeypatch.setenv("OPENAI_MODEL", "env-model")
            provider = OpenAIProvider()
            await provider.generate(HELLO, lambda k, t: None)
            await provider.aclose()
        assert provider.url == base_url + "/chat/completions"
        assert server.exchanges[0].headers["authorization"] == "Bearer sk-env-key"
        assert server.exchanges[0].body["model"] == "env-model"

    run(scenario())


def test_no_api_key_sends_no_authorization_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    async def script(x: Exchange) -> None:
        await x.answer(["local"])

    async def scenario() -> None:
        async with FakeServer(script) as server:
            provider = OpenAIProvider(base_url=server.base_url)
            assert (await provider.generate(HELLO, lambda k, t: None)).text == "local"
            await provider.aclose()
        assert "authorization" not in server.exchanges[0].headers

    run(scenario())


def test_make_provider_builds_openai_from_plain_arguments_and_its_repr_hides_the_key() -> None:
    provider = make_provider("openai", model="m", base_url="http://h/v1", api_key="sk-secret",
                             limits=ModelLimits(max_concurrency=2, rpm=60), vision=True, label="fast")
    assert isinstance(provider, OpenAIProvider)
    assert (provider.model, provider.limits.max_concurrency, provider.limits.rpm, provider.vision,
            provider.label) == ("m", 2, 60, True, "fast")
    assert "sk-secret" not in repr(provider)


@pytest.mark.parametrize("bad", [{"max_concurrency": 0}, {"rpm": -1}, {"tpm": 1.5}])
def test_a_limit_that_is_not_a_positive_integer_is_refused_naming_it(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        ModelLimits(**bad)


def test_request_bodies_are_plain_json() -> None:
    assert json.loads(json.dumps(request_body(PICTURE, "m", vision=True)))["model"] == "m"
