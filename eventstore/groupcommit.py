"""Group commit: concurrent writers coalesce into one write transaction.

Leader/follower, as in RocksDB's write groups: a writer that finds no commit under way becomes
the leader and commits everything queued so far, its own request included, in one transaction;
writers that arrive meanwhile queue up and sleep. When the leader's transaction is committed it
wakes each of them with its result and promotes the first writer queued since to lead the next
group. A lone writer therefore commits in its own thread with no hand-off, and many writers pay
one fsync per group instead of one each. Every caller returns only after the transaction that
holds its request committed (or failed).

``submit_async`` is the same without the wait, for callers that have other work while the group
commits (a pooled session actor hands its pool thread to other sessions, as Akka Persistence's
``persist`` stashes commands until the journal confirms): the request is queued and a dedicated
writer thread leads the groups that no waiting caller leads; ``done(result, error)`` is called
on the leading thread once the request's transaction committed or failed. With ``inline_async``
(a store whose commits do not wait for the disk, ``nosync``) an asynchronous request that finds
no group under way is led on its own thread, as a waiting caller's is: a commit that costs tens of
microseconds is not worth two thread hand-offs (to the writer and back to the caller's pool),
which at a moderate load, where most groups hold one request, cost more than the commit itself.
While that group commits, requests that arrive queue up and the writer thread leads them, as before.

Observations for metrics (:class:`CommitStats`): the leader times each group's transaction,
counts its requests, and times every request of a timed kind from its submission to the moment
its group is durable. Only the leader writes them and one thread leads at a time, so they take
no lock; a reader (a metrics scrape) copies them.
"""

from __future__ import annotations

import bisect
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessionloop.eventstore.errors import StoreClosed

log = logging.getLogger("sessionloop.eventstore")

#: Upper bounds (inclusive, as Prometheus' ``le``) of the buckets; one more bucket is +Inf.
COMMIT_SECONDS_BOUNDS = (.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1.0, 2.5)
APPEND_SECONDS_BOUNDS = (.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1.0, 2.5, 5.0)
BATCH_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """A copy of :class:`Observations`: ``counts`` per bucket (not cumulative; the last is +Inf)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)


class Observations:
    """Bucket counts (the last one +Inf) and the sum of one measured quantity, written by one
    thread at a time (the group leader here; each thread's own tally in ``actors.system.metrics``)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum: float = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def add(self, other: Observations) -> None:
        """Fold in ``other`` (same bounds): the metrics sum per-thread tallies this way."""
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.sum += other.sum

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(self.bounds, tuple(self.counts), self.sum)


class CommitStats:
    """What the group leader observes: each group's transaction time (``commit_seconds``, from
    the start of its write transaction to its commit, failed ones and map-resize retries
    included) and size (``batch_size``, requests), and each timed request's latency
    (``append_seconds``, from its submission to its group's durable commit; requests that
    failed are not counted)."""

    __slots__ = ("commit_seconds", "batch_size", "append_seconds")

    def __init__(self) -> None:
        self.commit_seconds = Observations(COMMIT_SECONDS_BOUNDS)
        self.batch_size = Observations(BATCH_SIZE_BOUNDS)
        self.append_seconds = Observations(APPEND_SECONDS_BOUNDS)

    def snapshot(self) -> dict[str, HistogramSnapshot]:
        return {"commit_seconds": self.commit_seconds.snapshot(), "batch_size": self.batch_size.snapshot(),
                "append_seconds": self.append_seconds.snapshot()}


class Request:
    """One unit of work for the writer; ``apply`` runs inside the group's write transaction."""

    __slots__ = ("payload", "result", "error", "_wake", "_promoted", "done", "submitted")

    def __init__(self, payload: Any, done: Callable[[Any, BaseException | None], None] | None = None) -> None:
        self.payload = payload
        self.submitted = time.perf_counter()
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = done  # set for an asynchronous request: nobody waits on ``_wake``
        if done is None:
            self._wake = threading.Lock()
            self._wake.acquire()
        self._promoted = False


class GroupCommitter:
    """Runs ``commit_batch(requests)`` for groups of concurrently submitted requests.

    ``commit_batch`` must set ``result`` or ``error`` on every request of the batch it is given.
    Requests whose payload is of a type in ``timed`` have their latency observed in ``stats``.
    """

    def __init__(self, commit_batch: Callable[[list[Request]], None], max_batch: int = 512,
                 timed: tuple[type, ...] = (), inline_async: bool = False) -> None:
        self._commit_batch = commit_batch
        self._inline_async = inline_async
        self._timed = frozenset(timed)
        self.stats = CommitStats()
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: list[Request] = []
        self._leading = False
        self._closed = False
        self._idle = threading.Condition(self._lock)
        self.batches = 0
        self.requests = 0
        self._writer_wake: queue.SimpleQueue[bool] = queue.SimpleQueue()  # the writer thread sleeps on it
        self._writer: threading.Thread | None = None

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

    def lead_on_writer(self) -> None:
        """From now on every asynchronous request is led on the writer thread (no ``inline_async``):
        for a store whose commits wait on something slow (the replicated log)."""
        self._inline_async = False

    def submit_async(self, payload: Any, done: Callable[[Any, BaseException | None], None]) -> None:
        """Queue ``payload`` and return at once; ``done(result, error)`` follows the commit.

        ``done`` runs on the thread that led the group (the writer thread or a waiting caller)
        and must be quick: it should only hand the outcome on. With ``inline_async`` it may run
        before this returns, on this thread (no group was under way: this one led its own).
        """
        req = Request(payload, done)
        with self._lock:
            if self._closed:
                raise StoreClosed()
            self._queue.append(req)
            if self._leading:
                return
            self._leading = True
            if not self._inline_async:
                self._ensure_writer()
        if self._inline_async:
            self._lead(req)
        else:
            self._writer_wake.put(True)

    def _ensure_writer(self) -> None:
        if self._writer is None:  # started on first use: a store only read never has one
            self._writer = threading.Thread(target=self._write_loop, name="sessionloop-writer", daemon=True)
            self._writer.start()

    def _write_loop(self) -> None:
        while self._writer_wake.get():
            self._lead(None)

    def _lead(self, own: Request | None) -> None:
        while True:
            with self._lock:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
            started = time.perf_counter()
            try:
                self._commit_batch(batch)
            except BaseException as e:  # raised before the commit (a bug): nothing of it was committed
                for req in batch:
                    req.result, req.error = None, e
            acked = time.perf_counter()
            self.batches += 1
            self.requests += len(batch)
            stats, timed = self.stats, self._timed  # only the leader writes them: no lock
            stats.commit_seconds.observe(acked - started)
            stats.batch_size.observe(len(batch))
            for req in batch:
                if req.error is None and type(req.payload) in timed:
                    stats.append_seconds.observe(acked - req.submitted)
                if req.done is not None:
                    try:
                        req.done(req.result, req.error)
                    except BaseException:  # noqa: BLE001 - one caller's hand-off must not stall the group
                        log.exception("commit callback failed")
                elif req is not own:
                    req._wake.release()
            with self._lock:
                if own is None or own in batch:
                    if not self._queue:
                        self._leading = False
                        self._idle.notify_all()
                        return
                    nxt = self._queue[0]
                    if nxt.done is None:  # a caller waits for it: it leads the next group itself
                        nxt._promoted = True
                        nxt._wake.release()
                        return
                    if own is not None:  # only asynchronous requests wait: the writer thread leads
                        self._ensure_writer()
                        self._writer_wake.put(True)
                        return
            # the writer thread, or ``own`` beyond the first max_batch: keep leading.

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new requests and wait for the group under way to finish."""
        with self._lock:
            self._closed = True
            self._idle.wait_for(lambda: not self._leading, timeout=timeout)
        if self._writer is not None:
            self._writer_wake.put(False)
