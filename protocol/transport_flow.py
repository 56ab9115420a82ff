"""The transport's flow control of frames, in and out: part of the I/O shell of protocol/.

With ``transport.py`` (the WebSocket server) and ``transport_http.py`` (the HTTP endpoints) this is
the only code of protocol/ that does I/O: it runs on the event loop, and the outbox is filled from
actor threads. The rest of protocol/ stays sans-I/O.

Incoming frames (:class:`GuardedConnection`): every connection may have 1 MiB of received data
frames in hand at no cost; beyond that, a data frame takes room for its payload in the
server-wide :class:`InflightBudget` when its header arrives, before the payload is buffered, and
gives it back once its message has been handled. A frame that finds no room stops its
connection's reading (TCP holds the sender back) until there is room, at most
``inflight_wait`` seconds; then the connection is closed 1013 ("try again later"). So the memory
taken by frames being received and parsed stays under about twice ``max_inflight_bytes`` (a
frame is held up to twice while websockets parses it: its read buffer, then the payload) plus
1 MiB per connection.

Outgoing frames: every connection has a bounded :class:`Outbox`: pushes from actor threads are
queued without blocking them; a client that does not read lets its outbox grow to
``max_outbox_bytes``, then the server closes it as a slow consumer. Writers are woken in bursts
(:class:`Waker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import ServerConnection

from sessionloop.protocol.guards import FrameHeader, FrameScanner

__all__ = [
    "DEFAULT_MAX_INFLIGHT",
    "DEFAULT_MAX_OUTBOX",
    "FREE_INFLIGHT_PER_CONNECTION",
    "GuardedConnection",
    "InflightBudget",
    "Outbox",
    "Waker",
]

DEFAULT_MAX_OUTBOX = 8 * 1024 * 1024
DEFAULT_MAX_INFLIGHT = 128 * 1024 * 1024
#: received data frames a connection may hold without taking room in the budget
FREE_INFLIGHT_PER_CONNECTION = 1024 * 1024


class Waker:
    """Wakes writers on the event loop from any thread, one loop wake-up for a burst of them: a
    push to a session with 200 subscribers is 200 :meth:`Outbox.put` calls on an actor thread,
    and 200 ``call_soon_threadsafe`` (each a write to the loop's self-pipe) would cost that
    thread more than the puts."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[Callable[[], Any]] = []

    def wake(self, callback: Callable[[], Any]) -> None:
        with self._lock:
            self._pending.append(callback)
            first = len(self._pending) == 1
        if first:
            self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for callback in pending:
            callback()


class Outbox:
    """A connection's bounded queue of frames to send, filled from any thread."""

    def __init__(self, waker: Waker, limit: int, on_overflow: Callable[[], None]) -> None:
        self._waker = waker
        self._limit = limit
        self._on_overflow = on_overflow
        self._frames: deque[str] = deque()
        self._size = 0
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self.overflowed = False
        self.closed = False
        self.stuck_since: float | None = None  # loop time of the writer's last progress while it has frames

    def put(self, frame: str) -> None:
        """Queue ``frame``; the connection is a slow consumer when the frames already waiting
        exceed the limit as another one arrives. Not the new frame itself: one reply bigger than
        the limit (the snapshot of a session with a big recent history) to a client that reads
        is no sign of falling behind. So the queue holds at most the limit plus two frames."""
        with self._lock:
            if self.closed or self.overflowed:
                return
            behind = self._size
            self._frames.append(frame)
            self._size += len(frame)
            wake = len(self._frames) == 1
            overflow = behind > self._limit
            if overflow:
                self.overflowed = True
        if overflow:
            self._waker.wake(self._on_overflow)  # not the writer's job: it may be stuck in a send to this peer
        elif wake:
            self._waker.wake(self._ready.set)

    def take(self) -> list[str]:
        with self._lock:
            frames = list(self._frames)
            self._frames.clear()
            self._size = 0
            return frames

    async def drained(self) -> None:
        """Return once the writer has sent every queued frame (or the outbox closed)."""
        while (self._frames or self.stuck_since is not None) and not self.closed:
            await asyncio.sleep(0.005)

    async def wait(self) -> None:
        await self._ready.wait()
        self._ready.clear()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._frames.clear()
            self._size = 0
        self._waker.wake(self._ready.set)


class InflightBudget:
    """Bytes of incoming data frames being received and parsed, server-wide (event loop only).

    :meth:`try_take` and :meth:`take` reserve room for a frame's payload, :meth:`give` returns
    it. Waiters are served first come, first served: a large frame is not starved by a stream
    of smaller ones behind it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def try_take(self, n: int) -> bool:
        if self._waiters or self.used + n > self.limit:
            return False
        self._add(n)
        return True

    async def take(self, n: int, timeout: float | None) -> bool:
        """Wait (at most ``timeout`` s) until ``n`` bytes fit; False when they did not in time."""
        if self.try_take(n):
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, waiter)
        self._waiters.append(entry)
        granted = False
        try:
            async with asyncio.timeout(timeout):
                await waiter
            granted = True
            return True
        except TimeoutError:
            return False
        finally:
            if not granted:
                if waiter.done() and not waiter.cancelled():
                    self.give(n)  # granted just as the time ran out, or while being cancelled
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(entry)
                    self._grant()  # a large waiter leaving may let smaller ones behind it in

    def give(self, n: int) -> None:
        if n:
            self.used -= n
            self._grant()

    def _add(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def _grant(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.limit:
            n, waiter = self._waiters.popleft()
            if not waiter.done():
                self._add(n)
                waiter.set_result(None)


class GuardedConnection(ServerConnection):
    """A websockets server connection whose data frames take room in an :class:`InflightBudget`
    from the moment their header is in, before websockets buffers their payload.

    The bytes of a chunk are handed to websockets up to a frame header that finds no room; the
    rest of the chunk is held and reading stops (websockets' own flow control, the queue of
    received frames, still pauses and resumes reading through :meth:`_sync_reading`). The room
    of a message is given back by :meth:`handled`, which the server calls after it handled the
    message, or when the connection is lost."""

    def __init__(self, *args: Any, budget: InflightBudget, max_frame_bytes: int, wait_s: float | None,
                 refuse: Callable[[GuardedConnection], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._budget = budget
        self._max_frame = max_frame_bytes
        self._wait_s = wait_s
        self._refuse = refuse
        self._scanner = FrameScanner()
        self._free = 0  # bytes of this connection's free allowance in use
        self._msg_free = self._msg_budget = 0  # the message being received
        self._received: deque[tuple[int, int]] = deque()  # (free, budget) of messages not yet handled
        self._held: bytearray | None = None  # what came after a header that waits for room
        self._refused = False
        self._frames_paused = False  # websockets' queue of received frames is full
        self._waiting: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.recv_messages.pause = lambda: self._frames_flow(False)
        self.recv_messages.resume = lambda: self._frames_flow(True)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # closing 1013: nothing more of it is buffered
        if self._held is not None:
            self._held += data  # came in before the pause took effect
            self._sync_reading()
            return
        self._admit(data)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._waiting is not None:
            self._waiting.cancel()
        self._held = None
        self._budget.give(sum(b for _, b in self._received) + self._msg_budget)
        self._received.clear()
        self._msg_budget = self._msg_free = self._free = 0

    def handled(self) -> None:
        """The oldest received message was handled: its room is free again."""
        if self._received:
            free, budget = self._received.popleft()
            self._free -= free
            self._budget.give(budget)

    # --- admission ---------------------------------------------------------------------------

    def _admit(self, data: bytes) -> None:
        pos = 0
        while True:
            end, header = self._scanner.next_header(data, pos)
            if header is None:
                super().data_received(data)
                return
            pos = end
            if not self._reserve_now(header):
                if end:
                    super().data_received(data[:end])
                self._held = bytearray(data[end:])
                self._sync_reading()
                self._waiting = asyncio.ensure_future(self._wait_for_room(header))
                return

    def _reserve_now(self, header: FrameHeader) -> bool:
        """Reserve what ``header``'s payload needs if that can be done at once."""
        if not header.is_data:
            return True
        n = header.length
        if n > self._max_frame:
            return True  # websockets refuses it at this very header (1009): nothing is buffered
        if self._free + n <= FREE_INFLIGHT_PER_CONNECTION:
            self._free += n
            self._record(header, free=n, budget=0)
            return True
        if self._budget.try_take(n):
            self._record(header, free=0, budget=n)
            return True
        return False

    def _record(self, header: FrameHeader, free: int, budget: int) -> None:
        self._msg_free += free
        self._msg_budget += budget
        if header.fin:
            self._received.append((self._msg_free, self._msg_budget))
            self._msg_free = self._msg_budget = 0

    async def _wait_for_room(self, header: FrameHeader) -> None:
        if not await self._budget.take(header.length, self._wait_s):
            self._refused = True
            self._held = None
            self._refuse(self)
            return
        if self._held is None:  # lost while the room was being granted
            self._budget.give(header.length)
            return
        self._record(header, free=0, budget=header.length)
        held, self._held = bytes(self._held), None
        self._waiting = None
        self._sync_reading()
        self._admit(held)

    def _frames_flow(self, on: bool) -> None:
        self._frames_paused = not on
        self._sync_reading()

    def _sync_reading(self) -> None:
        if self.transport.is_closing():
            return
        if self._frames_paused or self._held is not None or self._refused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

