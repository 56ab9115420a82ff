"""Answers to the reads of a live session (``commands.Query``), matched here and only here.

:func:`answer` runs on the session actor's thread (the shell calls it for an ``Ask`` message), so it
may read the actor's state and its timeline projection; what it returns leaves the actor, so it is
a copy or an immutable value, never the live state.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.errors import NotFound
from sessionloop.actors.session import commands as C
from sessionloop.actors.session.decide import ensure_usable
from sessionloop.actors.session.state import SessionState, copy_state, set_messages
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.system.pubsub import TurnOutcome

if TYPE_CHECKING:
    from sessionloop.actors.session.actor import SessionBehaviour


class CallerFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a session made with ``context='caller'`` takes from the calling session (a child
    inherits its caller's working directory, model and policy): its workspace directory (the one
    its tools use, also when it has no explicit cwd), and its effective model and permission policy."""

    created: E.SessionCreated
    cwd: str
    model: str | None
    permission_mode: str


def answer(actor: SessionBehaviour, query: C.Query) -> Any:
    """The value of ``query`` for ``actor``'s session; raises NotFound (and the like) instead."""
    state = actor.state
    match query:
        case C.Wake():
            return None
        case C.Exists():
            return state.created is not None and not state.deleted
        case C.StatusOf():
            ensure_usable(state)
            return state.status.value
        case C.StateCopy():
            ensure_usable(state)
            return actor.whole_state()
        case C.ForkSource():
            ensure_usable(state)
            return fork_source(actor.whole_state())
        case C.LastTurn():
            return state.queue[-1].turn_id if state.queue else state.current_turn
        case C.TurnEnd(turn_id=turn_id):
            if turn_id not in state.turns and turn_id in state.turn_starts:  # an old turn: read from the log
                return turn_end(actor.whole_state(), turn_id)
            return turn_end(state, turn_id)
        case C.SettingsOf():
            return dict(state.settings)
        case C.SettingRows(platform=platform):
            ensure_usable(state)
            return actor.rt.settings.session_rows(state, platform)
        case C.ActiveGrants():
            now = int(time.time() * 1000)
            return [g for g in state.grants.values() if g.active(now, state.current_turn)]
        case C.HistoryPage(before=before, limit=limit):
            ensure_usable(state)
            return actor.projection().history_page(before, limit)
        case C.CallerOf():
            return actor.caller_facts()
        case C.AgentConfigOf():
            return actor.config()
        case C.ProjectionView():
            items = actor.projection()
            singletons = [x for x in (items.plan_item(), items.usage_item(), items.queue_item()) if x is not None]
            return state.version, copy_state(state), items.items() + singletons  # the live (bounded) state
    raise TypeError(f"not a session query: {type(query).__name__}")


def fork_source(state: SessionState) -> SessionState:
    """What a fork copies of ``state`` (a whole fold read for it, changed in place): only what
    ended turns produced, since a running turn is not a stable prefix."""
    ensure_usable(state)
    if state.current_turn is not None:
        set_messages(state, state.messages[: state.turns[state.current_turn].message_start])
    return state


def turn_end(state: SessionState, turn_id: str) -> TurnOutcome | None:
    """The outcome of an ended turn, rebuilt from the state (the recent outcomes have forgotten it)."""
    if state.created is None or state.deleted:
        raise NotFound(Text("error.session-not-found", session=state.session_id))
    turn = state.turns.get(turn_id)
    if turn is None:
        if not any(q.turn_id == turn_id for q in state.queue):
            raise NotFound(Text("error.turn-not-found", turn=turn_id, session=state.session_id))
        return None
    if turn.ended_at is None:
        return None
    sid = state.session_id
    if turn.status == "completed":
        return TurnOutcome(session_id=sid, turn_id=turn_id, state="completed", output_text=turn.output_text,
                           outcome=turn.outcome or "replied")
    if turn.status == "limit":
        return _limit_outcome(sid, turn_id, turn.max_steps or 0)
    if turn.status == "aborted":
        return TurnOutcome(session_id=sid, turn_id=turn_id, state="failed", code="aborted", reason=turn.reason or "",
                           outcome="aborted")
    return TurnOutcome(session_id=sid, turn_id=turn_id, state="failed", code=turn.code or "error",
                       reason=turn.reason or "", outcome="error")


def _limit_outcome(session_id: str, turn_id: str, max_steps: int) -> TurnOutcome:
    return TurnOutcome(session_id=session_id, turn_id=turn_id, state="completed", output_text="", outcome="silent",
                       code="tool-limit", reason=f"stopped after {max_steps} model calls")


def turn_outcome(state: SessionState, event: E.Event) -> TurnOutcome:
    if isinstance(event, E.TurnCompleted):
        return TurnOutcome(session_id=state.session_id, turn_id=event.turn_id, state="completed",
                           output_text=event.output_text, outcome=event.outcome)
    if isinstance(event, E.TurnLimitReached):
        return _limit_outcome(state.session_id, event.turn_id, event.max_steps)
    if isinstance(event, E.TurnAborted):
        return TurnOutcome(session_id=state.session_id, turn_id=event.turn_id, state="failed", code="aborted",
                           reason=event.reason, outcome="aborted")
    assert isinstance(event, E.TurnFailed)
    return TurnOutcome(session_id=state.session_id, turn_id=event.turn_id, state="failed", code=event.code,
                       reason=event.reason, outcome="error")
