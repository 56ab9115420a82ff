"""The writes of one group's write transaction: the requests a writer hands the recorder
(``AppendOp``, ``PurgeOp``, ``FlagsOp``, ``SnapshotOp``, ``MetaOp``, pure data, so a group can
be redone after the map grew) and :class:`BatchContext`, which applies them to the transaction and keeps what the
group wrote so far (versions and receipts of earlier requests of the same group, and a witness
of every put, to find out after a failed commit whether the group is in the store).

No ``lmdb`` import: the transaction is handed in (the ``lmdb_*`` modules are the only ones that
import it); the retention helpers prune inside ordinary groups.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from sessionloop.eventstore import keys as K
from sessionloop.eventstore import purge as P
from sessionloop.eventstore.errors import IdempotencyConflict, StreamDeleted, WrongExpectedVersion
from sessionloop.eventstore.outbox import (
    OutboxAckOp,
    OutboxDeadOp,
    OutboxMark,
    OutboxReplayOp,
    apply_outbox_op,
    put_entries,
)
from sessionloop.eventstore.records import (
    AppendResult,
    CommitRecordIn,
    CommitRecordOut,
    IdempotencyClaim,
    IdemValue,
    PurgeResult,
    SnapshotRecord,
)

log = logging.getLogger("sessionloop.eventstore")

if TYPE_CHECKING:
    from sessionloop.eventstore.lmdb_recorder import LmdbRecorder

ANY_VERSION = -1

_enc = msgspec.msgpack.Encoder()
_idem_dec = msgspec.msgpack.Decoder(IdemValue)
_any_dec = msgspec.msgpack.Decoder()
_record_in = msgspec.msgpack.Decoder(CommitRecordIn)


class AppendOp(msgspec.Struct):
    """``events`` are Event structs (encoded once, inside the record) or pre-encoded ``Raw``."""

    stream: str
    raw_stream: bytes
    events: list[Any]
    feed_flags: list[bool]
    expected_version: int
    commit_id: str | None
    idem: IdempotencyClaim | None
    feed: str | None
    meta: bytes | None = None
    flags: dict[str, bool] | None = None
    #: the deliveries this append owes (``outbox.py``), written in its transaction
    outbox: OutboxMark | None = None
    #: the commit's time (ms) when it is not now: a commit materialized from the log keeps its own
    at: int | None = None
    #: the commit's first position when it is not the next one: a commit materialized from the log
    #: keeps the one its first writer gave it (so feed cursors mean the same on every node), and a
    #: commit the log already holds keeps the one it was published with when its group is applied
    #: again; one taken in the store (a log written before positions travelled) goes next
    position: int | None = None


class CompactOp(msgspec.Struct):
    """Rewrite the environment's file without its free pages (``LmdbRecorder.compact``); not a
    write of the group's transaction: the leader runs it after the group's other requests."""


class PurgeOp(msgspec.Struct):
    """Empty every stream of ``stream``'s partition in ``categories``, append ``events`` (the
    tombstone) to ``stream`` and seal the partition (see ``purge.py``)."""

    stream: str
    raw_stream: bytes
    categories: list[str]
    events: list[Any]
    expected_version: int
    meta: bytes | None = None
    flags: dict[str, bool] | None = None
    #: the tombstone's commit id (a store that follows a log gives every commit one)
    commit_id: str | None = None
    #: the tombstone's first position when it is not the next one (``AppendOp.position``)
    position: int | None = None


class FlagsOp(msgspec.Struct):
    """Set or clear named markers of a stream without an event (allowed on a sealed stream)."""

    stream: str
    raw_stream: bytes
    flags: dict[str, bool]


class SnapshotOp(msgspec.Struct):
    """Replace ``stream``'s snapshot: ``state`` with ``part_count`` parts, of which ``parts``
    (index -> bytes) are written now and the rest are kept from earlier snapshots."""

    raw_stream: bytes
    stream: str
    version: int
    state: bytes
    part_count: int = 0
    parts: dict[int, bytes] = {}


class MetaOp(msgspec.Struct):
    """Increment a counter in ``meta`` (used for epochs), to at least ``floor``; returns the new value."""

    name: str
    floor: int = 0


class BatchContext:
    """State of one group's write transaction: versions and receipts written so far in it.

    ``rec`` is the recorder leading the group (its databases, head and version cache are read
    here, written back by the recorder only once the group committed)."""

    def __init__(self, rec: LmdbRecorder, txn: Any, now_ms: int) -> None:
        self.rec = rec
        self.txn = txn
        self.db = rec._db
        self.versions: dict[bytes, int] = {}
        self.claims: dict[bytes, IdemValue] = {}
        # the log's last position: another worker process may have appended since this one's last
        # group, in an environment they share (the write transaction serializes them)
        self.head = rec._head if rec.owned_shards is None else _last_position(txn, self.db["log"])
        self.now = now_ms
        #: partitions this group purged (later requests of the group to their streams are refused)
        #: and the stream keys it purged (dropped from the recorder's version cache after commit)
        self.sealed: set[str] = set()
        self.purged: set[bytes] = set()
        #: (database, key, value) of a put each request made, to find out after a failed commit
        #: whether the group is in the store
        self.witnesses: list[tuple[str, bytes, bytes]] = []

    def _put(self, db: str, key: bytes, value: bytes, **kw: Any) -> None:
        self.txn.put(key, value, db=self.db[db], **kw)
        self.witnesses.append((db, key, value))

    def apply(self, op: AppendOp | PurgeOp | FlagsOp | SnapshotOp | MetaOp | OutboxAckOp | OutboxDeadOp
              | OutboxReplayOp) -> Any:
        if isinstance(op, AppendOp):
            return self.append(op)
        if isinstance(op, (OutboxAckOp, OutboxDeadOp, OutboxReplayOp)):
            return apply_outbox_op(self, op)
        if isinstance(op, PurgeOp):
            return self.purge(op)
        if isinstance(op, FlagsOp):
            self._put_flags(op.raw_stream, op.flags)
            return None
        if isinstance(op, SnapshotOp):
            skey = K.stream_key(K.shard_of(op.stream, self.rec.shards), op.raw_stream)
            record = SnapshotRecord(version=op.version, state=op.state, at=self.now, parts=op.part_count)
            for index, part in op.parts.items():
                self._put("snapshot_parts", K.snapshot_part_key(skey, index), part)
            self._put("snapshots", skey, _enc.encode(record))
            return None
        value = int(_any_dec.decode(self.txn.get(op.name.encode(), b"\x00", db=self.db["meta"]))) + 1
        value = max(value, op.floor)
        self._put("meta", op.name.encode(), _enc.encode(value))
        return value

    def _version(self, skey: bytes, stream: str) -> int:
        """The stream's version; raises StreamDeleted for a stream of a purged partition. A
        cached version is of a stream written since the store opened and not purged since (a
        purge drops its streams from the cache): only a cache miss reads the seal."""
        if self.sealed and K.partition_of(stream) in self.sealed:
            raise StreamDeleted(stream)
        v = self.versions.get(skey)
        if v is None:
            v = self.rec._versions.get(skey)
        if v is not None:
            return v
        if self.txn.get(K.seal_key(K.partition_of(stream)), db=self.db["meta"]) is not None:
            raise StreamDeleted(stream)
        return self.rec._current_version_uncached(self.txn, skey)

    def _duplicate(self, claim: IdempotencyClaim) -> AppendResult | None:
        ikey = K.idem_key(claim.scope, claim.key)
        found = self.claims.get(ikey)
        if found is None:
            raw = self.txn.get(ikey, db=self.db["idem"])
            found = None if raw is None else _idem_dec.decode(raw)
        if found is not None and found.erased:
            raise StreamDeleted(found.stream)  # the key's append was purged: never written again
        if found is None or found.claim.scope != claim.scope or found.claim.key != claim.key:
            return None
        if found.claim.request_hash != claim.request_hash:
            raise IdempotencyConflict(claim.scope, claim.key)
        return AppendResult(
            stream=found.stream,
            first_version=found.first_version,
            last_version=found.last_version,
            first_position=found.first_position,
            last_position=found.last_position,
            at=found.at,
            duplicate=True,
            receipt=found.claim.receipt,
        )

    def append(self, op: AppendOp) -> AppendResult:
        if op.idem is not None:
            dup = self._duplicate(op.idem)
            if dup is not None:
                return dup
        skey = K.stream_key(K.shard_of(op.stream, self.rec.shards), op.raw_stream)
        current = self._version(skey, op.stream)
        if op.expected_version != ANY_VERSION and op.expected_version != current:
            raise WrongExpectedVersion(op.stream, op.expected_version, current)
        return self._write(op, skey, current)

    def _write(self, op: AppendOp, skey: bytes, current: int,
               erased: list[tuple[bytes, int]] | None = None) -> AppendResult:
        n = len(op.events)
        at = self.now if op.at is None else op.at
        first_pos = self.head + 1 if op.position is None else op.position
        if first_pos <= self.head and self._taken(first_pos, first_pos + n - 1):
            # a commit of a log written before positions travelled with it, numbered here already
            log.warning("position %d of stream %r is taken in this store: the commit goes at %d", first_pos,
                        op.stream, self.head + 1)
            first_pos = self.head + 1
        last_pos = first_pos + n - 1
        first_v = current + 1
        last_v = current + n
        record = CommitRecordOut(
            stream=op.stream,
            first_version=first_v,
            first_position=first_pos,
            at=at,
            commit_id=op.commit_id,
            events=op.events,
            idem=op.idem,
            feed=op.feed,
            erased=erased,
        )
        logkey = K.u64(last_pos)
        txn, db = self.txn, self.db
        self._put("log", logkey, _enc.encode(record), append=last_pos > self.head)
        txn.put(K.index_key(skey, last_v), logkey, db=db["streams"])
        if current == 0:
            txn.put(K.catalogue_key(K.category_of(op.stream), op.raw_stream), K.u64(first_pos),
                    db=db["catalogue"])
        if op.feed is not None:
            self._index_feed(op, first_pos, at)
        if op.outbox is not None:
            put_entries(self, K.shard_of(op.stream, self.rec.shards), first_pos, op.outbox)
        if op.meta is not None:
            txn.put(skey, _enc.encode((op.stream, op.meta)), db=db["stream_meta"])
        if op.flags:
            self._put_flags(op.raw_stream, op.flags)
        receipt = op.idem.receipt if op.idem is not None else b""
        result = AppendResult(op.stream, first_v, last_v, first_pos, last_pos, at, False, receipt)
        if op.idem is not None:
            self._record_claim(op, result, at)
        self.versions[skey] = last_v
        self.head = max(self.head, last_pos)
        return result

    def _taken(self, first: int, last: int) -> bool:
        """Whether a record of the log holds a position from ``first`` to ``last`` (records are
        keyed by their last position: the first key from ``first`` on, and where it starts)."""
        cur = self.txn.cursor(db=self.db["log"])
        if not cur.set_range(K.u64(first)):
            return False
        if K.from_u64(cur.key()) <= last:
            return True
        return _record_in.decode(cur.value()).first_position <= last

    def _put_flags(self, raw_stream: bytes, flags: dict[str, bool]) -> None:
        for flag, on in flags.items():
            fkey = flag.encode() + b"\x00" + raw_stream
            if on:
                self.txn.put(fkey, b"", db=self.db["flags"])
            else:
                self.txn.delete(fkey, db=self.db["flags"])

    def purge(self, op: PurgeOp) -> PurgeResult:
        """See ``purge.py``. Every check runs before the first write: a refused purge (wrong
        expected version, already purged) leaves the group's transaction as it found it."""
        skey = K.stream_key(K.shard_of(op.stream, self.rec.shards), op.raw_stream)
        current = self._version(skey, op.stream)
        if op.expected_version != ANY_VERSION and op.expected_version != current:
            raise WrongExpectedVersion(op.stream, op.expected_version, current)
        found = P.partition_streams(self, op)
        erased: list[tuple[bytes, int]] = []
        records = events = 0
        names = []
        for raw, entries in sorted(found.items()):
            stream = raw.decode("utf-8", "surrogatepass")
            names.append(stream)
            records += len(entries)
            events += P.remove_records(self, entries, erased, op.stream)
            P.clear_stream(self, stream, raw, keep_catalogue=raw == op.raw_stream)
            purged_key = K.stream_key(K.shard_of(stream, self.rec.shards), raw)
            self.versions.pop(purged_key, None)
            self.purged.add(purged_key)
        if self.rec._on_purge is not None:
            self.rec._on_purge()  # the server's crash point ``purge``: records deleted, nothing committed
        self.versions[skey] = current  # the tombstone continues the stream's versions
        tombstone = self._write(AppendOp(op.stream, op.raw_stream, op.events, [], ANY_VERSION, op.commit_id, None,
                                         None, op.meta, op.flags, position=op.position), skey, current, erased)
        self.versions.pop(skey, None)
        self.purged.add(skey)
        partition = K.partition_of(op.stream)
        self.txn.put(K.seal_key(partition), K.u64(self.now), db=self.db["meta"])
        self.sealed.add(partition)
        return PurgeResult(tombstone, names, records, events)

    def _record_claim(self, op: AppendOp, result: AppendResult, at: int) -> None:
        assert op.idem is not None
        ikey = K.idem_key(op.idem.scope, op.idem.key)
        value = IdemValue(op.idem, op.stream, result.first_version, result.last_version,
                          result.first_position, result.last_position, at)
        self.txn.put(ikey, _enc.encode(value), db=self.db["idem"])
        self.txn.put(K.u64(at) + ikey, b"", db=self.db["idem_time"])
        self.claims[ikey] = value

    def _index_feed(self, op: AppendOp, first_pos: int, at: int) -> None:
        assert op.feed is not None
        prefix = K.feed_prefix(op.feed)
        stamp = K.u64(at)
        added = 0
        for i, flag in enumerate(op.feed_flags):
            if flag:
                self.txn.put(prefix + K.u64(first_pos + i), stamp, db=self.db["feed"])
                added += 1
        if not added:
            return
        count_key = b"feedcount\x00" + prefix
        count = int(_any_dec.decode(self.txn.get(count_key, b"\x00", db=self.db["meta"]))) + added
        excess = count - self.rec.feed_max_events
        if excess > 0:
            deleted, last = delete_prefix_head(self.txn, self.db["feed"], prefix, excess)
            count -= deleted
            raise_feed_floor(self.txn, self.db["meta"], prefix, last)
        self.txn.put(count_key, _enc.encode(count), db=self.db["meta"])


def _last_position(txn: Any, log_db: Any) -> int:
    cur = txn.cursor(db=log_db)
    return K.from_u64(cur.key()) if cur.last() else 0


def delete_prefix_head(txn: Any, db: Any, prefix: bytes, n: int,
                       older_than: int | None = None) -> tuple[int, int]:
    """Delete up to ``n`` of the first keys under ``prefix`` (those stamped before ``older_than``);
    ``(how many, the position of the last one deleted or 0)`` (keys are prefix ‖ u64 position)."""
    cur = txn.cursor(db=db)
    deleted = last = 0
    if not cur.set_range(prefix):
        return 0, 0
    while deleted < n and cur.key().startswith(prefix):
        if older_than is not None and K.from_u64(cur.value()) >= older_than:
            break
        key = bytes(cur.key())
        if not cur.delete():
            break
        deleted += 1
        last = K.from_u64(key, len(prefix)) if len(key) == len(prefix) + 8 else last
    return deleted, last


def raise_feed_floor(txn: Any, meta_db: Any, prefix: bytes, position: int) -> None:
    """Record that retention took the app's feed entries up to ``position`` out (never lowers it)."""
    if position <= 0:
        return
    key = K.FEED_FLOOR + prefix
    raw = txn.get(key, db=meta_db)
    if raw is None or K.from_u64(bytes(raw)) < position:
        txn.put(key, K.u64(position), db=meta_db)


def feed_apps(txn: Any, meta_db: Any) -> Iterator[bytes]:
    cur = txn.cursor(db=meta_db)
    if cur.set_range(b"feedcount\x00"):
        for key in cur.iternext(keys=True, values=False):
            if not key.startswith(b"feedcount\x00"):
                return
            yield key[len(b"feedcount\x00"):]


def prune_feed_age(txn: Any, dbs: dict[str, Any], prefix: bytes, cutoff: int, budget: int) -> int:
    deleted, last = delete_prefix_head(txn, dbs["feed"], prefix, budget, older_than=cutoff)
    if deleted:
        raise_feed_floor(txn, dbs["meta"], prefix, last)
        count_key = b"feedcount\x00" + prefix
        count = int(_any_dec.decode(txn.get(count_key, b"\x00", db=dbs["meta"])))
        txn.put(count_key, _enc.encode(max(0, count - deleted)), db=dbs["meta"])
    return deleted


def rebuilt_claims(records: Iterable[tuple[int, CommitRecordIn]],
                   cutoff: int) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    """The idempotency index (``idem`` and ``idem_time`` entries) as the log's records written
    at or after ``cutoff`` make it: each claim of a record, and each claim a purge's tombstone
    lists as erased (receipts live in the log, so replaying it rebuilds them)."""
    claims: dict[bytes, bytes] = {}
    times: dict[bytes, bytes] = {}
    for last, rec in records:
        for digest, at in rec.erased or ():
            if at >= cutoff:
                claims[digest] = _enc.encode(P.erased_value(rec.stream, at))
                times[K.u64(at) + digest] = b""
        if rec.idem is None or rec.at < cutoff:
            continue
        ikey = K.idem_key(rec.idem.scope, rec.idem.key)
        value = IdemValue(rec.idem, rec.stream, rec.first_version, rec.first_version + len(rec.events) - 1,
                          rec.first_position, last, rec.at)
        claims[ikey] = _enc.encode(value)
        times[K.u64(rec.at) + ikey] = b""
    return claims, times


def prune_idem(txn: Any, dbs: dict[str, Any], cutoff: int, budget: int) -> int:
    cur = txn.cursor(db=dbs["idem_time"])
    deleted = 0
    if not cur.first():
        return 0
    while deleted < budget:
        key = cur.key()
        if not key or K.from_u64(key) >= cutoff:
            break
        raw = txn.get(key[8:], db=dbs["idem"])
        if raw is not None and _idem_dec.decode(raw).at == K.from_u64(key):
            txn.delete(key[8:], db=dbs["idem"])
        if not cur.delete():
            break
        deleted += 1
    return deleted
