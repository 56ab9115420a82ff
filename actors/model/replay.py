"""The replay provider: answers from a session's recorded model responses (for ``rerun``).

Why: like a workflow replayer (Temporal's Replayer, STYLE "models"), ``sessionloop rerun
--provider replay`` forks a session at turn N and runs the later inputs again with the model
answers taken from the recording (``llm.completed`` events, which hold each call's whole answer).
If the runtime is deterministic the new event log equals the old one modulo ids and times; if it
is not, the first place it asks for something the recording does not have is reported as a
:class:`ReplayDivergence` with what was expected and what was asked.

Two divergences are detected here, where the provider can see them:

* more model calls than were recorded;
* (``check_tool_results``) the request ends with a batch of tool results whose call ids are not
  the ones the previous recorded answer asked for (the run took another path).

The answer keeps the recorded ``model`` and ``provider`` names so the re-run log compares equal;
the provider's own :attr:`name` is ``"replay"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sessionloop.actors.events import LlmCompleted, Message
from sessionloop.actors.model.base import DeltaCallback, ModelError, ModelRequest, ModelResponse, stream_now

DELTA_CHARS = 8


class ReplayDivergence(ModelError):
    """The re-run asked the model for something the recording does not contain.

    ``data`` holds ``call`` (1-based call number), ``expected`` and ``got`` (short texts).
    """

    code = "replay-divergence"

    def __init__(self, call: int, expected: str, got: str) -> None:
        super().__init__(
            f"replay diverged at model call {call}: expected {expected}, got {got}",
            call=call,
            expected=expected,
            got=got,
        )
        self.call = call
        self.expected = expected
        self.got = got


def _excerpt(text: str, limit: int = 80) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_request(messages: Sequence[Message]) -> str:
    """A one-line description of what a request ends with, for divergence reports."""
    if not messages:
        return "a request with no messages"
    last = messages[-1]
    if last.role == "tool":
        return f"a request ending with tool results {trailing_tool_ids(messages)}"
    return f"a request ending with a {last.role} message {_excerpt(last.content)!r}"


def trailing_tool_ids(messages: Sequence[Message]) -> list[str]:
    """The call ids of the tool results at the end of ``messages``, in order."""
    ids: list[str] = []
    for m in reversed(messages):
        if m.role != "tool":
            break
        ids.append(m.tool_call_id or "?")
    ids.reverse()
    return ids


class ReplayProvider:
    """Plays back recorded ``llm.completed`` answers in order, streaming their text as deltas."""

    name = "replay"

    def __init__(
        self,
        recorded: Iterable[Any] = (),
        *,
        check_tool_results: bool = True,
        delta_chars: int = DELTA_CHARS,
    ) -> None:
        # Any event may be passed (a whole stream); only the recorded answers matter.
        self.recorded: list[LlmCompleted] = [e for e in recorded if isinstance(e, LlmCompleted)]
        self.check_tool_results = check_tool_results
        self.delta_chars = max(1, delta_chars)
        self.calls = 0

    @property
    def remaining(self) -> int:
        """How many recorded answers have not been played yet."""
        return len(self.recorded) - self.calls

    async def generate(self, request: ModelRequest, on_delta: DeltaCallback) -> ModelResponse:
        """The next recorded answer; raises ReplayDivergence when the run left the recording."""
        index = self.calls
        if index >= len(self.recorded):
            raise ReplayDivergence(
                index + 1,
                f"no more model calls ({len(self.recorded)} recorded)",
                describe_request(request.messages),
            )
        self._check(index, request.messages)
        self.calls += 1
        event = self.recorded[index]
        stream_now(on_delta, "reasoning", event.reasoning, self.delta_chars)
        stream_now(on_delta, "text", event.text, self.delta_chars)
        return ModelResponse(
            text=event.text,
            reasoning=event.reasoning,
            tool_calls=list(event.tool_calls),
            usage=event.usage,
            model=event.model,
            provider=event.provider or self.name,
        )

    def _check(self, index: int, messages: Sequence[Message]) -> None:
        """Tool results at the end of the request must answer the previous recorded calls."""
        if not self.check_tool_results or index == 0:
            return
        got = trailing_tool_ids(messages)
        if not got:
            return  # a new user message (or a continue): nothing to compare with
        expected = [c.call_id for c in self.recorded[index - 1].tool_calls]
        if sorted(got) != sorted(expected):
            raise ReplayDivergence(
                index + 1,
                f"tool results for {expected}",
                f"tool results for {got}",
            )
