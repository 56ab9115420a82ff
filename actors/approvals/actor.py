"""Presence and approvals: every pending approval is an actor with its own
mailbox and stream (``approval-<session>.<approval id>``).

How a tool call that needs approval goes (``permissionMode: 'ask'``):

1. The session decides, purely, from the presence it is told: nobody present -> denied at once
   (source ``absent``, no push); too many approvals in a minute -> ``rate-limit``; otherwise it
   records ``tool.approval.requested`` and waits.
2. After that commit the session asks this service to open the approval: an ``ApprovalActor``
   persists ``approval.requested`` and pushes ``approval/requested`` to every present
   connection whose identity may answer (the owner's).
3. The first answer wins (``approval.settled``); later answers get ``approval-settled``; a wrong
   content hash ``hash-mismatch``; an ineligible identity ``forbidden``; an unknown id
   ``not-found``. Everyone who got the request gets ``approval/settled``; the session is told and
   runs or denies the call (a denial's note goes back to the model).
4. 300 s in all -> ``expired``/``timeout``. All present connections gone -> a 30 s grace, then
   ``absent`` (the grace never extends the 300 s). The turn ends -> ``cancelled``/``turn-ended``.
   Shutdown -> ``shutdown``; after a restart a pending approval is settled ``shutdown`` too; after
   a takeover (``serve --cluster``) it goes on with the wait it has left (``carry_leftovers``).

Presence: a connection is present for 10 minutes after its last ``presence/update {active:
true}``, and for as long as it holds a pushed, unsettled approval; ``active: false`` ends it at
once; a connection that never reported is not present. Going from not present to present
re-pushes what it may answer.

This module is the shell: presence, timers, pushes and the store. What an approval's stream
holds and what each step adds to it are decided in ``actors/approvals/model.py``; an
``ApprovalActor`` takes a closed set of messages (:data:`ApprovalMessage`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import msgspec
import pykka

from sessionloop.actors import events as E
from sessionloop.actors.approvals.model import (
    Answer,
    ApprovalState,
    ApprovalTiming,
    GateInputs,
    Request,
    Settle,
    SettlementSource,
    approval_of_request,
    approval_stream,
    build_approval,
    decide_answer,
    decide_request,
    decide_settle,
    evolve,
    fold,
)
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.system.pubsub import Reply
from sessionloop.actors.views.wire import wire_settlement
from sessionloop.eventstore import ANY_VERSION
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.schemas import ApprovalRequested as ApprovalRequestedParams
from sessionloop.protocol.schemas import ApprovalSettled as ApprovalSettledParams
from sessionloop.protocol.schemas import GrantRequest
from sessionloop.protocol.schemas_types import Approval

if TYPE_CHECKING:
    from sessionloop.actors.system.runtime import Runtime

log = logging.getLogger("sessionloop.approvals")


def now_ms() -> int:
    return int(time.time() * 1000)


class _Presence:
    __slots__ = ("active", "active_at", "holding")

    def __init__(self) -> None:
        self.active = False
        self.active_at = 0.0
        self.holding: set[str] = set()


class ApprovalService:
    def __init__(self, runtime: Runtime, timing: ApprovalTiming | None = None) -> None:
        self.rt = runtime
        self.timing = timing or ApprovalTiming()
        self._lock = threading.RLock()
        self._presence: dict[Any, _Presence] = {}
        self._actors: dict[str, pykka.ActorRef[Any]] = {}
        self._approvals: dict[str, Approval] = {}
        self._recent: dict[str, list[float]] = {}

    # --- presence ---------------------------------------------------------------------------------

    def _present(self, conn: Any, now: float) -> bool:
        p = self._presence.get(conn)
        if p is None or getattr(conn, "closed", False):
            return False
        return bool(p.holding) or (p.active and now - p.active_at < self.timing.presence_s)

    def eligible(self, conn: Any) -> bool:
        return bool(conn.peer.is_owner)  # the owner's console identity answers approvals

    def present_approvers(self) -> list[Any]:
        now = time.monotonic()
        with self._lock:
            return [c for c in self._presence if self.eligible(c) and self._present(c, now)]

    def update_presence(self, conn: Any, active: bool) -> None:
        now = time.monotonic()
        with self._lock:
            p = self._presence.setdefault(conn, _Presence())
            was = self._present(conn, now)
            p.active, p.active_at = active, now if active else p.active_at
            if not active:
                p.holding.clear()  # reporting inactive is absent at once
            became = not was and self._present(conn, now)
            actors = list(self._actors.values())
        for ref in actors:
            ref.tell(PresenceChanged(conn=conn if became else None))

    def hold(self, conn: Any, approval_id: str) -> None:
        with self._lock:
            self._presence.setdefault(conn, _Presence()).holding.add(approval_id)

    def release(self, approval_id: str) -> None:
        with self._lock:
            for p in self._presence.values():
                p.holding.discard(approval_id)

    def forget(self, conn: Any) -> None:
        with self._lock:
            self._presence.pop(conn, None)
            actors = list(self._actors.values())
        for ref in actors:
            ref.tell(PresenceChanged(conn=None))

    def gate(self, session_id: str, call_id: str) -> GateInputs:
        """The gate's inputs for call ``call_id`` of ``session_id``, decided now: presence and
        the rate limit; grants may settle it. (``rerun`` answers from a recording instead.)"""
        return GateInputs(present=bool(self.present_approvers()), rate_limited=self.rate_limited(session_id))

    def rate_limited(self, session_id: str) -> bool:
        now = time.monotonic()
        with self._lock:
            recent = [t for t in self._recent.get(session_id, []) if now - t < 60]
            self._recent[session_id] = recent
            return len(recent) >= self.timing.rate_limit

    # --- approvals ---------------------------------------------------------------------------------

    def open(self, state: Any, event: E.ToolApprovalRequested) -> None:
        """Start the approval actor of a ``tool.approval.requested`` the session committed
        (``state``: the session's state after that commit)."""
        rec = state.tool_calls[event.call_id]
        approval = build_approval(state, rec, event.approval_id, self.timing.wait_s, self.rt.chain_of(state), now_ms())
        with self._lock:
            self._recent.setdefault(state.session_id, []).append(time.monotonic())
            self._approvals[event.approval_id] = approval
            self._actors[event.approval_id] = ApprovalActor.start(self, approval)

    def pending_all(self) -> list[Approval]:
        with self._lock:
            return list(self._approvals.values())

    def pending_for(self, session_id: str) -> list[Approval]:
        with self._lock:
            return [a for a in self._approvals.values() if a.session_id == session_id]

    def respond(self, conn: Any, approval_id: str, decision: str, content: str, note: str | None,
                reply: Reply, grant: GrantRequest | None = None) -> None:
        """Answer an approval; ``grant`` makes the answer settle later calls too."""
        with self._lock:
            ref = self._actors.get(approval_id)
        if ref is None:
            if self._settled_before(approval_id):
                reply.fail(RpcError.approval_settled(Text("error.approval-settled", approval=approval_id)))
            else:
                reply.fail(RpcError.not_found(Text("error.approval-not-found", approval=approval_id)))
            return
        ref.tell(Respond(conn=conn, decision=decision, content=content, note=note, reply=reply, grant=grant))

    def _settled_before(self, approval_id: str) -> bool:
        try:
            return self.rt.store.stream_version(approval_stream("", approval_id)) > 1
        except Exception:  # not even a valid stream name: an id this server never issued
            return False

    def cancel(self, approval_id: str, source: SettlementSource) -> None:
        with self._lock:
            ref = self._actors.get(approval_id)
        if ref is not None:
            ref.tell(Cancel(source=source))

    def finished(self, approval_id: str) -> None:
        with self._lock:
            self._actors.pop(approval_id, None)
            self._approvals.pop(approval_id, None)
        self.release(approval_id)

    def settle_sessions(self, session_ids: list[str], timeout: float = 5.0) -> None:
        """Settle the sessions' pending approvals ``turn-ended`` and wait until each is recorded
        (a delete, before it purges: a settlement written after the purge would be refused).
        Blocks: call it off every actor thread."""
        wanted = set(session_ids)
        with self._lock:
            refs = [self._actors[a.id] for a in self._approvals.values() if a.session_id in wanted
                    and a.id in self._actors]
        for ref in refs:
            try:
                ref.ask(Cancel(source="turn-ended"), timeout=timeout)
            except (pykka.ActorDeadError, pykka.Timeout):
                pass  # settled meanwhile, or it does not answer: the purge seals its stream either way

    def connections(self) -> list[Any]:
        with self._lock:
            return list(self._presence)

    def shutdown(self) -> None:
        """Settle every pending approval ``shutdown`` and stop their actors."""
        with self._lock:
            refs = list(self._actors.values())
        for ref in refs:
            try:
                ref.ask(Cancel(source="shutdown"), timeout=5)
                ref.stop(timeout=5)
            except (pykka.ActorDeadError, pykka.Timeout):
                pass

    def settle_leftovers(self) -> int:
        """After a restart: approvals still pending in the store are settled ``shutdown``."""
        count = 0
        for stream, state in self._leftovers():
            settled = decide_settle(state, Settle(state="cancelled", source="shutdown"), now_ms())
            if not settled:  # settled already (its flag goes with that append, so this does not happen)
                continue
            self.rt.store.append(stream, settled, ANY_VERSION, flags={"approval-pending": False})
            count += 1
        return count

    def carry_leftovers(self) -> int:
        """After a takeover (``serve --cluster``: the node took the sessions over from the log):
        approvals still pending go on where the old owner left them, each an actor again with
        the wait it has left (one whose time ran out meanwhile settles ``expired`` at once) and
        the presence grace started now (nobody is present yet: an owner who comes back and
        reports presence within the grace is pushed the request again). Their sessions, woken
        after this, leave them open (``is_open``) and wait for their answers."""
        count = 0
        for _stream, state in self._leftovers():
            requested = state.requested
            assert requested is not None
            created = self.rt.store.read_stream(f"session-{requested.session_id}", limit=1)
            first = created[0].event if created else None
            approval = approval_of_request(requested, first if isinstance(first, E.SessionCreated) else None)
            with self._lock:
                self._approvals[approval.id] = approval
                self._actors[approval.id] = ApprovalActor.start(self, approval, state)
            count += 1
        if count:
            log.info("carried %d pending approvals over from the node before", count)
        return count

    def is_open(self, approval_id: str) -> bool:
        """Whether the approval has a live actor here (a carried one stays open in its session)."""
        with self._lock:
            return approval_id in self._actors

    def _leftovers(self) -> list[tuple[str, ApprovalState]]:
        """The pending approvals in the store this process owns: (stream, fold)."""
        out = []
        for stream in self.rt.store.flagged("approval-pending"):
            if not self.rt.store.owns(stream):  # another worker's to settle
                continue
            recorded = self.rt.store.read_stream(stream)
            if not recorded or not isinstance(recorded[0].event, E.ApprovalRequested):
                continue
            out.append((stream, fold([r.event for r in recorded if isinstance(r.event, E.Event)])))
        return out


# --- the approval actor's messages (a closed set) -----------------------------------------------


class Respond(msgspec.Struct, frozen=True, kw_only=True):
    """``approval/respond`` from ``conn``; ``reply`` completes once the answer is recorded (or fails)."""

    conn: Any
    decision: str
    content: str
    note: str | None
    reply: Reply
    grant: GrantRequest | None = None


class Expire(msgspec.Struct, frozen=True):
    """The approval's wait is over (``expired``/``timeout``)."""


class GraceOver(msgspec.Struct, frozen=True):
    """The grace that started when the last present connection went is over, unless a later
    change of presence started another (``token``)."""

    token: int


class PresenceChanged(msgspec.Struct, frozen=True):
    """Presence changed; ``conn`` is a connection that just became present (push it the request)."""

    conn: Any = None


class Cancel(msgspec.Struct, frozen=True):
    """Settle it ``cancelled`` with ``source`` (``turn-ended``, ``shutdown``); ``ask`` returns once recorded."""

    source: SettlementSource


ApprovalMessage = Respond | Expire | GraceOver | PresenceChanged | Cancel


class ApprovalActor(pykka.ThreadingActor):
    """One pending approval: its stream, its pushes, its timers; settles exactly once.

    Decide, persist, publish: each step asks the model (``actors/approvals/model.py``) for the
    events, appends them, and only after that commit folds them into ``state`` and tells anyone
    (the answer's reply, the ``approval/settled`` pushes, the session). A failed append leaves
    ``state`` as it was; the answer that caused it fails ``internal_error``.
    """

    use_daemon_thread = True

    def __init__(self, service: ApprovalService, approval: Approval, recorded: ApprovalState | None = None) -> None:
        """``recorded``: the fold of its stream when it is carried over (its request recorded)."""
        super().__init__()
        self.svc = service
        self.approval = approval
        self.stream = approval_stream(approval.session_id, approval.id)
        self.state = recorded or ApprovalState()
        self.got: set[Any] = set()
        self.grace_token = 0
        self.grace_deadline: float | None = None

    def on_start(self) -> None:
        a = self.approval
        events = decide_request(self.state, Request(approval=a), now_ms())
        if events:  # nothing when it was carried over: its request is recorded
            self.svc.rt.store.append(self.stream, events, ANY_VERSION, flags={"approval-pending": True})
            self._evolve(events)
        self._later(max(0.0, a.expires_at / 1000 - time.time()), Expire())
        self._push_to_present()

    def _evolve(self, events: list[E.Event]) -> None:
        for event in events:
            self.state = evolve(self.state, event)

    def _later(self, delay: float, message: ApprovalMessage) -> None:
        ref = self.actor_ref
        self.svc.rt.worker.later(delay, lambda: ref.tell(message) if ref.is_alive() else None)

    def _push_to_present(self, only: Any = None) -> None:
        frame = ApprovalRequestedParams(approval=self.approval)
        targets = [only] if only is not None else self.svc.present_approvers()
        for conn in targets:
            if not self.svc.eligible(conn):
                continue
            self.got.add(conn)
            self.svc.hold(conn, self.approval.id)
            conn.notify("approval/requested", frame)
        self._check_grace()

    def _check_grace(self) -> None:
        """All present connections gone -> 30 s grace, then absent (never beyond 300 s)."""
        if self.svc.present_approvers():
            self.grace_deadline = None
            self.grace_token += 1
            return
        if self.grace_deadline is None:
            self.grace_deadline = time.monotonic() + self.svc.timing.grace_s
            self.grace_token += 1
            self._later(self.svc.timing.grace_s, GraceOver(self.grace_token))

    def on_receive(self, message: Any) -> Any:
        try:
            self._receive(message)
        except RpcError as e:  # the model refused the answer: the client hears why
            if isinstance(message, Respond):
                message.reply.fail(e)
        except Exception:
            log.exception("approval %s failed handling %s", self.approval.id, type(message).__name__)
            if isinstance(message, Respond):
                message.reply.fail(RpcError.internal_error(Text("error.approval-not-recorded")))
        return None

    def _receive(self, message: Any) -> None:
        match message:
            case Respond():
                self._respond(message)
            case Expire():
                self._settle(Settle(state="expired", source="timeout"))
            case GraceOver(token=token):
                if self.state.pending and token == self.grace_token and not self.svc.present_approvers():
                    self._settle(Settle(state="denied", source="absent"))
            case PresenceChanged(conn=conn):
                if not self.state.pending:
                    return
                if conn is not None:  # a connection became present: push it again
                    self._push_to_present(conn)
                else:
                    self._check_grace()
            case Cancel(source=source):
                self._settle(Settle(state="cancelled", source=source))
            case _:
                log.warning("approval %s ignores a message it does not know: %r", self.approval.id, message)

    def _respond(self, message: Respond) -> None:
        conn = message.conn
        by = E.Speaker(platform=conn.peer.platform, user_id=conn.peer.user_id, owner=conn.peer.is_owner)
        answer = Answer(decision=message.decision, content=message.content, note=message.note, by=by,
                        eligible=self.svc.eligible(conn), grant=message.grant)
        self._commit(decide_answer(self.state, answer, now_ms()), message.reply)

    def _settle(self, command: Settle) -> None:
        self._commit(decide_settle(self.state, command, now_ms()), None)

    def _commit(self, events: list[E.Event], reply: Reply | None) -> None:
        """Append the settlement, then fold it, then acknowledge, push and tell the session."""
        if not events:  # settled already: it settles once
            return
        self.svc.rt.store.append(self.stream, events, ANY_VERSION, flags={"approval-pending": False})
        self.svc.rt.faults.hit("approval-commit")
        self._evolve(events)
        settlement = self.state.settlement
        assert settlement is not None  # the only events decided after the request settle it
        if reply is not None:  # the answer is recorded: acknowledge it before anything it causes
            reply.set(None)
        frame = ApprovalSettledParams.of(self.approval.id, wire_settlement(settlement))
        for conn in self.got:
            conn.notify("approval/settled", frame)
        self.svc.finished(self.approval.id)
        if settlement.source not in ("turn-ended", "shutdown"):  # the session itself decided those
            self.svc.rt.approval_settled(self.approval, settlement)
        self.stop()
