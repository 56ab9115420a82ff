"""The errors of :mod:`sessionloop.client`: one tree, each leaf with structured attributes.

An error frame from the server becomes an :class:`RpcFailed` subclass chosen by its
``error.data.code`` (an application error) or its JSON-RPC name (``invalidParams``, ...), so a bot
catches what it handles (``except Conflict``) and reads the rest from attributes, never from a
message::

    ClientError                     code: str, data: dict (the shape of every sessionloop error)
    ├── ConnectFailed               nothing answered at the URL within the connect timeout
    ├── TokenRefused                HTTP 401/403 before the upgrade: retrying will not help
    ├── ConnectionLost              the connection ended under a call whose outcome is unknown
    ├── ClientClosed                the client was closed (by its owner) before the call ended
    ├── CallTimeout                 the call did not end within its timeout (also a TimeoutError)
    ├── InvalidArguments            the params do not fit the method's schema: nothing was sent
    └── RpcFailed                   method, rpc_code, code, message, data, retry_after_ms
        ├── Rejected                back-pressure (rate, in flight): retry after retry_after_ms
        ├── Unavailable             the worker running the session is unreachable: retry after it
        ├── NotFound  Forbidden  Conflict  Unsupported  TooLarge
        ├── ApprovalSettled  HashMismatch  ExpectedTurnMismatch
        ├── StorageUnavailable      outcome: "not-written" | "unknown", retry_after_ms
        ├── CursorExpired           oldest_cursor: the feed's retention passed the cursor
        └── InvalidParams  InvalidRequest  MethodNotFound  ParseError  InternalError

``code`` is the business code for application errors (``"conflict"``), else the JSON-RPC name
(``"invalidParams"``): the same meaning as ``RpcError.code`` on the server.
"""

from __future__ import annotations

from typing import Any, Final

from sessionloop.protocol.errors import (
    APPLICATION_ERROR,
    APPROVAL_SETTLED,
    CONFLICT,
    CURSOR_EXPIRED,
    EXPECTED_TURN_MISMATCH,
    FORBIDDEN,
    HASH_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    NOT_FOUND,
    PARSE_ERROR,
    REJECTED,
    RPC_ERROR_CODES,
    STORAGE_UNAVAILABLE,
    TOO_LARGE,
    UNAVAILABLE,
    UNSUPPORTED,
)

__all__ = [
    "ApprovalSettled",
    "CallTimeout",
    "ClientClosed",
    "ClientError",
    "Conflict",
    "ConnectFailed",
    "CursorExpired",
    "ConnectionLost",
    "ExpectedTurnMismatch",
    "Forbidden",
    "HashMismatch",
    "InternalError",
    "InvalidArguments",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "NotFound",
    "ParseError",
    "Rejected",
    "RpcFailed",
    "StorageUnavailable",
    "TokenRefused",
    "TooLarge",
    "Unavailable",
    "Unsupported",
    "error_from_frame",
]

_RPC_NAMES: Final[dict[int, str]] = {number: name for name, number in RPC_ERROR_CODES.items()}


class ClientError(Exception):
    """Root of the client's errors: ``str(e)`` is one line naming what went wrong."""

    code: str = "client"

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = data


class ConnectFailed(ClientError):
    code = "connect-failed"


class TokenRefused(ClientError):
    code = "token-refused"


class ConnectionLost(ClientError):
    """The connection ended while a call that is not safe to repeat was in flight: whether the
    server carried it out is unknown (repeat it only if that is harmless)."""

    code = "connection-lost"


class ClientClosed(ClientError):
    code = "client-closed"


class CallTimeout(ClientError, TimeoutError):
    code = "timeout"


class InvalidArguments(ClientError):
    """The arguments do not fit the method's params schema; the message names the field."""

    code = "invalid-arguments"


class RpcFailed(ClientError):
    """An error frame. ``rpc_code``: the JSON-RPC number; ``code``: ``error.data.code`` for an
    application error, else the JSON-RPC name; ``data``: ``error.data`` as sent (``{}`` when
    absent); ``retry_after_ms``: ``error.data.retryAfterMs`` when the server gave one."""

    code = "rpc"

    def __init__(self, method: str, rpc_code: int, message: str, data: dict[str, Any]) -> None:
        business = data.get("code")
        code = business if isinstance(business, str) else _RPC_NAMES.get(rpc_code, "rpc")
        super().__init__(f"{method}: {message} ({code})", **data)
        self.method = method
        self.rpc_code = rpc_code
        self.code = code
        self.message = message
        retry = data.get("retryAfterMs")
        self.retry_after_ms: int | None = retry if isinstance(retry, int) and not isinstance(retry, bool) else None


class Rejected(RpcFailed):
    """Back-pressure: nothing was done; the same request may be sent again after ``retry_after_ms``."""


class Unavailable(RpcFailed):
    """The worker process that runs the session cannot be reached now (``serve --workers``):
    nothing was done; the same request may be sent again after ``retry_after_ms``."""


class NotFound(RpcFailed):
    pass


class Forbidden(RpcFailed):
    pass


class Conflict(RpcFailed):
    """E.g. an idempotency key used before for a different message: a new message needs a new key."""


class Unsupported(RpcFailed):
    pass


class TooLarge(RpcFailed):
    pass


class ApprovalSettled(RpcFailed):
    pass


class HashMismatch(RpcFailed):
    pass


class ExpectedTurnMismatch(RpcFailed):
    pass


class StorageUnavailable(RpcFailed):
    """The store could not take the write. ``outcome``: ``"not-written"`` (retry freely) or
    ``"unknown"`` (retry with the same idempotency key)."""

    @property
    def outcome(self) -> str | None:
        value = self.data.get("outcome")
        return value if isinstance(value, str) else None


class CursorExpired(RpcFailed):
    """A cursor (``watch(after=...)``, ``list_events(after=...)``) older than the event feed's
    retention (7 days, 10,000 events per app): events after it are gone, so the server refused
    rather than leave a silent gap. ``oldest_cursor`` resumes from what is left (knowing that
    something was missed)."""

    @property
    def oldest_cursor(self) -> str | None:
        value = self.data.get("oldestCursor")
        return value if isinstance(value, str) else None


class InvalidParams(RpcFailed):
    pass


class InvalidRequest(RpcFailed):
    pass


class MethodNotFound(RpcFailed):
    pass


class ParseError(RpcFailed):
    pass


class InternalError(RpcFailed):
    pass


_BY_BUSINESS: Final[dict[str, type[RpcFailed]]] = {
    REJECTED: Rejected,
    UNAVAILABLE: Unavailable,
    NOT_FOUND: NotFound,
    FORBIDDEN: Forbidden,
    CONFLICT: Conflict,
    UNSUPPORTED: Unsupported,
    TOO_LARGE: TooLarge,
    APPROVAL_SETTLED: ApprovalSettled,
    HASH_MISMATCH: HashMismatch,
    EXPECTED_TURN_MISMATCH: ExpectedTurnMismatch,
    STORAGE_UNAVAILABLE: StorageUnavailable,
    CURSOR_EXPIRED: CursorExpired,
}
_BY_RPC: Final[dict[int, type[RpcFailed]]] = {
    INVALID_PARAMS: InvalidParams,
    INVALID_REQUEST: InvalidRequest,
    METHOD_NOT_FOUND: MethodNotFound,
    PARSE_ERROR: ParseError,
    INTERNAL_ERROR: InternalError,
}


def error_from_frame(method: str, rpc_code: int, message: str, data: Any) -> RpcFailed:
    """The typed exception of an error frame (``data`` is ``error.data``, any JSON)."""
    fields = data if isinstance(data, dict) else ({} if data is None else {"value": data})
    business = fields.get("code")
    cls: type[RpcFailed] = RpcFailed
    if rpc_code == APPLICATION_ERROR and isinstance(business, str):
        cls = _BY_BUSINESS.get(business, RpcFailed)
    else:
        cls = _BY_RPC.get(rpc_code, RpcFailed)
    return cls(method, rpc_code, message, fields)
