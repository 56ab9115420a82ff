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
* ``GET /api/loop/events[?cursor=…]`` — an app's event feed as server-sent events
  (``transport_sse.py``; app tokens only, 403 for the owner): the cursor is ``Last-Event-ID``
  or ``cursor`` (400 when both are given and differ, or either is not a cursor), each event's
  ``id`` is its cursor; a cursor older than the feed's retention is answered 410 with
  ``{"error": {"code": "cursor-expired", "message", "oldestCursor"}}``;
* ``GET /metrics`` (Prometheus text; the owner token, unless ``metrics_public``) and ``GET /healthz``;
* the owner's web page (``web_login.py``): ``GET /`` (``/?token=`` logs in and redirects to ``/``),
  its files under ``/web/``, ``GET /api/web`` (is this browser logged in, the server's language),
  ``GET /api/login`` (the owner token as ``Authorization: Bearer``) and ``GET /api/logout``. A
  login sets an HttpOnly, SameSite=Strict cookie, signed and with an expiry, which the
  :class:`~protocol.web_login.WebLogins` given verify (:class:`MemoryLogins`: one process's;
  ``serve`` gives the data directory's, which every worker and a restarted server verify and
  whose logouts hold for all of them); ``/session`` and the other routes take it as the
  owner on the ``webui`` surface, only from the page itself: an allowed Origin, or without one
  ``Sec-Fetch-Site: same-origin`` (a cookie rides along on any same-site request, and other ports
  of the same host are the same site). A logout is passed to ``on_logout``, so the connections
  the login opened are closed.

Before any of that: a request with two ``Authorization``, ``Origin`` or ``Cookie`` headers is answered
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
import secrets
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
from sessionloop.protocol.transport_sse import SseStream, take_over
from sessionloop.protocol.web_login import (
    PAGE_HEADERS,
    Login,
    LoginCookies,
    Logouts,
    StaticFiles,
    WebLogins,
    clear_cookie,
    cookie_name,
    cookie_value,
    set_cookie,
)

__all__ = ["LOOP_EVENTS", "MAX_DEPENDENCY", "OPTIONS_PREFIX", "SINGLE_HEADERS", "SSE_RETRY_MS", "WEB_PREFIX",
           "WEB_ROUTES", "HttpEdges", "HttpSettings", "MemoryLogins", "sse_cursor", "sse_event", "sse_head"]

log = logging.getLogger("sessionloop.transport")

#: the headers a request may carry once: two would make "which one counts" the attacker's choice
SINGLE_HEADERS = ("Authorization", "Origin", "Cookie")
OPTIONS_PREFIX = "/api/models/"
_SOURCE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_DEPENDENCY = 1024
WEB_PREFIX = "/web/"
#: the page's routes besides its files: the page, whether this browser is logged in, log in, log out
WEB_ROUTES = ("/", "/api/web", "/api/login", "/api/logout")
LOOP_EVENTS = "/api/loop/events"
_AUTHENTICATED = ("/metrics", "/session", "/api/session-file", LOOP_EVENTS)
#: how long an EventSource waits before it reconnects (the stream's ``retry:``)
SSE_RETRY_MS = 1000
_CURSOR_DIGITS = 19


class HttpSettings(Protocol):
    """What the endpoints read of the transport's configuration (``transport.TransportConfig``).

    Read at every request, not copied: a reload swaps ``app_tokens`` whole (``sessionloop serve``
    on SIGHUP), and the next request is judged by the new table."""

    owner_token: str
    app_tokens: dict[str, AppCredential]
    metrics_public: bool
    max_outbox_bytes: int
    send_buffer_bytes: int
    ping_interval: float | None
    ping_timeout: float | None
    auth_failures: int
    auth_window: float


def now_ms() -> int:
    return int(time.time() * 1000)


class MemoryLogins:
    """The page's logins in one process (:class:`~protocol.web_login.WebLogins`): cookies signed
    under ``cookies`` (by default a key of its own, so a restart ends every login) and the
    logouts in memory. ``serve`` keeps the logouts in the data directory instead
    (``cli/web_logins.py``, a subclass)."""

    def __init__(self, cookies: LoginCookies | None = None) -> None:
        self.cookies = cookies or LoginCookies(secrets.token_bytes(32))
        self._logouts = Logouts()

    @property
    def ttl_s(self) -> float:
        return self.cookies.ttl_s

    def logouts(self) -> Logouts:
        return self._logouts

    def record(self, login: Login) -> None:
        self._logouts = self._logouts.with_logout(login, now_ms())

    def issue(self) -> str:
        return self.cookies.issue(now_ms())[1]

    def login(self, value: str | None) -> Login | None:
        found = self.cookies.verify(value, now_ms())
        return found if found is not None and not self.logouts().ends(found) else None

    def logout(self, value: str | None) -> Login | None:
        found = self.login(value)
        if found is not None:
            self.record(found)
        return found

    def live(self, login: Login) -> bool:
        return login.expires_ms > now_ms() and not self.logouts().ends(login)


class HttpEdges:
    """The answers to HTTP requests, and the authentication of the ones that go on to ``/session``.

    ``origins`` (the allowed Origin keys) is filled by the server once it knows its port."""

    def __init__(self, service: ProtocolService, config: HttpSettings,
                 metrics: Callable[[], bytes] | None = None,
                 health: Callable[[], dict[str, Any]] | None = None, logins: WebLogins | None = None,
                 on_logout: Callable[[Login], None] | None = None) -> None:
        self.service = service
        self.config = config
        self.metrics = metrics
        self.health = health
        self.throttle = AuthThrottle(config.auth_failures, config.auth_window)
        self.origins: set[str] = set()
        self.logins: WebLogins = logins if logins is not None else MemoryLogins()
        self.on_logout = on_logout
        self.files = StaticFiles()
        self.streams: set[SseStream] = set()  # open ``GET /api/loop/events`` streams

    def _authenticate(self, request: Request, cookie: str | None = None) -> Peer | None:
        """The peer of a token (``Authorization: Bearer``, else ``?token=``), else of the page's
        login cookie named ``cookie`` (the owner on the ``webui`` surface; see
        :meth:`_by_cookie`), else None."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
        token = _token(request)
        if not token:
            login = self._by_cookie(request, cookie) if cookie is not None else None
            if login is not None:
                return Peer(platform="console", user_id="owner", surface="webui", login=login)
            return None
        surface = query.get("surface", ["cli"])[0]
        surface = surface if surface in ("cli", "webui") else "cli"
        if self._is_owner_token(token):
            return Peer(platform="console", user_id="owner", surface=surface)
        for app_token, cred in self.config.app_tokens.items():
            if hmac.compare_digest(token.encode(), app_token.encode()):
                return Peer(platform=cred.platform, user_id=cred.app_id, surface=surface, app_id=cred.app_id)
        return None

    def _is_owner_token(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self.config.owner_token.encode())

    def _by_cookie(self, request: Request, name: str) -> Login | None:
        return self.logins.login(cookie_value(request.headers.get("Cookie"), name))

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
        web = path in WEB_ROUTES or path.startswith(WEB_PREFIX)
        if path not in _AUTHENTICATED and not path.startswith(OPTIONS_PREFIX) and not web:
            return _response(404, b"not found\n", "text/plain")
        for name in SINGLE_HEADERS:
            if len(request.headers.get_all(name)) > 1:
                return _response(400, f"more than one {name} header\n".encode(), "text/plain")
        if web and path == "/api/logout" and request.method == "GET" and self._origin_allowed(request):
            return await self._logout(connection, request)
        if web:
            return self._web(connection, request, path)
        if path == "/metrics" and self.config.metrics_public:
            return self._metrics()
        refused = self._throttled(connection)
        if refused is not None:
            return refused
        cookie = cookie_name(_local_port(connection))
        peer = self._authenticate(request, cookie)
        if peer is None:
            return self._failed(connection)
        if path == "/metrics":
            if not peer.is_owner:
                return _response(403, b"/metrics needs the owner token\n", "text/plain")
            return self._metrics()
        if not self._origin_allowed(request):
            return _response(403, b"forbidden origin\n", "text/plain")
        if self._cookie_only(request) and not _from_the_page(request):
            return _response(403, b"the login cookie is accepted only from the page itself\n", "text/plain")
        if path == "/api/session-file":
            return await self._file(peer, request)
        if path.startswith(OPTIONS_PREFIX):
            return await self._options(peer, path[len(OPTIONS_PREFIX):], request)
        if path == LOOP_EVENTS:
            return await self._events(connection, peer, request)
        connection.peer = peer  # type: ignore[attr-defined]
        return None

    def _cookie_only(self, request: Request) -> bool:
        """Authenticated by the cookie alone: no token given (an empty one is none)."""
        return not _token(request)

    def _throttled(self, connection: ServerConnection) -> Response | None:
        wait = self.throttle.retry_after(_client_address(connection), time.monotonic())
        if wait is None:
            return None
        return _response(429, b"too many failed authentications: try again later\n", "text/plain",
                         {"Retry-After": str(math.ceil(wait))})

    def _failed(self, connection: ServerConnection) -> Response:
        self.throttle.failed(_client_address(connection), time.monotonic())
        return _response(401, b"missing or wrong token\n", "text/plain", {"WWW-Authenticate": "Bearer"})

    # --- the owner's web page ---------------------------------------------------------------------

    def _web(self, connection: ServerConnection, request: Request, path: str) -> Response:
        if request.method != "GET":
            return _response(405, b"only GET\n", "text/plain", {"Allow": "GET"})
        if not self._origin_allowed(request):
            return _response(403, b"forbidden origin\n", "text/plain")
        name = cookie_name(_local_port(connection))
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
        if path.startswith(WEB_PREFIX):
            found = self.files.get(path[len(WEB_PREFIX):])
            if found is None:
                return _response(404, b"not found\n", "text/plain")
            return _response(200, found[0], found[1], PAGE_HEADERS)
        if path == "/api/web":
            body = msgspec.json.encode({"authenticated": self._by_cookie(request, name) is not None,
                                        "language": self._language()})
            return _response(200, body, "application/json", PAGE_HEADERS)
        if path == "/api/login" or "token" in query:
            return self._login(connection, request, path, name, query)
        page = self.files.get("index.html")
        if page is None:
            return _response(404, b"the web page is not installed\n", "text/plain")
        return _response(200, page[0], page[1], PAGE_HEADERS)

    async def _logout(self, connection: ServerConnection, request: Request) -> Response:
        """End the login of the request's cookie for every process (recording it may write a file:
        off the event loop), close its connections here (``on_logout``), clear the cookie."""
        if not _from_the_page(request):  # another port of the host could log the page out
            return _response(403, b"log out from the page itself\n", "text/plain")
        name = cookie_name(_local_port(connection))
        value = cookie_value(request.headers.get("Cookie"), name)
        ended = await asyncio.get_running_loop().run_in_executor(None, self.logins.logout, value)
        if ended is not None and self.on_logout is not None:
            self.on_logout(ended)
        return _response(204, b"", "text/plain", {**PAGE_HEADERS, "Set-Cookie": clear_cookie(name)})

    def _login(self, connection: ServerConnection, request: Request, path: str, name: str,
               query: dict[str, list[str]]) -> Response:
        """The owner token (``Authorization: Bearer`` on ``/api/login``, ``?token=`` on ``/``) for
        a login cookie. Only the owner's: the page is the owner's console. ``/?token=`` answers
        with a redirect to ``/``, so the token leaves the address bar and the history."""
        refused = self._throttled(connection)
        if refused is not None:
            return refused
        auth = request.headers.get("Authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else query.get("token", [""])[0]
        if not token or not self._is_owner_token(token):
            return self._failed(connection)
        cookie = set_cookie(name, self.logins.issue(), self.logins.ttl_s)
        if path == "/api/login":
            return _response(204, b"", "text/plain", {**PAGE_HEADERS, "Set-Cookie": cookie})
        return _response(303, b"", "text/plain", {**PAGE_HEADERS, "Set-Cookie": cookie, "Location": "/"})

    def _language(self) -> str:
        """The language of the server's human text, which the page's own text follows: the
        service's ``language`` when it has one, else its runtime's; ``en`` without either."""
        for holder in (self.service, getattr(self.service, "rt", None)):
            language = getattr(holder, "language", None)
            if isinstance(language, str) and language:
                return language
        return "en"

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


    # --- the event feed as server-sent events ---------------------------------------------------------

    async def _events(self, connection: ServerConnection, peer: Peer, request: Request) -> Response:
        """``GET /api/loop/events``: checks, then the socket is handed to an :class:`SseStream`
        (``transport_sse.py``); the Response returned then is never sent."""
        cursor, problem = sse_cursor(request)
        if problem is not None:
            return _response(400, f"{problem}\n".encode(), "text/plain")
        watch = getattr(self.service, "watch_feed", None)
        if watch is None:
            return _response(404, b"not found\n", "text/plain")
        if peer.app_id is None:
            return _error_json(403, "forbidden", "the event feed is for apps: connect with an app token")
        loop = asyncio.get_running_loop()
        interval, timeout = self.config.ping_interval, self.config.ping_timeout
        stall = interval + timeout if interval is not None and timeout is not None else None
        stream = SseStream(loop, sse_head(), max_bytes=self.config.max_outbox_bytes, heartbeat_s=interval,
                           stall_s=stall, on_closed=self.streams.discard)

        def deliver(event: Any) -> bool:
            return stream.put(sse_event(event))

        def ended(error: BaseException) -> None:  # the cursor expired under a client that fell behind
            loop.call_soon_threadsafe(stream.close, "the stream fell behind the event feed's retention", True)

        try:
            start_after, stop = await loop.run_in_executor(None, watch, peer, cursor, deliver, ended)
        except Exception as e:
            return _feed_refused(e)
        stream.stop = stop
        self.streams.add(stream)
        stream.put(f": after {start_after}\n\n".encode())
        take_over(connection, stream, self.config.send_buffer_bytes)
        return _response(200, b"", "text/event-stream")

    def close_streams(self) -> None:
        """At shutdown: every event stream ends (what is queued goes first)."""
        for stream in list(self.streams):
            stream.close("server shutting down")


def sse_cursor(request: Request) -> tuple[int | None, str | None]:
    """The cursor a ``GET /api/loop/events`` resumes after: ``Last-Event-ID`` (what an EventSource
    sends when it reconnects), else the ``cursor`` query parameter; ``(cursor, None)`` or
    ``(None, problem)``. None without either: the stream starts at the present."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
    given = [v for v in (request.headers.get("Last-Event-ID"), *query.get("cursor", [])) if v is not None]
    if len(request.headers.get_all("Last-Event-ID")) > 1 or len(query.get("cursor", [])) > 1:
        return None, "give one cursor"
    values = {v.strip() for v in given}
    if len(values) > 1:
        return None, "Last-Event-ID and cursor differ: give one"
    if not values:
        return None, None
    text = values.pop()
    if not text.isascii() or not text.isdigit() or len(text) > _CURSOR_DIGITS or int(text) > 2**63 - 1:
        return None, "the cursor (Last-Event-ID or cursor) is not one of this server's (digits, at most 2**63 - 1)"
    return int(text), None


def sse_head() -> bytes:
    """The response head of an event stream and its ``retry:`` field."""
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-store\r\n"
            b"X-Accel-Buffering: no\r\nConnection: close\r\n\r\n" + f"retry: {SSE_RETRY_MS}\n\n".encode())


def sse_event(event: Any) -> bytes:
    """One feed event (a wire ``LoopEvent``) as an SSE event: ``id:`` its cursor (none for a live
    delta, cursor ``"0"``), ``data:`` its JSON (one line: JSON escapes every newline)."""
    data = msgspec.json.encode(event)
    cursor = getattr(event, "cursor", "0")
    head = b"" if cursor == "0" else f"id: {cursor}\n".encode()
    return head + b"data: " + data + b"\n\n"


def _error_json(status: int, code: str, message: str, **extra: Any) -> Response:
    body = msgspec.json.encode({"error": {"code": code, "message": message, **extra}})
    return _response(status, body, "application/json")


def _feed_refused(error: Exception) -> Response:
    """The answer to a feed the service refused: 410 for an expired cursor (with the oldest one),
    403 forbidden, else 500."""
    code = getattr(error, "code", None)
    data = getattr(error, "data", None) or {}
    message = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
    if code == "cursor-expired":
        return _error_json(410, "cursor-expired", message, oldestCursor=str(data.get("oldestCursor", "")))
    if code == "forbidden":
        return _error_json(403, "forbidden", message)
    log.error("the event feed failed to start: %r", error)
    return _error_json(500, "internal", "the event feed failed to start")


def _token(request: Request) -> str | None:
    """The token a request gives: ``Authorization: Bearer``, else ``?token=``."""
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
    return query["token"][0] if "token" in query else None


def _from_the_page(request: Request) -> bool:
    """Whether a browser says the request comes from the page itself: the cookie stands for the
    owner only there. With an Origin (a WebSocket upgrade always has one; it was checked against
    the allowed ones already), yes; without one (a same-origin GET: a download link, a fetch),
    only when ``Sec-Fetch-Site`` says ``same-origin`` (or ``none``: the owner opened the address
    itself). Another port of the same host is the same *site* for cookies, and says
    ``same-site``; a request with neither header is not a browser's, and a cookie alone does not
    stand for the owner there."""
    if request.headers.get("Origin") is not None:
        return True
    return request.headers.get("Sec-Fetch-Site", "").strip().lower() in ("same-origin", "none")


def _local_port(connection: ServerConnection) -> int:
    """The port this request came in on (the login cookie's name carries it)."""
    address = connection.transport.get_extra_info("sockname") if connection.transport is not None else None
    return int(address[1]) if isinstance(address, tuple) and len(address) > 1 else 0


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
