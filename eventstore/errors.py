"""The one exception tree of sessionloop.

Every error we raise on purpose descends from :class:`SessionloopError`; each package adds
one base and its leaves carry structured attributes (``code``, ``data``) so the protocol
layer can turn them into ``applicationError`` frames without parsing messages::

    SessionloopError
    ├── StoreError                      (eventstore/)
    │   ├── WrongExpectedVersion        stream, expected, actual
    │   ├── IdempotencyConflict         scope, key
    │   ├── StoreLocked                 path, holder
    │   ├── StorageFull                 the disk or the map refused a write
    │   ├── StorageError                any other driver failure, chained with ``from``
    │   ├── EventDecodeError            stream, version
    │   ├── InvalidStreamName           stream
    │   └── StoreClosed
    ├── ActorError                      (actors/, see actors/errors.py)
    └── ProtocolMisuse                  (protocol/: our own code misused the API)

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


class StorageFull(StoreError):
    """The disk (or a configured map-size ceiling) refused a write; nothing of it was written."""

    code = "storage-full"


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


class InvalidStreamName(StoreError):
    code = "invalid-stream"

    def __init__(self, stream: str, reason: str) -> None:
        super().__init__(f"invalid stream name {stream!r}: {reason}", stream=stream)
        self.stream = stream


class StoreClosed(StoreError):
    code = "closed"

    def __init__(self) -> None:
        super().__init__("the event store is closed")


class ReadOnlyStore(StoreError):
    code = "read-only"

    def __init__(self, path: str) -> None:
        super().__init__(f"the event store at {path} was opened read-only", path=path)
