"""The shared worker loop: one asyncio event loop on its own thread for model calls and tools.

Actors never block on I/O: they hand coroutines to this loop and get the outcome
back as a message. Cancelling the returned future cancels the task on the loop
(``cancel()`` propagates an abort signal to model and tool).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("sessionloop.worker")


class LoopBatch(Generic[T]):
    """Items handed to an event loop from other threads in batches: the first item since the
    loop last took them schedules one ``take(items)`` there, so a burst costs one wake-up of the
    loop (one self-pipe write) instead of one per item, which matters at thousands of turns/s."""

    def __init__(self, loop: asyncio.AbstractEventLoop, take: Callable[[list[T]], None]) -> None:
        self.loop = loop
        self._take = take
        self._lock = threading.Lock()
        self._items: list[T] = []

    def add(self, item: T) -> None:
        """Queue ``item``; RuntimeError if the loop is closed."""
        with self._lock:
            self._items.append(item)
            first = len(self._items) == 1
        if first:
            self.loop.call_soon_threadsafe(self._run)

    def drain(self) -> list[T]:
        """What is queued and not taken yet (for a loop that will not run again)."""
        with self._lock:
            items, self._items = self._items, []
        return items

    def _run(self) -> None:
        self._take(self.drain())


class Deadline:
    """One callback of :class:`Deadlines`; ``fn`` is None once it ran or was cancelled."""

    __slots__ = ("when", "fn")

    def __init__(self, when: float, fn: Callable[[], object]) -> None:
        self.when = when
        self.fn: Callable[[], object] | None = fn

    def __lt__(self, other: Deadline) -> bool:
        return self.when < other.when


class Deadlines:
    """Callbacks due after a delay, set and cancelled from any thread, run on one event loop.

    ``loop.call_soon_threadsafe(loop.call_later, delay, fn)`` costs the loop a wake-up to set the
    timer and another when it fires, also after what it guarded has ended: every
    ``loop/waitForTurn`` over the wire left a timer of up to two minutes behind, and at hundreds of
    turns a second the loop woke for each twice. Here a deadline is an entry in a heap under a
    lock: setting one wakes the loop only when it is due before every deadline the loop is set for,
    cancelling one only marks it (the heap is rebuilt without the marked ones when they are most
    of it), and the loop wakes once for all that are due within ``slack`` of each other.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, slack: float = 0.002) -> None:
        self._loop = loop
        self._slack = slack
        self._lock = threading.Lock()
        self._heap: list[Deadline] = []
        self._cancelled = 0
        self._armed: float | None = None  # when the loop's one timer is set for (or about to be)
        self._timer: asyncio.TimerHandle | None = None  # the loop's thread only

    def __len__(self) -> int:
        """Deadlines set and neither run nor cancelled."""
        with self._lock:
            return len(self._heap) - self._cancelled

    def add(self, delay: float, fn: Callable[[], object]) -> Deadline:
        """Run ``fn`` on the loop ``delay`` seconds from now, unless :meth:`cancel` comes first;
        RuntimeError if the loop is closed."""
        entry = Deadline(time.monotonic() + max(0.0, delay), fn)
        with self._lock:
            heapq.heappush(self._heap, entry)
            wake = self._armed is None or entry.when < self._armed - self._slack
            if wake:
                self._armed = entry.when
        if wake:
            self._loop.call_soon_threadsafe(self._arm)
        return entry

    def cancel(self, entry: Deadline) -> None:
        """``entry`` will not run (a no-op once it ran)."""
        with self._lock:
            if entry.fn is None:
                return
            entry.fn = None
            self._cancelled += 1
            if self._cancelled > 64 and 2 * self._cancelled > len(self._heap):
                self._heap = [e for e in self._heap if e.fn is not None]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _arm(self) -> None:
        """Set the loop's timer for the earliest deadline not cancelled (on the loop)."""
        with self._lock:
            heap = self._heap
            while heap and heap[0].fn is None:
                heapq.heappop(heap)
                self._cancelled -= 1
            when = heap[0].when if heap else None
            self._armed = when
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if when is not None:
            self._timer = self._loop.call_later(max(0.0, when - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        due: list[Callable[[], object]] = []
        now = time.monotonic() + self._slack
        with self._lock:
            heap = self._heap
            while heap and heap[0].when <= now:
                entry = heapq.heappop(heap)
                fn, entry.fn = entry.fn, None
                if fn is None:
                    self._cancelled -= 1
                else:
                    due.append(fn)
        for fn in due:
            try:
                fn()
            except Exception:  # one deadline's failure must not keep the others from running
                log.exception("a deadline's callback failed")
        self._arm()


class TaskHandle:
    """What ``WorkerLoop.start`` gives back: ``cancel()`` from any thread cancels the task."""

    __slots__ = ("_worker", "task", "cancelled")

    def __init__(self, worker: WorkerLoop) -> None:
        self._worker = worker
        self.task: asyncio.Task[Any] | None = None  # set on the loop when the task is made
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True  # a task not made yet is never started
        self._worker.call_soon(self._cancel_on_loop)

    def _cancel_on_loop(self) -> None:
        if self.task is not None:
            self.task.cancel()


class WorkerLoop:
    def __init__(self, name: str = "sessionloop-worker") -> None:
        self.loop = asyncio.new_event_loop()
        self._incoming: LoopBatch[tuple[Coroutine[Any, Any, Any], TaskHandle]] = LoopBatch(
            self.loop, self._create_tasks)
        #: callbacks after a delay, set from any thread (``later``)
        self.deadlines = Deadlines(self.loop)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; thread-safe; the future's ``cancel()`` cancels the task."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def start(self, coro: Coroutine[Any, Any, Any]) -> TaskHandle:
        """Run ``coro`` on the loop as a task whose outcome the coroutine itself hands on.

        The cheap path for the many short effects of turns (a tool run, a model call): no
        ``concurrent.futures.Future`` per call, and the coroutines started while the loop has
        not woken yet ride one wake-up (one self-pipe write) in a batch.
        """
        handle = TaskHandle(self)
        self._incoming.add((coro, handle))
        return handle

    def _create_tasks(self, batch: list[tuple[Coroutine[Any, Any, Any], TaskHandle]]) -> None:
        create = self.loop.create_task
        for coro, handle in batch:
            if handle.cancelled:
                coro.close()
                continue
            handle.task = create(coro)

    def call_soon(self, fn: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def later(self, delay: float, fn: Callable[[], object]) -> Deadline:
        """Run ``fn`` on the loop after ``delay`` seconds; thread-safe, cancel with
        ``deadlines.cancel``; RuntimeError if the loop is closed."""
        return self.deadlines.add(delay, fn)

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what still runs, then stop the loop and join its thread."""
        if not self.loop.is_running():
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(timeout)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            for coro, _ in self._incoming.drain():  # never started
                coro.close()
            self.loop.close()
