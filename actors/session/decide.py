"""Commands decide events; ``drive`` decides what follows on its own (pure: the default agent loop).

Every function here is ``(state, command/config) -> events``: no I/O, no clock (``now`` and ids
arrive in the command), no randomness. The actor shell applies the events, asks ``drive`` what
follows from the new state, and commits everything as one append; only after the commit does
it start the effects those events imply (a model call for ``llm.started``, a tool run for
``tool.started``). Crash recovery is the same path: ``repairs_after_restart`` then ``drive``.

The default loop: call the model with the messages and tool schemas; no
tool calls -> the turn ends; else run each call in order, append its result, and call the model
again; after ``maxSteps`` model calls the turn stops with a ``tool-limit`` notice that
``turn/continue`` resumes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.approvals.grants import settlement_by, settling
from sessionloop.actors.errors import (
    Conflict,
    ExpectedTurnMismatch,
    InvalidCommand,
    NotFound,
    SessionBusy,
    SessionParked,
)
from sessionloop.actors.session import commands as C
from sessionloop.actors.session.context import SUMMARY_PREFIX, model_view
from sessionloop.actors.session.state import SessionState
from sessionloop.actors.settings.texts import Text, denial_reason, stored_parts
from sessionloop.protocol.limits import MAX_TITLE

NOT_EXECUTED = "not executed: the turn ended before this tool call ran"

#: ``maxSteps`` without a limit (the default is 20; Infinity means no limit). JSON and TOML have no
#: Infinity (a JavaScript client's ``JSON.stringify(Infinity)`` is ``null``, which deletes a
#: setting), and ``null`` already means "not recorded" in ``turn.started``; a limit of 0 model
#: calls means nothing else, so 0 stands for unlimited everywhere: the host option, the
#: ``agent/maxSteps`` setting, ``serve --max-steps`` and the limit a turn records when it starts.
UNLIMITED_STEPS = 0
_UNLIMITED_WORDS = frozenset({"unlimited", "infinity", "inf"})


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The effective agent options for a session at the moment of a decision
    (a reopened session uses the current configuration, not stored values)."""

    system_prompt: str | None = None
    max_steps: int = 20  # model calls per turn; UNLIMITED_STEPS (0): no limit
    context_chars: int | None = None
    permission_mode: str = "acceptCalls"
    model: str | None = None  # None: the provider's own default
    exec_yield_s: float = 10.0  # exec's foreground budget before it becomes a background task
    sandbox: str = "workspace-write"  # the sandbox policy exec runs under (actors.tools.sandbox)


class ToolPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What ``drive`` needs to know about a tool (from the registry), as plain data."""

    exists: bool
    needs_approval: bool = False
    error: str | None = None  # argument validation failure, named by field
    display: E.ToolDisplay | None = None
    approvers_present: bool = False  # someone who may answer an approval is present now
    rate_limited: bool = False  # this session asked for too many approvals in the last minute
    #: grants may settle the call (actors.approvals.grants); ``rerun`` turns this off for a call its
    #: recording settled otherwise, so the recorded answer decides it
    grants: bool = True


#: ``check(tool, args, call_id)``: the registry's and the approvals' view of one generated call
ToolCheck = Callable[[str, Any, str], ToolPolicy]


class Drive(msgspec.Struct, kw_only=True):
    events: list[E.Event]
    needs_compaction: str | None = None  # turn id whose first model call must wait for a summary


def steps_limit(value: object, name: str = "max_steps") -> int:
    """``value`` as a ``maxSteps`` limit: a whole number of model calls, or unlimited as
    :data:`UNLIMITED_STEPS` — given as 0, ``math.inf`` (Infinity) or one of the words
    ``unlimited`` / ``infinity`` / ``inf`` (any case). Raises ValueError naming ``name`` (an
    empty ``name``: the caller names the field itself)."""
    prefix = f"{name}: " if name else ""
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _UNLIMITED_WORDS:
            return UNLIMITED_STEPS
        try:
            value = int(word)
        except ValueError:
            raise ValueError(f"{prefix}expected a whole number of model calls or 'unlimited', got {value!r}") from None
    if isinstance(value, float) and value == math.inf:
        return UNLIMITED_STEPS
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{prefix}expected a whole number >= 0 (0: unlimited) or 'unlimited', got {value!r}")
    return value


# --- commands ---------------------------------------------------------------------------------


def ensure_usable(state: SessionState) -> E.SessionCreated:
    """The session's creation, when it can take commands: NotFound before it was created or
    after it was deleted, SessionParked while it is parked."""
    created = state.created
    if created is None or state.deleted:
        raise NotFound(Text("error.session-not-found", session=state.session_id))
    if state.parked is not None:
        raise SessionParked(Text("error.session-parked", session=state.session_id, reason=state.parked))
    return created


def decide_create(state: SessionState, created: E.SessionCreated) -> list[E.Event]:
    if state.version:
        raise Conflict(Text("error.session-exists", session=state.session_id))
    return [created]


def decide_input(state: SessionState, accepted: E.InputAccepted) -> list[E.Event]:
    ensure_usable(state)
    if any(q.input_id == accepted.input_id for q in state.queue) or accepted.turn_id in state.turns:
        raise Conflict(f"input {accepted.input_id} was already accepted")
    return [accepted]


def decide_cancel(state: SessionState, turn_id: str | None, reason: str, now: int) -> list[E.Event]:
    """Stop the running turn (``turn/abort``): unfinished calls are recorded aborted."""
    ensure_usable(state)
    current = state.current_turn
    if current is None:
        if turn_id is not None:
            raise ExpectedTurnMismatch(Text("error.turn-not-running", turn=turn_id))
        return []
    if turn_id is not None and turn_id != current:
        raise ExpectedTurnMismatch(Text("error.turn-not-current", turn=turn_id, current=current))
    events: list[E.Event] = []
    if state.pending_llm is not None:
        events.append(E.LlmFailed(at=now, turn_id=current, step_id=state.pending_llm, error="aborted", aborted=True))
    events += pending_approval_settlements(state, current, "cancelled", "turn-ended", now)
    events += _close_open_calls(state, current, now, "aborted", "cancel",
                                "aborted: the turn was stopped before this tool call finished")
    events.append(E.TurnAborted(at=now, turn_id=current, reason=reason))
    return events


def _close_open_calls(state: SessionState, turn_id: str, now: int, status: str, repair: str,
                      text: str) -> list[E.Event]:
    out: list[E.Event] = []
    for call_id in state.batch:
        rec = state.tool_calls.get(call_id)
        if rec is None or rec.status not in ("generating", "running"):
            continue
        never_ran = rec.status == "generating"
        out.append(E.ToolFinished(at=now, turn_id=turn_id, call_id=call_id, status=status,  # type: ignore[arg-type]
                                  output={"error": NOT_EXECUTED if never_ran else text},
                                  not_executed=never_ran, repair=repair))
    return out


def pending_approval_settlements(state: SessionState, turn_id: str, status: str, source: str,
                                 now: int, decided: Mapping[str, E.Settlement] | None = None) -> list[E.Event]:
    """Settle every unsettled approval of the batch ``status`` by ``source``, except those whose
    approval already recorded its own settlement (``decided``, by approval id): that one stands."""
    out: list[E.Event] = []
    for call_id in state.batch:
        rec = state.tool_calls.get(call_id)
        if rec is not None and rec.approval_id is not None and rec.settlement is None:
            settlement = (decided or {}).get(rec.approval_id) or \
                E.Settlement(state=status, source=source, at=now)  # type: ignore[arg-type]
            out.append(E.ToolApprovalSettled(at=now, turn_id=turn_id, call_id=call_id, approval_id=rec.approval_id,
                                             settlement=settlement))
    return out


def decide_model_done(state: SessionState, step_id: str, completed: E.LlmCompleted | None,
                      error: str | None, now: int) -> list[E.Event]:
    """The model answered (or failed) for ``step_id``; a stale answer (cancelled step) is dropped."""
    if state.pending_llm != step_id or state.current_turn is None:
        return []
    turn_id = state.current_turn
    if completed is not None:
        events: list[E.Event] = [completed]
        if not completed.tool_calls:
            events.append(E.TurnCompleted(at=now, turn_id=turn_id, outcome="replied" if completed.text else "silent",
                                          output_text=completed.text))
        return events
    return [
        E.LlmFailed(at=now, turn_id=turn_id, step_id=step_id, error=error or "model call failed"),
        E.TurnFailed(at=now, turn_id=turn_id, code="model-error", reason=error or "model call failed",
                     step_id=step_id),
    ]


def decide_tool_done(state: SessionState, finished: E.ToolFinished) -> list[E.Event]:
    rec = state.tool_calls.get(finished.call_id)
    if rec is None or rec.status != "running" or state.current_turn != finished.turn_id:
        return []  # late result of an aborted call: it stays aborted
    return [finished]


def decide_stop_for_delete(state: SessionState, reason: str, now: int) -> list[E.Event]:
    """What a delete stops before it purges (``session/delete``): the running turn is
    aborted (unfinished calls aborted, pending approvals settled ``turn-ended``) and the queued
    inputs are dropped. NotFound for a session that does not exist or is deleted; a parked
    session (nothing runs in it) can be deleted too."""
    _exists(state)
    events = decide_cancel(state, None, reason, now) if state.parked is None else []
    return events + [E.InputDropped(at=now, input_id=q.input_id, turn_id=q.turn_id, reason="session deleted")
                     for q in state.queue]


def decide_delete(state: SessionState, now: int) -> list[E.Event]:
    """The tombstone a delete leaves as the session's only events: ``session.deleted``, which
    holds no content (``eventstore/purge.py`` takes everything else out with it)."""
    _exists(state)
    return [E.SessionDeleted(at=now)]


def _exists(state: SessionState) -> None:
    if state.created is None or state.deleted:
        raise NotFound(Text("error.session-not-found", session=state.session_id))


def decide_rename(state: SessionState, title: str, now: int) -> list[E.Event]:
    ensure_usable(state)
    title = title.strip()
    if not title:
        raise InvalidCommand(Text("error.title-empty"))
    if len(title) > MAX_TITLE:
        raise InvalidCommand(Text("error.title-too-long", field="title", max=MAX_TITLE, got=len(title)))
    return [E.SessionRenamed(at=now, title=title)]


class SettingsPort(Protocol):
    """What a settings write needs of the settings service: the events of one write, checked."""

    def session_events(self, state: Any, plugin: str, key: str, value: Any, now: int) -> list[E.Event]: ...


class DecideContext(msgspec.Struct, frozen=True):
    """What a command's decision may read besides the state: the time, the settings service."""

    now: int
    settings: SettingsPort | None = None


def decide_command(state: SessionState, command: C.Command, ctx: DecideContext) -> list[E.Event]:
    """The events of one command from outside the session (``commands.Command``), matched here
    and only here; raises the refusal (nothing is written) instead."""
    now = ctx.now
    match command:
        case C.Rename(title=title):
            return decide_rename(state, title, now)
        case C.MarkSeen():
            ensure_usable(state)
            return [E.SessionSeen(at=now)]
        case C.ClearPlan():
            ensure_usable(state)
            return [E.PlanCleared(at=now)] if state.plan else []
        case C.Archive(archived=archived):
            ensure_usable(state)
            if archived:
                return [] if state.archived else [E.SessionArchived(at=now)]
            return [E.SessionUnarchived(at=now)] if state.archived else []
        case C.RevokeGrant(grant_id=grant_id, by=by):
            grant = state.grants.get(grant_id)
            if grant is None or not grant.active(now, state.current_turn):
                raise NotFound(Text("error.grant-not-found", grant=grant_id, session=state.session_id))
            return [E.ApprovalGrantRevoked(at=now, grant_id=grant.id, by=by)]
        case C.SetSetting(plugin=plugin, key=key, value=value):
            if ctx.settings is None:
                raise InvalidCommand("session settings are not enabled on this host")
            return ctx.settings.session_events(state, plugin, key, value, now)
        case C.Rewind():
            return _decide_rewind(state, command, now)
        case C.ImportFork():
            return _decide_fork(state, command, now)
        case C.PostTaskNotice():
            if state.created is None or state.deleted:
                return []
            return [E.NoticePosted(at=now, notice_id=command.task_id, topic="background-task", text=command.text,
                                   facts=command.facts, turn_id=command.turn_id, starts_turn=True,
                                   text_key=command.text_key, text_values=command.text_values),
                    E.InputAccepted(at=now, input_id=command.input_id, turn_id=command.turn_id, text=command.text,
                                    source="background-task")]
        case C.SettleApproval(turn_id=turn_id, call_id=call_id):
            rec = state.tool_calls.get(call_id)
            if rec is None or rec.settlement is not None or state.current_turn != turn_id:
                return []
            return [E.ToolApprovalSettled(at=now, turn_id=turn_id, call_id=call_id,
                                          approval_id=command.approval_id, settlement=command.settlement)]
        case C.RecordTaskEnd(ended=ended):
            return [] if state.created is None or state.deleted else [ended]
        case C.RecordCheckpoints(turn_id=turn_id, call_id=call_id, images=images):
            have = {c.path for c in state.checkpoints if c.turn_id == turn_id}
            out: list[E.Event] = []
            for image in images:
                if image.path not in have:
                    have.add(image.path)
                    out.append(E.CheckpointRecorded(at=now, turn_id=turn_id, call_id=call_id, path=image.path,
                                                    existed=image.existed, content=image.content))
            return out
    raise TypeError(f"not a session command: {type(command).__name__}")


def _decide_rewind(state: SessionState, command: C.Rewind, now: int) -> list[E.Event]:
    if state.current_turn is not None:  # a turn started after the files were restored
        raise SessionBusy(Text("error.rewind-busy-meanwhile"))
    return [E.TurnRewound(at=now, turn_id=command.turn_id, scope=command.scope,  # type: ignore[arg-type]
                          restored=command.restored, removed=command.removed, conflicts=command.conflicts,
                          chat_deleted=command.chat_deleted, deleted_messages=command.deleted_messages)]


def _decide_fork(state: SessionState, command: C.ImportFork, now: int) -> list[E.Event]:
    if state.version:
        raise InvalidCommand(f"session {command.session_id} already exists")
    created = msgspec.structs.replace(command.source_created, at=now, session_id=command.session_id,
                                      forked_from=command.source_id, fork_turns=command.turns, title=command.title)
    return [created, E.MessagesImported(at=now, source_session_id=command.source_id, turns=command.turns,
                                        messages=command.messages)]


def decide_compact_allowed(state: SessionState, compacting: bool) -> None:
    """A compaction is refused while a turn runs and while another compaction of the session runs
    (nothing recorded, so no notice)."""
    ensure_usable(state)
    if state.current_turn is not None:
        raise SessionBusy(Text("error.compress-running-turn", session=state.session_id))
    if compacting:
        raise SessionBusy(Text("error.compress-already", session=state.session_id))


#: ``session/compress`` fails when the session was cleared or its history changed meanwhile. What a manual compaction's
#: summary would no longer describe: a new input (it starts a turn at once: the summary would
#: land after that turn's user message and hide it from every later model call), a turn, a
#: rewind (of the chat, or of the files the summary's "file changes" describe), messages
#: replaced; and a session deleted or parked meanwhile.
_INTERRUPTIONS: dict[type, str] = {  # the catalogue keys of the reasons (actors.settings.texts)
    E.InputAccepted: "compress.changed.input",
    E.TurnStarted: "compress.changed.turn",
    E.TurnRewound: "compress.changed.rewind",
    E.MessagesImported: "compress.changed.messages",
    E.SessionDeleted: "compress.deleted",
    E.SessionParked: "compress.parked",
}


def decide_compaction_interrupted(events: list[E.Event], now: int) -> list[E.Event]:
    """While a manual compaction runs: the failure it ends with if ``events`` change the history
    it summarises (recorded before them, in their commit), else nothing."""
    for event in events:
        why = _INTERRUPTIONS.get(type(event))
        if why is not None:
            return [compact_failed(Text(why), at=now)]
    return []


def decide_compaction_cancelled(reason: str, now: int) -> list[E.Event]:
    """``cancel()`` stops a manual compaction: the manual compaction ends, failed, with the reason."""
    return [compact_failed(Text("compress.cancelled", reason=reason), at=now)]


def compact_failed(error: str, **fields: Any) -> E.ContextCompactFailed:
    """``agent.context.compact-failed`` with its reason: a text object keeps its key and values
    in the event (rendered when sent), a plain string (a provider's own message) stays as it is."""
    shown, key, values = stored_parts(error)
    return E.ContextCompactFailed(error=shown, error_key=key, error_values=values, **fields)


def decide_compaction_done(turns: int, text: str, error: str | None, usage: E.Usage | None, *, auto: bool,
                           turn_id: str | None, now: int,
                           context_tokens: Callable[[E.ContextCompacted], int]) -> E.Event:
    """The end of a summary call: the summary (a system message that starts with
    :data:`SUMMARY_PREFIX`) with the context the next model call gets (``context_tokens`` of the
    event), or the failure with its reason. ``usage`` is the summary call's own tokens."""
    if error is not None:
        return compact_failed(error, at=now, auto=auto, turn_id=turn_id, usage=usage)
    summary = text if text.startswith(SUMMARY_PREFIX) else f"{SUMMARY_PREFIX} {text}"
    event = E.ContextCompacted(at=now, summary=summary, turns=turns, chars=len(summary), auto=auto,
                               turn_id=turn_id, usage=usage)
    return msgspec.structs.replace(event, context_tokens=context_tokens(event))


# --- drive: what follows by itself -------------------------------------------------------------


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
    last = state.turns[state.turn_order[-1]].message_start if state.turn_order else 0
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
    """The files of this turn's user messages, as a model call's event names them."""
    return [f"{a.name} ({a.kind}, {a.mime}, {a.size} bytes)" for m in state.messages
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


# --- recovery ---------------------------------------------------------------------------------


def repairs_after_restart(state: SessionState, now: int,
                          decided: Mapping[str, E.Settlement] | None = None) -> list[E.Event]:
    """What a restart must record before the loop can go on (after a crash): a tool call
    that started and has no result is ``aborted`` (never re-run: it may have had side effects)
    and the model is told; a model call without an answer is closed so it can be re-issued.

    An approval still open in the session is cancelled by ``shutdown``, unless its own stream
    recorded an answer the session never heard of (the server stopped in between): ``decided``
    carries those settlements, and the answer stands (an approved call then runs: it never ran)."""
    turn_id = state.current_turn
    if turn_id is None:
        return []
    events: list[E.Event] = pending_approval_settlements(state, turn_id, "cancelled", "shutdown", now, decided)
    for call_id in state.batch:
        rec = state.tool_calls.get(call_id)
        if rec is not None and rec.status == "running":
            events.append(E.ToolFinished(
                at=now, turn_id=turn_id, call_id=call_id, status="aborted", repair="crash",
                output={"error": "aborted: the server stopped while this tool call was running; "
                                 "it was not run again because it may have had side effects"}))
    if state.pending_llm is not None:
        events.append(E.LlmFailed(at=now, turn_id=turn_id, step_id=state.pending_llm,
                                  error="interrupted: the server stopped during this model call", aborted=True))
    return events
