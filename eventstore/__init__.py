"""The LMDB event store (SPEC §3): the only package that touches LMDB."""

from .codec import decode_event, encode_event, event_from_builtins, event_to_builtins
from .errors import (
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
from .records import (
    AppendResult,
    IdempotencyClaim,
    PurgeResult,
    RecordedEvent,
    Snapshot,
    StreamPage,
)
from .store import ANY_VERSION, NO_STREAM, EventStore, request_hash

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
