"""The mock model: a fixed, deterministic directive grammar.

Tests, examples and the turn-throughput benchmark drive sessions through this model,
so its grammar is a contract. For each call it reads the *latest user message*; every line that
starts with ``!`` is a directive, the other lines (joined with ``"\\n"``, stripped) are the text:

==========================  =====================================================================
``!tool NAME {json}``       (one or more lines) while no tool result follows the latest user
                            message, the call returns these tool calls in order, with no text;
                            once results follow, it answers ``done: N tool calls`` (N = the
                            number of tool results after the latest user message). The JSON is
                            optional (``{}``).
``!sleep MS``               the answer is streamed over MS milliseconds, abortable at any moment
                            (several ``!sleep`` lines add up).
``!error TEXT``             the call fails with ``ModelError(TEXT)`` (after any reasoning/sleep).
``!reason TEXT``            a reasoning part, streamed as kind ``"reasoning"`` before the answer
                            (several lines are joined with ``"\\n"``).
``!loop``                   every call requests one ``list_files {"path": "."}`` call, so a turn
                            runs into ``maxSteps`` (at most that many model calls per turn).
(no directive)              ``echo: <text>``, streamed as deltas of a few characters.
==========================  =====================================================================

Precedence: ``!error`` > ``!loop`` > ``!tool`` > echo. A line starting with ``!`` that is none of
the above is an unknown directive: it is ignored (it is not part of the text either), so a typo
never turns into an echo that looks like success.

Call ids are ``call_<n>``: ``n`` counts the tool calls already present in the request's messages,
so ids are unique within the history the model sees. (When a trimmed or summarised request hides
older calls, numbers can repeat across turns; the session keys tool calls by turn and call id.)

Usage: prompt tokens = characters of all message contents sent // 4; completion tokens
= characters produced (text + reasoning + tool-call arguments as JSON) // 4.

Streaming: every answer streams, whichever way it is taken. ``generate`` reports the deltas
through ``on_delta`` (paced over ``!sleep``); ``answer_now``, for an answer with nothing to wait
for, reports the very same deltas synchronously and returns the answer, and the session delivers
them after the commit that records the step (see :meth:`MockProvider.answer_now`).

The clock (a real model on the clock, for realistic load runs: :class:`MockClock`)
------------------------------------------------------------------------------------
==========================  =====================================================================
``latency_ms``              the delay before the first token, in ms (0 to 600,000; default 0).
``latency_jitter``          ``none`` (default: every call waits ``latency_ms``), ``lognormal``
                            (a log-normal draw whose median is ``latency_ms``: ``latency_ms *
                            exp(latency_sigma * Z)``, Z standard normal) or ``uniform`` (uniform
                            between 0 and twice ``latency_ms``: median and mean ``latency_ms``).
                            A jitter needs ``latency_ms > 0``. A draw is capped at 600,000 ms.
``latency_sigma``           the spread of ``lognormal`` (0 to 3; default 0.5: a quarter of calls
                            wait more than 1.4x the median, one in a hundred more than 3.2x).
``stream_tokens_per_s``     0 (default): deltas go out as fast as they come. N > 0: the answer is
                            paced at N tokens/s, a token being :data:`TOKEN_CHARS` (4) characters,
                            the count usage reports: delta ``i`` (of ``delta_chars``
                            characters, reasoning first, then text) goes out once the characters
                            up to its end have had their time, and the tool calls' arguments
                            (JSON) take theirs before the answer returns. ``!sleep MS`` in a
                            message replaces the pacing of that call (it streams over MS ms).
``seed``                    the seed of the jitter's random generator (a whole number, 0 to
                            2**63 - 1; default none: a fresh one): the same seed draws the same
                            delays in the same order of calls, so a benchmark run can be repeated.
==========================  =====================================================================

Options out of bounds raise ModelError naming the option. Waiting is ``asyncio.sleep`` on the
worker loop, never a blocked thread; every sleep is a cancellation point (an aborted turn stops
its call at once).

Speed: with no ``!sleep``, no ``latency_ms`` and no ``stream_tokens_per_s`` a call never yields to
the event loop: deltas are reported synchronously, the parse of a message is cached, and a session
takes the answer in place (:meth:`MockProvider.answer_now`). It sits on the hot path of the
throughput benchmark.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections.abc import Sequence
from typing import Any

import msgspec

from sessionloop.actors.events import Message, ToolCallSpec, Usage
from sessionloop.actors.model.base import (
    DeltaCallback,
    ModelError,
    ModelRequest,
    ModelResponse,
    chunks,
    completion_chars,
    content_chars,
    stream_now,
)
from sessionloop.protocol.limits import MAX_NESTING
from sessionloop.protocol.nesting import nests_deeper

#: Characters per streamed delta ("a few characters").
DELTA_CHARS = 6

#: The tool ``!loop`` keeps calling, and its arguments.
LOOP_TOOL = "list_files"
LOOP_ARGS: dict[str, Any] = {"path": "."}

_KNOWN = frozenset({"tool", "sleep", "error", "reason", "loop"})

#: Characters per token for the pacing of ``stream_tokens_per_s`` (and usage: characters // 4).
TOKEN_CHARS = 4
#: ``latency_jitter`` values.
JITTERS: tuple[str, ...] = ("none", "lognormal", "uniform")
DEFAULT_SIGMA = 0.5
MAX_LATENCY_MS = 600_000
MAX_SIGMA = 3.0
MAX_TOKENS_PER_S = 1_000_000
MAX_SEED = 2**63 - 1
#: the option names of :class:`MockClock` (keys of a mock's ``[models.NAME]`` table)
CLOCK_OPTIONS: tuple[str, ...] = ("latency_ms", "latency_jitter", "latency_sigma", "stream_tokens_per_s", "seed")


def _number(option: str, value: Any, low: float, high: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ModelError(f"mock: {option} must be a number from {low:g} to {high:g} ({what}), got {value!r}")
    return float(value)


class MockClock(msgspec.Struct, frozen=True, kw_only=True):
    """How the mock spends time (the module docstring's table). Construction validates: a value
    out of bounds raises ModelError naming the option."""

    latency_ms: float = 0
    latency_jitter: str = "none"
    latency_sigma: float = DEFAULT_SIGMA
    stream_tokens_per_s: float = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        _number("latency_ms", self.latency_ms, 0, MAX_LATENCY_MS, "milliseconds")
        if self.latency_jitter not in JITTERS:
            raise ModelError(f"mock: latency_jitter must be one of {', '.join(JITTERS)}, got {self.latency_jitter!r}")
        _number("latency_sigma", self.latency_sigma, 0, MAX_SIGMA, "the spread of the lognormal jitter")
        _number("stream_tokens_per_s", self.stream_tokens_per_s, 0, MAX_TOKENS_PER_S, "0: no pacing")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed <= MAX_SEED):
            raise ModelError(f"mock: seed must be a whole number from 0 to 2**63 - 1, got {self.seed!r}")
        if self.latency_jitter != "none" and self.latency_ms <= 0:
            raise ModelError(f"mock: latency_jitter {self.latency_jitter} needs latency_ms > 0 (its median)")

    @property
    def waits(self) -> bool:
        """Whether a call spends time (latency or pacing): then it streams on the worker loop."""
        return self.latency_ms > 0 or self.stream_tokens_per_s > 0

    def describe(self) -> str:
        """A few words for the startup log: ``latency 800 ms lognormal (sigma 0.5), 50 tokens/s, seed 1``."""
        parts = []
        if self.latency_ms:
            jitter = "" if self.latency_jitter == "none" else f" {self.latency_jitter}"
            sigma = f" (sigma {self.latency_sigma:g})" if self.latency_jitter == "lognormal" else ""
            parts.append(f"latency {self.latency_ms:g} ms{jitter}{sigma}")
        if self.stream_tokens_per_s:
            parts.append(f"{self.stream_tokens_per_s:g} tokens/s")
        if self.seed is not None:
            parts.append(f"seed {self.seed}")
        return ", ".join(parts) or "no latency"


class MockScript(msgspec.Struct, frozen=True):
    """The parsed directives and text of one user message."""

    text: str = ""
    tools: tuple[tuple[str, Any], ...] = ()
    sleep_ms: int = 0
    error: str | None = None
    reasoning: str = ""
    loop: bool = False
    unknown: tuple[str, ...] = ()


@functools.lru_cache(maxsize=4096)
def parse_script(content: str) -> MockScript:
    """Parse a user message into a :class:`MockScript`.

    Raises ModelError for a malformed directive (``!sleep`` without a number, ``!tool``
    without a name or with invalid JSON), naming the line. Cached: a benchmark sends the
    same few messages thousands of times.
    """
    text_lines: list[str] = []
    tools: list[tuple[str, Any]] = []
    reasons: list[str] = []
    unknown: list[str] = []
    sleep_ms = 0
    error: str | None = None
    loop = False
    for line in content.splitlines():
        if not line.startswith("!"):
            text_lines.append(line)
            continue
        word, _, rest = line[1:].partition(" ")
        rest = rest.strip()
        if word == "tool":
            tools.append(_parse_tool(line, rest))
        elif word == "sleep":
            sleep_ms += _parse_ms(line, rest)
        elif word == "error":
            error = rest or "mock error"
        elif word == "reason":
            reasons.append(rest)
        elif word == "loop":
            loop = True
        else:
            unknown.append(word)
    return MockScript(
        text="\n".join(text_lines).strip(),
        tools=tuple(tools),
        sleep_ms=sleep_ms,
        error=error,
        reasoning="\n".join(reasons),
        loop=loop,
        unknown=tuple(unknown),
    )


def _parse_tool(line: str, rest: str) -> tuple[str, Any]:
    name, _, raw = rest.partition(" ")
    if not name:
        raise ModelError(f"mock: '!tool' needs a tool name: {line!r}")
    raw = raw.strip()
    if not raw:
        return name, {}
    too_deep = ModelError(f"mock: the JSON arguments of {name[:200]!r} nest too deeply "
                          f"(more than {MAX_NESTING} levels)")
    if nests_deeper(raw, MAX_NESTING):  # msgspec's own limit depends on the Python (protocol/nesting.py)
        raise too_deep
    try:
        return name, msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise ModelError(f"mock: invalid JSON arguments in {line[:200]!r}: {e}") from e
    except RecursionError as e:  # not after the check above; kept total
        raise too_deep from e


def _parse_ms(line: str, rest: str) -> int:
    try:
        ms = int(rest)
    except ValueError:
        raise ModelError(f"mock: '!sleep' needs milliseconds as a whole number: {line!r}") from None
    if ms < 0:
        raise ModelError(f"mock: '!sleep' needs a non-negative number: {line!r}")
    return ms


def latest_user_index(messages: Sequence[Message]) -> int | None:
    """Index of the last ``user`` message, or None when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return i
    return None


def _count_tool_calls(messages: Sequence[Message]) -> int:
    return sum(len(m.tool_calls) for m in messages)


def _calls_before(request: ModelRequest) -> int | None:
    return request.tally.tool_calls if request.tally is not None else None


def _make_calls(messages: Sequence[Message], wanted: Sequence[tuple[str, Any]],
                calls_before: int | None) -> list[ToolCallSpec]:
    base = _count_tool_calls(messages) if calls_before is None else calls_before
    return [ToolCallSpec(call_id=f"call_{base + i + 1}", name=n, args=a) for i, (n, a) in enumerate(wanted)]


def decide_answer(messages: Sequence[Message], script: MockScript,
                  calls_before: int | None = None) -> tuple[str, list[ToolCallSpec]]:
    """The text and tool calls the mock answers for ``script`` given the history (no error case);
    ``calls_before``: the history's tool calls when the sender counted them (else counted here)."""
    if script.loop:
        return "", _make_calls(messages, [(LOOP_TOOL, dict(LOOP_ARGS))], calls_before)
    if script.tools:
        user = latest_user_index(messages)
        after = messages[user + 1 :] if user is not None else messages
        results = sum(1 for m in after if m.role == "tool")
        if results == 0:
            return "", _make_calls(messages, script.tools, calls_before)
        return f"done: {results} tool calls", []
    return f"echo: {script.text}", []


class MockProvider:
    """The default model (when none is configured): deterministic answers from the directive grammar above.

    The clock options (``latency_ms``, the benchmark's ``--llm-latency``, ``latency_jitter``,
    ``latency_sigma``, ``stream_tokens_per_s``, ``seed``: see the module docstring) make it spend
    the time a real model spends; by default it spends none.
    """

    name = "mock"

    def __init__(self, latency_ms: float = 0, model: str = "mock", delta_chars: int = DELTA_CHARS, *,
                 latency_jitter: str = "none", latency_sigma: float = DEFAULT_SIGMA,
                 stream_tokens_per_s: float = 0, seed: int | None = None) -> None:
        if isinstance(delta_chars, bool) or not isinstance(delta_chars, int) or delta_chars < 1:
            raise ModelError(f"mock: delta_chars must be a whole number >= 1, got {delta_chars!r}")
        self.clock = MockClock(latency_ms=latency_ms, latency_jitter=latency_jitter, latency_sigma=latency_sigma,
                               stream_tokens_per_s=stream_tokens_per_s, seed=seed)
        self.latency_ms = latency_ms
        self.model = model
        self.delta_chars = delta_chars
        self._waits = self.clock.waits
        self._chars_per_s = self.clock.stream_tokens_per_s * TOKEN_CHARS
        self._rng = random.Random(seed)

    def draw_latency_ms(self) -> float:
        """The delay before the next call's first token: ``latency_ms``, or a draw of the jitter
        (the generator seeded with ``seed``, one draw per call, in the order of the calls)."""
        clock = self.clock
        if clock.latency_jitter == "lognormal":
            ms = clock.latency_ms * math.exp(clock.latency_sigma * self._rng.normalvariate(0.0, 1.0))
        elif clock.latency_jitter == "uniform":
            ms = self._rng.uniform(0.0, 2.0 * clock.latency_ms)
        else:
            return float(clock.latency_ms)
        return min(ms, float(MAX_LATENCY_MS))

    async def generate(self, request: ModelRequest, on_delta: DeltaCallback) -> ModelResponse:
        """Answer one call per the grammar; raises ModelError for ``!error`` or bad directives."""
        if self.clock.latency_ms:
            await asyncio.sleep(self.draw_latency_ms() / 1000)
        script = self._script(request)
        if script.error is not None:
            await self._stream(on_delta, script.reasoning, "", script.sleep_ms)
            raise ModelError(script.error, provider=self.name)
        text, calls = decide_answer(request.messages, script, _calls_before(request))
        await self._stream(on_delta, script.reasoning, text, script.sleep_ms, calls)
        return self._response(request, script, text, calls)

    def answer_now(self, request: ModelRequest, on_delta: DeltaCallback) -> ModelResponse | None:
        """The answer when there is nothing to wait for (no latency, no pacing, no ``!sleep``),
        else None (before reporting anything).

        The mock's answer is a pure function of the request, computed in microseconds; a session
        takes it in place instead of a round trip through the worker loop (two thread hand-offs
        that would dominate a benchmark of the actor system). Anything that waits still goes
        through ``generate`` on the loop. Raises ModelError for ``!error`` (after the reasoning's
        deltas, as ``generate`` does).

        Why this is honest: the answer still streams. ``on_delta`` gets exactly the deltas
        ``generate`` would report (``DELTA_CHARS`` pieces, reasoning first), in order; the session
        keeps them and, once the commit that records the step is durable, pushes them where a
        streamed answer's would be: ``item/started`` and the ``item/delta`` pieces just before the
        step's ``item/completed``, and ``assistant.delta`` before ``assistant.message``. So a
        subscriber and a loop watcher see the frames of a streamed answer (same kinds, order and
        text); only the pauses between them are gone, which is what "nothing to wait for" means.
        What stays cheaper than a real model is the absence of waiting: no worker-loop round trip
        and no commit of the step's start on its own.
        """
        if self._waits:
            return None
        script = self._script(request)
        if script.sleep_ms > 0:
            return None
        if script.error is not None:
            stream_now(on_delta, "reasoning", script.reasoning, self.delta_chars)
            raise ModelError(script.error, provider=self.name)
        text, calls = decide_answer(request.messages, script, _calls_before(request))
        stream_now(on_delta, "reasoning", script.reasoning, self.delta_chars)
        stream_now(on_delta, "text", text, self.delta_chars)
        return self._response(request, script, text, calls)

    def _script(self, request: ModelRequest) -> MockScript:
        messages = request.messages
        user = latest_user_index(messages)
        return parse_script(messages[user].content) if user is not None else MockScript()

    def _response(self, request: ModelRequest, script: MockScript, text: str,
                  calls: list[ToolCallSpec]) -> ModelResponse:
        usage = Usage(
            prompt_tokens=(request.tally.chars if request.tally is not None else content_chars(request.messages)) // 4,
            completion_tokens=completion_chars(text, script.reasoning, calls) // 4,
        )
        return ModelResponse(text=text, reasoning=script.reasoning, tool_calls=calls, usage=usage,
                             model=request.model or self.model, provider=self.name)

    async def _stream(self, on_delta: DeltaCallback, reasoning: str, text: str, sleep_ms: int,
                      calls: Sequence[ToolCallSpec] = ()) -> None:
        deltas = [("reasoning", p) for p in chunks(reasoning, self.delta_chars)]
        deltas += [("text", p) for p in chunks(text, self.delta_chars)]
        if sleep_ms > 0:
            await _paced(on_delta, deltas, sleep_ms)
        elif self._chars_per_s > 0:
            await _at_rate(on_delta, deltas, self._chars_per_s, completion_chars("", "", calls))
        else:
            for kind, piece in deltas:
                on_delta(kind, piece)


async def _paced(on_delta: DeltaCallback, deltas: Sequence[tuple[str, str]], total_ms: int) -> None:
    """Spread ``deltas`` evenly over ``total_ms``: delta i goes out at ``(i + 1) / n`` of it."""
    total = total_ms / 1000
    count = len(deltas)
    await _on_schedule(on_delta, deltas, [total * (i + 1) / count for i in range(count)], total)


async def _at_rate(on_delta: DeltaCallback, deltas: Sequence[tuple[str, str]], chars_per_s: float,
                   tail_chars: int) -> None:
    """Stream ``deltas`` at ``chars_per_s``: a delta goes out once the characters up to its end
    have had their time; ``tail_chars`` more (tool-call arguments) take theirs after the last."""
    offsets, produced = [], 0
    for _, piece in deltas:
        produced += len(piece)
        offsets.append(produced / chars_per_s)
    await _on_schedule(on_delta, deltas, offsets, (produced + tail_chars) / chars_per_s)


async def _on_schedule(on_delta: DeltaCallback, deltas: Sequence[tuple[str, str]], offsets: Sequence[float],
                       end: float) -> None:
    """Report delta i at ``offsets[i]`` seconds from now, then return at ``end`` seconds.

    Deadlines come from the loop clock, so the total does not drift with many small sleeps;
    each ``asyncio.sleep`` is a cancellation point (cancelling a turn aborts its model call).
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    for (kind, piece), offset in zip(deltas, offsets, strict=True):
        delay = start + offset - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        on_delta(kind, piece)
    delay = start + end - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
