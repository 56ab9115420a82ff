"""The WebSocket transport: the one I/O shell of protocol/ (STYLE rule 1).

It moves text between sockets and a session-protocol service (the seed's
``connect(peer, send) -> {receive, close}``) and serves three small HTTP endpoints. It imports
no actor: the service is anything with ``connect``, ``resolve_file`` and ``can_read``.

* ``/session`` — the protocol, after authentication (``Authorization: Bearer`` or ``?token=``;
  401 before the upgrade for a missing or wrong token) and an Origin check (403 before the
  upgrade for a browser page whose origin is neither the server's own listen address nor on
  ``allowed_origins``; no Origin at all — terminals, bots — passes);
* ``GET /api/session-file?sessionId=…&handle=…`` — an attachment, as ``application/octet-stream``,
  only for a handle the service issued for that session in this epoch;
* ``GET /metrics`` (Prometheus text; the owner token, unless ``metrics_public``) and ``GET /healthz``.

Before any of that: a request with two ``Authorization`` or two ``Origin`` headers is answered
400; an address that failed authentication ``auth_failures`` times in ``auth_window`` seconds is
answered 429 with ``Retry-After`` (:class:`~protocol.guards.AuthThrottle`).

Every connection has a bounded outbox: pushes from actor threads are queued without blocking
them; a client that does not read lets its outbox grow to ``max_outbox_bytes``, then it is
closed with code 4008 ("slow consumer") — memory stays bounded and other clients are unaffected
(RELIABILITY, websockets). A frame above the socket's hard limit closes with 1009; frames below
it but above the application limit get an ``invalidRequest`` reply from the connection.
"""

from __future__ import annotations

import asyncio
import hmac
import http
import logging
import math
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
from websockets.http11 import Request, Response

from .guards import AuthThrottle, origin_key, own_origins

log = logging.getLogger("sessionloop.transport")

CLOSE_SLOW_CONSUMER = 4008
DEFAULT_MAX_OUTBOX = 8 * 1024 * 1024
#: the headers a request may carry once: two would make "which one counts" the attacker's choice
SINGLE_HEADERS = ("Authorization", "Origin")


class Peer(msgspec.Struct, kw_only=True):
    """An authenticated connection (seed 004 ``SessionPeer``): who, on which approval surface,
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


class TransportConfig(msgspec.Struct, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8765
    owner_token: str
    app_tokens: dict[str, AppCredential] = {}
    allowed_origins: list[str] = []  # besides the server's own listen address (guards.own_origins)
    max_frame_bytes: int = 64 * 1024 * 1024  # the socket's hard limit (close 1009 above it)
    max_outbox_bytes: int = DEFAULT_MAX_OUTBOX
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    # after a failed keepalive (or any close) the peer gets this long to close its side before the
    # socket is aborted: a dead peer is let go ping_interval + ping_timeout + close_timeout after
    # it fell silent
    close_timeout: float | None = 10.0
    metrics_public: bool = False  # /metrics without a token
    auth_failures: int = 20  # failed authentications an address may have ...
    auth_window: float = 60.0  # ... in this many seconds before it gets 429


class Outbox:
    """A connection's bounded queue of frames to send, filled from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self._limit = limit
        self._frames: deque[str] = deque()
        self._size = 0
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self.overflowed = False
        self.closed = False

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
            if behind > self._limit:
                self.overflowed = True
                wake = True
        if wake:
            self._loop.call_soon_threadsafe(self._ready.set)

    def take(self) -> list[str]:
        with self._lock:
            frames = list(self._frames)
            self._frames.clear()
            self._size = 0
            return frames

    async def drained(self) -> None:
        """Return once the writer has taken every queued frame (or the outbox closed)."""
        while self._frames and not self.closed:
            await asyncio.sleep(0.005)

    async def wait(self) -> None:
        await self._ready.wait()
        self._ready.clear()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._frames.clear()
            self._size = 0
        self._loop.call_soon_threadsafe(self._ready.set)


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
        self.throttle = AuthThrottle(config.auth_failures, config.auth_window)
        self.origins: set[str] = set()

    async def start(self) -> int:
        self._server = await serve(
            self._handle, self.config.host, self.config.port,
            process_request=self._process_request, max_size=self.config.max_frame_bytes,
            ping_interval=self.config.ping_interval, ping_timeout=self.config.ping_timeout,
            close_timeout=self.config.close_timeout, compression=None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.origins = {origin_key(o) for o in [*own_origins(self.config.host, self.port),
                                                 *self.config.allowed_origins]}
        return self.port

    async def stop(self, reason: str = "server shutting down", drain_s: float = 1.0) -> None:
        """Tell every connection the features went away, let the writers send what is queued
        (``drain_s`` at most: a client that does not read is not waited for), then close 1001."""
        if self._server is None:
            return
        self.service.going_offline()
        outboxes = [o for o in self.connections.values() if not o.closed]
        if outboxes:
            try:
                await asyncio.wait_for(asyncio.gather(*(o.drained() for o in outboxes)), drain_s)
            except TimeoutError:
                pass
        for ws in list(self.connections):
            await ws.close(1001, reason[:120])
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
        if path not in ("/metrics", "/session", "/api/session-file"):
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

    # --- WebSocket side ---------------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        peer: Peer = ws.peer  # type: ignore[attr-defined]
        loop = asyncio.get_running_loop()
        outbox = Outbox(loop, self.config.max_outbox_bytes)

        def disconnect(code: int, reason: str) -> None:
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(_close(ws, code, reason)))

        peer.disconnect = disconnect
        conn = self.service.connect(peer, outbox.put)
        self.connections[ws] = outbox
        writer = asyncio.ensure_future(self._write(ws, outbox))
        try:
            async for message in ws:
                conn.receive(message)
        except ConnectionClosed:
            pass
        finally:
            self.connections.pop(ws, None)
            outbox.close()
            conn.close()
            writer.cancel()

    async def _write(self, ws: ServerConnection, outbox: Outbox) -> None:
        try:
            while True:
                await outbox.wait()
                if outbox.overflowed:
                    await _close(ws, CLOSE_SLOW_CONSUMER, "slow consumer: outgoing buffer full")
                    return
                for frame in outbox.take():
                    await ws.send(frame)
                if outbox.closed:
                    return
        except ConnectionClosed:
            return


async def _close(ws: ServerConnection, code: int, reason: str) -> None:
    encoded = reason.encode("utf-8")[:123].decode("utf-8", "ignore")  # close frames carry 123 bytes
    await ws.close(code, encoded)


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
