"""Group commit: concurrent writers coalesce into one write transaction.

Leader/follower, as in RocksDB's write groups: a writer that finds no commit under way becomes
the leader and commits everything queued so far, its own request included, in one transaction;
writers that arrive meanwhile queue up and sleep. When the leader's transaction is committed it
wakes each of them with its result and promotes the first writer queued since to lead the next
group. A lone writer therefore commits in its own thread with no hand-off, and many writers pay
one fsync per group instead of one each. Every caller returns only after the transaction that
holds its request committed (or failed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .errors import StoreClosed


class Request:
    """One unit of work for the writer; ``apply`` runs inside the group's write transaction."""

    __slots__ = ("payload", "result", "error", "_wake", "_promoted")

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.result: Any = None
        self.error: BaseException | None = None
        self._wake = threading.Lock()
        self._wake.acquire()
        self._promoted = False


class GroupCommitter:
    """Runs ``commit_batch(requests)`` for groups of concurrently submitted requests.

    ``commit_batch`` must set ``result`` or ``error`` on every request of the batch it is given.
    """

    def __init__(self, commit_batch: Callable[[list[Request]], None], max_batch: int = 512) -> None:
        self._commit_batch = commit_batch
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: list[Request] = []
        self._leading = False
        self._closed = False
        self._idle = threading.Condition(self._lock)
        self.batches = 0
        self.requests = 0

    def submit(self, payload: Any) -> Any:
        """Queue ``payload``, wait until its group committed, return its result or raise its error."""
        req = Request(payload)
        with self._lock:
            if self._closed:
                raise StoreClosed()
            self._queue.append(req)
            lead = not self._leading
            if lead:
                self._leading = True
        if not lead:
            req._wake.acquire()
            lead = req._promoted
        if lead:
            self._lead(req)
        if req.error is not None:
            raise req.error
        return req.result

    def _lead(self, own: Request) -> None:
        while True:
            with self._lock:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
            try:
                self._commit_batch(batch)
            except BaseException as e:  # the transaction failed: no request of it was committed
                for req in batch:
                    req.result, req.error = None, e
            self.batches += 1
            self.requests += len(batch)
            for req in batch:
                if req is not own:
                    req._wake.release()
            with self._lock:
                if own in batch:
                    if self._queue:
                        nxt = self._queue[0]
                        nxt._promoted = True
                        nxt._wake.release()
                    else:
                        self._leading = False
                        self._idle.notify_all()
                    return
            # ``own`` was beyond the first max_batch: keep leading until it is committed.

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new requests and wait for the group under way to finish."""
        with self._lock:
            self._closed = True
            self._idle.wait_for(lambda: not self._leading, timeout=timeout)
