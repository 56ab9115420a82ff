"""The timeline of a session's log: "what happened?".

:func:`build_timeline` turns the events into rows (:class:`Entry`) in log order -- turns, model
calls (provider, model, tokens, duration), tool calls (args, status, exit code, repair),
approvals, notices, context trimming and compaction, checkpoints and rewinds -- and a summary per
turn (:class:`TurnSummary`); ``until`` (:func:`until_version`) cuts it at an event version. Start
and end events of one call are one row. The builder is a table of small handlers, like
``ItemsProjection``. Pure: a function of the recorded events. ``sessionloop replay`` prints it
(``cli/replay_cmd.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.replay.values import EXCERPT, excerpt, fold_events, plain, summarize_args
from sessionloop.eventstore.records import RecordedEvent

__all__ = ["Entry", "Timeline", "TurnSummary", "build_timeline", "grant_text", "until_version"]


class Entry(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """One line of the timeline: what an event (or a start/end pair of events) tells.

    ``kind``: session, input, turn, model, tool, approval, notice, plan, context, checkpoint,
    rewind, artifact or unknown; ``what`` says which fact of that kind; ``version`` is the event
    that opened the entry and ``end_version`` the one that closed it (model and tool calls,
    approvals, turns).
    """

    version: int
    at: int
    kind: str
    what: str
    turn: int | None = None
    turn_id: str | None = None
    end_version: int | None = None
    status: str | None = None
    duration_ms: int | None = None
    facts: dict[str, Any] = {}


class TurnSummary(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    number: int
    turn_id: str
    source: str | None = None
    input: str = ""
    status: str = "running"  # running | completed | failed | aborted | limit
    outcome: str | None = None
    started_at: int = 0
    ended_at: int | None = None
    duration_ms: int | None = None
    output: str | None = None
    code: str | None = None
    reason: str | None = None
    model_calls: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_version: int = 0
    last_version: int = 0


class Timeline(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    session_id: str
    title: str = ""
    kind: str = "owner"
    status: str = "idle"
    events: int = 0
    last_version: int = 0
    until: int | None = None
    created_at: int = 0
    forked_from: str | None = None
    deleted: bool = False
    turns: list[TurnSummary] = []
    entries: list[Entry] = []


def until_version(events: Sequence[RecordedEvent], until: str | None) -> int | None:
    """The last version ``--until`` keeps: a number is an event version, anything else a turn id
    (or a unique prefix of one), which keeps every event of that turn. Raises ValueError."""
    if until is None:
        return None
    text = until.strip()
    if text.isdigit() and len(text) < 12:
        return int(text)
    ids = {getattr(r.event, "turn_id", None) for r in events if isinstance(r.event, E.TurnStarted)}
    matches = sorted(t for t in ids if t is not None and t.startswith(text))
    if text in ids:
        matches = [text]
    if not matches:
        raise ValueError(f"turn {text} not found")
    if len(matches) > 1:
        raise ValueError(f"turn prefix {text} is ambiguous: {', '.join(matches[:5])}")
    return max(r.version for r in events if getattr(r.event, "turn_id", None) == matches[0])


class _TimelineBuilder:
    """A fold of events into entries; start/end pairs update the entry their start opened."""

    def __init__(self, session_id: str) -> None:
        self.timeline = Timeline(session_id=session_id)
        self.turns: dict[str, TurnSummary] = {}
        self.inputs: dict[str, E.InputAccepted] = {}
        self.open: dict[str, Entry] = {}  # step id / call id / approval id / turn id -> entry
        self.calls: dict[str, E.ToolCallSpec] = {}  # call id -> the call as the model asked for it
        self.approvals: dict[str, str] = {}  # call id -> "state (source)" of its settled approval
        self.handlers: dict[type, Callable[[RecordedEvent, Any], None]] = {
            E.SessionCreated: self._created, E.MessagesImported: self._imported,
            E.InputAccepted: self._input, E.InputDropped: self._input_dropped,
            E.TurnStarted: self._turn_started, E.TurnCompleted: self._turn_ended, E.TurnFailed: self._turn_ended,
            E.TurnAborted: self._turn_ended, E.TurnLimitReached: self._turn_ended,
            E.LlmStarted: self._llm_started, E.LlmCompleted: self._llm_done, E.LlmFailed: self._llm_done,
            E.ToolStarted: self._tool_started, E.ToolFinished: self._tool_finished,
            E.ToolApprovalRequested: self._approval_requested, E.ToolApprovalSettled: self._approval_settled,
            E.ApprovalGrantRevoked: self._grant_revoked,
            E.NoticePosted: self._notice, E.PlanUpdated: self._plan, E.PlanCleared: self._plan,
            E.ContextTrimmed: self._context, E.ContextCompacted: self._context, E.ContextCompactFailed: self._context,
            E.CheckpointRecorded: self._checkpoint, E.TurnRewound: self._rewound, E.ArtifactRecorded: self._artifact,
        }

    def add(self, rec: RecordedEvent) -> None:
        event = rec.event
        if isinstance(event, E.UnknownEvent):
            self._entry(rec, "unknown", event.type, facts={"type": event.type})
            return
        handler = self.handlers.get(type(event))
        if handler is not None:
            handler(rec, event)
        elif E.event_tag(event).startswith("session."):
            self._session_fact(rec, event)

    def _turn_no(self, turn_id: str | None) -> int | None:
        turn = self.turns.get(turn_id) if turn_id else None
        return turn.number if turn is not None else None

    def _entry(self, rec: RecordedEvent, kind: str, what: str, *, turn_id: str | None = None,
               status: str | None = None, facts: dict[str, Any] | None = None) -> Entry:
        at = getattr(rec.event, "at", 0) or rec.at
        entry = Entry(version=rec.version, at=at, kind=kind, what=what, turn_id=turn_id, turn=self._turn_no(turn_id),
                      status=status, facts=facts or {})
        self.timeline.entries.append(entry)
        if turn_id in self.turns:
            self.turns[turn_id].last_version = rec.version
        return entry

    def _close(self, entry: Entry, rec: RecordedEvent, status: str, duration_ms: int | None = None) -> None:
        at = getattr(rec.event, "at", 0) or rec.at
        entry.end_version, entry.status = rec.version, status
        entry.duration_ms = duration_ms if duration_ms else max(0, at - entry.at)
        if entry.turn_id in self.turns:
            self.turns[entry.turn_id].last_version = rec.version

    # session facts

    def _created(self, rec: RecordedEvent, e: E.SessionCreated) -> None:
        tl = self.timeline
        tl.title, tl.kind, tl.forked_from, tl.created_at = e.title or e.name, e.kind, e.forked_from, e.at
        facts: dict[str, Any] = {"title": e.title or e.name, "kind": e.kind, "permissionMode": e.permission_mode,
                                 "activity": e.activity}
        for key, value in (("parentId", e.parent_id), ("appId", e.app_id), ("model", e.model),
                           ("forkedFrom", e.forked_from), ("forkTurns", e.fork_turns)):
            if value is not None:
                facts[key] = value
        self._entry(rec, "session", "created", facts=facts)

    def _imported(self, rec: RecordedEvent, e: E.MessagesImported) -> None:
        self._entry(rec, "session", "forked", facts={"from": e.source_session_id, "turns": e.turns,
                                                     "messages": len(e.messages)})

    def _session_fact(self, rec: RecordedEvent, e: E.Event) -> None:
        what = E.event_tag(e).removeprefix("session.")
        facts: dict[str, Any] = {}
        if isinstance(e, E.SessionRenamed):
            facts["title"] = e.title
            self.timeline.title = e.title
        elif isinstance(e, E.SessionSettingChanged):
            facts = {"setting": f"{e.plugin}/{e.key}", "value": None if e.deleted else plain(e.value)}
        elif isinstance(e, E.SessionParked):
            facts["reason"] = e.reason
        elif isinstance(e, E.SessionDeleted):
            self.timeline.deleted = True
        self._entry(rec, "session", what, facts=facts)

    # inputs and turns

    def _input(self, rec: RecordedEvent, e: E.InputAccepted) -> None:
        self.inputs[e.input_id] = e
        facts: dict[str, Any] = {"inputId": e.input_id, "text": excerpt(e.text)}
        if e.source:
            facts["source"] = e.source
        if e.attachments:
            facts["attachments"] = [a.name for a in e.attachments]
        self._entry(rec, "input", "accepted", turn_id=None, facts=facts)

    def _input_dropped(self, rec: RecordedEvent, e: E.InputDropped) -> None:
        self._entry(rec, "input", "dropped", facts={"inputId": e.input_id, "reason": e.reason})

    def _turn_started(self, rec: RecordedEvent, e: E.TurnStarted) -> None:
        text = " ".join(self.inputs[i].text for i in e.input_ids if i in self.inputs)
        turn = TurnSummary(number=len(self.turns) + 1, turn_id=e.turn_id, source=e.source, input=text,
                           started_at=e.at, first_version=rec.version, last_version=rec.version)
        self.turns[e.turn_id] = turn
        self.timeline.turns.append(turn)
        facts: dict[str, Any] = {"input": excerpt(text)}
        if e.source:
            facts["source"] = e.source
        if e.max_steps is not None:
            facts["maxSteps"] = e.max_steps
        self.open[f"turn:{e.turn_id}"] = self._entry(rec, "turn", "started", turn_id=e.turn_id, status="running",
                                                     facts=facts)

    def _turn_ended(self, rec: RecordedEvent, e: Any) -> None:
        turn = self.turns.get(e.turn_id)
        status, facts = _turn_end_facts(e)
        entry = self._entry(rec, "turn", "ended", turn_id=e.turn_id, status=status, facts=facts)
        if turn is None:
            return
        turn.status, turn.ended_at = status, e.at
        turn.duration_ms = max(0, e.at - turn.started_at)
        turn.outcome = facts.get("outcome")
        turn.output, turn.code, turn.reason = facts.get("output"), facts.get("code"), facts.get("reason")
        entry.duration_ms = turn.duration_ms
        started = self.open.pop(f"turn:{e.turn_id}", None)
        if started is not None:
            started.status, started.end_version, started.duration_ms = status, rec.version, turn.duration_ms

    # model calls

    def _llm_started(self, rec: RecordedEvent, e: E.LlmStarted) -> None:
        facts: dict[str, Any] = {"stepId": e.step_id, "messages": e.message_count}
        if e.attachments:
            facts["attachments"] = list(e.attachments)  # the files the call was sent
        if e.attempt != 1:
            facts["attempt"] = e.attempt
        self.open[f"step:{e.step_id}"] = self._entry(rec, "model", "call", turn_id=e.turn_id, status="running",
                                                     facts=facts)
        if e.turn_id in self.turns:
            self.turns[e.turn_id].model_calls += 1

    def _llm_done(self, rec: RecordedEvent, e: Any) -> None:
        entry = self.open.pop(f"step:{e.step_id}", None)
        if entry is None:
            entry = self._entry(rec, "model", "call", turn_id=e.turn_id, facts={"stepId": e.step_id})
        if isinstance(e, E.LlmCompleted):
            self.calls.update((c.call_id, c) for c in e.tool_calls)
            entry.facts.update(provider=e.provider, model=e.model, promptTokens=e.usage.prompt_tokens,
                               completionTokens=e.usage.completion_tokens, text=excerpt(e.text),
                               toolCalls=[c.name for c in e.tool_calls])
            if e.reasoning:
                entry.facts["reasoning"] = excerpt(e.reasoning)
            turn = self.turns.get(e.turn_id)
            if turn is not None:
                turn.prompt_tokens += e.usage.prompt_tokens
                turn.completion_tokens += e.usage.completion_tokens
            self._close(entry, rec, "completed", e.duration_ms)
        else:
            entry.facts["error"] = e.error
            self._close(entry, rec, "aborted" if e.aborted else "failed", e.duration_ms)

    # tool calls and approvals

    def _tool_started(self, rec: RecordedEvent, e: E.ToolStarted) -> None:
        facts: dict[str, Any] = {"callId": e.call_id, "tool": e.tool, "args": summarize_args(e.args)}
        if e.display is not None:
            facts["display"] = e.display.kind
            if e.display.sandbox is not None:
                facts["sandbox"] = e.display.sandbox  # the policy the command ran under
        if e.call_id in self.approvals:
            facts["approval"] = self.approvals[e.call_id]
        self.open[f"call:{e.call_id}"] = self._entry(rec, "tool", "call", turn_id=e.turn_id, status="running",
                                                     facts=facts)
        if e.turn_id in self.turns:
            self.turns[e.turn_id].tool_calls += 1

    def _tool_finished(self, rec: RecordedEvent, e: E.ToolFinished) -> None:
        entry = self.open.pop(f"call:{e.call_id}", None)
        if entry is None:  # never started: denied, not executed, unknown tool or invalid arguments
            spec = self.calls.get(e.call_id)
            facts: dict[str, Any] = {"callId": e.call_id, "tool": spec.name if spec is not None else "?"}
            if spec is not None:
                facts["args"] = summarize_args(spec.args)
            entry = self._entry(rec, "tool", "call", turn_id=e.turn_id, facts=facts)
            if e.turn_id in self.turns:
                self.turns[e.turn_id].tool_calls += 1
        for key, value in (("exitCode", e.exit_code), ("repair", e.repair), ("taskId", e.task_id)):
            if value is not None:
                entry.facts[key] = value
        if e.not_executed:
            entry.facts["notExecuted"] = True
        if e.settlement is not None:
            entry.facts["approval"] = f"{e.settlement.state} ({e.settlement.source})"
        entry.facts["output"] = summarize_args(e.output, EXCERPT)
        self._close(entry, rec, e.status, e.duration_ms)

    def _approval_requested(self, rec: RecordedEvent, e: E.ToolApprovalRequested) -> None:
        self.open[f"approval:{e.approval_id}"] = self._entry(
            rec, "approval", "requested", turn_id=e.turn_id, status="pending",
            facts={"callId": e.call_id, "approvalId": e.approval_id})

    def _approval_settled(self, rec: RecordedEvent, e: E.ToolApprovalSettled) -> None:
        entry = self.open.pop(f"approval:{e.approval_id}", None)
        if entry is None:
            entry = self._entry(rec, "approval", "requested", turn_id=e.turn_id,
                                facts={"callId": e.call_id, "approvalId": e.approval_id})
        s = e.settlement
        entry.facts.update(settlement=s.state, source=s.source)
        if s.by is not None:
            entry.facts["by"] = s.by.nickname or s.by.user_id or s.by.platform
        if s.note:
            entry.facts["note"] = s.note
        if s.grant_id is not None:
            entry.facts["grantId"] = s.grant_id  # settled by that grant: no approval was asked
        if s.grant is not None:
            entry.facts["grant"] = grant_text(s.state, s.grant)
        self._close(entry, rec, s.state, max(0, s.at - entry.at) if s.at else None)
        self.approvals[e.call_id] = f"{s.state} ({s.source})"
        call = self.open.get(f"call:{e.call_id}")
        if call is not None:
            call.facts["approval"] = self.approvals[e.call_id]

    def _grant_revoked(self, rec: RecordedEvent, e: E.ApprovalGrantRevoked) -> None:
        facts: dict[str, Any] = {"grantId": e.grant_id}
        if e.by is not None:
            facts["by"] = e.by.nickname or e.by.user_id or e.by.platform
        self._entry(rec, "approval", "grant revoked", status="revoked", facts=facts)

    # notices, plan, context, files

    def _notice(self, rec: RecordedEvent, e: E.NoticePosted) -> None:
        facts: dict[str, Any] = {"topic": e.topic, "text": excerpt(e.text)}
        if e.can_continue:
            facts["canContinue"] = True
        self._entry(rec, "notice", e.topic, turn_id=e.turn_id, facts=facts)

    def _plan(self, rec: RecordedEvent, e: Any) -> None:
        if isinstance(e, E.PlanUpdated):
            facts = {"entries": [f"[{p.status}] {p.text}" for p in e.entries]}
            self._entry(rec, "plan", "updated", facts=facts)
        else:
            self._entry(rec, "plan", "cleared")

    def _context(self, rec: RecordedEvent, e: Any) -> None:
        if isinstance(e, E.ContextTrimmed):
            self._entry(rec, "context", "trimmed", turn_id=e.turn_id, facts={
                "charsBefore": e.chars_before, "charsAfter": e.chars_after, "omittedOutputs": e.omitted_outputs,
                "droppedTurns": e.dropped_turns})
        elif isinstance(e, E.ContextCompacted):
            self._entry(rec, "context", "compacted", turn_id=e.turn_id, facts={
                "turns": e.turns, "chars": e.chars, "auto": e.auto, "summary": excerpt(e.summary)})
        else:
            self._entry(rec, "context", "compact-failed", turn_id=e.turn_id, facts={"error": e.error, "auto": e.auto})

    def _checkpoint(self, rec: RecordedEvent, e: E.CheckpointRecorded) -> None:
        facts: dict[str, Any] = {"callId": e.call_id, "path": e.path, "existed": e.existed}
        if e.content is not None:
            facts["bytes"] = len(e.content)
        self._entry(rec, "checkpoint", "recorded", turn_id=e.turn_id, facts=facts)

    def _rewound(self, rec: RecordedEvent, e: E.TurnRewound) -> None:
        self._entry(rec, "rewind", e.scope, turn_id=e.turn_id, facts={
            "restored": e.restored, "removed": e.removed, "conflicts": e.conflicts, "chatDeleted": e.chat_deleted,
            "deletedMessages": e.deleted_messages})

    def _artifact(self, rec: RecordedEvent, e: E.ArtifactRecorded) -> None:
        self._entry(rec, "artifact", "recorded", turn_id=e.turn_id, facts={
            "name": e.name, "path": e.path, "size": e.size, "mime": e.mime})


def _turn_end_facts(e: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(e, E.TurnCompleted):
        return "completed", {"outcome": e.outcome, "output": excerpt(e.output_text)}
    if isinstance(e, E.TurnFailed):
        facts = {"outcome": "error", "code": e.code, "reason": e.reason}
        return "failed", facts if e.step_id is None else {**facts, "step": e.step_id}
    if isinstance(e, E.TurnAborted):
        return "aborted", {"outcome": "aborted", "reason": e.reason}
    return "limit", {"outcome": "silent", "code": "tool-limit", "reason": f"stopped after {e.max_steps} model calls"}


def build_timeline(session_id: str, events: Sequence[RecordedEvent], until: int | None = None) -> Timeline:
    """The timeline of a session's events with version <= ``until`` (all of them by default)."""
    builder = _TimelineBuilder(session_id)
    kept = [r for r in events if until is None or r.version <= until]
    for rec in kept:
        builder.add(rec)
    state = fold_events(session_id, kept)
    tl = builder.timeline
    tl.status, tl.events, tl.until = state.status.value, len(kept), until
    tl.last_version = kept[-1].version if kept else 0
    return tl



def grant_text(state: str, terms: E.GrantTerms) -> str:
    """``approve exec 'git status' for the session until <ms>``: a grant in one line."""
    what = terms.tool + (f" {terms.command_prefix!r}" if terms.command_prefix else "")
    return f"{'approve' if state == 'approved' else 'deny'} {what} for the {terms.scope} until {terms.expires_at}"
