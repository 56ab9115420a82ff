"""The LMDB recorder: encoded payloads in, ordered keys out; its write side and its lifetime.

eventstore/ is the only package that imports ``lmdb``, in four modules: this one (the writes, the
group commits and what happens when one fails, compaction and backup), ``lmdb_env.py`` (opening the
environment: directory, lock, flags, databases, the read gate), ``lmdb_reads.py`` (the read paths,
which :class:`LmdbRecorder` inherits) and ``lmdb_copy.py`` (the key-by-key copy that compaction
and backup write).

Why it is shaped this way (see ../shared/RELIABILITY.md, LMDB):

* one write transaction per *group* of appends (``groupcommit.py``), positions and versions
  allocated inside it, so nothing is visible or acknowledged before its commit;
* read transactions are short: every read opens, copies out and closes; none is held across a
  wait. The map can only be resized with no transaction open in the process, so readers pass a
  gate that a resize closes for the few microseconds it takes;
* ``MDB_MAP_FULL`` never reaches a caller: the leader aborts, doubles the map, and redoes the
  whole group (requests are pure data, their checks run again);
* ``reader_check()`` at open clears reader slots left by killed processes; an ``flock`` on
  ``LOCK`` refuses a second writing process with StoreLocked instead of risking corruption.

When a commit fails (every answer a client gets is true)
--------------------------------------------------------

A client that is told "not written" and believes it sends again without its idempotency key,
so an error may only say "not written" when nothing of the write is in the store. What LMDB
0.9 (py-lmdb 3.0's ``mdb.c``) does when a write transaction fails:

* a put fails (a page spill on a full disk, ``MDB_MAP_FULL``): the transaction is aborted and
  nothing of it was written. ``MDB_MAP_FULL`` grows the map and redoes the group; anything
  else answers :class:`StorageFull` / :class:`StorageUnavailable` with ``outcome="not-written"``.
* ``mdb_txn_commit`` writes the dirty pages (``pwrite``/``writev``; a short write on a full
  disk is reported as ``EIO``), then ``fdatasync``s them, then writes the meta page (through an
  ``O_DSYNC`` descriptor in ``sync``). A failure before the meta page: the transaction is
  aborted and invisible, its pages are unreferenced free space. A failure *of* the meta page
  write: LMDB writes the old meta page back to the page cache and marks the environment fatal
  (every later transaction gets ``MDB_PANIC``); what the disk holds for that page is unknown.

py-lmdb's ``Transaction.commit()`` hands ``mdb_txn_commit``'s code on as ``lmdb.Error`` after
LMDB has ended the transaction (a later ``abort()`` is a no-op). So after a commit raised,
the writer (the group's leader, holding every other writer off) finds out before it answers:

1. it reads back, in a fresh read transaction, a witness of every request of the group: the
   exact bytes each one put (a log record at its position, a snapshot, a counter);
2. if that read gets ``MDB_PANIC``, it closes the environment and opens it again (readers wait
   at the gate; the ``LOCK`` stays ours), then commits a small synced transaction: it takes the
   slot of the meta page whose write failed (or builds on it, if that write made it), so what
   the reopened store shows is now what the disk holds; then it reads the witnesses back;
3. all witnesses present: the group committed; every request gets its result (a witness
   present without a fatal error first gets the same synced transaction, to be durable);
   none present: every request gets ``StorageUnavailable(outcome="not-written")`` (retryable,
   ``retry_after_ms``), and a retry writes it once;
4. it cannot tell (the reopen or the synced transaction fails, or only some witnesses are
   present, which an atomic transaction cannot do): **fail-stop**, as PostgreSQL does after
   a failed fsync: the group's requests get ``StorageUnavailable(outcome="unknown")``, every
   later write gets ``StorageUnavailable(reason="stopped")``, and the next open (a restart)
   shows what was written. Idempotency receipts are committed with their events, so a retry
   with the same key after the restart returns the original receipt or writes it once.

Each failed group is logged once (the driver's error, the path, the outcome found).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any, Protocol

import lmdb
import msgspec

from sessionloop.eventstore.batch import (
    AppendOp,
    BatchContext,
    CompactOp,
    FlagsOp,
    MetaOp,
    PurgeOp,
    SnapshotOp,
    feed_apps,
    prune_feed_age,
    prune_idem,
    rebuilt_claims,
)
from sessionloop.eventstore.errors import (
    RETRY_AFTER_MS,
    STOPPED_RETRY_AFTER_MS,
    UNKNOWN,
    IdempotencyConflict,
    ReadOnlyStore,
    StorageError,
    StorageFull,
    StorageUnavailable,
    StoreClosed,
    StoreError,
    StreamDeleted,
    WrongExpectedVersion,
)
from sessionloop.eventstore.groupcommit import GroupCommitter, HistogramSnapshot, Request
from sessionloop.eventstore.lmdb_copy import compacted_copy
from sessionloop.eventstore.lmdb_env import (
    ReadGate,
    adopt_lock,
    durability_mismatch,
    init_meta,
    open_environment,
    owner_only,
    read_head,
    take_lock,
)
from sessionloop.eventstore.lmdb_reads import LmdbReads
from sessionloop.eventstore.outbox import OutboxOp

log = logging.getLogger("sessionloop.eventstore")

DAY_MS = 86_400_000

#: the map of an environment shared by worker processes (``owned_shards``): opened at its ceiling
#: once, never grown (a growth by one process would make every other one's next transaction fail
#: with ``MDB_MAP_RESIZED``); address space only: the file grows with the data
SHARED_MAP_SIZE = 1 << 40

_enc = msgspec.msgpack.Encoder()

class Replica(Protocol):
    """The replicated log a store materializes (``log_replica.LogReplica``)."""

    def new_commit_id(self) -> str: ...

    def ship(self, writes: list[tuple[Any, Any]]) -> list[BaseException | None]: ...


class LmdbRecorder(LmdbReads):
    """Append-only event log in one LMDB environment (see ``keys.py`` for the layout)."""

    def __init__(
        self,
        path: str,
        *,
        durability: str = "sync",
        shards: int = 16,
        map_size: int = 1 << 30,
        max_map_size: int | None = None,
        readonly: bool = False,
        max_readers: int = 1024,
        idempotency_ttl_ms: int = 7 * DAY_MS,
        feed_max_events: int = 10_000,
        feed_ttl_ms: int = 7 * DAY_MS,
        prune_interval_s: float = 1.0,
        prune_batch: int = 500,
        on_map_resize: Callable[[], None] | None = None,
        on_purge: Callable[[], None] | None = None,
        owned_shards: frozenset[int] | None = None,
        lock_fd: int | None = None,
    ) -> None:
        if durability not in ("sync", "nosync"):
            raise ValueError(f"durability must be 'sync' or 'nosync', not {durability!r}")
        self.path = os.path.abspath(path)
        self.durability = durability
        self.readonly = readonly
        self.max_map_size = max_map_size
        self.idempotency_ttl_ms = idempotency_ttl_ms
        self.feed_max_events = feed_max_events
        self.feed_ttl_ms = feed_ttl_ms
        self._prune_interval = prune_interval_s
        self._prune_batch = prune_batch
        self._last_prune = 0.0
        self._closed = False
        self._lock_fd: int | None = None
        self._gate = ReadGate()
        self.stale_readers_cleared = 0
        self.map_resizes = 0
        self._on_map_resize = on_map_resize
        self._on_purge = on_purge
        self.last_batch_size = 0
        #: the shards whose sessions this process runs, in an environment other processes write too
        #: (None: every shard, and no other writer). Shared, no stream version is cached: each is read
        #: in the write transaction (an expected version is checked against what every process
        #: wrote; a cursor lookup, a few microseconds), and so is the log's head
        self.owned_shards = owned_shards
        if owned_shards is not None:
            map_size = max(map_size, min(SHARED_MAP_SIZE, max_map_size or SHARED_MAP_SIZE))
        if not readonly:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            owner_only(self.path)
            self._lock_fd = take_lock(self.path) if lock_fd is None else adopt_lock(self.path, lock_fd)
        elif not os.path.exists(os.path.join(self.path, "data.mdb")):
            raise StorageError(f"no event store at {self.path}", path=self.path)
        self._max_readers = max_readers
        self._map_size = map_size
        self._stopped: str | None = None  # why the store stopped accepting writes (fail-stop)
        self._env_usable = True
        self.commit_failures = 0
        self.reopens = 0
        try:
            self._open_env()
            self.stale_readers_cleared = self._env.reader_check()
            mismatch = durability_mismatch(durability, self.env_flags)
            if mismatch is not None and not readonly:
                self._env.close()
                raise StorageError(f"event store at {self.path}: {mismatch}", path=self.path)
        except lmdb.Error as e:
            self._release_lock()
            raise StorageError(f"cannot open event store at {self.path}: {e}", path=self.path) from e
        self.shards = init_meta(self._env, self._db["meta"], self.path, readonly=readonly, shards=shards)
        if owned_shards is not None and not all(0 <= k < self.shards for k in owned_shards):
            self._env.close()
            self._release_lock()
            raise ValueError(f"owned shards {sorted(owned_shards)} are not all below the store's {self.shards}")
        self._versions: dict[bytes, int] = {}
        self._head = read_head(self._env, self._db["log"])
        # nosync commits are memory writes: an asynchronous append leads its own group when none is
        # under way (``groupcommit``); sync ones wait for the disk, and in an environment shared by
        # worker processes for the others' commits (LMDB's one write lock; measured: 1.1-1.2x the CPU
        # per turn at N = 2 when the callers waited for it), on the writer thread
        #: the replicated log this store materializes (``attach_replica``), or None: LMDB alone
        self._replica: Replica | None = None
        self._committer = GroupCommitter(self._commit_batch, timed=(AppendOp,),
                                         inline_async=durability == "nosync" and owned_shards is None)

    # --- open / close -----------------------------------------------------------------------

    def _open_env(self) -> None:
        """Open the environment and its databases (at start, and again after a fatal commit error)."""
        self._env, self.env_flags, self._db = open_environment(
            self.path, map_size=self._map_size, max_readers=self._max_readers, durability=self.durability,
            readonly=self.readonly)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def close(self) -> None:
        if self._closed:
            return
        self._committer.close()
        self._closed = True
        if not self.readonly and self.durability == "nosync" and self._stopped is None:
            self._env.sync(True)
        self._env.close()
        self._release_lock()

    @property
    def head_position(self) -> int:
        if self.owned_shards is not None:  # other processes append too
            with self._read():
                return read_head(self._env, self._db["log"])
        return self._head

    def info(self) -> dict[str, Any]:
        map_size = self._env.info()["map_size"] if self._env_usable else self._map_size
        return {
            "path": self.path,
            "durability": self.durability,
            "fsync_per_commit": bool(self.env_flags["sync"] and self.env_flags["metasync"]),
            "readonly": self.readonly,
            "shards": self.shards,
            "map_size": map_size,
            "last_position": self._head,
            "stale_readers_cleared": self.stale_readers_cleared,
            "map_resizes": self.map_resizes,
            "batches": self._committer.batches,
            "requests": self._committer.requests,
            "last_batch_size": self.last_batch_size,
            "commit_failures": self.commit_failures,
            "reopens": self.reopens,
            "writable": self._stopped is None and not self.readonly,
            "stopped": self._stopped,
        }

    def commit_stats(self) -> dict[str, HistogramSnapshot]:
        """Copies of the group commits' observations (``groupcommit.CommitStats``); appends are timed."""
        return self._committer.stats.snapshot()

    # --- writes ---------------------------------------------------------------------------------

    def submit(self, op: AppendOp | PurgeOp | FlagsOp | SnapshotOp | MetaOp | OutboxOp) -> Any:
        self._check_writable()
        return self._committer.submit(op)

    def submit_async(self, op: AppendOp | PurgeOp, done: Any) -> None:
        self._check_writable()
        self._committer.submit_async(op, done)

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreClosed()
        if self.readonly:
            raise ReadOnlyStore(self.path)
        if self._stopped is not None:
            raise self._stopped_error()

    def _stopped_error(self) -> StorageUnavailable:
        return StorageUnavailable(
            "the event store stopped accepting writes after a write it could not confirm; nothing of this "
            f"one was written; it takes writes again after a restart (retry after {STOPPED_RETRY_AFTER_MS} ms)",
            reason="stopped", retry_after_ms=STOPPED_RETRY_AFTER_MS, path=self.path)

    def compact(self) -> tuple[int, int]:
        """Rewrite ``data.mdb`` with nothing but the store's live data; returns its size in bytes
        before and after.

        LMDB does not zero the pages a transaction frees (a purge's, a pruned feed's): their bytes
        stay in the file until later commits reuse them. Nor does it zero a freed page's buffer
        when it reuses it in memory, so a page written later (a purge's tombstone, say) can carry
        deleted bytes in its unused end; a page-by-page copy (``mdb_env_copy2`` with
        ``MDB_CP_COMPACT``) keeps them. So the copy is rebuilt key by key (``lmdb_copy.py``):
        every page of it is written from live data. Runs on the group commit's leader, after the
        writes queued before it and with no transaction open (readers wait at the gate), so
        nothing written meanwhile is lost: the copy is fsynced, renamed over ``data.mdb``
        (atomic: a crash leaves the old file or the new, never half) and the environment
        reopened. It stalls reads and writes for as long as the copy takes (about the time to
        write the live data once): maintenance, not a per-delete step."""
        self._check_writable()
        if self.owned_shards is not None:
            raise StorageError(f"the event store at {self.path} is shared by worker processes: compact it "
                               "with the server stopped (sessionloop compact)", path=self.path)
        return self._committer.submit(CompactOp())  # type: ignore[no-any-return]

    def backup(self, dest: str) -> int:
        """A consistent copy of the store at ``dest`` (a new directory), written while the store
        serves: one read transaction, rebuilt key by key as ``compact`` does (so no byte of
        deleted data), fsynced, mode 0600; returns its size in bytes. Works on a read-only open,
        so another process can back up a running server's store."""
        os.makedirs(dest, mode=0o700)
        with self._read():
            copied = compacted_copy(self._env, self._db, self._map_size, dest, self.path)
        return os.path.getsize(copied)

    def _compact_now(self) -> tuple[int, int]:
        data = os.path.join(self.path, "data.mdb")
        work = os.path.join(self.path, "compact.tmp")
        shutil.rmtree(work, ignore_errors=True)  # left by a copy a crash interrupted: never in use
        os.mkdir(work, 0o700)
        before = os.path.getsize(data)

        def swap() -> None:
            copied = compacted_copy(self._env, self._db, self._map_size, work, self.path)
            self._env_usable = False
            self._map_size = max(self._map_size, int(self._env.info()["map_size"]))
            self._env.close()
            try:
                os.replace(copied, data)
                dir_fd = os.open(self.path, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
            finally:  # the new file, or the old one if the rename failed
                self._open_env()
                self._env_usable = True

        try:
            self._gate.exclusive(swap)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return before, os.path.getsize(data)

    def _commit_batch(self, batch: list[Request]) -> None:
        """One group's write transaction; sets every request's result or error (see the module
        docstring, "When a commit fails", for how each answer is made true). A compaction in the
        group runs after the others' commit (``compact``)."""
        compacting = [req for req in batch if type(req.payload) is CompactOp]
        if compacting:
            writes = [req for req in batch if type(req.payload) is not CompactOp]
            if writes:
                self._commit_batch(writes)
            for req in compacting:
                try:
                    req.result, req.error = self._compact_now(), None
                except (OSError, lmdb.Error, StorageError) as e:
                    req.result, req.error = None, StorageError(
                        f"compacting the event store at {self.path} failed: {e}; the store is as it was",
                        path=self.path)
            return
        replica = self._replica
        if replica is not None:  # every commit the log gets has an id, the same on every try
            for req in batch:
                if type(req.payload) in (AppendOp, PurgeOp) and req.payload.commit_id is None:
                    req.payload.commit_id = replica.new_commit_id()
        while batch:
            if self._stopped is not None:
                return _fail_all(batch, self._stopped_error())
            try:
                txn = self._env.begin(write=True)
            except lmdb.Error as e:  # nothing started, nothing written
                return self._refuse(batch, e)
            committing = False
            try:
                ctx = BatchContext(self, txn, int(time.time() * 1000))
                for req in batch:
                    req.result, req.error = None, None
                    try:
                        req.result = ctx.apply(req.payload)
                    except (WrongExpectedVersion, IdempotencyConflict, StreamDeleted) as e:
                        req.error = e  # refused before it wrote anything: the group goes on
                if replica is not None:
                    refused = self._ship(replica, batch)
                    if refused:  # applied again without them; the log takes the rest again as duplicates
                        txn.abort()
                        batch = [req for req in batch if req not in refused]
                        continue
                self._maybe_prune(txn)
                committing = True
                txn.commit()
            except lmdb.MapFullError:  # from a put, or from the commit's page allocation: before any write
                try:
                    self._grow_map(txn)
                except StorageFull as e:
                    log.warning("a group of %d writes was refused: %s", len(batch), e)
                    return _fail_all(batch, e)
                continue
            except lmdb.Error as e:
                txn.abort()  # a no-op after a failed commit: LMDB has ended the transaction
                if committing:
                    return self._settle(batch, ctx, e)
                return self._refuse(batch, e)
            except BaseException:
                txn.abort()
                raise
            return self._applied(batch, ctx)

    def _ship(self, replica: Replica, batch: list[Request]) -> list[Request]:
        """Publish the group's appends and purges to the log (``log_replica.py``); the requests it
        refused, each with its error set."""
        writes = [req for req in batch if req.error is None and type(req.payload) in (AppendOp, PurgeOp)
                  and not getattr(req.result, "duplicate", False)]
        if not writes:
            return []
        errors = replica.ship([(req.payload, req.result) for req in writes])
        refused = []
        for req, error in zip(writes, errors, strict=True):
            if error is not None:
                req.result, req.error = None, error
                refused.append(req)
            else:  # the log holds it at this position: applied again (after a refusal), it stays there
                result = req.result.tombstone if isinstance(req.payload, PurgeOp) else req.result
                req.payload.position = result.first_position
        return refused

    def attach_replica(self, replica: Replica) -> None:
        """Make the store a materialization of ``replica``'s log: from now on a group commits in
        LMDB only after the log holds its appends and purges (``log_replica.py``), and every
        asynchronous append is led on the writer thread (a log round trip is not a pool thread's)."""
        self._replica = replica
        self._committer.lead_on_writer()

    def _applied(self, batch: list[Request], ctx: BatchContext) -> None:
        if self.owned_shards is None:  # shared: another process may append to any stream
            self._versions.update(ctx.versions)
        for skey in ctx.purged:  # their next append reads the seal
            self._versions.pop(skey, None)
        if len(self._versions) > 200_000:
            self._versions.clear()
        self._head = ctx.head
        self.last_batch_size = len(batch)

    def _refuse(self, batch: list[Request], e: lmdb.Error) -> None:
        """LMDB failed the group before its commit (a put, a page spill, the transaction's start):
        it aborted the transaction, so nothing of it was written."""
        err = _translate_write_error(e, self.path)
        log.warning("a group of %d writes to %s was refused before its commit (%s): nothing written",
                    len(batch), self.path, e)
        _fail_all(batch, err)

    # --- when a commit fails ------------------------------------------------------------------------

    def _settle(self, batch: list[Request], ctx: BatchContext, error: lmdb.Error) -> None:
        """``txn.commit()`` raised ``error``: find out whether the group is in the store, then
        answer every request of it with what is true (module docstring)."""
        self.commit_failures += 1
        try:
            found = self._witnessed(ctx.witnesses)
            reopened = False
        except lmdb.Error:  # MDB_PANIC: LMDB failed to write the meta page; this handle is dead
            found, reopened = None, True
        try:
            if reopened:
                self._reopen()
                self._barrier()
                found = self._witnessed(ctx.witnesses)
            elif found:  # present after a reported failure (not what LMDB 0.9 does): make it durable
                self._barrier()
        except (lmdb.Error, OSError) as e:
            return self._stop(batch, f"{error}; then, finding out what was written: {e}")
        if found is None:
            return self._stop(batch, f"{error}; its records are only partly in the store")
        if found:
            log.error("the commit of a group of %d writes to %s reported %r, but the group is in the store "
                      "(checked%s): answered as committed", len(batch), self.path, str(error),
                      " after reopening the environment" if reopened else "")
            return self._applied(batch, ctx)
        if self._replica is not None:  # the log holds the group: the store is behind it until it catches up
            return self._stop(batch, f"{error}; the event log holds the group, this store does not (it catches up "
                                     "from the log at its next start)")
        log.error("the commit of a group of %d writes to %s failed (%s); nothing of it is in the store "
                  "(checked%s): answered storage-unavailable, not written", len(batch), self.path, error,
                  " after reopening the environment" if reopened else "")
        _fail_all(batch, _translate_write_error(error, self.path))

    def _witnessed(self, witnesses: list[tuple[str, bytes, bytes]]) -> bool | None:
        """Whether the group's writes are in the store, read in a fresh transaction: True if all
        are, False if none is (also when there is nothing to check), None if only some are."""
        with self._env.begin() as txn:  # the leader's own read: the gate is for other threads
            seen = [txn.get(key, db=self._db[db]) == value for db, key, value in witnesses]
        if not seen or not any(seen):
            return False
        return True if all(seen) else None

    def _reopen(self) -> None:
        """Close the dead environment and open it again, with every reader held at the gate (the
        lock on ``LOCK`` stays ours: no other process can slip in). What it shows is what a
        restarted server would show; ``_barrier`` then makes it durable."""

        def reopen() -> None:
            self._env_usable = False
            self._map_size = max(self._map_size, int(self._env.info()["map_size"]))
            self._env.close()
            self._open_env()
            self._env_usable = True

        self._gate.exclusive(reopen)
        self.reopens += 1
        self._versions.clear()
        self._head = read_head(self._env, self._db["log"])

    def _barrier(self) -> None:
        """A durable write over whatever the failed commit left: it takes the place of the meta
        page whose write failed (or, if that write made it, builds on it), so once it is synced
        what the store shows is what the disk holds."""
        with self._env.begin(write=True, db=self._db["meta"]) as txn:
            txn.put(b"recovered_at", _enc.encode(int(time.time() * 1000)))
        self._env.sync(True)

    def _stop(self, batch: list[Request], why: str) -> None:
        """Fail-stop (as PostgreSQL does after a failed fsync): the store cannot tell whether the
        group was written, so it takes no more writes and the next open decides. Every request of
        the group is told the outcome is unknown."""
        self._stopped = why
        log.critical("the event store at %s stopped accepting writes: a commit failed and its outcome could "
                     "not be determined (%s); restart the server: the store will show what was written",
                     self.path, why)
        _fail_all(batch, StorageUnavailable(
            "the event store could not confirm this write and stopped accepting writes; after a restart, "
            "retry with the same idempotency key: the original receipt comes back if it was written",
            outcome=UNKNOWN, reason="stopped", retry_after_ms=STOPPED_RETRY_AFTER_MS, path=self.path))

    def _grow_map(self, txn: Any) -> None:
        """Abort the group's transaction and double the map, with every reader held at the gate:
        py-lmdb remaps on that abort and a steady stream of readers would otherwise starve it."""
        current = int(self._env.info()["map_size"])
        ceiling = self.max_map_size
        if self.owned_shards is not None:  # shared: never grown (``SHARED_MAP_SIZE``)
            ceiling = current
        if ceiling is not None and current >= ceiling:
            txn.abort()
            raise StorageFull(
                f"the event store reached its map size ceiling of {ceiling} bytes; nothing was written",
                path=self.path,
            )
        new_size = current * 2 if ceiling is None else min(current * 2, ceiling)

        def resize() -> None:
            txn.abort()
            if self._on_map_resize is not None:
                self._on_map_resize()
            self._env.set_mapsize(new_size)
            self._map_size = new_size

        self._gate.exclusive(resize)
        self.map_resizes += 1

    def _maybe_prune(self, txn: Any) -> None:
        """Retention, in small slices inside ordinary write groups so it never blocks a writer."""
        now = time.monotonic()
        if now - self._last_prune < self._prune_interval:
            return
        self._last_prune = now
        wall = int(time.time() * 1000)
        budget = self._prune_batch
        budget -= prune_idem(txn, self._db, wall - self.idempotency_ttl_ms, budget)
        for prefix in list(feed_apps(txn, self._db["meta"])):
            if budget <= 0:
                break
            budget -= prune_feed_age(txn, self._db, prefix, wall - self.feed_ttl_ms, budget)

    def _current_version(self, txn: Any, skey: bytes) -> int:
        v = self._versions.get(skey)
        return v if v is not None else self._current_version_uncached(txn, skey)

    def rebuild_idempotency(self) -> int:
        """Rebuild the idempotency index from the log (receipts are committed with their events, so
        the log holds them all); returns receipts written."""
        cutoff = int(time.time() * 1000) - self.idempotency_ttl_ms
        claims, times = rebuilt_claims(self.iter_all_records(), cutoff)
        with self._gate, self._env.begin(write=True) as txn:
            txn.drop(self._db["idem"], delete=False)
            txn.drop(self._db["idem_time"], delete=False)
            for k, v in claims.items():
                txn.put(k, v, db=self._db["idem"])
            for k in times:
                txn.put(k, b"", db=self._db["idem_time"])
        return len(claims)


def _translate_write_error(e: lmdb.Error, path: str) -> StorageUnavailable:
    """The client's answer for a write LMDB refused and that is known not to be in the store."""
    text = str(e)
    if isinstance(e, (lmdb.MapFullError, lmdb.DiskError)) or "No space left" in text \
            or f"{errno.ENOSPC}" in text.split(":")[-1] or _nearly_full(path):
        return StorageFull(f"the disk holding the event store is full; nothing was written "
                           f"(retry after {RETRY_AFTER_MS} ms)", path=path)
    return StorageUnavailable(f"the event store could not write (I/O error); nothing was written "
                              f"(retry after {RETRY_AFTER_MS} ms)", reason="io-error", path=path)


def _nearly_full(path: str) -> bool:
    """LMDB reports a short write as ``EIO`` ("short write, filesystem full?", mdb.c): call the
    disk full when less than 1 MiB is left on it."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20


def _fail_all(batch: list[Request], error: StoreError) -> None:
    for req in batch:
        req.result, req.error = None, error

