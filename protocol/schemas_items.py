"""The items of a session's timeline as the session protocol shows them (docs/protocol.md, Items):
one tagged union on ``kind`` (:data:`SessionItem`), built by the gateway, parsed by clients. The
shapes they are made of (attachments, tool displays, approvals) are in :mod:`protocol.schemas_types`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET

from sessionloop.protocol.schemas_types import (
    ApprovalSettlement,
    ItemAttachment,
    Speaker,
    ToolDisplay,
    TurnOutcome,
    Wire,
)

__all__ = [
    "AgentMessageItem",
    "AgentModel",
    "Forward",
    "ForwardFacts",
    "NoticeItem",
    "PlanEntry",
    "PlanItem",
    "QueueEntry",
    "QueueItem",
    "ReasoningItem",
    "SessionItem",
    "ToolCallItem",
    "TurnItem",
    "Undelivered",
    "UsageItem",
    "UsagePart",
    "UserMessageItem",
]


class _Item(Wire, tag_field="kind", frozen=True, kw_only=True):
    """Every item has ``itemId`` and ``at``; most have the ``turnId`` of the turn they entered."""

    item_id: str
    at: int
    turn_id: str | None = None


class ForwardFacts(Wire, frozen=True, kw_only=True):
    count: int
    participants: list[str]
    unlisted: int
    text: str
    cut_off: bool


class Forward(Wire, frozen=True, kw_only=True):
    """A forwarded chat log attached to a message; no facts when it could not be expanded."""

    facts: ForwardFacts | None = None


class UserMessageItem(_Item, tag="user-message", frozen=True, kw_only=True):
    text: str
    attachments: list[ItemAttachment] = msgspec.field(default_factory=list)
    speaker: Speaker | None = None
    forwards: list[Forward] = msgspec.field(default_factory=list)
    entry: Literal["opened", "joined"] | None = None
    addressed: bool | None = None


class AgentModel(Wire, frozen=True, kw_only=True):
    provider: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class Undelivered(Wire, frozen=True, kw_only=True):
    reason: str


class AgentMessageItem(_Item, tag="agent-message", frozen=True, kw_only=True):
    text: str
    attachments: list[ItemAttachment] = msgspec.field(default_factory=list)
    model: AgentModel | None = None
    undelivered: Undelivered | None = None


class ReasoningItem(_Item, tag="reasoning", frozen=True, kw_only=True):
    text: str


ToolStatus = Literal["generating", "running", "completed", "failed", "denied", "aborted"]


class ToolCallItem(_Item, tag="tool-call", frozen=True, kw_only=True):
    """A tool card; ``itemId`` is the call id. ``args``/``result`` are raw data (never rendered)."""

    tool: str
    status: ToolStatus
    args: Any = UNSET
    output: str | None = None
    result: Any = UNSET
    duration_ms: int | None = None
    display: ToolDisplay | None = None
    approval_id: str | None = None
    settlement: ApprovalSettlement | None = None
    not_executed: bool = False
    sent_to_room: bool = False
    task_id: str | None = None
    #: an extension of the protocol's tool-call item: why a ``denied`` call was not approved, one line
    #: in the server's language (the result holds what the model was told, raw)
    reason: str | None = None


class NoticeItem(_Item, tag="notice", frozen=True, kw_only=True):
    topic: str
    text: str
    attachments: list[ItemAttachment] = msgspec.field(default_factory=list)
    notice_id: str | None = None
    facts: Any = UNSET
    can_continue: bool | None = None
    entry: Literal["opened", "joined"] | None = None
    addressed: bool | None = None


class PlanEntry(Wire, frozen=True, kw_only=True):
    text: str
    status: Literal["pending", "in_progress", "completed"]


def _require_fixed_id(item_id: str, fixed: str) -> None:
    # The fixed ids cannot be defaults: omit_defaults would drop them from the wire.
    if item_id != fixed:
        raise ValueError(f"itemId of a {fixed} item must be {fixed!r}")


class PlanItem(_Item, tag="plan", frozen=True, kw_only=True):
    """The session's plan, replaced whole; ``itemId`` is always ``"plan"``."""

    entries: list[PlanEntry]

    def __post_init__(self) -> None:
        _require_fixed_id(self.item_id, "plan")


class UsagePart(Wire, frozen=True, kw_only=True):
    label: str
    tokens: int
    injectors: dict[str, int] | None = None


class UsageItem(_Item, tag="usage", frozen=True, kw_only=True):
    """Latest token usage, replaced whole; ``itemId`` is always ``"usage"``; not on the timeline."""

    parts: list[UsagePart]
    tokens: int | None = None
    context_window: int | None = None
    token_budget: int | None = None
    max_tokens: int | None = None
    usage_ratio: float | None = None
    compress_at: float | None = None

    def __post_init__(self) -> None:
        _require_fixed_id(self.item_id, "usage")


class TurnItem(_Item, tag="turn", frozen=True, kw_only=True):
    """Pushed when a turn starts (no outcome) and again when it ends (with outcome)."""

    source: str | None = None
    outcome: TurnOutcome | None = None
    ended_at: int | None = None
    #: an extension of the protocol's turn item: why a turn ended in ``error`` (one line), and the step
    reason: str | None = None
    step_id: str | None = None


class QueueEntry(Wire, frozen=True, kw_only=True):
    text: str
    attachments: int
    speaker: Speaker | None = None


class QueueItem(_Item, tag="queue", frozen=True, kw_only=True):
    """Inputs waiting for a turn, replaced whole; ``itemId`` is always ``"queue"``."""

    entries: list[QueueEntry]

    def __post_init__(self) -> None:
        _require_fixed_id(self.item_id, "queue")


SessionItem = (
    UserMessageItem
    | AgentMessageItem
    | ReasoningItem
    | ToolCallItem
    | NoticeItem
    | PlanItem
    | UsageItem
    | TurnItem
    | QueueItem
)
