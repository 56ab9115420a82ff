"""The Session Loop API over the wire (``loop/*``, docs/protocol.md) for connections holding an app token.

The same rules as the Python API in ``session_loop.py`` (it is called underneath); answers are
camelCase mirrors of the Python API's objects. The owner's connection has no app identity
and gets ``forbidden``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from sessionloop.actors.api.feed_tail import FeedTails
from sessionloop.actors.api.loop import turn_result
from sessionloop.actors.errors import InvalidCommand
from sessionloop.actors.gateway.methods import Client, Handler, answer, in_background, store_attachments
from sessionloop.actors.system.pubsub import Reply
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.frames import RequestId
from sessionloop.protocol.limits import MAX_INT
from sessionloop.protocol.schemas_loop import (
    LoopCreateParams,
    LoopCreateResult,
    LoopEvent,
    LoopEventParams,
    LoopListEventsParams,
    LoopListEventsResult,
    LoopSendParams,
    LoopSendResult,
    LoopWaitForTurnParams,
    LoopWaitForTurnResult,
    LoopWatchParams,
    LoopWatchResult,
)

if TYPE_CHECKING:
    from sessionloop.actors.gateway.service import SessionProtocolService

log = logging.getLogger("sessionloop.gateway")


def loop_handlers(svc: SessionProtocolService, host: Any) -> tuple[dict[str, Handler], LoopHandlers]:
    """The ``loop/*`` methods, and their holder (``forget``: what the service calls when a
    connection closes, its event watch ends; ``tail``: the feed of ``GET /api/loop/events``)."""
    h = LoopHandlers(svc, host)
    handlers: dict[str, Handler] = {
        "loop/create": h.create,
        "loop/send": h.send,
        "loop/waitForTurn": h.wait_for_turn,
        "loop/listEvents": h.list_events,
        "loop/watch": h.watch,
    }
    return handlers, h


def wire_event(e: Any) -> LoopEvent:
    return LoopEvent(cursor=str(e.cursor), session_id=e.session_id, type=e.type, at=e.at, data=e.data,
                     turn_id=e.turn_id)


class LoopHandlers:
    def __init__(self, svc: SessionProtocolService, host: Any) -> None:
        self.svc = svc
        self.host = host
        self.unsubscribers: dict[Any, Any] = {}
        self.tails = FeedTails(host.rt.store, host.loop_watchers)

    def loop_of(self, conn: Client) -> Any:
        if conn.peer.app_id is None:
            raise RpcError.forbidden("loop/* methods are for apps: connect with an app token")
        return self.host.sessions(app=conn.peer.app_id)

    def create(self, conn: Client, request_id: RequestId, p: LoopCreateParams) -> None:
        loop = self.loop_of(conn)
        if p.context is not None:
            raise RpcError.invalid_params("params.context: 'caller' is only valid inside a tool's execution")
        initial = None
        if p.initial_message is not None:
            initial = {"text": p.initial_message.text, "idempotency_key": p.initial_message.idempotency_key}

        def work() -> LoopCreateResult:
            made = loop.create(container_id=p.container_id, space={"spaceId": p.space.space_id} if p.space else None,
                               title=p.title or "", activity=p.activity or "interactive",
                               permission_mode=p.permission_mode, initial_message=initial,
                               chat={"type": p.chat.type, "multiParty": p.chat.multi_party} if p.chat else None,
                               account=p.account,
                               place={"key": p.place.key, "name": p.place.name} if p.place else None)
            return LoopCreateResult(session_id=made.session_id, turn_id=made.turn_id)

        in_background(self.svc, conn, request_id, work)

    def send(self, conn: Client, request_id: RequestId, p: LoopSendParams) -> None:
        loop = self.loop_of(conn)

        def receipt(r: Any) -> msgspec.Struct:
            return LoopSendResult(state=r.state, epoch=r.epoch, seq=r.seq, turn_id=r.turn_id,
                                  retry_after_ms=r.retry_after_ms,
                                  cursor=str(r.position - 1) if r.position else None)

        if p.attachments:
            def work() -> msgspec.Struct:
                loop._owned(p.session_id)  # refused before any attachment is saved: nothing half-written
                refs = store_attachments(self.svc, p.attachments, p.session_id)
                return receipt(loop.send(p.session_id, p.text, p.idempotency_key, refs, traceparent=p.traceparent))

            in_background(self.svc, conn, request_id, work)
            return
        reply = answer(conn, request_id, receipt)
        self.svc.rt.tell(p.session_id, loop._send_message(p.session_id, p.text, p.idempotency_key, [], reply,
                                                          p.traceparent))

    def wait_for_turn(self, conn: Client, request_id: RequestId, p: LoopWaitForTurnParams) -> None:
        loop = self.loop_of(conn)
        timeout = loop.clamp_timeout_ms(p.timeout_ms)  # before the waiter exists: nothing to undo
        reply: Reply = loop._watch(p.session_id, p.turn_id)
        worker = self.svc.rt.worker

        def done(r: Reply) -> None:
            worker.deadlines.cancel(deadline)
            value, error = r.outcome()
            if error is not None:
                conn.error(request_id, error)
            elif value is None:
                conn.result(request_id, LoopWaitForTurnResult(state="timeout"))
            else:
                result = _result(value)
                conn.result(request_id, LoopWaitForTurnResult(state=result.state, output_text=result.output_text,
                                                              code=result.code, message=result.message))

        def expire() -> None:
            self.svc.rt.results.cancel_wait(p.turn_id, reply.set)
            reply.set(None)  # a timeout ends this wait only; the turn goes on

        deadline = worker.later(timeout, expire)
        reply.add_callback(done)

    def list_events(self, conn: Client, request_id: RequestId, p: LoopListEventsParams) -> None:
        loop = self.loop_of(conn)

        def work() -> LoopListEventsResult:  # errors raised here become the request's error reply
            try:
                after = int(p.after) if p.after is not None else None
            except ValueError:
                raise InvalidCommand("params.after: not a cursor from this server") from None
            page = loop.list_events(p.session_id, after, p.limit or 100)
            return LoopListEventsResult(events=[wire_event(e) for e in page.events],
                                        next_cursor=str(page.next_cursor) if page.next_cursor is not None else None)

        in_background(self.svc, conn, request_id, work)

    def watch(self, conn: Client, request_id: RequestId, p: LoopWatchParams) -> None:
        """Answer the cursor the watch starts after, then deliver the feed after it (a tail:
        ``actors/api/feed_tail.py``). A second ``loop/watch`` on the connection replaces the first."""
        loop = self.loop_of(conn)
        after = parse_cursor("params.cursor", p.cursor)

        def start() -> None:
            try:
                begin(self.tails.check(loop.app.id, after))
            except BaseException as e:  # CursorExpired, a failed read, or a bug: the request's error
                conn.error(request_id, e)

        def begin(start_after: int) -> None:
            def deliver(e: Any) -> bool:
                conn.notify("loop/event", LoopEventParams(event=wire_event(e)))
                return not conn.closed

            def ended(error: BaseException) -> None:
                # the cursor expired under a consumer that fell behind the retention: closed as
                # a slow consumer; its next ``loop/watch`` from that cursor is ``cursor-expired``
                log.warning("loop/watch of app %s ended: %s", loop.app.id, error)
                disconnect = getattr(conn.peer, "disconnect", None)
                if disconnect is not None:
                    disconnect(4008, "slow consumer: the watch fell behind the event feed")

            self.forget(conn)
            # listening before the answer (nothing told after it is missed), delivering after it
            tail = self.tails.tail(loop.app.id, start_after, deliver, ended, begin=False)
            self.unsubscribers[conn] = tail.close
            conn.result(request_id, LoopWatchResult(cursor=str(start_after)))
            if conn.closed:
                self.forget(conn)
                return
            tail.begin()

        self.svc.slow.submit(start)

    def forget(self, conn: Any) -> None:
        unsubscribe = self.unsubscribers.pop(conn, None)
        if unsubscribe is not None:
            unsubscribe()

    def tail(self, app_id: str, cursor: int | None, deliver: Callable[[Any], bool],
             ended: Callable[[BaseException], None]) -> tuple[int, Callable[[], None]]:
        """For ``GET /api/loop/events``: the cursor a tail of ``app_id``'s feed starts after
        (CursorExpired if retention passed ``cursor``) and the function that closes it."""
        self.host.sessions(app=app_id)  # an app without permissions.sessions is refused here
        start_after = self.tails.check(app_id, cursor)
        return start_after, self.tails.tail(app_id, start_after, deliver, ended).close


def parse_cursor(field: str, value: str | None) -> int | None:
    """A cursor of the wire (a string of digits, at most 2**63 - 1), or None."""
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or int(value) > MAX_INT:
        raise RpcError.invalid_params(f"{field}: not a cursor from this server (digits, from 0 to 2**63 - 1)")
    return int(value)


def _result(outcome: Any) -> Any:
    return turn_result(outcome)
