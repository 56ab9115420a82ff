"""The model-provider interface: one async ``generate`` call per agent step.

Why asyncio and not an actor: no actor handler may block its mailbox, so every model call runs on
one shared asyncio loop and its result comes back to the session actor as a message. A provider
therefore never touches actor state; it gets a :class:`ModelRequest` (the *projected* messages,
context trimming: only the copy sent to the model is trimmed, never the log) and returns a
:class:`ModelResponse`, streaming deltas through ``on_delta(kind, text)`` while it works
(``llm.delta`` flows to subscribers live, it is never persisted).

Cancellation is asyncio task cancellation (cancelling a turn aborts its model call too): a
provider must let :class:`asyncio.CancelledError`
through promptly and must never turn it into a :class:`ModelError`.

Besides text, a streaming provider may report two facts to ``on_delta`` when it has them, through
optional methods of the callback object (a plain function has neither, and they are skipped):
``on_delta.tool_call(call_id, name)`` as soon as a streamed tool call's name is known (the tool
card shows ``generating`` while the arguments stream), and
``on_delta.retrying(notice)`` when an attempt failed and the call will be tried again after
``notice.wait_ms`` (a :class:`RetryNotice`; the session records it as ``llm.retried`` and restarts
the streamed items). Call :func:`announce_tool_call` / :func:`announce_retry`, not the methods.

Errors::

    SessionloopError (eventstore.errors)
    └── ModelError                 a model call failed; the message is shown to the user
        └── ReplayDivergence       (replay.py) a rerun asked for a call the recording lacks
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from sessionloop.actors.events import Message, ToolCallSpec, Usage
from sessionloop.eventstore.errors import SessionloopError

#: ``on_delta(kind, text)``: ``kind`` is ``"text"`` or ``"reasoning"``.
DeltaKind = Literal["text", "reasoning"]
DeltaCallback = Callable[[str, str], None]

#: Provider names :func:`make_provider` knows.
PROVIDER_NAMES: tuple[str, ...] = ("mock", "scripted", "replay", "openai")

_json_encoder = msgspec.json.Encoder()


class ModelAttachment(msgspec.Struct, frozen=True, kw_only=True):
    """A file that goes to the model with a message: its bytes, already read from the blob store.

    ``kind`` is the item kind (``image``, ``audio``, ``video``, ``file``), ``mime`` the sniffed
    type (``actors/system/blobs.py``). A vision model gets an image as an ``image_url`` content part (a
    ``data:`` URL); anything else is named in the text, so the model knows it is there.
    """

    name: str
    kind: str
    mime: str
    data: bytes


class HistoryTally(msgspec.Struct, frozen=True, gc=False):
    """Counts over a request's messages that would otherwise be recounted over the whole history on
    every model call: content characters (the mock's prompt-token basis), tool calls (the mock numbers
    its calls after them) and messages with attachments. When a request carries one, it is exact for
    its ``messages`` (the session keeps the counts as its history grows: ``SessionState``)."""

    chars: int = 0
    tool_calls: int = 0
    attachments: int = 0


def tally_of(messages: Sequence[Message]) -> HistoryTally:
    """The counts of ``messages``, counted."""
    return HistoryTally(chars=content_chars(messages), tool_calls=sum(len(m.tool_calls) for m in messages),
                        attachments=sum(1 for m in messages if m.attachments))


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What one agent step sends to the model (the default loop's messages and tool schemas).

    ``tools`` are the registry's schemas, ``{"name", "description", "parameters"}`` each
    (see :meth:`actors.tools.registry.ToolRegistry.schemas`); ``model`` overrides the
    provider's default model name when set. ``attachments[i]`` are the files of
    ``messages[i]`` (a user message), indexed in this very list (after trimming), bytes read.
    """

    messages: Sequence[Message]
    tools: list[dict[str, Any]] = []
    model: str | None = None
    attachments: dict[int, list[ModelAttachment]] = {}
    #: exact counts over ``messages`` when the sender kept them (None: count them)
    tally: HistoryTally | None = None

    def counts(self) -> HistoryTally:
        """The request's counts: the tally it carries, else counted over its messages."""
        return self.tally if self.tally is not None else tally_of(self.messages)


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True):
    """A model call's whole answer; the actor records it as ``llm.completed``."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallSpec] = []
    usage: Usage = Usage()
    model: str = ""
    provider: str = ""


class ModelError(SessionloopError):
    """A model call failed (HTTP error, malformed stream, ``!error`` in the mock, ...).

    The message is meant for people: the session records it in ``llm.failed`` and the turn
    fails with it. Structured details (``status``, ``expected``, ``got``) go in ``data``.
    """

    code = "model-error"


class RetryNotice(msgspec.Struct, frozen=True, kw_only=True):
    """One failed attempt of a model call that will be tried again (``llm.retried``).

    ``attempt`` is the 1-based number of the attempt that failed; ``status`` its HTTP status (0
    when there was none: a timeout, a connection error, an error inside the stream); ``cause``
    one of ``http``, ``timeout``, ``connection``, ``stream``; ``wait_ms`` the pause before the next
    attempt (the server's ``Retry-After`` when it sent one, else exponential backoff with jitter);
    ``error`` the sentence of the failure (no secret in it).
    """

    attempt: int
    status: int = 0
    cause: str = "http"
    wait_ms: int = 0
    error: str = ""

    @property
    def label(self) -> str:
        """The metrics label of the failure: the status, or the cause when there was none."""
        return str(self.status) if self.status else self.cause


@runtime_checkable
class Provider(Protocol):
    """A model provider. Implementations: mock, scripted, replay, openai.

    ``generate`` promises: deltas are reported through ``on_delta`` in order, synchronously on
    the loop that runs the call; the returned response's ``text`` and ``reasoning`` equal the
    concatenation of the deltas of each kind; failures raise :class:`ModelError`;
    cancellation raises :class:`asyncio.CancelledError` promptly.

    A provider whose answer can be complete at once (the mock) may also offer
    ``answer_now(request, on_delta) -> ModelResponse | None``: the answer in place, or None when
    the call must wait. It reports the same deltas as ``generate`` (a session delivers them after
    the commit that records the step, see ``actors/session/actor.py``), never fewer.
    """

    name: str

    async def generate(self, request: ModelRequest, on_delta: DeltaCallback) -> ModelResponse: ...


def error_message(body: Any) -> str:
    """The human message of an OpenAI-style error body (``{"error": {"message": ...}}``)."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if body.get("message"):
            return str(body["message"])
    if isinstance(body, str):
        return body.strip()[:500] or "(empty body)"
    return str(body)[:500]


def ignore_delta(kind: str, text: str) -> None:
    """An ``on_delta`` for callers that do not stream (summaries, tests)."""


def announce_tool_call(on_delta: DeltaCallback, call_id: str, name: str) -> None:
    """Tell ``on_delta`` that a streamed tool call's name is known (if it listens for that)."""
    listener = getattr(on_delta, "tool_call", None)
    if listener is not None:
        listener(call_id, name)


def announce_retry(on_delta: DeltaCallback, notice: RetryNotice) -> None:
    """Tell ``on_delta`` that the call is tried again (if it listens for that)."""
    listener = getattr(on_delta, "retrying", None)
    if listener is not None:
        listener(notice)


# --- helpers shared by the providers ------------------------------------------------------------


def args_json(args: Any) -> str:
    """The JSON text of a tool call's arguments, as counted and as sent to OpenAI.

    A string is taken to be JSON already (a model may produce arguments we could not parse;
    they travel unchanged so the model sees what it wrote).
    """
    if isinstance(args, str):
        return args
    return _json_encoder.encode({} if args is None else args).decode()


_content = attrgetter("content")


def content_chars(messages: Sequence[Message]) -> int:
    """Total characters of the messages' contents (the mock's prompt-token basis)."""
    return sum(map(len, map(_content, messages)))  # in C: this runs over the history per model call


def completion_chars(text: str, reasoning: str, tool_calls: Sequence[ToolCallSpec]) -> int:
    """Characters a call produced: text, reasoning and tool-call arguments as JSON."""
    return len(text) + len(reasoning) + sum(len(args_json(c.args)) for c in tool_calls)


def estimated_usage(request: ModelRequest, text: str, reasoning: str,
                    tool_calls: Sequence[ToolCallSpec]) -> Usage:
    """The mock's token estimate (characters / 4), for a provider that reports none."""
    return Usage(prompt_tokens=content_chars(request.messages) // 4,
                 completion_tokens=completion_chars(text, reasoning, tool_calls) // 4)


def chunks(text: str, size: int) -> list[str]:
    """``text`` cut into pieces of ``size`` characters (the last one may be shorter)."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream_now(on_delta: DeltaCallback, kind: str, text: str, size: int) -> None:
    """Report ``text`` as deltas of ``size`` characters, synchronously, without yielding."""
    if on_delta is ignore_delta or not text:
        return
    for piece in chunks(text, size):
        on_delta(kind, piece)


def tool_call_from_dict(data: dict[str, Any], index: int) -> ToolCallSpec:
    """A :class:`ToolCallSpec` from a loose dict (``call_id`` or ``id``, ``name``, ``args``).

    Raises ModelError naming what is missing, so a malformed canned response is obvious.
    """
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ModelError(f"tool call {index} has no name: {data!r}")
    call_id = data.get("call_id") or data.get("id") or f"call_{index + 1}"
    args = data.get("args", data.get("arguments", {}))
    return ToolCallSpec(call_id=str(call_id), name=name, args=args)


def response_from_dict(data: dict[str, Any], provider: str, model: str = "") -> ModelResponse:
    """A :class:`ModelResponse` from ``{"text", "reasoning", "tool_calls", "usage", "model"}``."""
    known = {"text", "reasoning", "tool_calls", "usage", "model", "provider"}
    unknown = set(data) - known
    if unknown:
        raise ModelError(f"canned response has unknown keys {sorted(unknown)}; known: {sorted(known)}")
    calls = [tool_call_from_dict(c, i) for i, c in enumerate(data.get("tool_calls") or [])]
    usage = data.get("usage") or Usage()
    if isinstance(usage, dict):
        usage = Usage(**usage)
    return ModelResponse(
        text=str(data.get("text", "")),
        reasoning=str(data.get("reasoning", "")),
        tool_calls=calls,
        usage=usage,
        model=str(data.get("model", model)),
        provider=str(data.get("provider", provider)),
    )
