"""Commands decide events (pure): the one place, with :mod:`actors.session.drive` (the default agent
loop, what follows by itself), where a session's stored facts are constructed.

Every function here is ``(state, command/config) -> events``: no I/O, no clock (``now`` and ids
arrive in the command), no randomness. The actor shell applies the events, asks ``drive`` what
follows from the new state, and commits everything as one append; only after the commit does
it start the effects those events imply (a model call for ``llm.started``, a tool run for
``tool.started``). Crash recovery is the same path: ``repairs_after_restart`` then ``drive``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping
from typing import Any, Protocol

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.errors import (
    Conflict,
    ExpectedTurnMismatch,
    InvalidCommand,
    NotFound,
    SessionBusy,
    SessionParked,
)
from sessionloop.actors.model.base import ModelResponse, RetryNotice
from sessionloop.actors.model.storable import storable_response
from sessionloop.actors.session import commands as C
from sessionloop.actors.session.context import SUMMARY_PREFIX
from sessionloop.actors.session.state import SessionState
from sessionloop.actors.settings.texts import Text, stored_parts
from sessionloop.actors.tools.builtin import plan_from_output
from sessionloop.actors.tools.registry import ToolResult
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


def decide_create(state: SessionState, new: C.NewSession, initial: C.NewInput | None, now: int) -> list[E.Event]:
    """``session.created`` (and, with ``initial``, its first input in the same commit); Conflict
    for a session that exists."""
    if state.version:
        raise Conflict(Text("error.session-exists", session=state.session_id))
    events: list[E.Event] = [E.SessionCreated(at=now, session_id=state.session_id, **msgspec.structs.asdict(new))]
    if initial is not None:
        events.append(accepted_input(initial, now))
    return events


def decide_input(state: SessionState, new: C.NewInput, now: int) -> list[E.Event]:
    """``input.accepted`` into the FIFO queue; Conflict for an input or turn id already taken."""
    ensure_usable(state)
    if any(q.input_id == new.input_id for q in state.queue) or state.has_turn(new.turn_id):
        raise Conflict(f"input {new.input_id} was already accepted")
    return [accepted_input(new, now)]


def accepted_input(new: C.NewInput, now: int) -> E.InputAccepted:
    return E.InputAccepted(at=now, input_id=new.input_id, turn_id=new.turn_id, text=new.text,
                           attachments=new.attachments, source=new.source, speaker=new.speaker,
                           idempotency_key=new.idempotency_key, traceparent=new.traceparent)


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
                                 now: int, decided: Mapping[str, E.Settlement] | None = None,
                                 open_: Container[str] = ()) -> list[E.Event]:
    """Settle every unsettled approval of the batch ``status`` by ``source``, except those whose
    approval already recorded its own settlement (``decided``, by approval id): that one stands;
    and those still ``open_`` (by approval id, with no settlement recorded): they stay open."""
    out: list[E.Event] = []
    for call_id in state.batch:
        rec = state.tool_calls.get(call_id)
        if rec is not None and rec.approval_id is not None and rec.settlement is None:
            if rec.approval_id in open_ and rec.approval_id not in (decided or {}):
                continue
            settlement = (decided or {}).get(rec.approval_id) or \
                E.Settlement(state=status, source=source, at=now)  # type: ignore[arg-type]
            out.append(E.ToolApprovalSettled(at=now, turn_id=turn_id, call_id=call_id, approval_id=rec.approval_id,
                                             settlement=settlement))
    return out


def llm_completed(response: ModelResponse, now: int, turn_id: str, step_id: str, duration_ms: int) -> E.LlmCompleted:
    """The event of a model's answer: the one place every provider's answer passes (the mock's
    taken in place and every ``generate`` result), so it is where an answer is made storable
    (a tool call whose arguments the store cannot encode becomes one that fails, see
    ``actors/model/storable.py``); before, such an answer failed every commit and the re-issued
    model call failed again until the session was parked."""
    r = storable_response(response)
    return E.LlmCompleted(at=now, turn_id=turn_id, step_id=step_id, text=r.text, reasoning=r.reasoning,
                          tool_calls=list(r.tool_calls), usage=r.usage, model=r.model, provider=r.provider,
                          duration_ms=duration_ms)


def decide_model_done(state: SessionState, step_id: str, response: ModelResponse | None,
                      error: str | None, duration_ms: int, now: int) -> list[E.Event]:
    """The model answered (or failed) for ``step_id``; a stale answer (cancelled step) is dropped."""
    if state.pending_llm != step_id or state.current_turn is None:
        return []
    turn_id = state.current_turn
    if response is not None:
        completed = llm_completed(response, now, turn_id, step_id, duration_ms)
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


def decide_model_retried(state: SessionState, step_id: str, notice: RetryNotice, next_item_id: str,
                         now: int) -> list[E.Event]:
    """An attempt of the running model call failed and the provider tries again: the retry is a
    fact of the step (nothing else changes); nothing when the step ended meanwhile."""
    turn_id = state.current_turn
    if state.pending_llm != step_id or turn_id is None:
        return []
    return [E.LlmRetried(at=now, turn_id=turn_id, step_id=step_id, attempt=notice.attempt, status=notice.status,
                         cause=notice.cause, wait_ms=notice.wait_ms, error=notice.error, next_item_id=next_item_id)]


def decide_tool_done(state: SessionState, turn_id: str, call_id: str, result: ToolResult, duration_ms: int,
                     now: int) -> list[E.Event]:
    """A tool call's result (``tool.finished``; ``update_plan``'s also replaces the plan); a late
    result of an aborted call is dropped: it stays aborted."""
    rec = state.tool_calls.get(call_id)
    if rec is None or rec.status != "running" or state.current_turn != turn_id:
        return []
    output = result.output
    failed = result.is_error or (result.exit_code not in (None, 0))
    task_id = output.get("taskId") if isinstance(output, dict) else None
    events: list[E.Event] = [E.ToolFinished(
        at=now, turn_id=turn_id, call_id=call_id, status="failed" if failed else "completed", output=output,
        exit_code=result.exit_code, duration_ms=duration_ms, task_id=task_id if isinstance(task_id, str) else None)]
    if rec.tool == "update_plan" and not failed and isinstance(output, dict):
        entries, explanation = plan_from_output(output)  # the plan item, replaced whole
        events.append(E.PlanUpdated(at=now, entries=entries, explanation=explanation))
    return events


def decide_stop(state: SessionState, turn_id: str | None, reason: str, now: int, *, drop_queue: bool) -> list[E.Event]:
    """Stop the running turn (``decide_cancel``); with ``drop_queue`` (``background/stopAll``) the
    queued inputs are dropped first."""
    events: list[E.Event] = []
    if drop_queue and state.created is not None:
        events += [E.InputDropped(at=now, input_id=q.input_id, turn_id=q.turn_id, reason=reason) for q in state.queue]
    return events + decide_cancel(state, turn_id, reason, now)


def decide_park(reason: str, now: int) -> list[E.Event]:
    """The session failed too often: it is parked (``session.parked``) and takes no command until
    it is unparked."""
    return [E.SessionParked(at=now, reason=reason)]


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


# --- recovery ---------------------------------------------------------------------------------


def repairs_after_restart(state: SessionState, now: int, decided: Mapping[str, E.Settlement] | None = None,
                          carried: Container[str] = ()) -> list[E.Event]:
    """What a restart must record before the loop can go on (after a crash): a tool call
    that started and has no result is ``aborted`` (never re-run: it may have had side effects)
    and the model is told; a model call without an answer is closed so it can be re-issued.

    An approval still open in the session is cancelled by ``shutdown``, unless its own stream
    recorded an answer the session never heard of (the server stopped in between): ``decided``
    carries those settlements, and the answer stands (an approved call then runs: it never ran).
    An approval in ``carried`` (a takeover carried it over, still open: ``carry_leftovers``) stays
    open, and the turn waits for its answer as it did on the node before."""
    turn_id = state.current_turn
    if turn_id is None:
        return []
    events: list[E.Event] = pending_approval_settlements(state, turn_id, "cancelled", "shutdown", now, decided,
                                                         carried)
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
