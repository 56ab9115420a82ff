"""The event store façade: events in, recorded events out.

Generic: which events exist is the application's business. It hands its union in when the store
opens (``EventStore.open(path, events=EventTypes(...))``, see ``codec.py``); the store keeps bytes
under tags, streams and versions and decodes reads through that union.

The narrow interface a second backend would implement (a replicated log beyond one machine) is
``append``, the reads, and snapshots; everything LMDB-specific stays in ``lmdb_recorder.py`` and
the ``lmdb_*`` modules beside it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic

import msgspec

from sessionloop.eventstore import keys as K
from sessionloop.eventstore.batch import ANY_VERSION, AppendOp, FlagsOp, MetaOp, PurgeOp, SnapshotOp
from sessionloop.eventstore.codec import EventTypes, EvT, UnknownEvent, encode_json, event_to_builtins
from sessionloop.eventstore.errors import FeedCursorExpired, IdempotencyConflict, StorageError, StreamDeleted
from sessionloop.eventstore.groupcommit import HistogramSnapshot
from sessionloop.eventstore.lmdb_recorder import LmdbRecorder
from sessionloop.eventstore.log_replica import LogReplica, Materialized
from sessionloop.eventstore.outbox import OutboxAckOp, OutboxDeadOp, OutboxItem, OutboxMark, OutboxReplayOp
from sessionloop.eventstore.records import (
    AppendResult,
    CommitRecordIn,
    IdempotencyClaim,
    PurgeResult,
    RecordedEvent,
    Snapshot,
    StreamPage,
)

__all__ = ["ANY_VERSION", "NO_STREAM", "EventStore", "request_hash"]

NO_STREAM = 0
#: above every position (u64 keys): a read after it finds nothing
MAX_POSITION = 2**64 - 2


def request_hash(body: Any) -> str:
    """A stable hash of a request body for idempotency checks: canonical JSON, sorted keys, so
    two encodings of the same body (key order, duplicate keys) hash alike (RELIABILITY, msgspec)."""
    return hashlib.sha256(encode_json(_sorted(body))).hexdigest()


def _sorted(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _sorted(obj[k]) for k in sorted(obj, key=str)}
    if isinstance(obj, (list, tuple)):
        return [_sorted(v) for v in obj]
    return obj


class EventStore(Generic[EvT]):
    """An append-only store of event streams in one data directory; ``purge`` is the one write
    that takes events out (deleting a session, see ``purge.py``). ``EvT`` is the application's
    event type; reads hand back each event as one of its union or an :class:`UnknownEvent`.

    Thread-safe: appends from any number of threads are group-committed; reads run in their own
    short read transactions. Open one per data directory and process (a second writing process
    gets StoreLocked).
    """

    def __init__(self, recorder: LmdbRecorder, events: EventTypes[EvT]) -> None:
        self._rec = recorder
        self._events = events
        self._replica: LogReplica | None = None  # the log the store materializes (``follow_log``)

    @classmethod
    def open(
        cls,
        path: str,
        *,
        events: EventTypes[EvT],
        durability: str = "sync",
        shards: int = 16,
        map_size: int = 1 << 30,
        max_map_size: int | None = None,
        readonly: bool = False,
        idempotency_ttl_s: float = 7 * 86_400,
        feed_max_events: int = 10_000,
        feed_ttl_s: float = 7 * 86_400,
        prune_interval_s: float = 1.0,
        on_map_resize: Callable[[], None] | None = None,
        on_purge: Callable[[], None] | None = None,
        owned_shards: frozenset[int] | None = None,
        lock_fd: int | None = None,
    ) -> EventStore[EvT]:
        """Open (or create) the store at ``path``, decoding its events through ``events``.

        ``durability`` is ``sync`` (fsync before every acknowledgement) or ``nosync`` (the OS
        decides when; survives a process crash, not a power loss). ``shards`` only matters when
        the store is created. Raises StoreLocked if another process writes there, StorageError
        if the files cannot be opened. ``on_map_resize`` is called when a full map is about to
        grow, after the group's transaction is aborted (the server's crash point ``map-resize``);
        ``on_purge`` inside a purge's transaction, its records deleted and nothing committed
        (the crash point ``purge``).

        ``owned_shards`` (``serve --workers``): the shards whose sessions this process runs, in an
        environment other processes write too; it may read and write any stream, and every
        expected version is checked against what all of them wrote. ``lock_fd``: the inherited descriptor of the
        directory's ``LOCK`` on which the parent process holds the writer lock, instead of taking it.
        """
        if idempotency_ttl_s < 0 or feed_ttl_s < 0:
            raise ValueError("retention times must not be negative")
        return cls(
            LmdbRecorder(
                path,
                durability=durability,
                shards=shards,
                map_size=map_size,
                max_map_size=max_map_size,
                readonly=readonly,
                idempotency_ttl_ms=int(idempotency_ttl_s * 1000),
                feed_max_events=feed_max_events,
                feed_ttl_ms=int(feed_ttl_s * 1000),
                prune_interval_s=prune_interval_s,
                on_map_resize=on_map_resize,
                on_purge=on_purge,
                owned_shards=owned_shards,
                lock_fd=lock_fd,
            ),
            events,
        )

    def close(self) -> None:
        """Close the store, then the log it follows (``follow_log``), whose leases go back."""
        try:
            self._rec.close()
        finally:
            if self._replica is not None:
                self._replica.close()

    def stand_by(self, replica: LogReplica, shards: Iterable[int]) -> None:
        """Take the leases of ``shards`` through ``replica``, waiting while another node holds
        them, and keep this store up to the log meanwhile (a hot standby); then ``follow_log``.
        Raises StorageError when the store and the log do not have the same shards."""
        self._check_shards(replica)
        replica.open(shards, wait=True, rec=self._rec)

    def _check_shards(self, replica: LogReplica) -> None:
        if replica.shards != self._rec.shards:
            raise StorageError(f"the event store at {self.path} has {self._rec.shards} shards, the cluster's log "
                               f"{replica.shards}", path=self.path)

    def follow_log(self, replica: LogReplica) -> Materialized:
        """Bring the store up to ``replica``'s log (every shard the replica holds a lease of) and
        make it the log's materialization from then on: a commit is in the store only once the
        log holds it (``log_replica.py``). Raises StorageError when the store holds commits and
        the log none of the replica's shards (a data directory that was never a cluster node's),
        or when the store disagrees with the log. The store closes the replica when it closes;
        its epochs (``next_epoch``) are above every lease revision the replica holds."""
        self._check_shards(replica)
        done = replica.materialize(self._rec)
        if replica.commits_read == 0 and self._rec.head_position > 0:
            raise StorageError(f"the event store at {self.path} holds commits that the cluster's log does not: "
                               "start a cluster node on an empty data directory (or one a node of this cluster "
                               "made)", path=self.path)
        self._rec.attach_replica(replica)
        self._replica = replica
        return done

    def compact(self) -> tuple[int, int]:
        """Rewrite the store's file without the pages LMDB freed (deleted sessions' bytes among
        them); ``(bytes before, bytes after)``. See ``LmdbRecorder.compact``."""
        return self._rec.compact()

    def backup(self, dest: str) -> int:
        """A consistent, compacted copy of the store in the new directory ``dest`` while it
        serves (read-only opens too); its size in bytes. See ``LmdbRecorder.backup``."""
        return self._rec.backup(dest)

    def __enter__(self) -> EventStore[EvT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- properties -------------------------------------------------------------------------------

    @property
    def events(self) -> EventTypes[EvT]:
        """The union of event types this store was opened with."""
        return self._events

    @property
    def path(self) -> str:
        return self._rec.path

    @property
    def durability(self) -> str:
        return self._rec.durability

    @property
    def shards(self) -> int:
        return self._rec.shards

    @property
    def head_position(self) -> int:
        """The global position of the last committed event (0 for an empty store)."""
        return self._rec.head_position

    def info(self) -> dict[str, Any]:
        """Settings and counters, for logs and metrics (durability is checked and reported here)."""
        return self._rec.info()

    def commit_stats(self) -> dict[str, HistogramSnapshot]:
        """Observations of the group commits since the store opened, for metrics: per write
        transaction its duration (``commit_seconds``) and request count (``batch_size``), per
        append its latency from submission to durable commit (``append_seconds``). Taken
        without locks by the committing thread; this returns copies."""
        return self._rec.commit_stats()

    def shard_of(self, stream: str) -> int:
        return K.shard_of(stream, self._rec.shards)

    @property
    def owned_shards(self) -> frozenset[int] | None:
        """The shards this process writes when it shares the store with other workers, else None."""
        return self._rec.owned_shards

    def owns(self, stream: str) -> bool:
        """Whether ``stream``'s shard is this process's (always, unless it shares the store)."""
        owned = self._rec.owned_shards
        return owned is None or K.shard_of(stream, self._rec.shards) in owned

    # --- writes -----------------------------------------------------------------------------------

    def append(
        self,
        stream: str,
        events: Sequence[EvT],
        expected_version: int = ANY_VERSION,
        commit_id: str | None = None,
        *,
        idempotency: IdempotencyClaim | None = None,
        feed: str | None = None,
        meta: bytes | None = None,
        flags: dict[str, bool] | None = None,
        outbox: OutboxMark | None = None,
    ) -> AppendResult:
        """Append ``events`` to ``stream`` atomically, after all previously committed ones.

        ``expected_version`` is the version the stream must have now (0: must not exist,
        ANY_VERSION: no check). With ``idempotency``, a repeat of the same ``(scope, key)`` and
        body returns the original result with ``duplicate=True`` and writes nothing. ``feed``
        indexes the feed-visible events under that app (kept for the feed's retention). ``meta`` replaces
        the stream's metadata record (opaque bytes, e.g. a listing summary) and ``flags`` sets
        or clears named markers of the stream (e.g. "has unfinished work"), both in the same
        transaction, so they can never disagree with the events. ``outbox`` puts one outbox
        entry per event its flags mark (``outbox.py``), in the same transaction too.

        Returns only after the commit (fsynced in ``sync`` mode). Raises WrongExpectedVersion or
        IdempotencyConflict (nothing was written), or StorageUnavailable (StorageFull for a full
        disk) whose ``outcome`` is ``"not-written"`` (checked after the failure: nothing of it is
        in the store) or ``"unknown"`` (the store could not tell and stopped taking writes; retry
        with the same idempotency key after a restart). Never reports a committed append as failed.
        """
        op = self._append_op(stream, events, expected_version, commit_id, idempotency, feed, meta, flags, outbox)
        result: AppendResult = self._rec.submit(op)
        return result

    def append_async(
        self,
        stream: str,
        events: Sequence[EvT],
        expected_version: int,
        done: Callable[[AppendResult | None, BaseException | None], None],
        *,
        idempotency: IdempotencyClaim | None = None,
        feed: str | None = None,
        meta: bytes | None = None,
        flags: dict[str, bool] | None = None,
        outbox: OutboxMark | None = None,
    ) -> None:
        """``append`` without waiting: ``done(result, None)`` or ``done(None, error)`` is called
        once the group holding the append committed (fsynced in ``sync``) or failed.

        ``done`` runs on the store's writing thread and must only hand the outcome on. Bad
        arguments and a closed or read-only store raise here, before anything is queued.
        """
        op = self._append_op(stream, events, expected_version, None, idempotency, feed, meta, flags, outbox)
        self._rec.submit_async(op, done)

    def append_encoded(
        self,
        stream: str,
        raw_stream: bytes,
        payloads: list[bytes],
        feed_flags: list[bool],
        expected_version: int = ANY_VERSION,
        commit_id: str | None = None,
        idempotency: IdempotencyClaim | None = None,
        feed: str | None = None,
    ) -> AppendResult:
        """``append`` for payloads already encoded (``import``, tests of corrupt data)."""
        op = AppendOp(stream, raw_stream, [msgspec.Raw(p) for p in payloads], feed_flags, expected_version, commit_id,
                      idempotency, feed)
        result: AppendResult = self._rec.submit(op)
        return result

    def purge(
        self,
        stream: str,
        tombstone: Sequence[EvT],
        expected_version: int = ANY_VERSION,
        *,
        categories: Sequence[str] | None = None,
        meta: bytes | None = None,
        flags: dict[str, bool] | None = None,
    ) -> PurgeResult:
        """Take every stream of ``stream``'s partition in ``categories`` (default: ``stream``'s own
        category) out of the store and leave ``tombstone`` (at least one event) as ``stream``'s
        only events, in one transaction (``purge.py`` says what goes and what stays).

        Afterwards ``stream`` reads as the tombstone alone (at versions after the purged ones),
        its other streams read as empty, ``meta`` is ``stream``'s metadata record and ``flags``
        its only flags, and every append to a stream of the partition raises StreamDeleted, as
        does a repeat of an idempotency key one of the purged appends used.

        Raises WrongExpectedVersion, or StreamDeleted if the partition was purged before
        (nothing written either way), or StorageUnavailable as ``append`` does.
        """
        if not tombstone:
            raise ValueError("purge needs at least one tombstone event")
        raw_stream = K.validate_stream(stream)
        cats = list(categories) if categories is not None else [K.category_of(stream)]
        for category in cats:
            K.validate_stream(f"{category}-x")
        op = PurgeOp(stream, raw_stream, cats, list(tombstone), expected_version, meta, flags)
        result: PurgeResult = self._rec.submit(op)
        return result

    def purged(self, stream: str) -> bool:
        """Whether ``stream``'s partition was purged (it takes no more appends)."""
        return self._rec.purged(stream)

    def set_flags(self, stream: str, flags: dict[str, bool]) -> None:
        """Set (True) or clear (False) named markers of ``stream`` without appending an event;
        allowed on a purged stream (a marker holds no content)."""
        self._rec.submit(FlagsOp(stream, K.validate_stream(stream), dict(flags)))

    def save_snapshot(self, stream: str, version: int, state: bytes, part_count: int = 0,
                      parts: Mapping[int, bytes] | None = None) -> None:
        """Store ``state`` as the fold of ``stream`` up to ``version`` (replaces the previous one).
        ``part_count``: the parts (indices 0 to part_count - 1) that go with it, read back by
        :meth:`load_snapshot`; ``parts`` writes those of them that are new or changed (index ->
        bytes) in the same transaction, the others are the ones earlier snapshots wrote. A big
        state that mostly only grows (a long history) is written as parts once, not whole each time."""
        if part_count < 0 or any(not 0 <= i < part_count for i in (parts or {})):
            raise ValueError(f"snapshot parts must have indices below part_count {part_count}")
        self._rec.submit(SnapshotOp(K.validate_stream(stream), stream, version, state, part_count,
                                    dict(parts or {})))

    def next_epoch(self) -> int:
        """Draw and persist a new epoch (persisted before the server serves, so no two starts share one)."""
        floor = self._replica.epoch_floor() if self._replica is not None else 0
        value: int = self._rec.submit(MetaOp("epoch", floor))
        return value

    def rebuild_idempotency(self) -> int:
        """Rebuild the idempotency index by replaying the log; returns the receipts kept."""
        return self._rec.rebuild_idempotency()

    # --- reads ------------------------------------------------------------------------------------

    def stream_version(self, stream: str) -> int:
        """The stream's current version (0 when it has no events)."""
        return self._rec.stream_version(stream)

    def read_stream(self, stream: str, from_version: int = 1,
                    limit: int | None = None) -> list[RecordedEvent[EvT | UnknownEvent]]:
        """Events of ``stream`` with version >= ``from_version``, oldest first, at most ``limit``.

        Raises EventDecodeError naming stream and version for a corrupt payload.
        """
        out: list[RecordedEvent[EvT | UnknownEvent]] = []
        for rec, _last in self._rec.read_stream_records(stream, from_version, limit):
            for ev in self._expand(rec):
                if ev.version >= from_version:
                    out.append(ev)
                    if limit is not None and len(out) >= limit:
                        return out
        return out

    def last_event(self, stream: str) -> RecordedEvent[EvT | UnknownEvent] | None:
        version = self.stream_version(stream)
        if version == 0:
            return None
        events = self.read_stream(stream, version, 1)
        return events[0] if events else None

    def read_all(self, after: int = 0, limit: int = 1000) -> list[RecordedEvent[EvT | UnknownEvent]]:
        """Events of every stream with global position > ``after``, in commit order."""
        out: list[RecordedEvent[EvT | UnknownEvent]] = []
        for rec in self._rec.read_log_records(after, limit):
            for ev in self._expand(rec):
                if ev.position > after:
                    out.append(ev)
                    if len(out) >= limit:
                        return out
        return out

    def iter_all(self, after: int = 0, page: int = 1000) -> Iterator[RecordedEvent[EvT | UnknownEvent]]:
        """Every event after ``after``, read page by page (no transaction held between pages)."""
        while True:
            batch = self.read_all(after, page)
            if not batch:
                return
            yield from batch
            after = batch[-1].position

    def event_at(self, position: int) -> RecordedEvent[EvT | UnknownEvent] | None:
        rec = self._rec.record_at(position)
        if rec is None:
            return None
        return self._expand_one(rec, position - rec.first_position)

    def list_streams(self, category: str, after: str | None = None, limit: int = 100) -> StreamPage:
        """Stream names of a category in name order; pass ``next_after`` back for the next page."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        names, nxt = self._rec.list_streams(category, after, limit)
        return StreamPage(streams=names, next_after=nxt)

    def count_streams(self, category: str) -> int:
        return self._rec.count_streams(category)

    def stream_meta(self, stream: str) -> bytes | None:
        """The metadata record last written with an append to ``stream``."""
        return self._rec.get_stream_meta(stream)

    def scan_stream_meta(self) -> Iterator[tuple[str, bytes]]:
        """``(stream, metadata)`` of every stream that has one (short read transactions)."""
        return self._rec.scan_stream_meta()

    def flagged(self, flag: str) -> list[str]:
        """Streams whose ``flag`` is set (cost grows with the flagged streams, not all streams)."""
        return self._rec.flagged(flag)

    def load_snapshot(self, stream: str) -> Snapshot | None:
        found = self._rec.load_snapshot(stream)
        if found is None:
            return None
        rec, parts = found
        return Snapshot(stream, rec.version, rec.state, rec.at, tuple(parts))

    def get_receipt(self, scope: str, key: str) -> AppendResult | None:
        """The original result of an idempotent append, or None if the key is unknown (or
        expired, or its append was purged)."""
        v = self._rec.get_receipt(scope, key)
        if v is None or v.erased:
            return None
        return AppendResult(v.stream, v.first_version, v.last_version, v.first_position,
                            v.last_position, v.at, True, v.claim.receipt)

    def lookup_claim(self, claim: IdempotencyClaim) -> AppendResult | None:
        """The original result if ``claim``'s key was used before with the same body, None if
        the key is new; raises IdempotencyConflict if it was used with a different body, and
        StreamDeleted if the append it made was purged (a retry must not write it again)."""
        v = self._rec.get_receipt(claim.scope, claim.key)
        if v is None:
            return None
        if v.erased:
            raise StreamDeleted(v.stream)
        if v.claim.request_hash != claim.request_hash:
            raise IdempotencyConflict(claim.scope, claim.key)
        return AppendResult(v.stream, v.first_version, v.last_version, v.first_position,
                            v.last_position, v.at, True, v.claim.receipt)

    def read_feed(self, app: str, after: int = 0, limit: int = 100, *,
                  strict: bool = False) -> list[RecordedEvent[EvT | UnknownEvent]]:
        """The app's feed events with position > ``after`` (the stable cursor is the position).

        Retention (``feed_ttl_s``, ``feed_max_events``) takes the oldest entries out; with
        ``strict`` a read whose ``after`` lies below what it took (so events after ``after`` are
        gone) raises FeedCursorExpired carrying the oldest cursor that reads without a gap,
        checked in the same read transaction as the positions. Entries of a purged session are
        simply absent (never a reason to refuse)."""
        positions, floor = self._rec.read_feed_positions(app, after, limit)
        if strict and after < floor:
            raise FeedCursorExpired(app, after, floor)
        out: list[RecordedEvent[EvT | UnknownEvent]] = []
        for pos in positions:
            ev = self.event_at(pos)
            if ev is not None:
                out.append(ev)
        return out

    def feed_floor(self, app: str) -> int:
        """The last feed position of ``app`` retention took out (0: none yet): the oldest cursor
        a strict :meth:`read_feed` accepts."""
        return self._rec.read_feed_positions(app, MAX_POSITION, 1)[1]

    # --- the outbox (outbox.py) ------------------------------------------------------------------

    def read_outbox(self, shards: Sequence[int] | None = None, after: tuple[int, int] | None = None,
                    limit: int = 100, *, dead: bool = False, min_position: int = 0) -> list[OutboxItem]:
        """Owed deliveries (``dead``: the dead letters) of ``shards`` (None: every shard), in
        ``(shard, position)`` order, after ``after``, of global positions above ``min_position``."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return self._rec.read_outbox(dead, shards, after, limit, min_position)

    def ack_outbox(self, keys: Sequence[tuple[int, int]]) -> int:
        """Delete delivered entries, ``(shard, position)`` each; returns how many were there."""
        if not keys:
            return 0
        done: int = self._rec.submit(OutboxAckOp(list(keys)))
        return done

    def dead_letter(self, entries: Sequence[tuple[int, int, int, str]]) -> int:
        """Move entries ``(shard, position, attempts, last error)`` to the dead letters."""
        if not entries:
            return 0
        moved: int = self._rec.submit(OutboxDeadOp(list(entries)))
        return moved

    def replay_dead_letters(self, keys: Sequence[tuple[int, int]]) -> int:
        """Move dead letters back to the outbox, their clock started again; returns how many."""
        if not keys:
            return 0
        moved: int = self._rec.submit(OutboxReplayOp(list(keys)))
        return moved

    def audit(self) -> list[str]:
        """Whether the indexes agree with the log: one sentence per problem found, none when
        they do (reads the whole store in one read transaction: for tests and audits)."""
        return self._rec.audit()

    def export_jsonl(self, stream: str) -> Iterator[bytes]:
        """The stream as JSON lines: one object per event with its place in the log."""
        for ev in self.read_stream(stream):
            yield encode_json(
                {
                    "stream": ev.stream,
                    "version": ev.version,
                    "position": ev.position,
                    "at": ev.at,
                    "commitId": ev.commit_id,
                    "event": event_to_builtins(ev.event),
                }
            ) + b"\n"

    # --- helpers --------------------------------------------------------------------------------

    def _append_op(self, stream: str, events: Sequence[EvT], expected_version: int, commit_id: str | None,
                   idempotency: IdempotencyClaim | None, feed: str | None, meta: bytes | None,
                   flags: dict[str, bool] | None, outbox: OutboxMark | None = None) -> AppendOp:
        if not events:
            raise ValueError("append needs at least one event")
        if outbox is not None and len(outbox.flags) != len(events):
            raise ValueError("an outbox mark needs one flag per event")
        raw_stream = K.validate_stream(stream)
        feed_flags = [self._events.in_feed(e) for e in events] if feed is not None else []
        return AppendOp(stream, raw_stream, list(events), feed_flags, expected_version, commit_id, idempotency,
                        feed, meta, flags, outbox)

    def _expand(self, rec: CommitRecordIn) -> Iterator[RecordedEvent[EvT | UnknownEvent]]:
        for i in range(len(rec.events)):
            yield self._expand_one(rec, i)

    def _expand_one(self, rec: CommitRecordIn, i: int) -> RecordedEvent[EvT | UnknownEvent]:
        version = rec.first_version + i
        event = self._events.decode(rec.events[i], rec.stream, version)
        return RecordedEvent(rec.stream, version, rec.first_position + i, rec.at, event, rec.commit_id)
