"""Opening the LMDB environment of the event store: its directory, lock, flags and databases.

What :class:`~eventstore.lmdb_recorder.LmdbRecorder` does once when it opens (and again, for the
environment only, after a fatal commit error or a compaction): the directory and its files made
owner-only (the store holds every session's conversation), an ``flock`` on ``LOCK`` that refuses a
second writing process with :class:`StoreLocked` instead of risking corruption, the environment
opened with the durability asked for and its flags read back (``durability_mismatch``), the named
databases (``keys.py`` has their layout), and the ``meta`` records: format and shard count.

Also the read gate: many readers, or one resize. LMDB's map may change only with no transaction
open in the process, so every read passes the gate, which a resize (or a reopen) closes for as
long as it takes.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import lmdb
import msgspec

from sessionloop.eventstore import keys as K
from sessionloop.eventstore.errors import RETRY_AFTER_MS, StorageError, StorageUnavailable, StoreLocked

__all__ = [
    "DATABASES",
    "FORMAT_VERSION",
    "ReadGate",
    "durability_mismatch",
    "init_meta",
    "open_environment",
    "owner_only",
    "read_head",
    "take_lock",
    "adopt_lock",
]

#: the on-disk format this release reads and writes (``meta``'s ``format`` record)
FORMAT_VERSION = 1

#: the named databases of a store
DATABASES = ("meta", "log", "streams", "catalogue", "snapshots", "idem", "idem_time", "feed", "stream_meta",
             "flags", "outbox", "dead", "snapshot_parts")
#: databases added after the format's first release (``outbox.py``, snapshot parts): absent from an
#: older store opened read-only
LATER_DATABASES = ("outbox", "dead", "snapshot_parts")

_enc = msgspec.msgpack.Encoder()
_any_dec = msgspec.msgpack.Decoder()


class _Reads:
    """One thread's reads under way (``ReadGate``): only that thread writes ``depth``."""

    __slots__ = ("depth",)

    def __init__(self) -> None:
        self.depth = 0


class ReadGate:
    """Many readers, or one resize: LMDB's map may change only with no transaction open.

    A read takes no lock: it marks its own thread as reading, then checks whether a resize is
    asked for (and if so unmarks itself and waits); a resize marks that it is asked for, then waits
    until no thread is marked. Either the reader sees the resize asked for or the resize sees the
    reader, since each writes its mark before it reads the other's (statements of one interpreter
    under the GIL run one at a time, in order). A read nested in another on the same thread goes on
    during a resize (the resize waits for the outer one): with one counter for all threads, as
    before, the nested read waited for the resize and the resize for the outer read. Every read of
    the store passes here twice; taking no lock for it changed no measured CPU per turn
    (benchmarks/README.md, 2026-12-03).
    """

    __slots__ = ("_cond", "_local", "_threads", "_resizing")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._local = threading.local()  # .reads: this thread's _Reads
        #: every reading thread's marks, for a resize to look at (a thread's go when it ends)
        self._threads: weakref.WeakKeyDictionary[threading.Thread, _Reads] = weakref.WeakKeyDictionary()
        self._resizing = False

    def __enter__(self) -> None:
        try:
            mine: _Reads = self._local.reads
        except AttributeError:
            mine = self._local.reads = _Reads()
            with self._cond:
                self._threads[threading.current_thread()] = mine
        while True:
            mine.depth += 1
            if not self._resizing or mine.depth > 1:  # a nested read: the resize waits for its outer one
                return
            mine.depth -= 1
            with self._cond:
                self._cond.notify_all()
                self._cond.wait_for(lambda: not self._resizing)

    def __exit__(self, kind: object, error: object, tb: object) -> None:
        self._local.reads.depth -= 1
        if self._resizing:
            with self._cond:
                self._cond.notify_all()
        if isinstance(error, lmdb.PanicError):  # the writer is reopening the environment after a failed commit
            raise StorageUnavailable(f"the event store could not be read ({error}); retry after "
                                     f"{RETRY_AFTER_MS} ms") from error

    def _reading(self) -> bool:
        return any(t.depth for t in list(self._threads.values()))

    def exclusive(self, fn: Callable[[], None]) -> None:
        with self._cond:
            while self._resizing:  # one resize at a time
                self._cond.wait()
            self._resizing = True
            try:
                while self._reading():
                    self._cond.wait(0.01)  # a reader that finishes notifies; the timeout is a backstop
                fn()
            finally:
                self._resizing = False
                self._cond.notify_all()


def durability_mismatch(durability: str, flags: Mapping[str, Any]) -> str | None:
    """What is wrong when LMDB's own flags (``Environment.flags()``, read back after opening) do
    not give ``durability``: ``sync`` needs the data and the meta page flushed at every commit,
    ``nosync`` neither; ``None`` when they agree."""
    want = durability == "sync"
    got = {name: bool(flags.get(name)) for name in ("sync", "metasync")}
    if all(value == want for value in got.values()):
        return None
    return (f"durability {durability!r} asked for sync={want}, metasync={want}, but LMDB reports "
            f"sync={got['sync']}, metasync={got['metasync']}")


def open_environment(path: str, *, map_size: int, max_readers: int, durability: str,
                     readonly: bool) -> tuple[lmdb.Environment, Mapping[str, Any], dict[str, Any]]:
    """The environment at ``path``, its flags as LMDB reports them (read back, not what was asked
    for) and its named databases by name (created unless ``readonly``). Raises ``lmdb.Error``."""
    env = lmdb.open(
        path,
        map_size=map_size,
        max_dbs=len(DATABASES) + 2,
        max_readers=max_readers,
        sync=durability == "sync",
        metasync=durability == "sync",
        readonly=readonly,
        readahead=False,
        lock=True,
        writemap=False,
        mode=0o600,  # the store holds every session's conversation: the server's user only
    )
    flags = env.flags()
    dbs = {}
    for name in DATABASES:
        try:
            dbs[name] = env.open_db(name.encode(), create=not readonly)
        except lmdb.NotFoundError:
            if name not in LATER_DATABASES:
                raise
            # a store last written before this database existed, opened read-only: reads of it find nothing
    return env, flags, dbs


def take_lock(path: str) -> int:
    """An exclusive ``flock`` on ``LOCK`` in the store's directory, with our pid written in it; the
    descriptor is returned (closing it releases the lock). Raises :class:`StoreLocked` naming the
    holder when another process has it."""
    lock_path = os.path.join(path, "LOCK")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = "unknown process"
        try:
            pid = os.pread(fd, 32, 0).decode().strip()
            holder = f"pid {pid}" if pid else holder
        finally:
            os.close(fd)
        raise StoreLocked(path, holder) from e
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def adopt_lock(path: str, fd: int) -> int:
    """``fd``, an inherited descriptor of ``LOCK`` in ``path`` on which the parent (``serve
    --workers``) holds the exclusive ``flock``: a ``flock`` belongs to the open file, so a worker
    that inherited it holds the same lock (another server still gets :class:`StoreLocked`, also
    while an orphaned worker lives). Raises StoreLocked when ``fd`` is not that file or another
    process holds the lock on it."""
    lock_path = os.path.join(path, "LOCK")
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
    except OSError:
        same = False
    if not same:
        raise StoreLocked(path, f"descriptor {fd} is not {lock_path}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: the same open file
    except OSError as e:
        raise StoreLocked(path, "another process, not the worker's parent") from e
    return fd


def init_meta(env: lmdb.Environment, meta_db: Any, path: str, *, readonly: bool, shards: int) -> int:
    """The store's shard count: read from ``meta`` (checking the format), or, for a new store,
    ``shards`` written there with the format and the creation time. Raises :class:`StorageError`
    for a store of another format or a read-only open of an uninitialised one, ``ValueError``
    for a shard count out of 1..65535."""
    with env.begin(db=meta_db, write=not readonly) as txn:
        raw = txn.get(b"shards")
        if raw is not None:
            fmt = _any_dec.decode(txn.get(b"format", b"null"))  # no format: not a store of ours
            if fmt != FORMAT_VERSION:
                raise StorageError(
                    f"event store at {path} has format {fmt}, this release reads {FORMAT_VERSION}"
                )
            return int(_any_dec.decode(raw))
        if readonly:
            raise StorageError(f"event store at {path} is not initialised")
        if not 1 <= shards <= 65535:
            raise ValueError(f"shards must be in 1..65535, not {shards}")
        txn.put(b"format", _enc.encode(FORMAT_VERSION))
        txn.put(b"shards", _enc.encode(shards))
        txn.put(b"created_at", _enc.encode(int(time.time() * 1000)))
        return shards


def read_head(env: lmdb.Environment, log_db: Any) -> int:
    """The position of the last event in the log (0 for an empty store)."""
    with env.begin(db=log_db) as txn:
        cur = txn.cursor()
        return K.from_u64(cur.key()) if cur.last() else 0


def owner_only(path: str) -> None:
    """Make the store's directory 0700 and its files 0600 (a store made before they were)."""
    os.chmod(path, 0o700)
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isfile(full) and not os.path.islink(full):
            os.chmod(full, 0o600)
