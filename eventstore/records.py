"""What the store keeps on disk and hands back, as msgspec Structs (array-like on disk: compact)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

#: what a read hands back as the event: one of the store's union, or an UnknownEvent
EventT = TypeVar("EventT")


class IdempotencyClaim(msgspec.Struct, frozen=True, array_like=True):
    """``(scope, key)`` with a hash of the request body and the receipt to return on a repeat."""

    scope: str
    key: str
    request_hash: str
    receipt: bytes = b""


class CommitRecordOut(msgspec.Struct, array_like=True):
    """One log record per commit (the unit a replicated log beyond one machine keeps too).
    ``events`` are event structs or pre-encoded ``msgspec.Raw`` payloads; either way each lands
    as one msgpack map, so readers can decode them one by one (``CommitRecordIn``) and name the
    version of a bad one."""

    stream: str
    first_version: int
    first_position: int
    at: int
    commit_id: str | None
    events: list[Any]
    idem: IdempotencyClaim | None = None
    feed: str | None = None
    #: only on a purge's tombstone record: ``(idempotency key digest, time)`` of each claim the
    #: purged records held, so a rebuilt index still answers "deleted" for them (no scope, key,
    #: request hash or receipt is kept)
    erased: list[tuple[bytes, int]] | None = None


class CommitRecordIn(msgspec.Struct, array_like=True):
    stream: str
    first_version: int
    first_position: int
    at: int
    commit_id: str | None
    events: list[msgspec.Raw]
    idem: IdempotencyClaim | None = None
    feed: str | None = None
    erased: list[tuple[bytes, int]] | None = None


class IdemValue(msgspec.Struct, frozen=True, array_like=True):
    """A receipt in the idempotency index. ``erased``: the append it dedups was purged; the
    claim is emptied (no scope, key, hash or receipt), ``stream`` names the purged stream, and
    a repeat of the key is answered :class:`~eventstore.errors.StreamDeleted`."""

    claim: IdempotencyClaim
    stream: str
    first_version: int
    last_version: int
    first_position: int
    last_position: int
    at: int
    erased: bool = False


class SnapshotRecord(msgspec.Struct, frozen=True, array_like=True):
    """``parts``: how many of the stream's snapshot parts (``snapshot_parts``, indices from 0)
    belong to this snapshot; parts are written once and kept across snapshots until replaced."""

    version: int
    state: bytes
    at: int = 0
    parts: int = 0


class AppendResult(msgspec.Struct, frozen=True):
    """Where an append landed. ``duplicate`` is true when an idempotency key matched an earlier
    append: nothing was written and the fields describe that original append."""

    stream: str
    first_version: int
    last_version: int
    first_position: int
    last_position: int
    at: int
    duplicate: bool = False
    receipt: bytes = b""


class PurgeResult(msgspec.Struct, frozen=True):
    """What a purge did: where its tombstone landed, which streams it emptied, and how many
    commit records and events it removed."""

    tombstone: AppendResult
    streams: list[str]
    records: int
    events: int


class RecordedEvent(msgspec.Struct, Generic[EventT], frozen=True):
    """An event as read back: where it lives and when it was committed."""

    stream: str
    version: int
    position: int
    at: int
    event: EventT
    commit_id: str | None = None


class Snapshot(msgspec.Struct, frozen=True):
    """A stream's saved fold: ``state`` and the ``parts`` it was saved with (in index order)."""

    stream: str
    version: int
    state: bytes
    at: int = 0
    parts: tuple[bytes, ...] = ()


class StreamPage(msgspec.Struct, frozen=True):
    streams: list[str]
    next_after: str | None = None
