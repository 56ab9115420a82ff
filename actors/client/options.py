"""The options of :class:`~sessionloop.client.aio.AsyncClient`, each bounded (checked on construction)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sessionloop.client.errors import InvalidArguments
from sessionloop.protocol.connection import Limits
from sessionloop.protocol.schemas_types import RateLimits

__all__ = ["ClientOptions", "Pace", "check_options", "pace_for"]

_SERVER: Final = Limits()


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """How the client behaves; every buffer is bounded. Times in seconds.

    Pacing: ``requests_per_second``, ``burst`` and ``max_in_flight`` left as None follow what the
    server announced in ``initialize`` (``rateLimits``: 90% of its rate, half its burst and half
    its in-flight limit, so a client alone on its connection is not refused; no pacing when the
    server has no rate limit), and before that, or from a server that announces none, the same
    share of the documented default (``Limits``: 100 requests a second, bursts of 200, 256 in
    flight). A value given is used as it is. A refusal (``rejected`` with ``retryAfterMs``) is
    waited out all the same."""

    client_name: str = "sessionloop-client"
    call_timeout: float = 30.0  # each call's default timeout (wait_for_turn adds its own wait)
    connect_timeout: float = 30.0  # how long connect() keeps trying before ConnectFailed
    open_timeout: float = 10.0  # one attempt's TCP + WebSocket handshake
    reconnect: bool = True
    #: backoff between attempts to reconnect: websockets' exponential backoff with these bounds
    reconnect_initial: float = 1.0  # a random delay up to this before the first attempt
    reconnect_min: float = 0.5
    reconnect_max: float = 30.0
    requests_per_second: float | None = None
    burst: int | None = None
    max_in_flight: int | None = None
    max_notifications: int = 10_000
    max_watch_buffer: int = 10_000
    resume_window: int = 1024  # see sessionloop.client.stream
    max_frame_bytes: int = 64 * 1024 * 1024  # the server's default frame limit: a snapshot can be big
    honour_rejected: bool = True  # send(): a rejected receipt is sent again after retryAfterMs
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0



#: the share of the server's limits the client keeps to when it sets its own pace from them
RATE_SHARE: Final = 0.9


@dataclass(frozen=True, slots=True)
class Pace:
    """The pace a client keeps: ``requests_per_second`` None means no pacing."""

    requests_per_second: float | None
    burst: int
    max_in_flight: int


def pace_for(o: ClientOptions, announced: RateLimits | None) -> Pace:
    """The pace from the options, and for those left None from the server's announced limits
    (else the documented default's): see :class:`ClientOptions`."""
    if announced is None:
        announced = RateLimits(requests_per_second=_SERVER.requests_per_second, burst=_SERVER.burst,
                               max_in_flight=_SERVER.max_in_flight)
    rate = o.requests_per_second
    if rate is None and announced.requests_per_second is not None:
        rate = announced.requests_per_second * RATE_SHARE
    burst = o.burst if o.burst is not None else max(1, announced.burst // 2)
    in_flight = o.max_in_flight if o.max_in_flight is not None else max(1, announced.max_in_flight // 2)
    return Pace(rate, burst, in_flight)


def check_options(o: ClientOptions) -> None:
    """Every option within sense, or InvalidArguments naming it."""
    positive = {"call_timeout": o.call_timeout, "connect_timeout": o.connect_timeout, "open_timeout": o.open_timeout,
                "reconnect_max": o.reconnect_max}
    if o.requests_per_second is not None:
        positive["requests_per_second"] = o.requests_per_second
    counts = {"max_notifications": o.max_notifications, "max_watch_buffer": o.max_watch_buffer,
              "resume_window": o.resume_window, "max_frame_bytes": o.max_frame_bytes}
    counts.update({name: value for name, value in (("burst", o.burst), ("max_in_flight", o.max_in_flight))
                   if value is not None})
    for name, value in positive.items():
        if not value > 0:
            raise InvalidArguments(f"{name} must be above 0, not {value!r}")
    for name, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidArguments(f"{name} must be a whole number of at least 1, not {count!r}")
    if not 0 <= o.reconnect_min <= o.reconnect_max or o.reconnect_initial < 0:
        raise InvalidArguments("reconnect delays must be 0 <= reconnect_min <= reconnect_max, reconnect_initial >= 0")


