"""Wire shapes of the Session Loop API for remote bots (docs/protocol.md, ``loop/*``).

The same operations as the in-process Python API (``create``, ``send``, ``waitForTurn``,
``listEvents``, ``onDidReceiveEvent``) as JSON-RPC methods ``loop/*`` on the session endpoint,
authenticated as an app. Limits a Struct can check are checked here, with the numbers of
:mod:`protocol.limits` (the contract's key length, text length, number of attachments; our bounds on
ids, titles, cursors and integers); the byte-size limits (20 MB per attachment and in total) need
the decoded payloads and are the gateway's (``schemas_types.decode_data_url``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from sessionloop.protocol.limits import (
    DEFAULT_WAIT_MS,
    LOOP_EVENTS_MAX_LIMIT,
    MAX_ATTACHMENTS,
    MAX_CURSOR,
    MAX_IDEMPOTENCY_KEY,
    MAX_INT,
    MAX_PLACE_KEY,
    MAX_SPACE_ID,
    MAX_TEXT_CHARS,
    MAX_TRACEPARENT,
    MAX_WAIT_MS,
    MIN_INT,
    MIN_WAIT_MS,
    TRACEPARENT_PATTERN,
)
from sessionloop.protocol.schemas_types import Id, OutgoingAttachment, ShortName, Text, Title, Wire

__all__ = [
    "DEFAULT_WAIT_MS",
    "MAX_ATTACHMENTS",
    "MAX_IDEMPOTENCY_KEY",
    "MAX_TEXT_CHARS",
    "MAX_WAIT_MS",
    "MIN_WAIT_MS",
    "InitialMessage",
    "LoopChat",
    "LoopPlace",
    "LoopCreateParams",
    "LoopCreateResult",
    "LoopEvent",
    "LoopEventParams",
    "LoopListEventsParams",
    "LoopListEventsResult",
    "LoopSendParams",
    "LoopSendResult",
    "LoopWaitForTurnParams",
    "LoopWaitForTurnResult",
    "SpaceRef",
    "Traceparent",
]

IdempotencyKey = Annotated[str, Meta(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)]
#: A W3C ``traceparent``: the caller's span, which the turn's span continues (actors/views/traces.py).
Traceparent = Annotated[str, Meta(pattern=TRACEPARENT_PATTERN, max_length=MAX_TRACEPARENT)]


class SpaceRef(Wire, frozen=True, kw_only=True):
    space_id: Annotated[str, Meta(max_length=MAX_SPACE_ID)]


class InitialMessage(Wire, frozen=True, kw_only=True):
    text: Text
    idempotency_key: IdempotencyKey


class LoopChat(Wire, frozen=True, kw_only=True):
    """The chat window a room is (``SessionSummary.chat``): the platform's own type name,
    shown as is, and whether more than two parties talk in it."""

    type: ShortName
    multi_party: bool = False


class LoopPlace(Wire, frozen=True, kw_only=True):
    """A room's window place: its key (by convention
    ``<platform>:<account>:<type>:<number>``, so ``sessions/list`` finds ``<platform>:<number>``)
    and its display name (the group's name, or the other party's nickname)."""

    key: Annotated[str, Meta(min_length=1, max_length=MAX_PLACE_KEY)]
    name: Title = ""


class LoopCreateParams(Wire, frozen=True, kw_only=True):
    """Placement is ``containerId`` or ``space``, never both (a session is placed one way).

    ``context: 'caller'`` is accepted by the schema so the gateway can refuse it with a clear
    error: over the wire there is no calling tool execution to inherit from (outside a tool call it is an
    error).
    """

    container_id: ShortName | None = None
    space: SpaceRef | None = None
    title: Title | None = None
    activity: Literal["interactive", "background"] | None = None
    permission_mode: Literal["ask", "acceptCalls", "deny"] | None = None
    initial_message: InitialMessage | None = None
    context: Literal["caller"] | None = None
    #: a room's description (with ``containerId``): its chat window, the bot's account in it and
    #: its window place (as the summary shows it: chat, account, place)
    chat: LoopChat | None = None
    account: ShortName | None = None
    place: LoopPlace | None = None

    def __post_init__(self) -> None:
        if self.container_id is not None and self.space is not None:
            raise ValueError("containerId and space cannot be given together")

    @property
    def effective_permission_mode(self) -> str:
        """Interactive defaults to ``ask``, background to ``acceptCalls``."""
        if self.permission_mode is not None:
            return self.permission_mode
        return "acceptCalls" if self.activity == "background" else "ask"


class LoopCreateResult(Wire, frozen=True, kw_only=True):
    session_id: str
    turn_id: str | None = None


class LoopSendParams(Wire, frozen=True, kw_only=True):
    session_id: Id
    text: Text
    idempotency_key: IdempotencyKey
    attachments: Annotated[list[OutgoingAttachment], Meta(max_length=MAX_ATTACHMENTS)] = msgspec.field(
        default_factory=list
    )
    traceparent: Traceparent | None = None


class LoopSendResult(Wire, frozen=True, kw_only=True):
    """The receipt. ``rejected`` comes with ``retryAfterMs`` (1000 ms when the queue is full)."""

    state: Literal["accepted", "queued", "duplicate", "rejected"]
    epoch: int
    seq: int
    turn_id: str | None = None
    retry_after_ms: int | None = None
    cursor: str | None = None  # ``loop/listEvents`` with ``after: cursor`` shows exactly this input's events


class LoopWaitForTurnParams(Wire, frozen=True, kw_only=True):
    """Any int64 ``timeoutMs`` is accepted and clamped, not refused (to 1–600 s); a
    longer integer (JSON has no limit) is invalidParams, not an overflow in the clamp."""

    session_id: Id
    turn_id: Id
    timeout_ms: Annotated[int, Meta(ge=MIN_INT, le=MAX_INT)] | None = None

    @property
    def clamped_timeout_ms(self) -> int:
        if self.timeout_ms is None:
            return DEFAULT_WAIT_MS
        return min(MAX_WAIT_MS, max(MIN_WAIT_MS, self.timeout_ms))


class LoopWaitForTurnResult(Wire, frozen=True, kw_only=True):
    """A ``timeout`` only ends this wait; it never cancels the turn."""

    state: Literal["completed", "failed", "timeout"]
    output_text: str | None = None
    code: str | None = None
    message: str | None = None  # a failed turn's reason, one line


class LoopListEventsParams(Wire, frozen=True, kw_only=True):
    session_id: Id | None = None
    after: Annotated[str, Meta(max_length=MAX_CURSOR)] | None = None
    limit: Annotated[int, Meta(ge=1, le=LOOP_EVENTS_MAX_LIMIT)] | None = None


class LoopEvent(Wire, frozen=True, kw_only=True):
    """A persisted (or, on ``loop/event``, live) event of an app's sessions; ``data`` is raw."""

    cursor: str
    session_id: str
    type: str
    at: int
    data: Any
    turn_id: str | None = None


class LoopListEventsResult(Wire, frozen=True, kw_only=True):
    events: list[LoopEvent]
    next_cursor: str | None = None


class LoopWatchParams(Wire, frozen=True, kw_only=True):
    """``cursor``: deliver the stored events after it first (a cursor from an event, a receipt or
    ``loop/listEvents``; ``"0"``: everything retained), then the live ones, in cursor order with
    no gap and no duplicate; a cursor older than the retention is ``cursor-expired``. Without
    one the watch starts at the present."""

    cursor: Annotated[str, Meta(max_length=MAX_CURSOR)] | None = None


class LoopWatchResult(Wire, frozen=True, kw_only=True):
    """``cursor``: the watch delivers the stored events after this one (the given cursor, or the
    present's last position)."""

    cursor: str


class LoopEventParams(Wire, frozen=True, kw_only=True):
    event: LoopEvent
