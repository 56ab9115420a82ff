"""The OpenAI-compatible provider against a fake SSE server on 127.0.0.1 (never the internet)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Self

import pytest

from actors.model import ModelError, ModelRequest, OpenAIProvider, make_provider
from actors.model.openai import parse_sse_lines, request_body, to_openai_message
from eventstore.events import Message, ToolCallSpec, Usage

Script = Callable[["Exchange"], Awaitable[None]]


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


class Exchange:
    """One HTTP request the fake server received, and the means to answer it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.method = self.path = ""
        self.headers: dict[str, str] = {}
        self.body: Any = None

    async def read_request(self) -> None:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        self.method, self.path, _ = lines[0].split(" ", 2)
        for line in lines[1:]:
            if line:
                key, _, value = line.partition(":")
                self.headers[key.strip().lower()] = value.strip()
        size = int(self.headers.get("content-length", "0"))
        self.body = json.loads(await self.reader.readexactly(size)) if size else None

    async def start_sse(self) -> None:
        self.writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        await self.writer.drain()

    async def send(self, text: str) -> None:
        data = text.encode()
        self.writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await self.writer.drain()

    async def event(self, payload: Any) -> None:
        await self.send("data: " + (payload if isinstance(payload, str) else json.dumps(payload)) + "\n\n")

    async def end(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    async def reply(
        self, status: int, reason: str, body: bytes, content_type: str = "application/json"
    ) -> None:
        self.writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await self.writer.drain()


class FakeServer:
    """A tiny HTTP/1.1 server on 127.0.0.1:0 that answers each request with ``script``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.exchanges: list[Exchange] = []
        self.disconnected = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def base_url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        exchange = Exchange(reader, writer)
        self.exchanges.append(exchange)
        try:
            await exchange.read_request()
            await self.script(exchange)
        finally:
            writer.close()


def chunk(
    content: str | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = None,
    reasoning: str | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


USAGE_CHUNK = {
    "id": "chatcmpl-1",
    "model": "fake-model",
    "choices": [],
    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
}


async def generate(
    server: FakeServer, req: ModelRequest, **options: Any
) -> tuple[Any, list[tuple[str, str]]]:
    deltas: list[tuple[str, str]] = []
    provider = OpenAIProvider(model="test-model", base_url=server.base_url, api_key="sk-test", **options)
    try:
        response = await provider.generate(req, lambda k, t: deltas.append((k, t)))
    finally:
        await provider.aclose()
    return response, deltas


HELLO = ModelRequest(
    messages=[Message(role="system", content="be brief"), Message(role="user", content="hi")]
)


# --- streaming ----------------------------------------------------------------------------------


def test_text_is_streamed_as_deltas_and_usage_is_taken_from_the_last_chunk() -> None:
    async def script(x: Exchange) -> None:
        await x.start_sse()
        for piece in ["Hel", "lo, ", "world"]:
            await x.event(chunk(piece))
        await x.event(chunk(finish="stop"))
        await x.event(USAGE_CHUNK)
        await x.event("[DONE]")
        await x.end()

    async def scenario() -> None:
        async with FakeServer(script) as server:
            response, deltas = await generate(server, HELLO)
        assert deltas == [("text", "Hel"), ("text", "lo, "), ("text", "world")]
        assert response.text == "Hello, world"
        assert response.usage == Usage(prompt_tokens=11, completion_tokens=7)
        assert (response.model, response.provider) == ("fake-model", "openai")
        sent = server.exchanges[0]
        assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
        assert sent.headers["authorization"] == "Bearer sk-test"
        assert sent.body["stream"] is True and sent.body["stream_options"] == {"include_usage": True}
        assert sent.body["model"] == "test-model"
        assert sent.body["messages"] == [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
        ]

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
            response, deltas = await generate(server, HELLO)
        assert deltas == [("reasoning", "think"), ("text", "answer")]
        assert response.reasoning == "think"

    run(scenario())


def test_streamed_tool_call_fragments_are_accumulated_by_index() -> None:
    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(
            chunk(
                tool_calls=[
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": ""},
                    }
                ]
            )
        )
        await x.event(
            chunk(
                tool_calls=[
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "exec", "arguments": '{"comm'},
                    }
                ]
            )
        )
        await x.event(chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"path": '}}]))
        await x.event(chunk(tool_calls=[{"index": 0, "function": {"arguments": '"a.txt"}'}}]))
        await x.event(chunk(tool_calls=[{"index": 1, "function": {"arguments": 'and": "ls"}'}}]))
        await x.event(chunk(finish="tool_calls"))
        await x.event("[DONE]")
        await x.end()

    async def scenario() -> None:
        async with FakeServer(script) as server:
            response, deltas = await generate(server, HELLO)
        assert deltas == []
        assert response.tool_calls == [
            ToolCallSpec(call_id="call_a", name="read_file", args={"path": "a.txt"}),
            ToolCallSpec(call_id="call_b", name="exec", args={"command": "ls"}),
        ]

    run(scenario())


def test_tool_call_arguments_that_are_not_json_are_kept_as_the_raw_string() -> None:
    response = parse_sse_lines(
        [
            "data: "
            + json.dumps(
                chunk(tool_calls=[{"index": 0, "id": "c", "function": {"name": "x", "arguments": "{oops"}}])
            ),
            "data: [DONE]",
        ]
    )
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
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "exec", "arguments": '{"command":"ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "exec",
                "description": "run",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]


def test_an_assistant_message_without_calls_sends_its_text() -> None:
    assert to_openai_message(Message(role="assistant", content="")) == {"role": "assistant", "content": ""}


# --- errors -------------------------------------------------------------------------------------


def test_an_http_401_becomes_a_model_error_with_the_status_and_the_error_message() -> None:
    async def script(x: Exchange) -> None:
        body = {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}
        await x.reply(401, "Unauthorized", json.dumps(body).encode())

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError) as e:
                await generate(server, HELLO)
        assert "HTTP 401" in str(e.value) and "Incorrect API key provided" in str(e.value)
        assert e.value.data["status"] == 401

    run(scenario())


def test_an_http_error_with_a_plain_text_body_shows_the_body() -> None:
    async def script(x: Exchange) -> None:
        await x.reply(502, "Bad Gateway", b"upstream exploded", "text/plain")

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError, match="HTTP 502 .*upstream exploded"):
                await generate(server, HELLO)

    run(scenario())


def test_a_data_line_that_is_not_json_is_a_malformed_stream() -> None:
    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event("{not json")
        await x.end()

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError, match="malformed stream"):
                await generate(server, HELLO)

    run(scenario())


def test_a_stream_that_ends_before_done_is_a_model_error() -> None:
    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(chunk("partial"))
        await x.end()

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError, match=r"ended before \[DONE\]"):
                await generate(server, HELLO)

    run(scenario())


def test_an_error_object_inside_the_stream_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="mid-stream: overloaded"):
        parse_sse_lines(['data: {"error": {"message": "overloaded"}}'])


def test_an_unreachable_server_is_a_model_error_naming_the_url() -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        provider = OpenAIProvider(base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
        with pytest.raises(ModelError, match=f"cannot reach http://127.0.0.1:{port}/v1/chat/completions"):
            await provider.generate(HELLO, lambda k, t: None)
        await provider.aclose()

    run(scenario())


def test_a_server_that_stops_sending_times_out_as_a_model_error() -> None:
    async def script(x: Exchange) -> None:
        await x.start_sse()
        await asyncio.sleep(5)

    async def scenario() -> None:
        async with FakeServer(script) as server:
            with pytest.raises(ModelError, match="timed out"):
                await generate(server, HELLO, timeout=0.2)

    run(scenario())


# --- cancellation and configuration ---------------------------------------------------------------


def test_cancelling_mid_stream_raises_cancelled_and_closes_the_connection() -> None:
    first_delta = asyncio.Event()
    closed = asyncio.Event()

    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(chunk("first"))
        await x.reader.read()  # returns when the client closes the connection
        closed.set()

    async def scenario() -> None:
        async with FakeServer(script) as server:
            provider = OpenAIProvider(base_url=server.base_url, api_key="k")
            task = asyncio.ensure_future(provider.generate(HELLO, lambda k, t: first_delta.set()))
            await asyncio.wait_for(first_delta.wait(), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(closed.wait(), 5)
            await provider.aclose()

    run(scenario())


def test_base_url_and_api_key_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://example.invalid/v9/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    provider = OpenAIProvider(model="m")
    assert provider.url == "http://example.invalid/v9/chat/completions"
    assert provider._headers()["Authorization"] == "Bearer sk-env"
    explicit = OpenAIProvider(base_url="http://other/v1", api_key="sk-arg")
    assert explicit.url == "http://other/v1/chat/completions"
    assert explicit._headers()["Authorization"] == "Bearer sk-arg"


def test_no_api_key_sends_no_authorization_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert "Authorization" not in OpenAIProvider(base_url="http://local/v1")._headers()


def test_make_provider_builds_openai_with_its_options() -> None:
    provider = make_provider("openai", model="m", base_url="http://h/v1", api_key="k")
    assert isinstance(provider, OpenAIProvider) and provider.model == "m"
