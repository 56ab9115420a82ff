"""The shared worker loop: coroutines handed in from actor threads, cancellable from any thread."""

from __future__ import annotations

import asyncio
import threading

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
