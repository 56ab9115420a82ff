"""Per-model limits of a real model endpoint: concurrent requests, requests and tokens per minute,
and the retry policy; with the counters ``/metrics`` shows.

Why: a thousand sessions that start a turn at once must not open a thousand requests against one
endpoint (a local vLLM queues them all and every answer gets slow; a hosted API answers 429 to all
of them, and they retry together). Each configured model (one provider object) owns one
:class:`Limiter`; a model call takes a slot for each attempt and gives it back when the attempt's
stream ends, so a call waiting for its retry holds no slot.

Theory of operation. Waiters queue in arrival order (FIFO: no session starves behind newer ones).
The head of the queue is granted a slot when fewer than ``max_concurrency`` requests are open and
both budgets have room: ``rpm`` is a token bucket of requests (capacity ``rpm``, refilled at
``rpm / 60`` per second), ``tpm`` one of tokens (capacity ``tpm``). A request takes its estimated
prompt tokens from the TPM bucket when it starts (a request larger than the whole budget waits
for a full bucket, so it is slow, never stuck); when it ends, the tokens the provider reported
replace the estimate (:meth:`Slot.release` with ``tokens``): a larger answer takes more, and the
bucket may go below zero, which makes the next requests wait longer. When only a budget blocks
the head, one timer wakes the queue when the bucket will have enough.

Waiting is an ``await`` on a future, so cancelling the task (``turn/abort``) leaves the queue at
once; a slot granted in the same instant is given back. The limiter is used from one event loop
at a time (the host's worker loop); :class:`CallStats` is written there and read by ``/metrics``
from another thread (plain integers and :class:`~eventstore.groupcommit.Observations`, read
without a lock as the commit tallies are).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Final

import msgspec

from sessionloop.eventstore.groupcommit import Observations

__all__ = ["WAIT_BUCKETS", "CallStats", "Limiter", "ModelLimits", "RetryPolicy", "Slot"]

#: Histogram bounds of the wait for a slot, seconds.
WAIT_BUCKETS: Final = (.001, .01, .05, .1, .5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ModelLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The limits of one configured model. ``None`` means no limit of that kind.

    ``max_concurrency``: requests open at once (default 64: enough for a hosted API's usual
    concurrency, few enough that a local server is not flooded); ``rpm``: requests started per
    minute; ``tpm``: tokens (prompt + completion) per minute.
    """

    max_concurrency: int | None = 64
    rpm: int | None = None
    tpm: int | None = None

    def __post_init__(self) -> None:
        for field in ("max_concurrency", "rpm", "tpm"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"model limit {field} must be a positive integer or None, not {value!r}")


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a failed attempt of a model call is tried again (429, 5xx, timeouts, lost connections).

    ``attempts``: at most this many attempts in all (1: never retry); ``total_s``: no attempt
    starts later than this after the first one began (a ``Retry-After`` past it ends the call
    now rather than waiting); the wait before attempt n+1 is the server's ``Retry-After`` when it
    sent one, else random in ``[0, min(max_wait_s, base_s * 2**n)]`` (exponential backoff with
    full jitter, so many sessions that failed together do not come back together).
    """

    attempts: int = 4
    base_s: float = 0.5
    max_wait_s: float = 20.0
    total_s: float = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"retry attempts must be a positive integer, not {self.attempts!r}")
        for field in ("base_s", "max_wait_s", "total_s"):
            value = getattr(self, field)
            if not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"retry {field} must be a number >= 0, not {value!r}")


class CallStats:
    """What one model's calls did, for ``/metrics``: requests waiting for a slot and open now,
    the waits for a slot (seconds, and how many waits were not immediate), retries by status."""

    __slots__ = ("waiting", "in_flight", "waits", "delayed", "retries", "requests")

    def __init__(self) -> None:
        self.waiting = 0
        self.in_flight = 0
        self.waits = Observations(WAIT_BUCKETS)
        self.delayed = 0  # slots that were not free at once
        self.retries: dict[str, int] = {}
        self.requests = 0  # attempts started

    def retried(self, label: str) -> None:
        self.retries[label] = self.retries.get(label, 0) + 1


class _Bucket:
    """A token bucket: ``capacity`` per minute, refilled continuously; the level may go negative."""

    __slots__ = ("capacity", "rate", "level", "stamp", "clock")

    def __init__(self, capacity: int, clock: Callable[[], float]) -> None:
        self.capacity = capacity
        self.rate = capacity / 60.0
        self.level = float(capacity)
        self.clock = clock
        self.stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def delay(self, amount: int) -> float:
        """Seconds until ``amount`` (at most the capacity) can be taken; 0 when it can be now."""
        self._refill()
        short = min(amount, self.capacity) - self.level
        return 0.0 if short <= 0 else short / self.rate

    def take(self, amount: int) -> None:
        self._refill()
        self.level -= amount

    def give(self, amount: int) -> None:
        self._refill()
        self.level = min(self.capacity, self.level + amount)


class Slot:
    """One granted request; :meth:`release` exactly once (``async with`` does it)."""

    __slots__ = ("_limiter", "tokens", "released", "waited_s")

    def __init__(self, limiter: Limiter, tokens: int, waited_s: float) -> None:
        self._limiter = limiter
        self.tokens = tokens  # what was taken from the TPM budget (the estimate)
        self.released = False
        self.waited_s = waited_s

    def release(self, tokens: int | None = None) -> None:
        """Give the slot back; ``tokens``: what the request really used (replaces the estimate)."""
        if self.released:
            return
        self.released = True
        self._limiter._release(self, tokens)


class _Waiter:
    __slots__ = ("future", "tokens", "since")

    def __init__(self, future: asyncio.Future[Slot], tokens: int, since: float) -> None:
        self.future = future
        self.tokens = tokens
        self.since = since


class Limiter:
    """The slots of one model: FIFO, concurrency, RPM and TPM (see the module docstring)."""

    def __init__(self, limits: ModelLimits | None = None, *, stats: CallStats | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits = limits if limits is not None else ModelLimits()
        self.stats = stats if stats is not None else CallStats()
        self._clock = clock
        self._open = 0
        self._queue: deque[_Waiter] = deque()
        self._rpm = _Bucket(limits.rpm, clock) if limits.rpm else None
        self._tpm = _Bucket(limits.tpm, clock) if limits.tpm else None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def open(self) -> int:
        """Requests holding a slot now."""
        return self._open

    def slot(self, tokens: int = 0) -> _SlotContext:
        """``async with limiter.slot(estimated_tokens) as slot:`` — waits (cancellably) for a slot."""
        return _SlotContext(self, tokens)

    async def acquire(self, tokens: int = 0) -> Slot:
        """Wait for a slot in FIFO order; cancellation leaves the queue (and frees a slot granted
        in the same instant)."""
        since = self._clock()
        if not self._queue and self._delay(tokens) == 0.0:
            return self._grant(tokens, since)
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(future, tokens, since)
        self._queue.append(waiter)
        self.stats.waiting += 1
        self.stats.delayed += 1
        try:
            self._pump()
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                future.result().release()  # granted as the task was cancelled: give it back
            else:
                try:
                    self._queue.remove(waiter)
                except ValueError:
                    pass
                self._pump()  # the head may have changed
            raise
        finally:
            self.stats.waiting -= 1

    # --- inside --------------------------------------------------------------------------------

    def _delay(self, tokens: int) -> float | None:
        """0 when a request of ``tokens`` may start now; seconds to wait when only a budget blocks
        it; None when the concurrency limit does (a release will wake the queue)."""
        cap = self.limits.max_concurrency
        if cap is not None and self._open >= cap:
            return None
        delay = 0.0
        if self._rpm is not None:
            delay = max(delay, self._rpm.delay(1))
        if self._tpm is not None and tokens:
            delay = max(delay, self._tpm.delay(tokens))
        return delay

    def _grant(self, tokens: int, since: float) -> Slot:
        self._open += 1
        if self._rpm is not None:
            self._rpm.take(1)
        if self._tpm is not None and tokens:
            self._tpm.take(tokens)
        waited = max(0.0, self._clock() - since)
        self.stats.waits.observe(waited)
        self.stats.in_flight = self._open
        self.stats.requests += 1
        return Slot(self, tokens, waited)

    def _pump(self) -> None:
        """Grant slots to the head of the queue while it may start; else arm the budget timer."""
        while self._queue:
            head = self._queue[0]
            if head.future.done():  # cancelled, not yet removed by its task
                self._queue.popleft()
                continue
            delay = self._delay(head.tokens)
            if delay is None:
                return
            if delay > 0:
                self._arm(delay)
                return
            self._queue.popleft()
            head.future.set_result(self._grant(head.tokens, head.since))

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._wake)

    def _wake(self) -> None:
        self._timer = None
        self._pump()

    def _release(self, slot: Slot, tokens: int | None) -> None:
        self._open -= 1
        self.stats.in_flight = self._open
        if self._tpm is not None and tokens is not None:
            extra = tokens - slot.tokens
            if extra > 0:
                self._tpm.take(extra)
            elif extra < 0:
                self._tpm.give(-extra)
        if self._queue:
            try:
                self._pump()
            except RuntimeError:  # released outside a running loop (a closed loop): nothing waits there
                pass


class _SlotContext:
    __slots__ = ("_limiter", "_tokens", "slot")

    def __init__(self, limiter: Limiter, tokens: int) -> None:
        self._limiter = limiter
        self._tokens = tokens
        self.slot: Slot | None = None

    async def __aenter__(self) -> Slot:
        self.slot = await self._limiter.acquire(self._tokens)
        return self.slot

    async def __aexit__(self, *exc: object) -> None:
        assert self.slot is not None
        self.slot.release()
