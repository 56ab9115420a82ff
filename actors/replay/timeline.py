"""Replay-based debugging, the pure part (SPEC §9): timelines, verification, re-run comparison.

Everything here is a function of recorded events (and of what the store serves beside them: the
snapshot, the listing record; and of what a live host served, :class:`LiveView`); no clock, and no
I/O except :func:`serve_live_view`, which asks a live host's gateway and session actor. The
``sessionloop replay / rerun`` commands in ``cli/replay_cmd.py`` are the shell that reads the
store, runs a host and prints.

Three tools, each the answer to one debugging question:

* :func:`build_timeline` -- "what happened?": turns, model calls (provider, model, tokens,
  duration), tool calls (args, status, exit code, repair), approvals, notices, context trimming
  and compaction, checkpoints and rewinds, in log order; ``until`` cuts it at an event version.
* :func:`verify` -- "does what the system serves follow from the log?": the state folded from the
  raw events against the stored snapshot, the listing record against ``summary_record`` of the
  fold at the commit that wrote it, and the protocol history (paged history, and the pushes a
  client received from a subscription at a snapshot boundary) against the projection of all
  events; given a :class:`LiveView`, also what a live host serves: its session actor's projection
  and state, the gateway's ``session/history`` pages and ``session/subscribe`` snapshot. The
  first difference is reported with its field path, the expected value (from the events) and the
  value the system has.
* :func:`plan_rerun` / :func:`comparable` / :func:`compare_logs` -- "is the runtime
  deterministic?": like a workflow replayer (Temporal, STYLE "models"), a session forked at turn N
  re-runs the later inputs; its log must equal the recording modulo ids and times
  (:data:`IGNORED_KEYS`), and the first divergence is reported as event index, tag, field,
  expected and got. :meth:`RerunPlan.find_step` and :func:`parse_model_answer` resolve the
  what-if overrides (a tool result or a model answer replaced at one step).

Why one module over the house size (STYLE rule 12): the three share the plain-value diff
(:func:`plain`, :func:`first_difference`) and the fold, and each is a handful of short pure
functions; the timeline builder is a table of small handlers, like ``ItemsProjection``.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import msgspec
from msgspec import UNSET

from sessionloop.actors import events as E
from sessionloop.actors.approvals.actor import GateInputs
from sessionloop.actors.session.context import turn_starts
from sessionloop.actors.session.state import SessionState, decode_state, evolve, new_state
from sessionloop.actors.settings.texts import DEFAULT_LANGUAGE, LANGUAGES, enc_hook
from sessionloop.actors.views.items import HISTORY_MAX_LIMIT, ItemsProjection
from sessionloop.actors.views.summary import (
    SummaryRecord,
    decode_summary_record,
    rewrites_listing,
    summary_record,
)
from sessionloop.eventstore.records import RecordedEvent, Snapshot
from sessionloop.protocol.handshake import SESSION_PROTOCOL_VERSION

__all__ = [
    "ABSENT",
    "IGNORED_KEYS",
    "Difference",
    "Divergence",
    "Entry",
    "LaterTurn",
    "LiveUnavailable",
    "LiveView",
    "MemoryClient",
    "ModelAnswer",
    "RecordedApproval",
    "RerunPlan",
    "StepRef",
    "Timeline",
    "TurnSummary",
    "VerifyReport",
    "build_timeline",
    "comparable",
    "compare_logs",
    "first_difference",
    "fold_events",
    "override_settlement",
    "parse_model_answer",
    "plain",
    "plan_rerun",
    "replayed_settlement",
    "rerun_gate",
    "serve_live_view",
    "until_version",
    "verify",
]

ABSENT: Final = "(absent)"  # how a missing key or list element is shown in a difference

#: Payload keys a re-run may change without being a divergence: ids the runtime draws and times.
#: ``call_id`` is *not* here: call ids come from the model's answer, which a replay reproduces.
IGNORED_KEYS: Final = frozenset({
    "at", "duration_ms", "turn_id", "step_id", "input_id", "input_ids", "notice_id", "approval_id",
    "grant_id", "task_id", "session_id", "idempotency_key", "expires_at", "last_output_at",
})

#: Listing-record fields that are not a function of the session's own events (other streams).
NOT_FROM_EVENTS: Final = frozenset({"attention", "background"})

_TURN_END: Final = (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)
EXCERPT: Final = 120


# --- plain values and differences ----------------------------------------------------------------


def plain(value: Any) -> Any:
    """``value`` as JSON-like data with *every* field (defaults too), so two values compare field by
    field and a difference names a real field. Events carry their tag as ``type``."""
    if isinstance(value, E.UnknownEvent):
        return {"type": value.type, "raw": plain(value.raw)}
    if isinstance(value, msgspec.Struct):
        out: dict[str, Any] = {}
        if isinstance(value, E.Event):
            out["type"] = E.event_tag(value)
        for name in value.__struct_fields__:
            out[name] = plain(getattr(value, name))
        return out
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return msgspec.to_builtins(bytes(value))  # base64, as the JSON export writes it
    if value is UNSET:
        return ABSENT
    return value


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def first_difference(expected: Any, got: Any, path: str = "",
                     ignore: frozenset[str] = frozenset()) -> tuple[str, Any, Any] | None:
    """The first place where two plain values differ: ``(path, expected, got)``, or None.

    Dict keys are visited in ``expected``'s order, then keys only ``got`` has; a missing key or
    list element is shown as :data:`ABSENT`. Keys in ``ignore`` are skipped at every depth.
    """
    if isinstance(expected, dict) and isinstance(got, dict):
        keys = [k for k in expected if k not in ignore] + [k for k in got if k not in expected and k not in ignore]
        for key in keys:
            here = _join(path, key)
            if key not in got:
                return here, expected[key], ABSENT
            if key not in expected:
                return here, ABSENT, got[key]
            found = first_difference(expected[key], got[key], here, ignore)
            if found is not None:
                return found
        return None
    if isinstance(expected, list) and isinstance(got, list):
        for i in range(max(len(expected), len(got))):
            if i >= len(got):
                return _join(path, i), expected[i], ABSENT
            if i >= len(expected):
                return _join(path, i), ABSENT, got[i]
            found = first_difference(expected[i], got[i], _join(path, i), ignore)
            if found is not None:
                return found
        return None
    if type(expected) is not type(got) and not (_is_number(expected) and _is_number(got)):
        return path or "$", expected, got
    return None if expected == got else (path or "$", expected, got)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def excerpt(text: str, limit: int = EXCERPT) -> str:
    """One line of at most ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summarize_args(args: Any, limit: int = 80) -> str:
    """A tool call's arguments as one short line of JSON."""
    if args is None:
        return "{}"
    try:
        text = msgspec.json.encode(args).decode()
    except (TypeError, msgspec.EncodeError):
        text = repr(args)
    return excerpt(text, limit)


def fold_events(session_id: str, events: Iterable[Any], state: SessionState | None = None) -> SessionState:
    """The session state folded from ``events`` (recorded or bare), the same fold activation runs."""
    state = state if state is not None else new_state(session_id)
    for item in events:
        evolve(state, item.event if isinstance(item, RecordedEvent) else item)
    return state


# --- timeline ------------------------------------------------------------------------------------


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


# --- verify --------------------------------------------------------------------------------------


class Difference(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """Where what the system serves differs from what the events say.

    ``check`` names the served thing (``snapshot``, ``listing record``, ``history``, ``pushes``);
    ``expected`` is the value rebuilt from the raw events, ``got`` the served one; ``version`` is
    the event version the compared value belongs to.
    """

    check: str
    path: str
    expected: Any = None
    got: Any = None
    version: int | None = None
    note: str | None = None


class VerifyReport(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """What :func:`verify` compared and the first difference.

    ``compared`` is ``live`` when a live host's answers (:class:`LiveView`) were compared too
    (``live_epoch``, ``history_pages``, ``snapshot_items`` say what it served), ``offline`` when
    only what the store holds was (``offline_reason`` says why, when the caller knows).
    """

    session_id: str
    compared: str
    events: int = 0
    snapshot_version: int | None = None
    snapshot_note: str | None = None
    listing_version: int | None = None
    history_items: int = 0
    live_epoch: int | None = None
    history_pages: int | None = None
    snapshot_items: int | None = None
    offline_reason: str | None = None
    remote_url: str | None = None  # the running server asked over the wire (its actor's state is not)
    difference: Difference | None = None

    @property
    def ok(self) -> bool:
        return self.difference is None


def _commit_end(events: Sequence[RecordedEvent], index: int) -> int:
    """Index of the last event that may belong to the same commit as ``events[index]``.

    Events of one commit share the commit's time and have consecutive positions; two commits in
    the same millisecond may look like one, so the caller treats every index up to this one as a
    possible end of the commit.
    """
    end = index
    while end + 1 < len(events):
        a, b = events[end], events[end + 1]
        if b.at != a.at or b.position != a.position + 1 or b.commit_id != a.commit_id:
            break
        end += 1
    return end


def _record_plain(record: SummaryRecord) -> dict[str, Any]:
    out = plain(record)
    for key in NOT_FROM_EVENTS:
        out.pop(key, None)
    return out  # type: ignore[no-any-return]


def verify(session_id: str, events: Sequence[RecordedEvent], snapshot: Snapshot | None,
           meta: bytes | None, live: LiveView | None = None) -> VerifyReport:
    """Rebuild state, listing record and protocol items from ``events`` and compare them with the
    stored ``snapshot``, the stored listing record ``meta`` and the history paged from the
    rebuilt items; with ``live`` (:func:`serve_live_view`), also with what a live host serves:
    its session actor's projection and state, ``session/history`` pages and the
    ``session/subscribe`` snapshot, as the gateway sends them.

    Returns a report whose ``difference`` is the first one found (snapshot, listing record,
    history, then the live checks), or None when everything agrees.
    """
    report = VerifyReport(session_id=session_id, compared="live" if live is not None else "offline",
                          events=len(events))
    # the commits that rewrote the record, by the rule the session actor writes it by
    summary_at = [i for i, r in enumerate(events) if rewrites_listing([r.event])]
    candidates: set[int] = set()
    if summary_at:
        last = summary_at[-1]
        candidates = set(range(last, _commit_end(events, last) + 1))
    snap_at = snapshot.version if snapshot is not None else None
    state = new_state(session_id)
    snap_state: Any = None
    records: list[tuple[int, SummaryRecord]] = []
    for i, rec in enumerate(events):
        evolve(state, rec.event)
        if snap_at is not None and rec.version == snap_at:
            snap_state = plain(state)
        if i in candidates:
            records.append((rec.version, summary_record(state)))
    full = ItemsProjection(session_id)
    full.apply_all(r.event for r in events)
    report.difference = (_check_snapshot(report, snapshot, snap_state, events)
                         or _check_listing(report, meta, records)
                         or _check_history(report, session_id, events, full, state, snap_at)
                         or (_check_live(report, full, state, live) if live is not None else None))
    return report


def _check_snapshot(report: VerifyReport, snapshot: Snapshot | None, folded: Any,
                    events: Sequence[RecordedEvent]) -> Difference | None:
    if snapshot is None:
        return None
    report.snapshot_version = snapshot.version
    last = events[-1].version if events else 0
    if snapshot.version > last or folded is None:
        return Difference(check="snapshot", path="version", expected=f"a version between 1 and {last}",
                          got=snapshot.version, note="the snapshot claims events the stream does not have")
    decoded = decode_state(snapshot.state)
    if decoded is None:
        report.snapshot_note = "written in another state format: activation ignores it and replays the events"
        return None
    found = first_difference(folded, plain(decoded))
    if found is None:
        return None
    path, expected, got = found
    return Difference(check="snapshot", path=f"state.{path}", expected=expected, got=got, version=snapshot.version)


def _check_listing(report: VerifyReport, meta: bytes | None,
                   records: list[tuple[int, SummaryRecord]]) -> Difference | None:
    if not records:
        return None
    version, expected = records[-1]
    if meta is None:
        return Difference(check="listing record", path="record", expected="a listing record", got=ABSENT,
                          version=version, note="sessions/list would not show this session")
    try:
        stored = decode_summary_record(meta)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return Difference(check="listing record", path="record", expected="a listing record",
                          got=f"undecodable bytes ({e})", version=version)
    got = _record_plain(stored)
    for candidate_version, candidate in reversed(records):
        if first_difference(_record_plain(candidate), got) is None:
            report.listing_version = candidate_version
            return None
    found = first_difference(_record_plain(expected), got)
    assert found is not None
    path, want, have = found
    return Difference(check="listing record", path=f"record.{path}", expected=want, got=have, version=version)


def _wire(item: Any, language: str = DEFAULT_LANGUAGE) -> Any:
    """An item as plain JSON-like values, its human text rendered in ``language`` (as a frame of
    a server in that language has it; ``actors.settings.texts``)."""
    return msgspec.to_builtins(item, enc_hook=_TEXT_HOOKS.get(language, _TEXT_HOOKS[DEFAULT_LANGUAGE]))


_TEXT_HOOKS: Final = {language: enc_hook(lambda language=language: language) for language in LANGUAGES}


def _singletons(items: ItemsProjection) -> list[Any]:
    return [x for x in (items.plan_item(), items.usage_item(), items.queue_item()) if x is not None]


def _check_history(report: VerifyReport, session_id: str, events: Sequence[RecordedEvent], full: ItemsProjection,
                   state: SessionState, snap_at: int | None) -> Difference | None:
    report.history_items = len(full.items())
    found = _check_pages(full, state)
    if found is not None or state.deleted:
        return found
    for boundary in sorted({0, snap_at or 0}):
        found = _check_pushes(full, session_id, events, boundary)
        if found is not None:
            return found
    return None


def _check_pages(full: ItemsProjection, state: SessionState) -> Difference | None:
    """``session/history`` paged from the newest to the oldest gives every archived item once, in order."""
    running = state.current_turn
    archived = [_wire(i) for i in full.items() if running is None or i.turn_id != running]
    paged: list[Any] = []
    before: str | None = None
    seen: set[str] = set()
    while True:
        page, before = full.history_page(before, HISTORY_MAX_LIMIT)  # the pages ask_served asked for
        paged[:0] = [_wire(i) for i in page]
        if before is None:
            break
        if before in seen:
            return Difference(check="history", path="before", expected="a cursor to an older page", got=before,
                              note="session/history repeats a cursor")
        seen.add(before)
    found = first_difference(archived, paged)
    if found is None:
        return None
    path, expected, got = found
    return Difference(check="history", path=f"history{path}", expected=expected, got=got,
                      note="session/history pages vs the items of all events")


def _check_pushes(full: ItemsProjection, session_id: str, events: Sequence[RecordedEvent],
                  boundary: int) -> Difference | None:
    """A client that subscribed at ``boundary`` and applied every later push holds the same items
    as a subscription made now (seed 004: ``item/completed`` is the canonical copy)."""
    partial = ItemsProjection(session_id)
    partial.apply_all(r.event for r in events if r.version <= boundary)
    view = {i.item_id: _wire(i) for i in partial.items() + _singletons(partial)}
    removed = False
    for rec in events:
        if rec.version <= boundary:
            continue
        if isinstance(rec.event, (E.TurnRewound, E.SessionDeleted)):
            removed = True
        for _method, item in partial.apply(rec.event):
            view[item.item_id] = _wire(item)
    for key in ("plan", "queue"):  # an empty plan or queue is how a push says "none"
        if key in view and not view[key].get("entries"):
            del view[key]
    expected = {i.item_id: _wire(i) for i in full.items() + _singletons(full)}
    note = f"a client subscribed at version {boundary} and applying the pushes since"
    for item_id, want in expected.items():
        if item_id not in view:
            return Difference(check="pushes", path=f"items[{item_id!r}]", expected=want, got=ABSENT, note=note,
                              version=boundary)
        found = first_difference(want, view[item_id])
        if found is not None:
            path, a, b = found
            return Difference(check="pushes", path=f"items[{item_id!r}].{path}", expected=a, got=b, note=note,
                              version=boundary)
    extra = [k for k in view if k not in expected]
    if extra and not removed:
        return Difference(check="pushes", path=f"items[{extra[0]!r}]", expected=ABSENT, got=view[extra[0]],
                          note=note, version=boundary)
    return None


# --- verify against a live host ---------------------------------------------------------------------


class LiveView(msgspec.Struct, kw_only=True):
    """What a live host serves for one session, as plain JSON-like values (:func:`serve_live_view`).

    ``items`` is the session actor's own projection (the ``ItemsProjection`` it keeps up to date
    from its commits and serves from; items, then plan, usage and queue), ``state`` and
    ``version`` its folded state; ``snapshot`` (``{items, before}``) and ``history`` (pages,
    newest first, each ``{items, before}``) are the gateway's answers to ``session/subscribe``
    and ``session/history`` as a client receives them. ``error`` is the error object the gateway
    answered instead (a session it does not serve); ``decorate`` is the gateway's decoration of
    items (attachment handles of its epoch), applied to the rebuilt side before comparing.
    """

    session_id: str
    epoch: int = 0
    version: int = 0
    state: Any = None
    items: list[Any] = []
    snapshot: Any = None
    history: list[Any] = []
    error: Any = None
    decorate: Any = None
    #: asked over the wire (``replay --verify --url``): the server's answers only, no session actor
    #: to ask for its projection and state; attachment handles compared as :data:`HANDLE`
    remote: bool = False
    #: the language the host renders human text in; None (a remote server: not announced): the
    #: served items are compared with the rebuilt ones in each language, one must agree
    language: str | None = None
    remote_url: str | None = None


HANDLE = "<download handle>"


def remote_decorate(_session_id: str, item: Any) -> Any:
    """The rebuilt side of a remote comparison: a stored attachment (``blob:<sha256>``) is served
    as a download handle signed with the server's key, which only the server has."""
    from sessionloop.protocol.schemas_types import ItemAttachment, UserMessageItem

    if not isinstance(item, UserMessageItem) or not item.attachments:
        return item
    return msgspec.structs.replace(item, attachments=[
        ItemAttachment(kind=a.kind, name=a.name, src=HANDLE) if a.src is not None and a.src.startswith("blob:") else a
        for a in item.attachments])


def served_handles_masked(items: list[Any]) -> list[Any]:
    """The served side of a remote comparison: each download handle (seed 004 handle shape) in a
    user message's attachments replaced by :data:`HANDLE`."""
    from sessionloop.protocol.file_handles import HANDLE_SHAPE

    out = []
    for item in items:
        if isinstance(item, dict) and item.get("kind") == "user-message" and item.get("attachments"):
            item = {**item, "attachments": [
                {**a, "src": HANDLE} if isinstance(a, dict) and isinstance(a.get("src"), str)
                and HANDLE_SHAPE.fullmatch(a["src"]) else a for a in item["attachments"]]}
        out.append(item)
    return out


class LiveUnavailable(Exception):
    """The live host did not answer (a timeout): nothing to compare with."""


class MemoryClient:
    """An owner connection to a gateway service with no socket: request frames in, result frames
    out, pushes dropped (``--verify`` reads snapshots and pages; ``rerun`` sets its fork's
    settings and deletes a discarded fork)."""

    def __init__(self, service: Any, timeout: float) -> None:
        from sessionloop.protocol.transport import Peer

        self.timeout = timeout
        self.answers: dict[int, dict[str, Any]] = {}
        self.cond = threading.Condition()
        self.next_id = 0
        self.conn = service.connect(Peer(platform="console", user_id="owner", surface="cli"), self._send)

    def _send(self, text: str) -> None:
        frame = msgspec.json.decode(text)
        if isinstance(frame, dict) and isinstance(frame.get("id"), int):
            with self.cond:
                self.answers[frame["id"]] = frame
                self.cond.notify_all()

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The reply frame (``result`` or ``error``) of one request."""
        with self.cond:
            self.next_id += 1
            rid = self.next_id
        self.conn.receive(msgspec.json.encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        with self.cond:
            if not self.cond.wait_for(lambda: rid in self.answers, self.timeout):
                raise LiveUnavailable(f"the live host did not answer {method} within {self.timeout:g} s")
            return self.answers.pop(rid)

    def initialize(self, name: str) -> None:
        """The handshake, as client ``name``; raises :class:`LiveUnavailable` when refused."""
        hello = self.call("initialize", {"protocolVersion": SESSION_PROTOCOL_VERSION,
                                         "client": {"name": name, "version": "1"}})
        if "error" in hello:
            raise LiveUnavailable(f"the live host refused the connection: {hello['error']}")

    def close(self) -> None:
        self.conn.close()


def serve_live_view(service: Any, session_id: str, *, timeout: float = 30.0) -> LiveView:
    """Ask a live host what it serves for ``session_id``: through ``service`` (the host's
    ``SessionProtocolService``, the gateway a server runs) an owner connection subscribes,
    unsubscribes and pages ``session/history`` to the end (200 messages a page); then the
    session actor is asked for its projection and state. The one function here with I/O.

    Meant for a session at rest: a turn that commits meanwhile makes the answers disagree.
    Raises :class:`LiveUnavailable` when the host does not answer in ``timeout`` seconds.
    """
    from sessionloop.actors.session.actor import Ask
    from sessionloop.actors.session.commands import ProjectionView

    view = LiveView(session_id=session_id, epoch=service.rt.epoch, decorate=service.decorate,
                    language=service.rt.language)
    client = MemoryClient(service, timeout)
    try:
        ask_served(client.call, view)
    finally:
        client.close()
    if view.error is None:
        version, state, items = service.rt.ask(session_id, lambda r: Ask(ProjectionView(), r), timeout)
        view.version, view.state, view.items = version, plain(state), [_wire(i) for i in items]
    return view


def ask_served(call: Callable[[str, dict[str, Any]], dict[str, Any]], view: LiveView,
               served: Callable[[list[Any]], list[Any]] = lambda items: items) -> None:
    """Fill ``view`` with what a connection is served for its session: ``call(method, params)``
    answers one JSON-RPC request (the reply object). Handshake, ``session/subscribe`` (its
    snapshot and epoch), ``session/unsubscribe``, then ``session/history`` to the oldest page;
    ``served`` is applied to every list of items received. An error answer is kept in
    ``view.error``; a refused handshake raises :class:`LiveUnavailable`."""
    sid = view.session_id
    hello = call("initialize", {"protocolVersion": SESSION_PROTOCOL_VERSION,
                                "client": {"name": "sessionloop-verify", "version": "1"}})
    if "error" in hello:
        raise LiveUnavailable(f"the live host refused the connection: {hello['error']}")
    reply = call("session/subscribe", {"sessionId": sid})
    if "error" in reply:
        view.error = reply["error"]
        return
    view.epoch = reply["result"]["epoch"]
    view.snapshot = {"items": served(reply["result"]["items"]), "before": reply["result"].get("before")}
    call("session/unsubscribe", {"sessionId": sid})
    before: str | None = None
    while True:
        params: dict[str, Any] = {"sessionId": sid, "limit": HISTORY_MAX_LIMIT}
        if before is not None:
            params["before"] = before
        reply = call("session/history", params)
        if "error" in reply:
            view.error = reply["error"]
            return
        page = reply["result"]
        view.history.append({"items": served(page["items"]), "before": page.get("before")})
        if page.get("before") is None or len(view.history) > 100_000:
            return
        before = page["before"]


def _check_live(report: VerifyReport, full: ItemsProjection, state: SessionState,
                live: LiveView) -> Difference | None:
    """The live host's answers against the rebuild, its human text in the host's language (in
    each language for a remote host; the first difference in English when none agrees)."""
    languages = [live.language] if live.language is not None else list(LANGUAGES)
    first: Difference | None = None
    for language in languages:
        found = _check_live_in(report, full, state, live, language)
        if found is None:
            return None
        first = first or found
    return first


def _check_live_in(report: VerifyReport, full: ItemsProjection, state: SessionState,
                   live: LiveView, language: str) -> Difference | None:
    report.live_epoch = live.epoch
    report.remote_url = live.remote_url
    sid = live.session_id
    if live.error is not None:
        if state.deleted:
            return None  # a deleted session is not served: that is what the events say
        return Difference(check="live subscribe", path="error", expected="a subscription snapshot", got=live.error,
                          note="the live host refused to serve the session")
    if state.deleted:
        return Difference(check="live subscribe", path="session", expected="not-found (the events delete the session)",
                          got="a subscription snapshot", note="the live host serves a deleted session")
    report.history_pages = len(live.history)
    report.snapshot_items = len(live.snapshot["items"])
    decorate = live.decorate if live.decorate is not None else (lambda _sid, item: item)

    def served(items: Iterable[Any]) -> list[Any]:
        return [_wire(decorate(sid, i), language) for i in items]

    expected_pages: list[Any] = []
    before: str | None = None
    while True:
        page, before = full.history_page(before, HISTORY_MAX_LIMIT)  # the pages ask_served asked for
        expected_pages.append({"items": served(page), "before": before})
        if before is None or len(expected_pages) > len(live.history):
            break
    found_item = None if live.remote else _compare_items([_wire(i) for i in full.items() + _singletons(full)],
                                                          live.items)
    if found_item is not None:
        where, a, b = found_item
        return Difference(check="live projection", path=where, expected=a, got=b, version=live.version,
                          note="the live session actor's items vs the items of all events")
    snap_items, snap_before = full.snapshot_items()
    for check, path, want, got, note in (
        ("live history", "pages", expected_pages, live.history,
         "session/history pages from the live host vs pages of the items of all events"),
        ("live snapshot", "snapshot", {"items": served(snap_items), "before": snap_before}, live.snapshot,
         "the live host's session/subscribe snapshot vs the snapshot of the items of all events"),
        ("live state", "state", plain(state), live.state,
         "the live session actor's state vs the fold of all events"),
    ):
        if live.remote and check == "live state":
            continue  # a server answers over the wire, not with its actor's state
        found = first_difference(want, got)
        if found is not None:
            where, a, b = found
            where = path if where == "$" else f"{path}{where}" if where.startswith("[") else f"{path}.{where}"
            return Difference(check=check, path=where, expected=a, got=b, note=note, version=live.version)
    return None


def _compare_items(expected: list[Any], got: list[Any]) -> tuple[str, Any, Any] | None:
    """Two lists of wire items compared by item id (``items['<id>'].field``), then their order."""
    want = {i.get("itemId"): i for i in expected}
    have = {i.get("itemId"): i for i in got if isinstance(i, dict)}
    for item_id, item in want.items():
        if item_id not in have:
            return f"items[{item_id!r}]", item, ABSENT
        found = first_difference(item, have[item_id])
        if found is not None:
            path, a, b = found
            return f"items[{item_id!r}].{path}", a, b
    extra = [k for k in have if k not in want]
    if extra:
        return f"items[{extra[0]!r}]", ABSENT, have[extra[0]]
    if list(want) != list(have) or len(got) != len(expected):
        return "order", list(want), [i.get("itemId") if isinstance(i, dict) else i for i in got]
    return None


# --- rerun -----------------------------------------------------------------------------------------


class LaterTurn(msgspec.Struct, kw_only=True):
    """A turn of the recording after the fork point, to be sent again."""

    number: int  # 1-based among the re-run turns
    turn_id: str
    input: E.InputAccepted

    @property
    def is_continue(self) -> bool:
        return self.input.source == "continue"


class RecordedApproval(msgspec.Struct, kw_only=True):
    """How the recording settled one call of the re-run turns that needed an approval.

    ``asked``: an approval was requested (``tool.approval.requested``) and answered later, by
    the owner or by its timers; otherwise the gate settled the call at once (a grant, nobody
    present, the rate limit, permission mode ``deny``). ``number`` is its 1-based place among
    the approvals after the fork point (what ``--override-approval N`` names)."""

    number: int
    turn: int
    call_id: str
    tool: str
    approval_id: str
    asked: bool = False
    settlement: E.Settlement | None = None

    def describe(self) -> str:
        how = "asked" if self.asked else "settled at once"
        s = self.settlement
        settled = f"{s.state} ({s.source})" if s is not None else "never settled"
        return f"{self.approval_id} ({self.tool} call {self.call_id}, re-run turn {self.turn}: {how}, {settled})"


#: who answers an approval in a rerun's what-if (``--override-approval``): the owner, as over the wire
RERUN_OWNER: Final = E.Speaker(platform="console", user_id="owner", owner=True)


def rerun_gate(recorded: RecordedApproval | None, overridden: bool) -> GateInputs:
    """What a rerun's approval gate is told about a call, so that it settles the call the way the
    recording did: asked (someone present, no grant), at once by a grant, at once ``absent`` or
    ``rate-limit``. An overridden call is asked, whatever grants say, and the override answers
    it. A call the recording has no approval for (the answers differ from the recording) meets
    what a rerun has: nobody present, and the grants the replayed answers made."""
    if overridden or (recorded is not None and recorded.asked):
        return GateInputs(present=True, rate_limited=False, grants=False)
    settled = recorded.settlement if recorded is not None else None
    if settled is None:
        return GateInputs(present=False, rate_limited=False)
    if settled.source == "grant":
        return GateInputs(present=True, rate_limited=False)  # the grant should settle it again
    return GateInputs(present=settled.source != "absent", rate_limited=settled.source == "rate-limit",
                      grants=False)


def replayed_settlement(recorded: E.Settlement, now: int) -> E.Settlement:
    """A recorded settlement given again at ``now``: a grant it made lasts as long after ``now``
    as it did after the recorded answer (so it settles the same later calls)."""
    grant = recorded.grant
    if grant is not None:
        grant = msgspec.structs.replace(grant, expires_at=now + max(0, grant.expires_at - recorded.at))
    return msgspec.structs.replace(recorded, at=now, grant=grant)


def override_settlement(decision: str, now: int) -> E.Settlement:
    """The owner's answer ``approve`` or ``deny`` (no note, no grant) for ``--override-approval``."""
    return E.Settlement(state="approved" if decision == "approve" else "denied", source="answer", at=now,
                        by=RERUN_OWNER)


class RerunPlan(msgspec.Struct, kw_only=True):
    """What ``rerun --from-turn N`` sends and what it expects, all from the original's events."""

    session_id: str
    from_turn: int
    user_turns: int
    turns: list[LaterTurn] = []
    answers: list[E.LlmCompleted] = []  # the recorded model answers of the later turns, in order
    model_calls: list[E.Event] = []  # answers and (not aborted) failures, in order: what a replay plays
    summaries: list[E.Event] = []  # automatic compactions (ContextCompacted / ContextCompactFailed)
    tool_results: dict[tuple[int, str], E.ToolFinished] = {}  # (turn number, call id) of calls that ran
    checkpoints: dict[tuple[int, str], list[str]] = {}  # (turn number, call id) -> paths, before-image order
    images: list[tuple[int, str, bool, bytes | None]] = []  # (turn number, path, existed, content), log order
    calls: list[tuple[int, str, str]] = []  # (turn number, call id, tool) of the calls that ran, in order
    #: (turn number, llm step id, 1-based model call within its turn) of the recorded model calls
    #: a replay plays (answers and provider failures), in order
    model_steps: list[tuple[int, str, int]] = []
    max_steps: int | None = None
    expected: list[tuple[str, RecordedEvent]] = []  # comparable events of the later turns
    #: (turn number, call id) -> how the recording settled a call that needed an approval
    approvals: dict[tuple[int, str], RecordedApproval] = {}
    #: turn number -> the session layer of settings ("plugin/key" -> value) when the turn started
    settings: dict[int, dict[str, Any]] = {}

    def turn_number(self, turn_id: str) -> int | None:
        return next((t.number for t in self.turns if t.turn_id == turn_id), None)

    def image_after(self, turn: int, path: str) -> tuple[bool, bytes | None] | None:
        """``(existed, content)`` of ``path`` right after re-run turn ``turn``, from the next later
        turn's before-image; None when no later turn touched it (the file's current state then)."""
        for number, p, existed, content in self.images:
            if p == path and number > turn:
                return existed, content
        return None

    def find_call(self, step: str) -> tuple[int, str, str]:
        """The tool call ``--override-tool STEP`` names: a call id, or the 1-based index of the
        calls that ran after the fork point. Raises ValueError."""
        if step.isdigit():
            index = int(step)
            if not 1 <= index <= len(self.calls):
                raise ValueError(f"tool call {index} does not exist: {len(self.calls)} tool calls ran after turn "
                                 f"{self.from_turn}")
            return self.calls[index - 1]
        for call in self.calls:
            if call[1] == step:
                return call
        raise ValueError(f"tool call {step!r} did not run after turn {self.from_turn}")

    def find_step(self, step: str) -> StepRef:
        """The step ``--override-tool STEP`` names (SPEC §9 what-if): a tool call that ran (its
        call id, or its 1-based number among the calls after the fork point) or a recorded model
        call (its llm step id, as ``replay`` shows it, or ``llm:N``, the N-th model call after the
        fork point). Raises ValueError naming what exists."""
        text = step.strip()
        if text.startswith("llm:"):
            number = text[4:]
            if not number.isdigit() or not 1 <= int(number) <= len(self.model_steps):
                raise ValueError(f"model call {text} does not exist: {len(self.model_steps)} model calls were "
                                 f"recorded after turn {self.from_turn} (llm:1 to llm:{len(self.model_steps)})")
            return self._model_ref(self.model_steps[int(number) - 1])
        for found in self.model_steps:
            if found[1] == text:
                return self._model_ref(found)
        if text.isdigit() or any(call[1] == text for call in self.calls):
            turn, call_id, tool = self.find_call(text)
            return StepRef(kind="tool", turn=turn, call_id=call_id, tool=tool)
        raise ValueError(f"step {text!r} is neither a tool call that ran nor a model call recorded after turn "
                         f"{self.from_turn} (tool calls: a call id or 1 to {len(self.calls)}; model calls: an llm "
                         f"step id or llm:1 to llm:{len(self.model_steps)})")

    def find_approval(self, ref: str) -> RecordedApproval:
        """The approval ``--override-approval REF`` names: an approval id (as ``replay`` shows
        it), the call id of a call that needed one (when only one call has it), or the 1-based
        number of the approvals after the fork point. Raises ValueError saying what exists."""
        text = ref.strip()
        found = sorted(self.approvals.values(), key=lambda a: a.number)
        if not found:
            raise ValueError(f"no call needed an approval after turn {self.from_turn}")
        listed = "; ".join(f"{a.number}: {a.describe()}" for a in found[:5]) + (
            f"; and {len(found) - 5} more" if len(found) > 5 else "")
        if text.isdigit():
            if 1 <= int(text) <= len(found):
                return found[int(text) - 1]
            raise ValueError(f"approval {text} does not exist: {len(found)} approvals after turn {self.from_turn} "
                             f"({listed})")
        by_id = [a for a in found if a.approval_id == text]
        by_call = [a for a in found if a.call_id == text]
        if by_id or len(by_call) == 1:
            return (by_id or by_call)[0]
        if by_call:
            raise ValueError(f"call id {text!r} needed an approval in {len(by_call)} turns; name one by its "
                             f"approval id or number ({listed})")
        raise ValueError(f"{text!r} names no approval after turn {self.from_turn} ({listed})")

    def _model_ref(self, found: tuple[int, str, int]) -> StepRef:
        turn, step_id, call = found
        recorded = next((e for e in self.model_calls if getattr(e, "step_id", None) == step_id), None)
        return StepRef(kind="model", turn=turn, step_id=step_id, call=call, recorded=recorded)


class StepRef(msgspec.Struct, kw_only=True):
    """A step of the re-run turns that ``--override-tool STEP`` names.

    ``kind`` is ``tool`` (``call_id``, ``tool``) or ``model`` (``step_id``: the recorded llm
    step; ``call``: the 1-based model call within its turn; ``recorded``: the recorded
    ``llm.completed`` or ``llm.failed``). ``turn`` is the 1-based re-run turn.
    """

    kind: str
    turn: int
    call_id: str = ""
    tool: str = ""
    step_id: str = ""
    call: int = 0
    recorded: Any = None


class OverrideToolCall(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    name: str
    args: Any = None
    call_id: str | None = None


class ModelAnswer(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="camel", omit_defaults=True):
    """A model answer given on the command line instead of a recorded one: ``text`` and
    ``toolCalls`` (each ``{"name", "args", "callId"?}``, ids default to ``override_N``), an
    optional ``reasoning``; or ``error`` alone, for a call that fails with that message."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[OverrideToolCall] = []
    error: str | None = None

    def tool_call_specs(self) -> list[E.ToolCallSpec]:
        return [E.ToolCallSpec(call_id=c.call_id or f"override_{i}", name=c.name, args=c.args)
                for i, c in enumerate(self.tool_calls, start=1)]


MODEL_ANSWER_SHAPE: Final = '{"text": "...", "toolCalls": [{"name": "...", "args": {...}}]} or {"error": "..."}'


def parse_model_answer(value: Any) -> ModelAnswer:
    """The model answer a ``--override-tool`` JSON value for a model step stands for. Raises
    ValueError saying what is wrong and which shape is expected."""
    if not isinstance(value, dict):
        raise ValueError(f"a model answer must be a JSON object {MODEL_ANSWER_SHAPE}, got {summarize_args(value)}")
    if not value:
        raise ValueError(f"the model answer is empty: give {MODEL_ANSWER_SHAPE}")
    try:
        answer = msgspec.convert(value, ModelAnswer)
    except msgspec.ValidationError as e:
        raise ValueError(f"not a model answer ({e}); expected {MODEL_ANSWER_SHAPE}") from e
    if answer.error is not None and (answer.text or answer.reasoning or answer.tool_calls):
        raise ValueError("a model answer has either error (the call fails) or text/toolCalls, not both")
    if any(not c.name for c in answer.tool_calls):
        raise ValueError("every tool call of the model answer needs a name")
    ids = [c.call_id for c in answer.tool_call_specs()]
    if len(set(ids)) != len(ids):
        raise ValueError(f"the model answer repeats a tool call id: {ids}")
    return answer


def plan_rerun(session_id: str, events: Sequence[RecordedEvent], from_turn: int) -> RerunPlan:
    """The plan to re-run ``events`` from user turn ``from_turn`` (0-based count of user turns
    kept, as ``Host.fork(turns=N)`` counts them). Raises ValueError when that cannot be done."""
    state = fold_events(session_id, events)
    if state.created is None:
        raise ValueError(f"session {session_id} has no session.created event")
    if state.deleted:
        raise ValueError(f"session {session_id} was deleted; rerun needs a live session (replay still shows its log)")
    if state.current_turn is not None or state.queue:
        raise ValueError(f"session {session_id} has a turn in progress or queued inputs; rerun needs it at rest")
    starts = turn_starts(state.messages)
    if not starts:
        raise ValueError(f"session {session_id} has no user turns to re-run")
    if not 0 <= from_turn < len(starts):
        raise ValueError(f"--from-turn must be between 0 and {len(starts) - 1}: the session has {len(starts)} user "
                         f"turns and --from-turn {len(starts)} would keep them all, leaving nothing to re-run")
    plan = RerunPlan(session_id=session_id, from_turn=from_turn, user_turns=len(starts))
    first = state.messages[starts[from_turn]].turn_id
    if first not in state.turn_order:
        own = [i for i, s in enumerate(starts) if state.messages[s].turn_id in state.turn_order]
        least = own[0] if own else len(starts)
        raise ValueError(f"user turn {from_turn} came with the history this session was forked from; "
                         f"--from-turn must be at least {least}")
    inputs = {r.event.input_id: r.event for r in events if isinstance(r.event, E.InputAccepted)}
    started = {r.event.turn_id: r.event for r in events if isinstance(r.event, E.TurnStarted)}
    for turn_id in state.turn_order[state.turn_order.index(first):]:
        ids = started[turn_id].input_ids
        if not ids or ids[0] not in inputs:
            raise ValueError(f"turn {turn_id} has no recorded input to send again")
        plan.turns.append(LaterTurn(number=len(plan.turns) + 1, turn_id=turn_id, input=inputs[ids[0]]))
    plan.max_steps = started[first].max_steps
    _collect_recordings(plan, events)
    return plan


def _collect_recordings(plan: RerunPlan, events: Sequence[RecordedEvent]) -> None:
    numbers = {t.turn_id: t.number for t in plan.turns}
    ran: set[tuple[int, str]] = set()
    tools: dict[tuple[int, str], str] = {}  # (turn number, call id) -> the tool the model asked for
    settings: dict[str, Any] = {}
    for rec in events:
        e = rec.event
        if isinstance(e, E.SessionSettingChanged):
            _fold_setting(settings, e)
            continue
        number = numbers.get(getattr(e, "turn_id", None) or "")
        if number is None:
            continue
        if isinstance(e, E.TurnStarted):
            plan.settings[number] = dict(settings)
        elif isinstance(e, E.LlmCompleted):
            plan.answers.append(e)
            plan.model_calls.append(e)
            _model_step(plan, number, e.step_id)
            tools.update(((number, c.call_id), c.name) for c in e.tool_calls)
        elif isinstance(e, (E.ToolApprovalRequested, E.ToolApprovalSettled)) or (
                isinstance(e, E.ToolFinished) and e.settlement is not None):
            _approval_fact(plan, number, e, tools)
        if isinstance(e, E.LlmFailed) and not e.aborted:
            plan.model_calls.append(e)  # a provider error is part of the recording too
            _model_step(plan, number, e.step_id)
        elif isinstance(e, (E.ContextCompacted, E.ContextCompactFailed)) and e.auto:
            plan.summaries.append(e)
        elif isinstance(e, E.ToolStarted):
            ran.add((number, e.call_id))
            plan.calls.append((number, e.call_id, e.tool))
        elif isinstance(e, E.ToolFinished) and (number, e.call_id) in ran:
            plan.tool_results[(number, e.call_id)] = e
        elif isinstance(e, E.CheckpointRecorded):
            plan.checkpoints.setdefault((number, e.call_id), []).append(e.path)
            plan.images.append((number, e.path, e.existed, e.content))
    plan.expected = comparable(events, set(numbers))


def _fold_setting(settings: dict[str, Any], e: E.SessionSettingChanged) -> None:
    key = f"{e.plugin}/{e.key}"
    if e.deleted:
        settings.pop(key, None)
    else:
        settings[key] = e.value


def _approval_fact(plan: RerunPlan, turn: int, e: Any, tools: dict[tuple[int, str], str]) -> None:
    """Fold one approval fact of a re-run turn into ``plan.approvals``: a request, a settlement,
    or a call denied at once (its ``tool.finished`` carries the settlement, no approval event)."""
    key = (turn, e.call_id)
    found = plan.approvals.get(key)
    if found is None:
        if isinstance(e, E.ToolFinished) and e.approval_id is None:
            return
        found = plan.approvals[key] = RecordedApproval(
            number=len(plan.approvals) + 1, turn=turn, call_id=e.call_id, tool=tools.get(key, "?"),
            approval_id=e.approval_id or "")
    if isinstance(e, E.ToolApprovalRequested):
        found.asked = True
    elif found.settlement is None:  # the approval's own settlement; a denial's tool.finished repeats it
        found.settlement = e.settlement


def _model_step(plan: RerunPlan, turn: int, step_id: str) -> None:
    within = sum(1 for t, _, _ in plan.model_steps if t == turn)
    plan.model_steps.append((turn, step_id, within + 1))


def comparable(events: Iterable[RecordedEvent], turn_ids: set[str]) -> list[tuple[str, RecordedEvent]]:
    """The events of the turns ``turn_ids`` that a re-run must reproduce, each with its turn id.

    Owner actions are left out (``session.*``, rewinds, dropped inputs, plan clears, grant
    revocations, manual compaction): a re-run does not repeat them; so are a model endpoint's
    retries (``llm.retried``), which a replayed answer never has. An input is moved to just before the turn it
    opened, because a recording may have queued it while the previous turn ran and a re-run sends
    it after that turn ended.
    """
    inputs: dict[str, RecordedEvent] = {}
    out: list[tuple[str, RecordedEvent]] = []
    current: str | None = None
    for rec in events:
        e = rec.event
        tag = E.event_tag(e)
        if tag.startswith("session.") or isinstance(e, (E.TurnRewound, E.InputDropped, E.PlanCleared,
                                                        E.ApprovalGrantRevoked)):
            continue
        if isinstance(e, E.LlmRetried):  # how the endpoint behaved, not what the agent did
            continue
        if isinstance(e, (E.ContextCompacted, E.ContextCompactFailed)) and not e.auto:
            continue
        if isinstance(e, E.InputAccepted):
            if e.turn_id in turn_ids:
                inputs[e.input_id] = rec
            continue
        if isinstance(e, E.TurnStarted) and e.turn_id in turn_ids:
            current = e.turn_id
            out.extend((current, inputs.pop(i)) for i in e.input_ids if i in inputs)
            out.append((current, rec))
            continue
        owner = getattr(e, "turn_id", None) or current
        if owner is None or owner not in turn_ids:
            continue
        out.append((owner, rec))
        if isinstance(e, _TURN_END) and e.turn_id == current:
            current = None
    return out


class Divergence(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """The first place a re-run's log left the recording (a workflow replayer's non-determinism
    error): the 1-based ``index`` in the compared sequence, both tags, the field and both values."""

    index: int
    expected_tag: str | None = None
    got_tag: str | None = None
    path: str | None = None
    expected: Any = None
    got: Any = None
    expected_version: int | None = None
    got_version: int | None = None
    turn: int | None = None


def payload(event: Any, ignore: frozenset[str] = IGNORED_KEYS) -> Any:
    """What of an event a re-run must reproduce: its plain form without ids and times."""
    return _strip(plain(event), ignore)


def _strip(value: Any, ignore: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v, ignore) for k, v in value.items() if k not in ignore}
    if isinstance(value, list):
        return [_strip(v, ignore) for v in value]
    return value


def compare_logs(expected: Sequence[tuple[str, RecordedEvent]], got: Sequence[tuple[str, RecordedEvent]],
                 turn_numbers: dict[str, int], *, loose: dict[int, frozenset[str]] | None = None,
                 ) -> tuple[Divergence | None, list[Divergence]]:
    """Compare two comparable logs event by event, modulo :data:`IGNORED_KEYS`.

    ``loose`` maps 0-based indices of ``expected`` to extra keys not compared there (an
    overridden tool result); differences in those keys are returned in the second list instead of
    counting as the divergence. Returns ``(first divergence or None, loosened differences)``.
    """
    loose = loose or {}
    relaxed: list[Divergence] = []
    for i in range(max(len(expected), len(got))):
        want = expected[i] if i < len(expected) else None
        have = got[i] if i < len(got) else None
        turn = turn_numbers.get((want or have)[0])  # type: ignore[index]
        if want is None or have is None:
            return _divergence(i, want, have, turn, None), relaxed
        extra = loose.get(i, frozenset())
        tags = (E.event_tag(want[1].event), E.event_tag(have[1].event))
        if tags[0] != tags[1]:
            return _divergence(i, want, have, turn, None), relaxed
        found = first_difference(plain(want[1].event), plain(have[1].event), ignore=IGNORED_KEYS | extra)
        if found is not None:
            return _divergence(i, want, have, turn, found), relaxed
        if extra:
            found = first_difference(payload(want[1].event), payload(have[1].event))
            if found is not None:
                relaxed.append(_divergence(i, want, have, turn, found))
    return None, relaxed


def _divergence(i: int, want: tuple[str, RecordedEvent] | None, have: tuple[str, RecordedEvent] | None,
                turn: int | None, found: tuple[str, Any, Any] | None) -> Divergence:
    d = Divergence(index=i + 1, turn=turn)
    if want is not None:
        d.expected_tag, d.expected_version = E.event_tag(want[1].event), want[1].version
    if have is not None:
        d.got_tag, d.got_version = E.event_tag(have[1].event), have[1].version
    if found is not None:
        d.path, d.expected, d.got = found
    else:
        d.expected = payload(want[1].event) if want is not None else ABSENT
        d.got = payload(have[1].event) if have is not None else ABSENT
    return d


def grant_text(state: str, terms: E.GrantTerms) -> str:
    """``approve exec 'git status' for the session until <ms>``: a grant in one line."""
    what = terms.tool + (f" {terms.command_prefix!r}" if terms.command_prefix else "")
    return f"{'approve' if state == 'approved' else 'deny'} {what} for the {terms.scope} until {terms.expires_at}"
