"""A session's inputs: its creation and the inputs for its FIFO queue (the ``Create`` and ``Send``
messages), with their idempotency and the Session Loop API's quota (:class:`SessionInputs`, mixed
into ``actors.session.actor.SessionBehaviour``).

An input with an idempotency claim is committed with it in one append: a repeat (same key and
body) answers the receipt of the first, a repeat with another body is refused
(``IdempotencyConflict``), and a claim lost to a concurrent writer answers as a duplicate. The
receipt goes out only after the commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.errors import NotFound
from sessionloop.actors.session.commands import Quota
from sessionloop.actors.session.decide import decide_create, decide_input
from sessionloop.actors.session.messages import Create, Created, Msg, Receipt, Send, now_ms
from sessionloop.actors.session.state import SessionState
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.system.pubsub import SessionChannel
from sessionloop.eventstore import IdempotencyClaim

if TYPE_CHECKING:
    from sessionloop.actors.system.runtime import Runtime

_created_enc = msgspec.msgpack.Encoder()
_created_dec = msgspec.msgpack.Decoder(Created)
_receipt_enc = msgspec.msgpack.Encoder()
_receipt_dec = msgspec.msgpack.Decoder(Receipt)


class SessionInputs:
    """``Create`` and ``Send``: decided, committed with their claim, answered after the commit."""

    rt: Runtime
    sid: str
    state: SessionState
    channel: SessionChannel
    deleting: bool
    _unfinished: int

    if TYPE_CHECKING:  # the shell's (actors.session.actor.SessionBehaviour)
        def _commit_then(self, message: Msg, events: list[E.Event], then: Any, *,
                         claim: IdempotencyClaim | None = None) -> None: ...

        def _app_id(self) -> str | None: ...

        def _account_unfinished(self) -> None: ...

    def on_create(self, msg: Create) -> None:
        assert msg.reply is not None
        claim = msg.claim
        if claim is not None:
            known = self.rt.store.lookup_claim(claim)
            if known is not None:
                msg.reply.set(_created_dec.decode(known.receipt))
                return
        events = decide_create(self.state, msg.new, msg.initial, now_ms())
        created = Created(session_id=self.sid, turn_id=msg.initial.turn_id if msg.initial else None)
        if claim is not None:
            claim = IdempotencyClaim(claim.scope, claim.key, claim.request_hash, _created_enc.encode(created))
        reply = msg.reply

        def answer(result: Any) -> None:
            if result is not None and result.duplicate:
                reply.set(msgspec.structs.replace(_created_dec.decode(result.receipt), duplicate=True))
            else:
                reply.set(created)

        self._commit_then(msg, events, answer, claim=claim)

    def on_send(self, msg: Send) -> None:
        assert msg.reply is not None
        claim = msg.claim
        if claim is not None:
            known = self.rt.store.lookup_claim(claim)  # IdempotencyConflict for another body
            if known is not None:  # the original receipt, with the cursor of the original input
                msg.reply.set(msgspec.structs.replace(_receipt_dec.decode(known.receipt), state="duplicate",
                                                      position=known.first_position))
                return
        if self.deleting:  # a repeat above still gets its receipt; a new input is refused
            raise NotFound(Text("error.session-deleting", session=self.sid))
        quota = msg.quota
        if quota is not None:
            if self._over_quota(quota):
                msg.reply.set(Receipt(state="rejected", retry_after_ms=quota.retry_after_ms, epoch=self.rt.epoch))
                return
            if self._app_id() is not None:
                # the check took the app's slot for this input: count it as ours already, so the
                # accounting after the commit does not add it twice (a reload gives it back)
                self._unfinished += 1
        accepted = msg.input
        try:
            events = decide_input(self.state, accepted, now_ms())
        except BaseException:
            if quota is not None and self._app_id() is not None:
                self._account_unfinished()  # refused before any append: the slot goes back
            raise
        state = "accepted" if not self.state.is_busy and not self.state.queue else "queued"
        receipt = Receipt(state=state, turn_id=accepted.turn_id, input_id=accepted.input_id,
                          epoch=self.rt.epoch, seq=self.channel.seq)
        if claim is not None:
            claim = IdempotencyClaim(claim.scope, claim.key, claim.request_hash, _receipt_enc.encode(receipt))
        reply = msg.reply

        def answer(result: Any) -> None:
            if result is not None and result.duplicate:
                reply.set(msgspec.structs.replace(_receipt_dec.decode(result.receipt), state="duplicate",
                                                  position=result.first_position))
            else:
                reply.set(msgspec.structs.replace(receipt, position=result.first_position if result else 0))
            self.rt.faults.hit("after-ack")

        self._commit_then(msg, events, answer, claim=claim)

    def _over_quota(self, quota: Quota) -> bool:
        """Too many unfinished turns in this session, or in all of the app's (whose count is
        shared by its sessions, so the slot is taken atomically here: ``app_reserve``; the
        session's own accounting then counts the input as already there, and a failed or
        duplicate append gives the slot back)."""
        if self.state.unfinished_turns() >= quota.per_session:
            return True
        return not self.rt.app_reserve(quota.app_id, quota.per_app)


__all__ = ["SessionInputs"]
