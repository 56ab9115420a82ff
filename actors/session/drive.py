"""The default agent loop, decided (pure): what follows in a session by itself, without outside input.

``drive(state, cfg, check, now, apply)`` starts the next queued turn, calls the model with the
messages and tool schemas, runs each generated call in order (gated by approvals and grants),
calls the model again, and ends the turn when the model answers without calls; after
``maxSteps`` model calls the turn stops with a ``tool-limit`` notice that ``turn/continue``
resumes. Each event is applied through ``apply`` as it is decided (the shell's working state),
and all of them are returned for one append. The commands a session is given are decided in
:mod:`actors.session.decide`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sessionloop.actors import events as E
from sessionloop.actors.approvals.grants import settlement_by, settling
from sessionloop.actors.session.context import model_view
from sessionloop.actors.session.decide import (
    NOT_EXECUTED,
    UNLIMITED_STEPS,
    AgentConfig,
    Drive,
    ToolCheck,
    ToolPolicy,
)
from sessionloop.actors.session.state import SessionState
from sessionloop.actors.settings.texts import Text, denial_reason, stored_parts


def drive(state: SessionState, cfg: AgentConfig, check: ToolCheck, now: int,
          apply: Callable[[E.Event], object]) -> Drive:
    """Decide, apply (through ``apply``) and return every event that follows from ``state``
    without outside input, until the session waits for a model, a tool, or new input."""
    out = Drive(events=[])

    def emit(event: E.Event) -> None:
        out.events.append(event)
        apply(event)

    for _ in range(10_000):  # each round emits at least one event or returns
        if state.parked is not None or state.deleted or state.created is None:
            return out
        turn_id = state.current_turn
        if turn_id is None:
            if not state.queue:
                return out
            _start_turn(state, cfg, now, emit)
            continue
        if state.pending_llm is not None:
            return out
        turn = state.turns[turn_id]
        waiting = [state.tool_calls[c] for c in state.batch if c in state.tool_calls]
        if any(rec.status == "running" for rec in waiting):
            return out
        nxt = next((rec for rec in waiting if rec.status == "generating"), None)
        if nxt is not None:
            if not _start_call(state, cfg, check, nxt, now, emit):
                return out  # waiting for an approval
            continue
        limit = turn.max_steps_or(cfg.max_steps)
        if limit != UNLIMITED_STEPS and turn.llm_calls >= limit:
            # the notice first: it is the turn's last entry, then the turn item closes
            text, key, values = stored_parts(Text("notice.tool-limit", limit=limit))
            emit(E.NoticePosted(at=now, notice_id=f"{turn_id}.limit", topic="tool-limit", turn_id=turn_id,
                                text=text, text_key=key, text_values=values, can_continue=True))
            emit(E.TurnLimitReached(at=now, turn_id=turn_id, max_steps=limit))
            continue
        if turn.llm_calls == 0 and _needs_compaction(state, cfg, turn_id):
            out.needs_compaction = turn_id
            return out
        _start_model(state, cfg, turn_id, now, emit)
    raise RuntimeError("drive did not settle")  # a bug: the loop must always make progress


def _start_turn(state: SessionState, cfg: AgentConfig, now: int, emit: Callable[[E.Event], None]) -> None:
    q = state.queue[0]
    # before a new run, unanswered tool calls of an earlier turn get a
    # "not executed" result so the provider never sees a call without its result.
    last = state.message_start(state.turn_order[-1]) if state.turn_order else 0
    recent = state.messages[last:]
    answered = {m.tool_call_id for m in recent if m.role == "tool"}
    for m in recent:
        for call in m.tool_calls:
            if call.call_id not in answered:
                emit(E.ToolFinished(at=now, turn_id=m.turn_id or q.turn_id, call_id=call.call_id, status="failed",
                                    output={"error": NOT_EXECUTED}, not_executed=True, repair="not-executed"))
    emit(E.TurnStarted(at=now, turn_id=q.turn_id, input_ids=[q.input_id], source=q.source, max_steps=cfg.max_steps))


def _needs_compaction(state: SessionState, cfg: AgentConfig, turn_id: str) -> bool:
    if cfg.context_chars is None or state.turns[turn_id].compaction_tried:
        return False
    earlier = state.turns[turn_id].message_start
    if earlier == 0:
        return False  # nothing before the current turn to summarise
    view, report = model_view(system_messages(cfg) + state.messages, cfg.context_chars)
    return report.chars_before > cfg.context_chars


def system_messages(cfg: AgentConfig) -> list[E.Message]:
    return [E.Message(role="system", content=cfg.system_prompt)] if cfg.system_prompt else []


def _start_model(state: SessionState, cfg: AgentConfig, turn_id: str, now: int,
                 emit: Callable[[E.Event], None]) -> None:
    step_id = f"{turn_id}.{state.turns[turn_id].llm_calls + 1}"
    if cfg.context_chars is not None:
        view, report = model_view(system_messages(cfg) + state.messages, cfg.context_chars)
        if report.trimmed:
            emit(E.ContextTrimmed(at=now, turn_id=turn_id, step_id=step_id, chars_before=report.chars_before,
                                  chars_after=report.chars_after, omitted_outputs=report.omitted_outputs,
                                  dropped_turns=report.dropped_turns))
    emit(E.LlmStarted(at=now, turn_id=turn_id, step_id=step_id, message_count=len(state.messages),
                      attachments=_turn_attachments(state, turn_id)))


def _turn_attachments(state: SessionState, turn_id: str) -> list[str]:
    """The files of this turn's user messages, as a model call's event names them (the turn's
    messages begin at its ``message_start``: the history before it is not scanned)."""
    turn = state.turns.get(turn_id)
    start = turn.message_start if turn is not None else 0
    return [f"{a.name} ({a.kind}, {a.mime}, {a.size} bytes)" for m in state.messages[start:]
            if m.turn_id == turn_id and m.role == "user" for a in m.attachments]


def _start_call(state: SessionState, cfg: AgentConfig, check: ToolCheck, rec: Any, now: int,
                emit: Callable[[E.Event], None]) -> bool:
    """Start, refuse or hold one generated call; False while it waits for an approval."""
    turn_id = state.current_turn
    assert turn_id is not None
    policy = check(rec.tool, rec.args, rec.call_id)
    if not policy.exists:
        emit(E.ToolFinished(at=now, turn_id=turn_id, call_id=rec.call_id, status="failed",
                            output={"error": f"unknown tool {rec.tool!r}"}))
        return True
    if policy.error is not None:
        emit(E.ToolFinished(at=now, turn_id=turn_id, call_id=rec.call_id, status="failed",
                            output={"error": policy.error}))
        return True
    if policy.needs_approval and cfg.permission_mode != "acceptCalls":
        return _gate(state, cfg, policy, rec, turn_id, now, emit)
    if policy.needs_approval and policy.grants and rec.settlement is None:  # a denying grant holds here too
        grant = settling(state.grants.values(), rec.tool, rec.args, now, turn_id, approving=False)
        if grant is not None:
            _settle_by_grant(state, policy, rec, turn_id, grant, now, emit)
            return True
    emit(E.ToolStarted(at=now, turn_id=turn_id, call_id=rec.call_id, tool=rec.tool, args=rec.args,
                       display=policy.display))
    return True


def approval_id_of(session_id: str, turn_id: str, call_id: str) -> str:
    """Unique per call; begins with the session id, so the approval's stream shares its shard."""
    return f"{session_id}.{turn_id}.{call_id}"


def _gate(state: SessionState, cfg: AgentConfig, policy: ToolPolicy, rec: Any, turn_id: str, now: int,
          emit: Callable[[E.Event], None]) -> bool:
    """An approval's outcome: approved -> run; settled otherwise -> denied with the note for the model;
    nobody present -> denied at once as ``absent`` (no push); else request and wait."""
    settlement = rec.settlement
    approval_id = rec.approval_id or approval_id_of(state.session_id, turn_id, rec.call_id)
    if settlement is not None:
        if settlement.state == "approved":
            emit(E.ToolStarted(at=now, turn_id=turn_id, call_id=rec.call_id, tool=rec.tool, args=rec.args,
                               display=policy.display))
        else:
            emit(_denied(turn_id, rec.call_id, approval_id, settlement, now))
        return True
    if rec.approval_id is not None:
        return False
    grant = settling(state.grants.values(), rec.tool, rec.args, now, turn_id,
                     approving=cfg.permission_mode == "ask") if policy.grants else None
    if grant is not None:
        _settle_by_grant(state, policy, rec, turn_id, grant, now, emit)
        return True
    source = None
    if cfg.permission_mode == "deny":
        source = "ineligible"
    elif not policy.approvers_present:
        source = "absent"
    elif policy.rate_limited:
        source = "rate-limit"
    if source is not None:
        settled = E.Settlement(state="denied", source=source, at=now)  # type: ignore[arg-type]
        emit(_denied(turn_id, rec.call_id, approval_id, settled, now))
        return True
    emit(E.ToolApprovalRequested(at=now, turn_id=turn_id, call_id=rec.call_id, approval_id=approval_id))
    return False


def _settle_by_grant(state: SessionState, policy: ToolPolicy, rec: Any, turn_id: str, grant: Any, now: int,
                     emit: Callable[[E.Event], None]) -> None:
    """A grant settles the call at once, no approval asked; the settlement names the grant."""
    approval_id = approval_id_of(state.session_id, turn_id, rec.call_id)
    settlement = settlement_by(grant, now)
    emit(E.ToolApprovalSettled(at=now, turn_id=turn_id, call_id=rec.call_id, approval_id=approval_id,
                               settlement=settlement))
    if settlement.state == "approved":
        emit(E.ToolStarted(at=now, turn_id=turn_id, call_id=rec.call_id, tool=rec.tool, args=rec.args,
                           display=policy.display))
    else:
        emit(_denied(turn_id, rec.call_id, approval_id, settlement, now))


def _denied(turn_id: str, call_id: str, approval_id: str, settlement: E.Settlement, now: int) -> E.ToolFinished:
    """The denied call's result, for the model: English (text for the model, ``actors.settings.texts``);
    the owner's card shows the same reason in the server's language (``reason``)."""
    why = str.__str__(denial_reason(settlement))
    return E.ToolFinished(at=now, turn_id=turn_id, call_id=call_id, status="denied",
                          output={"error": f"denied: {why}"}, approval_id=approval_id, settlement=settlement)


