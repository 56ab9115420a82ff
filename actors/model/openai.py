"""An OpenAI-compatible chat-completions provider, streaming, over ``httpx.AsyncClient`` (SPEC §4).

Any endpoint that speaks ``POST {base_url}/chat/completions`` with ``stream: true`` works (OpenAI,
vLLM, llama.cpp, Ollama, OpenRouter, DeepSeek, ...). The response is Server-Sent Events: one
``data: {json}`` line per chunk, ``data: [DONE]`` at the end.

What is streamed and how it is put back together:

* ``choices[0].delta.content`` -> ``on_delta("text", ...)``;
* ``choices[0].delta.reasoning_content`` / ``.reasoning`` (DeepSeek, OpenRouter, vLLM) ->
  ``on_delta("reasoning", ...)``;
* ``choices[0].delta.tool_calls[i]`` -> accumulated by ``index``: the first fragment carries
  ``id`` and ``function.name``, later ones append to ``function.arguments``; the arguments are
  parsed as JSON at the end (kept as the raw string if they are not JSON, so the tool registry
  can tell the model what was wrong with them);
* ``usage`` (sent because we ask for ``stream_options: {include_usage: true}``).

Failures become :class:`~actors.model.base.ModelError` with a message a person can act on:
``HTTP 401 from https://…/chat/completions: Incorrect API key provided`` (the status and the
body's ``error.message``), unreachable hosts, timeouts, a stream that is not SSE JSON, an
``error`` object inside the stream, and a stream that ends before ``[DONE]``. Cancellation
(seed 002: cancel propagates to the LLM) cancels the task; leaving the ``async with`` closes
the HTTP response, so the server sees the connection go away.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import httpx
import msgspec

from eventstore.events import Message, ToolCallSpec, Usage

from .base import DeltaCallback, ModelError, ModelRequest, ModelResponse, args_json

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"

_chunk_decoder = msgspec.json.Decoder(dict[str, Any])
_json_encoder = msgspec.json.Encoder()


# --- request shape ------------------------------------------------------------------------------


def to_openai_message(message: Message) -> dict[str, Any]:
    """One of our messages in the chat-completions shape.

    Assistant tool calls carry ``function.arguments`` as a JSON *string*; tool results carry
    ``tool_call_id``. ``name`` is not sent: OpenAI restricts its characters and our names are
    display names.
    """
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.content or None}
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": args_json(call.args)},
                }
                for call in message.tool_calls
            ]
        elif out["content"] is None:
            out["content"] = ""
        return out
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    return {"role": message.role, "content": message.content}


def to_openai_tool(schema: dict[str, Any]) -> dict[str, Any]:
    """A registry schema ``{name, description, parameters}`` as an OpenAI ``function`` tool."""
    if schema.get("type") == "function":
        return schema
    function = {"name": schema["name"], "description": schema.get("description", "")}
    function["parameters"] = schema.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def request_body(request: ModelRequest, model: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of a streaming chat-completions request."""
    body: dict[str, Any] = {
        "model": request.model or model,
        "messages": [to_openai_message(m) for m in request.messages],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [to_openai_tool(t) for t in request.tools]
    if extra:
        body.update(extra)
    return body


# --- response stream ----------------------------------------------------------------------------


class _ToolCallBuffer:
    """The fragments of one streamed tool call, by its ``index``."""

    __slots__ = ("arguments", "call_id", "name")

    def __init__(self) -> None:
        self.call_id = ""
        self.name = ""
        self.arguments: list[str] = []

    def add(self, fragment: dict[str, Any]) -> None:
        if fragment.get("id"):
            self.call_id = str(fragment["id"])
        function = fragment.get("function") or {}
        if function.get("name") and not self.name:
            # Some servers repeat the name in every fragment; the first one is the name.
            self.name = str(function["name"])
        if function.get("arguments"):
            self.arguments.append(str(function["arguments"]))

    def finish(self, index: int) -> ToolCallSpec:
        if not self.name:
            raise ModelError(f"malformed stream: tool call {index} has no function name")
        raw = "".join(self.arguments)
        args: Any = {}
        if raw.strip():
            try:
                args = msgspec.json.decode(raw)
            except (msgspec.DecodeError, RecursionError):  # msgspec gives up around 1,000 levels
                args = raw  # the registry reports invalid JSON arguments to the model
        return ToolCallSpec(call_id=self.call_id or f"call_{index}", name=self.name, args=args)


class StreamState:
    """Accumulates one streamed answer from SSE chunks (pure: no I/O, testable alone)."""

    def __init__(self, on_delta: DeltaCallback) -> None:
        self.on_delta = on_delta
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, _ToolCallBuffer] = {}
        self.usage = Usage()
        self.model = ""
        self.finished = False  # a finish_reason was seen
        self.done = False  # [DONE] was seen

    def feed_line(self, line: str) -> None:
        """Take one line of the SSE body; raises ModelError for malformed data."""
        if not line.startswith("data:"):
            return  # blank separators, comments (":"), "event:" and "id:" lines
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.done = True
            return
        try:
            chunk = _chunk_decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ModelError(
                f"malformed stream: a data line is not a JSON object ({e}): {payload[:200]!r}"
            ) from e
        self.feed_chunk(chunk)

    def feed_chunk(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            raise ModelError(f"the model reported an error mid-stream: {_error_message(chunk)}")
        if chunk.get("model"):
            self.model = str(chunk["model"])
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = Usage(
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
            )
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._feed_choice(choice)

    def _feed_choice(self, choice: dict[str, Any]) -> None:
        if choice.get("finish_reason"):
            self.finished = True
        delta = choice.get("delta") or {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning.append(reasoning)
            self.on_delta("reasoning", reasoning)
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.text.append(content)
            self.on_delta("text", content)
        for fragment in delta.get("tool_calls") or []:
            index = int(fragment.get("index", len(self.calls)))
            self.calls.setdefault(index, _ToolCallBuffer()).add(fragment)

    def response(self, provider: str, model: str) -> ModelResponse:
        """The whole answer; raises ModelError if the stream ended early."""
        if not (self.done or self.finished):
            raise ModelError("malformed stream: it ended before [DONE]")
        calls = [self.calls[i].finish(i) for i in sorted(self.calls)]
        return ModelResponse(
            text="".join(self.text),
            reasoning="".join(self.reasoning),
            tool_calls=calls,
            usage=self.usage,
            model=self.model or model,
            provider=provider,
        )


def _error_message(body: Any) -> str:
    """The human message of an OpenAI-style error body (``{"error": {"message": ...}}``)."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if body.get("message"):
            return str(body["message"])
    return str(body)[:500]


def http_error(status: int, url: str, body: bytes) -> ModelError:
    """A ModelError for a non-2xx reply: the status and the body's error message."""
    try:
        message = _error_message(msgspec.json.decode(body))
    except msgspec.DecodeError:
        message = body.decode("utf-8", "replace").strip()[:500] or "(empty body)"
    return ModelError(f"HTTP {status} from {url}: {message}", status=status)


# --- the provider -------------------------------------------------------------------------------


class OpenAIProvider:
    """Streams chat completions from an OpenAI-compatible endpoint.

    ``base_url`` and ``api_key`` default to ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``. ``timeout``
    bounds connecting and each wait for the next chunk, not the whole answer. ``client`` lets the
    caller share an ``httpx.AsyncClient``; otherwise one is created per event loop and closed by
    :meth:`aclose`. ``extra_body`` is merged into every request (``temperature``, ...).
    """

    name = "openai"

    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        client: httpx.AsyncClient | None = None,
        extra_body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.model = model or os.environ.get("OPENAI_MODEL") or DEFAULT_MODEL
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout = timeout
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self._client = client
        self._own_client: httpx.AsyncClient | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", **self.headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _http(self) -> httpx.AsyncClient:
        """The client to use: the caller's, or ours for the running loop (clients are loop-bound)."""
        if self._client is not None:
            return self._client
        loop = asyncio.get_running_loop()
        if self._own_client is None or self._own_loop is not loop or self._own_client.is_closed:
            timeout = httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0))
            self._own_client = httpx.AsyncClient(timeout=timeout)
            self._own_loop = loop
        return self._own_client

    async def aclose(self) -> None:
        """Close the client this provider created (not one passed in)."""
        if self._own_client is not None:
            await self._own_client.aclose()
            self._own_client = None

    async def generate(self, request: ModelRequest, on_delta: DeltaCallback) -> ModelResponse:
        """One streamed completion; raises ModelError on HTTP, network or stream errors."""
        body = _json_encoder.encode(request_body(request, self.model, self.extra_body))
        headers = {**self._headers(), "Content-Type": "application/json"}
        state = StreamState(on_delta)
        try:
            async with self._http().stream("POST", self.url, content=body, headers=headers) as reply:
                if reply.status_code >= 400:
                    raise http_error(reply.status_code, self.url, await reply.aread())
                await self._consume(reply, state)
        except httpx.TimeoutException as e:
            raise ModelError(
                f"timed out talking to {self.url} ({type(e).__name__})", timeout=self.timeout
            ) from e
        except httpx.HTTPError as e:
            raise ModelError(f"cannot reach {self.url}: {type(e).__name__}: {e}") from e
        return state.response(self.name, request.model or self.model)

    @staticmethod
    async def _consume(reply: httpx.Response, state: StreamState) -> None:
        async for line in reply.aiter_lines():
            state.feed_line(line)
            if state.done:
                break


def parse_sse_lines(lines: Sequence[str], on_delta: DeltaCallback | None = None) -> ModelResponse:
    """Fold complete SSE lines into a response, without I/O (used by tests and tools)."""
    state = StreamState(on_delta or (lambda kind, text: None))
    for line in lines:
        state.feed_line(line)
        if state.done:
            break
    return state.response("openai", "")


def openai_provider(*, base_url: str, model: str, api_key: str, vision: bool = False,
                    limits: Any = None) -> OpenAIProvider:
    """The provider of one configured model (:mod:`actors.model.registry` calls only this, with
    plain arguments, so the constructor may change without the registry changing).

    ``api_key`` "" sends no key (a local endpoint). ``vision`` and ``limits`` (an object with
    ``max_concurrency``, ``rpm``, ``tpm``, each None or an int) are accepted for the provider to
    honour; this constructor does not take them yet.
    """
    return OpenAIProvider(model=model, base_url=base_url, api_key=api_key)
