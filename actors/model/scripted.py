"""The scripted provider: canned answers in order, for tests.

Why it exists beside the mock: the mock's answers follow from the user's text, which is right for
benchmarks and demos; a test of the agent loop often needs an exact sequence instead ("first a
tool call with these args, then a failure, then this text"). Each entry of ``responses`` is one
model call:

* a :class:`~actors.model.base.ModelResponse` — answered as is (text and reasoning streamed);
* a ``dict`` ``{"text", "reasoning", "tool_calls": [{"call_id"|"id", "name", "args"}], "usage"}``;
* a ``str`` — shorthand for ``{"text": ...}``;
* an exception instance or class — raised by that call (a ``ModelError`` to simulate a provider
  failure, anything else to simulate a bug);
* a callable ``(ModelRequest) -> one of the above`` — for answers that depend on the request.

When the script is exhausted the call fails with a ModelError that says how many answers there
were, so a loop that makes one call too many is obvious in the test output.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from sessionloop.actors.model.base import (
    DeltaCallback,
    ModelError,
    ModelRequest,
    ModelResponse,
    response_from_dict,
    stream_now,
)

CannedAnswer = ModelResponse | dict[str, Any] | str | BaseException | type[BaseException]
ScriptEntry = CannedAnswer | Callable[[ModelRequest], CannedAnswer]

DELTA_CHARS = 8


class ScriptedProvider:
    """Answers model calls from a fixed list, in order; keeps every request it saw.

    ``delay_ms`` waits before each answer (a cancellation point, for abort tests).
    ``requests`` holds every :class:`ModelRequest` received, for assertions.
    """

    name = "scripted"

    def __init__(
        self,
        responses: Iterable[ScriptEntry] = (),
        *,
        model: str = "scripted",
        delay_ms: float = 0,
        delta_chars: int = DELTA_CHARS,
    ) -> None:
        self._responses: list[ScriptEntry] = list(responses)
        self.model = model
        self.delay_ms = delay_ms
        self.delta_chars = max(1, delta_chars)
        self.requests: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        """How many canned answers are left."""
        return len(self._responses) - len(self.requests)

    def extend(self, responses: Iterable[ScriptEntry]) -> None:
        """Append more answers (a test may script the next turn after the first one ran)."""
        self._responses.extend(responses)

    async def generate(self, request: ModelRequest, on_delta: DeltaCallback) -> ModelResponse:
        """The next canned answer; raises it if it is an exception, ModelError when exhausted."""
        index = len(self.requests)
        self.requests.append(request)
        if index >= len(self._responses):
            raise ModelError(
                f"scripted provider exhausted: it had {len(self._responses)} answers and call "
                f"{index + 1} asked for another",
                provider=self.name,
                calls=index + 1,
            )
        if self.delay_ms:
            await asyncio.sleep(self.delay_ms / 1000)
        entry = self._responses[index]
        if callable(entry) and not isinstance(entry, type):
            entry = entry(request)
        response = self._as_response(entry, request)
        stream_now(on_delta, "reasoning", response.reasoning, self.delta_chars)
        stream_now(on_delta, "text", response.text, self.delta_chars)
        return response

    def _as_response(self, entry: Any, request: ModelRequest) -> ModelResponse:
        model = request.model or self.model
        if isinstance(entry, BaseException):
            raise entry
        if isinstance(entry, type) and issubclass(entry, BaseException):
            if issubclass(entry, ModelError):
                raise entry("scripted failure")
            raise entry()
        if isinstance(entry, ModelResponse):
            return entry
        if isinstance(entry, str):
            return ModelResponse(text=entry, model=model, provider=self.name)
        if isinstance(entry, dict):
            return response_from_dict(entry, provider=self.name, model=model)
        raise ModelError(f"scripted provider: cannot answer with a {type(entry).__name__}: {entry!r}")
