"""The event store's read paths over LMDB: short read transactions, copied out, never held.

Every read opens a read transaction, copies what it needs out and closes it; none is held across a
wait. Each passes the recorder's :class:`~eventstore.lmdb_env.ReadGate` (a resize of the map, a
reopen after a fatal commit error and a compaction close it while they run), and none may run once
the store is closed, or after a write the store could not confirm took its environment down
(``StorageUnavailable(reason="stopped")`` until a restart).

:class:`LmdbReads` is the read half of :class:`~eventstore.lmdb_recorder.LmdbRecorder`, which
inherits it: the recorder owns the environment (it opens it, and opens it again), these methods only
read the attributes declared here. A corrupt commit record raises :class:`EventDecodeError` naming
where it is; no ``lmdb`` or ``msgspec`` error escapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import lmdb
import msgspec

from sessionloop.eventstore import keys as K
from sessionloop.eventstore.audit import check as check_store
from sessionloop.eventstore.errors import STOPPED_RETRY_AFTER_MS, EventDecodeError, StorageUnavailable, StoreClosed
from sessionloop.eventstore.lmdb_env import ReadGate
from sessionloop.eventstore.outbox import OutboxItem, read_entries
from sessionloop.eventstore.records import CommitRecordIn, IdemValue, SnapshotRecord

__all__ = ["LmdbReads"]

_rec_dec = msgspec.msgpack.Decoder(CommitRecordIn)
_idem_dec = msgspec.msgpack.Decoder(IdemValue)
_snap_dec = msgspec.msgpack.Decoder(SnapshotRecord)
_any_dec = msgspec.msgpack.Decoder()


class LmdbReads:
    """The read paths of the recorder (mixed into :class:`~eventstore.lmdb_recorder.LmdbRecorder`)."""

    # owned and set by the recorder (lmdb_recorder.py): its path, the environment and named
    # databases it opened, their shard count, the gate, and whether reads may run
    path: str
    shards: int
    _env: lmdb.Environment
    _db: dict[str, Any]
    _gate: ReadGate
    _closed: bool
    _env_usable: bool

    def _read(self) -> ReadGate:
        if self._closed:
            raise StoreClosed()
        if not self._env_usable:
            raise StorageUnavailable("the event store stopped after a write it could not confirm; it can be "
                                     f"read again after a restart (retry after {STOPPED_RETRY_AFTER_MS} ms)",
                                     reason="stopped", retry_after_ms=STOPPED_RETRY_AFTER_MS, path=self.path)
        return self._gate

    def stream_key(self, stream: str) -> bytes:
        return K.stream_key(K.shard_of(stream, self.shards), K.validate_stream(stream))

    def stream_version(self, stream: str) -> int:
        skey = self.stream_key(stream)
        with self._read(), self._env.begin() as txn:
            return self._current_version_uncached(txn, skey)

    def _current_version_uncached(self, txn: Any, skey: bytes) -> int:
        cur = txn.cursor(db=self._db["streams"])
        if cur.set_range(K.index_key(skey, K.MAX_VERSION)):
            ok = cur.prev()
        else:
            ok = cur.last()
        if ok and cur.key()[:-9] == skey:
            return K.index_version(cur.key())
        return 0

    def read_stream_records(
        self, stream: str, from_version: int = 1, limit: int | None = None
    ) -> Iterator[tuple[CommitRecordIn, int]]:
        """Commit records holding versions >= ``from_version``, with their last position."""
        skey = self.stream_key(stream)
        out: list[tuple[CommitRecordIn, int]] = []
        seen = 0
        with self._read(), self._env.begin() as txn:
            cur = txn.cursor(db=self._db["streams"])
            logdb = self._db["log"]
            if not cur.set_range(K.index_key(skey, max(from_version, 1))):
                return iter(())
            for key, logkey in cur:
                if key[:-9] != skey:
                    break
                raw = txn.get(logkey, db=logdb)
                if raw is None:  # an index entry whose record is gone: what audit() reports
                    raise EventDecodeError(stream, K.index_version(key), "indexed, but its commit record is missing")
                rec = _decode_record(raw, stream, K.index_version(key))
                out.append((rec, K.from_u64(logkey)))
                seen += K.index_version(key) - max(rec.first_version, from_version) + 1
                if limit is not None and seen >= limit:
                    break
        return iter(out)

    def read_log_records(self, after: int, limit: int) -> list[CommitRecordIn]:
        out: list[CommitRecordIn] = []
        seen = 0
        with self._read(), self._env.begin(db=self._db["log"]) as txn:
            cur = txn.cursor()
            if not cur.set_range(K.u64(after + 1)):
                return out
            for key, value in cur:
                rec = _decode_record(value, "<log>", K.from_u64(key), "position")
                out.append(rec)
                seen += K.from_u64(key) - max(rec.first_position, after + 1) + 1
                if seen >= limit:
                    break
        return out

    def record_at(self, position: int) -> CommitRecordIn | None:
        with self._read(), self._env.begin(db=self._db["log"]) as txn:
            cur = txn.cursor()
            if not cur.set_range(K.u64(position)):
                return None
            rec = _decode_record(cur.value(), "<log>", K.from_u64(cur.key()), "position")
            return rec if rec.first_position <= position else None

    def list_streams(self, category: str, after: str | None, limit: int) -> tuple[list[str], str | None]:
        prefix = category.encode("utf-8") + b"\x00"
        start = prefix + (after.encode("utf-8", "surrogatepass") + b"\x00" if after else b"")
        names: list[str] = []
        with self._read(), self._env.begin(db=self._db["catalogue"]) as txn:
            cur = txn.cursor()
            if cur.set_range(start):
                for key in cur.iternext(keys=True, values=False):
                    if not key.startswith(prefix):
                        break
                    if len(names) == limit:
                        return names, names[-1]
                    names.append(key[len(prefix):].decode("utf-8", "surrogatepass"))
        return names, None

    def count_streams(self, category: str) -> int:
        prefix = category.encode("utf-8") + b"\x00"
        n = 0
        with self._read(), self._env.begin(db=self._db["catalogue"]) as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for key in cur.iternext(keys=True, values=False):
                    if not key.startswith(prefix):
                        break
                    n += 1
        return n

    def load_snapshot(self, stream: str) -> tuple[SnapshotRecord, list[bytes]] | None:
        """The stream's snapshot record and its parts, read in one transaction (so they agree)."""
        skey = self.stream_key(stream)
        parts_db = self._db.get("snapshot_parts")
        with self._read(), self._env.begin() as txn:
            raw = txn.get(skey, db=self._db["snapshots"])
            if raw is None:
                return None
            record = _snap_dec.decode(raw)
            parts: list[bytes] = []
            for index in range(record.parts):
                part = txn.get(K.snapshot_part_key(skey, index), db=parts_db) if parts_db is not None else None
                if part is None:
                    raise EventDecodeError(stream, record.version,
                                           f"its snapshot's part {index} of {record.parts} is missing")
                parts.append(bytes(part))
        return record, parts

    def get_receipt(self, scope: str, key: str) -> IdemValue | None:
        with self._read(), self._env.begin(db=self._db["idem"]) as txn:
            raw = txn.get(K.idem_key(scope, key))
        if raw is None:
            return None
        value = _idem_dec.decode(raw)
        if value.erased:
            return value
        if value.claim.scope != scope or value.claim.key != key:
            return None
        return value

    def purged(self, stream: str) -> bool:
        """Whether the stream's partition was purged (sealed)."""
        K.validate_stream(stream)
        with self._read(), self._env.begin(db=self._db["meta"]) as txn:
            return txn.get(K.seal_key(K.partition_of(stream))) is not None

    def read_outbox(self, dead: bool, shards: Iterable[int] | None, after: tuple[int, int] | None,
                    limit: int, min_position: int = 0) -> list[OutboxItem]:
        """Entries of the outbox (or the dead letters) of ``shards`` (None: all), in key order."""
        wanted = range(self.shards) if shards is None else shards
        db = self._db.get("dead" if dead else "outbox")
        if db is None:  # an older store opened read-only (``lmdb_env.LATER_DATABASES``)
            return []
        with self._read(), self._env.begin() as txn:
            return read_entries(txn, db, wanted, after, limit, min_position)

    def read_feed_positions(self, app: str, after: int, limit: int) -> tuple[list[int], int]:
        """The app's feed positions above ``after`` (at most ``limit``) and its floor (the last
        position retention took out, 0 when none), read in one transaction so they agree."""
        prefix = K.feed_prefix(app)
        out: list[int] = []
        with self._read(), self._env.begin(db=self._db["feed"]) as txn:
            raw = txn.get(K.FEED_FLOOR + prefix, db=self._db["meta"])
            floor = K.from_u64(bytes(raw)) if raw is not None else 0
            cur = txn.cursor()
            if not cur.set_range(prefix + K.u64(after + 1)):
                return out, floor
            for key in cur.iternext(keys=True, values=False):
                if not key.startswith(prefix) or len(key) != len(prefix) + 8:
                    break
                out.append(K.from_u64(key, len(prefix)))
                if len(out) >= limit:
                    break
        return out, floor

    def get_stream_meta(self, stream: str) -> bytes | None:
        skey = self.stream_key(stream)
        with self._read(), self._env.begin(db=self._db["stream_meta"]) as txn:
            raw = txn.get(skey)
        return None if raw is None else bytes(_any_dec.decode(raw)[1])

    def scan_stream_meta(self, page: int = 2000) -> Iterator[tuple[str, bytes]]:
        """Every stream's metadata record, in shard order, read in short transactions."""
        after: bytes | None = None
        while True:
            rows: list[tuple[str, bytes]] = []
            with self._read(), self._env.begin(db=self._db["stream_meta"]) as txn:
                cur = txn.cursor()
                found = cur.set_range(after + b"\x00") if after is not None else cur.first()
                if found:
                    for key, value in cur:
                        stream, meta = _any_dec.decode(value)
                        rows.append((stream, meta))
                        after = bytes(key)
                        if len(rows) >= page:
                            break
            yield from rows
            if len(rows) < page:
                return

    def flagged(self, flag: str) -> list[str]:
        prefix = flag.encode() + b"\x00"
        out: list[str] = []
        with self._read(), self._env.begin(db=self._db["flags"]) as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for key in cur.iternext(keys=True, values=False):
                    if not key.startswith(prefix):
                        break
                    out.append(key[len(prefix):].decode("utf-8", "surrogatepass"))
        return out

    def audit(self) -> list[str]:
        """``audit.check`` over the whole store in one read transaction."""
        with self._read(), self._env.begin() as txn:
            return check_store(txn, self._db, self.shards)

    def read_meta(self, name: str) -> Any:
        with self._read(), self._env.begin(db=self._db["meta"]) as txn:
            raw = txn.get(name.encode())
        return None if raw is None else _any_dec.decode(raw)

    def iter_all_records(self) -> Iterator[tuple[int, CommitRecordIn]]:
        """Every commit record in log order, read in short transactions of 1,000 records."""
        after = 0
        while True:
            page = self.read_log_records(after, 1000)
            if not page:
                return
            for rec in page:
                last = rec.first_position + len(rec.events) - 1
                yield last, rec
                after = last


def _decode_record(raw: bytes, stream: str, where: int, unit: str = "version") -> CommitRecordIn:
    try:
        return _rec_dec.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as e:
        if unit == "position":
            raise EventDecodeError(stream, where, f"corrupt commit record ending at position {where} ({e})") from e
        raise EventDecodeError(stream, where, f"corrupt commit record ({e})") from e

