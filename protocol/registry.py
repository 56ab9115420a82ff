"""The session protocol's registry: every method with its params and result types, and every
notification with its params type (docs/protocol.md). :class:`protocol.connection.Connection`
decodes requests and checks answers by it; ``protocol.reference`` writes the reference from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgspec

from sessionloop.protocol.schemas import (
    ApprovalRequested,
    ApprovalRespondParams,
    ApprovalSettled,
    BackgroundChanged,
    BackgroundListResult,
    BackgroundOutputParams,
    BackgroundOutputResult,
    ConfigLayersResult,
    ConfigRows,
    ConfigUpdateParams,
    Empty,
    FeaturesChanged,
    GrantRevokeParams,
    GrantsListResult,
    HistoryParams,
    HistoryResult,
    InitializeParams,
    InitializeResult,
    ItemDelta,
    ItemPush,
    LayerGetParams,
    LayerRows,
    LayerUpdateParams,
    LoopCreateParams,
    LoopCreateResult,
    LoopEventParams,
    LoopListEventsParams,
    LoopListEventsResult,
    LoopSendParams,
    LoopSendResult,
    LoopWaitForTurnParams,
    LoopWaitForTurnResult,
    LoopWatchParams,
    LoopWatchResult,
    OverridesParams,
    OverridesResult,
    PresenceParams,
    RewindResult,
    SessionBatchParams,
    SessionBatchResult,
    SessionCreateParams,
    SessionIdParams,
    SessionRenameParams,
    SessionResult,
    SessionResync,
    SessionsChanged,
    SessionsListParams,
    SessionsListResult,
    SubscribeResult,
    TaskIdParams,
    TurnAbortParams,
    TurnRewindParams,
    TurnSendParams,
)
from sessionloop.protocol.schemas_webhooks import (
    DeadLettersListParams,
    DeadLettersListResult,
    DeadLettersReplayParams,
    DeadLettersReplayResult,
)

__all__ = ["METHODS", "NOTIFICATIONS", "MethodSpec"]


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """What a method takes and gives; ``decoder`` decodes its params (built once, at import)."""

    name: str
    params: type[msgspec.Struct]
    result: type[msgspec.Struct]
    decoder: msgspec.json.Decoder[Any]


def _spec(name: str, params: type[msgspec.Struct], result: type[msgspec.Struct]) -> tuple[str, MethodSpec]:
    return name, MethodSpec(name, params, result, msgspec.json.Decoder(params))


METHODS: Final[dict[str, MethodSpec]] = dict(
    [
        _spec("initialize", InitializeParams, InitializeResult),
        _spec("sessions/list", SessionsListParams, SessionsListResult),
        _spec("sessions/watch", Empty, Empty),
        _spec("session/create", SessionCreateParams, SessionResult),
        _spec("session/rename", SessionRenameParams, Empty),
        _spec("session/archive", SessionIdParams, Empty),
        _spec("session/unarchive", SessionIdParams, Empty),
        _spec("session/delete", SessionIdParams, Empty),
        _spec("session/batch", SessionBatchParams, SessionBatchResult),
        _spec("session/markSeen", SessionIdParams, Empty),
        _spec("session/config/get", SessionIdParams, ConfigRows),
        _spec("session/config/update", ConfigUpdateParams, ConfigRows),
        _spec("session/config/layers", Empty, ConfigLayersResult),
        _spec("session/config/layer/get", LayerGetParams, LayerRows),
        _spec("session/config/layer/update", LayerUpdateParams, LayerRows),
        _spec("session/config/overrides", OverridesParams, OverridesResult),
        _spec("session/subscribe", SessionIdParams, SubscribeResult),
        _spec("session/unsubscribe", SessionIdParams, Empty),
        _spec("session/history", HistoryParams, HistoryResult),
        _spec("turn/send", TurnSendParams, Empty),
        _spec("turn/continue", SessionIdParams, Empty),
        _spec("turn/abort", TurnAbortParams, Empty),
        _spec("session/compress", SessionIdParams, Empty),
        _spec("turn/rewind", TurnRewindParams, RewindResult),
        _spec("plan/clear", SessionIdParams, Empty),
        _spec("background/list", Empty, BackgroundListResult),
        _spec("background/watch", Empty, Empty),
        _spec("background/output", BackgroundOutputParams, BackgroundOutputResult),
        _spec("background/stop", TaskIdParams, Empty),
        _spec("background/stopAll", SessionIdParams, Empty),
        _spec("presence/update", PresenceParams, Empty),
        _spec("approval/respond", ApprovalRespondParams, Empty),
        _spec("approval/grants/list", SessionIdParams, GrantsListResult),  # 0.2.1
        _spec("approval/grants/revoke", GrantRevokeParams, Empty),  # 0.2.1
        # Session Loop API for bots (see protocol.schemas_loop)
        _spec("loop/create", LoopCreateParams, LoopCreateResult),
        _spec("loop/send", LoopSendParams, LoopSendResult),
        _spec("loop/waitForTurn", LoopWaitForTurnParams, LoopWaitForTurnResult),
        _spec("loop/listEvents", LoopListEventsParams, LoopListEventsResult),
        _spec("loop/watch", LoopWatchParams, LoopWatchResult),
        # the owner's webhook dead letters (see protocol.schemas_webhooks)
        _spec("webhooks/deadLetters/list", DeadLettersListParams, DeadLettersListResult),
        _spec("webhooks/deadLetters/replay", DeadLettersReplayParams, DeadLettersReplayResult),
    ]
)

NOTIFICATIONS: Final[dict[str, type[msgspec.Struct]]] = {
    "sessions/changed": SessionsChanged,
    "session/config/changed": Empty,
    "features/changed": FeaturesChanged,
    "item/started": ItemPush,
    "item/completed": ItemPush,
    "item/delta": ItemDelta,
    "session/resync": SessionResync,
    "background/changed": BackgroundChanged,
    "approval/requested": ApprovalRequested,
    "approval/settled": ApprovalSettled,
    "loop/event": LoopEventParams,
}
