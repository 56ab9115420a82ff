"""Every fact sessionloop records, as a tagged union of frozen msgspec Structs.

Events are facts, not commands: they say what happened, with every id and time inside them, so
folding them again (replay, recovery, ``rerun``) needs no clock and no randomness.

Rules for changing this file (schema evolution, see tests/fixtures/events_v1.msgpack):

* a tag is forever: never rename a tag, never retype or rename a stored field;
* new fields always get a default, so payloads written before them still decode;
* a breaking change adds a new tag (and, if needed, an upcaster in :data:`UPCASTERS`, below);
* a payload whose tag this code does not know decodes to :class:`UnknownEvent`, which is kept
  and skipped, so rolling back a release never bricks a store.

Streams: ``session-<id>`` (session, input, turn, step, tool, notice, plan, context, checkpoint and
settings events), ``approval-<session>.<id>``, ``task-<session>.<id>`` and ``place-<key>``.

The event store is generic; this module hands it the union (:data:`DOMAIN_EVENTS`: the types,
which of them the per-app feed indexes, the upcasters). Open a store of these events with
:func:`open_store`; decode a payload with :func:`decode_event`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec

from sessionloop.actors.event_values import (
    ApprovalFacts,
    AttachmentRef,
    ChainLink,
    ChatInfo,
    GrantTerms,
    Message,
    OriginInfo,
    PlaceRef,
    PlanEntry,
    Settlement,
    Speaker,
    ToolCallRef,
    ToolCallSpec,
    ToolDisplay,
    Usage,
)
from sessionloop.eventstore import EventStore, EventTypes, UnknownEvent, Upcaster
from sessionloop.eventstore.codec import encode_event, event_to_builtins

__all__ = [
    "Speaker",
    "AttachmentRef",
    "ToolCallSpec",
    "Usage",
    "GrantTerms",
    "Settlement",
    "ToolDisplay",
    "PlanEntry",
    "Message",
    "ChatInfo",
    "PlaceRef",
    "OriginInfo",
    "ApprovalFacts",
    "ChainLink",
    "ToolCallRef",
    "DOMAIN_EVENTS",
    "EVENT_TYPES",
    "UPCASTERS",
    "AnyEvent",
    "Event",
    "UnknownEvent",
    "decode_event",
    "encode_event",
    "event_from_builtins",
    "event_tag",
    "event_to_builtins",
    "open_store",
]


class Event(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True, tag_field="type"):
    """Base of all events. ``at`` is the time of the fact in epoch milliseconds."""

    at: int = 0

    #: Whether the Session Loop API's per-app event feed indexes this event (the persisted
    #: event types a bot can list; ``assistant.delta`` is live only and never stored).
    feed: ClassVar[bool] = False


# --- session lifecycle ------------------------------------------------------------------------


#: what a session is: the owner's own, an app's room, or a task below another session
SessionKind = Literal["owner", "room", "task"]
Activity = Literal["interactive", "background"]
#: how a session's tool calls that need approval are settled (ask the approvers, accept, deny)
PermissionMode = Literal["ask", "acceptCalls", "deny"]


class SessionCreated(Event, tag="session.created", frozen=True, kw_only=True):
    session_id: str
    title: str = ""
    name: str = ""
    kind: SessionKind = "owner"
    parent_id: str | None = None
    root_id: str | None = None
    app_id: str | None = None
    platform: str | None = None
    instance: str | None = None
    account: str | None = None
    container_id: str | None = None
    space_id: str | None = None
    activity: Activity = "interactive"
    permission_mode: PermissionMode = "ask"
    cwd: str = ""
    model: str | None = None
    chat: ChatInfo | None = None
    place: PlaceRef | None = None
    forked_from: str | None = None
    fork_turns: int | None = None
    created_by: Speaker | None = None


class SessionRenamed(Event, tag="session.renamed", frozen=True, kw_only=True):
    title: str


class SessionArchived(Event, tag="session.archived", frozen=True, kw_only=True):
    pass


class SessionUnarchived(Event, tag="session.unarchived", frozen=True, kw_only=True):
    pass


class SessionDeleted(Event, tag="session.deleted", frozen=True, kw_only=True):
    """The session and its history are gone for every reader; the log keeps the fact."""


class SessionSeen(Event, tag="session.seen", frozen=True, kw_only=True):
    """The owner looked at the session (the protocol's ``session/markSeen``)."""


class MessagesImported(Event, tag="session.forked", frozen=True, kw_only=True):
    """A fork copied ``messages`` from ``source_session_id`` (a fork starts with no steps of its own)."""

    source_session_id: str
    turns: int | None = None
    messages: list[Message] = []


class SessionSettingChanged(Event, tag="session.setting.changed", frozen=True, kw_only=True):
    """A setting set on this session itself (its session layer); ``value`` None deletes it."""

    plugin: str
    key: str
    value: Any = None
    deleted: bool = False


class SessionParked(Event, tag="session.parked", frozen=True, kw_only=True):
    """Supervision gave up re-activating the session after repeated failures."""

    reason: str


class SessionUnparked(Event, tag="session.unparked", frozen=True, kw_only=True):
    pass


# --- inputs and turns -------------------------------------------------------------------------


class InputAccepted(Event, tag="input.accepted", frozen=True, kw_only=True):
    """An input was accepted into the session's FIFO queue; it will open (or join) ``turn_id``."""

    input_id: str
    turn_id: str
    text: str = ""
    attachments: list[AttachmentRef] = []
    source: str | None = None
    speaker: Speaker | None = None
    idempotency_key: str | None = None
    #: the W3C traceparent the sender passed (``loop/send``, ``turn/send``): the turn's span is
    #: its child, so a rebuild from the log (``sessionloop trace``) keeps the parentage
    traceparent: str | None = None


class InputDropped(Event, tag="input.dropped", frozen=True, kw_only=True):
    """A queued input was removed before it opened a turn (stopAll, delete, fork)."""

    input_id: str
    turn_id: str
    reason: str


class TurnStarted(Event, tag="turn.started", frozen=True, kw_only=True):
    feed: ClassVar[bool] = True

    turn_id: str
    input_ids: list[str] = []
    source: str | None = None
    max_steps: int | None = None


class TurnCompleted(Event, tag="turn.completed", frozen=True, kw_only=True):
    feed: ClassVar[bool] = True

    turn_id: str
    outcome: Literal["replied", "silent"] = "replied"
    output_text: str = ""


class TurnFailed(Event, tag="turn.failed", frozen=True, kw_only=True):
    feed: ClassVar[bool] = True

    turn_id: str
    code: str
    reason: str = ""
    step_id: str | None = None  # the step that failed (a model call), when one did


class TurnAborted(Event, tag="turn.aborted", frozen=True, kw_only=True):
    feed: ClassVar[bool] = True

    turn_id: str
    reason: str = ""


class TurnLimitReached(Event, tag="turn.limit-reached", frozen=True, kw_only=True):
    """``maxSteps`` model calls were made; the turn stopped and ``turn/continue`` can resume it."""

    feed: ClassVar[bool] = True

    turn_id: str
    max_steps: int


# --- steps ------------------------------------------------------------------------------------


class LlmStarted(Event, tag="llm.started", frozen=True, kw_only=True):
    turn_id: str
    step_id: str
    attempt: int = 1
    message_count: int = 0
    chars: int = 0
    provider: str = ""
    #: the files of this turn's messages the call is sent (``name (kind, mime, size bytes)``)
    attachments: list[str] = []


class LlmCompleted(Event, tag="llm.completed", frozen=True, kw_only=True):
    """A model call's whole answer: the recording that ``rerun --provider replay`` plays back."""

    feed: ClassVar[bool] = True

    turn_id: str
    step_id: str
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallSpec] = []
    usage: Usage = Usage()
    model: str = ""
    provider: str = ""
    duration_ms: int = 0


class LlmFailed(Event, tag="llm.failed", frozen=True, kw_only=True):
    turn_id: str
    step_id: str
    error: str
    aborted: bool = False
    duration_ms: int = 0


class LlmRetried(Event, tag="llm.retried", frozen=True, kw_only=True):
    """An attempt of a model call failed and the call is tried again after ``wait_ms`` (a fact of
    the step: its retries are part of its story, ``replay`` and ``/metrics`` show them).

    ``attempt`` is the 1-based attempt that failed; ``status`` its HTTP status (0 without one);
    ``cause`` ``http``, ``timeout``, ``connection`` or ``stream``; ``error`` the failure's
    sentence. ``next_item_id``: the attempt had streamed output, which is discarded, and the next
    attempt streams its answer as this item (empty: nothing was shown, the item id stays).
    """

    turn_id: str
    step_id: str
    attempt: int = 1
    status: int = 0
    cause: str = ""
    wait_ms: int = 0
    error: str = ""
    next_item_id: str = ""


class ToolStarted(Event, tag="tool.started", frozen=True, kw_only=True):
    feed: ClassVar[bool] = True

    turn_id: str
    call_id: str
    tool: str
    args: Any = None
    display: ToolDisplay | None = None


class ToolFinished(Event, tag="tool.finished", frozen=True, kw_only=True):
    """A tool call's result, or its repair: ``repair`` names why a result was written for a call
    that never returned one (``crash``, ``cancel``, ``not-executed``, ``fork``)."""

    feed: ClassVar[bool] = True

    turn_id: str
    call_id: str
    status: Literal["completed", "failed", "denied", "aborted"]
    output: Any = None
    exit_code: int | None = None
    duration_ms: int = 0
    task_id: str | None = None
    not_executed: bool = False
    repair: str | None = None
    approval_id: str | None = None
    settlement: Settlement | None = None


class ToolApprovalRequested(Event, tag="tool.approval.requested", frozen=True, kw_only=True):
    turn_id: str
    call_id: str
    approval_id: str


class ToolApprovalSettled(Event, tag="tool.approval.settled", frozen=True, kw_only=True):
    turn_id: str
    call_id: str
    approval_id: str
    settlement: Settlement


class ApprovalGrantRevoked(Event, tag="approval.grant.revoked", frozen=True, kw_only=True):
    """A grant (made by the answer to approval ``grant_id``) no longer settles calls."""

    grant_id: str
    by: Speaker | None = None


# --- notices, plan, context -------------------------------------------------------------------


class NoticePosted(Event, tag="notice.posted", frozen=True, kw_only=True):
    notice_id: str
    topic: str
    text: str = ""  # in English; what shows of a notice without a ``text_key`` (an older one)
    facts: dict[str, Any] = {}
    can_continue: bool = False
    turn_id: str | None = None
    starts_turn: bool = False
    #: the catalogue key and values of ``text`` (``actors.settings.texts``): the owner sees the notice in
    #: the server's language when it is sent; "" in logs written before
    text_key: str = ""
    text_values: dict[str, Any] = {}


class PlanUpdated(Event, tag="plan.updated", frozen=True, kw_only=True):
    entries: list[PlanEntry] = []
    explanation: str = ""


class PlanCleared(Event, tag="plan.cleared", frozen=True, kw_only=True):
    pass


class ContextTrimmed(Event, tag="agent.context.trimmed", frozen=True, kw_only=True):
    turn_id: str
    step_id: str
    chars_before: int
    chars_after: int
    omitted_outputs: int = 0
    dropped_turns: int = 0


class ContextCompacted(Event, tag="agent.context.compacted", frozen=True, kw_only=True):
    """A summary message was inserted: before the current turn (auto) or at the end (manual)."""

    summary: str
    turns: int
    chars: int
    auto: bool = False
    turn_id: str | None = None
    #: the next model call's context after this compaction, in estimated tokens (characters / 4,
    #: as the mock model counts): the usage pushed after ``session/compress``'s notice (a compress
    #: is followed by a push of the latest usage). 0 in logs written before it was recorded.
    context_tokens: int = 0
    #: the summary call's own tokens, counted in the session's token accounting (every model
    #: call's tokens add up there); None in logs written before it was recorded
    usage: Usage | None = None


class ContextCompactFailed(Event, tag="agent.context.compact-failed", frozen=True, kw_only=True):
    error: str  # in English
    auto: bool = False
    turn_id: str | None = None
    usage: Usage | None = None  # a summary call that answered (with nothing usable) still cost tokens
    #: the catalogue key and values of ``error`` (``actors.settings.texts``), rendered when sent; "" for a
    #: log written before, or an error that is raw text (a provider's own message)
    error_key: str = ""
    error_values: dict[str, Any] = {}


# --- checkpoints and artifacts -----------------------------------------------------------------


class CheckpointRecorded(Event, tag="checkpoint.recorded", frozen=True, kw_only=True):
    """The before-image of a file a tool is about to change, once per file per turn."""

    turn_id: str
    call_id: str
    path: str
    existed: bool
    content: bytes | None = None


class TurnRewound(Event, tag="turn.rewound", frozen=True, kw_only=True):
    turn_id: str
    scope: Literal["code", "code-and-chat"]
    restored: list[str] = []
    removed: list[str] = []
    conflicts: list[str] = []
    chat_deleted: bool = False
    deleted_messages: int = 0


class ArtifactRecorded(Event, tag="artifact.recorded", frozen=True, kw_only=True):
    artifact_id: str
    turn_id: str
    call_id: str | None = None
    name: str
    path: str
    size: int = 0
    mime: str = "application/octet-stream"


# --- approvals (stream approval-<session>.<id>) -------------------------------------------------


class ApprovalRequested(Event, tag="approval.requested", frozen=True, kw_only=True):
    approval_id: str
    session_id: str
    turn_id: str | None = None
    call_id: str | None = None
    origin: OriginInfo
    tool: str
    facts: ApprovalFacts
    options: list[Literal["approve", "deny"]] = msgspec.field(default_factory=lambda: ["approve", "deny"])
    content_hash: str
    expires_at: int
    chain: list[ChainLink] = []


class ApprovalSettled(Event, tag="approval.settled", frozen=True, kw_only=True):
    approval_id: str
    settlement: Settlement


# --- background tasks (stream task-<session>.<id>) ----------------------------------------------


class TaskStarted(Event, tag="task.started", frozen=True, kw_only=True):
    task_id: str
    session_id: str
    kind: Literal["tool-call"] = "tool-call"
    label: str
    call: ToolCallRef | None = None
    display: ToolDisplay | None = None


class TaskEnded(Event, tag="task.ended", frozen=True, kw_only=True):
    task_id: str
    status: Literal["completed", "failed", "stopped", "aborted"]
    exit_code: int | None = None
    reason: str | None = None  # in English, or the tool's own error
    last_line: str | None = None
    last_output_at: int | None = None
    #: the catalogue key and values of ``reason`` (``actors.settings.texts``), rendered when sent; "" for a
    #: log written before, or a reason that is raw text (the tool's own error)
    reason_key: str = ""
    reason_values: dict[str, Any] = {}


# --- places (stream place-<key>) ---------------------------------------------------------------


class PlaceRegistered(Event, tag="place.registered", frozen=True, kw_only=True):
    key: str
    kind: Literal["window", "workspace"]
    name: str


class PlaceSettingChanged(Event, tag="place.setting.changed", frozen=True, kw_only=True):
    plugin: str
    key: str
    value: Any = None
    deleted: bool = False


#: Every known event type; the store's union is built from it once (:data:`DOMAIN_EVENTS`).
EVENT_TYPES: tuple[type[Event], ...] = (
    SessionCreated,
    SessionRenamed,
    SessionArchived,
    SessionUnarchived,
    SessionDeleted,
    SessionSeen,
    MessagesImported,
    SessionSettingChanged,
    SessionParked,
    SessionUnparked,
    InputAccepted,
    InputDropped,
    TurnStarted,
    TurnCompleted,
    TurnFailed,
    TurnAborted,
    TurnLimitReached,
    LlmStarted,
    LlmCompleted,
    LlmFailed,
    LlmRetried,
    ToolStarted,
    ToolFinished,
    ToolApprovalRequested,
    ToolApprovalSettled,
    ApprovalGrantRevoked,
    NoticePosted,
    PlanUpdated,
    PlanCleared,
    ContextTrimmed,
    ContextCompacted,
    ContextCompactFailed,
    CheckpointRecorded,
    TurnRewound,
    ArtifactRecorded,
    ApprovalRequested,
    ApprovalSettled,
    TaskStarted,
    TaskEnded,
    PlaceRegistered,
    PlaceSettingChanged,
)

AnyEvent = Event | UnknownEvent

#: tag -> function rewriting an old payload (as a dict) into the current shape. Applied on read
#: only; stored bytes are never rewritten. Empty while no field has been retyped since the first
#: release. Read once, when :data:`DOMAIN_EVENTS` is built below.
UPCASTERS: dict[str, Upcaster] = {}

#: The union the store decodes sessionloop's events through (handed in when it opens).
DOMAIN_EVENTS: EventTypes[Event] = EventTypes(
    EVENT_TYPES, feed=[t for t in EVENT_TYPES if t.feed], upcasters=UPCASTERS
)


def decode_event(data: bytes, stream: str = "?", version: int = 0) -> AnyEvent:
    """One stored payload decoded: an event of :data:`EVENT_TYPES`, or an :class:`UnknownEvent`
    for a tag this release does not know. Raises EventDecodeError naming ``stream`` and
    ``version`` for a broken payload."""
    return DOMAIN_EVENTS.decode(data, stream, version)


def event_from_builtins(data: dict[str, Any]) -> AnyEvent:
    """The inverse of :func:`event_to_builtins` (the JSON form of export and import). Raises
    EventDecodeError when ``data`` is not a valid event of a known tag."""
    return DOMAIN_EVENTS.from_builtins(data)


def open_store(path: str, **options: Any) -> EventStore[Event]:
    """``EventStore.open(path, **options)`` for sessionloop's events (every opener's one call)."""
    return EventStore.open(path, events=DOMAIN_EVENTS, **options)


def event_tag(event: AnyEvent) -> str:
    """The stable tag of an event (``UnknownEvent`` keeps the tag it was stored with)."""
    if isinstance(event, UnknownEvent):
        return event.type
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag
