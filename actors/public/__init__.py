"""sessionloop: a server that hosts LLM-agent sessions as event-sourced actors.

The installed distribution owns one top-level name, ``sessionloop``; this module is its root (the
repository keeps the design card's folders, so setup.cfg maps this folder to ``sessionloop`` and
``actors/``, ``cli/``, ``eventstore/``, ``protocol/`` to ``sessionloop.actors`` and so on).

    from sessionloop import Host

    with Host.open("./data") as host:
        loop = host.sessions(app="mybot")          # the Session Loop API of one app
        s = loop.create(container_id="inbox", title="Chat with Alice")
        receipt = loop.send(s.session_id, "What is the weather?", idempotency_key="msg-123")
        result = loop.wait_for_turn(s.session_id, receipt.turn_id, timeout_ms=60_000)

The names below are the public API; everything else is internal and may change between versions.
"""

from sessionloop.actors.api.host import Host, RunResult, Session, SessionInfo
from sessionloop.actors.api.loop import (
    AsyncSessionLoop,
    CreateResult,
    EventsPage,
    LoopEvent,
    LoopReceipt,
    SessionLoop,
    TurnResult,
)
from sessionloop.actors.errors import (
    ActorError,
    CompactionFailed,
    Conflict,
    ExpectedTurnMismatch,
    Forbidden,
    HostClosed,
    InvalidCommand,
    NotFound,
    RequestTimeout,
    SessionBusy,
    SessionParked,
    Unsupported,
)
from sessionloop.actors.session.messages import Receipt
from sessionloop.actors.system.runtime import HostOptions
from sessionloop.eventstore.errors import (
    IdempotencyConflict,
    SessionloopError,
    StorageFull,
    StorageUnavailable,
    StoreError,
    StoreLocked,
)

__all__ = [
    "ActorError",
    "AsyncSessionLoop",
    "CompactionFailed",
    "Conflict",
    "CreateResult",
    "EventsPage",
    "ExpectedTurnMismatch",
    "Forbidden",
    "Host",
    "HostClosed",
    "HostOptions",
    "IdempotencyConflict",
    "InvalidCommand",
    "LoopEvent",
    "LoopReceipt",
    "NotFound",
    "Receipt",
    "RequestTimeout",
    "RunResult",
    "Session",
    "SessionBusy",
    "SessionInfo",
    "SessionLoop",
    "SessionParked",
    "SessionloopError",
    "StorageFull",
    "StorageUnavailable",
    "StoreError",
    "StoreLocked",
    "TurnResult",
    "Unsupported",
]
