"""The LMDB event store (SPEC §3): the only package that touches LMDB."""

from sessionloop.eventstore.codec import decode_event, encode_event, event_from_builtins, event_to_builtins
from sessionloop.eventstore.errors import (
    EventDecodeError,
    IdempotencyConflict,
    InvalidStreamName,
    ReadOnlyStore,
    SessionloopError,
    StorageError,
    StorageFull,
    StorageUnavailable,
    StoreClosed,
    StoreError,
    StoreLocked,
    StreamDeleted,
    WrongExpectedVersion,
)
from sessionloop.eventstore.records import (
    AppendResult,
    IdempotencyClaim,
    PurgeResult,
    RecordedEvent,
    Snapshot,
    StreamPage,
)
from sessionloop.eventstore.store import ANY_VERSION, NO_STREAM, EventStore, request_hash

__all__ = [
    "ANY_VERSION",
    "NO_STREAM",
    "AppendResult",
    "EventDecodeError",
    "EventStore",
    "IdempotencyClaim",
    "IdempotencyConflict",
    "InvalidStreamName",
    "PurgeResult",
    "ReadOnlyStore",
    "RecordedEvent",
    "SessionloopError",
    "Snapshot",
    "StorageError",
    "StorageFull",
    "StorageUnavailable",
    "StoreClosed",
    "StoreError",
    "StoreLocked",
    "StreamDeleted",
    "StreamPage",
    "WrongExpectedVersion",
    "decode_event",
    "encode_event",
    "event_from_builtins",
    "event_to_builtins",
    "request_hash",
]
