"""``GET /api/loop/events``: an app's event feed as server-sent events, for bots that do not speak
WebSocket. Part of the I/O shell of protocol/ (with ``transport.py``, ``transport_http.py`` and
``transport_flow.py``); what it sends is made by the sans-I/O functions of ``transport_http.py``.

The request arrives like every HTTP request, through websockets' opening handshake
(``HttpEdges.process_request``: the same token, Origin and throttle checks as ``/session``).
websockets answers a handshake with one whole response and then closes; a stream cannot be one,
so once the request is accepted the socket is taken over: its asyncio transport is handed to an
:class:`SseStream` (``transport.set_protocol``), and the websockets connection is left with a
detached transport and the state CLOSED, so it neither sends its own response nor aborts the
socket when its handshake returns (websockets 14-17: ``ServerConnection.handshake`` sends no
response unless the state is CONNECTING, and ``serve``'s handler only aborts
``connection.transport``).

The stream: the response head, ``retry:`` (how long an EventSource waits before it reconnects),
then one event per feed event (``id:`` its cursor, ``data:`` the ``LoopEvent`` as
``loop/event`` carries it; a live ``assistant.delta`` has no ``id:``, so the client's last event
id stays the last stored event's cursor), and a comment (``: ping``) as a heartbeat whenever
nothing else was sent for ``heartbeat_s``. A reconnecting client sends ``Last-Event-ID`` and
gets what followed, once.

Bounded like the WebSocket path: the frames waiting for the socket are at most ``max_bytes``
(then the stream is closed: a slow consumer; it reconnects from its last event id), and a
socket that took nothing for ``stall_s`` while data waits is closed too (and reset if it does
not take even that); what the client sends after its request is ignored up to 64 KiB, then it
is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

__all__ = ["SseStream", "take_over"]

log = logging.getLogger("sessionloop.transport")

#: what a client may send after its request before it is closed
MAX_CLIENT_BYTES = 64 * 1024


class SseStream(asyncio.Protocol):
    """One client's stream (see the module docstring). :meth:`put` is thread-safe; everything else
    runs on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, head: bytes, *, max_bytes: int, heartbeat_s: float | None,
                 stall_s: float | None, on_closed: Callable[[SseStream], None]) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._queue: list[bytes] = [head]
        self._queued = len(head)
        self._max = max_bytes
        self._heartbeat_s = heartbeat_s
        self._stall_s = stall_s
        self._on_closed = on_closed
        self._transport: asyncio.Transport | None = None
        self._paused_at: float | None = None
        self._last_write = loop.time()
        self._flush_scheduled = False
        self._received = 0
        self._timer: asyncio.TimerHandle | None = None
        self.stop: Callable[[], None] | None = None  # stops what feeds the stream (set by the caller)
        self.closed = False
        self.reason = ""

    # --- fed from any thread ------------------------------------------------------------------------

    def put(self, data: bytes) -> bool:
        """Queue ``data`` to send; False once the stream is closed (or overflowed, which closes it)."""
        schedule = False
        with self._lock:
            if self.closed:
                return False
            if self._queued + len(data) > self._max:
                overflow = True
            else:
                overflow = False
                self._queue.append(data)
                self._queued += len(data)
                schedule = not self._flush_scheduled
                self._flush_scheduled = True
        if overflow:
            self._loop.call_soon_threadsafe(self.close, "slow consumer: outgoing buffer full", True)
            return False
        if schedule:
            self._loop.call_soon_threadsafe(self._flush)
        return True

    # --- the event loop ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.set_write_buffer_limits(high=64 * 1024)
        self._flush()
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._received += len(data)
        if self._received > MAX_CLIENT_BYTES:
            self.close("the client sent data after its request", True)

    def eof_received(self) -> bool | None:
        return None  # the client is gone: the transport closes

    def pause_writing(self) -> None:
        self._paused_at = self._loop.time()

    def resume_writing(self) -> None:
        self._paused_at = None
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._finish("the client went away")

    def _flush(self) -> None:
        with self._lock:
            self._flush_scheduled = False
            if self._transport is None or self._paused_at is not None or not self._queue:
                return
            data, self._queue, self._queued = b"".join(self._queue), [], 0
        self._transport.write(data)
        self._last_write = self._loop.time()

    def _arm(self) -> None:
        step = min(x for x in (self._heartbeat_s, self._stall_s, 5.0) if x is not None)
        self._timer = self._loop.call_later(max(0.05, step / 2), self._tick)

    def _tick(self) -> None:
        if self.closed:
            return
        now = self._loop.time()
        if self._stall_s is not None and self._paused_at is not None and now - self._paused_at > self._stall_s:
            self.close("slow consumer: not reading", True)
            return
        if self._heartbeat_s is not None and now - self._last_write >= self._heartbeat_s:
            self.put(b": ping\n\n")
        self._arm()

    def close(self, reason: str, reset: bool = False) -> None:
        """End the stream: what is queued goes first unless ``reset`` (a slow consumer is cut off,
        with a TCP reset, so neither the process nor the kernel keeps its data)."""
        transport = self._transport
        self._finish(reason)
        if transport is None:
            return
        if reset:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        else:
            self._flush_all(transport)
            transport.close()

    def _flush_all(self, transport: asyncio.Transport) -> None:
        with self._lock:
            data, self._queue, self._queued = b"".join(self._queue), [], 0
        if data:
            transport.write(data)

    def _finish(self, reason: str) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.reason = reason
        log.info("event stream closed: %s", reason)
        if self._timer is not None:
            self._timer.cancel()
        stop, self.stop = self.stop, None
        if stop is not None:
            stop()
        self._on_closed(self)


class _Detached(asyncio.Transport):
    """What the websockets connection keeps after the take-over: a transport that does nothing."""

    def write(self, data: Any) -> None:
        pass

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return True

    def can_write_eof(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def take_over(connection: ServerConnection, stream: SseStream, send_buffer_bytes: int = 0) -> None:
    """Hand ``connection``'s socket to ``stream`` (see the module docstring), its kernel send
    buffer capped at ``send_buffer_bytes`` as the WebSocket connections' are (0: as it is)."""
    transport = connection.transport
    sock = transport.get_extra_info("socket")
    if sock is not None and send_buffer_bytes > 0:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
    connection.transport = _Detached()
    connection.protocol.state = State.CLOSED
    transport.set_protocol(stream)
    stream.connection_made(transport)
