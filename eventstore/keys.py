"""The LMDB key layout: every key is ordered bytes (big-endian integers) so range scans are ordered.

=============  ==========================================  ======================================
database       key                                         value
=============  ==========================================  ======================================
``meta``       ascii name                                  msgpack value (format, shards, epoch)
``meta``       ``sealed`` ‖ 0x00 ‖ partition               time ms (u64) of the partition's purge
``log``        last global position of the commit (u64)    CommitRecord (one record per commit)
``streams``    shard (u16) ‖ stream ‖ 0x00 ‖ last version  log key of the commit holding it
``catalogue``  category ‖ 0x00 ‖ stream                    global position of the stream's birth
``snapshots``  shard (u16) ‖ stream                        SnapshotRecord
``snapshot_parts`` shard (u16) ‖ stream ‖ 0x00 ‖ index (u32)  one part of the stream's snapshot (bytes)
``idem``       sha256(scope ‖ 0x00 ‖ key)                  IdemValue (the receipt; erased: purged)
``idem_time``  time ms (u64) ‖ sha256                      empty (retention order)
``feed``       app ‖ 0x00 ‖ global position (u64)          time ms (u64)
``meta``       ``feedfloor`` ‖ 0x00 ‖ app ‖ 0x00              u64: the last position retention pruned
=============  ==========================================  ======================================

Session-stream keys begin with their shard, ``shard = crc32(partition) mod S`` where
the partition of ``approval-<session>.<n>`` is ``<session>``, so a session's approvals and tasks
live on its shard and a shard can be moved or served alone. A partition's streams of one category
are adjacent in ``streams`` (``<category>-<partition>`` and ``<category>-<partition>.<n>``), which
is how a purge finds them.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

from sessionloop.eventstore.errors import InvalidStreamName

_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
MAX_STREAM_BYTES = 400  # LMDB keys are at most 511 bytes; leave room for shard and version
MAX_VERSION = (1 << 64) - 1


def validate_stream(stream: str) -> bytes:
    """The UTF-8 bytes of a stream name; raises InvalidStreamName when it cannot be a key."""
    if not isinstance(stream, str) or not stream:
        raise InvalidStreamName(str(stream), "must be a non-empty string")
    if "\x00" in stream:
        raise InvalidStreamName(stream, "must not contain NUL")
    raw = stream.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_STREAM_BYTES:
        raise InvalidStreamName(stream, f"longer than {MAX_STREAM_BYTES} bytes")
    if "-" not in stream or stream.startswith("-"):
        raise InvalidStreamName(stream, "must look like <category>-<id>")
    return raw


def category_of(stream: str) -> str:
    return stream.split("-", 1)[0]


def partition_of(stream: str) -> str:
    """The id whose hash picks the shard: ``approval-S.N`` shares the shard of ``session-S``."""
    return stream.split("-", 1)[1].split(".", 1)[0]


def shard_of(stream: str, shards: int) -> int:
    return zlib.crc32(partition_of(stream).encode("utf-8", "surrogatepass")) % shards


def stream_key(shard: int, raw_stream: bytes) -> bytes:
    return _U16.pack(shard) + raw_stream


def index_key(skey: bytes, last_version: int) -> bytes:
    return skey + b"\x00" + _U64.pack(last_version)


def index_version(key: bytes) -> int:
    return int(_U64.unpack_from(key, len(key) - 8)[0])


def snapshot_part_key(skey: bytes, index: int) -> bytes:
    """``snapshot_parts`` key of part ``index`` of the snapshot at stream key ``skey``."""
    return skey + b"\x00" + _U32.pack(index)


def u64(value: int) -> bytes:
    return _U64.pack(value)


def from_u64(raw: bytes, offset: int = 0) -> int:
    return int(_U64.unpack_from(raw, offset)[0])


def catalogue_key(category: str, raw_stream: bytes) -> bytes:
    return category.encode("utf-8") + b"\x00" + raw_stream


#: meta key prefix of an app's feed floor (``feedfloor\\0 ‖ feed prefix`` -> u64): the position of
#: the last feed entry retention took out (7 days or the per-app cap). A cursor below it would miss
#: events, so reads after it are refused (a purge's entries do not count: the session is gone)
FEED_FLOOR = b"feedfloor\x00"


def feed_prefix(app: str) -> bytes:
    return app.encode("utf-8", "surrogatepass") + b"\x00"


def seal_key(partition: str) -> bytes:
    """The ``meta`` key marking a purged partition: its streams take no more writes."""
    return b"sealed\x00" + partition.encode("utf-8", "surrogatepass")


def idem_key(scope: str, key: str) -> bytes:
    """Idempotency keys may be 512 characters (2 KiB of UTF-8), beyond LMDB's key limit: hash them."""
    return hashlib.sha256(
        scope.encode("utf-8", "surrogatepass") + b"\x00" + key.encode("utf-8", "surrogatepass")
    ).digest()
