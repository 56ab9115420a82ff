"""Summary compaction: automatic before a model call over ``contextChars``, manual with
``compact()`` and ``session/compress``.

Two ways in. *Automatic*: before the first model call of a turn that is over ``contextChars``
(once per turn), the turns before it are summarised and the summary goes right before the
current user message; a failure falls back to trimming. *Manual* (``compact()``,
``session/compress``): every turn so far is summarised and the summary appended; it refuses
while a turn runs and while another compaction runs (refused at once, no notice).

A compaction under way is a :class:`Flight`, held by its session actor (``actor.compaction``,
never stored: a restart forgets it, and a client retries). The summary call runs on the worker
loop and comes back as a :class:`~actors.session.actor.SummaryDone` message. What ends a manual
flight early is decided with the command that causes it, in the same commit
(``session_decide.decide_compaction_interrupted`` / ``decide_compaction_cancelled``): a new input,
a turn, a rewind or replaced messages (the history changed meanwhile: not compressed), a delete or park, and
``cancel()``. Its request then fails with :class:`CompactionFailed`
naming the reason, the compress notice says the same, and the summary, when it comes, is
dropped: no summary is committed for a history that moved on. An automatic flight ends
silently when its turn ends first (aborted): there is no turn left to insert the summary into.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pykka

from sessionloop.actors import events as E
from sessionloop.actors.errors import CompactionFailed, compact_error
from sessionloop.actors.model import ModelRequest
from sessionloop.actors.model.base import ignore_delta
from sessionloop.actors.session.context import build_summary_request, compaction_input, estimated_context_tokens
from sessionloop.actors.session.decide import decide_compact_allowed, decide_compaction_done
from sessionloop.actors.session.drive import system_messages
from sessionloop.actors.session.messages import SummaryDone, now_ms
from sessionloop.actors.session.state import copy_state, evolve
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.system.pubsub import Reply
from sessionloop.eventstore import StoreError

if TYPE_CHECKING:
    from sessionloop.actors.session.actor import SessionBehaviour
    from sessionloop.actors.system.runtime import Runtime


class Flight:
    """One compaction under way: which kind, what it summarises, who waits, its summary call."""

    __slots__ = ("auto", "turn_id", "turns", "reply", "task")

    def __init__(self, *, auto: bool, turn_id: str | None, turns: int, reply: Reply | None) -> None:
        self.auto = auto
        self.turn_id = turn_id  # automatic: the turn whose first model call waits for the summary
        self.turns = turns
        self.reply = reply  # manual: the compact() / session/compress request
        self.task: Any = None  # the summary call on the worker loop (``TaskHandle``)

    def abandon(self, error: BaseException | None) -> None:
        """Stop the summary call; a waiting request fails with ``error``."""
        if self.task is not None:
            self.task.cancel()
        if self.reply is not None and error is not None:
            self.reply.fail(error)


class Compaction:
    """Starts and finishes compactions for the session actors of one runtime."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    def start_auto(self, actor: SessionBehaviour, turn_id: str) -> None:
        inp = compaction_input(actor.state.messages, include_current=False)
        self._start(actor, Flight(auto=True, turn_id=turn_id, turns=inp.turns, reply=None), inp)

    def start_manual(self, actor: SessionBehaviour, reply: Reply) -> None:
        """``compact()``: ``{turns, chars}`` once the summary is committed, None when there is
        nothing to compact. Raises SessionBusy (a turn or another compaction runs)."""
        decide_compact_allowed(actor.state, actor.compaction is not None)
        inp = compaction_input(actor.state.messages, include_current=True)
        if inp.turns == 0:
            reply.set(None)
            return
        self._start(actor, Flight(auto=False, turn_id=None, turns=inp.turns, reply=reply), inp)

    def _start(self, actor: SessionBehaviour, flight: Flight, inp: Any) -> None:
        request = ModelRequest(messages=build_summary_request(inp.messages, inp.previous_summary), tools=[])
        if actor.compaction is not None:  # an automatic one asked again (a reload re-drove its turn)
            actor.compaction.abandon(None)
        actor.compaction = flight
        try:
            provider = self.rt.provider_for(actor.state)
        except Exception as e:  # no summary model: not compressed, the reason said
            actor.actor_ref.tell(SummaryDone(flight, "", Text("compress.model-unavailable", error=str(e)), None))
            return
        ref = actor.actor_ref

        async def call() -> None:
            try:
                response = await provider.generate(request, ignore_delta)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a failed automatic summary falls back to trimming
                done = SummaryDone(flight, "", Text("compress.model-failed", error=str(e) or type(e).__name__), None)
            else:
                text = response.text.strip()
                done = SummaryDone(flight, text, None if text else Text("compress.model-empty"), response.usage)
            try:
                ref.tell(done)
            except pykka.ActorDeadError:  # the session stopped meanwhile (its stop failed the request)
                pass

        flight.task = self.rt.worker.start(call())

    def finish(self, actor: SessionBehaviour, done: SummaryDone) -> None:
        """On the actor thread: commit the summary (or the failure) of ``done.flight`` and answer
        its request, unless the flight already ended (interrupted, cancelled, its turn over)."""
        flight = done.flight
        if actor.compaction is not flight:
            return  # ended meanwhile; that end is recorded and answered
        actor.compaction = None
        state = actor.state
        if flight.auto and state.current_turn != flight.turn_id:
            return
        event = decide_compaction_done(flight.turns, done.text, done.error, done.usage, auto=flight.auto,
                                       turn_id=flight.turn_id, now=now_ms(),
                                       context_tokens=lambda e: self._context_tokens_after(actor, e))
        try:
            actor._commit([event], run_drive=flight.auto)
        except StoreError:
            actor.compaction = flight  # the message is tried again later (SessionBehaviour._guarded)
            raise
        except BaseException as e:
            flight.abandon(e)
            raise
        if flight.reply is None:
            return
        if isinstance(event, E.ContextCompactFailed):
            flight.reply.fail(CompactionFailed(compact_error(event)))
        else:
            assert isinstance(event, E.ContextCompacted)
            flight.reply.set({"turns": event.turns, "chars": event.chars})

    @staticmethod
    def _context_tokens_after(actor: SessionBehaviour, event: E.ContextCompacted) -> int:
        """The estimated prompt tokens of the next model call once ``event`` is applied: the fold
        of a copy of the state (compaction is rare; the live state changes only with the commit)."""
        state = copy_state(actor.state)
        evolve(state, event)
        cfg = actor.config()
        return estimated_context_tokens(system_messages(cfg) + state.messages, cfg.context_chars)


__all__ = ["Compaction", "Flight"]
