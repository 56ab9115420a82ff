"""Shard leases in a JetStream key-value bucket, and the fenced append of a shard's owner (issue 23).

Theory of operation:

* the bucket ``SL_LEASES`` keeps one key per leased shard, ``shard.<n>``, whose value is the
  owner's node id; the bucket's TTL (``max_age``) removes a lease nobody renewed;
* ``acquire(shard, node)`` is ``kv.create``: it fails while another node's lease holds
  (:class:`~eventstore.errors.LeaseHeld`), and its revision is the lease's **epoch**. The
  revision is the bucket stream's sequence, so a later owner of the shard always has a higher
  epoch than every earlier one. A lease under the node's own name (a create whose answer was
  lost, the node before a restart) is taken on by ``kv.update(last=revision)``: a new epoch;
* ``renew`` is ``kv.update(last=revision)``: it fails (:class:`~eventstore.errors.LeaseLost`) once
  the key expired or another node took it; ``release`` deletes the key with the last revision;
* the owner also keeps a local deadline, taken on its monotonic clock when the request left and
  shortened by a guard (``guard`` of the TTL), so a node that was paused past its lease refuses
  to write before it asks the server anything.

:class:`ShardOwner` is a node's view: it appends only to streams of shards whose lease it holds,
inside the local deadline, and the server fences every append per shard:

* taking a shard, the owner writes a takeover marker on the shard's fence subject
  ``sl.log.<shard>._fence`` (``JetStreamLog.write_fence``) and remembers its sequence;
* every append carries ``Nats-Expected-Last-Subject-Sequence`` with
  ``Nats-Expected-Last-Subject-Sequence-Subject: sl.log.<shard>.>``: the server checks that the
  last message on any subject of the shard (every stream of it, and its fence) is the owner's
  own last write there (nats-server's ``store.LoadLastMsg`` on the filter; stream.go). The owner's
  appends to one shard go one at a time, each expecting the one before;
* so after a new owner's fence, every append of an earlier owner, to any stream of the shard and
  whether or not the new owner wrote that stream, is refused; the earlier owner drops the shard
  (``LeaseLost``). A stale owner that passed its local deadline check and then stalled is
  refused by the server, not by its clock.

The fence point is the new owner's marker: a commit of the old owner that reached the server
before it is history the new owner reads after it took the shard, not a conflict.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from sessionloop.eventstore.batch import ANY_VERSION
from sessionloop.eventstore.errors import NOT_WRITTEN, LeaseHeld, LeaseLost, StorageError, StorageUnavailable
from sessionloop.eventstore.jetstream_log import _UNREACHABLE, WRONG_LAST_SEQUENCE, JetStreamLog
from sessionloop.eventstore.records import AppendResult

__all__ = ["DEFAULT_BUCKET", "Lease", "ShardLeases", "ShardOwner"]

DEFAULT_BUCKET = "SL_LEASES"
MAX_NODE_ID_BYTES = 64
MAX_SHARD = 1 << 16
CREATE_ATTEMPTS = 3


class Lease(msgspec.Struct, frozen=True):
    """A shard's lease as its owner holds it. ``epoch``: the revision that created it (the
    ownership's epoch, constant across renewals); ``revision``: the last one written (the next
    renewal's expectation); ``deadline``: the owner's monotonic time after which it stops writing."""

    shard: int
    node: str
    epoch: int
    revision: int
    deadline: float

    def valid(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) < self.deadline


def _key(shard: int) -> str:
    if not 0 <= shard < MAX_SHARD:
        raise ValueError(f"shard must be 0 to {MAX_SHARD - 1}, got {shard}")
    return f"shard.{shard}"


def _check_node(node: str) -> bytes:
    raw = node.encode("utf-8")
    if not raw or len(raw) > MAX_NODE_ID_BYTES or not node.isprintable():
        raise ValueError(f"node id must be 1 to {MAX_NODE_ID_BYTES} printable bytes, got {node!r}")
    return raw


class ShardLeases:
    """The lease bucket; open it with :meth:`open` on a log's (or any) JetStream context."""

    def __init__(self, kv: KeyValue, ttl_s: float, guard: float) -> None:
        self._kv = kv
        self.ttl_s = ttl_s
        self.guard = guard

    @classmethod
    async def open(cls, js: JetStreamContext | JetStreamLog, *, bucket: str = DEFAULT_BUCKET, ttl_s: float = 10.0,
                   replicas: int = 1, guard: float = 0.2) -> ShardLeases:
        """Create the bucket if needed (file storage, history 1, ``ttl_s``, ``replicas`` copies: 3 on
        a cluster, so a lease survives the loss of one server). An existing bucket keeps its TTL and
        replicas: the ones given must match them (StorageError otherwise)."""
        if not 0.5 <= ttl_s <= 3600:
            raise ValueError(f"lease ttl must be 0.5 to 3600 s, got {ttl_s}")
        if not 0 <= guard < 1:
            raise ValueError(f"guard must be in [0, 1), got {guard}")
        ctx = js.jetstream if isinstance(js, JetStreamLog) else js
        try:
            try:
                kv = await ctx.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                kv = await ctx.create_key_value(api.KeyValueConfig(
                    bucket=bucket, history=1, ttl=ttl_s, storage=api.StorageType.FILE, replicas=replicas,
                    direct=replicas == 1))  # R>1: reads from the leader, not from a replica behind it
            status = await kv.status()
        except _UNREACHABLE as e:
            raise StorageUnavailable(f"JetStream did not answer for the lease bucket {bucket}",
                                     reason="io-error") from e
        except nats.js.errors.APIError as e:
            raise StorageError(f"cannot open the lease bucket {bucket}: {e.description}") from e
        if status.stream_info.config.num_replicas != replicas:
            raise StorageError(f"lease bucket {bucket} has {status.stream_info.config.num_replicas} replicas, "
                               f"not {replicas}")
        if status.ttl is not None and abs(status.ttl - ttl_s) > 1e-3:
            raise StorageError(f"lease bucket {bucket} has a ttl of {status.ttl} s, not {ttl_s} s")
        return cls(kv, ttl_s, guard)

    def _deadline(self, sent: float) -> float:
        return sent + self.ttl_s * (1 - self.guard)

    async def acquire(self, shard: int, node: str) -> Lease:
        """Take ``shard``'s lease for ``node``; raises LeaseHeld while another node's lease holds it.

        A lease held under ``node``'s own name (a create whose answer was lost on the way back, or
        this node before a restart) is taken on at once by a revision-checked update: its new
        revision is the new epoch, and the owner's new fence refuses whatever the old one writes."""
        key, raw = _key(shard), _check_node(node)
        for _ in range(CREATE_ATTEMPTS):
            sent = time.monotonic()
            try:
                revision = await self._kv.create(key, raw)
                return Lease(shard, node, revision, revision, self._deadline(sent))
            except nats.js.errors.KeyWrongLastSequenceError as e:
                try:
                    held = await self.holder(shard)
                except StorageUnavailable:
                    raise LeaseHeld(shard, "?") from e  # the server went away between the refusal and this read
                if held is None:
                    continue  # it expired in between: create again
                if held[0] != node:
                    raise LeaseHeld(shard, held[0]) from e
                try:
                    revision = await self._kv.update(key, raw, last=held[1])
                except nats.js.errors.KeyWrongLastSequenceError:
                    continue  # it changed in between: look again
                except _UNREACHABLE as e2:
                    raise StorageUnavailable(f"JetStream did not answer the lease request for shard {shard}",
                                             reason="io-error") from e2
                return Lease(shard, node, revision, revision, self._deadline(sent))
            except nats.js.errors.KeyNotFoundError:
                # nats-py's create, refused on the old lease, reads the key to tell a deleted key
                # from a held one; the old lease expired in between (seen at R=3): create again
                continue
            except _UNREACHABLE as e:
                raise StorageUnavailable(f"JetStream did not answer the lease request for shard {shard}",
                                         reason="io-error") from e
        raise StorageUnavailable(f"the lease of shard {shard} kept expiring under {CREATE_ATTEMPTS} creates",
                                 outcome=NOT_WRITTEN, reason="contention")

    async def renew(self, lease: Lease) -> Lease:
        """Extend ``lease``; raises LeaseLost once it expired on the server or passed to another node."""
        sent = time.monotonic()
        try:
            revision = await self._kv.update(_key(lease.shard), lease.node.encode("utf-8"), last=lease.revision)
        except nats.js.errors.KeyWrongLastSequenceError as e:
            raise LeaseLost(lease.shard, lease.node, "the lease expired or another node took it") from e
        except _UNREACHABLE as e:
            raise StorageUnavailable(f"JetStream did not answer the renewal of shard {lease.shard}",
                                     reason="io-error") from e
        return Lease(lease.shard, lease.node, lease.epoch, revision, self._deadline(sent))

    async def release(self, lease: Lease) -> bool:
        """Give the lease up (delete at its revision); False when it was no longer ours."""
        try:
            await self._kv.delete(_key(lease.shard), last=lease.revision)
        except _UNREACHABLE as e:  # before APIError: some of them are API errors too
            raise StorageUnavailable(f"JetStream did not answer the release of shard {lease.shard}",
                                     reason="io-error") from e
        except nats.js.errors.APIError as e:
            if e.err_code in WRONG_LAST_SEQUENCE:
                return False
            raise StorageError(f"cannot release shard {lease.shard}: {e.description}") from e
        return True

    async def holder(self, shard: int) -> tuple[str, int] | None:
        """``(node, revision)`` of the lease holding ``shard`` now, or None."""
        try:
            entry = await self._kv.get(_key(shard))
        except nats.js.errors.KeyNotFoundError:
            return None
        except _UNREACHABLE as e:
            raise StorageUnavailable(f"JetStream did not answer a lease read of shard {shard}",
                                     reason="io-error") from e
        return (entry.value or b"").decode("utf-8", "replace"), int(entry.revision or 0)


class ShardOwner:
    """One node's shards: it appends only where its lease holds, and drops a shard whose fence failed."""

    def __init__(self, log: JetStreamLog, leases: ShardLeases, node: str) -> None:
        _check_node(node)
        self.log = log
        self.leases = leases
        self.node = node
        self._held: dict[int, Lease] = {}
        #: per held shard: the last sequence of the shard's subjects this node wrote (its fence or
        #: its last commit there), which its next fenced append expects; and the lock that keeps
        #: this node's appends to one shard one at a time (each expects the one before it)
        self._shard_seq: dict[int, int] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        #: how many shards this node dropped (lease expired locally, renewal refused, fence failed)
        self.drops = 0

    @property
    def held(self) -> dict[int, Lease]:
        return dict(self._held)

    async def acquire(self, shard: int) -> Lease:
        """Take ``shard``'s lease and write the takeover fence: from then on no append of an
        earlier owner to any stream of the shard is accepted. Raises LeaseHeld, StorageUnavailable."""
        lease = await self.leases.acquire(shard, self.node)
        self._shard_seq[shard] = await self.log.write_fence(shard, self.node, lease.epoch)
        self._held[shard] = lease
        return lease

    async def renew(self, shard: int) -> Lease:
        """Renew a held shard's lease; drops it and raises LeaseLost when the server refuses."""
        lease = self._lease(shard)
        try:
            renewed = await self.leases.renew(lease)
        except LeaseLost:
            self._drop(shard)
            raise
        self._held[shard] = renewed
        return renewed

    async def release(self, shard: int) -> bool:
        self._shard_seq.pop(shard, None)
        lease = self._held.pop(shard, None)
        return False if lease is None else await self.leases.release(lease)

    def fence_of(self, shard: int) -> int:
        """The stream sequence of this node's last write to held ``shard`` (its fence, or its last
        commit there since); raises LeaseLost when not held."""
        self._lease(shard)
        return self._shard_seq[shard]

    def epoch_of(self, shard: int) -> int:
        """The epoch of this node's ownership of ``shard`` (raises LeaseLost when not held)."""
        return self._lease(shard).epoch

    async def append(self, stream: str, events: Sequence[bytes], expected_version: int = ANY_VERSION,
                     commit_id: str | None = None, extra: bytes = b"") -> AppendResult:
        """``JetStreamLog.append_fenced`` under the shard's lease: raises LeaseLost (nothing
        written) when the lease is not held or its local deadline passed, and when the server
        refused the shard's expected sequence (another node wrote a fence or a commit to the
        shard since this node's last write: the shard is dropped). WrongExpectedVersion when
        ``expected_version`` is not the stream's version (the shard stays held)."""
        shard = self.log.shard_of(stream)
        lock = self._locks.setdefault(shard, asyncio.Lock())
        async with lock:
            self._lease(shard)
            result = await self.log.append_fenced(stream, events, expected_version, commit_id,
                                                  self._shard_seq[shard], extra)
            if result is None:
                self._drop(shard)
                raise LeaseLost(shard, self.node, f"the append to {stream!r} was refused by the shard's fence: "
                                                  "another node took the shard over")
            self._shard_seq[shard] = max(self._shard_seq[shard], result.last_position)
            return result

    def _lease(self, shard: int) -> Lease:
        lease = self._held.get(shard)
        if lease is None:
            raise LeaseLost(shard, self.node, "no lease held")
        if not lease.valid():
            self._drop(shard)
            raise LeaseLost(shard, self.node, "the lease's local deadline passed")
        return lease

    def _drop(self, shard: int) -> None:
        self._shard_seq.pop(shard, None)
        if self._held.pop(shard, None) is not None:
            self.drops += 1
