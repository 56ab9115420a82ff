"""The WebSocket transport: the I/O shell of protocol/ (STYLE rule 1), this module and two beside it.

It moves text between sockets and a session-protocol service (through
``connect(peer, send) -> {receive, close}``, :class:`~protocol.peer.ProtocolService`) and serves
small HTTP endpoints. It imports no actor: the service is anything with ``connect``,
``resolve_file`` and ``can_read`` (and ``watch_feed`` for the event stream). The I/O shell is four
modules; the rest of protocol/ is sans-I/O:

* ``transport.py`` (this one): :class:`SessionServer`, serving ``/session`` over WebSocket, and
  its writers and closes;
* ``transport_http.py``: the HTTP endpoints and the authentication and Origin checks before an
  upgrade (:class:`~protocol.transport_http.HttpEdges`);
* ``transport_flow.py``: the flow control of frames, the inflight budget of incoming frames and
  the bounded outbox of outgoing ones;
* ``transport_sse.py``: ``GET /api/loop/events``, an app's event feed as server-sent events, on a
  socket taken over from the HTTP handshake.

Outgoing frames: every connection has a bounded outbox: pushes from actor threads are queued
without blocking them; a client that does not read lets its outbox grow to ``max_outbox_bytes``,
then it is closed with code 4008 ("slow consumer") and unsubscribed at once. Writers are
woken in bursts (``Waker``) and write what they have queued in batches, a batch each in
turn, of frame bytes made once per push for all its subscribers (:class:`WireFrames`). Every
close the server starts — 4008, 1013, the protocol's own, 1001 at shutdown — gives the peer
``close_timeout`` seconds to take the
close frame and answer it; a peer that does not (its socket buffer is full because it does not
read) is then cut off with a TCP reset, so neither the process nor the kernel keeps its buffers.
A connection whose socket has taken nothing for ``ping_interval + ping_timeout`` while frames
wait is a slow consumer too (its keepalive ping cannot get out either). The kernel's send buffer
of each connection is capped at ``send_buffer_bytes``. A frame above the socket's hard limit
closes with 1009; frames below it but above the application limit get an ``invalidRequest``
reply from the connection. A frame that waited ``inflight_wait`` for room in the inflight
budget closes its connection with 1013 (``transport_flow.py``).

A connection the page's login cookie opened is closed with 4003 when that login ends: at once when
it is logged out here, within :data:`LOGIN_CHECK_S` when another process logged it out (every
worker of ``serve --workers`` reads the logouts) or when it expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

import msgspec
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from sessionloop.protocol.guards import origin_key, own_origins
from sessionloop.protocol.peer import AppCredential, Peer, ProtocolService
from sessionloop.protocol.transport_flow import (
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_OUTBOX,
    GuardedConnection,
    InflightBudget,
    Outbox,
    Waker,
)
from sessionloop.protocol.transport_http import HttpEdges
from sessionloop.protocol.web_login import Login, WebLogins

log = logging.getLogger("sessionloop.transport")

CLOSE_SLOW_CONSUMER = 4008
CLOSE_LOGGED_OUT = 4003
#: how often the connections of page logins are checked against the logouts and their expiry
LOGIN_CHECK_S = 1.0
CLOSE_TRY_AGAIN_LATER = 1013
#: asked for with SO_SNDBUF on every connection (Linux doubles it: 256 KiB); without a cap the
#: kernel grows it to ``net.ipv4.tcp_wmem``'s maximum (4 MiB here, 3.7 MB seen filled) for a
#: client that does not read, and filling 200 of those is what stalled everyone else
DEFAULT_SEND_BUFFER = 128 * 1024


class TransportConfig(msgspec.Struct, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8765
    owner_token: str
    app_tokens: dict[str, AppCredential] = {}
    allowed_origins: list[str] = []  # besides the server's own listen address (guards.own_origins)
    max_frame_bytes: int = 64 * 1024 * 1024  # the socket's hard limit (close 1009 above it)
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT  # server-wide, frames being received and parsed
    inflight_wait: float = 30.0  # how long a frame may wait for room before the 1013 close
    max_outbox_bytes: int = DEFAULT_MAX_OUTBOX
    send_buffer_bytes: int = DEFAULT_SEND_BUFFER
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    # after a failed keepalive (or any close) the peer gets this long to close its side before the
    # socket is aborted: a dead peer is let go ping_interval + ping_timeout + close_timeout after
    # it fell silent
    close_timeout: float | None = 10.0
    metrics_public: bool = False  # /metrics without a token
    auth_failures: int = 20  # failed authentications an address may have ...
    auth_window: float = 60.0  # ... in this many seconds before it gets 429
    #: several processes listen on one port (``serve --workers``: the kernel spreads connections)
    reuse_port: bool = False


class SessionServer:
    """Serves ``/session`` over WebSocket to ``service``, and the HTTP endpoints (``transport_http.py``)."""

    def __init__(self, service: ProtocolService, config: TransportConfig,
                 metrics: Callable[[], bytes] | None = None,
                 health: Callable[[], dict[str, Any]] | None = None, logins: WebLogins | None = None) -> None:
        self.service = service
        self.config = config
        self.http = HttpEdges(service, config, metrics=metrics, health=health, logins=logins,
                              on_logout=self._logged_out)
        self._server: Server | None = None
        self.port: int | None = None
        self.connections: dict[ServerConnection, Outbox] = {}
        self.budget = InflightBudget(config.max_inflight_bytes)
        self._writers: dict[ServerConnection, asyncio.Task[None]] = {}
        self._services: dict[ServerConnection, Any] = {}  # each connection's end of the service
        self._closing: dict[ServerConnection, asyncio.Task[None]] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._login_check: asyncio.Task[None] | None = None
        self._waker: Waker | None = None
        self._wire = WireFrames()

    async def start(self) -> int:
        def connection(*args: Any, **kwargs: Any) -> GuardedConnection:
            return GuardedConnection(*args, budget=self.budget, max_frame_bytes=self.config.max_frame_bytes,
                                     wait_s=self.config.inflight_wait, refuse=self._refused, **kwargs)

        self._server = await serve(
            self._handle, self.config.host, self.config.port, create_connection=connection,  # type: ignore[arg-type]
            process_request=self.http.process_request, max_size=self.config.max_frame_bytes,
            ping_interval=self.config.ping_interval, ping_timeout=self.config.ping_timeout,
            close_timeout=self.config.close_timeout, compression=None, reuse_port=self.config.reuse_port or None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.http.origins = {origin_key(o) for o in [*own_origins(self.config.host, self.port),
                                                      *self.config.allowed_origins]}
        stall = self._stall_limit()
        if stall is not None:
            self._watchdog = asyncio.ensure_future(self._watch_stalls(stall))
        self._login_check = asyncio.ensure_future(self._watch_logins())
        return self.port

    async def stop(self, reason: str = "server shutting down", drain_s: float = 1.0) -> None:
        """Tell every connection the features went away, let the writers send what is queued
        (``drain_s`` at most: a client that does not read is not waited for), then close 1001
        (each peer gets ``close_timeout`` to answer, all at once)."""
        if self._server is None:
            return
        for task in (self._watchdog, self._login_check):
            if task is not None:
                task.cancel()
        self.service.going_offline()
        outboxes = [o for o in self.connections.values() if not o.closed]
        if outboxes:
            try:
                await asyncio.wait_for(asyncio.gather(*(o.drained() for o in outboxes)), drain_s)
            except TimeoutError:
                pass
        self.http.close_streams()
        for ws in list(self.connections):
            self._release(ws, 1001, reason, flush=False)
        await asyncio.gather(*list(self._closing.values()), return_exceptions=True)
        self._server.close()
        await self._server.wait_closed()

    # --- WebSocket side ---------------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        peer: Peer = ws.peer  # type: ignore[attr-defined]
        loop = asyncio.get_running_loop()
        _cap_send_buffer(ws, self.config.send_buffer_bytes)
        if self._waker is None:
            self._waker = Waker(loop)
        outbox = Outbox(self._waker, self.config.max_outbox_bytes,
                        lambda: self._release(ws, CLOSE_SLOW_CONSUMER, "slow consumer: outgoing buffer full"))

        def disconnect(code: int, reason: str) -> None:
            loop.call_soon_threadsafe(self._release, ws, code, reason)

        peer.disconnect = disconnect
        conn = self.service.connect(peer, outbox.put)
        self.connections[ws] = outbox
        self._services[ws] = conn
        self._writers[ws] = asyncio.ensure_future(self._write(ws, outbox))
        try:
            async for message in ws:
                try:
                    conn.receive(message)
                finally:
                    del message  # its room in the budget is given back below: let it go first
                    if isinstance(ws, GuardedConnection):
                        ws.handled()
        except ConnectionClosed:
            pass
        finally:
            self.connections.pop(ws, None)
            self._services.pop(ws, None)
            outbox.close()
            conn.close()
            writer = self._writers.pop(ws, None)
            if writer is not None:
                writer.cancel()

    async def _write(self, ws: ServerConnection, outbox: Outbox) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not outbox.closed:
                await outbox.wait()
                frames = outbox.take()
                if frames:
                    outbox.stuck_since = loop.time()
                for i, batch in enumerate(_batches(frames)):
                    if i:
                        await asyncio.sleep(0)  # round robin: a batch, then the other writers' turn
                    await _send_all(ws, batch, self._wire)  # waits while the socket's buffer is full
                    outbox.stuck_since = loop.time()
                outbox.stuck_since = None
        except ConnectionClosed:
            return

    def _release(self, ws: ServerConnection, code: int, reason: str, flush: bool = True) -> None:
        """Start closing ``ws`` (event loop thread), once: see :meth:`_close`."""
        if ws in self._closing or ws.state is State.CLOSED:
            return
        task = asyncio.ensure_future(self._close(ws, code, reason, flush))
        self._closing[ws] = task
        task.add_done_callback(lambda _: self._closing.pop(ws, None))

    async def _close(self, ws: ServerConnection, code: int, reason: str, flush: bool) -> None:
        """Send the close frame after what is queued (``flush``) or instead of it, then give the
        peer ``close_timeout`` to answer; a peer that cannot even take the close frame (it does
        not read: its socket buffer is full) is reset then, which frees the buffers for real."""
        encoded = reason.encode("utf-8")[:123].decode("utf-8", "ignore")  # close frames carry 123 bytes
        outbox = self.connections.get(ws)
        conn = self._services.get(ws)
        if conn is not None:
            conn.close()  # unsubscribed now: a slow consumer costs the publishers nothing from here on
        try:
            async with asyncio.timeout(self.config.close_timeout):
                if outbox is not None:
                    if flush:
                        await outbox.drained()
                    outbox.close()
                writer = self._writers.get(ws)
                if writer is not None:
                    writer.cancel()  # it may be stuck in a send to this peer; nothing follows the close
                await ws.close(code, encoded)
        except TimeoutError:
            _reset(ws)

    def _refused(self, ws: GuardedConnection) -> None:
        self._release(ws, CLOSE_TRY_AGAIN_LATER, "try again later: the server is receiving too much data",
                      flush=False)

    def _stall_limit(self) -> float | None:
        if self.config.ping_interval is None or self.config.ping_timeout is None:
            return None
        return self.config.ping_interval + self.config.ping_timeout

    async def _watch_stalls(self, limit: float) -> None:
        """Release connections whose socket has taken nothing for ``limit`` seconds while frames
        wait for it. websockets' keepalive cannot catch them: its ping waits behind those frames."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            now = loop.time()
            for ws, outbox in list(self.connections.items()):
                if outbox.stuck_since is not None and now - outbox.stuck_since > limit:
                    self._release(ws, CLOSE_SLOW_CONSUMER, "slow consumer: not reading", flush=False)

    def _logged_out(self, login: Login) -> None:
        for ws in list(self.connections):
            peer = getattr(ws, "peer", None)
            if peer is not None and peer.login is not None and peer.login.id == login.id:
                self._release(ws, CLOSE_LOGGED_OUT, "the page's login ended")

    async def _watch_logins(self) -> None:
        """Close the connections of page logins that ended elsewhere or expired (checked every
        :data:`LOGIN_CHECK_S`; reading the logouts again is a ``stat`` unless they changed)."""
        while True:
            await asyncio.sleep(LOGIN_CHECK_S)
            for ws in list(self.connections):
                peer = getattr(ws, "peer", None)
                if peer is not None and peer.login is not None and not self.http.logins.live(peer.login):
                    self._release(ws, CLOSE_LOGGED_OUT, "the page's login ended")


#: frames written to a socket in one go before the next writer's turn
WRITE_BATCH_BYTES = 64 * 1024


def _batches(frames: list[str]) -> list[list[str]]:
    batches: list[list[str]] = []
    size = WRITE_BATCH_BYTES
    for frame in frames:
        if size >= WRITE_BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(frame)
        size += len(frame)
    return batches


class WireFrames:
    """The bytes of a text frame as the server sends it, made once for every connection.

    A server's frames are not masked and this server negotiates no extension, so a push's frame
    is the same bytes for each of its subscribers; a stream of item deltas is hundreds of small
    pushes a second per session, and framing each again per subscriber was most of what a push
    cost the event loop. Event loop only; at most ``max_bytes`` are kept, oldest out first, and
    frames over ``max_frame`` (rarer, and costly to keep) are not kept at all."""

    def __init__(self, max_bytes: int = 4 * 1024 * 1024, max_frame: int = 64 * 1024) -> None:
        self.max_bytes = max_bytes
        self.max_frame = max_frame
        self._kept: dict[int, tuple[str, bytes]] = {}  # id(text) -> (text, frame): the text keeps the id valid
        self._size = 0

    def wire(self, text: str) -> bytes:
        kept = self._kept.get(id(text))
        if kept is not None and kept[0] is text:
            return kept[1]
        data = Frame(Opcode.TEXT, text.encode()).serialize(mask=False)
        if len(data) <= self.max_frame:
            self._kept[id(text)] = (text, data)
            self._size += len(data)
            while self._size > self.max_bytes:
                _, old = self._kept.pop(next(iter(self._kept)))
                self._size -= len(old)
        return data


async def _send_all(ws: ServerConnection, frames: list[str], wire: WireFrames) -> None:
    """Send ``frames`` as text messages with one socket write and one wait for the socket.

    ``ServerConnection.send`` does this for one message: ``send_context`` checks the connection
    is open, the sans-I/O protocol frames the text (``send_text``: a text frame, unmasked on the
    server side), and on leaving the context the bytes are written and the socket drained. Here
    the frames come from :class:`WireFrames`, and the connection's own frames (pings, pongs, the
    close) still go through the protocol, whole, between two writes."""
    async with ws.send_context():
        ws.transport.write(b"".join([wire.wire(frame) for frame in frames]))


def _cap_send_buffer(ws: ServerConnection, size: int) -> None:
    sock = ws.transport.get_extra_info("socket")
    if sock is not None and size > 0:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


def _reset(ws: ServerConnection) -> None:
    """Drop the connection with a TCP reset: a plain close would leave an orphaned socket that
    keeps its unsent data (and keeps probing a peer that advertises a zero window)."""
    sock = ws.transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.transport.abort()
