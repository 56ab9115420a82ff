"""The spans of a session, rebuilt from its events (OpenTelemetry GenAI semantic conventions).

A session's log has every fact and every time a trace needs, so its spans are a pure fold of its
events, with no clock and no randomness:

* a **turn** span, ``invoke_agent`` (kind internal), from ``turn.started`` to the turn's end
  (``turn.completed``, ``turn.failed``, ``turn.aborted``, ``turn.limit-reached``);
* a **model call** span, ``chat <model>`` (kind client), from ``llm.started`` to
  ``llm.completed`` or ``llm.failed``: the model, the usage and the finish reason;
* a **tool** span, ``execute_tool <name>`` (kind internal), from ``tool.started`` to
  ``tool.finished``: the call id, the status, the exit code and the sandbox policy. A call that
  never ran (unknown, refused, denied, not executed) has no span.

Every span carries ``sessionloop.session.id`` and ``sessionloop.turn.id``. A turn span's parent
is the W3C ``traceparent`` its input carried (``loop/send``, ``turn/send``: a bot's trace goes on
into the turn); without one the turn starts a trace of its own. Ids are derived, never drawn: the
trace id from the session and turn ids, each span id from the session and the turn, step or call,
so the live exporter (fed commit by commit, :mod:`actors.system.trace_export`) and ``sessionloop
trace`` (fed the whole log) make the same spans, ids included.

Times: events carry epoch milliseconds; spans get nanoseconds (``at * 1_000_000``). A model call
answered at once (the mock) starts and ends in the same millisecond.

Content is not recorded: no prompt, answer, tool argument or output goes into an attribute (the
conventions make content opt-in; it may hold secrets). Nothing here imports OpenTelemetry: spans
are plain values that :mod:`actors.system.trace_export` turns into the SDK's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from sessionloop.actors import events as E
from sessionloop.protocol.limits import MAX_REASON, TRACEPARENT_PATTERN, clip

__all__ = [
    "MissingHistory",
    "SpanBuilder",
    "SpanData",
    "TraceParent",
    "build_spans",
    "parse_traceparent",
]

_TRACEPARENT = re.compile(TRACEPARENT_PATTERN)
_SAMPLED = 0x01
_NS_PER_MS = 1_000_000

# the four ways a turn ends
TurnEnd = E.TurnCompleted | E.TurnFailed | E.TurnAborted | E.TurnLimitReached

#: the events that start, end or feed a span; a commit without any is not a tracer's business
SPAN_EVENTS: frozenset[type[E.Event]] = frozenset({
    E.InputAccepted, E.InputDropped, E.TurnStarted, E.TurnCompleted, E.TurnFailed, E.TurnAborted,
    E.TurnLimitReached, E.LlmStarted, E.LlmCompleted, E.LlmFailed, E.ToolStarted, E.ToolFinished,
    E.SessionDeleted,
})


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A parsed W3C ``traceparent``: the caller's span."""

    trace_id: int
    span_id: int
    sampled: bool


def parse_traceparent(text: str | None) -> TraceParent | None:
    """The span ``text`` names (W3C Trace Context §3.2, version-traceid-parentid-flags in
    lowercase hex, at most 55 characters), or None for None or anything not of that format."""
    if not isinstance(text, str) or len(text) != 55 or _TRACEPARENT.match(text) is None:
        return None
    _, trace, span, flags = text.split("-")
    return TraceParent(int(trace, 16), int(span, 16), bool(int(flags, 16) & _SAMPLED))


@dataclass(frozen=True, slots=True)
class SpanData:
    """A finished span. ``parent_id`` None: a root; ``remote_parent``: the parent is the caller's
    span (from a traceparent); ``error``: the status is ERROR with this description (else UNSET)."""

    name: str
    kind: Literal["internal", "client"]
    trace_id: int
    span_id: int
    parent_id: int | None
    remote_parent: bool
    sampled: bool
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: str | None = None


class MissingHistory(Exception):
    """An event refers to a turn, input, step or call this builder has not seen: it started in
    events before the ones it was fed (before this process, or in commits it missed)."""


@dataclass(slots=True)
class _Turn:
    turn_id: str
    trace_id: int
    span_id: int
    parent: TraceParent | None
    start_ns: int
    source: str | None
    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0


@dataclass(slots=True)
class _Step:
    turn_id: str
    span_id: int
    start_ns: int
    attempt: int


@dataclass(slots=True)
class _Call:
    turn_id: str
    span_id: int
    start_ns: int
    tool: str
    sandbox: str | None


def _derived(key: str, size: int) -> int:
    """A nonzero id of ``size`` bytes derived from ``key`` (W3C: all-zero ids are invalid)."""
    value = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=size, person=b"sessionloop").digest(), "big")
    return value or 1


@dataclass
class SpanBuilder:
    """The fold of one session's events into spans: :meth:`feed` takes the next event and returns
    the spans it ends. It holds only what is open (inputs whose turn has not started, turns,
    model calls and tool calls under way), so an idle session's builder is empty (:attr:`idle`).

    ``complete``: the builder was fed the log from its first event. One that was not (the live
    exporter meeting a session whose turn began before this process started) raises
    :class:`MissingHistory` when an event refers to something it never saw, and its caller folds
    the earlier events first; a complete one skips such a reference (it names nothing that ran).
    """

    session_id: str
    complete: bool = True
    inputs: dict[str, TraceParent | None] = field(default_factory=dict)
    turns: dict[str, _Turn] = field(default_factory=dict)
    steps: dict[str, _Step] = field(default_factory=dict)
    calls: dict[tuple[str, str], _Call] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        return not (self.inputs or self.turns)

    def feed(self, event: Any) -> list[SpanData]:
        handler = _HANDLERS.get(type(event))
        return handler(self, event) if handler is not None else []

    def feed_all(self, events: Iterable[Any]) -> list[SpanData]:
        return [span for event in events for span in self.feed(event)]

    # --- what is not known ----------------------------------------------------------------------

    def _unknown(self, what: str) -> list[SpanData]:
        if not self.complete:
            raise MissingHistory(f"session {self.session_id}: {what} began before the events this tracer saw")
        return []

    def _attributes(self, turn_id: str, operation: str) -> dict[str, Any]:
        return {"gen_ai.operation.name": operation, "gen_ai.conversation.id": self.session_id,
                "sessionloop.session.id": self.session_id, "sessionloop.turn.id": turn_id}

    def _span(self, turn: _Turn, name: str, kind: Literal["internal", "client"], span_id: int, start_ns: int,
              end_at: int, attributes: dict[str, Any], error: str | None) -> SpanData:
        """A child span of ``turn``."""
        sampled = turn.parent.sampled if turn.parent is not None else True
        return SpanData(name=name, kind=kind, trace_id=turn.trace_id, span_id=span_id, parent_id=turn.span_id,
                        remote_parent=False, sampled=sampled, start_ns=start_ns,
                        end_ns=max(start_ns, end_at * _NS_PER_MS), attributes=attributes, error=error)

    # --- inputs and turns -----------------------------------------------------------------------

    def _input(self, e: E.InputAccepted) -> list[SpanData]:
        self.inputs[e.input_id] = parse_traceparent(e.traceparent)
        return []

    def _input_dropped(self, e: E.InputDropped) -> list[SpanData]:
        self.inputs.pop(e.input_id, None)
        return []

    def _turn_started(self, e: E.TurnStarted) -> list[SpanData]:
        if any(i not in self.inputs for i in e.input_ids) and not self.complete:
            return self._unknown(f"an input of turn {e.turn_id}")
        parents = [self.inputs.pop(i, None) for i in e.input_ids]
        parent = next((p for p in parents if p is not None), None)
        trace_id = parent.trace_id if parent is not None else _derived(f"trace/{self.session_id}/{e.turn_id}", 16)
        self.turns[e.turn_id] = _Turn(turn_id=e.turn_id, trace_id=trace_id,
                                      span_id=_derived(f"turn/{self.session_id}/{e.turn_id}", 8), parent=parent,
                                      start_ns=e.at * _NS_PER_MS, source=e.source)
        return []

    def _turn_ended(self, e: TurnEnd) -> list[SpanData]:
        turn = self.turns.pop(e.turn_id, None)
        if turn is None:
            return self._unknown(f"turn {e.turn_id}")
        # a call or step still open never ends: the turn's end closed it first (cancel, crash
        # repair), so what is left had its end dropped as stale and ran no further
        for key in [k for k in self.calls if k[0] == e.turn_id]:
            del self.calls[key]
        for step_key in [k for k, s in self.steps.items() if s.turn_id == e.turn_id]:
            del self.steps[step_key]
        outcome, error = _TURN_OUTCOME[type(e)], None
        attributes = self._attributes(turn.turn_id, "invoke_agent")
        attributes.update({"sessionloop.turn.outcome": outcome, "sessionloop.turn.model_calls": turn.llm_calls,
                           "gen_ai.usage.input_tokens": turn.input_tokens,
                           "gen_ai.usage.output_tokens": turn.output_tokens})
        if turn.source:
            attributes["sessionloop.turn.source"] = turn.source
        if isinstance(e, E.TurnFailed):
            attributes["error.type"] = e.code
            error = clip(e.reason or e.code, MAX_REASON)
        parent = turn.parent
        return [SpanData(name="invoke_agent", kind="internal", trace_id=turn.trace_id, span_id=turn.span_id,
                         parent_id=parent.span_id if parent is not None else None, remote_parent=parent is not None,
                         sampled=parent.sampled if parent is not None else True, start_ns=turn.start_ns,
                         end_ns=max(turn.start_ns, e.at * _NS_PER_MS), attributes=attributes, error=error)]

    # --- model calls ----------------------------------------------------------------------------

    def _llm_started(self, e: E.LlmStarted) -> list[SpanData]:
        turn = self.turns.get(e.turn_id)
        if turn is None:
            return self._unknown(f"turn {e.turn_id}")
        turn.llm_calls += 1
        self.steps[e.step_id] = _Step(turn_id=e.turn_id, start_ns=e.at * _NS_PER_MS, attempt=e.attempt,
                                      span_id=_derived(f"llm/{self.session_id}/{e.step_id}/{e.attempt}", 8))
        return []

    def _llm_completed(self, e: E.LlmCompleted) -> list[SpanData]:
        step, turn = self.steps.pop(e.step_id, None), self.turns.get(e.turn_id)
        if step is None or turn is None:
            return self._unknown(f"model call {e.step_id}")
        turn.input_tokens += e.usage.prompt_tokens
        turn.output_tokens += e.usage.completion_tokens
        attributes = self._step_attributes(e.turn_id, e.step_id, step)
        # the log records the model that answered; the request named the same one (or none, and
        # the provider used its own), so it stands for the requested model too
        if e.model:
            attributes["gen_ai.request.model"] = e.model
            attributes["gen_ai.response.model"] = e.model
        if e.provider:
            attributes["gen_ai.provider.name"] = e.provider
        attributes.update({"gen_ai.usage.input_tokens": e.usage.prompt_tokens,
                           "gen_ai.usage.output_tokens": e.usage.completion_tokens,
                           "gen_ai.response.finish_reasons": ("tool_calls",) if e.tool_calls else ("stop",)})
        name = f"chat {e.model}" if e.model else "chat"
        return [self._span(turn, name, "client", step.span_id, step.start_ns, e.at, attributes, None)]

    def _llm_failed(self, e: E.LlmFailed) -> list[SpanData]:
        step, turn = self.steps.pop(e.step_id, None), self.turns.get(e.turn_id)
        if step is None or turn is None:
            return self._unknown(f"model call {e.step_id}")
        attributes = self._step_attributes(e.turn_id, e.step_id, step)
        attributes["error.type"] = "cancelled" if e.aborted else "model_error"
        return [self._span(turn, "chat", "client", step.span_id, step.start_ns, e.at, attributes,
                           clip(e.error or "model call failed", MAX_REASON))]

    def _step_attributes(self, turn_id: str, step_id: str, step: _Step) -> dict[str, Any]:
        attributes = self._attributes(turn_id, "chat")
        attributes["sessionloop.step.id"] = step_id
        if step.attempt != 1:
            attributes["sessionloop.step.attempt"] = step.attempt
        return attributes

    # --- tool calls -----------------------------------------------------------------------------

    def _tool_started(self, e: E.ToolStarted) -> list[SpanData]:
        if e.turn_id not in self.turns:
            return self._unknown(f"turn {e.turn_id}")
        sandbox = e.display.sandbox if e.display is not None else None
        self.calls[(e.turn_id, e.call_id)] = _Call(
            turn_id=e.turn_id, start_ns=e.at * _NS_PER_MS, tool=e.tool, sandbox=sandbox,
            span_id=_derived(f"tool/{self.session_id}/{e.turn_id}/{e.call_id}", 8))
        return []

    def _tool_finished(self, e: E.ToolFinished) -> list[SpanData]:
        call, turn = self.calls.pop((e.turn_id, e.call_id), None), self.turns.get(e.turn_id)
        if call is None or turn is None:
            if e.not_executed or turn is not None:
                return []  # a call that never ran: refused, denied or not executed, no span
            return self._unknown(f"tool call {e.call_id}")
        attributes = self._attributes(e.turn_id, "execute_tool")
        attributes.update({"gen_ai.tool.name": call.tool, "gen_ai.tool.call.id": e.call_id,
                           "gen_ai.tool.type": "function", "sessionloop.tool.status": e.status})
        if e.exit_code is not None:
            attributes["sessionloop.tool.exit_code"] = e.exit_code
        if call.sandbox:
            attributes["sessionloop.tool.sandbox"] = call.sandbox
        if e.task_id:
            attributes["sessionloop.tool.task_id"] = e.task_id
        error = None
        if e.status in ("failed", "aborted"):
            attributes["error.type"] = e.repair or e.status
            error = f"tool call {e.status}" + (f" ({e.repair})" if e.repair else "")
        return [self._span(turn, f"execute_tool {call.tool}", "internal", call.span_id, call.start_ns, e.at,
                           attributes, error)]

    def _deleted(self, e: E.SessionDeleted) -> list[SpanData]:
        self.inputs.clear()
        self.turns.clear()
        self.steps.clear()
        self.calls.clear()
        return []


_TURN_OUTCOME: dict[type, str] = {E.TurnCompleted: "completed", E.TurnFailed: "failed",
                                  E.TurnAborted: "aborted", E.TurnLimitReached: "limit"}

_HANDLERS: dict[type, Callable[[SpanBuilder, Any], list[SpanData]]] = {
    E.InputAccepted: SpanBuilder._input,
    E.InputDropped: SpanBuilder._input_dropped,
    E.TurnStarted: SpanBuilder._turn_started,
    E.TurnCompleted: SpanBuilder._turn_ended,
    E.TurnFailed: SpanBuilder._turn_ended,
    E.TurnAborted: SpanBuilder._turn_ended,
    E.TurnLimitReached: SpanBuilder._turn_ended,
    E.LlmStarted: SpanBuilder._llm_started,
    E.LlmCompleted: SpanBuilder._llm_completed,
    E.LlmFailed: SpanBuilder._llm_failed,
    E.ToolStarted: SpanBuilder._tool_started,
    E.ToolFinished: SpanBuilder._tool_finished,
    E.SessionDeleted: SpanBuilder._deleted,
}


def build_spans(session_id: str, events: Iterable[Any]) -> list[SpanData]:
    """Every finished span of the session whose log is ``events`` (oldest first), in the order
    they ended; spans still open at the end of the log (a turn under way) are left out."""
    return SpanBuilder(session_id).feed_all(events)
