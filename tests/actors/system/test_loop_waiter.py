"""Completions handed from actor threads to an asyncio loop: ``Reply.future`` and ``LoopWaiter``."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sessionloop.actors.system.pubsub import LoopWaiter, Reply


def _in_thread(fn) -> None:  # type: ignore[no-untyped-def]
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def test_a_loop_waiter_set_from_another_thread_gives_its_value() -> None:
    async def main() -> object:
        waiter = LoopWaiter()
        _in_thread(lambda: waiter.set({"turn": 1}))
        return await asyncio.wait_for(waiter.future, 5)

    assert asyncio.run(main()) == {"turn": 1}


def test_a_loop_waiter_failed_from_another_thread_raises_the_error() -> None:
    async def main() -> None:
        waiter = LoopWaiter()
        _in_thread(lambda: waiter.fail(LookupError("refused")))
        await asyncio.wait_for(waiter.future, 5)

    with pytest.raises(LookupError, match="refused"):
        asyncio.run(main())


def test_only_the_first_completion_counts() -> None:
    async def main() -> object:
        waiter = LoopWaiter()
        waiter.set("first")
        waiter.fail(RuntimeError("late"))
        waiter.set("second")
        value = await asyncio.wait_for(waiter.future, 5)
        await asyncio.sleep(0)  # the later completions are settled on the loop and ignored
        return value

    assert asyncio.run(main()) == "first"


def test_a_burst_of_completions_from_many_threads_reaches_every_waiter() -> None:
    async def main() -> list[int]:
        waiters = [LoopWaiter() for _ in range(2000)]
        threads = [threading.Thread(target=lambda k=k: [w.set(i) for i, w in enumerate(waiters) if i % 8 == k])
                   for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return list(await asyncio.wait_for(asyncio.gather(*(w.future for w in waiters)), 5))

    assert asyncio.run(main()) == list(range(2000))


def test_a_completion_after_the_loop_closed_is_dropped_quietly() -> None:
    async def make() -> LoopWaiter:
        return LoopWaiter()

    waiter = asyncio.run(make())  # asyncio.run closes the loop
    waiter.set("nobody waits")  # must not raise
    waiter.fail(RuntimeError("nobody waits"))
    assert not waiter.future.done()


def test_a_reply_future_carries_the_value_or_the_error_of_the_reply() -> None:
    async def main() -> tuple[object, BaseException | None]:
        ok, bad = Reply(), Reply()
        ok_future, bad_future = ok.future(), bad.future()
        _in_thread(lambda: (ok.set(42), bad.fail(ValueError("no such session"))))
        value = await asyncio.wait_for(ok_future, 5)
        try:
            await asyncio.wait_for(bad_future, 5)
        except ValueError as e:
            return value, e
        return value, None

    value, error = asyncio.run(main())
    assert value == 42
    assert isinstance(error, ValueError) and str(error) == "no such session"
