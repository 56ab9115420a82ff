"""The options of :class:`~sessionloop.client.aio.AsyncClient`, each bounded (checked on construction)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sessionloop.client.errors import InvalidArguments
from sessionloop.protocol.connection import Limits

__all__ = ["ClientOptions", "check_options"]

_SERVER: Final = Limits()


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """How the client behaves; every buffer is bounded. Times in seconds.

    The pacing bucket defaults to below the server's per-connection bucket (``Limits``: 100
    requests a second, bursts of 200), so a client alone on its connection is not refused; a
    refusal (``rejected`` with ``retryAfterMs``) is waited out all the same."""

    client_name: str = "sessionloop-client"
    call_timeout: float = 30.0  # each call's default timeout (wait_for_turn adds its own wait)
    connect_timeout: float = 30.0  # how long connect() keeps trying before ConnectFailed
    open_timeout: float = 10.0  # one attempt's TCP + WebSocket handshake
    reconnect: bool = True
    #: backoff between attempts to reconnect: websockets' exponential backoff with these bounds
    reconnect_initial: float = 1.0  # a random delay up to this before the first attempt
    reconnect_min: float = 0.5
    reconnect_max: float = 30.0
    requests_per_second: float = (_SERVER.requests_per_second or 100.0) * 0.9
    burst: int = _SERVER.burst // 2
    max_in_flight: int = _SERVER.max_in_flight // 2
    max_notifications: int = 10_000
    max_watch_buffer: int = 10_000
    resume_window: int = 1024  # see sessionloop.client.stream
    max_frame_bytes: int = 64 * 1024 * 1024  # the server's default frame limit: a snapshot can be big
    honour_rejected: bool = True  # send(): a rejected receipt is sent again after retryAfterMs
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0



def check_options(o: ClientOptions) -> None:
    """Every option within sense, or InvalidArguments naming it."""
    positive = {"call_timeout": o.call_timeout, "connect_timeout": o.connect_timeout, "open_timeout": o.open_timeout,
                "requests_per_second": o.requests_per_second, "reconnect_max": o.reconnect_max}
    counts = {"burst": o.burst, "max_in_flight": o.max_in_flight, "max_notifications": o.max_notifications,
              "max_watch_buffer": o.max_watch_buffer, "resume_window": o.resume_window,
              "max_frame_bytes": o.max_frame_bytes}
    for name, value in positive.items():
        if not value > 0:
            raise InvalidArguments(f"{name} must be above 0, not {value!r}")
    for name, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidArguments(f"{name} must be a whole number of at least 1, not {count!r}")
    if not 0 <= o.reconnect_min <= o.reconnect_max or o.reconnect_initial < 0:
        raise InvalidArguments("reconnect delays must be 0 <= reconnect_min <= reconnect_max, reconnect_initial >= 0")


