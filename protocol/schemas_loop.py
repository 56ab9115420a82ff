"""Wire shapes of the Session Loop API for remote bots (seeds 000/001, SPEC §5).

The same operations as the in-process Python API (``create``, ``send``, ``waitForTurn``,
``listEvents``, ``onDidReceiveEvent``) as JSON-RPC methods ``loop/*`` on the session endpoint,
authenticated as an app. Limits the seeds state and a Struct can check are checked here (key
length, text length, number of attachments); the byte-size limits (20 MB per attachment and in
total) need the decoded payloads and are the gateway's (``schemas_types.decode_data_url``).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from .schemas_types import OutgoingAttachment, Wire

__all__ = [
    "DEFAULT_WAIT_MS",
    "MAX_ATTACHMENTS",
    "MAX_IDEMPOTENCY_KEY",
    "MAX_TEXT_CHARS",
    "MAX_WAIT_MS",
    "MIN_WAIT_MS",
    "InitialMessage",
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
]

MAX_IDEMPOTENCY_KEY: Final = 512  # seed 000: idempotencyKey 必填,最长 512 字符
MAX_TEXT_CHARS: Final = 100_000  # seed 000: 文本 10 万字符
MAX_ATTACHMENTS: Final = 10  # seed 000: 附件每条 10 个
DEFAULT_WAIT_MS: Final = 60_000  # seed 001: 超时默认 60 秒
MIN_WAIT_MS: Final = 1_000  # seed 001: 钳制在 1–600 秒
MAX_WAIT_MS: Final = 600_000

IdempotencyKey = Annotated[str, Meta(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)]
Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]


class SpaceRef(Wire, frozen=True, kw_only=True):
    space_id: str


class InitialMessage(Wire, frozen=True, kw_only=True):
    text: Text
    idempotency_key: IdempotencyKey


class LoopCreateParams(Wire, frozen=True, kw_only=True):
    """Placement is ``containerId`` or ``space``, never both (seed 001: 投放位置二选一).

    ``context: 'caller'`` is accepted by the schema so the gateway can refuse it with a clear
    error: over the wire there is no calling tool execution to inherit from (seed: 在工具调用之外
    使用会抛错).
    """

    container_id: str | None = None
    space: SpaceRef | None = None
    title: str | None = None
    activity: Literal["interactive", "background"] | None = None
    permission_mode: Literal["ask", "acceptCalls", "deny"] | None = None
    initial_message: InitialMessage | None = None
    context: Literal["caller"] | None = None

    def __post_init__(self) -> None:
        if self.container_id is not None and self.space is not None:
            raise ValueError("containerId and space cannot be given together")

    @property
    def effective_permission_mode(self) -> str:
        """Seed 001: interactive defaults to ``ask``, background to ``acceptCalls``."""
        if self.permission_mode is not None:
            return self.permission_mode
        return "acceptCalls" if self.activity == "background" else "ask"


class LoopCreateResult(Wire, frozen=True, kw_only=True):
    session_id: str
    turn_id: str | None = None


class LoopSendParams(Wire, frozen=True, kw_only=True):
    session_id: str
    text: Text
    idempotency_key: IdempotencyKey
    attachments: Annotated[list[OutgoingAttachment], Meta(max_length=MAX_ATTACHMENTS)] = msgspec.field(
        default_factory=list
    )


class LoopSendResult(Wire, frozen=True, kw_only=True):
    """The receipt. ``rejected`` comes with ``retryAfterMs`` (seed: 1000 ms when the queue is full)."""

    state: Literal["accepted", "queued", "duplicate", "rejected"]
    epoch: int
    seq: int
    turn_id: str | None = None
    retry_after_ms: int | None = None
    cursor: str | None = None  # ``loop/listEvents`` with ``after: cursor`` shows exactly this input's events


class LoopWaitForTurnParams(Wire, frozen=True, kw_only=True):
    """Any ``timeoutMs`` is accepted and clamped, not refused (seed: 钳制在 1–600 秒)."""

    session_id: str
    turn_id: str
    timeout_ms: int | None = None

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


class LoopListEventsParams(Wire, frozen=True, kw_only=True):
    session_id: str | None = None
    after: str | None = None
    limit: Annotated[int, Meta(ge=1, le=1000)] | None = None


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


class LoopEventParams(Wire, frozen=True, kw_only=True):
    event: LoopEvent
