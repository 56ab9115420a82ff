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
   Shutdown -> ``shutdown``; after a restart a pending approval is settled ``shutdown`` too.

Presence: a connection is present for 10 minutes after its last ``presence/update {active:
true}``, and for as long as it holds a pushed, unsettled approval; ``active: false`` ends it at
once; a connection that never reported is not present. Going from not present to present
re-pushes what it may answer.
"""

from __future__ import annotations

import difflib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import pykka

from sessionloop.actors import events as E
from sessionloop.actors.approvals.grants import terms_for
from sessionloop.actors.settings.texts import Text, message_of
from sessionloop.actors.system.pubsub import Reply
from sessionloop.actors.views.items import wire_settlement
from sessionloop.eventstore import ANY_VERSION, request_hash
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.schemas import ApprovalRequested as ApprovalRequestedParams
from sessionloop.protocol.schemas import ApprovalSettled as ApprovalSettledParams
from sessionloop.protocol.schemas import GrantRequest
from sessionloop.protocol.schemas_types import (
    AncestorRef,
    Approval,
    ApprovalDiff,
    ApprovalFacts,
    ApprovalOrigin,
    Participant,
)

if TYPE_CHECKING:
    from sessionloop.actors.system.runtime import Runtime

log = logging.getLogger("sessionloop.approvals")

# how an approval ended and what ended it, as E.Settlement records them
SettlementState = Literal["approved", "denied", "expired", "cancelled"]
SettlementSource = Literal["answer", "absent", "timeout", "ineligible", "rate-limit", "turn-ended", "shutdown",
                           "grant"]


class ApprovalTiming(msgspec.Struct, frozen=True, kw_only=True):
    wait_s: float = 300.0  # an approval waits 300 s at most
    grace_s: float = 30.0  # with nobody present, 30 s to reconnect before it is denied
    presence_s: float = 600.0  # a presence report counts for 10 minutes
    rate_limit: int = 10  # approvals per session per minute before ``rate-limit``


def now_ms() -> int:
    return int(time.time() * 1000)


def approval_stream(session_id: str, approval_id: str) -> str:
    """``approval-<session>.<turn>.<call>``: approval ids already begin with their session id."""
    return f"approval-{approval_id}"


def content_hash(facts: ApprovalFacts) -> str:
    """Over a canonical re-encoding (sorted keys), never the raw bytes (RELIABILITY, msgspec)."""
    return request_hash(msgspec.to_builtins(facts))


class GateInputs(msgspec.Struct, frozen=True, kw_only=True):
    """What a session's approval gate (``session_decide._gate``) is told about one call."""

    present: bool  # someone who may answer is present: ask (else denied at once, ``absent``)
    rate_limited: bool  # the session asked too often in the last minute (``rate-limit``)
    grants: bool = True  # the session's grants may settle the call


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
            ref.tell(("presence", conn if became else None))

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
            ref.tell(("presence", None))

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

    def open(self, session_actor: Any, event: E.ToolApprovalRequested) -> None:
        """Start the approval actor of a ``tool.approval.requested`` the session committed."""
        state = session_actor.state
        rec = state.tool_calls[event.call_id]
        approval = build_approval(state, rec, event.approval_id, self.timing.wait_s, self.rt.chain_of(state))
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
        ref.tell(("respond", (conn, decision, content, note, reply, grant)))

    def _settled_before(self, approval_id: str) -> bool:
        try:
            return self.rt.store.stream_version(approval_stream("", approval_id)) > 1
        except Exception:  # not even a valid stream name: an id this server never issued
            return False

    def cancel(self, approval_id: str, source: str) -> None:
        with self._lock:
            ref = self._actors.get(approval_id)
        if ref is not None:
            ref.tell(("cancel", source))

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
                ref.ask(("cancel", "turn-ended"), timeout=timeout)
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
                ref.ask(("cancel", "shutdown"), timeout=5)
                ref.stop(timeout=5)
            except (pykka.ActorDeadError, pykka.Timeout):
                pass

    def settle_leftovers(self) -> int:
        """After a restart: approvals still pending in the store are settled ``shutdown``."""
        count = 0
        for stream in self.rt.store.flagged("approval-pending"):
            events = self.rt.store.read_stream(stream)
            if not events or not isinstance(events[0].event, E.ApprovalRequested):
                continue
            settlement = E.Settlement(state="cancelled", source="shutdown", at=now_ms())
            self.rt.store.append(stream, [E.ApprovalSettled(at=settlement.at, approval_id=events[0].event.approval_id,
                                                            settlement=settlement)], ANY_VERSION,
                                 flags={"approval-pending": False})
            count += 1
        return count


class ApprovalActor(pykka.ThreadingActor):
    """One pending approval: its stream, its pushes, its timers; settles exactly once."""

    use_daemon_thread = True

    def __init__(self, service: ApprovalService, approval: Approval) -> None:
        super().__init__()
        self.svc = service
        self.approval = approval
        self.stream = approval_stream(approval.session_id, approval.id)
        self.got: set[Any] = set()
        self.settled: E.Settlement | None = None
        self.grace_token = 0
        self.grace_deadline: float | None = None

    def on_start(self) -> None:
        a = self.approval
        facts = E.ApprovalFacts(params=dict(a.facts.params), command=a.facts.command, cwd=a.facts.cwd,
                                diff_path=a.facts.diff.path if a.facts.diff else None,
                                diff_patch=a.facts.diff.patch if a.facts.diff else None, sandbox=a.facts.sandbox)
        event = E.ApprovalRequested(
            at=now_ms(), approval_id=a.id, session_id=a.session_id, turn_id=a.turn_id, call_id=a.call_id,
            origin=E.OriginInfo(kind=a.origin.kind), tool=a.tool, facts=facts, content_hash=a.content_hash,
            expires_at=a.expires_at, chain=[E.ChainLink(id=c.id, title=c.title) for c in a.chain or []])
        self.svc.rt.store.append(self.stream, [event], ANY_VERSION, flags={"approval-pending": True})
        self._later(max(0.0, a.expires_at / 1000 - time.time()), ("timeout", None))
        self._push_to_present()

    def _later(self, delay: float, message: Any) -> None:
        loop = self.svc.rt.worker.loop
        ref = self.actor_ref
        loop.call_soon_threadsafe(loop.call_later, delay, lambda: ref.tell(message) if ref.is_alive() else None)

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
            self._later(self.svc.timing.grace_s, ("grace", self.grace_token))

    def on_receive(self, message: Any) -> Any:
        kind, payload = message
        if self.settled is not None:
            if kind == "respond":
                payload[4].fail(RpcError.approval_settled(Text("error.approval-settled", approval=self.approval.id)))
            return None
        try:
            return self._handle(kind, payload)
        except Exception:
            log.exception("approval %s failed handling %s", self.approval.id, kind)
            if kind == "respond":
                payload[4].fail(RpcError.internal_error(Text("error.approval-not-recorded")))
            return None

    def _handle(self, kind: str, payload: Any) -> Any:
        if kind == "respond":
            self._respond(*payload)
        elif kind == "timeout":
            self._settle("expired", "timeout", None, None)
        elif kind == "grace":
            if payload == self.grace_token and not self.svc.present_approvers():
                self._settle("denied", "absent", None, None)
        elif kind == "presence":
            if payload is not None:  # a connection became present: push it again
                self._push_to_present(payload)
            else:
                self._check_grace()
        elif kind == "cancel":
            self._settle("cancelled", payload, None, None)
        return None

    def _respond(self, conn: Any, decision: str, content: str, note: str | None, reply: Reply,
                 grant: GrantRequest | None) -> None:
        if not self.svc.eligible(conn):
            reply.fail(RpcError.forbidden(Text("error.approval-forbidden")))
            return
        if content != self.approval.content_hash:
            reply.fail(RpcError.hash_mismatch(Text("error.approval-hash", approval=self.approval.id)))
            return
        terms = None
        if grant is not None:
            try:
                terms = terms_for(self.approval.tool, grant.scope, grant.command_prefix, grant.expires_in_ms, now_ms())
            except ValueError as e:
                reply.fail(RpcError.invalid_params(Text("error.params", problem=message_of(e))))
                return
        by = E.Speaker(platform=conn.peer.platform, user_id=conn.peer.user_id, owner=conn.peer.is_owner)
        self._settle("approved" if decision == "approve" else "denied", "answer", by, note, reply, terms)

    def _settle(self, state: SettlementState, source: SettlementSource, by: E.Speaker | None, note: str | None,
                reply: Reply | None = None, grant: E.GrantTerms | None = None) -> None:
        settlement = E.Settlement(state=state, source=source, at=now_ms(), by=by, note=note,
                                  grant=grant)
        self.svc.rt.store.append(self.stream, [E.ApprovalSettled(at=settlement.at, approval_id=self.approval.id,
                                                                 settlement=settlement)],
                                 ANY_VERSION, flags={"approval-pending": False})
        self.svc.rt.faults.hit("approval-commit")
        self.settled = settlement
        if reply is not None:  # the answer is recorded: acknowledge it before anything it causes
            reply.set(None)
        frame = ApprovalSettledParams.of(self.approval.id, wire_settlement(settlement))
        for conn in self.got:
            conn.notify("approval/settled", frame)
        self.svc.finished(self.approval.id)
        if source not in ("turn-ended", "shutdown"):  # the session itself decided those
            self.svc.rt.approval_settled(self.approval, settlement)
        self.stop()


def build_approval(state: Any, rec: Any, approval_id: str, wait_s: float, chain: list[AncestorRef]) -> Approval:
    """The protocol's Approval object for a tool call: facts verbatim from the arguments."""
    args = rec.args if isinstance(rec.args, dict) else {}
    display = rec.display
    diff = None
    if rec.tool == "write_file" and isinstance(args.get("path"), str):
        diff = ApprovalDiff(path=args["path"], patch=_patch(display.removed if display else None,
                                                            args.get("content")))
    facts = ApprovalFacts(params=args, command=args.get("command") if isinstance(args.get("command"), str) else None,
                          cwd=args.get("cwd") if isinstance(args.get("cwd"), str) else None, diff=diff,
                          sandbox=display.sandbox if display is not None else None)
    participants = []
    created = state.created
    if created is not None and created.created_by is not None and created.created_by.user_id:
        participants.append(Participant(platform=created.created_by.platform, user_id=created.created_by.user_id))
    return Approval(
        id=approval_id, session_id=state.session_id, turn_id=rec.turn_id, call_id=rec.call_id,
        origin=ApprovalOrigin(kind="autonomous" if created is not None and created.activity == "background" else "hand",
                              participants=participants),
        target="tool", tool=rec.tool, facts=facts, options=["approve", "deny"], content_hash=content_hash(facts),
        expires_at=now_ms() + int(wait_s * 1000), state="pending", chain=chain or None,
    )


def _patch(old: str | None, new: Any) -> str:
    before = (old or "").splitlines(keepends=True)
    after = (new if isinstance(new, str) else "").splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, "before", "after"))
