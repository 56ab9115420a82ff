"""The shared worker loop: one asyncio event loop on its own thread for model calls and tools.

Actors never block on I/O: they hand coroutines to this loop and get the outcome
back as a message. Cancelling the returned future cancels the task on the loop
(``cancel()`` propagates an abort signal to model and tool).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")


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
