"""Each app's unfinished turns, counted for the per-app quota (200 by default).

A session actor takes a slot when it accepts an input (``reserve``: refused when the app is at its
limit) and gives slots back as turns end or the actor stops (``add``). One process counts in memory
(:class:`LocalAppCounts`). The workers of ``serve --workers N`` count in one file they all map
(:class:`SharedAppCounts`), so the limit holds across all of them exactly: a reservation reads
every worker's count of the app and adds to its own under a lock on that file (an ``flock``, held
for a few microseconds; nothing is waited for that another process holds longer); giving slots
back takes no file lock (only a worker writes its own count, in one aligned store). Each worker has
its own column: a worker that is started again zeroes its column (what its previous incarnation
had ended with it; its sessions count themselves again as they resume).
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import threading
from typing import Protocol

__all__ = ["AppCounts", "LocalAppCounts", "SharedAppCounts"]


class AppCounts(Protocol):
    def reserve(self, app_id: str, limit: int) -> bool: ...

    def add(self, app_id: str, delta: int) -> None: ...

    def count(self, app_id: str) -> int: ...


class LocalAppCounts:
    """The counts of one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def reserve(self, app_id: str, limit: int) -> bool:
        with self._lock:
            taken = self._counts.get(app_id, 0)
            if taken >= limit:
                return False
            self._counts[app_id] = taken + 1
            return True

    def add(self, app_id: str, delta: int) -> None:
        with self._lock:
            self._counts[app_id] = self._counts.get(app_id, 0) + delta

    def count(self, app_id: str) -> int:
        with self._lock:
            return self._counts.get(app_id, 0)


_MAGIC = b"slappcnt"
_HEADER = struct.Struct("<8sII")  # magic, workers, slots
SLOTS = 4096  # apps a data directory's workers count (open addressing by the app id's hash)


class SharedAppCounts:
    """The counts of the workers of one data directory, in the file at ``path`` (made by the
    supervisor with :meth:`create` before the workers start)."""

    def __init__(self, path: str, worker: int) -> None:
        self._fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(self._fd).st_size
            self._map = mmap.mmap(self._fd, size)
        except BaseException:
            os.close(self._fd)
            raise
        magic, self.workers, self.slots = _HEADER.unpack_from(self._map, 0)
        if magic != _MAGIC or not 0 <= worker < self.workers:
            self.close()
            raise ValueError(f"{path} is not the app counts file of worker {worker}")
        self.worker = worker
        self._row_size = struct.calcsize(f"<Q{self.workers}i")  # an app's key, then each worker's count
        # the counts as ints of the machine's own order (the file never leaves it), each 4-byte
        # aligned: a worker's count changes in one store, so another worker reads it whole
        self._ints = memoryview(self._map).cast("i")
        self._lock = threading.Lock()  # the flock is the process's: its threads take turns here first
        self._slots: dict[str, int] = {}  # app id -> its slot, found once (under the lock)
        with self._locked():
            for slot in range(self.slots):  # what this worker's previous incarnation counted ended with it
                self._ints[self._counts_at(slot) + worker] = 0

    @classmethod
    def create(cls, path: str, workers: int) -> None:
        """A new, zeroed file for ``workers`` workers (every count is of a turn that ended with the
        processes that counted it)."""
        size = _HEADER.size + SLOTS * struct.calcsize(f"<Q{workers}i")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            os.pwrite(fd, _HEADER.pack(_MAGIC, workers, SLOTS), 0)
        finally:
            os.close(fd)

    def _offset(self, slot: int) -> int:
        return _HEADER.size + slot * self._row_size

    def _locked(self) -> _FileLock:
        return _FileLock(self._lock, self._fd)

    def _slot(self, app_id: str, create: bool) -> int | None:
        slot = self._slots.get(app_id)
        if slot is not None:  # an app's slot never moves once taken (slots are never freed)
            return slot
        slot = self._find_slot(app_id, create)
        if slot is not None:
            self._slots[app_id] = slot
        return slot

    def _find_slot(self, app_id: str, create: bool) -> int | None:
        key = int.from_bytes(hashlib.blake2b(app_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                             "little") or 1
        start = key % self.slots
        for i in range(self.slots):
            slot = (start + i) % self.slots
            found = struct.unpack_from("<Q", self._map, self._offset(slot))[0]
            if found == key:
                return slot
            if found == 0:
                if not create:
                    return None
                struct.pack_into("<Q", self._map, self._offset(slot), key)
                return slot
        raise RuntimeError(f"the app counts file has no room for another app ({self.slots} slots)")

    def _counts_at(self, slot: int) -> int:
        """The index in ``_ints`` of worker 0's count in ``slot`` (the others follow it)."""
        return (self._offset(slot) + 8) // 4

    def reserve(self, app_id: str, limit: int) -> bool:
        """Under the file's lock: no two workers both take the app's last slot."""
        with self._locked():
            slot = self._slot(app_id, True)
            assert slot is not None
            at = self._counts_at(slot)
            if sum(self._ints[at:at + self.workers]) >= limit:
                return False
            self._ints[at + self.worker] += 1
            return True

    def add(self, app_id: str, delta: int) -> None:
        """Only this worker writes its count: no file lock (a reservation elsewhere reads it before
        or after, as if the two had taken turns); the app's slot is found under it once."""
        slot = self._slots.get(app_id)
        if slot is None:
            with self._locked():
                slot = self._slot(app_id, True)
                assert slot is not None
        at = self._counts_at(slot) + self.worker
        with self._lock:
            self._ints[at] += delta

    def count(self, app_id: str) -> int:
        slot = self._slots.get(app_id)
        if slot is None:
            with self._locked():
                slot = self._slot(app_id, False)
            if slot is None:
                return 0
        at = self._counts_at(slot)
        return sum(self._ints[at:at + self.workers])

    def close(self) -> None:
        ints = getattr(self, "_ints", None)
        if ints is not None:
            ints.release()
        self._map.close()
        os.close(self._fd)


class _FileLock:
    def __init__(self, lock: threading.Lock, fd: int) -> None:
        self._lock = lock
        self._fd = fd

    def __enter__(self) -> None:
        self._lock.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._lock.release()
