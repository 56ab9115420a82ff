"""The outbox: deliveries owed to someone outside (a webhook's receiver), written in the commit of
the events they announce, so a crash between the commit and the delivery loses none.

=============  ==========================================  ======================================
database       key                                         value
=============  ==========================================  ======================================
``outbox``     shard (u16) ‖ global position (u64)         OutboxRecord (owed, not yet delivered)
``dead``       shard (u16) ‖ global position (u64)         OutboxRecord (given up: a dead letter)
=============  ==========================================  ======================================

An append that names an :class:`OutboxMark` puts one ``outbox`` entry per event its flags mark, in
the same write transaction as the events. Whoever delivers reads the entries of its shards
(:func:`read_entries`), delivers, and then acknowledges (:class:`OutboxAckOp`: the entry goes) or
gives up (:class:`OutboxDeadOp`: the entry moves to ``dead`` with its attempts and last error);
:class:`OutboxReplayOp` moves dead letters back to the outbox, their clock started again. The
shard leads the key so each worker process of a shared store reads only its own shards' entries.

What an entry announces is the event at its position (``EventStore.event_at``); a purge deletes
the entries of the records it removes. Generic: ``target`` is an opaque name (an app id).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from sessionloop.eventstore import keys as K

if TYPE_CHECKING:
    from sessionloop.eventstore.batch import BatchContext

__all__ = [
    "MAX_ERROR_CHARS",
    "OutboxAckOp",
    "OutboxDeadOp",
    "OutboxItem",
    "OutboxMark",
    "OutboxRecord",
    "OutboxReplayOp",
    "apply_outbox_op",
    "drop_positions",
    "put_entries",
    "read_entries",
]

_U16 = struct.Struct(">H")
_enc = msgspec.msgpack.Encoder()
#: the last error kept with an entry is cut to this many characters
MAX_ERROR_CHARS = 500


class OutboxMark(msgspec.Struct, frozen=True):
    """What an append owes: one delivery to ``target`` per event whose flag is true."""

    target: str
    flags: list[bool]


class OutboxRecord(msgspec.Struct, frozen=True, array_like=True):
    """An entry's value. ``since``: when its clock started (ms: the commit, or its replay);
    ``attempts`` and ``error``: the failed deliveries so far and the last one's sentence (written
    when it becomes a dead letter); ``dead_at``: when it did (0 in the outbox)."""

    target: str
    since: int
    attempts: int = 0
    error: str = ""
    dead_at: int = 0


_record_dec = msgspec.msgpack.Decoder(OutboxRecord)


class OutboxItem(msgspec.Struct, frozen=True):
    """An entry as a read hands it back: where it is and what its record says."""

    shard: int
    position: int
    target: str
    since: int
    attempts: int = 0
    error: str = ""
    dead_at: int = 0


class OutboxAckOp(msgspec.Struct):
    """Delete delivered entries: ``(shard, position)`` each (absent ones are skipped)."""

    keys: list[tuple[int, int]]


class OutboxDeadOp(msgspec.Struct):
    """Move entries to the dead letters: ``(shard, position, attempts, last error)`` each."""

    entries: list[tuple[int, int, int, str]]


class OutboxReplayOp(msgspec.Struct):
    """Move dead letters back to the outbox with a fresh clock; returns how many moved."""

    keys: list[tuple[int, int]]


OutboxOp = OutboxAckOp | OutboxDeadOp | OutboxReplayOp


def entry_key(shard: int, position: int) -> bytes:
    return _U16.pack(shard) + K.u64(position)


def put_entries(ctx: BatchContext, shard: int, first_position: int, mark: OutboxMark) -> None:
    """The outbox entries of one append (inside its write transaction)."""
    value = _enc.encode(OutboxRecord(mark.target, ctx.now))
    for i, flag in enumerate(mark.flags):
        if flag:
            ctx.txn.put(entry_key(shard, first_position + i), value, db=ctx.db["outbox"])


def apply_outbox_op(ctx: BatchContext, op: OutboxOp) -> int:
    """Apply one outbox op in the group's transaction; returns the entries it changed."""
    txn, outbox, dead = ctx.txn, ctx.db["outbox"], ctx.db["dead"]
    changed = 0
    if isinstance(op, OutboxAckOp):
        for shard, position in op.keys:
            changed += bool(txn.delete(entry_key(shard, position), db=outbox))
        return changed
    if isinstance(op, OutboxDeadOp):
        for shard, position, attempts, error in op.entries:
            key = entry_key(shard, position)
            raw = txn.get(key, db=outbox)
            if raw is None:
                continue
            rec = _record_dec.decode(raw)
            moved = OutboxRecord(rec.target, rec.since, attempts, error[:MAX_ERROR_CHARS], ctx.now)
            txn.put(key, _enc.encode(moved), db=dead)
            txn.delete(key, db=outbox)
            changed += 1
        return changed
    for shard, position in op.keys:
        key = entry_key(shard, position)
        raw = txn.get(key, db=dead)
        if raw is None:
            continue
        rec = _record_dec.decode(raw)
        txn.put(key, _enc.encode(OutboxRecord(rec.target, ctx.now)), db=outbox)
        txn.delete(key, db=dead)
        changed += 1
    return changed


def drop_positions(ctx: BatchContext, shard: int, positions: Iterable[int]) -> None:
    """A purge's part: the outbox entries and dead letters of the records it removes."""
    for position in positions:
        key = entry_key(shard, position)
        ctx.txn.delete(key, db=ctx.db["outbox"])
        ctx.txn.delete(key, db=ctx.db["dead"])


def read_entries(txn: Any, db: Any, shards: Iterable[int], after: tuple[int, int] | None,
                 limit: int, min_position: int = 0) -> list[OutboxItem]:
    """Up to ``limit`` entries of ``db`` in the given shards, in key order (shard, then
    position), strictly after ``after`` when it is given, of positions above ``min_position``."""
    out: list[OutboxItem] = []
    cur = txn.cursor(db=db)
    for shard in sorted(set(shards)):
        if after is not None and shard < after[0]:
            continue
        prefix = _U16.pack(shard)
        first = max(min_position, after[1] if after is not None and shard == after[0] else 0)
        start = entry_key(shard, first + 1) if first else prefix
        if not cur.set_range(start):
            continue
        for key, raw in cur:
            if not key.startswith(prefix) or len(key) != 10:
                break
            rec = _record_dec.decode(raw)
            out.append(OutboxItem(shard, K.from_u64(key, 2), rec.target, rec.since, rec.attempts,
                                  rec.error, rec.dead_at))
            if len(out) >= limit:
                return out
    return out
