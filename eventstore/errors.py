"""The exception tree of sessionloop's domain errors.

Every error the store and the actors raise on purpose descends from :class:`SessionloopError`;
each package adds one base and its leaves carry structured attributes (``code``, ``data``) so the
protocol layer can turn them into ``applicationError`` frames without parsing messages (it reads
that shape, ``protocol.errors.DomainError``, and imports nothing from here)::

    SessionloopError
    ├── StoreError                      (eventstore/)
    │   ├── WrongExpectedVersion        stream, expected, actual
    │   ├── IdempotencyConflict         scope, key
    │   ├── StoreLocked                 path, holder
    │   ├── StorageUnavailable          a write could not be taken now: outcome, retry_after_ms
    │   │   └── StorageFull             the disk or the map refused a write (nothing written)
    │   ├── StorageError                any other driver failure, chained with ``from``
    │   ├── EventDecodeError            stream, version
    │   ├── StreamDeleted               stream (its partition was purged: nothing more is written)
    │   ├── InvalidStreamName           stream
    │   ├── FeedCursorExpired           app, after, oldest (retention took events after ``after``)
    │   ├── CommitTooLarge              stream, size, limit (a JetStream log message bound)
    │   ├── LeaseHeld                   shard, holder (another node's lease holds the shard)
    │   ├── LeaseLost                   shard, node, reason (this node no longer owns the shard)
    │   └── StoreClosed
    └── ActorError                      (actors/, see actors/errors.py)

protocol/ has a root of its own, ``protocol.errors.ProtocolError`` (``RpcError``, and
``ProtocolMisuse``: our own code misused the API), shaped the same way.

No ``lmdb`` or ``msgspec`` exception escapes eventstore/: the recorder translates them at the
boundary with ``raise ... from e``.
"""

from __future__ import annotations

from typing import Any


class SessionloopError(Exception):
    """Root of every error sessionloop raises on purpose."""

    code: str = "internal"

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.data = data


class StoreError(SessionloopError):
    """Base of the event store's errors."""

    code = "store"


class WrongExpectedVersion(StoreError):
    """An append named a stream version that is not the stream's current one; nothing was written."""

    code = "conflict"

    def __init__(self, stream: str, expected: int, actual: int) -> None:
        super().__init__(
            f"wrong expected version for stream {stream!r}: expected {expected}, actual {actual}",
            stream=stream,
            expected=expected,
            actual=actual,
        )
        self.stream = stream
        self.expected = expected
        self.actual = actual


class IdempotencyConflict(StoreError):
    """The idempotency key was used before for a request with a different body."""

    code = "conflict"

    def __init__(self, scope: str, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} in scope {scope!r} was already used for a different request",
            scope=scope,
            key=key,
        )
        self.scope = scope
        self.key = key


class StoreLocked(StoreError):
    """Another process holds the data directory open for writing."""

    code = "locked"

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(
            f"data directory {path} is already open for writing by another process ({holder})",
            path=path,
            holder=holder,
        )
        self.path = path
        self.holder = holder


#: How long a client should wait before retrying a write the store refused (disk full, I/O
#: error); and after the store stopped accepting writes (it needs a restart).
RETRY_AFTER_MS = 1000
STOPPED_RETRY_AFTER_MS = 5000

NOT_WRITTEN = "not-written"
UNKNOWN = "unknown"


class StorageUnavailable(StoreError):
    """The store could not take a write now; the client may retry after ``retry_after_ms``.

    ``outcome`` is what became of the write, and it is always true:

    * ``"not-written"``: nothing of it is in the store (checked after the failure), so a retry
      writes it once;
    * ``"unknown"``: the store could not find out, stopped accepting writes (fail-stop) and
      decides at its next open; a retry with the same idempotency key after the restart returns
      the original receipt if the write made it, or writes it once.

    ``reason`` is ``"full"`` (disk or map ceiling), ``"io-error"`` or ``"stopped"`` (refused
    because an earlier failure stopped the store). The message is written for the client and
    names no path; the log line the store writes has the driver's error and the path.
    """

    code = "storage-unavailable"

    def __init__(self, message: str, *, outcome: str = NOT_WRITTEN, reason: str = "io-error",
                 retry_after_ms: int = RETRY_AFTER_MS, path: str = "") -> None:
        # data keys are the wire's names (``error.data``); ``_path`` stays on the server
        super().__init__(message, retryAfterMs=retry_after_ms, outcome=outcome, reason=reason, _path=path)
        self.outcome = outcome
        self.reason = reason
        self.retry_after_ms = retry_after_ms
        self.path = path


class StorageFull(StorageUnavailable):
    """The disk (or a configured map-size ceiling) refused a write; nothing of it was written."""

    def __init__(self, message: str, *, path: str = "", retry_after_ms: int = RETRY_AFTER_MS) -> None:
        super().__init__(message, outcome=NOT_WRITTEN, reason="full", retry_after_ms=retry_after_ms, path=path)


class StorageError(StoreError):
    """The storage driver failed; the original error is chained as ``__cause__``."""

    code = "storage"


class EventDecodeError(StoreError):
    """A stored payload could not be decoded; names where it lives."""

    code = "decode"

    def __init__(self, stream: str, version: int, reason: str) -> None:
        super().__init__(
            f"cannot decode event {version} of stream {stream!r}: {reason}",
            stream=stream,
            version=version,
        )
        self.stream = stream
        self.version = version


class StreamDeleted(StoreError):
    """The stream belongs to a purged partition (``EventStore.purge``): it is sealed, nothing more
    is written to it, and an idempotency key it used answers this instead of its receipt."""

    code = "not-found"

    def __init__(self, stream: str) -> None:
        super().__init__(f"stream {stream!r} was deleted; nothing more is written to it", stream=stream)
        self.stream = stream


class InvalidStreamName(StoreError):
    code = "invalid-stream"

    def __init__(self, stream: str, reason: str) -> None:
        super().__init__(f"invalid stream name {stream!r}: {reason}", stream=stream)
        self.stream = stream


class FeedCursorExpired(StoreError):
    """A feed read after ``after`` would skip events retention already took out: the oldest
    cursor to read after without a gap is ``oldest`` (the last position pruned)."""

    code = "cursor-expired"

    def __init__(self, app: str, after: int, oldest: int) -> None:
        super().__init__(f"cursor {after} of feed {app!r} is older than its retention: the oldest "
                         f"cursor to resume after is {oldest}", after=after, oldest=oldest)
        self.app = app
        self.after = after
        self.oldest = oldest


class CommitTooLarge(StoreError):
    """A commit's encoded message is larger than the replicated log takes in one message
    (``jetstream_log.py``: the server's max payload, or the log's own bound); nothing was written."""

    code = "too-large"

    def __init__(self, stream: str, size: int, limit: int) -> None:
        super().__init__(f"commit to stream {stream!r} encodes to {size} bytes, above the log's limit of "
                         f"{limit} bytes per commit", stream=stream, size=size, limit=limit)
        self.stream = stream
        self.size = size
        self.limit = limit


class LeaseHeld(StoreError):
    """A shard lease could not be taken: another node holds it (``leases.py``)."""

    code = "lease-held"

    def __init__(self, shard: int, holder: str) -> None:
        super().__init__(f"shard {shard} is leased by node {holder!r}", shard=shard, holder=holder)
        self.shard = shard
        self.holder = holder


class LeaseLost(StoreError):
    """This node no longer owns the shard (its lease expired, passed to another node, or a fenced
    append found another writer); it dropped the shard and must not write to it (``leases.py``)."""

    code = "lease-lost"

    def __init__(self, shard: int, node: str, reason: str) -> None:
        super().__init__(f"node {node!r} lost shard {shard}: {reason}", shard=shard, node=node, reason=reason)
        self.shard = shard
        self.node = node
        self.reason = reason


class StoreClosed(StoreError):
    code = "closed"

    def __init__(self) -> None:
        super().__init__("the event store is closed")


class ReadOnlyStore(StoreError):
    code = "read-only"

    def __init__(self, path: str) -> None:
        super().__init__(f"the event store at {path} was opened read-only", path=path)

