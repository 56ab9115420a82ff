"""One approval, pure: what its stream folds to, and the decisions that add to it.

An approval's stream (``approval-<session>.<approval id>``) holds at most two facts: the
``approval.requested`` that opens it and the ``approval.settled`` that closes it. Its state
(:class:`ApprovalState`) is the fold of them (:func:`evolve`). The decisions take the state, a
typed command and the time, and return the events to append (this module is the only place those
two events are built):

* :func:`decide_request` (:class:`Request`): record what is asked, once;
* :func:`decide_answer` (:class:`Answer`): the first answer wins; an answer to a settled approval
  is refused ``approval-settled``, one from an identity that may not answer ``forbidden``, one with
  another content hash ``hash-mismatch``, one asking for a grant that does not fit
  ``invalidParams`` (each raises the :class:`RpcError` the client gets);
* :func:`decide_settle` (:class:`Settle`): settle it without an answer (expired, absent,
  cancelled); nothing once it is settled.

No I/O, no clock: ``now`` (epoch milliseconds) is handed in. The actor shell
(``actors/approvals/actor.py``) appends what is decided, and only after that commit folds it and
tells anyone (the reply, the pushes, the session).

Also here, because they are pure: the protocol's ``Approval`` of a tool call
(:func:`build_approval`), its content hash, the stream name, the timing and the gate's inputs.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.approvals.grants import terms_for
from sessionloop.actors.errors import InvalidCommand
from sessionloop.actors.settings.texts import Text, message_of
from sessionloop.eventstore import request_hash
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.schemas import GrantRequest
from sessionloop.protocol.schemas_types import (
    AncestorRef,
    Approval,
    ApprovalDiff,
    ApprovalFacts,
    ApprovalOrigin,
    Participant,
)

# how an approval ended and what ended it, as E.Settlement records them
SettlementState = Literal["approved", "denied", "expired", "cancelled"]
SettlementSource = Literal["answer", "absent", "timeout", "ineligible", "rate-limit", "turn-ended", "shutdown",
                           "grant"]


class ApprovalTiming(msgspec.Struct, frozen=True, kw_only=True):
    wait_s: float = 300.0  # an approval waits 300 s at most
    grace_s: float = 30.0  # with nobody present, 30 s to reconnect before it is denied
    presence_s: float = 600.0  # a presence report counts for 10 minutes
    rate_limit: int = 10  # approvals per session per minute before ``rate-limit``


class GateInputs(msgspec.Struct, frozen=True, kw_only=True):
    """What a session's approval gate (``session_decide._gate``) is told about one call."""

    present: bool  # someone who may answer is present: ask (else denied at once, ``absent``)
    rate_limited: bool  # the session asked too often in the last minute (``rate-limit``)
    grants: bool = True  # the session's grants may settle the call


def approval_stream(session_id: str, approval_id: str) -> str:
    """``approval-<session>.<turn>.<call>``: approval ids already begin with their session id."""
    return f"approval-{approval_id}"


def content_hash(facts: ApprovalFacts) -> str:
    """Over a canonical re-encoding (sorted keys), never the raw bytes (RELIABILITY, msgspec)."""
    return request_hash(msgspec.to_builtins(facts))


# --- state ---------------------------------------------------------------------------------------


class ApprovalState(msgspec.Struct, frozen=True, kw_only=True):
    """The fold of an approval's stream: what was asked, and how it ended (None while pending)."""

    requested: E.ApprovalRequested | None = None
    settlement: E.Settlement | None = None

    @property
    def pending(self) -> bool:
        """Requested and not settled yet: the only state in which anything is decided."""
        return self.requested is not None and self.settlement is None


def evolve(state: ApprovalState, event: E.Event) -> ApprovalState:
    """The state after ``event`` (total: an event of another kind leaves it as it is)."""
    match event:
        case E.ApprovalRequested():
            return msgspec.structs.replace(state, requested=event)
        case E.ApprovalSettled(settlement=settlement):
            return msgspec.structs.replace(state, settlement=settlement)
    return state


def fold(events: list[E.Event]) -> ApprovalState:
    """The state of a stream holding ``events``, from nothing."""
    state = ApprovalState()
    for event in events:
        state = evolve(state, event)
    return state


# --- commands and decisions ----------------------------------------------------------------------


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """Record that ``approval`` is asked (the actor's first step)."""

    approval: Approval


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """An answer from a connection: ``eligible`` says whether its identity may answer, ``by`` who
    it is; ``content`` must be the approval's content hash; ``grant`` makes it settle later calls."""

    decision: str
    content: str
    note: str | None
    by: E.Speaker
    eligible: bool
    grant: GrantRequest | None = None


class Settle(msgspec.Struct, frozen=True, kw_only=True):
    """Settle without an answer: expired (``timeout``), denied (``absent``), cancelled (the turn
    ended, shutdown, ...)."""

    state: SettlementState
    source: SettlementSource


Command = Request | Answer | Settle


def decide_request(state: ApprovalState, command: Request, now: int) -> list[E.Event]:
    """``approval.requested`` with the approval's facts verbatim; nothing if already recorded."""
    if state.requested is not None:
        return []
    a = command.approval
    diff = a.facts.diff
    facts = E.ApprovalFacts(params=dict(a.facts.params), command=a.facts.command, cwd=a.facts.cwd,
                            diff_path=diff.path if diff else None, diff_patch=diff.patch if diff else None,
                            sandbox=a.facts.sandbox)
    return [E.ApprovalRequested(
        at=now, approval_id=a.id, session_id=a.session_id, turn_id=a.turn_id, call_id=a.call_id,
        origin=E.OriginInfo(kind=a.origin.kind), tool=a.tool, facts=facts, content_hash=a.content_hash,
        expires_at=a.expires_at, chain=[E.ChainLink(id=c.id, title=c.title) for c in a.chain or []])]


def decide_answer(state: ApprovalState, command: Answer, now: int) -> list[E.Event]:
    """The answer settles the approval (``approved`` or ``denied``, source ``answer``); raises the
    RpcError the answering client gets when it cannot (see the module doc), in that order."""
    requested = _requested(state)
    if state.settlement is not None:
        raise RpcError.approval_settled(Text("error.approval-settled", approval=requested.approval_id))
    if not command.eligible:
        raise RpcError.forbidden(Text("error.approval-forbidden"))
    if command.content != requested.content_hash:
        raise RpcError.hash_mismatch(Text("error.approval-hash", approval=requested.approval_id))
    terms = None
    if command.grant is not None:
        grant = command.grant
        try:
            terms = terms_for(requested.tool, grant.scope, grant.command_prefix, grant.expires_in_ms, now)
        except ValueError as e:
            raise RpcError.invalid_params(Text("error.params", problem=message_of(e))) from e
    settlement = E.Settlement(state="approved" if command.decision == "approve" else "denied", source="answer",
                              at=now, by=command.by, note=command.note, grant=terms)
    return [E.ApprovalSettled(at=now, approval_id=requested.approval_id, settlement=settlement)]


def decide_settle(state: ApprovalState, command: Settle, now: int) -> list[E.Event]:
    """``approval.settled`` as the command says; nothing when it is settled already (it settles once)."""
    requested = _requested(state)
    if state.settlement is not None:
        return []
    settlement = E.Settlement(state=command.state, source=command.source, at=now)
    return [E.ApprovalSettled(at=now, approval_id=requested.approval_id, settlement=settlement)]


def decide(state: ApprovalState, command: Command, now: int) -> list[E.Event]:
    """The events ``command`` adds to an approval in ``state`` at ``now``."""
    match command:
        case Request():
            return decide_request(state, command, now)
        case Answer():
            return decide_answer(state, command, now)
        case Settle():
            return decide_settle(state, command, now)
    raise TypeError(f"not an approval command: {type(command).__name__}")


def _requested(state: ApprovalState) -> E.ApprovalRequested:
    if state.requested is None:
        raise InvalidCommand("the approval was never requested: only a requested approval is answered or settled")
    return state.requested


# --- the protocol's Approval of a tool call ------------------------------------------------------


def build_approval(state: Any, rec: Any, approval_id: str, wait_s: float, chain: list[AncestorRef],
                   now: int) -> Approval:
    """The protocol's Approval object for a tool call (``rec``, a call in the session ``state``):
    facts verbatim from the arguments; it expires ``wait_s`` after ``now``."""
    args = rec.args if isinstance(rec.args, dict) else {}
    display = rec.display
    diff = None
    if rec.tool == "write_file" and isinstance(args.get("path"), str):
        diff = ApprovalDiff(path=args["path"], patch=_patch(display.removed if display else None,
                                                            args.get("content")))
    facts = ApprovalFacts(params=args, command=args.get("command") if isinstance(args.get("command"), str) else None,
                          cwd=args.get("cwd") if isinstance(args.get("cwd"), str) else None, diff=diff,
                          sandbox=display.sandbox if display is not None else None)
    created = state.created
    return Approval(
        id=approval_id, session_id=state.session_id, turn_id=rec.turn_id, call_id=rec.call_id,
        origin=ApprovalOrigin(kind="autonomous" if created is not None and created.activity == "background" else "hand",
                              participants=_participants(created)),
        target="tool", tool=rec.tool, facts=facts, options=["approve", "deny"], content_hash=content_hash(facts),
        expires_at=now + int(wait_s * 1000), state="pending", chain=chain or None,
    )


def approval_of_request(e: E.ApprovalRequested, created: E.SessionCreated | None) -> Approval:
    """The protocol's Approval object of a recorded request (``decide_request``'s event), as it
    was pushed when asked: an approval carried to a node that took its session over.
    ``created``: the session's creation (its participants, as ``build_approval`` took them)."""
    f = e.facts
    diff = ApprovalDiff(path=f.diff_path, patch=f.diff_patch or "") if f.diff_path is not None else None
    return Approval(
        id=e.approval_id, session_id=e.session_id, turn_id=e.turn_id, call_id=e.call_id,
        origin=ApprovalOrigin(kind=e.origin.kind, participants=_participants(created)),
        target="tool", tool=e.tool,
        facts=ApprovalFacts(params=dict(f.params), command=f.command, cwd=f.cwd, diff=diff, sandbox=f.sandbox),
        options=list(e.options), content_hash=e.content_hash, expires_at=e.expires_at, state="pending",
        chain=[AncestorRef(id=c.id, title=c.title) for c in e.chain] or None)


def _participants(created: E.SessionCreated | None) -> list[Participant]:
    """Who the session is with, as an approval names them: its creator, when it has a user id."""
    by = created.created_by if created is not None else None
    return [Participant(platform=by.platform, user_id=by.user_id)] if by is not None and by.user_id else []


def _patch(old: str | None, new: Any) -> str:
    before = (old or "").splitlines(keepends=True)
    after = (new if isinstance(new, str) else "").splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, "before", "after"))
