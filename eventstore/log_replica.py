"""A node's LMDB store as a materialization of the event log on JetStream (issue 23, SPEC §12).

With a replica attached (``LmdbRecorder.attach_replica``), the log is the source of truth and
LMDB the node's local copy of what it owns:

* a group's writes are applied in the LMDB write transaction as always (every check: expected
  versions, idempotency, seals); then, **before** that transaction commits, every append and
  purge of the group is published to the log as one fenced commit (``ShardOwner.append``: under
  the shard's lease, the server checking that nobody else wrote to the shard since this node's
  last write), the appends of one shard one at a time, the shards side by side. Only once the
  log acknowledged them does the LMDB transaction commit. A commit the log refused (the shard's
  lease is lost, the log holds another version) fails its request and the group is applied
  again without it; the rest are published again with the same commit ids, which the log takes
  as duplicates of what it already holds;
* a commit carries what the LMDB transaction wrote beside the events (the :class:`LogSidecar`:
  the feed app and flags, the idempotency claim and receipt, the listing record, the flags, the
  outbox mark, the commit's time), so :meth:`LogReplica.materialize` rebuilds the node's store
  from the log: receipts and timers included, since those are events or written with them;
* a purge (deleting a session) is a tombstone commit with the purged categories; once the log
  holds it, the partition's other commits are erased from the log (the tombstone stays);
* the replica keeps its leases: it renews each held shard every third of the lease's TTL. A
  shard it could not renew, or whose fence refused a commit, is lost: ``on_lost(shard, why)``
  is called once (``serve --cluster`` stops: a node that lost a shard must not half-serve it),
  and every later write to it fails ``LeaseLost``.

Not in the log: snapshots (a node makes its own), flags set without an event (``set_flags``:
local markers of local files), epochs, the outbox's acknowledgements (a node rebuilt from the log
may deliver an owed webhook again: deliveries are at least once). Positions are local: a node
rebuilt from the log numbers its commits anew (feed cursors of the old store do not carry over).

All JetStream work runs on the replica's own event loop thread; the group commit's leader waits
for it (``ship``). A commit the log does not answer (its server is away, a cluster elects a
leader) is published again with the same commit id, for ``retry_s`` while the lease holds: the
log keeps one copy (a retry of one that landed is found by its id). One whose outcome stays unknown
after that stops the node's writes to its shard as a lost lease does: the local store may be
behind the log, and only :meth:`materialize` at the next start makes them agree. Leases are
renewed all at once, each try bounded by a third of the TTL, so a server that does not answer
makes a lease run out on time (and the node stop), not later.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec

from sessionloop.eventstore import keys as K
from sessionloop.eventstore.batch import ANY_VERSION, AppendOp, PurgeOp
from sessionloop.eventstore.errors import (
    UNKNOWN,
    LeaseHeld,
    LeaseLost,
    StorageError,
    StorageUnavailable,
    StoreError,
    WrongExpectedVersion,
)
from sessionloop.eventstore.jetstream_log import DEFAULT_STREAM, JetStreamLog, LogCommit, without_userinfo
from sessionloop.eventstore.leases import DEFAULT_BUCKET, ShardLeases, ShardOwner
from sessionloop.eventstore.outbox import OutboxMark
from sessionloop.eventstore.records import AppendResult, IdempotencyClaim, PurgeResult

__all__ = ["APPEND", "PURGE", "LogReplica", "LogSidecar", "Materialized"]

log = logging.getLogger("sessionloop.cluster")
T = TypeVar("T")

APPEND = 0
PURGE = 1
#: commits materialized at once (queued to the group commit before waiting for them)
MATERIALIZE_WINDOW = 512
#: a commit the log did not answer is tried again after this (doubling, capped), seconds
RETRY_BACKOFF_S = (0.05, 1.0)
#: a lease renewal that failed is tried again after this, seconds (until its local deadline)
RENEW_RETRY_S = 0.25
#: the NATS client's wait between reconnection tries (nats-py's default is 2 s)
RECONNECT_WAIT_S = 0.25
#: how often a standby asks for the lease it waits for (one request; the catch-up of its store
#: runs every eighth of the TTL): it takes over within this of the lease's end
LEASE_POLL_S = 0.1
#: between two tries of a connection to the log that met no answer
CONNECT_RETRY_S = 0.5


class LogSidecar(msgspec.Struct, array_like=True, frozen=True):
    """What a commit carries beside its events (``LogCommit.extra``), so a store rebuilt from
    the log writes what the original transaction wrote. ``node``: the node that wrote it;
    ``lease``: the revision of the shard's lease it was written under (its owner's epoch), so the
    log shows which owner each commit came from (an older one's after a newer one's: none)."""

    kind: int
    node: str
    at: int
    feed: str | None = None
    feed_flags: list[bool] = []
    idem: IdempotencyClaim | None = None
    meta: bytes | None = None
    flags: dict[str, bool] | None = None
    outbox: OutboxMark | None = None
    categories: list[str] = []
    lease: int = 0
    #: the commit's first position in its writer's store: a store rebuilt from the log puts it
    #: there too, so a feed cursor (``listEvents``) means the same on every node (0: not known)
    position: int = 0


_enc = msgspec.msgpack.Encoder()
_sidecar = msgspec.msgpack.Decoder(LogSidecar)


class Recorder(Protocol):
    """What :meth:`LogReplica.materialize` needs of the LMDB recorder (``LmdbRecorder``)."""

    shards: int

    def stream_version(self, stream: str) -> int: ...

    def purged(self, stream: str) -> bool: ...

    def submit_async(self, op: Any, done: Callable[[Any, BaseException | None], None]) -> None: ...


@dataclass(frozen=True, slots=True)
class Materialized:
    """What :meth:`LogReplica.materialize` did: commits read from the log, applied to the store
    (the rest it already had), and purges applied."""

    read: int
    applied: int
    purges: int


@dataclass(slots=True)
class _Ship:
    """One commit to publish: ``expected`` is the stream's version before it (the LMDB view)."""

    stream: str
    events: list[bytes]
    expected: int
    commit_id: str
    sidecar: LogSidecar
    erase: list[str]


class LogReplica:
    """A node's link to the log: its leases, its fenced commits, its materialization.

    ``url``: the NATS server(s); ``node``: this node's id (at most 64 bytes, unique in the
    cluster); ``shards``: the store's shard count (the log's subjects use the same
    ``shard = hash(partition) mod S``). Call :meth:`open` with the shards to own, then
    :meth:`materialize`, then attach it to the recorder; :meth:`close` releases the leases.
    """

    def __init__(self, url: str | list[str], *, node: str, shards: int, replicas: int = 1,
                 lease_ttl_s: float = 10.0, stream: str = DEFAULT_STREAM, bucket: str = DEFAULT_BUCKET,
                 timeout_s: float = 10.0, on_lost: Callable[[int, str], None] | None = None) -> None:
        self.url, self.node, self.shards, self.replicas = url, node, shards, replicas
        self.lease_ttl_s, self.stream_name, self.bucket, self.timeout_s = lease_ttl_s, stream, bucket, timeout_s
        self._on_lost = on_lost
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sessionloop-log", daemon=True)
        self._thread.start()
        self._log: JetStreamLog | None = None
        self._owner: ShardOwner | None = None
        self._renewer: asyncio.Task[None] | None = None
        #: shards this node held and lost (reported once each)
        self.lost: dict[int, str] = {}
        #: per shard, the last log sequence read into the store (``catch_up``); commits read in all
        self._read_upto: dict[int, int] = {}
        self.commits_read = 0
        #: how long a commit is tried again while the log does not answer (a failover of its
        #: servers), each try bounded by the log's request timeout
        self.retry_s = max(2 * self.lease_ttl_s, 5.0)
        self._closed = False

    # --- life -----------------------------------------------------------------------------------

    def open(self, shards: Iterable[int], *, wait: bool = False, rec: Recorder | None = None) -> None:
        """Connect, and take the lease of each of ``shards`` with its takeover fence. Raises
        LeaseHeld when another node owns one (the leases taken are given back), unless ``wait``:
        then it stands by (renewing what it took) until every lease held elsewhere ran out or was
        given back, and takes it over (it asks every ``LEASE_POLL_S``). Standing by with ``rec``
        (the node's store, no replica attached), it keeps the store up to the log meanwhile
        (:meth:`catch_up`, every eighth of the TTL), so a takeover
        reads only the commits made since its last round, however long the log. Raises
        StorageUnavailable when the log does not answer (in ``timeout_s`` and 5 s to connect;
        standing by, a round the log does not answer is tried again, saying so once a minute:
        a standby loses nothing by waiting, and a partition or an election is not the end of it)."""
        wanted = sorted(set(shards))
        told: set[str] = set()
        said_at = caught_up_at = -math.inf
        try:
            self._connect_in_time(time.monotonic() + self.timeout_s + 5)
            while True:
                try:
                    if self._run(self._acquire_round(wanted, wait, told), self.timeout_s * 3):
                        break
                    if rec is not None and time.monotonic() - caught_up_at >= self.lease_ttl_s / 8:
                        self.catch_up(rec, wanted)
                        caught_up_at = time.monotonic()
                except (StorageUnavailable, TimeoutError) as e:
                    if not wait:
                        raise
                    if time.monotonic() - said_at >= 60:
                        said_at = time.monotonic()
                        log.warning("node %s stands by: the log did not answer (%s); trying again", self.node,
                                    e or "no answer in time")
                time.sleep(min(self.lease_ttl_s / 8, LEASE_POLL_S))
        except TimeoutError as e:
            self.close()
            urls = [self.url] if isinstance(self.url, str) else self.url
            raise StorageUnavailable(f"the cluster's log at {', '.join(without_userinfo(u) for u in urls)} did not "
                                     f"answer in time (a try is {self.timeout_s:.0f} s)", reason="io-error") from e
        except BaseException:
            self.close()
            raise

    def _connect_in_time(self, deadline: float) -> None:
        """Connect, trying again while no server answers (a server met at a bad moment: its host
        cut off, its cluster electing) until ``deadline``."""
        while True:
            try:
                self._run(self._connect(), max(deadline - time.monotonic(), 0.1))
                return
            except StorageUnavailable:
                if self._log is not None:
                    self._run(self._log.close(), 5)
                    self._log = None
                if time.monotonic() + CONNECT_RETRY_S >= deadline:
                    raise
                time.sleep(CONNECT_RETRY_S)

    async def _connect(self) -> None:
        self._log = await JetStreamLog.connect(self.url, stream=self.stream_name, replicas=self.replicas,
                                               shards=self.shards, request_timeout_s=self._request_timeout_s,
                                               connect_timeout_s=self.timeout_s, reconnect_time_wait=RECONNECT_WAIT_S,
                                               ping_interval=self._ping_interval_s, max_outstanding_pings=2,
                                               error_cb=_nats_error)
        leases = await ShardLeases.open(self._log, bucket=self.bucket, ttl_s=self.lease_ttl_s,
                                        replicas=self.replicas)
        self._owner = ShardOwner(self._log, leases, self.node)
        self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _acquire_round(self, shards: list[int], wait: bool, told: set[str]) -> bool:
        """Take what leases it can, in shard order and never past a held one (two standbys never
        split the shards between them, each waiting for the other's: the one that took the first
        goes on); whether it holds them all now."""
        assert self._owner is not None
        owner = self._owner
        for shard in shards:
            if shard in owner.held:
                continue
            try:
                await owner.acquire(shard)
            except LeaseHeld as e:
                if not wait:
                    raise
                if e.holder not in told:
                    told.add(e.holder)
                    log.warning("node %s stands by: shard %d is leased by node %r; it takes the shards over "
                                "when their leases run out (at most %.1f s after that node stops)", self.node,
                                shard, e.holder, self.lease_ttl_s)
                return False
        return len(owner.held) >= len(shards)

    def close(self) -> None:
        """Stop renewing, give the leases back (another node may take them at once), disconnect."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._close(), self.timeout_s)
        except (StoreError, TimeoutError, OSError) as e:
            log.warning("closing the log link: %s (the leases expire by themselves)", e)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    async def _close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        if self._owner is not None:
            for shard in list(self._owner.held):
                try:
                    await self._owner.release(shard)
                except StoreError:
                    pass
        if self._log is not None:
            await self._log.close()

    @property
    def held(self) -> list[int]:
        return sorted(self._owner.held) if self._owner is not None else []

    def epoch_floor(self) -> int:
        """The highest lease revision this node holds: an epoch above it is above every earlier
        owner's of any of its shards (revisions only grow)."""
        assert self._owner is not None
        return max((lease.epoch for lease in self._owner.held.values()), default=0)

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    # --- leases ---------------------------------------------------------------------------------

    async def _renew_forever(self) -> None:
        """Every third of the TTL, renew every held lease at once, each try bounded by that third:
        a server that does not answer (down, electing a leader) costs a try, not the loop. A
        lease whose local deadline passed is lost, whatever the server would say."""
        assert self._owner is not None
        owner, period = self._owner, self.lease_ttl_s / 3
        failed: set[int] = set()  # tried again soon, not a period later (a leader election is seconds)
        while True:
            await asyncio.sleep(min(period, RENEW_RETRY_S) if failed else period)
            shards = [shard for shard in owner.held if shard not in self.lost]
            results = await asyncio.gather(*(asyncio.wait_for(owner.renew(shard), period) for shard in shards),
                                           return_exceptions=True)
            was_failing, failed = failed, set()
            for shard, result in zip(shards, results, strict=True):
                if isinstance(result, LeaseLost):
                    self._lose(shard, result.reason)
                elif isinstance(result, (StoreError, TimeoutError)):
                    failed.add(shard)
                    if shard not in was_failing:
                        log.warning("cannot renew the lease of shard %d now (trying again every %.2f s): %s", shard,
                                    RENEW_RETRY_S, result or "no answer in time")
                elif isinstance(result, BaseException):
                    raise result
            for shard, lease in list(owner.held.items()):
                if not lease.valid():
                    self._lose(shard, "its lease could not be renewed before it ran out")

    def _lose(self, shard: int, why: str) -> None:
        if shard in self.lost:
            return
        self.lost[shard] = why
        log.error("node %s lost shard %d: %s; it writes nothing more to it", self.node, shard, why)
        if self._on_lost is not None:
            self._on_lost(shard, why)

    # --- the write path -------------------------------------------------------------------------

    @property
    def _ping_interval_s(self) -> float:
        """How often the connection is pinged: a server that went silent (its host partitioned
        away, no reset) is left for another after three unanswered pings, half a lease, where
        nats-py's default (every 2 min) would keep a standby on it for minutes."""
        return max(self.lease_ttl_s / 6, 0.25)

    @property
    def _request_timeout_s(self) -> float:
        """One request to the log: short enough that a commit is tried again (or its lease found
        lost) well inside the lease's TTL."""
        return min(self.timeout_s, max(0.5, self.lease_ttl_s / 4))

    def new_commit_id(self) -> str:
        """A commit id no other commit has (``<node>.<uuid4 hex>``)."""
        return f"{self.node}.{uuid.uuid4().hex}"

    def ship(self, writes: list[tuple[AppendOp | PurgeOp, AppendResult | PurgeResult]]) -> list[BaseException | None]:
        """Publish each write of a group (in order) as a fenced commit; per write, None when the
        log holds it, else the error to answer it with. Called by the group's leader inside the
        LMDB write transaction, before it commits."""
        ships = [self._ship_of(op, result) for op, result in writes]
        try:
            return self._run(self._publish_all(ships), self.retry_s + 2 * self._request_timeout_s + 5)
        except TimeoutError:
            for shard in {K.shard_of(s.stream, self.shards) for s in ships}:
                self._lose(shard, "the log did not acknowledge a commit in time (its outcome is unknown)")
            err = StorageUnavailable("the event log did not acknowledge the commit in time; retry with the same "
                                     "idempotency key after the node restarted", outcome=UNKNOWN, reason="io-error")
            return [err for _ in ships]

    def _ship_of(self, op: AppendOp | PurgeOp, result: AppendResult | PurgeResult) -> _Ship:
        assert op.commit_id is not None  # given by the recorder before the group applies (``new_commit_id``)
        commit_id = op.commit_id
        if isinstance(op, AppendOp):
            assert isinstance(result, AppendResult)
            sidecar = LogSidecar(APPEND, self.node, result.at, op.feed, op.feed_flags, op.idem, op.meta, op.flags,
                                 op.outbox, position=result.first_position)
            return _Ship(op.stream, _encoded(op.events), result.first_version - 1, commit_id, sidecar, [])
        assert isinstance(result, PurgeResult)
        tomb = result.tombstone
        sidecar = LogSidecar(PURGE, self.node, tomb.at, meta=op.meta, flags=op.flags, categories=op.categories,
                             position=tomb.first_position)
        return _Ship(op.stream, _encoded(op.events), tomb.first_version - 1, commit_id, sidecar,
                     [name for name in result.streams if name != op.stream])

    async def _publish_all(self, ships: list[_Ship]) -> list[BaseException | None]:
        by_shard: dict[int, list[int]] = {}
        for i, s in enumerate(ships):
            by_shard.setdefault(K.shard_of(s.stream, self.shards), []).append(i)
        out: list[BaseException | None] = [None] * len(ships)

        async def one_shard(shard: int, indices: list[int]) -> None:
            for i in indices:
                out[i] = await self._publish(shard, ships[i])

        await asyncio.gather(*(one_shard(k, v) for k, v in by_shard.items()))
        return out

    async def _publish(self, shard: int, s: _Ship) -> BaseException | None:
        assert self._owner is not None
        if shard in self.lost:
            return LeaseLost(shard, self.node, self.lost[shard])
        deadline = time.monotonic() + self.retry_s
        held = self._owner.held.get(shard)
        extra = _enc.encode(msgspec.structs.replace(s.sidecar, lease=held.epoch if held is not None else 0))
        for attempt in itertools.count():
            try:
                await self._owner.append(s.stream, s.events, s.expected, s.commit_id, extra)
                break
            except LeaseLost as e:
                self._lose(shard, e.reason)
                return e
            except WrongExpectedVersion as e:
                return StorageError(f"the event log holds stream {s.stream!r} at version {e.actual}, this node's "
                                    f"store at {s.expected}: the node's store is not the log's materialization",
                                    stream=s.stream)
            except StorageUnavailable as e:
                # the log is away or electing a leader: the same commit id again (a retry of one
                # that landed is found and answered as it), while the lease holds and time is left
                if time.monotonic() + RETRY_BACKOFF_S[1] < deadline:
                    await asyncio.sleep(min(RETRY_BACKOFF_S[1], RETRY_BACKOFF_S[0] * 2 ** attempt))
                    continue
                if e.outcome == UNKNOWN:
                    self._lose(shard, f"a commit's outcome stayed unknown for {self.retry_s:.0f} s ({e})")
                return e
            except StoreError as e:
                return e
        if s.sidecar.kind == PURGE:
            try:
                await self._log_of().erase(s.stream, keep_last=True)
                for name in s.erase:
                    await self._log_of().erase(name)
            except StoreError as e:  # the tombstone holds: a rebuild purges them again
                log.warning("the log keeps the purged commits of %s for now: %s", s.stream, e)
        return None

    def _log_of(self) -> JetStreamLog:
        assert self._log is not None
        return self._log

    # --- materialization ------------------------------------------------------------------------

    def materialize(self, rec: Recorder) -> Materialized:
        """Bring ``rec`` (with no replica attached yet) up to the log for every held shard, to its
        takeover fence: each commit it lacks is written as the log has it (events, versions,
        time, receipts, feed, listing record); purges are applied. What an earlier
        :meth:`catch_up` read is not read again. Raises StorageError when the store holds a
        stream the log has at another history (the data directory is not this cluster's), or
        when a shard's log cannot be read."""
        done = self.catch_up(rec, self.held)
        log.info("node %s materialized %d of %d commits of %d shards from the log (%d purges; %d commits read "
                 "in all)", self.node, done.applied, done.read, len(self.held), done.purges, self.commits_read)
        return done

    def catch_up(self, rec: Recorder, shards: Iterable[int]) -> Materialized:
        """Write into ``rec`` the commits of ``shards`` it lacks, from where the last call left
        each shard to the shard's last message now (a held shard: to this node's fence)."""
        read = applied = purges = 0
        pending: list[threading.Event] = []
        errors: list[BaseException] = []
        #: the versions and seals the queued writes leave (the store shows them once committed)
        view = _View(rec)
        for shard in shards:
            commits, last = self._run(self._read_shard(shard), self.timeout_s * 30)
            for seq, commit in commits:
                read += 1
                op = view.op_of(seq, commit)
                if op is None:
                    continue
                if isinstance(op, PurgeOp):
                    purges += 1
                applied += 1
                pending.append(self._submit(rec, op, errors))
                if len(pending) >= MATERIALIZE_WINDOW:
                    _wait(pending, errors)
            _wait(pending, errors)
            self._read_upto[shard] = last
        self.commits_read += read
        return Materialized(read, applied, purges)

    async def _read_shard(self, shard: int) -> tuple[list[tuple[int, LogCommit]], int]:
        assert self._owner is not None
        last = self._owner.fence_of(shard) if shard in self._owner.held else await self._log_of().shard_head(shard)
        start = self._read_upto.get(shard, 0) + 1
        if last < start:
            return [], start - 1
        return [item async for item in self._log_of().shard_commits(shard, last, start)], last

    @staticmethod
    def _submit(rec: Recorder, op: AppendOp | PurgeOp, errors: list[BaseException]) -> threading.Event:
        done = threading.Event()

        def settled(result: Any, error: BaseException | None) -> None:
            if error is not None:
                errors.append(error)
            done.set()

        rec.submit_async(op, settled)
        return done


class _View:
    """The store as the writes queued by a materialization leave it."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.versions: dict[str, int] = {}
        self.sealed: set[str] = set()

    def _purged(self, stream: str) -> bool:
        return K.partition_of(stream) in self.sealed or self.rec.purged(stream)

    def op_of(self, seq: int, commit: LogCommit) -> AppendOp | PurgeOp | None:
        """The write that brings the store to include ``commit``, or None when it has it."""
        try:
            side = _sidecar.decode(commit.extra) if commit.extra else LogSidecar(APPEND, "?", commit.at)
        except msgspec.DecodeError as e:
            raise StorageError(f"log commit {seq} of stream {commit.stream!r} has an unreadable sidecar: {e}") from e
        raw = K.validate_stream(commit.stream)
        events = [msgspec.Raw(e) for e in commit.events]
        partition = K.partition_of(commit.stream)
        if side.kind == PURGE:
            if self._purged(commit.stream):
                return None
            self.sealed.add(partition)
            return PurgeOp(commit.stream, raw, list(side.categories), events, ANY_VERSION, side.meta, side.flags,
                           commit.commit_id, side.position or None)
        if self._purged(commit.stream):
            return None
        have = self.versions.get(commit.stream)
        if have is None:
            have = self.rec.stream_version(commit.stream)
        last = commit.first_version + len(commit.events) - 1
        if have >= last:
            return None
        if have != commit.first_version - 1:
            raise StorageError(f"the store has stream {commit.stream!r} at version {have}, but the log's next commit "
                               f"of it (sequence {seq}) starts at version {commit.first_version}: this data "
                               "directory is not the cluster log's materialization", stream=commit.stream)
        self.versions[commit.stream] = last
        return AppendOp(commit.stream, raw, events, list(side.feed_flags), have, commit.commit_id, side.idem,
                        side.feed, side.meta, side.flags, side.outbox, side.at, side.position or None)


async def _nats_error(e: Exception) -> None:
    """The NATS client's errors (a refused connection on each reconnection try): one debug line
    each, not nats-py's traceback; what they cost is said by the lease renewals and the commits."""
    log.debug("the log's NATS connection: %s", e or type(e).__name__)


def _encoded(events: list[Any]) -> list[bytes]:
    return [bytes(e) if isinstance(e, msgspec.Raw) else _enc.encode(e) for e in events]


def _wait(pending: list[threading.Event], errors: list[BaseException]) -> None:
    for done in pending:
        done.wait()
    pending.clear()
    if errors:
        raise StorageError(f"materializing the store from the log failed: {errors[0]}") from errors[0]
