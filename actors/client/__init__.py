"""sessionloop.client: a typed client of a sessionloop server, for bots and tools.

    from sessionloop.client import AsyncClient, Client

    async with AsyncClient("ws://127.0.0.1:8765/session", token) as bot:    # asyncio
        ...
    with Client("ws://127.0.0.1:8765/session", token) as bot:              # threads
        ...

The Session Loop API (``create``, ``send``, ``wait_for_turn``, ``list_events``, ``watch``) and every
method of the session protocol, with results decoded into the protocol's msgspec Structs
(:mod:`sessionloop.protocol.schemas`) and errors raised as the typed exceptions of
:mod:`sessionloop.client.errors`. It reconnects by itself (docs/bots.md, "Over the wire").

It imports nothing of sessionloop but :mod:`sessionloop.protocol` (tests/architecture checks it),
so the server's own parts never come with it.
"""

from sessionloop.client.aio import AsyncClient, ClientOptions, NotificationsDropped
from sessionloop.client.errors import (
    ApprovalSettled,
    CallTimeout,
    ClientClosed,
    ClientError,
    Conflict,
    ConnectFailed,
    ConnectionLost,
    CursorExpired,
    ExpectedTurnMismatch,
    Forbidden,
    HashMismatch,
    InternalError,
    InvalidArguments,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    NotFound,
    ParseError,
    Rejected,
    RpcFailed,
    StorageUnavailable,
    TokenRefused,
    TooLarge,
    Unavailable,
    Unsupported,
)
from sessionloop.client.stream import EventStream
from sessionloop.client.sync import Client, EventIterator
from sessionloop.client.wire import Notification

__all__ = [
    "ApprovalSettled",
    "AsyncClient",
    "CallTimeout",
    "Client",
    "ClientClosed",
    "ClientError",
    "ClientOptions",
    "Conflict",
    "CursorExpired",
    "ConnectFailed",
    "ConnectionLost",
    "EventIterator",
    "EventStream",
    "ExpectedTurnMismatch",
    "Forbidden",
    "HashMismatch",
    "InternalError",
    "InvalidArguments",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "Notification",
    "NotFound",
    "NotificationsDropped",
    "ParseError",
    "Rejected",
    "RpcFailed",
    "StorageUnavailable",
    "TokenRefused",
    "TooLarge",
    "Unavailable",
    "Unsupported",
]
