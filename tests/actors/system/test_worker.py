"""The shared worker loop: coroutines handed in from actor threads, cancellable from any thread."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from sessionloop.actors.system.worker import WorkerLoop


@pytest.fixture
def worker():
    w = WorkerLoop()
    yield w
    w.stop()


def test_coroutines_started_from_many_threads_each_run_once(worker):
    ran: list[int] = []
    lock = threading.Lock()
    all_ran = threading.Event()

    async def effect(i: int) -> None:
        await asyncio.sleep(0)
        with lock:
            ran.append(i)
            if len(ran) == 800:
                all_ran.set()

    def starter(k: int) -> None:
        for j in range(100):
            worker.start(effect(k * 100 + j))

    threads = [threading.Thread(target=starter, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all_ran.wait(5)
    assert sorted(ran) == list(range(800))


def test_cancel_reaches_a_running_task(worker):
    started, outcome = threading.Event(), []
    finished = threading.Event()

    async def long() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
            outcome.append("slept")
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        finally:
            finished.set()

    handle = worker.start(long())
    assert started.wait(5)
    handle.cancel()
    assert finished.wait(5)
    assert outcome == ["cancelled"]


def test_a_task_cancelled_before_the_loop_took_it_never_runs(worker):
    ran: list[str] = []
    gate = threading.Event()
    worker.call_soon(gate.wait, 5)  # keep the loop busy so the next start waits in the batch

    async def effect() -> None:
        ran.append("ran")

    handle = worker.start(effect())
    handle.cancel()
    gate.set()
    done = threading.Event()
    worker.call_soon(done.set)
    assert done.wait(5)
    assert ran == []


def test_deadlines_run_once_in_order_on_the_loop_and_cancelled_ones_never(worker):
    ran: list[tuple[str, bool]] = []
    finished = threading.Event()

    def mark(name: str) -> Any:
        def fn() -> None:
            ran.append((name, threading.current_thread() is worker.thread))
            if name == "last":
                finished.set()
        return fn

    worker.later(0.06, mark("second"))
    dropped = worker.later(0.03, mark("cancelled"))
    worker.later(0.02, mark("first"))
    worker.later(0.09, mark("last"))
    worker.deadlines.cancel(dropped)
    worker.deadlines.cancel(dropped)  # twice is once
    assert finished.wait(5)
    assert ran == [("first", True), ("second", True), ("last", True)]
    assert len(worker.deadlines) == 0


def test_a_deadline_does_not_run_before_its_delay_and_a_failing_one_keeps_the_others(worker):
    started = time.monotonic()
    times: list[float] = []
    done = threading.Event()

    def boom() -> None:
        raise RuntimeError("deadline bug")

    worker.later(0.05, boom)
    worker.later(0.05, lambda: (times.append(time.monotonic() - started), done.set()))
    assert done.wait(5)
    assert times[0] >= 0.05


def test_deadlines_due_after_the_armed_one_cost_the_loop_no_wake_up_and_cancelled_ones_are_dropped():
    """A waitForTurn's timeout is set for minutes and cancelled within milliseconds: thousands of
    them wake the loop once (the first), and the heap does not keep what was cancelled."""
    worker = WorkerLoop()
    wakes = 0
    real = worker.loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal wakes
        wakes += 1
        return real(*args, **kwargs)

    worker.loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    try:
        entries = [worker.later(60 + i / 1000, lambda: None) for i in range(5_000)]
        assert wakes == 1
        for entry in entries:
            worker.deadlines.cancel(entry)
        assert len(worker.deadlines) == 0
        assert len(worker.deadlines._heap) <= 64  # noqa: SLF001 - the marked ones were let go
        fired = threading.Event()
        worker.later(0.01, fired.set)  # due before the armed one: the loop is woken for it
        assert wakes == 2
        assert fired.wait(5)
    finally:
        worker.stop()
