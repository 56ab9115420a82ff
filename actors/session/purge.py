"""The session's steps of a delete (``actors/session/deletion.py``): freeze (stop what runs, take
no new input) and purge (the session out of the store, a tombstone left) (:class:`SessionPurge`,
mixed into ``actors.session.actor.SessionBehaviour``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sessionloop.actors import events as E
from sessionloop.actors.session.decide import decide_delete, decide_stop_for_delete
from sessionloop.actors.session.messages import Freeze, Purge, now_ms
from sessionloop.actors.session.state import SessionState
from sessionloop.actors.system.pubsub import TurnOutcome
from sessionloop.actors.views.summary import encode_summary_record, tombstone_record

if TYPE_CHECKING:
    from sessionloop.actors.system.runtime import Runtime

#: the categories of a session's streams (``session-S``, ``approval-S.*``, ``task-S.*``): a purge
#: takes them all (``actors/session/deletion.py``)
OWNED_CATEGORIES = ("session", "approval", "task")
#: set with a session's purge, cleared once its files are deleted too (a restart finishes them)
FILES_PENDING = "files-pending"


class SessionPurge:
    """``Freeze`` and ``Purge``, the two steps of a delete a session takes itself."""

    rt: Runtime
    sid: str
    stream: str
    state: SessionState
    deleting: bool
    last_record: Any
    record_dirty: bool

    if TYPE_CHECKING:  # the shell's (actors.session.actor.SessionBehaviour)
        def _commit(self, events: list[E.Event], *, run_drive: bool = True) -> Any: ...

        def _cancel_tasks(self) -> None: ...

        def _reload(self) -> None: ...

        def _tell_listeners(self, events: list[E.Event], result: Any,
                            loop_deltas: dict[str, list[dict[str, Any]]] | None) -> None: ...

    def on_freeze(self, msg: Freeze) -> None:
        """Stop what runs before a delete (``actors/session/deletion.py``, step 1): the turn is aborted,
        queued inputs are dropped (their waiters hear the session is gone), and until the purge
        no input is taken. NotFound for a session that does not exist or is deleted."""
        assert msg.reply is not None
        state = self.state
        now = now_ms()
        dropped = [q.turn_id for q in state.queue]
        events = decide_stop_for_delete(state, msg.reason, now)
        self.deleting = True
        if events:
            self._cancel_tasks()
            self._commit(events, run_drive=False)
        for turn_id in dropped:
            self.rt.results.complete(TurnOutcome(session_id=self.sid, turn_id=turn_id, state="failed",
                                                 code="not-found", reason=msg.reason, outcome="error"))
        msg.reply.set(None)

    def on_purge(self, msg: Purge) -> None:
        """Take the session out of the store (``actors/session/deletion.py``, step 3): one transaction
        removes its streams, approval and task streams, leaves ``decide_delete``'s tombstone and
        the tombstone listing record, and flags its files for deletion. After the commit the
        listeners hear of it (the listing drops it), the task registry forgets its tasks, and the
        state is the tombstone's fold (deleted: every later command answers not-found)."""
        assert msg.reply is not None
        state = self.state
        now = now_ms()
        events = decide_delete(state, now)
        record = tombstone_record(state, now)
        self._cancel_tasks()
        try:
            result = self.rt.store.purge(self.stream, events, state.version, categories=OWNED_CATEGORIES,
                                         meta=encode_summary_record(record), flags={FILES_PENDING: True})
        except BaseException:
            self._reload()
            raise
        self.last_record, self.record_dirty = record, True
        self._tell_listeners(events, result.tombstone, None)  # before the reload: listeners read what was deleted
        self.deleting = False
        self._reload()
        self.rt.tasks_service.remove_session(self.sid)
        msg.reply.set(result)


__all__ = ["FILES_PENDING", "OWNED_CATEGORIES", "SessionPurge"]
