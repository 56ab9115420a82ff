"""The owner's webhook methods (docs/webhooks.md): ``webhooks/deadLetters/list`` and
``webhooks/deadLetters/replay``. Both read and write the store this process shares with the other
workers (a replayed entry is delivered by the worker owning its shard); both run on the gateway's
thread pool; an app connection gets ``forbidden``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from sessionloop.actors.gateway.methods import Client, Handler, in_background
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.webhooks.dead_letters import list_dead_letters, replay_dead_letters
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.frames import RequestId
from sessionloop.protocol.schemas_webhooks import (
    DeadLettersListParams,
    DeadLettersListResult,
    DeadLettersReplayParams,
    DeadLettersReplayResult,
)

if TYPE_CHECKING:
    from sessionloop.actors.gateway.service import SessionProtocolService

__all__ = ["webhook_handlers"]

_CURSOR = re.compile(r"^[0-9]{1,5}\.[0-9]{1,20}$")


def webhook_handlers(svc: SessionProtocolService, host: Any) -> dict[str, Handler]:
    store = svc.rt.store

    def owner(conn: Client, method: str) -> None:
        if not conn.peer.is_owner:
            raise RpcError.forbidden(Text("error.owner-only", method=method))

    def list_(conn: Client, request_id: RequestId, params: DeadLettersListParams) -> None:
        owner(conn, "webhooks/deadLetters/list")
        if params.after is not None and not _CURSOR.match(params.after):
            raise RpcError.invalid_params("after must be the nextAfter of an earlier webhooks/deadLetters/list")

        def work() -> DeadLettersListResult:
            letters, after = list_dead_letters(store, app=params.app, after=params.after, limit=params.limit)
            return DeadLettersListResult(dead_letters=letters, next_after=after)

        in_background(svc, conn, request_id, work)

    def replay(conn: Client, request_id: RequestId, params: DeadLettersReplayParams) -> None:
        owner(conn, "webhooks/deadLetters/replay")
        if params.all == bool(params.ids):
            raise RpcError.invalid_params("give ids, or all: true, not both")

        def work() -> DeadLettersReplayResult:
            moved, missing = replay_dead_letters(store, params.ids, everything=params.all, app=params.app)
            host.webhooks.wake()
            return DeadLettersReplayResult(replayed=moved, missing=missing)

        in_background(svc, conn, request_id, work)

    return {"webhooks/deadLetters/list": list_, "webhooks/deadLetters/replay": replay}
