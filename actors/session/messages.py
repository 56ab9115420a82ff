"""The messages a session actor's mailbox takes (a closed set): each one's ``run`` hands it to the
actor's handler for it. Callers outside actors/session use ``Decide`` (a ``commands.Command``),
``Ask`` (a ``commands.Query``) and ``Subscribe``; the rest are the session's own (its inputs, the
outcomes of its model calls and tools, its delete steps, passivation). ``Receipt`` and ``Created``
are what ``Send`` and ``Create`` answer.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.model.base import RetryNotice
from sessionloop.actors.session import commands as C
from sessionloop.actors.session.decide import ensure_usable
from sessionloop.actors.session.queries import answer
from sessionloop.actors.system.pubsub import Reply
from sessionloop.eventstore import IdempotencyClaim, SessionloopError

if TYPE_CHECKING:
    from sessionloop.actors.session.actor import SessionActor
    from sessionloop.actors.session.compaction import Flight

log = logging.getLogger("sessionloop.session")


def now_ms() -> int:
    return int(time.time() * 1000)


class Msg:
    """A message to a session actor; requests carry a Reply the actor completes exactly once."""

    __slots__ = ("reply",)

    def __init__(self, reply: Reply | None = None) -> None:
        self.reply = reply

    def run(self, actor: SessionActor) -> None:  # pragma: no cover - every message overrides it
        raise TypeError(type(self).__name__)


class Create(Msg):
    """Create the session, with its first input in the same commit (no ghost session if that
    fails); ``claim`` makes a retried create answer with the session it made the first time."""

    __slots__ = ("new", "initial", "claim")

    def __init__(self, new: C.NewSession, initial: C.NewInput | None, reply: Reply,
                 claim: IdempotencyClaim | None = None) -> None:
        super().__init__(reply)
        self.new, self.initial, self.claim = new, initial, claim

    def run(self, actor: SessionActor) -> None:
        actor.on_create(self)


class Send(Msg):
    """An input for the FIFO queue; ``claim`` makes it idempotent (same key -> same receipt);
    ``quota`` (the Session Loop API's) refuses it as ``rejected`` when the session or its app
    has too many unfinished turns."""

    __slots__ = ("input", "claim", "quota")

    def __init__(self, input: C.NewInput, claim: IdempotencyClaim | None, reply: Reply,
                 quota: C.Quota | None = None) -> None:
        super().__init__(reply)
        self.input, self.claim, self.quota = input, claim, quota

    def run(self, actor: SessionActor) -> None:
        actor.on_send(self)


class Cancel(Msg):
    """Stop the running turn; with ``drop_queue`` the queued inputs go too (background/stopAll)."""

    __slots__ = ("turn_id", "reason", "drop_queue")

    def __init__(self, turn_id: str | None, reason: str, reply: Reply, drop_queue: bool = False) -> None:
        super().__init__(reply)
        self.turn_id, self.reason, self.drop_queue = turn_id, reason, drop_queue

    def run(self, actor: SessionActor) -> None:
        actor.on_cancel(self)


class Freeze(Msg):
    """The first step of a delete: abort the running turn, drop the queue, take no new input."""

    __slots__ = ("reason",)

    def __init__(self, reason: str, reply: Reply) -> None:
        super().__init__(reply)
        self.reason = reason

    def run(self, actor: SessionActor) -> None:
        actor.on_freeze(self)


class Thaw(Msg):
    """A delete that failed before its purge: the session takes input again."""

    def run(self, actor: SessionActor) -> None:
        actor.deleting = False
        assert self.reply is not None
        self.reply.set(None)


class Purge(Msg):
    """The last step of a delete: the session's streams out of the store, a tombstone left."""

    def run(self, actor: SessionActor) -> None:
        actor.on_purge(self)


class ModelDone(Msg):
    __slots__ = ("step_id", "response", "error", "duration_ms")

    def __init__(self, step_id: str, response: Any, error: str | None, duration_ms: int) -> None:
        super().__init__(None)
        self.step_id, self.response, self.error, self.duration_ms = step_id, response, error, duration_ms

    def run(self, actor: SessionActor) -> None:
        actor.on_model_done(self)


class ModelRetried(Msg):
    """An attempt of the running model call failed and the provider tries again (``llm.retried``)."""

    __slots__ = ("step_id", "notice", "next_item_id")

    def __init__(self, step_id: str, notice: RetryNotice, next_item_id: str) -> None:
        super().__init__(None)
        self.step_id, self.notice, self.next_item_id = step_id, notice, next_item_id

    def run(self, actor: SessionActor) -> None:
        actor.on_model_retried(self)


class ToolDone(Msg):
    __slots__ = ("turn_id", "call_id", "result", "duration_ms")

    def __init__(self, turn_id: str, call_id: str, result: Any, duration_ms: int) -> None:
        super().__init__(None)
        self.turn_id, self.call_id, self.result, self.duration_ms = turn_id, call_id, result, duration_ms

    def run(self, actor: SessionActor) -> None:
        actor.on_tool_done(self)


class Decide(Msg):
    """A command from outside (``commands.Command``), decided into events by
    ``decide.decide_command``; the reply completes after their commit (None when there were none)."""

    __slots__ = ("command",)

    def __init__(self, command: C.Command, reply: Reply) -> None:
        super().__init__(reply)
        self.command = command

    def run(self, actor: SessionActor) -> None:
        actor.on_decide(self)


class Ask(Msg):
    """A read of the live session (``commands.Query``), answered by ``queries.answer``."""

    __slots__ = ("query",)

    def __init__(self, query: C.Query, reply: Reply) -> None:
        super().__init__(reply)
        self.query = query

    def run(self, actor: SessionActor) -> None:
        assert self.reply is not None
        try:
            value = answer(actor, self.query)
        except SessionloopError:
            raise  # the refusal (not-found, parked...), answered by the shell
        except Exception as e:  # a bug in a read: the asker hears it; the session, unchanged, goes on
            log.exception("session %s: %s failed", actor.sid, type(self.query).__name__)
            self.reply.fail(e)
            return
        self.reply.set(value)


class Subscribe(Msg):
    """A connection subscribes: the reply gets the snapshot (:class:`Snapshot`) and the connection
    becomes a subscriber under the channel's lock, so no push of this session reaches it before
    the snapshot's reply and none after it is missed."""

    __slots__ = ("subscriber",)

    def __init__(self, subscriber: Any, reply: Reply) -> None:
        super().__init__(reply)
        self.subscriber = subscriber

    def run(self, actor: SessionActor) -> None:
        actor.on_subscribe(self)


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What a new subscriber is served: the timeline's latest items (with the text a reply has
    streamed so far) and the position of the channel they are current at."""

    epoch: int
    seq: int
    items: list[Any]
    before: Any


class Compact(Msg):
    """Manual compaction: refused while a turn or another compaction runs; the reply completes
    when the summary is in (actors.session.compaction)."""

    def run(self, actor: SessionActor) -> None:
        assert self.reply is not None
        ensure_usable(actor.state)
        actor.rt.compaction.start_manual(actor, self.reply)


class SummaryDone(Msg):
    """The summary call of the compaction ``flight`` answered (``text``, its ``usage``) or failed
    (``error``, the reason as the notice and the request will say it)."""

    __slots__ = ("flight", "text", "error", "usage")

    def __init__(self, flight: Flight, text: str, error: str | None, usage: E.Usage | None) -> None:
        super().__init__(None)
        self.flight, self.text, self.error, self.usage = flight, text, error, usage

    def run(self, actor: SessionActor) -> None:
        actor.rt.compaction.finish(actor, self)


class Passivate(Msg):
    __slots__ = ("routed",)

    def __init__(self, routed: int) -> None:
        super().__init__(None)
        self.routed = routed

    def run(self, actor: SessionActor) -> None:
        actor.on_passivate(self)


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """What ``send`` answers: ``accepted`` (opened a turn now), ``queued`` (behind
    others), ``duplicate`` (this idempotency key was seen: the original turn), ``rejected``."""

    state: str
    turn_id: str | None = None
    input_id: str | None = None
    epoch: int = 0
    seq: int = 0
    position: int = 0
    retry_after_ms: int | None = None


class Created(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    turn_id: str | None = None
    duplicate: bool = False
