"""The WebSocket transport: the one I/O shell of protocol/ (STYLE rule 1).

It moves text between sockets and a session-protocol service (through
``connect(peer, send) -> {receive, close}``) and serves three small HTTP endpoints. It imports
no actor: the service is anything with ``connect``, ``resolve_file`` and ``can_read``.

* ``/session`` — the protocol, after authentication (``Authorization: Bearer`` or ``?token=``;
  401 before the upgrade for a missing or wrong token) and an Origin check (403 before the
  upgrade for a browser page whose origin is neither the server's own listen address nor on
  ``allowed_origins``; no Origin at all — terminals, bots — passes);
* ``GET /api/session-file?sessionId=…&handle=…`` — an attachment, as ``application/octet-stream``,
  only for a handle the service issued for that session in this epoch;
* ``GET /api/models/<source>?dependency=…`` — the option list of a settings field's
  ``dynamicOptions`` source (``llm``: the configured models), JSON, answered by
  the service's ``options``; any valid token, the Origin check of ``/session``; 404 for a source
  nobody answers;
* ``GET /metrics`` (Prometheus text; the owner token, unless ``metrics_public``) and ``GET /healthz``.

Before any of that: a request with two ``Authorization`` or two ``Origin`` headers is answered
400; an address that failed authentication ``auth_failures`` times in ``auth_window`` seconds is
answered 429 with ``Retry-After`` (:class:`~protocol.guards.AuthThrottle`).

Incoming frames (:class:`GuardedConnection`): every connection may have 1 MiB of received data
frames in hand at no cost; beyond that, a data frame takes room for its payload in the
server-wide :class:`InflightBudget` when its header arrives, before the payload is buffered, and
gives it back once its message has been handled. A frame that finds no room stops its
connection's reading (TCP holds the sender back) until there is room, at most
``inflight_wait`` seconds; then the connection is closed 1013 ("try again later"). So the memory
taken by frames being received and parsed stays under about twice ``max_inflight_bytes`` (a
frame is held up to twice while websockets parses it: its read buffer, then the payload) plus
1 MiB per connection.

Outgoing frames: every connection has a bounded outbox: pushes from actor threads are queued
without blocking them; a client that does not read lets its outbox grow to ``max_outbox_bytes``,
then it is closed with code 4008 ("slow consumer") and unsubscribed at once. Writers are
woken in bursts (:class:`Waker`) and write what they have queued in batches, a batch each in
turn, of frame bytes made once per push for all its subscribers (:class:`WireFrames`). Every
close the server starts — 4008, 1013, the protocol's own, 1001 at shutdown — gives the peer
``close_timeout`` seconds to take the
close frame and answer it; a peer that does not (its socket buffer is full because it does not
read) is then cut off with a TCP reset, so neither the process nor the kernel keeps its buffers.
A connection whose socket has taken nothing for ``ping_interval + ping_timeout`` while frames
wait is a slow consumer too (its keepalive ping cannot get out either). The kernel's send buffer
of each connection is capped at ``send_buffer_bytes``. A frame above the socket's hard limit
closes with 1009; frames below it but above the application limit get an ``invalidRequest``
reply from the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import http
import logging
import math
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State

from sessionloop.protocol.guards import AuthThrottle, FrameHeader, FrameScanner, origin_key, own_origins

log = logging.getLogger("sessionloop.transport")

CLOSE_SLOW_CONSUMER = 4008
CLOSE_TRY_AGAIN_LATER = 1013
DEFAULT_MAX_OUTBOX = 8 * 1024 * 1024
DEFAULT_MAX_INFLIGHT = 128 * 1024 * 1024
#: received data frames a connection may hold without taking room in the budget
FREE_INFLIGHT_PER_CONNECTION = 1024 * 1024
#: asked for with SO_SNDBUF on every connection (Linux doubles it: 256 KiB); without a cap the
#: kernel grows it to ``net.ipv4.tcp_wmem``'s maximum (4 MiB here, 3.7 MB seen filled) for a
#: client that does not read, and filling 200 of those is what stalled everyone else
DEFAULT_SEND_BUFFER = 128 * 1024
#: the headers a request may carry once: two would make "which one counts" the attacker's choice
SINGLE_HEADERS = ("Authorization", "Origin")
OPTIONS_PREFIX = "/api/models/"
_SOURCE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_DEPENDENCY = 1024


class Peer(msgspec.Struct, kw_only=True):
    """An authenticated connection (a ``SessionPeer``): who, on which approval surface,
    and how the server asks the transport to close it."""

    platform: str
    user_id: str
    surface: str = "cli"
    app_id: str | None = None
    disconnect: Any = None  # Callable[[int, str], None]

    @property
    def is_owner(self) -> bool:
        return self.app_id is None


class AppCredential(msgspec.Struct, frozen=True, kw_only=True):
    app_id: str
    platform: str


class ProtocolService(Protocol):
    def connect(self, peer: Peer, send: Callable[[str], None]) -> Any: ...

    def resolve_file(self, session_id: str, handle: str) -> tuple[str, str] | None: ...

    def can_read(self, peer: Peer, session_id: str) -> bool: ...

    def going_offline(self) -> None: ...

    # optional: ``GET /api/models/<source>``; a JSON-able answer, or None for an unknown source
    def options(self, peer: Peer, source: str, dependency: str | None) -> Any: ...


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


class SessionServer:
    def __init__(self, service: ProtocolService, config: TransportConfig,
                 metrics: Callable[[], bytes] | None = None,
                 health: Callable[[], dict[str, Any]] | None = None) -> None:
        self.service = service
        self.config = config
        self.metrics = metrics
        self.health = health
        self._server: Server | None = None
        self.port: int | None = None
        self.connections: dict[ServerConnection, Outbox] = {}
        self.budget = InflightBudget(config.max_inflight_bytes)
        self.throttle = AuthThrottle(config.auth_failures, config.auth_window)
        self.origins: set[str] = set()
        self._writers: dict[ServerConnection, asyncio.Task[None]] = {}
        self._services: dict[ServerConnection, Any] = {}  # each connection's end of the service
        self._closing: dict[ServerConnection, asyncio.Task[None]] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._waker: Waker | None = None
        self._wire = WireFrames()

    async def start(self) -> int:
        def connection(*args: Any, **kwargs: Any) -> GuardedConnection:
            return GuardedConnection(*args, budget=self.budget, max_frame_bytes=self.config.max_frame_bytes,
                                     wait_s=self.config.inflight_wait, refuse=self._refused, **kwargs)

        self._server = await serve(
            self._handle, self.config.host, self.config.port, create_connection=connection,  # type: ignore[arg-type]
            process_request=self._process_request, max_size=self.config.max_frame_bytes,
            ping_interval=self.config.ping_interval, ping_timeout=self.config.ping_timeout,
            close_timeout=self.config.close_timeout, compression=None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.origins = {origin_key(o) for o in [*own_origins(self.config.host, self.port),
                                                 *self.config.allowed_origins]}
        stall = self._stall_limit()
        if stall is not None:
            self._watchdog = asyncio.ensure_future(self._watch_stalls(stall))
        return self.port

    async def stop(self, reason: str = "server shutting down", drain_s: float = 1.0) -> None:
        """Tell every connection the features went away, let the writers send what is queued
        (``drain_s`` at most: a client that does not read is not waited for), then close 1001
        (each peer gets ``close_timeout`` to answer, all at once)."""
        if self._server is None:
            return
        if self._watchdog is not None:
            self._watchdog.cancel()
        self.service.going_offline()
        outboxes = [o for o in self.connections.values() if not o.closed]
        if outboxes:
            try:
                await asyncio.wait_for(asyncio.gather(*(o.drained() for o in outboxes)), drain_s)
            except TimeoutError:
                pass
        for ws in list(self.connections):
            self._release(ws, 1001, reason, flush=False)
        await asyncio.gather(*list(self._closing.values()), return_exceptions=True)
        self._server.close()
        await self._server.wait_closed()

    # --- HTTP side ------------------------------------------------------------------------------

    def _authenticate(self, request: Request) -> Peer | None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
        token = None
        auth = request.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        elif "token" in query:
            token = query["token"][0]
        if not token:
            return None
        surface = query.get("surface", ["cli"])[0]
        surface = surface if surface in ("cli", "webui") else "cli"
        if hmac.compare_digest(token.encode(), self.config.owner_token.encode()):
            return Peer(platform="console", user_id="owner", surface=surface)
        for app_token, cred in self.config.app_tokens.items():
            if hmac.compare_digest(token.encode(), app_token.encode()):
                return Peer(platform=cred.platform, user_id=cred.app_id, surface=surface, app_id=cred.app_id)
        return None

    def _origin_allowed(self, request: Request) -> bool:
        """No Origin: not a browser (terminals and bots send none). Otherwise the origin must be
        the server's own listen address or on the allow list — never judged by the request's
        Host header, which a DNS-rebinding page controls as much as its Origin."""
        origin = request.headers.get("Origin")
        return origin is None or origin_key(origin) in self.origins

    async def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urllib.parse.urlsplit(request.path).path
        if path == "/healthz":
            body = msgspec.json.encode(self.health() if self.health else {"status": "ok"})
            return _response(200, body, "application/json")
        if path not in ("/metrics", "/session", "/api/session-file") and not path.startswith(OPTIONS_PREFIX):
            return _response(404, b"not found\n", "text/plain")
        for name in SINGLE_HEADERS:
            if len(request.headers.get_all(name)) > 1:
                return _response(400, f"more than one {name} header\n".encode(), "text/plain")
        if path == "/metrics" and self.config.metrics_public:
            return self._metrics()
        address = _client_address(connection)
        wait = self.throttle.retry_after(address, time.monotonic())
        if wait is not None:
            return _response(429, b"too many failed authentications: try again later\n", "text/plain",
                             {"Retry-After": str(math.ceil(wait))})
        peer = self._authenticate(request)
        if peer is None:
            self.throttle.failed(address, time.monotonic())
            return _response(401, b"missing or wrong token\n", "text/plain", {"WWW-Authenticate": "Bearer"})
        if path == "/metrics":
            if not peer.is_owner:
                return _response(403, b"/metrics needs the owner token\n", "text/plain")
            return self._metrics()
        if not self._origin_allowed(request):
            return _response(403, b"forbidden origin\n", "text/plain")
        if path == "/api/session-file":
            return await self._file(peer, request)
        if path.startswith(OPTIONS_PREFIX):
            return await self._options(peer, path[len(OPTIONS_PREFIX):], request)
        connection.peer = peer  # type: ignore[attr-defined]
        return None

    def _metrics(self) -> Response:
        return _response(200, self.metrics() if self.metrics else b"", "text/plain; version=0.0.4")

    async def _file(self, peer: Peer, request: Request) -> Response:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
        session_id = query.get("sessionId", [""])[0]
        handle = query.get("handle", [""])[0]
        found = self.service.resolve_file(session_id, handle) if session_id and handle else None
        if found is None or not self.service.can_read(peer, session_id):
            return _response(404, b"no such file\n", "text/plain")
        path, name = found
        data = await asyncio.get_running_loop().run_in_executor(None, _read, path)
        quoted = urllib.parse.quote(name)
        return _response(200, data, "application/octet-stream",
                         {"Content-Disposition": f"attachment; filename*=UTF-8''{quoted}"})

    async def _options(self, peer: Peer, source: str, request: Request) -> Response:
        """The option list of ``source``, with the ``dependency`` a ``dependsOn``
        field sends. Computed off the loop (a contributed source may be slow)."""
        source = urllib.parse.unquote(source)
        if not _SOURCE_NAME.fullmatch(source):
            return _response(404, b"no such option source\n", "text/plain")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
        dependency = query.get("dependency", [None])[0]
        if dependency is not None and len(dependency) > MAX_DEPENDENCY:
            return _response(400, f"dependency: at most {MAX_DEPENDENCY} characters\n".encode(), "text/plain")
        answer_of = getattr(self.service, "options", None)
        if answer_of is None:
            return _response(404, b"no such option source\n", "text/plain")
        try:
            answer = await asyncio.get_running_loop().run_in_executor(None, answer_of, peer, source, dependency)
        except Exception:
            log.exception("the option source %r failed", source)
            return _response(500, b"the option source failed\n", "text/plain")
        if answer is None:
            return _response(404, b"no such option source\n", "text/plain")
        return _response(200, msgspec.json.encode(answer), "application/json")

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


def _client_address(connection: ServerConnection) -> str:
    address = connection.remote_address
    return str(address[0]) if isinstance(address, tuple) and address else str(address)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _response(status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> Response:
    headers = Headers({"Content-Type": content_type, "Content-Length": str(len(body)), "Connection": "close"})
    for key, value in (extra or {}).items():
        headers[key] = value
    return Response(status, http.HTTPStatus(status).phrase, headers, body)
