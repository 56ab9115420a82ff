"""Params and results of every session-protocol method and notification, and their registry.

The gateway never sees raw JSON: :mod:`protocol.connection` decodes a request's ``params`` with the
decoder registered here for its method (built once, at import: msgspec perf tips) and hands the
gateway a typed Struct; the gateway answers with the registered result Struct. Shapes are the
contract's (docs/protocol.md, field by field); the shared pieces (summaries, items, approvals, ...) are in
:mod:`protocol.schemas_types`; the Session Loop API's bot methods (``loop/*``) in
:mod:`protocol.schemas_loop`.

Validation that msgspec constraints can express lives in the Structs (``Meta`` bounds, ``Literal``
enums); cross-field rules live in ``__post_init__``, which msgspec turns into a ``ValidationError``
during decoding, so they too become ``invalidParams`` replies. Every string, list, integer and raw
JSON value of every params Struct is bounded, with the numbers of :mod:`protocol.limits` (a test
walks :data:`METHODS` and holds every field to it).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from sessionloop.protocol.limits import (
    HISTORY_DEFAULT_LIMIT,
    HISTORY_MAX_LIMIT,
    LIST_MAX_LIMIT,
    MAX_ATTACHMENTS,
    MAX_BATCH_IDS,
    MAX_CURSOR,
    MAX_GRANT_MS,
    MAX_GRANT_PREFIX,
    MAX_INT,
    MAX_QUERY,
    MAX_VERSION,
)
from sessionloop.protocol.schemas_items import (  # re-exported: one import site for every wire shape
    AgentMessageItem,
    AgentModel,
    Forward,
    ForwardFacts,
    NoticeItem,
    PlanEntry,
    PlanItem,
    QueueEntry,
    QueueItem,
    ReasoningItem,
    SessionItem,
    ToolCallItem,
    TurnItem,
    Undelivered,
    UsageItem,
    UsagePart,
    UserMessageItem,
)
from sessionloop.protocol.schemas_loop import (
    LoopCreateParams,
    LoopCreateResult,
    LoopEvent,
    LoopEventParams,
    LoopListEventsParams,
    LoopListEventsResult,
    LoopSendParams,
    LoopSendResult,
    LoopWaitForTurnParams,
    LoopWaitForTurnResult,
    LoopWatchParams,
    LoopWatchResult,
    Traceparent,
)
from sessionloop.protocol.schemas_types import (
    AncestorRef,
    Approval,
    ApprovalDiff,
    ApprovalFacts,
    ApprovalGrant,
    ApprovalOrigin,
    ApprovalSettlement,
    BackgroundCall,
    BackgroundTask,
    ChatInfo,
    ClientInfo,
    CommandDisplay,
    DataUrl,
    Features,
    FileChangeDisplay,
    GlobalLayer,
    GrantTerms,
    Id,
    Identity,
    ItemAttachment,
    JsonValue,
    LastTurn,
    OutgoingAttachment,
    OverrideTarget,
    Participant,
    PlaceInfo,
    PlaceLayer,
    PlatformLayer,
    PlatformTypeLayer,
    RateLimits,
    RoomGroup,
    SessionSummary,
    SessionTarget,
    SettingActual,
    SettingLayer,
    SettingLayerInfo,
    SettingRow,
    SettlementSource,
    ShortName,
    Speaker,
    Text,
    Title,
    TokenCount,
    ToolDisplay,
    Wire,
    check_json_value,
    decode_data_url,
    is_unset,
)

# --- shared --------------------------------------------------------------------------------------


class Empty(Wire, frozen=True, kw_only=True):
    """``{}``: params of methods without arguments (extra keys ignored) and the bare ``{}`` result."""


class SessionIdParams(Wire, frozen=True, kw_only=True):
    """``{ sessionId }``: the params of every method that only names a session."""

    session_id: Id


# --- handshake ------------------------------------------------------------------------------------


class InitializeParams(Wire, frozen=True, kw_only=True):
    protocol_version: Annotated[str, Meta(max_length=MAX_VERSION)]
    client: ClientInfo


class ServerName(Wire, frozen=True, kw_only=True):
    name: str


class InitializeResult(Wire, frozen=True, kw_only=True):
    protocol_version: str
    experimental: Literal[True]
    server: ServerName
    identity: Identity
    surface: str
    features: Features
    app_name: str
    #: the limits this connection's requests meet (0.2.2 servers on; absent before)
    rate_limits: RateLimits | None = None


class FeaturesChanged(Wire, frozen=True, kw_only=True):
    features: Features


# --- sessions and the list ------------------------------------------------------------------------

ListLimit = Annotated[int, Meta(ge=1, le=LIST_MAX_LIMIT)]
Cursor = Annotated[str, Meta(max_length=MAX_CURSOR)]


class SessionsListParams(Wire, frozen=True, kw_only=True):
    """Filters of ``sessions/list``; see :mod:`protocol.listing` for the rules."""

    section: Literal["owner", "rooms"] | None = None
    parent_id: Id | None = None
    instance: ShortName | None = None
    platform: ShortName | None = None
    archived: bool | None = None
    background: Literal[True] | None = None  # only ``true`` filters
    query: Annotated[str, Meta(max_length=MAX_QUERY)] | None = None
    cursor: Cursor | None = None
    limit: ListLimit | None = None

    def __post_init__(self) -> None:
        if self.instance is not None and self.platform is not None:
            raise ValueError("instance and platform cannot be given together")
        if self.background is not None and self.archived is not None:
            raise ValueError("background and archived cannot be given together")


class SessionsListResult(Wire, frozen=True, kw_only=True):
    sessions: list[SessionSummary]
    groups: list[RoomGroup]
    next_cursor: str | None = None


class SessionsChanged(Wire, frozen=True, kw_only=True):
    """Pushed after ``sessions/watch``; clients overwrite by id with the latest upsert."""

    upserts: list[SessionSummary]
    removes: list[str]
    groups: list[RoomGroup]


class SessionCreateParams(Wire, frozen=True, kw_only=True):
    name: Title | None = None
    parent_id: Id | None = None


class SessionResult(Wire, frozen=True, kw_only=True):
    session: SessionSummary


class SessionRenameParams(Wire, frozen=True, kw_only=True):
    session_id: Id
    title: Title


class SessionBatchParams(Wire, frozen=True, kw_only=True):
    op: Literal["archive", "delete"]
    ids: Annotated[list[Id], Meta(max_length=MAX_BATCH_IDS)]


class BatchFailure(Wire, frozen=True, kw_only=True):
    session_id: str
    message: str


class SessionBatchResult(Wire, frozen=True, kw_only=True):
    failed: list[BatchFailure]


# --- session settings -----------------------------------------------------------------------------


class ConfigRows(Wire, frozen=True, kw_only=True):
    """Result of session/config/get and /update; ``unsaved`` only when the write did not persist."""

    items: list[SettingRow]
    platform: str | None = None
    unsaved: str | None = None


class ConfigUpdateParams(Wire, frozen=True, kw_only=True):
    """``value: null`` deletes the value at this place, so ``value`` is required (null is data)."""

    session_id: Id
    plugin: ShortName
    key: ShortName
    value: JsonValue

    def __post_init__(self) -> None:
        check_json_value("value", self.value)


class LayerName(Wire, frozen=True, kw_only=True):
    name: Literal["global", "platform", "platformType", "place", "session"]
    label: str


class ConfigLayersResult(Wire, frozen=True, kw_only=True):
    layers: list[SettingLayerInfo]
    order: list[LayerName]


class LayerGetParams(Wire, frozen=True, kw_only=True):
    layer: SettingLayer


class LayerRows(Wire, frozen=True, kw_only=True):
    items: list[SettingRow]
    unsaved: str | None = None


class LayerUpdateParams(Wire, frozen=True, kw_only=True):
    layer: SettingLayer
    plugin: ShortName
    key: ShortName
    value: JsonValue

    def __post_init__(self) -> None:
        check_json_value("value", self.value)


class OverridesParams(Wire, frozen=True, kw_only=True):
    plugin: ShortName


class OverrideEntry(Wire, frozen=True, kw_only=True):
    target: OverrideTarget
    value: Any


class OverrideGroup(Wire, frozen=True, kw_only=True):
    key: str
    entries: list[OverrideEntry]


class OverridesResult(Wire, frozen=True, kw_only=True):
    items: list[OverrideGroup]


# --- subscription and items -----------------------------------------------------------------------


class SubscribeResult(Wire, frozen=True, kw_only=True):
    """The snapshot: drop later pushes with ``seq <= self.seq``; a new epoch means resubscribe."""

    epoch: int
    seq: int
    session: SessionSummary
    items: list[SessionItem]
    approvals: list[Approval]
    before: str | None = None


class HistoryParams(Wire, frozen=True, kw_only=True):
    session_id: Id
    before: Cursor | None = None
    limit: Annotated[int, Meta(ge=1, le=HISTORY_MAX_LIMIT)] | None = None  # default 100, max 200


class HistoryResult(Wire, frozen=True, kw_only=True):
    items: list[SessionItem]
    before: str | None = None


class ItemPush(Wire, frozen=True, kw_only=True):
    """``item/started`` and ``item/completed``; ``completed`` is the canonical copy by itemId."""

    session_id: str
    epoch: int
    seq: int
    item: SessionItem


class ItemDelta(Wire, frozen=True, kw_only=True):
    """Live-only streaming text appended to the item's text (never persisted)."""

    session_id: str
    epoch: int
    seq: int
    item_id: str
    text: str


class SessionResync(Wire, frozen=True, kw_only=True):
    session_id: str
    epoch: int
    seq: int


# --- turn control ---------------------------------------------------------------------------------


class TurnSendParams(Wire, frozen=True, kw_only=True):
    """Send as this connection's identity; the text is stripped; text or attachments required."""

    session_id: Id
    content: Text
    attachments: Annotated[list[OutgoingAttachment], Meta(max_length=MAX_ATTACHMENTS)] = msgspec.field(
        default_factory=list
    )
    traceparent: Traceparent | None = None

    def __post_init__(self) -> None:
        if not self.content.strip() and not self.attachments:
            raise ValueError("content is empty and there are no attachments")

    @property
    def text(self) -> str:
        """The content with surrounding whitespace removed: it is not part of the text."""
        return self.content.strip()


class TurnAbortParams(Wire, frozen=True, kw_only=True):
    session_id: Id
    turn_id: Id | None = None


class TurnRewindParams(Wire, frozen=True, kw_only=True):
    session_id: Id
    turn_id: Id
    scope: Literal["code", "code-and-chat"]


class RewindResult(Wire, frozen=True, kw_only=True):
    """Checkpoint rollback result: files restored / removed / in conflict."""

    turn_id: str
    restored: list[str]
    removed: list[str]
    conflicts: list[str]
    deleted_messages: int | None = None
    chat_deleted: bool | None = None


# --- background tasks -----------------------------------------------------------------------------


class BackgroundListResult(Wire, frozen=True, kw_only=True):
    tasks: list[BackgroundTask]


class BackgroundChanged(Wire, frozen=True, kw_only=True):
    upserts: list[BackgroundTask]
    removes: list[str]


class BackgroundOutputParams(Wire, frozen=True, kw_only=True):
    task_id: Id
    after: Annotated[int, Meta(ge=0, le=MAX_INT)] | None = None


class BackgroundOutputResult(Wire, frozen=True, kw_only=True):
    text: str
    end: int
    truncated: bool


class TaskIdParams(Wire, frozen=True, kw_only=True):
    task_id: Id


# --- presence and approvals -----------------------------------------------------------------------


class PresenceParams(Wire, frozen=True, kw_only=True):
    active: bool


class ApprovalRequested(Wire, frozen=True, kw_only=True):
    approval: Approval


class ApprovalSettled(Wire, frozen=True, kw_only=True):
    approval_id: str
    state: Literal["approved", "denied", "expired", "cancelled"]
    source: SettlementSource
    at: int
    by: Speaker | None = None
    grant: GrantTerms | None = None

    @classmethod
    def of(cls, approval_id: str, settlement: ApprovalSettlement) -> ApprovalSettled:
        """The notification for a settlement (same shape as the tool card's ``settlement``)."""
        return cls(
            approval_id=approval_id,
            state=settlement.state,
            source=settlement.source,
            at=settlement.at,
            by=settlement.by,
            grant=settlement.grant,
        )


class GrantRequest(Wire, frozen=True, kw_only=True):
    """``approval/respond``'s ``grant`` (0.2.1): settle later calls of the approval's tool the same
    way, for the rest of the ``turn`` or the ``session``; ``commandPrefix`` narrows an ``exec``
    grant to commands whose shell words start with it; ``expiresInMs`` (default 1 h for a turn,
    24 h for a session; at most 30 days)."""

    scope: Literal["turn", "session"]
    command_prefix: Annotated[str, Meta(max_length=MAX_GRANT_PREFIX)] | None = None
    expires_in_ms: Annotated[int, Meta(ge=1, le=MAX_GRANT_MS)] | None = None


class ApprovalRespondParams(Wire, frozen=True, kw_only=True):
    approval_id: Id
    decision: Literal["approve", "deny"]
    content_hash: Id
    note: Text | None = None
    grant: GrantRequest | None = None


class GrantsListResult(Wire, frozen=True, kw_only=True):
    grants: list[ApprovalGrant]


class GrantRevokeParams(Wire, frozen=True, kw_only=True):
    session_id: Id
    grant_id: Id


__all__ = [
    "HISTORY_DEFAULT_LIMIT",
    "AgentMessageItem",
    "AgentModel",
    "AncestorRef",
    "Approval",
    "ApprovalDiff",
    "ApprovalFacts",
    "ApprovalOrigin",
    "ApprovalRequested",
    "ApprovalRespondParams",
    "ApprovalSettled",
    "ApprovalSettlement",
    "ApprovalGrant",
    "GrantRequest",
    "GrantRevokeParams",
    "GrantTerms",
    "GrantsListResult",
    "BackgroundCall",
    "BackgroundChanged",
    "BackgroundListResult",
    "BackgroundOutputParams",
    "BackgroundOutputResult",
    "BackgroundTask",
    "BatchFailure",
    "ChatInfo",
    "ClientInfo",
    "CommandDisplay",
    "ConfigLayersResult",
    "ConfigRows",
    "ConfigUpdateParams",
    "DataUrl",
    "Empty",
    "Features",
    "FeaturesChanged",
    "FileChangeDisplay",
    "Forward",
    "ForwardFacts",
    "GlobalLayer",
    "HistoryParams",
    "HistoryResult",
    "Identity",
    "InitializeParams",
    "InitializeResult",
    "ItemAttachment",
    "ItemDelta",
    "ItemPush",
    "LastTurn",
    "LayerGetParams",
    "LayerName",
    "LayerRows",
    "LayerUpdateParams",
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
    "LoopWatchParams",
    "LoopWatchResult",
    "NoticeItem",
    "OutgoingAttachment",
    "OverrideEntry",
    "OverrideGroup",
    "OverrideTarget",
    "OverridesParams",
    "OverridesResult",
    "Participant",
    "PlaceInfo",
    "PlaceLayer",
    "PlanEntry",
    "PlanItem",
    "PlatformLayer",
    "PlatformTypeLayer",
    "PresenceParams",
    "QueueEntry",
    "QueueItem",
    "RateLimits",
    "ReasoningItem",
    "RewindResult",
    "RoomGroup",
    "ServerName",
    "SessionBatchParams",
    "SessionBatchResult",
    "SessionCreateParams",
    "SessionIdParams",
    "SessionItem",
    "SessionRenameParams",
    "SessionResult",
    "SessionResync",
    "SessionSummary",
    "SessionTarget",
    "SessionsChanged",
    "SessionsListParams",
    "SessionsListResult",
    "SettingActual",
    "SettingLayer",
    "SettingLayerInfo",
    "SettingRow",
    "Speaker",
    "SubscribeResult",
    "TaskIdParams",
    "TokenCount",
    "ToolCallItem",
    "ToolDisplay",
    "TurnAbortParams",
    "TurnItem",
    "TurnRewindParams",
    "TurnSendParams",
    "Undelivered",
    "UsageItem",
    "UsagePart",
    "UserMessageItem",
    "Wire",
    "decode_data_url",
    "is_unset",
]
