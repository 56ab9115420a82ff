"""``turn/rewind`` and ``Session.rewind``: files back to their state before a turn, and with
``code-and-chat`` the turn and the later ones out of the conversation.

Runs off the actor threads (it reads and writes the workspace): the session's state is read with
a ``StateCopy`` query, the files are restored from the checkpoints recorded before each change
(:func:`actors.session.checkpoints.restore_before`), then a ``Rewind`` command records what was
done; the session refuses it if a turn started meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sessionloop.actors.errors import InvalidCommand, NotFound, SessionBusy
from sessionloop.actors.session import commands as C
from sessionloop.actors.session.checkpoints import restore_before
from sessionloop.actors.session.messages import Ask, Decide
from sessionloop.actors.settings.texts import Text

if TYPE_CHECKING:
    from sessionloop.actors.system.runtime import Runtime

SCOPES = ("code", "code-and-chat")


def rewind(rt: Runtime, session_id: str, turn_id: str, scope: str = "code") -> dict[str, Any]:
    """Restore the files ``turn_id`` and the turns after it changed; the result's fields are those of
    ``turn/rewind`` (``turnId``, ``restored``, ``removed``, ``conflicts``, and with ``code-and-chat``
    ``deletedMessages`` and ``chatDeleted``)."""
    if scope not in SCOPES:
        raise InvalidCommand(Text("error.rewind-scope"))
    state = rt.ask(session_id, lambda r: Ask(C.StateCopy(), r))
    if state.current_turn is not None:
        raise SessionBusy(Text("error.rewind-busy"))
    if turn_id not in state.turns or state.turns[turn_id].ended_at is None:
        raise NotFound(Text("error.rewind-turn", turn=turn_id, session=session_id))
    restored, removed, conflicts = restore_before(state, turn_id, rt.workspace(state))
    chat = scope == "code-and-chat"
    deleted = len(state.messages) - state.turns[turn_id].message_start if chat else 0
    rewound = C.Rewind(turn_id=turn_id, scope=scope, restored=restored, removed=removed, conflicts=conflicts,
                       chat_deleted=chat, deleted_messages=deleted)
    rt.ask(session_id, lambda r: Decide(rewound, r))
    result: dict[str, Any] = {"turnId": turn_id, "restored": restored, "removed": removed, "conflicts": conflicts}
    if chat:
        result.update(deletedMessages=deleted, chatDeleted=True)
    return result
