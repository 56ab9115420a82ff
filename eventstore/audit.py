"""A consistency check of the whole store: do the indexes agree with the log?

Read in one read transaction over every database (for tests and the reliability harness, not
for a serving hot path: it reads the whole store). Each problem is one sentence naming where it
is; an empty list means: every commit record is where its last position says, indexed under its
stream and last version; every index, feed, idempotency, snapshot, metadata, flag and catalogue
entry, outbox entry and dead letter points at a stream or record that exists. No ``lmdb`` import:
the recorder hands in the transaction and its databases.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sessionloop.eventstore import keys as K
from sessionloop.eventstore.records import CommitRecordIn, IdemValue

_rec_dec = msgspec.msgpack.Decoder(CommitRecordIn)
_idem_dec = msgspec.msgpack.Decoder(IdemValue)
_any_dec = msgspec.msgpack.Decoder()

MAX_PROBLEMS = 50


def check(txn: Any, dbs: dict[str, Any], shards: int) -> list[str]:
    problems: list[str] = []
    records = _check_log(txn, dbs, shards, problems)
    streams = _check_index(txn, dbs, records, problems)
    _check_feed(txn, dbs, records, problems)
    _check_outbox(txn, dbs, shards, records, problems)
    _check_idem(txn, dbs, records, problems)
    _check_stream_keyed(txn, dbs, shards, streams, problems)
    return problems[:MAX_PROBLEMS]


def _check_log(txn: Any, dbs: dict[str, Any], shards: int, problems: list[str]) -> dict[int, CommitRecordIn]:
    """Every record, by its last position; checks it ends where its key says and is indexed."""
    records: dict[int, CommitRecordIn] = {}
    previous = 0
    for key, value in txn.cursor(db=dbs["log"]):
        last = K.from_u64(key)
        rec = _rec_dec.decode(value)
        if not rec.events or rec.first_position + len(rec.events) - 1 != last or rec.first_position <= previous:
            problems.append(f"log record at position {last} ({rec.stream}) does not cover the positions its key says")
        previous = last
        records[last] = rec
        raw = rec.stream.encode("utf-8", "surrogatepass")
        index = K.index_key(K.stream_key(K.shard_of(rec.stream, shards), raw), rec.first_version + len(rec.events) - 1)
        if txn.get(index, db=dbs["streams"]) != bytes(key):
            problems.append(f"log record at position {last} ({rec.stream}) is not in the stream index")
    return records


def _check_index(txn: Any, dbs: dict[str, Any], records: dict[int, CommitRecordIn], problems: list[str]) -> set[bytes]:
    """Stream keys (shard ‖ stream) that have events; checks each entry points at its record."""
    streams: set[bytes] = set()
    for key, logkey in txn.cursor(db=dbs["streams"]):
        skey, version = bytes(key[:-9]), K.index_version(key)
        streams.add(skey)
        rec = records.get(K.from_u64(logkey))
        name = skey[2:].decode("utf-8", "surrogatepass")
        if rec is None or rec.stream != name or rec.first_version + len(rec.events) - 1 != version:
            problems.append(f"index entry {name} v{version} points at no record of that stream and version")
    return streams


def _covering(records: dict[int, CommitRecordIn], ends: list[int], position: int) -> CommitRecordIn | None:
    lo, hi = 0, len(ends)
    while lo < hi:  # the first record ending at or after ``position``
        mid = (lo + hi) // 2
        if ends[mid] < position:
            lo = mid + 1
        else:
            hi = mid
    if lo == len(ends):
        return None
    rec = records[ends[lo]]
    return rec if rec.first_position <= position else None


def _check_feed(txn: Any, dbs: dict[str, Any], records: dict[int, CommitRecordIn], problems: list[str]) -> None:
    ends = sorted(records)
    counts: dict[bytes, int] = {}
    for key in txn.cursor(db=dbs["feed"]).iternext(keys=True, values=False):
        prefix, position = bytes(key[:-8]), K.from_u64(key, len(key) - 8)
        counts[prefix] = counts.get(prefix, 0) + 1
        rec = _covering(records, ends, position)
        if rec is None or rec.feed is None or K.feed_prefix(rec.feed) != prefix:
            app = prefix[:-1].decode(errors="replace")
            problems.append(f"feed entry {app}@{position} points at no event of that app")
    for prefix, n in counts.items():
        stored = txn.get(b"feedcount\x00" + prefix, db=dbs["meta"])
        if stored is None or int(_any_dec.decode(stored)) != n:
            problems.append(f"feed count of {prefix[:-1].decode(errors='replace')} is not its {n} entries")


def _check_outbox(txn: Any, dbs: dict[str, Any], shards: int, records: dict[int, CommitRecordIn],
                  problems: list[str]) -> None:
    """Every outbox entry and dead letter points at an event of a stream of its key's shard."""
    ends = sorted(records)
    for name in ("outbox", "dead"):
        db = dbs.get(name)
        if db is None:  # an older store opened read-only
            continue
        for key in txn.cursor(db=db).iternext(keys=True, values=False):
            shard, position = int.from_bytes(key[:2], "big"), K.from_u64(key, 2)
            rec = _covering(records, ends, position)
            if rec is None or K.shard_of(rec.stream, shards) != shard:
                problems.append(f"{name} entry {shard}.{position} points at no event of its shard")


def _check_idem(txn: Any, dbs: dict[str, Any], records: dict[int, CommitRecordIn], problems: list[str]) -> None:
    for key, value in txn.cursor(db=dbs["idem"]):
        v = _idem_dec.decode(value)
        if v.erased:
            if v.claim.scope or v.claim.key or v.claim.request_hash or v.claim.receipt:
                problems.append(f"erased idempotency entry of {v.stream} still holds its claim")
            continue
        rec = records.get(v.last_position)
        if rec is None or rec.stream != v.stream or rec.idem is None or \
                K.idem_key(rec.idem.scope, rec.idem.key) != bytes(key):
            problems.append(f"idempotency entry of {v.stream} (position {v.last_position}) points at no record with it")


def _check_stream_keyed(txn: Any, dbs: dict[str, Any], shards: int, streams: set[bytes], problems: list[str]) -> None:
    """Snapshots, metadata records, flags and catalogue entries belong to streams with events."""
    for db in ("snapshots", "stream_meta"):
        for key in txn.cursor(db=dbs[db]).iternext(keys=True, values=False):
            if bytes(key) not in streams:
                problems.append(f"{db} entry of {bytes(key[2:]).decode(errors='replace')} belongs to no stream")
    for key in txn.cursor(db=dbs["snapshot_parts"]).iternext(keys=True, values=False):
        if bytes(key[:-5]) not in streams:
            problems.append(f"snapshot part of {bytes(key[2:-5]).decode(errors='replace')} belongs to no stream")
    for db in ("flags", "catalogue"):
        for key in txn.cursor(db=dbs[db]).iternext(keys=True, values=False):
            name = bytes(key).split(b"\x00", 1)[1]
            stream = name.decode("utf-8", "surrogatepass")
            if K.stream_key(K.shard_of(stream, shards), name) not in streams:
                problems.append(f"{db} entry {bytes(key).decode(errors='replace')} belongs to no stream")
