"""A session's state as a fold of its events: ``state = evolve(state, event)``.

``evolve`` is deterministic and total: no I/O, no clock, no randomness (ids and times travel in
the events), and an event it does not expect leaves the state as it was. Replay, recovery,
snapshots and ``rerun`` all run it again, so it must never have effects. For speed it updates
``state`` in place and returns it (a session's message list would otherwise be copied on every
event); take ``copy_state`` first when the old value is still needed.

Session status is a small state machine, written as a table below::

    idle ──turn.started──▶ running ──tool.started──▶ waiting_tool ──llm.started──▶ running
    running / waiting_tool ──turn.completed / limit-reached──▶ completed
                           ──turn.failed──▶ failed      ──turn.aborted──▶ cancelled
    completed / failed / cancelled ──turn.started──▶ running
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.approvals.grants import Grant, grant_of
from sessionloop.actors.model.base import tally_of
from sessionloop.actors.session.context import summary_message
from sessionloop.protocol.limits import MAX_TITLE, clip

#: bump when SessionState changes shape. 3: a live session's state is bounded (``bound``); a
#: format-2 snapshot (the whole state) still loads and is bounded when read. 4: a live session's
#: snapshot keeps the history's full chunks as snapshot parts of the store, each written once
#: (``encode_snapshot``); a copy of a state (``encode_state``) is still format 3, self-contained
STATE_FORMAT = 3
SNAPSHOT_FORMAT = 4
_FORMATS = (2, 3, 4)
#: turns whose records (turn, tool calls, steps, checkpoints, artifacts) a bounded state keeps: the
#: current one and the one before it (``drive`` looks at the last turn's messages before a new one)
KEPT_TURNS = 2
MAX_GRANTS = 100  # grants a session keeps (revoked and expired ones are dropped first)


class Status(enum.StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    WAITING_TOOL = "waiting_tool"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


_ANY = frozenset(Status)
_ACTIVE = frozenset({Status.RUNNING, Status.WAITING_TOOL})
_ENDED = frozenset({Status.IDLE, Status.COMPLETED, Status.FAILED, Status.CANCELLED})

#: tag -> (states it may happen in, state after). Events not listed do not change the status.
TRANSITIONS: dict[str, tuple[frozenset[Status], Status]] = {
    "turn.started": (_ENDED, Status.RUNNING),
    "tool.started": (_ACTIVE, Status.WAITING_TOOL),
    "llm.started": (_ACTIVE, Status.RUNNING),
    "turn.completed": (_ACTIVE, Status.COMPLETED),
    "turn.limit-reached": (_ACTIVE, Status.COMPLETED),
    "turn.failed": (_ACTIVE, Status.FAILED),
    "turn.aborted": (_ACTIVE, Status.CANCELLED),
}


class IllegalTransition(Exception):
    """A command produced an event the current status does not allow (our bug, not the peer's)."""


def next_status(current: Status, tag: str) -> Status:
    rule = TRANSITIONS.get(tag)
    if rule is None:
        return current
    allowed, after = rule
    if current not in allowed:
        raise IllegalTransition(f"{tag} is not allowed while the session is {current.value}")
    return after


# --- state -----------------------------------------------------------------------------------


class QueuedInput(msgspec.Struct, kw_only=True, gc=False):
    input_id: str
    turn_id: str
    text: str
    attachments: tuple[E.AttachmentRef, ...] = ()
    speaker: E.Speaker | None = None
    source: str | None = None
    idempotency_key: str | None = None
    at: int = 0


class TurnRecord(msgspec.Struct, kw_only=True, gc=False):
    turn_id: str
    status: str = "running"  # running | completed | failed | aborted | limit
    input_ids: tuple[str, ...] = ()
    source: str | None = None
    started_at: int = 0
    ended_at: int | None = None
    outcome: str | None = None  # replied | silent | aborted | error
    output_text: str = ""
    code: str | None = None
    reason: str | None = None
    llm_calls: int = 0
    max_steps: int | None = None
    message_start: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    compaction_tried: bool = False

    def max_steps_or(self, default: int) -> int:
        return self.max_steps if self.max_steps is not None else default


class ToolCallRecord(msgspec.Struct, kw_only=True, gc=False):
    call_id: str
    turn_id: str
    tool: str
    args: Any = None
    status: str = "generating"  # generating | running | completed | failed | denied | aborted
    output: Any = None
    exit_code: int | None = None
    display: E.ToolDisplay | None = None
    approval_id: str | None = None
    settlement: E.Settlement | None = None
    task_id: str | None = None
    not_executed: bool = False
    repair: str | None = None
    started_at: int = 0
    ended_at: int | None = None
    step_id: str = ""


class StepRecord(msgspec.Struct, kw_only=True, gc=False):
    """An agent step: ``thinking``, ``llm`` or ``tool``, the unit of debugging and billing."""

    step_id: str
    type: str  # thinking | llm | tool
    turn_id: str
    status: str  # pending | streaming | running | completed | failed
    started_at: int = 0
    ended_at: int | None = None
    tool: str | None = None
    call_id: str | None = None


class Checkpoint(msgspec.Struct, kw_only=True, gc=False):
    turn_id: str
    call_id: str
    path: str
    existed: bool
    content: bytes | None = None


class SessionState(msgspec.Struct, kw_only=True):
    session_id: str
    version: int = 0
    created: E.SessionCreated | None = None
    title: str = ""
    archived: bool = False
    deleted: bool = False
    parked: str | None = None
    status: Status = Status.IDLE
    messages: list[E.Message] = []
    #: counts over ``messages`` kept as they change (``model.base.HistoryTally``): content characters,
    #: tool calls, messages with attachments; a model request carries them instead of recounting
    history_chars: int = 0
    history_tool_calls: int = 0
    history_attachments: int = 0
    queue: list[QueuedInput] = []
    turns: dict[str, TurnRecord] = {}
    turn_order: list[str] = []
    current_turn: str | None = None
    pending_llm: str | None = None  # step id of a model call started and not finished
    batch: list[str] = []  # call ids of the last model answer, in order
    tool_calls: dict[str, ToolCallRecord] = {}
    steps: list[StepRecord] = []
    plan: list[E.PlanEntry] = []
    plan_explanation: str = ""
    plan_at: int | None = None
    last_usage: E.Usage | None = None
    last_usage_at: int | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    created_at: int = 0
    updated_at: int = 0
    last_reply_at: int | None = None
    seen_at: int = 0
    checkpoints: list[Checkpoint] = []
    artifacts: list[E.ArtifactRecorded] = []
    settings: dict[str, Any] = {}
    settings_rev: int = 0  # bumped on every settings change: lets the shell cache its config
    summaries: int = 0  # summary messages inserted so far (0: the model view needs no merging)
    notices: list[E.NoticePosted] = []
    grants: dict[str, Grant] = {}  # approval grants by id (the approval whose answer made them)
    #: a bounded state (the live session actor's, its snapshots): ``turns``, ``tool_calls``,
    #: ``steps``, ``checkpoints`` and ``artifacts`` hold the last ``KEPT_TURNS`` turns only, and
    #: ``turn_starts`` the first message of every turn; what is older is read from the log
    #: (``actors.session.history``). False: the whole fold (replay, verify, a state copy)
    bounded: bool = False
    turn_starts: dict[str, int] = {}  # bounded only: turn id -> its ``message_start``, every turn

    @property
    def is_busy(self) -> bool:
        return self.current_turn is not None

    def has_turn(self, turn_id: str) -> bool:
        """Whether ``turn_id`` started in this session (also a turn a bounded state keeps no record of)."""
        return turn_id in self.turns or turn_id in self.turn_starts

    def unfinished_turns(self) -> int:
        return len(self.queue) + (1 if self.current_turn else 0)

    def last_turn(self) -> TurnRecord | None:
        for turn_id in reversed(self.turn_order):
            turn = self.turns.get(turn_id)
            if turn is None:  # a bounded state keeps the last two turns: one of them has ended
                return None
            if turn.ended_at is not None:
                return turn
        return None

    def message_start(self, turn_id: str) -> int:
        """The index of ``turn_id``'s first message (its record's, or a bounded state's index)."""
        turn = self.turns.get(turn_id)
        return turn.message_start if turn is not None else self.turn_starts[turn_id]


def add_message(s: SessionState, message: E.Message, at: int | None = None) -> None:
    """Append ``message`` to the history (or insert it at index ``at``), keeping the history's counts.

    A history list only grows at its end in place; any other change (an insert here, a rewind, an
    import: ``set_messages``) makes a new list, so a model request's view of the list as it was
    (``effects.HistoryView``: the list and its length) never changes under it."""
    if at is None:
        s.messages.append(message)
    else:
        s.messages = [*s.messages[:at], message, *s.messages[at:]]
    s.history_chars += len(message.content)
    s.history_tool_calls += len(message.tool_calls)
    if message.attachments:
        s.history_attachments += 1


def set_messages(s: SessionState, messages: list[E.Message]) -> None:
    """Replace the history (an import, a rewind that deletes chat), counting it again."""
    s.messages = messages
    tally = tally_of(messages)
    s.history_chars, s.history_tool_calls, s.history_attachments = tally.chars, tally.tool_calls, tally.attachments


def new_state(session_id: str, *, bounded: bool = False) -> SessionState:
    return SessionState(session_id=session_id, bounded=bounded)


def bound(state: SessionState) -> SessionState:
    """``state`` as a bounded fold of the same events has it (in place): the records of the last
    ``KEPT_TURNS`` turns, and every turn's first message in ``turn_starts``. A bounded fold equals
    ``bound`` of the whole fold except after a ``turn.rewound`` (the shell then bounds the whole
    fold read from the log again, ``actors.session.history``)."""
    if not state.bounded:
        state.turn_starts = {t: state.turns[t].message_start for t in state.turn_order if t in state.turns}
        state.bounded = True
    _keep_recent(state)
    return state


def _keep_recent(s: SessionState) -> None:
    """Drop the records of every turn but the last ``KEPT_TURNS`` (a bounded state, at a turn start)."""
    kept = set(s.turn_order[-KEPT_TURNS:])
    if len(s.turns) > len(kept) or any(t not in kept for t in s.turns):
        s.turns = {t: r for t, r in s.turns.items() if t in kept}
    s.tool_calls = {k: v for k, v in s.tool_calls.items() if v.turn_id in kept}
    s.steps = [st for st in s.steps if st.turn_id in kept]
    if s.checkpoints:
        s.checkpoints = [c for c in s.checkpoints if c.turn_id in kept]
    if s.artifacts:
        s.artifacts = [a for a in s.artifacts if a.turn_id in kept]


#: messages per chunk of a snapshot's history; a full chunk of a live session is encoded once
HISTORY_CHUNK = 1024

_state_encoder = msgspec.msgpack.Encoder()
_parts_decoder = msgspec.msgpack.Decoder(list[msgspec.Raw])
_format_decoder = msgspec.msgpack.Decoder(int)
_body_decoder = msgspec.msgpack.Decoder(SessionState)
_chunk_decoder = msgspec.msgpack.Decoder(list[E.Message])


class EncodedHistory:
    """Which full chunks of one history list the store holds as snapshot parts, kept by a live
    session between its snapshots, so a snapshot encodes and writes only the chunks filled since
    (their bytes are not kept: the store has them). Valid while the list is the same object: a
    history list only grows at its end in place (``add_message``); any other change makes a new
    list, and its chunks are written again."""

    __slots__ = ("_source", "_stored")

    def __init__(self) -> None:
        self._source: list[E.Message] | None = None
        self._stored = 0  # chunks 0..n-1 of ``_source`` are in the store

    def adopt(self, messages: list[E.Message], count: int) -> None:
        """``messages`` were decoded from a snapshot with ``count`` parts (the store holds them)."""
        self._source, self._stored = messages, count

    def parts(self, messages: list[E.Message]) -> tuple[int, dict[int, bytes], bytes | None]:
        """The full chunks' count, those of them the store lacks (index -> bytes) and the encoded
        tail (None when the history ends on a chunk's end)."""
        stored = self._stored if self._source is messages else 0
        full = len(messages) // HISTORY_CHUNK
        new = {i: _state_encoder.encode(messages[i * HISTORY_CHUNK:(i + 1) * HISTORY_CHUNK])
               for i in range(stored, full)}
        tail = messages[full * HISTORY_CHUNK:]
        return full, new, _state_encoder.encode(tail) if tail else None

    def stored(self, messages: list[E.Message], count: int) -> None:
        """The store now holds the first ``count`` chunks of ``messages`` as snapshot parts."""
        self._source, self._stored = messages, count


class SnapshotData(msgspec.Struct, frozen=True):
    """What a live session's snapshot writes: ``state`` with ``part_count`` parts, ``parts`` new."""

    state: bytes
    part_count: int
    parts: dict[int, bytes]


def _without_messages(state: SessionState) -> SessionState:
    """What a snapshot's body holds: the state without its history (stored in chunks) and, for a
    bounded state, without ``turn_order`` (the keys of ``turn_starts``)."""
    return msgspec.structs.replace(state, messages=[], turn_order=[] if state.bounded else state.turn_order)


def encode_state(state: SessionState) -> bytes:
    """``state`` in format 3, self-contained (a copy of a state): ``[3, the state without its
    messages, chunk, ...]``, each chunk an array of at most ``HISTORY_CHUNK`` messages; a bounded
    state stores ``turn_order`` once, as the keys of ``turn_starts``."""
    body = _without_messages(state)
    messages = state.messages
    chunks = [msgspec.Raw(_state_encoder.encode(messages[at:at + HISTORY_CHUNK]))
              for at in range(0, len(messages), HISTORY_CHUNK)]
    return _state_encoder.encode([STATE_FORMAT, body, *chunks])


def encode_snapshot(state: SessionState, history: EncodedHistory) -> SnapshotData:
    """A live session's snapshot in format 4: ``[4, the state without its messages, tail]``, the
    history's full chunks being the snapshot's parts (``history`` says which the store lacks)."""
    body = _without_messages(state)
    count, new, tail = history.parts(state.messages)
    items: list[Any] = [SNAPSHOT_FORMAT, body]
    if tail is not None:
        items.append(msgspec.Raw(tail))
    return SnapshotData(_state_encoder.encode(items), count, new)


def decode_state(data: bytes, parts: Sequence[bytes] = ()) -> SessionState | None:
    """A snapshot's state (``parts``: the snapshot parts it was saved with), or None when it was
    written in a format this code does not read (replay instead). A format-2 snapshot,
    ``[2, state]``, holds the whole fold (``bounded`` False)."""
    try:
        items = _parts_decoder.decode(data)
        fmt = _format_decoder.decode(items[0]) if len(items) >= 2 else None
        if fmt not in _FORMATS or (fmt != 4 and parts):
            return None
        state = _body_decoder.decode(items[1])
        if fmt == 2:
            return state if len(items) == 2 else None
        messages: list[E.Message] = []
        for chunk in (*parts, *items[2:]) if fmt == 4 else items[2:]:
            messages += _chunk_decoder.decode(chunk)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if len(items) > 2 or fmt == 4:  # else no message (an early format-3 snapshot kept them in the state itself)
        state.messages = messages
    if state.bounded:
        state.turn_order = list(state.turn_starts)
    return state


def copy_state(state: SessionState) -> SessionState:
    decoded = decode_state(encode_state(state))
    assert decoded is not None
    return decoded


# --- evolve ------------------------------------------------------------------------------------


def evolve(state: SessionState, event: E.Event | E.UnknownEvent) -> SessionState:
    """Apply one event. Deterministic; unknown events are skipped (kept in the log)."""
    state.version += 1
    plan = _PLANS.get(type(event))
    if plan is None:
        if isinstance(event, E.UnknownEvent):
            return state
        plan = _PLANS[type(event)] = (E.event_tag(event), _HANDLERS.get(type(event)))
    tag, handler = plan
    state.status = next_status(state.status, tag)
    if handler is not None:
        handler(state, event)
    if event.at:
        state.updated_at = max(state.updated_at, event.at)
    return state


def fold(events: Any, state: SessionState) -> SessionState:
    for event in events:
        evolve(state, event)
    return state


def _created(s: SessionState, e: E.SessionCreated) -> None:
    if len(e.title) > MAX_TITLE or len(e.name) > MAX_TITLE:  # stored before the bound: cut when read
        e = msgspec.structs.replace(e, title=clip(e.title, MAX_TITLE), name=clip(e.name, MAX_TITLE))
    s.created = e
    s.title = e.title or e.name
    s.created_at = e.at


def _renamed(s: SessionState, e: E.SessionRenamed) -> None:
    s.title = clip(e.title, MAX_TITLE)


def _archived(s: SessionState, e: E.Event) -> None:
    s.archived = isinstance(e, E.SessionArchived)


def _deleted(s: SessionState, e: E.SessionDeleted) -> None:
    s.deleted = True
    s.queue.clear()


def _seen(s: SessionState, e: E.SessionSeen) -> None:
    s.seen_at = e.at


def _imported(s: SessionState, e: E.MessagesImported) -> None:
    set_messages(s, list(e.messages))


def _setting(s: SessionState, e: E.SessionSettingChanged) -> None:
    key = f"{e.plugin}/{e.key}"
    s.settings_rev += 1
    if e.deleted:
        s.settings.pop(key, None)
    else:
        s.settings[key] = e.value


def _parked(s: SessionState, e: E.Event) -> None:
    s.parked = e.reason if isinstance(e, E.SessionParked) else None


def _input(s: SessionState, e: E.InputAccepted) -> None:
    s.queue.append(QueuedInput(input_id=e.input_id, turn_id=e.turn_id, text=e.text, attachments=tuple(e.attachments),
                               speaker=e.speaker, source=e.source, idempotency_key=e.idempotency_key, at=e.at))


def _input_dropped(s: SessionState, e: E.InputDropped) -> None:
    s.queue = [q for q in s.queue if q.input_id != e.input_id]


def _turn_started(s: SessionState, e: E.TurnStarted) -> None:
    turn = TurnRecord(turn_id=e.turn_id, input_ids=tuple(e.input_ids), source=e.source, started_at=e.at,
                      max_steps=e.max_steps, message_start=len(s.messages))
    taken = set(e.input_ids)
    for q in s.queue:
        if q.input_id in taken and q.source != "continue":  # turn/continue adds no user message
            add_message(s, E.Message(role="user", content=q.text, turn_id=e.turn_id, attachments=q.attachments))
    s.queue = [q for q in s.queue if q.input_id not in taken]
    s.turns[e.turn_id] = turn
    s.turn_order.append(e.turn_id)
    s.current_turn = e.turn_id
    s.batch = []
    if s.bounded:
        s.turn_starts[e.turn_id] = turn.message_start
        _keep_recent(s)


def _end_turn(s: SessionState, turn_id: str, status: str, at: int, outcome: str) -> TurnRecord | None:
    turn = s.turns.get(turn_id)
    if turn is None:
        return None
    turn.status, turn.ended_at, turn.outcome = status, at, outcome
    if s.current_turn == turn_id:
        s.current_turn = None
        s.pending_llm = None
        s.batch = []
    return turn


def _turn_completed(s: SessionState, e: E.TurnCompleted) -> None:
    turn = _end_turn(s, e.turn_id, "completed", e.at, e.outcome)
    if turn is not None:
        turn.output_text = e.output_text
        if e.outcome == "replied":
            s.last_reply_at = e.at


def _turn_failed(s: SessionState, e: E.TurnFailed) -> None:
    turn = _end_turn(s, e.turn_id, "failed", e.at, "error")
    if turn is not None:
        turn.code, turn.reason = e.code, e.reason


def _turn_aborted(s: SessionState, e: E.TurnAborted) -> None:
    turn = _end_turn(s, e.turn_id, "aborted", e.at, "aborted")
    if turn is not None:
        turn.reason = e.reason


def _turn_limit(s: SessionState, e: E.TurnLimitReached) -> None:
    turn = _end_turn(s, e.turn_id, "limit", e.at, "silent")
    if turn is not None:
        turn.reason = f"stopped after {e.max_steps} model calls"


def _llm_started(s: SessionState, e: E.LlmStarted) -> None:
    s.pending_llm = e.step_id
    turn = s.turns.get(e.turn_id)
    if turn is not None:
        turn.llm_calls += 1
    s.steps.append(StepRecord(step_id=e.step_id, type="llm", turn_id=e.turn_id, status="pending", started_at=e.at))


def _finish_step(s: SessionState, step_id: str, status: str, at: int) -> None:
    for step in reversed(s.steps):
        if step.step_id == step_id:
            step.status, step.ended_at = status, at
            return


def _llm_completed(s: SessionState, e: E.LlmCompleted) -> None:
    if s.pending_llm == e.step_id:
        s.pending_llm = None
    _finish_step(s, e.step_id, "completed", e.at)
    if e.reasoning:
        s.steps.append(StepRecord(step_id=f"{e.step_id}.thinking", type="thinking", turn_id=e.turn_id,
                                  status="completed", started_at=e.at, ended_at=e.at))
    add_message(s, E.Message(role="assistant", content=e.text, tool_calls=tuple(e.tool_calls), turn_id=e.turn_id))
    s.batch = [c.call_id for c in e.tool_calls]
    for call in e.tool_calls:
        s.tool_calls[call.call_id] = ToolCallRecord(call_id=call.call_id, turn_id=e.turn_id, tool=call.name,
                                                    args=call.args, started_at=e.at, step_id=e.step_id)
    s.last_usage, s.last_usage_at = e.usage, e.at
    s.tokens_in += e.usage.prompt_tokens
    s.tokens_out += e.usage.completion_tokens
    turn = s.turns.get(e.turn_id)
    if turn is not None:
        turn.prompt_tokens = e.usage.prompt_tokens
        turn.completion_tokens += e.usage.completion_tokens


def _llm_failed(s: SessionState, e: E.LlmFailed) -> None:
    if s.pending_llm == e.step_id:
        s.pending_llm = None
    _finish_step(s, e.step_id, "failed", e.at)


def _tool_started(s: SessionState, e: E.ToolStarted) -> None:
    rec = s.tool_calls.get(e.call_id)
    if rec is None:
        rec = s.tool_calls[e.call_id] = ToolCallRecord(call_id=e.call_id, turn_id=e.turn_id, tool=e.tool)
    rec.status, rec.args, rec.display, rec.started_at = "running", e.args, e.display, e.at
    s.steps.append(StepRecord(step_id=f"tool.{e.call_id}", type="tool", turn_id=e.turn_id, status="running",
                              started_at=e.at, tool=e.tool, call_id=e.call_id))


def _tool_finished(s: SessionState, e: E.ToolFinished) -> None:
    rec = s.tool_calls.get(e.call_id)
    if rec is None:
        rec = s.tool_calls[e.call_id] = ToolCallRecord(call_id=e.call_id, turn_id=e.turn_id, tool="?")
    rec.status, rec.output, rec.exit_code, rec.ended_at = e.status, e.output, e.exit_code, e.at
    rec.task_id, rec.not_executed, rec.repair = e.task_id, e.not_executed, e.repair
    if e.approval_id:
        rec.approval_id = e.approval_id
    if e.settlement is not None:
        rec.settlement = e.settlement
    if rec.display is not None and e.exit_code is not None and rec.display.kind == "command":
        rec.display = msgspec.structs.replace(rec.display, exit_code=e.exit_code)
    _finish_step(s, f"tool.{e.call_id}", "completed" if e.status == "completed" else "failed", e.at)
    content = e.output if isinstance(e.output, str) else msgspec.json.encode(e.output).decode()
    add_message(s, E.Message(role="tool", content=content, tool_call_id=e.call_id, name=rec.tool, turn_id=e.turn_id))


def _approval_requested(s: SessionState, e: E.ToolApprovalRequested) -> None:
    rec = s.tool_calls.get(e.call_id)
    if rec is not None:
        rec.approval_id = e.approval_id


def _approval_settled(s: SessionState, e: E.ToolApprovalSettled) -> None:
    rec = s.tool_calls.get(e.call_id)
    if rec is not None:
        rec.approval_id, rec.settlement = e.approval_id, e.settlement
    grant = grant_of(e)
    if grant is not None:
        if len(s.grants) >= MAX_GRANTS:  # the oldest ended grants go first
            ended = [g.id for g in s.grants.values() if g.revoked or g.terms.expires_at <= e.at]
            for gid in (ended or list(s.grants))[: len(s.grants) - MAX_GRANTS + 1]:
                del s.grants[gid]
        s.grants[grant.id] = grant


def _grant_revoked(s: SessionState, e: E.ApprovalGrantRevoked) -> None:
    grant = s.grants.get(e.grant_id)
    if grant is not None:
        grant.revoked = True


def _notice(s: SessionState, e: E.NoticePosted) -> None:
    s.notices.append(e)
    if len(s.notices) > 200:
        del s.notices[:-200]


def _plan(s: SessionState, e: E.Event) -> None:
    if isinstance(e, E.PlanUpdated):
        s.plan, s.plan_explanation, s.plan_at = list(e.entries), e.explanation, e.at
    else:
        s.plan, s.plan_explanation, s.plan_at = [], "", None


def _count_summary_call(s: SessionState, usage: E.Usage | None) -> None:
    """A summary call's tokens go into the session's accounting, not into its context usage."""
    if usage is not None:
        s.tokens_in += usage.prompt_tokens
        s.tokens_out += usage.completion_tokens


def _compacted(s: SessionState, e: E.ContextCompacted) -> None:
    _count_summary_call(s, e.usage)
    message = summary_message(e.summary)
    s.summaries += 1
    turn = s.turns.get(e.turn_id) if e.turn_id else None
    if e.auto and turn is not None:
        # the automatic summary goes right before the current user message
        turn.compaction_tried = True
        add_message(s, msgspec.structs.replace(message, turn_id=e.turn_id), turn.message_start)
    else:
        add_message(s, message)


def _compact_failed(s: SessionState, e: E.ContextCompactFailed) -> None:
    _count_summary_call(s, e.usage)
    turn = s.turns.get(e.turn_id) if e.turn_id else None
    if turn is not None:
        turn.compaction_tried = True


def _checkpoint(s: SessionState, e: E.CheckpointRecorded) -> None:
    s.checkpoints.append(Checkpoint(turn_id=e.turn_id, call_id=e.call_id, path=e.path, existed=e.existed,
                                    content=e.content))


def _rewound(s: SessionState, e: E.TurnRewound) -> None:
    if not s.has_turn(e.turn_id):
        return
    index = s.turn_order.index(e.turn_id)
    gone = set(s.turn_order[index:])
    s.checkpoints = [c for c in s.checkpoints if c.turn_id not in gone]
    if e.chat_deleted:
        set_messages(s, s.messages[: s.message_start(e.turn_id)])
        for turn_id in s.turn_order[index:]:
            s.turns.pop(turn_id, None)
            s.turn_starts.pop(turn_id, None)
        s.turn_order = s.turn_order[:index]
        s.tool_calls = {k: v for k, v in s.tool_calls.items() if v.turn_id not in gone}
        s.steps = [st for st in s.steps if st.turn_id not in gone]


def _artifact(s: SessionState, e: E.ArtifactRecorded) -> None:
    s.artifacts.append(e)


#: per event type: its tag and its handler, looked up once (evolve runs for every event)
_PLANS: dict[type, tuple[str, Any]] = {}

_HANDLERS: dict[type, Any] = {
    E.SessionCreated: _created,
    E.SessionRenamed: _renamed,
    E.SessionArchived: _archived,
    E.SessionUnarchived: _archived,
    E.SessionDeleted: _deleted,
    E.SessionSeen: _seen,
    E.MessagesImported: _imported,
    E.SessionSettingChanged: _setting,
    E.SessionParked: _parked,
    E.SessionUnparked: _parked,
    E.InputAccepted: _input,
    E.InputDropped: _input_dropped,
    E.TurnStarted: _turn_started,
    E.TurnCompleted: _turn_completed,
    E.TurnFailed: _turn_failed,
    E.TurnAborted: _turn_aborted,
    E.TurnLimitReached: _turn_limit,
    E.LlmStarted: _llm_started,
    E.LlmCompleted: _llm_completed,
    E.LlmFailed: _llm_failed,
    E.ToolStarted: _tool_started,
    E.ToolFinished: _tool_finished,
    E.ToolApprovalRequested: _approval_requested,
    E.ToolApprovalSettled: _approval_settled,
    E.ApprovalGrantRevoked: _grant_revoked,
    E.NoticePosted: _notice,
    E.PlanUpdated: _plan,
    E.PlanCleared: _plan,
    E.ContextCompacted: _compacted,
    E.ContextCompactFailed: _compact_failed,
    E.CheckpointRecorded: _checkpoint,
    E.TurnRewound: _rewound,
    E.ArtifactRecorded: _artifact,
}
