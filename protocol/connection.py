"""One session-protocol connection as a sans-I/O state machine (after h11's ``_state.py``).

Theory of operation
-------------------
A :class:`Connection` is created by the transport for each authenticated WebSocket. It never
touches a socket, a clock or an actor: the transport feeds it every received text with
:meth:`Connection.receive` and carries out what comes back, in order:

* :class:`Send` -- a frame to write to the socket;
* :class:`Dispatch` -- a decoded, validated request the gateway must carry out; when done the
  gateway calls :meth:`Connection.result` or :meth:`Connection.error` with the same id and sends
  the returned frame;
* :class:`Close` -- close the socket with this code and reason (after sending what precedes it).

Every request gets exactly one reply frame: either at once (a :class:`Send` from ``receive``) or
later (from ``result``/``error`` after a :class:`Dispatch`).

Every frame the server sends comes out of a :class:`Connection` (as websockets'
``data_to_send()`` and h11's ``Connection.send()`` do), so the connection's state decides whether
it goes out. A notification to one connection is :meth:`Connection.notify`; a notification to
many (a session's pushes to its subscribers) is encoded once with :func:`encode_push` and the one
:class:`Push` handed to each connection's :meth:`Connection.push`, which gives back the shared
text while the connection is open and ``None`` otherwise.

States and what may happen in each (the table :data:`TRANSITIONS` is the authority)::

    AWAITING_INIT --initialize accepted--> OPEN
    AWAITING_INIT --handshake made on another worker (relayed)--> OPEN
    AWAITING_INIT --initialize refused (version)--> CLOSED   (error frame, then Close)
    AWAITING_INIT / OPEN --transport closed / server shutdown--> CLOSED

* AWAITING_INIT: only ``initialize`` is served (answered here, from the injected
  :attr:`ServerInfo.describe`); any other method is ``invalidRequest`` (a request before the
  handshake is refused so). A malformed version is ``invalidParams`` and the connection stays here.
* OPEN: every registered method is decoded and dispatched; a second ``initialize`` is
  ``invalidRequest``; an unknown method ``methodNotFound``.
* CLOSED: nothing is produced any more: ``receive`` returns ``[]``, ``result``/``error``/``notify``
  return ``None`` (the gateway may finish work after the socket went away).

Peer errors become replies; our own misuse (answering an id that is not in flight, a result of the
wrong type, an unknown notification, an illegal transition) raises :class:`ProtocolMisuse`.

Back-pressure: a token bucket per connection (``now`` is passed in, in seconds from any monotonic
clock) and a bound on requests in flight; both answer ``applicationError`` / ``rejected`` with
``retryAfterMs``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import msgspec

from sessionloop.protocol.errors import INVALID_PARAMS, ProtocolMisuse, RpcError, from_domain_error
from sessionloop.protocol.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    BadFrame,
    Request,
    RequestId,
    decode_params,
    decode_request,
    error_frame,
    notification_frame,
    result_frame,
)
from sessionloop.protocol.handshake import SESSION_PROTOCOL_VERSION, negotiate
from sessionloop.protocol.registry import METHODS, NOTIFICATIONS, MethodSpec
from sessionloop.protocol.schemas import InitializeParams, InitializeResult, ServerName
from sessionloop.protocol.schemas_types import ClientInfo, Features, Identity, RateLimits

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_UNSUPPORTED_VERSION",
    "TRANSITIONS",
    "Close",
    "Connection",
    "Dispatch",
    "Event",
    "Limits",
    "Output",
    "Push",
    "Send",
    "ServerInfo",
    "State",
    "TokenBucket",
    "encode_push",
    "truncate_close_reason",
]

#: After an unsupported version the connection is closed with 1000 and the refusal as the reason.
CLOSE_UNSUPPORTED_VERSION: Final = 1000
#: Server stopping or reloading: clients reconnect.
CLOSE_GOING_AWAY: Final = 1001
#: WebSocket close frames carry at most 123 bytes of reason.
MAX_CLOSE_REASON_BYTES: Final = 123


class State(enum.Enum):
    AWAITING_INIT = "awaiting-init"
    OPEN = "open"
    CLOSED = "closed"


class Event(enum.Enum):
    INIT_ACCEPTED = "init-accepted"
    INIT_RELAYED = "init-relayed"
    INIT_REFUSED = "init-refused"
    TRANSPORT_CLOSED = "transport-closed"
    SERVER_SHUTDOWN = "server-shutdown"


TRANSITIONS: Final[dict[tuple[State, Event], State]] = {
    (State.AWAITING_INIT, Event.INIT_ACCEPTED): State.OPEN,
    (State.AWAITING_INIT, Event.INIT_RELAYED): State.OPEN,
    (State.AWAITING_INIT, Event.INIT_REFUSED): State.CLOSED,
    (State.AWAITING_INIT, Event.TRANSPORT_CLOSED): State.CLOSED,
    (State.AWAITING_INIT, Event.SERVER_SHUTDOWN): State.CLOSED,
    (State.OPEN, Event.TRANSPORT_CLOSED): State.CLOSED,
    (State.OPEN, Event.SERVER_SHUTDOWN): State.CLOSED,
    # The transport reports its close even when we asked for it: closing is idempotent.
    (State.CLOSED, Event.TRANSPORT_CLOSED): State.CLOSED,
    (State.CLOSED, Event.SERVER_SHUTDOWN): State.CLOSED,
}


# --- outputs --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Write this frame to the socket."""

    text: str


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Carry out ``method`` with the decoded ``params``; answer with ``result``/``error``(``id``)."""

    id: RequestId
    method: str
    params: msgspec.Struct


@dataclass(frozen=True, slots=True)
class Close:
    """Close the socket; ``reason`` is whole (use :func:`truncate_close_reason` for the frame)."""

    code: int
    reason: str


Output = Send | Dispatch | Close


@dataclass(frozen=True, slots=True)
class Push:
    """A notification encoded once for every connection it goes to (:func:`encode_push`); each
    connection's :meth:`Connection.push` decides whether ``text`` goes out on it."""

    method: str
    text: str


def _check_notification(method: str, params: msgspec.Struct) -> None:
    expected = NOTIFICATIONS.get(method)
    if expected is None:
        raise ProtocolMisuse(f"unknown notification {method!r}", method=method)
    if not isinstance(params, expected):
        raise ProtocolMisuse(f"{method} takes {expected.__name__}, not {type(params).__name__}", method=method)


def encode_push(method: str, params: msgspec.Struct, encoder: msgspec.json.Encoder | None = None) -> Push:
    """The frame of notification ``method`` encoded once, for :meth:`Connection.push` on any number of
    connections. Raises :class:`ProtocolMisuse` for a notification the protocol does not have, params
    of the wrong type or params that cannot be encoded."""
    _check_notification(method, params)
    return Push(method, notification_frame(method, params, encoder))


def truncate_close_reason(reason: str, limit: int = MAX_CLOSE_REASON_BYTES) -> str:
    """Cut ``reason`` to at most ``limit`` UTF-8 bytes without splitting a character."""
    encoded = reason.encode("utf-8", "replace")
    if len(encoded) <= limit:
        return reason
    return encoded[:limit].decode("utf-8", "ignore")


# --- configuration --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection limits (docs/protocol.md, Transport). ``requests_per_second=None`` turns the rate limit off."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    requests_per_second: float | None = 100.0
    burst: int = 200
    max_in_flight: int = 256


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What ``initialize`` answers. ``describe`` returns ``(features, app_name)`` and is called on
    every handshake, so a renamed app or a service coming up shows on the next connection without a
    restart (read afresh on every handshake). It is our code, not peer input: an exception from it propagates."""

    name: str
    describe: Callable[[], tuple[Features, str]]
    protocol_version: str = SESSION_PROTOCOL_VERSION


class TokenBucket:
    """A token bucket: ``rate`` tokens per second, at most ``burst`` saved. Time comes in as
    ``now`` (seconds, monotonic); a clock going backwards refills nothing."""

    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0 or burst < 1:
            raise ProtocolMisuse("a token bucket needs rate > 0 and burst >= 1", rate=rate, burst=burst)
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._last: float | None = None

    def take(self, now: float) -> int | None:
        """Take one token: ``None`` if granted, else the milliseconds until one is available."""
        if self._last is not None and now > self._last:
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        if self._last is None or now > self._last:
            self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return max(1, math.ceil((1.0 - self._tokens) / self._rate * 1000))


# --- the connection -------------------------------------------------------------------------------


class Connection:
    """The protocol side of one client connection; see the module docstring."""

    def __init__(
        self,
        identity: Identity,
        surface: str,
        server_info: ServerInfo,
        limits: Limits | None = None,
        encoder: msgspec.json.Encoder | None = None,
    ) -> None:
        self.identity = identity
        #: encodes this connection's frames; the application's renders its text objects (see
        #: :mod:`protocol.frames`), None: the shared encoder
        self.encoder = encoder
        self.surface = surface
        self.client: ClientInfo | None = None  # the ClientInfo of initialize, once accepted
        self._server = server_info
        self._limits = limits or Limits()
        rate = self._limits.requests_per_second
        self._bucket = TokenBucket(rate, self._limits.burst) if rate is not None else None
        self._state = State.AWAITING_INIT
        self._in_flight: dict[RequestId, MethodSpec] = {}

    # --- state ----------------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def is_open(self) -> bool:
        """Initialized and not closed: pushes may be sent to it."""
        return self._state is State.OPEN

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def _transition(self, event: Event) -> None:
        try:
            self._state = TRANSITIONS[(self._state, event)]
        except KeyError:
            raise ProtocolMisuse(f"illegal transition: {event.value} in state {self._state.value}") from None
        if self._state is State.CLOSED:
            self._in_flight.clear()

    # --- input ----------------------------------------------------------------------------------

    def receive(self, data: str | bytes, now: float | None = None) -> list[Output]:
        """Handle one received frame; never raises on peer input.

        ``now`` (seconds, monotonic) feeds the rate limiter; without it the limiter is not
        consulted (tests, trusted in-process callers).
        """
        if self._state is State.CLOSED:
            return []
        decoded = decode_request(data, self._limits.max_frame_bytes)
        if isinstance(decoded, BadFrame):
            return [Send(error_frame(decoded.id, decoded.error))]
        if now is not None and self._bucket is not None:
            retry_after = self._bucket.take(now)
            if retry_after is not None:
                error = RpcError.rejected("too many requests on this connection", retry_after)
                return [Send(error_frame(decoded.id, error))]
        return self._route(decoded)

    def _route(self, request: Request) -> list[Output]:
        rid, method = request.id, request.method
        if method == "initialize":
            if self._state is State.OPEN:
                return self._reply(rid, RpcError.invalid_request("already initialized"))
            return self._initialize(request)
        if self._state is State.AWAITING_INIT:
            return self._reply(
                rid, RpcError.invalid_request("initialize first: the handshake has not happened")
            )
        spec = METHODS.get(method)
        if spec is None:
            return self._reply(rid, RpcError.method_not_found(method))
        if rid in self._in_flight:
            return self._reply(rid, RpcError.invalid_request("id is already used by a request in flight"))
        if len(self._in_flight) >= self._limits.max_in_flight:
            return self._reply(rid, RpcError.rejected("too many requests in flight", 1000))
        params = decode_params(spec.decoder, request.params)
        if isinstance(params, RpcError):
            return self._reply(rid, params)
        self._in_flight[rid] = spec
        return [Dispatch(rid, method, params)]

    def _initialize(self, request: Request) -> list[Output]:
        params = decode_params(METHODS["initialize"].decoder, request.params)
        if isinstance(params, RpcError):
            return self._reply(request.id, params)
        assert isinstance(params, InitializeParams)
        try:
            version = negotiate(params.protocol_version, self._server.protocol_version)
        except RpcError as refusal:
            if refusal.rpc_code == INVALID_PARAMS:
                return self._reply(request.id, refusal)
            self._transition(Event.INIT_REFUSED)
            return [Send(error_frame(request.id, refusal)), Close(CLOSE_UNSUPPORTED_VERSION, refusal.message)]
        features, app_name = self._server.describe()
        result = InitializeResult(
            protocol_version=version,
            experimental=True,
            server=ServerName(name=self._server.name),
            identity=self.identity,
            surface=self.surface,
            features=features,
            app_name=app_name,
            rate_limits=RateLimits(requests_per_second=self._limits.requests_per_second, burst=self._limits.burst,
                                   max_in_flight=self._limits.max_in_flight),
        )
        self._transition(Event.INIT_ACCEPTED)
        self.client = params.client
        return [Send(result_frame(request.id, result, self.encoder))]

    def open_relayed(self, client: ClientInfo | None) -> None:
        """Open without a handshake of its own: the client made it with another worker process, which
        relays this connection's requests for the sessions this one runs (``serve --workers``)."""
        self._transition(Event.INIT_RELAYED)
        self.client = client

    def relayed(self, request_id: RequestId, frame: str) -> str | None:
        """Settle a dispatched request with ``frame``, the response another worker process made
        for it (its result or error, already encoded), or ``None`` if the connection closed.
        Raises :class:`ProtocolMisuse` if ``request_id`` is not in flight."""
        if self._take(request_id) is None:
            return None
        del self._in_flight[request_id]
        return frame

    def _reply(self, request_id: RequestId, error: RpcError) -> list[Output]:
        return [Send(error_frame(request_id, error, self.encoder))]

    # --- answers from the gateway ---------------------------------------------------------------

    def _take(self, request_id: RequestId) -> MethodSpec | None:
        spec = self._in_flight.get(request_id)
        if spec is None and self._state is not State.CLOSED:
            raise ProtocolMisuse(f"no request {request_id!r} is in flight on this connection", id=request_id)
        return spec

    def result(self, request_id: RequestId, result: msgspec.Struct) -> str | None:
        """The result frame for a dispatched request, or ``None`` if the connection closed.

        Raises :class:`ProtocolMisuse` if ``request_id`` is not in flight or ``result`` is not the
        method's registered result type.
        """
        spec = self._take(request_id)
        if spec is None:
            return None
        if not isinstance(result, spec.result):
            raise ProtocolMisuse(
                f"{spec.name} answers {spec.result.__name__}, not {type(result).__name__}", method=spec.name
            )
        del self._in_flight[request_id]
        return result_frame(request_id, result, self.encoder)

    def error(self, request_id: RequestId, error: BaseException) -> str | None:
        """The error frame for a dispatched request, or ``None`` if the connection closed.

        Any exception is accepted and translated by :func:`protocol.errors.from_domain_error`: an
        :class:`RpcError` as it is, an error with a business ``code`` as that application error, the
        rest as ``internalError``.
        """
        if self._take(request_id) is None:
            return None
        del self._in_flight[request_id]
        return error_frame(request_id, from_domain_error(error), self.encoder)

    def notify(self, method: str, params: msgspec.Struct) -> str | None:
        """A notification frame, or ``None`` while the connection is not open (nothing to push).

        Raises :class:`ProtocolMisuse` for an unknown notification or params of the wrong type,
        whatever the state."""
        _check_notification(method, params)
        if self._state is not State.OPEN:
            return None
        return notification_frame(method, params, self.encoder)

    def push(self, push: Push) -> str | None:
        """The text of a notification encoded once for many connections (:func:`encode_push`), or
        ``None`` while this connection is not open.

        It only reads the state, so a caller that serializes the other methods with a lock may call
        it without (pushes come from many threads): a push that races a close may then still be
        handed out, and the transport drops it with the socket."""
        if self._state is not State.OPEN:
            return None
        return push.text

    # --- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """The transport closed the socket: forget requests in flight, produce nothing more."""
        self._transition(Event.TRANSPORT_CLOSED)

    def shutdown(self, reason: str) -> list[Output]:
        """The server stops or reloads: ask the transport to close (clients reconnect)."""
        if self._state is State.CLOSED:
            return []
        self._transition(Event.SERVER_SHUTDOWN)
        return [Close(CLOSE_GOING_AWAY, reason)]
