"""What a session starts after a commit and how its model calls stream: the effects half of the
session shell (:class:`SessionEffects`, mixed into ``actors.session.actor.SessionBehaviour``).

A model call and a tool run never run on the actor's thread: they are started on the runtime's
worker loop once the commit that records their start is durable (``llm.started``,
``tool.started``), and their outcomes come back as messages (``ModelDone``, ``ModelRetried``,
``ToolDone``). A provider that can answer at once (the mock) is asked in place while the commit is
prepared (:meth:`SessionEffects._answer_now`); its deltas are kept and published after the commit
like a stream's.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

import pykka

from sessionloop.actors import events as E
from sessionloop.actors.model.attachments import request_has_attachments
from sessionloop.actors.model.attachments import resolve as resolve_attachments
from sessionloop.actors.model.base import HistoryTally, RetryNotice, tally_of
from sessionloop.actors.session.context import model_view
from sessionloop.actors.session.decide import AgentConfig, decide_model_done
from sessionloop.actors.session.drive import system_messages
from sessionloop.actors.session.messages import ModelDone, ModelRetried, ToolDone, now_ms
from sessionloop.actors.session.state import SessionState
from sessionloop.actors.session.stream_sink import StreamSink
from sessionloop.actors.system.pubsub import LoopEvent, SessionChannel
from sessionloop.actors.tools.caller import CURRENT_CALL, CallerContext
from sessionloop.eventstore import SessionloopError

if TYPE_CHECKING:
    from sessionloop.actors.system.runtime import Runtime

#: the deltas a model call reported, ``(kind, text)`` in order
Deltas = list[tuple[str, str]]


class SessionEffects:
    """Model calls and tool runs of one session: launched after their commit, cancelled when
    the turn stops."""

    rt: Runtime
    sid: str
    state: SessionState
    channel: SessionChannel
    actor_ref: pykka.ActorRef[Any]
    _model_task: Any
    _sink: StreamSink | None
    _tool_tasks: dict[str, Any]

    if TYPE_CHECKING:  # the shell's (actors.session.actor.SessionBehaviour)
        def config(self) -> AgentConfig: ...

        def _app_id(self) -> str | None: ...

        def workspace(self) -> Any: ...

    def _answer_now(self, cfg: AgentConfig, now: int) -> tuple[str, list[E.Event], Deltas] | None:
        """The events of the pending model step when the provider answers it at once, with the
        deltas it streamed; None when the call must go to the worker loop.

        An answer taken in place streams like any other: its deltas are kept here and
        go out after the commit that makes the step exist (``_publish``: persist, then publish), as the same
        frames a subscriber and a loop watcher get for an answer streamed over time."""
        provider = self.rt.provider_for(self.state)
        answer_now = getattr(provider, "answer_now", None)
        if answer_now is None:
            return None
        state = self.state
        step_id, turn_id = state.pending_llm, state.current_turn
        assert step_id is not None and turn_id is not None
        deltas: Deltas = []
        keep = deltas.append
        started = time.perf_counter()
        try:
            request = self._model_request(cfg)
            if request_has_attachments(request):  # files are read off the actor thread: not in place
                return None
            r = answer_now(request, lambda kind, text: keep((kind, text)))
        except SessionloopError as e:  # what streamed before the failure (reasoning) still goes out
            return step_id, decide_model_done(state, step_id, None, str(e), _ms_since(started), now), deltas
        if r is None:
            return None
        return step_id, decide_model_done(state, step_id, r, None, _ms_since(started), now), deltas

    def _model_request(self, cfg: AgentConfig) -> Any:
        """The request of the next model call. The whole history (no trimming, no summary to merge)
        goes with the session's counts of it, so nobody recounts the history per call."""
        state = self.state
        system = system_messages(cfg)
        if cfg.context_chars is None and not state.summaries:
            head = tally_of(system)
            tally = HistoryTally(chars=head.chars + state.history_chars,
                                 tool_calls=head.tool_calls + state.history_tool_calls,
                                 attachments=head.attachments + state.history_attachments)
            return self.rt.model_request(cfg, HistoryView(system, state.messages), tally)
        messages, _ = model_view(system + state.messages, cfg.context_chars)
        return self.rt.model_request(cfg, messages)

    def _delta_sink(self, step_id: str) -> StreamSink:
        """The ``on_delta`` of a model call: live items, generating cards, and the restart of
        what an attempt showed when the provider retries (``actors/session/stream_sink.py``)."""
        ref = self.actor_ref

        def on_retry(notice: RetryNotice, next_item_id: str) -> None:
            ref.tell(ModelRetried(step_id, notice, next_item_id))

        return StreamSink(channel=self.channel, session_id=self.sid, step_id=step_id, turn_id=self.state.current_turn,
                          delta=self.rt.delta_payload, on_retry=on_retry, now=now_ms, fault=self.rt.faults.hit,
                          loop_delta=self._loop_delta())

    def _loop_delta(self) -> Any:
        """Emits a bot's live ``assistant.delta`` with ``data``; None outside apps."""
        app, watchers = self._app_id(), self.rt.loop_watchers
        if app is None:
            return None
        sid, turn_id = self.sid, self.state.current_turn

        def emit(data: dict[str, Any]) -> None:
            if watchers.any(app):
                watchers.emit(app, LoopEvent(cursor=0, session_id=sid, type="assistant.delta", at=now_ms(),
                                             turn_id=turn_id, data=data))

        return emit

    def _cancel_tasks(self) -> None:
        if self._model_task is not None:
            self._model_task.cancel()
            self._model_task = None
        if self._sink is not None:
            self._sink.close()  # a delta still on its way must not revive an item
        for task in self._tool_tasks.values():
            task.cancel()
        self._tool_tasks.clear()

    def _launch_model(self, turn_id: str, step_id: str) -> None:
        request = self._model_request(self.config())
        provider = self.rt.provider_for(self.state)
        ref, on_delta = self.actor_ref, self._delta_sink(step_id)
        self._sink = on_delta

        blobs = self.rt.blobs

        async def call() -> None:
            started = time.perf_counter()
            try:
                sent = request
                if request_has_attachments(request):  # the files, read off the actor thread
                    sent = await asyncio.to_thread(resolve_attachments, request, blobs.read)
                response = await provider.generate(sent, on_delta)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                ref.tell(ModelDone(step_id, None, str(e) or type(e).__name__, _ms_since(started)))
            else:
                ref.tell(ModelDone(step_id, response, None, _ms_since(started)))

        self._model_task = self.rt.worker.start(call())

    def _launch_tool(self, turn_id: str, call_id: str, tool: str, args: Any) -> None:
        ref = self.actor_ref
        ctx = self.rt.tool_context(self.sid, ref, self.channel, self.workspace(), self.state.tool_calls.get(call_id),
                                   self.config(), turn_id, call_id)

        caller = CallerContext(session_id=self.sid, turn_id=turn_id, call_id=call_id)

        async def run() -> None:
            CURRENT_CALL.set(caller)  # this task's own context: only this tool sees it
            self.rt.faults.hit("tool-run")
            started = time.perf_counter()
            result = await self.rt.tools.execute(tool, args, ctx)
            ref.tell(ToolDone(turn_id, call_id, result, _ms_since(started)))

        self._tool_tasks[call_id] = self.rt.worker.start(run())


class HistoryView(Sequence[E.Message]):
    """``system`` then the history as it is now, without copying it (a model call per step would
    otherwise copy the whole history): holds the history list and its length, and a history list
    only grows at its end (``state.add_message``), so the view never changes."""

    __slots__ = ("_system", "_history", "_len")

    def __init__(self, system: list[E.Message], history: list[E.Message]) -> None:
        self._system, self._history, self._len = system, history, len(system) + len(history)

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> E.Message: ...
    @overload
    def __getitem__(self, index: slice) -> list[E.Message]: ...
    def __getitem__(self, index: int | slice) -> E.Message | list[E.Message]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            head = len(self._system)
            return self._system[start:min(stop, head)] + self._history[max(start - head, 0):max(stop - head, 0)]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("history view index out of range")
        head = len(self._system)
        return self._system[index] if index < head else self._history[index - head]

    def __iter__(self) -> Iterator[E.Message]:
        yield from self._system
        yield from itertools.islice(self._history, self._len - len(self._system))

    def __eq__(self, other: object) -> bool:  # equal to a list of the same messages, as the copy it replaces was
        return isinstance(other, (list, tuple, HistoryView)) and len(other) == self._len and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # like a list

    def __repr__(self) -> str:
        return f"HistoryView({list(self)!r})"


def _ms_since(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


__all__ = ["Deltas", "SessionEffects"]
