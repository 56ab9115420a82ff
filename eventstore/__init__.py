"""The LMDB event store: the only package that touches LMDB.

Generic: streams of tagged events, versions, idempotency and feeds. The union of event types is
handed in when the store opens (``EventStore.open(path, events=EventTypes(...))``); this package
imports nothing of ours outside itself.
"""

from sessionloop.eventstore.codec import EventTypes, UnknownEvent, Upcaster, encode_event, event_to_builtins
from sessionloop.eventstore.errors import (
    EventDecodeError,
    FeedCursorExpired,
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
from sessionloop.eventstore.log_replica import LogReplica
from sessionloop.eventstore.outbox import OutboxItem, OutboxMark
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
    "LogReplica",
    "ANY_VERSION",
    "NO_STREAM",
    "AppendResult",
    "EventDecodeError",
    "EventStore",
    "EventTypes",
    "FeedCursorExpired",
    "IdempotencyClaim",
    "IdempotencyConflict",
    "InvalidStreamName",
    "OutboxItem",
    "OutboxMark",
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
    "UnknownEvent",
    "Upcaster",
    "WrongExpectedVersion",
    "encode_event",
    "event_to_builtins",
    "request_hash",
]
