"""A worker's connection to the other workers: nats-py on an asyncio loop thread of its own.

``serve --workers N`` runs N processes; what one worker asks of another (a request for a session
that other one runs, a listing record it committed) travels on NATS subjects through this link.
Its methods are thread-safe and never block the caller: a publish is queued onto the link's loop,
a request's answer comes back through a callback on that loop (which must not block either: it
hands work to an actor or a connection). nats-py reconnects by itself when the server restarts
(every attempt, half a second apart); publishes made meanwhile wait in its buffer.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nats.aio.msg import Msg

log = logging.getLogger("sessionloop.cluster")

__all__ = ["ClusterUnavailable", "NatsLink"]


def _nats() -> Any:
    """nats-py, imported when a worker first connects: a process of one worker never needs it
    (its import takes a few hundred milliseconds on a busy machine, at every start)."""
    import nats  # noqa: PLC0415 - a third-party import only ``serve --workers`` needs, on demand

    return nats

#: how long the start waits for the NATS server before the worker gives up (it exits, and the
#: supervisor starts it again)
CONNECT_TIMEOUT_S = 10.0


#: a request's task, made when it leaves the outbox
_Ask = Callable[[], Coroutine[Any, Any, None]]
#: a message's data, made when it leaves the outbox (None: nothing to send)
_Make = Callable[[], bytes | None]


class ClusterUnavailable(Exception):
    """The NATS server could not be reached."""


class NatsLink:
    """One NATS connection, used from any thread."""

    def __init__(self, url: str, *, token: str | None, name: str) -> None:
        self.url = url
        self.name = name
        self._reconnect_handlers: list[Callable[[], None]] = []
        #: what is to be sent, in order: (subject, data, None) for a message, a request's task for a request
        self._outbox: collections.deque[tuple[str, bytes | _Make, _Ask | None]] = collections.deque()
        self._outbox_lock = threading.Lock()
        self._sending = False  # a task on the loop empties the outbox
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"sessionloop-nats-{name}", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._nc: Any = self._run(self._connect(token), CONNECT_TIMEOUT_S + 1)
        except BaseException as e:
            self._stop_loop()
            raise ClusterUnavailable(f"cannot reach the NATS server at {url}: {e or type(e).__name__}") from e

    async def _connect(self, token: str | None) -> Any:
        async def disconnected() -> None:
            if not self._closed:
                log.warning("%s: the connection to NATS at %s was lost; reconnecting", self.name, self.url)

        async def reconnected() -> None:
            log.warning("%s: reconnected to NATS at %s", self.name, self.url)
            for handler in list(self._reconnect_handlers):
                handler()

        async def error(e: Exception) -> None:
            if not self._closed:
                log.warning("%s: NATS: %s", self.name, e)

        return await _nats().connect(
            self.url, name=self.name, token=token, connect_timeout=CONNECT_TIMEOUT_S, allow_reconnect=True,
            max_reconnect_attempts=-1, reconnect_time_wait=0.5, disconnected_cb=disconnected,
            reconnected_cb=reconnected, error_cb=error, pending_size=64 * 1024 * 1024)

    def _run(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # --- what the workers say to each other ------------------------------------------------------

    def publish(self, subject: str, data: bytes) -> None:
        """Queue ``data`` for ``subject`` (nothing is waited for; lost only with the connection).
        Messages and requests leave in the order they were queued, from any thread."""
        self._queue(subject, data)

    def publish_made(self, subject: str, make: _Make) -> None:
        """Queue a message whose data ``make()`` gives when its turn to be sent comes (what piled up
        meanwhile goes in it), in order with everything queued before and after it."""
        self._queue(subject, make)

    def _queue(self, subject: str, data: bytes | _Make, ask: _Ask | None = None) -> None:
        """Into the outbox; the first of a batch wakes the link's loop (one wake-up, not one per message)."""
        if self._closed:
            return
        with self._outbox_lock:
            self._outbox.append((subject, data, ask))
            if self._sending:
                return
            self._sending = True
        self._loop.call_soon_threadsafe(self._start_sending)

    def _start_sending(self) -> None:
        self._loop.create_task(self._send_outbox())

    async def _send_outbox(self) -> None:
        while True:
            with self._outbox_lock:
                if not self._outbox:
                    self._sending = False
                    return
                batch = list(self._outbox)
                self._outbox.clear()
            for subject, data, ask in batch:
                if ask is not None:  # a request: its task publishes it when it first runs, before what follows
                    self._loop.create_task(ask())
                    await asyncio.sleep(0)
                    continue
                payload = data if isinstance(data, bytes) else data()
                if payload is None:
                    continue
                try:
                    await self._nc.publish(subject, payload)
                except Exception as e:  # closed, or the buffer is full while NATS is away
                    if not self._closed:
                        log.warning("%s: a message to %s was dropped: %s", self.name, subject, e)

    def request(self, subject: str, data: bytes, timeout: float,
                done: Callable[[bytes | None, BaseException | None], None]) -> None:
        """Send a request; ``done(answer, None)`` or ``done(None, error)`` on the link's loop: a
        ``nats.errors.NoRespondersError`` when nobody serves ``subject``, a timeout error after
        ``timeout`` seconds."""

        async def ask() -> None:
            answer: bytes | None = None
            error: BaseException | None = None
            try:
                answer = (await self._nc.request(subject, data, timeout=timeout)).data
            except BaseException as e:
                error = e
            try:
                done(answer, error)
            except Exception:  # a bug in the handler: said, not lost in a task nobody awaits
                log.exception("the handler of a reply on %s failed", subject)

        if not self.connected:  # nothing is sent: the caller may say nothing was done
            done(None, ClusterUnavailable("the link to the other workers is down"))
            return
        self._queue(subject, data, ask)

    @property
    def connected(self) -> bool:
        return not self._closed and bool(self._nc.is_connected)

    def on_reconnect(self, handler: Callable[[], None]) -> None:
        """Call ``handler()`` on the link's loop each time the connection is made again (what was
        in flight while it was away may be lost: NATS keeps no message for an absent subscriber)."""
        self._reconnect_handlers.append(handler)

    def subscribe(self, subject: str, handler: Callable[[Msg], None]) -> None:
        """Call ``handler(msg)`` on the link's loop for every message on ``subject`` (it must not block)."""

        async def deliver(msg: Msg) -> None:
            try:
                handler(msg)
            except Exception:
                log.exception("%s: the handler of %s failed", self.name, subject)

        self._run(self._nc.subscribe(subject, cb=deliver), CONNECT_TIMEOUT_S)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._nc.drain(), 5)
        except Exception:  # closed already, or NATS away: nothing more to send
            pass
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
