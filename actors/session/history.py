"""A session's older history, read from its log when asked.

The live session actor keeps a *bounded* state (``state.bound``): the model view (its messages),
the tallies, settings, grants, the queue and the records of the last two turns. What a read or a
decision needs beyond that (a state copy, a fork's source, the outcome of an old turn, a rewind's
checkpoints and turn boundaries) is the whole fold, read from the log here: a read on demand, its
cost grows with the history, like the timeline's projection (``views.items``) built on a first
subscriber.

The two folds agree: ``bound(whole_fold(log)) == `` the bounded fold of the same log, except after a
``turn.rewound`` (a rewind to a turn whose record the bounded state no longer holds cannot be folded
from the bounded state), so the shell bounds the whole fold again after one
(``bounded_fold``).
"""

from __future__ import annotations

from typing import Any

from sessionloop.actors.session.state import SessionState, bound, fold, new_state


def session_stream(session_id: str) -> str:
    return f"session-{session_id}"


def whole_fold(store: Any, session_id: str) -> SessionState:
    """The fold of every stored event of the session (``bounded`` False): what a copy of the state
    returns, what replay and verify compute."""
    return fold((r.event for r in store.read_stream(session_stream(session_id))), new_state(session_id))


def bounded_fold(store: Any, session_id: str) -> SessionState:
    """The bounded state of the stored events: the whole fold, bounded."""
    return bound(whole_fold(store, session_id))


__all__ = ["bounded_fold", "session_stream", "whole_fold"]
