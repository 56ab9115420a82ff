"""An OpenAI-compatible chat-completions provider on the official ``openai`` SDK.

Any endpoint that speaks ``POST {base_url}/chat/completions`` with ``stream: true`` works (OpenAI,
vLLM, llama.cpp, Ollama, OpenRouter, DeepSeek, ...). The SDK (``AsyncOpenAI(base_url=...)``) does
the HTTP (its connection pool, timeouts, auth headers), the Server-Sent Events, ``[DONE]``, the
error replies (``APIStatusError`` and kin) and closing the response; this module shapes the
request, folds the chunks into one answer (:class:`StreamState`, no I/O), and owns what the SDK
does not do for us.

Why the chunks are plain dicts, not the SDK's typed ``ChatCompletionChunk``: the request goes
through ``client.post("/chat/completions", cast_to=object, stream=True, stream_cls=AsyncStream)``
(the SDK's documented way to call an endpoint directly; ``chat.completions.create`` is the same
request with ``cast_to=ChatCompletionChunk``). The SDK builds each typed chunk with its own
non-validating ``construct``, which walks the model's fields in Python: measured 450-1,000 µs a
chunk here (``benchmarks/bench_models.py`` prints it beside ``json.loads``' ~15 µs), so at 50
chunks an answer the typed chunks cost more CPU than all the rest of a turn. And a typed chunk is
not a checked one (a ``content`` of ``7`` stays ``7``), so :class:`StreamState` checks every field
it reads either way.

* **Retries we can see.** The SDK's own retries (``max_retries``) are turned off (``0``): they
  happen inside ``create()`` with nothing but a log line, so a retry could not be recorded as a
  fact of the step (``llm.retried``) nor counted by status, and they stop at the response headers,
  so a stream that breaks after its first chunk (a 500 mid-stream, a lost connection) is never
  retried. Our loop is tenacity's (:class:`tenacity.AsyncRetrying`): at most
  ``RetryPolicy.attempts`` attempts, none starting later than ``RetryPolicy.total_s`` after the
  first (``stop_before_delay``), waiting the server's ``Retry-After`` (``retry-after-ms``, seconds,
  or an HTTP date, as the SDK reads them) or else exponential backoff with full jitter
  (``wait_random_exponential``). Retried: HTTP 408, 409, 429 and 5xx, timeouts, connection errors
  (before or during the stream), an ``error`` object inside the stream that does not name a
  client error, and a stream that ends before its ``finish_reason``. Not retried: other 4xx, a
  chunk that is not JSON or not of the chunk shape. Before each wait, ``on_delta.retrying`` is
  told (:func:`~actors.model.base.announce_retry`), so the session records the retry and restarts
  the items it streamed.
* **Limits.** Each attempt holds a slot of the provider's :class:`~actors.model.limits.Limiter`
  (concurrency, requests and tokens per minute) while its request is open; the wait for a slot is
  an ``await``, so ``turn/abort`` ends it.
* **Cancellation** (cancelling a turn reaches the model call): the task is cancelled; leaving
  ``async with stream`` closes the HTTP response, so the server sees the connection go away at
  once.

What is streamed and how it is put back together:

* ``choices[0].delta.content`` -> ``on_delta("text", ...)``;
* ``choices[0].delta.reasoning_content`` / ``.reasoning`` (DeepSeek, OpenRouter, vLLM) ->
  ``on_delta("reasoning", ...)``;
* ``choices[0].delta.tool_calls[i]`` -> accumulated by ``index``: the first fragment carries
  ``id`` and ``function.name`` (announced at once: ``on_delta.tool_call(id, name)``, for the
  ``generating`` tool card), later ones append to ``function.arguments``; the arguments are parsed as
  JSON at the end (kept as the raw string if they are not JSON, so the tool registry can tell the
  model what was wrong with them);
* ``usage`` (sent because we ask for ``stream_options: {include_usage: true}``) is the answer's
  usage; an endpoint that sends none gets the mock's estimate (characters / 4).

Failures become :class:`~actors.model.base.ModelError` with a message a person can act on:
``HTTP 401 from https://…/chat/completions: Incorrect API key provided`` (the status and the
body's ``error.message``), unreachable hosts, timeouts, a malformed chunk, an error inside the
stream. The API key never appears in one: a server that echoes it gets it replaced.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import logging
import math
import os
import time
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import msgspec
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
)
from tenacity.wait import wait_random_exponential

from sessionloop.actors.events import Message, ToolCallSpec, Usage
from sessionloop.actors.model.base import (
    DeltaCallback,
    ModelAttachment,
    ModelError,
    ModelRequest,
    ModelResponse,
    RetryNotice,
    announce_retry,
    announce_tool_call,
    args_json,
    content_chars,
    error_message,
    estimated_usage,
)
from sessionloop.actors.model.limits import CallStats, Limiter, ModelLimits, RetryPolicy
from sessionloop.protocol.limits import MAX_NESTING
from sessionloop.protocol.nesting import nests_deeper

if TYPE_CHECKING:
    import openai


def _sdk_module() -> ModuleType:
    """The ``openai`` SDK, imported when a provider first needs it: it (with pydantic) takes about a
    second to import, which a server on the mock model must not pay at every start."""
    import openai  # noqa: PLC0415 - a heavy third-party import, on demand

    return openai

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "OpenAIProvider",
    "StreamState",
    "request_body",
    "response_from_chunks",
    "to_openai_message",
    "to_openai_tool",
]

log = logging.getLogger("sessionloop.model")

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"
DEFAULT_MODEL: Final = "gpt-4o-mini"
#: The SDK refuses to start without a key; an endpoint that needs none gets no Authorization
#: header at all (``extra_headers`` omits it), whatever this placeholder is.
_NO_KEY: Final = "sessionloop-no-key"
#: HTTP statuses worth another attempt (the SDK's own list: request timeout, lock timeout, rate
#: limit, and every server error).
_RETRY_STATUSES: Final = frozenset({408, 409, 429})
#: Words in an in-stream error's ``type``/``code`` that mean the request itself is wrong.
_CLIENT_ERROR_WORDS: Final = ("invalid", "not_found", "permission", "authentication", "context_length")
_MAX_QUOTED: Final = 200  # characters of a bad chunk quoted in an error


# --- request shape ------------------------------------------------------------------------------


def to_openai_message(message: Message, attachments: Sequence[ModelAttachment] = (),
                      vision: bool = False) -> dict[str, Any]:
    """One of our messages in the chat-completions shape.

    Assistant tool calls carry ``function.arguments`` as a JSON *string*; tool results carry
    ``tool_call_id``. ``name`` is not sent: OpenAI restricts its characters and our names are
    display names. A user message with ``attachments`` becomes content parts: its text, then each
    image as an ``image_url`` part with a ``data:`` URL when the model has ``vision``; other files
    (and images for a model without vision) are named in the text instead.
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
    if attachments:
        return {"role": message.role, "content": content_parts(message.content, attachments, vision)}
    return {"role": message.role, "content": message.content}


def content_parts(text: str, attachments: Sequence[ModelAttachment], vision: bool) -> list[dict[str, Any]]:
    """A message's text and files as chat-completions content parts."""
    notes: list[str] = []
    images: list[dict[str, Any]] = []
    for a in attachments:
        if vision and a.kind == "image" and a.mime.startswith("image/"):
            url = f"data:{a.mime};base64,{base64.b64encode(a.data).decode('ascii')}"
            images.append({"type": "image_url", "image_url": {"url": url}})
        elif a.kind == "image":
            notes.append(f"[image {a.name} ({a.mime}, {len(a.data)} bytes): this model does not see images]")
        else:
            notes.append(f"[file {a.name} ({a.mime}, {len(a.data)} bytes): not shown to the model]")
    body = "\n".join([text, *notes]) if text else "\n".join(notes)
    parts: list[dict[str, Any]] = [{"type": "text", "text": body}] if body else []
    return parts + images


def to_openai_tool(schema: dict[str, Any]) -> dict[str, Any]:
    """A registry schema ``{name, description, parameters}`` as an OpenAI ``function`` tool."""
    if schema.get("type") == "function":
        return schema
    function = {"name": schema["name"], "description": schema.get("description", "")}
    function["parameters"] = schema.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def request_body(request: ModelRequest, model: str, extra: dict[str, Any] | None = None,
                 vision: bool = False) -> dict[str, Any]:
    """The JSON body of a streaming chat-completions request (also the ``create()`` keywords)."""
    attachments = request.attachments
    body: dict[str, Any] = {
        "model": request.model or model,
        "messages": [to_openai_message(m, attachments.get(i, ()), vision) for i, m in enumerate(request.messages)],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [to_openai_tool(t) for t in request.tools]
    if extra:
        body.update(extra)
    return body


# --- response stream ----------------------------------------------------------------------------


def _malformed(what: str, value: Any) -> ModelError:
    return ModelError(f"malformed stream: {what}, got {str(value)[:_MAX_QUOTED]!r}", cause="stream",
                      retryable=False)


def _text(value: Any, what: str) -> str:
    if value is None or type(value) is str:
        return value or ""
    raise _malformed(f"{what} is not a string", value)


def _count(value: Any) -> int:
    """A token count as the endpoint sent it; anything but an integer counts as 0 (the store
    clamps huge ones, ``actors/model/storable.py``)."""
    return value if type(value) is int else 0


class _ToolCallBuffer:
    """The fragments of one streamed tool call, by its ``index``."""

    __slots__ = ("arguments", "call_id", "name", "announced")

    def __init__(self) -> None:
        self.call_id = ""
        self.name = ""
        self.arguments: list[str] = []
        self.announced = False

    def add(self, fragment: dict[str, Any]) -> None:
        call_id = _text(fragment.get("id"), "a tool call's id")
        if call_id and not self.call_id:
            self.call_id = call_id  # the first id is the call's; some servers repeat it
        function = fragment.get("function")
        if function is None:
            return
        if type(function) is not dict:
            raise _malformed("a tool call's function is not an object", function)
        name = _text(function.get("name"), "a tool call's name")
        if name and not self.name:
            self.name = name  # some servers repeat the name in every fragment
        arguments = _text(function.get("arguments"), "a tool call's arguments")
        if arguments:
            self.arguments.append(arguments)

    def finish(self, index: int) -> ToolCallSpec:
        if not self.name:
            raise ModelError(f"malformed stream: tool call {index} has no function name", cause="stream",
                             retryable=False)
        raw = "".join(self.arguments)
        args: Any = {}
        if raw.strip():
            try:
                # too deep: kept as text, whatever msgspec's own limit on this Python (protocol/nesting.py)
                args = raw if nests_deeper(raw, MAX_NESTING) else msgspec.json.decode(raw)
            except (msgspec.DecodeError, RecursionError):
                args = raw  # the registry reports invalid JSON arguments to the model
        return ToolCallSpec(call_id=self.call_id or f"call_{index}", name=self.name, args=args)


class StreamState:
    """Accumulates one streamed answer from its chunks (pure: no I/O, testable alone).

    ``feed_chunk`` takes a chunk as the JSON object it is (a typed SDK chunk is turned into one);
    it raises :class:`ModelError` for a chunk of the wrong shape or an ``error`` object. Plain
    dicts, checked field by field, because this runs for every chunk of every answer.
    """

    def __init__(self, on_delta: DeltaCallback) -> None:
        self.on_delta = on_delta
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, _ToolCallBuffer] = {}
        self.usage: Usage | None = None  # None: the endpoint sent none
        self.model = ""
        self.finished = False  # a finish_reason was seen
        self.chunks = 0

    def feed_chunk(self, chunk: Any) -> None:
        if type(chunk) is not dict:
            import pydantic  # noqa: PLC0415 - loaded with the SDK that made the chunk (a rare, typed one)

            if not isinstance(chunk, pydantic.BaseModel):
                raise _malformed("a chunk is not a JSON object", chunk)
            chunk = chunk.model_dump(exclude_unset=True)
        self.chunks += 1
        if chunk.get("error"):
            raise _stream_error(chunk["error"])
        model = chunk.get("model")
        if model and type(model) is str:
            self.model = model
        usage = chunk.get("usage")
        if usage is not None:
            if type(usage) is not dict:
                raise _malformed("usage is not an object", usage)
            self.usage = Usage(prompt_tokens=_count(usage.get("prompt_tokens")),
                               completion_tokens=_count(usage.get("completion_tokens")))
        choices = chunk.get("choices")
        if choices is None:
            return
        if type(choices) is not list:
            raise _malformed("choices is not a list", choices)
        for choice in choices:
            if type(choice) is not dict:
                raise _malformed("a choice is not an object", choice)
            if not choice.get("index"):  # choice 0 (or no index): the answer
                self._feed_choice(choice)

    def _feed_choice(self, choice: dict[str, Any]) -> None:
        if choice.get("finish_reason"):
            self.finished = True
        delta = choice.get("delta")
        if delta is None:
            return
        if type(delta) is not dict:
            raise _malformed("a delta is not an object", delta)
        content = delta.get("content")
        if content and type(content) is str:  # the common chunk, first
            self.text.append(content)
            self.on_delta("text", content)
        elif content is not None:
            _text(content, "content")
        if len(delta) > 1 or content is None:
            self._feed_rest(delta)

    def _feed_rest(self, delta: dict[str, Any]) -> None:
        reasoning = _text(delta.get("reasoning_content") or delta.get("reasoning"), "reasoning")
        if reasoning:
            self.reasoning.append(reasoning)
            self.on_delta("reasoning", reasoning)
        fragments = delta.get("tool_calls")
        if fragments is None:
            return
        if type(fragments) is not list:
            raise _malformed("tool_calls is not a list", fragments)
        for fragment in fragments:
            self._feed_fragment(fragment)

    def _feed_fragment(self, fragment: Any) -> None:
        if type(fragment) is not dict:
            raise _malformed("a tool call fragment is not an object", fragment)
        index = fragment.get("index")
        if index is None:
            index = len(self.calls)
        if type(index) is not int or not 0 <= index < 1024:
            raise _malformed("a tool call's index is not an integer from 0 to 1023", index)
        buffer = self.calls.setdefault(index, _ToolCallBuffer())
        buffer.add(fragment)
        if buffer.call_id and buffer.name and not buffer.announced:
            buffer.announced = True  # the tool card is pushed as soon as the name is known
            announce_tool_call(self.on_delta, buffer.call_id, buffer.name)

    def response(self, provider: str, model: str, request: ModelRequest | None = None) -> ModelResponse:
        """The whole answer; raises ModelError if the stream ended before the answer did."""
        if not self.finished and self.usage is None:
            raise ModelError("the stream ended before the answer was finished (no finish_reason)",
                             cause="stream", retryable=True)
        calls = [self.calls[i].finish(i) for i in sorted(self.calls)]
        text, reasoning = "".join(self.text), "".join(self.reasoning)
        usage = self.usage
        if usage is None:  # finished, and the endpoint ignored include_usage
            usage = estimated_usage(request, text, reasoning, calls) if request is not None else Usage()
        return ModelResponse(text=text, reasoning=reasoning, tool_calls=calls, usage=usage,
                             model=self.model or model, provider=provider)


def response_from_chunks(chunks: Sequence[Any], on_delta: DeltaCallback | None = None,
                         request: ModelRequest | None = None) -> ModelResponse:
    """Fold chunks (typed or dicts) into a response, without I/O (tests and tools)."""
    state = StreamState(on_delta or (lambda kind, text: None))
    for chunk in chunks:
        state.feed_chunk(chunk)
    return state.response("openai", "", request)


# --- errors -------------------------------------------------------------------------------------


def _stream_error(error: Any) -> ModelError:
    """An ``error`` object inside the stream: retried unless it names a client error."""
    message = error_message({"error": error})
    code = error.get("code") if type(error) is dict else None
    kind = error.get("type") if type(error) is dict else None
    status = code if type(code) is int else 0
    if isinstance(code, str) and code.isdigit():
        status = int(code)
    words = f"{kind or ''} {code or ''}".lower()
    client = (400 <= status < 500 and status not in _RETRY_STATUSES) or any(w in words for w in _CLIENT_ERROR_WORDS)
    return ModelError(f"the model reported an error mid-stream: {message}", status=status, cause="stream",
                      retryable=not client)


def retry_after_s(headers: Any) -> float | None:
    """The wait a reply asks for: ``retry-after-ms``, else ``retry-after`` in seconds or as an
    HTTP date (as the SDK reads them); None when there is none or it is not a number."""
    if headers is None:
        return None
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue
        return seconds if math.isfinite(seconds) else None
    value = headers.get("retry-after")
    if value:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return None


def _retryable(error: BaseException) -> bool:
    return isinstance(error, ModelError) and bool(error.data.get("retryable"))


# --- the provider -------------------------------------------------------------------------------


class OpenAIProvider:
    """Streams chat completions from an OpenAI-compatible endpoint; constructible from plain
    arguments (a model registry builds one per configured model).

    ``model``, ``base_url`` and ``api_key`` default to ``OPENAI_MODEL`` / ``OPENAI_BASE_URL`` /
    ``OPENAI_API_KEY``; no key at all sends no ``Authorization`` header (a local server).
    ``timeout`` bounds connecting (at most 10 s) and each wait for the next chunk, not the whole
    answer. ``limits`` are this model's concurrency and budgets, ``retry`` its retry policy,
    ``vision`` whether it takes images. ``extra_body`` is merged into every request
    (``temperature``, ...); ``headers`` are sent with every request; ``label`` names the model
    in ``/metrics`` (default: the model name).
    """

    name = "openai"

    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        limits: ModelLimits | None = None,
        retry: RetryPolicy | None = None,
        vision: bool = False,
        extra_body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        label: str | None = None,
    ) -> None:
        self.model = model or os.environ.get("OPENAI_MODEL") or DEFAULT_MODEL
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        if not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"timeout must be a number of seconds > 0, not {timeout!r}")
        self.timeout = float(timeout)
        self.limits = limits if limits is not None else ModelLimits()
        self.retry = retry if retry is not None else RetryPolicy()
        self.vision = vision
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self.label = label or self.model
        self.stats = CallStats()
        self.limiter = Limiter(self.limits, stats=self.stats)
        self._client: openai.AsyncOpenAI | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        # per request: no key -> no Authorization header (the SDK would send its placeholder)
        self._options: Any = {} if self.api_key else {"headers": {"Authorization": _sdk_module().Omit()}}

    def __repr__(self) -> str:  # never the key
        return f"OpenAIProvider(model={self.model!r}, base_url={self.base_url!r})"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _sdk(self) -> openai.AsyncOpenAI:
        """The SDK client for the running loop (its connection pool is bound to one loop)."""
        loop = asyncio.get_running_loop()
        client = self._client
        if client is None or self._client_loop is not loop or client.is_closed():
            sdk = _sdk_module()
            client = self._client = sdk.AsyncOpenAI(
                api_key=self.api_key or _NO_KEY, base_url=self.base_url, max_retries=0,
                timeout=sdk.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                default_headers=self.headers or None)
            self._client_loop = loop
        return client

    async def aclose(self) -> None:
        """Close the SDK client (its connections)."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def generate(self, request: ModelRequest, on_delta: DeltaCallback) -> ModelResponse:
        """One streamed completion, retried per :attr:`retry`; raises ModelError when it fails
        (after the last attempt), CancelledError when cancelled."""
        body = request_body(request, self.model, self.extra_body, vision=self.vision)
        estimate = content_chars(request.messages) // 4 + 1
        policy = self.retry
        retrying = AsyncRetrying(
            stop=stop_after_attempt(policy.attempts) | stop_before_delay(policy.total_s),
            wait=self._wait, retry=retry_if_exception(_retryable), reraise=True,
            before_sleep=lambda state: self._before_sleep(state, on_delta))
        try:
            return await retrying(self._attempt, request, body, estimate, on_delta)
        except ModelError as e:
            attempts = retrying.statistics.get("attempt_number", 1)
            if attempts > 1:
                raise ModelError(f"{e} (gave up after {attempts} attempts)", **e.data) from e
            raise

    # --- one attempt ----------------------------------------------------------------------------

    async def _attempt(self, request: ModelRequest, body: dict[str, Any], estimate: int,
                       on_delta: DeltaCallback) -> ModelResponse:
        state = StreamState(on_delta)
        client = self._sdk()
        openai = _sdk_module()  # the module the except clauses below name
        async with self.limiter.slot(estimate) as slot:
            try:
                # ``client.post`` is the SDK's documented way to a raw endpoint; ``cast_to=object``
                # keeps each chunk the dict its JSON is (see the module docstring: typed chunks
                # cost more CPU than everything else of a turn)
                stream = await client.post("/chat/completions", body=body, cast_to=object, stream=True,
                                           stream_cls=openai.AsyncStream[object], options=self._options)
                async with stream:
                    async for chunk in stream:
                        state.feed_chunk(chunk)
            except ModelError as e:  # a malformed chunk, quoted: the endpoint may have echoed the key
                raise self._redacted(e) from None
            except openai.APIStatusError as e:
                raise self._status_error(e) from None
            except openai.APITimeoutError as e:
                raise ModelError(self._redact(f"timed out talking to {self.url}: no data for {self.timeout:g} s"),
                                 cause="timeout", retryable=True, timeout=self.timeout) from e
            except openai.APIConnectionError as e:
                raise self._connection_error(e, state) from e
            except openai.APIError as e:  # an ``error`` object in the stream (the SDK raises it)
                raise self._redacted(_stream_error(e.body if e.body is not None else e.message)) from e
            except openai.OpenAIError as e:
                raise ModelError(self._redact(f"the model call to {self.url} failed: {e}"), cause="client",
                                 retryable=False) from e
            except (ValueError, RecursionError) as e:  # a data line that is not JSON (json.loads)
                doc = getattr(e, "doc", "")
                raise ModelError(self._redact(f"malformed stream: a data line is not JSON ({type(e).__name__}): "
                                              f"{str(doc)[:_MAX_QUOTED]!r}"), cause="stream", retryable=False) from e
            response = state.response(self.name, request.model or self.model, request)
            slot.release(response.usage.prompt_tokens + response.usage.completion_tokens)
        return response

    def _status_error(self, e: openai.APIStatusError) -> ModelError:
        status = e.status_code
        message = error_message(e.body if e.body is not None else e.response.text)
        wait = retry_after_s(e.response.headers)
        retryable = status in _RETRY_STATUSES or status >= 500
        return ModelError(self._redact(f"HTTP {status} from {self.url}: {message}"), status=status, cause="http",
                          retryable=retryable, retry_after=wait)

    def _connection_error(self, e: openai.APIConnectionError, state: StreamState) -> ModelError:
        cause = e.__cause__ or e
        detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        if state.chunks:
            text = f"lost the connection to {self.url} after {state.chunks} chunks: {detail}"
        else:
            text = f"cannot reach {self.url}: {detail}"
        return ModelError(self._redact(text), cause="connection", retryable=True)

    def _redact(self, text: str) -> str:
        """``text`` without the API key (a server may echo it in an error)."""
        key = self.api_key
        return text.replace(key, "[redacted]") if key and len(key) >= 4 else text

    def _redacted(self, error: ModelError) -> ModelError:
        return ModelError(self._redact(str(error)), **error.data)

    # --- retries --------------------------------------------------------------------------------

    def _wait(self, state: RetryCallState) -> float:
        """The pause before the next attempt: the server's Retry-After, else backoff with jitter."""
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        hinted = error.data.get("retry_after") if isinstance(error, ModelError) else None
        if isinstance(hinted, int | float):
            return max(0.0, float(hinted))
        policy = self.retry
        backoff = wait_random_exponential(multiplier=policy.base_s, max=policy.max_wait_s)
        return float(backoff(state))

    def _before_sleep(self, state: RetryCallState, on_delta: DeltaCallback) -> None:
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        data = error.data if isinstance(error, ModelError) else {}
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        notice = RetryNotice(attempt=state.attempt_number, status=int(data.get("status") or 0),
                             cause=str(data.get("cause") or "http"), wait_ms=int(wait * 1000),
                             error=str(error) if error is not None else "")
        self.stats.retried(notice.label)
        log.info("model %s: attempt %d failed (%s); trying again in %d ms", self.label, notice.attempt,
                 notice.error, notice.wait_ms)
        announce_retry(on_delta, notice)


def openai_provider(*, base_url: str, model: str, api_key: str, vision: bool = False,
                    limits: ModelLimits | None = None, label: str | None = None) -> OpenAIProvider:
    """The provider of one configured model (:mod:`actors.model.registry` calls only this, with
    plain arguments, so the constructor may change without the registry changing). ``api_key``
    "" sends no key (a local endpoint); ``label`` names the model in ``/metrics``."""
    return OpenAIProvider(model=model, base_url=base_url, api_key=api_key, vision=vision, limits=limits,
                          label=label)
