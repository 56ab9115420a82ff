"""The per-model limiter (``actors/model/limits.py``): concurrency in FIFO order, requests and
tokens per minute, cancellation while waiting, and the counters ``/metrics`` reads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from sessionloop.actors.model.limits import Limiter, ModelLimits, RetryPolicy


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


async def until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.005)


def test_slots_beyond_the_concurrency_limit_are_granted_in_arrival_order_as_others_are_released() -> None:
    async def scenario() -> None:
        limiter = Limiter(ModelLimits(max_concurrency=2))
        held = [await limiter.acquire(), await limiter.acquire()]
        order: list[int] = []

        async def wait(n: int) -> None:
            slot = await limiter.acquire()
            order.append(n)
            held.append(slot)

        waiters = [asyncio.ensure_future(wait(n)) for n in range(4)]
        await until(lambda: limiter.stats.waiting == 4)
        assert limiter.open == 2
        for i in range(4):
            held.pop(0).release()
            await until(lambda n=i + 1: len(order) == n)
            assert limiter.open == 2
        await asyncio.gather(*waiters)
        assert order == [0, 1, 2, 3]
        assert limiter.stats.delayed == 4 and limiter.stats.waiting == 0 and limiter.stats.requests == 6

    run(scenario())


def test_a_waiter_cancelled_in_the_queue_leaves_it_and_the_next_one_gets_the_slot() -> None:
    async def scenario() -> None:
        limiter = Limiter(ModelLimits(max_concurrency=1))
        first = await limiter.acquire()
        cancelled = asyncio.ensure_future(limiter.acquire())
        later = asyncio.ensure_future(limiter.acquire())
        await until(lambda: limiter.stats.waiting == 2)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert limiter.stats.waiting == 1
        first.release()
        slot = await asyncio.wait_for(later, 5)
        assert limiter.open == 1
        slot.release()
        assert limiter.open == 0 and limiter.stats.in_flight == 0

    run(scenario())


def test_a_slot_granted_as_its_waiter_is_cancelled_is_given_back() -> None:
    async def scenario() -> None:
        limiter = Limiter(ModelLimits(max_concurrency=1))
        first = await limiter.acquire()
        waiter = asyncio.ensure_future(limiter.acquire())
        await until(lambda: limiter.stats.waiting == 1)
        first.release()  # grants the waiter's future...
        waiter.cancel()  # ...and cancels its task before it ran
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert limiter.open == 0

    run(scenario())


def test_requests_per_minute_make_the_request_past_the_budget_wait_for_the_bucket_to_refill() -> None:
    async def scenario() -> None:
        limiter = Limiter(ModelLimits(max_concurrency=None, rpm=120))  # 2 per second once spent
        for _ in range(120):
            (await limiter.acquire()).release()
        assert limiter.stats.delayed == 0
        started = time.monotonic()
        (await limiter.acquire()).release()
        assert time.monotonic() - started >= 0.4  # about half a second for one more request
        assert limiter.stats.delayed == 1

    run(scenario())


def test_tokens_per_minute_count_what_the_provider_reported_not_the_estimate() -> None:
    async def scenario() -> None:
        limiter = Limiter(ModelLimits(max_concurrency=None, tpm=60_000))  # 1,000 tokens per second
        big = await limiter.acquire(60_000)
        big.release(60_500)  # it used more than estimated: the budget is 500 in debt
        started = time.monotonic()
        (await limiter.acquire(100)).release(100)
        assert time.monotonic() - started >= 0.5  # the debt and the 100 had to refill first
        assert limiter.stats.delayed == 1
        fresh = Limiter(ModelLimits(max_concurrency=None, tpm=60_000))
        small = await fresh.acquire(30_000)
        small.release(10)  # it used far less than estimated: the rest is given back at once
        (await fresh.acquire(59_000)).release()
        assert fresh.stats.delayed == 0

    run(scenario())


def test_a_request_larger_than_the_whole_token_budget_waits_for_a_full_bucket_not_forever() -> None:
    async def scenario() -> None:
        limiter = Limiter(ModelLimits(tpm=1_000))
        slot = await asyncio.wait_for(limiter.acquire(5_000), 5)
        assert slot.waited_s < 1
        slot.release()

    run(scenario())


@pytest.mark.parametrize("bad", [{"attempts": 0}, {"base_s": -1}, {"total_s": float("nan")}])
def test_a_retry_policy_out_of_range_is_refused_naming_the_field(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        RetryPolicy(**bad)
