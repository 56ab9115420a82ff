"""The transport's HTTP endpoints, answered before any WebSocket upgrade: part of the I/O shell of
protocol/ (with ``transport.py``, which hands every opening request to :meth:`HttpEdges.process_request`).

* ``/session`` — the protocol, after authentication (``Authorization: Bearer`` or ``?token=``;
  401 before the upgrade for a missing or wrong token) and an Origin check (403 before the
  upgrade for a browser page whose origin is neither the server's own listen address nor on
  ``allowed_origins``; no Origin at all — terminals, bots — passes): the request goes on to the
  upgrade with its :class:`Peer`;
* ``GET /api/session-file?sessionId=…&handle=…`` — an attachment, as ``application/octet-stream``,
  only for a handle the service issued for that session in this epoch (read off the event loop);
* ``GET /api/models/<source>?dependency=…`` — the option list of a settings field's
  ``dynamicOptions`` source (``llm``: the configured models), JSON, answered by
  the service's ``options``; any valid token, the Origin check of ``/session``; 404 for a source
  nobody answers;
* ``GET /metrics`` (Prometheus text; the owner token, unless ``metrics_public``) and ``GET /healthz``.

Before any of that: a request with two ``Authorization`` or two ``Origin`` headers is answered
400; an address that failed authentication ``auth_failures`` times in ``auth_window`` seconds is
answered 429 with ``Retry-After`` (:class:`~protocol.guards.AuthThrottle`).
"""

from __future__ import annotations

import asyncio
import hmac
import http
import logging
import math
import re
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from sessionloop.protocol.guards import AuthThrottle, origin_key
from sessionloop.protocol.peer import AppCredential, Peer, ProtocolService

__all__ = ["MAX_DEPENDENCY", "OPTIONS_PREFIX", "SINGLE_HEADERS", "HttpEdges", "HttpSettings"]

log = logging.getLogger("sessionloop.transport")

#: the headers a request may carry once: two would make "which one counts" the attacker's choice
SINGLE_HEADERS = ("Authorization", "Origin")
OPTIONS_PREFIX = "/api/models/"
_SOURCE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_DEPENDENCY = 1024


class HttpSettings(Protocol):
    """What the endpoints read of the transport's configuration (``transport.TransportConfig``).

    Read at every request, not copied: a reload swaps ``app_tokens`` whole (``sessionloop serve``
    on SIGHUP), and the next request is judged by the new table."""

    owner_token: str
    app_tokens: dict[str, AppCredential]
    metrics_public: bool
    auth_failures: int
    auth_window: float


class HttpEdges:
    """The answers to HTTP requests, and the authentication of the ones that go on to ``/session``.

    ``origins`` (the allowed Origin keys) is filled by the server once it knows its port."""

    def __init__(self, service: ProtocolService, config: HttpSettings,
                 metrics: Callable[[], bytes] | None = None,
                 health: Callable[[], dict[str, Any]] | None = None) -> None:
        self.service = service
        self.config = config
        self.metrics = metrics
        self.health = health
        self.throttle = AuthThrottle(config.auth_failures, config.auth_window)
        self.origins: set[str] = set()

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

    async def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """The answer to an HTTP request, or None to let a ``/session`` request go on to the
        upgrade (its :class:`Peer` set on ``connection.peer``)."""
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
