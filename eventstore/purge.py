"""Purging a partition: the one write that takes data out of the append-only log.

What a purge of ``<category>-<partition>`` does, in the group's one write transaction (so a crash
leaves either everything or nothing of it, and no reader ever sees half):

* every stream of the partition in the given categories (``session-S``, ``approval-S.*``,
  ``task-S.*``) loses its commit records from ``log`` and their entries in ``streams``, its
  snapshot, its metadata record, its flags, its outbox entries and dead letters, its feed
  entries (the app's feed counts shrink with them) and, except the tombstone stream, its place in ``catalogue``;
* each idempotency claim those records held is *erased*: the entry stays under the same key
  digest and time (retention prunes it as before) with scope, key, request hash and receipt
  emptied, so a retry of the key is answered :class:`~eventstore.errors.StreamDeleted`, never
  with a second write;
* the tombstone stream gets one new commit record, the caller's tombstone events, at its next
  version and the next global position: versions and positions are never reused, the head never
  goes back, and a reader of the global log sees a gap where the purged records were (every
  reader already skips positions it does not find) and then the tombstone. The tombstone record
  lists the erased claims' digests, so rebuilding the idempotency index from the log keeps
  answering "deleted" for them;
* the partition is sealed (``meta``: ``sealed`` ‖ partition): every later append to any of its
  streams raises StreamDeleted, so an actor, task or approval that outlived the purge cannot
  write content back. Flags (``set_flags``) stay writable: they are markers, not content.

Why physical removal and not an erased payload kept in place, or crypto-shredding: every reader
(stream reads, the global log, the feed) already tolerates absent positions, the records are
found through the stream index in O(records of the partition), and a replicated log can do the
same (NATS JetStream purges a subject and keeps its sequence numbers). What it does not do:
LMDB does not zero the pages it frees; their bytes stay in the file until later commits reuse
them. ``EventStore.compact`` (``sessionloop compact``) swaps in a compacting copy of the
environment, a file without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from sessionloop.eventstore import keys as K
from sessionloop.eventstore.outbox import drop_positions
from sessionloop.eventstore.records import CommitRecordIn, IdempotencyClaim, IdemValue

if TYPE_CHECKING:
    from sessionloop.eventstore.batch import BatchContext, PurgeOp

_enc = msgspec.msgpack.Encoder()
_rec_dec = msgspec.msgpack.Decoder(CommitRecordIn)
_idem_dec = msgspec.msgpack.Decoder(IdemValue)
_any_dec = msgspec.msgpack.Decoder()

_EMPTY_CLAIM = IdempotencyClaim("", "", "")


def partition_streams(ctx: BatchContext, op: PurgeOp) -> dict[bytes, list[tuple[bytes, bytes]]]:
    """Raw stream name -> its ``(index key, log key)`` entries, for every stream of the op's
    partition in its categories (``<category>-<partition>`` and ``<category>-<partition>.*``)."""
    partition = K.partition_of(op.stream)
    shard = K.shard_of(op.stream, ctx.rec.shards)
    found: dict[bytes, list[tuple[bytes, bytes]]] = {}
    cur = ctx.txn.cursor(db=ctx.db["streams"])
    for category in op.categories:
        base = f"{category}-{partition}".encode("utf-8", "surrogatepass")
        prefix = K.stream_key(shard, base)
        if not cur.set_range(prefix):
            continue
        for key, logkey in cur:
            if not key.startswith(prefix):
                break
            raw = bytes(key[2:-9])
            if raw == base or raw.startswith(base + b"."):  # not another partition sharing the prefix
                found.setdefault(raw, []).append((bytes(key), bytes(logkey)))
    return found


def remove_records(ctx: BatchContext, entries: list[tuple[bytes, bytes]], erased: list[tuple[bytes, int]],
                   tombstone: str) -> int:
    """Delete one stream's commit records and their index, feed and idempotency entries; returns
    the events they held. Claims are erased (their digest and time appended to ``erased``)."""
    txn, db = ctx.txn, ctx.db
    events = 0
    for index_key, logkey in entries:
        raw = txn.get(logkey, db=db["log"])
        if raw is not None:
            try:
                rec: CommitRecordIn | None = _rec_dec.decode(raw)
            except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                rec = None  # a corrupt record goes too; what it indexed (if anything) points at nothing
            if rec is not None:
                events += len(rec.events)
                if rec.idem is not None:
                    _erase_claim(ctx, rec, erased, tombstone)
                if rec.feed is not None:
                    _drop_feed(ctx, rec)
                drop_positions(ctx, K.shard_of(rec.stream, ctx.rec.shards),
                               range(rec.first_position, rec.first_position + len(rec.events)))
            txn.delete(logkey, db=db["log"])
        txn.delete(index_key, db=db["streams"])
    return events


def _erase_claim(ctx: BatchContext, rec: CommitRecordIn, erased: list[tuple[bytes, int]], tombstone: str) -> None:
    assert rec.idem is not None
    ikey = K.idem_key(rec.idem.scope, rec.idem.key)
    raw = ctx.txn.get(ikey, db=ctx.db["idem"])
    if raw is None:
        return  # expired: retention already pruned it
    value = _idem_dec.decode(raw)
    if value.erased or value.stream != rec.stream or value.first_position != rec.first_position:
        return  # the key's entry belongs to another append
    ctx.txn.put(ikey, _enc.encode(erased_value(tombstone, value.at)), db=ctx.db["idem"])
    ctx.claims.pop(ikey, None)
    erased.append((ikey, value.at))


def erased_value(stream: str, at: int) -> IdemValue:
    """The index entry of a claim whose append was purged: only the stream and the time."""
    return IdemValue(_EMPTY_CLAIM, stream, 0, 0, 0, 0, at, True)


def _drop_feed(ctx: BatchContext, rec: CommitRecordIn) -> None:
    assert rec.feed is not None
    prefix = K.feed_prefix(rec.feed)
    dropped = sum(1 for i in range(len(rec.events))
                  if ctx.txn.delete(prefix + K.u64(rec.first_position + i), db=ctx.db["feed"]))
    if dropped:
        count_key = b"feedcount\x00" + prefix
        count = int(_any_dec.decode(ctx.txn.get(count_key, b"\x00", db=ctx.db["meta"])))
        ctx.txn.put(count_key, _enc.encode(max(0, count - dropped)), db=ctx.db["meta"])


def clear_stream(ctx: BatchContext, stream: str, raw_stream: bytes, keep_catalogue: bool) -> None:
    """Drop a purged stream's snapshot, metadata record, flags and (unless kept) catalogue entry."""
    txn, db = ctx.txn, ctx.db
    skey = K.stream_key(K.shard_of(stream, ctx.rec.shards), raw_stream)
    txn.delete(skey, db=db["snapshots"])
    parts = txn.cursor(db=db["snapshot_parts"])
    prefix = skey + b"\x00"
    found = parts.set_range(prefix)
    while found and bytes(parts.key()).startswith(prefix):
        found = parts.delete()
    txn.delete(skey, db=db["stream_meta"])
    clear_flags(txn, db["flags"], raw_stream)
    if not keep_catalogue:
        txn.delete(K.catalogue_key(K.category_of(stream), raw_stream), db=db["catalogue"])


def clear_flags(txn: Any, flags_db: Any, raw_stream: bytes) -> None:
    """Delete every flag of one stream. Flag keys are ``name ‖ 0x00 ‖ stream``: jump from one
    flag name to the next (few names, however many flagged streams) and look the stream up in each."""
    cur = txn.cursor(db=flags_db)
    found = cur.first()
    while found:
        name = bytes(cur.key()).split(b"\x00", 1)[0]
        target = name + b"\x00" + raw_stream
        if cur.set_key(target):
            cur.delete()
        found = cur.set_range(name + b"\x01")
