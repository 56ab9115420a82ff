"""Error codes of the session protocol and the exceptions that carry them.

Two kinds of failure meet here (STYLE rule 4, after h11):

* **the peer did something wrong** -> an :class:`RpcError` is raised by a handler (or built by the
  frame decoder) and becomes an error frame ``{jsonrpc, id, error: {code, message, data?}}``;
  nothing about it ever escapes ``protocol/`` as an exception on peer input;
* **we misused our own API** (answering a request id that is not in flight, pushing a notification
  that does not exist, ...) -> :class:`ProtocolMisuse` is raised at once, because it is a bug.

``protocol/`` imports nothing of ours outside ``protocol/``, so its errors have their own root,
shaped like the root of the rest of sessionloop (``SessionloopError``: a string ``code`` and a
``data`` dict)::

    ProtocolError                       code: str, data: dict
    ├── RpcError                        rpc_code: int (JSON-RPC), code: business code, message
    └── ProtocolMisuse                  our own code misused protocol/

Errors raised elsewhere (the event store's, the actors') reach a client through
:func:`from_domain_error`, which reads them through the :class:`DomainError` protocol: any
exception whose ``code`` is a string and whose ``data`` is a mapping, whatever class it is. That
is how a ``WrongExpectedVersion`` (``code == "conflict"``) becomes a ``conflict`` application error
without ``protocol/`` importing the store.

Naming: ``code`` is a *string* business code in both trees, so on :class:`RpcError` the string
``code`` is the business code (``error.data.code`` for application errors) and the JSON-RPC
number lives in ``rpc_code``. That keeps one meaning per attribute name across the code base and
lets :func:`from_domain_error` map errors by their ``code`` without parsing messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol, TypeGuard

__all__ = [
    "APPLICATION_ERROR",
    "APPROVAL_SETTLED",
    "BUSINESS_CODES",
    "CONFLICT",
    "CURSOR_EXPIRED",
    "DomainError",
    "EXPECTED_TURN_MISMATCH",
    "FORBIDDEN",
    "HASH_MISMATCH",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "NOT_FOUND",
    "PARSE_ERROR",
    "REJECTED",
    "RPC_ERROR_CODES",
    "STORAGE_UNAVAILABLE",
    "TOO_LARGE",
    "UNSUPPORTED",
    "ProtocolError",
    "ProtocolMisuse",
    "RpcError",
    "from_domain_error",
    "is_domain_error",
]

# --- JSON-RPC numeric codes (docs/protocol.md, Errors) ------------------------------------------

PARSE_ERROR: Final = -32700  # the frame is not JSON
INVALID_REQUEST: Final = -32600  # not a JSON-RPC 2.0 request; before/duplicate handshake
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602  # params do not match the method's schema
INTERNAL_ERROR: Final = -32603  # the server failed (e.g. a write failed)
APPLICATION_ERROR: Final = -32000  # business error; the reason is in error.data.code

RPC_ERROR_CODES: Final[dict[str, int]] = {
    "parseError": PARSE_ERROR,
    "invalidRequest": INVALID_REQUEST,
    "methodNotFound": METHOD_NOT_FOUND,
    "invalidParams": INVALID_PARAMS,
    "internalError": INTERNAL_ERROR,
    "applicationError": APPLICATION_ERROR,
}

# --- business codes for error.data.code (docs/protocol.md, Error codes) ---------------------------

NOT_FOUND: Final = "not-found"  # session, approval, task ... does not exist
FORBIDDEN: Final = "forbidden"  # this connection's identity may not do this
CONFLICT: Final = "conflict"
APPROVAL_SETTLED: Final = "approval-settled"  # the approval was already settled (first answer wins)
HASH_MISMATCH: Final = "hash-mismatch"  # the answer's contentHash does not match
EXPECTED_TURN_MISMATCH: Final = "expected-turn-mismatch"  # turn/abort named a turn that is not running
UNSUPPORTED: Final = "unsupported"  # protocol version mismatch, or a needed service is absent
# Beyond the protocol's original set: back-pressure (rate limit, too many requests in flight) and size limits.
REJECTED: Final = "rejected"
TOO_LARGE: Final = "too-large"
# The event store could not take the write (disk full, I/O error); ``data.retryAfterMs`` says
# when to retry and ``data.outcome`` what became of it: "not-written" (checked: a retry writes
# it once) or "unknown" (retry with the same idempotency key: the original receipt, or one write).
STORAGE_UNAVAILABLE: Final = "storage-unavailable"
# The worker process that runs the session is not reachable (``serve --workers``: restarting, or
# not started yet); ``data.retryAfterMs`` says when to retry. Nothing was done, unless ``data.outcome``
# is "unknown" (the link between the workers broke while the request was on its way): then retry with
# the same idempotency key.
UNAVAILABLE: Final = "unavailable"
# A cursor (``loop/watch``, ``loop/listEvents``, ``GET /api/loop/events``) older than the feed's
# retention (7 days, 10,000 events per app): events after it are gone, so nothing is answered
# rather than a silent gap; ``data.oldestCursor`` is the oldest cursor that resumes without one.
CURSOR_EXPIRED: Final = "cursor-expired"

BUSINESS_CODES: Final[frozenset[str]] = frozenset(
    {
        NOT_FOUND,
        FORBIDDEN,
        CONFLICT,
        APPROVAL_SETTLED,
        HASH_MISMATCH,
        EXPECTED_TURN_MISMATCH,
        UNSUPPORTED,
        REJECTED,
        TOO_LARGE,
        STORAGE_UNAVAILABLE,
        UNAVAILABLE,
        CURSOR_EXPIRED,
    }
)

# The string ``code`` given to RpcErrors that are not application errors, so every member of the
# tree has a meaningful ``code`` (used by metrics: frames counted by error code).
_JSONRPC_NAMES: Final[dict[int, str]] = {value: key for key, value in RPC_ERROR_CODES.items()}

# A peer can make us echo its own text in a message (a method name, an enum value); keep replies
# small whatever it sends.
MAX_MESSAGE_CHARS: Final = 500


def _clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ProtocolError(Exception):
    """Root of the errors ``protocol/`` raises: a string ``code`` and a ``data`` dict, as every error
    sessionloop raises on purpose has (so a :class:`ProtocolError` is a :class:`DomainError` too)."""

    code: str = "protocol"

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.data = data


class RpcError(ProtocolError):
    """An error reply: raise it from a handler and the connection turns it into an error frame.

    ``rpc_code`` is the JSON-RPC number, ``message`` the human-readable text, ``data`` the
    ``error.data`` object (for application errors it holds ``code`` plus any extra fields, e.g.
    ``retryAfterMs``). ``code`` is the business code for application errors, else the JSON-RPC
    name (``"invalidParams"``, ...). Build them with the classmethods rather than by number.
    """

    def __init__(self, rpc_code: int, message: str, **data: Any) -> None:
        message = _clip(message)
        super().__init__(message, **data)
        self.rpc_code = rpc_code
        self.message = message
        business = data.get("code")
        self.code = business if isinstance(business, str) else _JSONRPC_NAMES.get(rpc_code, "rpc")

    def __repr__(self) -> str:
        return f"RpcError({self.rpc_code}, {self.message!r}, data={self.data!r})"

    # --- JSON-RPC level ---------------------------------------------------------------------

    @classmethod
    def parse_error(cls, message: str = "frame is not valid JSON") -> RpcError:
        return cls(PARSE_ERROR, message)

    @classmethod
    def invalid_request(cls, message: str) -> RpcError:
        return cls(INVALID_REQUEST, message)

    @classmethod
    def method_not_found(cls, method: str) -> RpcError:
        return cls(METHOD_NOT_FOUND, f"method not found: {_clip(method, 100)}")

    @classmethod
    def invalid_params(cls, message: str) -> RpcError:
        """``message`` should name the field, e.g. ``"params.sessionId: Expected `str`"``."""
        return cls(INVALID_PARAMS, message)

    @classmethod
    def internal_error(cls, message: str = "internal error") -> RpcError:
        return cls(INTERNAL_ERROR, message)

    # --- application errors (error.data.code) -----------------------------------------------

    @classmethod
    def application(cls, code: str, message: str, **extra: Any) -> RpcError:
        """An ``applicationError`` whose ``error.data`` is ``{code, **extra}``."""
        if code not in BUSINESS_CODES:
            raise ProtocolMisuse(f"unknown business error code {code!r}", code=code)
        return cls(APPLICATION_ERROR, message, code=code, **extra)

    @classmethod
    def not_found(cls, message: str, **extra: Any) -> RpcError:
        return cls.application(NOT_FOUND, message, **extra)

    @classmethod
    def forbidden(cls, message: str, **extra: Any) -> RpcError:
        return cls.application(FORBIDDEN, message, **extra)

    @classmethod
    def conflict(cls, message: str, **extra: Any) -> RpcError:
        return cls.application(CONFLICT, message, **extra)

    @classmethod
    def approval_settled(cls, message: str = "the approval is already settled", **extra: Any) -> RpcError:
        return cls.application(APPROVAL_SETTLED, message, **extra)

    @classmethod
    def hash_mismatch(
        cls, message: str = "contentHash does not match the approval", **extra: Any
    ) -> RpcError:
        return cls.application(HASH_MISMATCH, message, **extra)

    @classmethod
    def expected_turn_mismatch(cls, message: str, **extra: Any) -> RpcError:
        return cls.application(EXPECTED_TURN_MISMATCH, message, **extra)

    @classmethod
    def unsupported(cls, message: str, **extra: Any) -> RpcError:
        return cls.application(UNSUPPORTED, message, **extra)

    @classmethod
    def rejected(cls, message: str, retry_after_ms: int, **extra: Any) -> RpcError:
        """Back-pressure (the per-connection rate and in-flight limits): the client should retry after
        ``retry_after_ms``."""
        return cls.application(REJECTED, message, retryAfterMs=max(0, int(retry_after_ms)), **extra)

    @classmethod
    def unavailable(cls, message: str, retry_after_ms: int, **extra: Any) -> RpcError:
        """The worker that runs the session cannot be reached now: retry after ``retry_after_ms``."""
        return cls.application(UNAVAILABLE, message, retryAfterMs=max(0, int(retry_after_ms)), **extra)

    @classmethod
    def too_large(cls, message: str, **extra: Any) -> RpcError:
        return cls.application(TOO_LARGE, message, **extra)

    # --- wire shape ----------------------------------------------------------------------------

    def error_object(self) -> dict[str, Any]:
        """The ``error`` member of the frame (``data`` omitted when empty)."""
        body: dict[str, Any] = {"code": self.rpc_code, "message": self.message}
        if self.data:
            body["data"] = self.data
        return body


class ProtocolMisuse(ProtocolError):
    """Our own code used protocol/ wrongly (a bug, never peer input): raised, not replied."""

    code = "protocol-misuse"


class DomainError(Protocol):
    """What :func:`from_domain_error` reads of an error raised outside ``protocol/``.

    ``code`` names the failure (a business code such as ``"conflict"`` is answered as that
    application error), ``data`` holds its structured fields (those that are JSON scalars and do not
    start with ``_`` go out in ``error.data``: a retry hint ``retryAfterMs``, an ``outcome``, ...),
    ``args[0]`` is the message as raised. The errors of the event store and of the actors have this
    shape by construction; nothing needs to inherit from this class.
    """

    @property
    def code(self) -> str: ...

    @property
    def data(self) -> Mapping[str, Any]: ...

    @property
    def args(self) -> tuple[Any, ...]: ...


def is_domain_error(error: BaseException) -> TypeGuard[DomainError]:
    """Whether ``error`` is one sessionloop raised on purpose: a string ``code`` and a mapping
    ``data`` (any other exception is a bug, answered ``internalError``)."""
    return isinstance(getattr(error, "code", None), str) and isinstance(getattr(error, "data", None), Mapping)


# Codes of errors raised outside protocol/ that map one-to-one onto a business code; any other
# code is an internal error (its message still goes out: it was written for people).
_DOMAIN_CODE_MAP: Final[dict[str, str]] = {
    "conflict": CONFLICT,
    "not-found": NOT_FOUND,
    "forbidden": FORBIDDEN,
    "approval-settled": APPROVAL_SETTLED,
    "hash-mismatch": HASH_MISMATCH,
    "expected-turn-mismatch": EXPECTED_TURN_MISMATCH,
    "unsupported": UNSUPPORTED,
    "rejected": REJECTED,
    "too-large": TOO_LARGE,
    "storage-unavailable": STORAGE_UNAVAILABLE,
    "unavailable": UNAVAILABLE,
    "cursor-expired": CURSOR_EXPIRED,
}


def from_domain_error(error: BaseException) -> RpcError:
    """Translate an error into the reply a client should get.

    An :class:`RpcError` is returned unchanged. A :class:`DomainError` whose ``code`` is a business
    code becomes that ``applicationError``, keeping the JSON scalar fields of its ``data`` whose
    names do not start with ``_`` (a store that cannot write answers ``storage-unavailable`` with
    ``retryAfterMs`` and ``outcome``); one with any other code is an ``internalError`` with its
    message. Any other exception is a bug: an ``internalError`` naming its type and message.
    """
    if isinstance(error, RpcError):
        return error
    if not is_domain_error(error):
        return RpcError.internal_error(f"{type(error).__name__}: {error}")
    business = _DOMAIN_CODE_MAP.get(error.code)
    # the message as raised (``str(error)`` would copy a text object into a plain string: the
    # application renders its text objects when the frame is encoded, see protocol.frames)
    first = error.args[0] if error.args else None
    message = first if isinstance(first, str) and first else (str(error) or error.code)
    if business is None:
        return RpcError.internal_error(message)
    extra = {
        key: value
        for key, value in error.data.items()
        if key != "code" and isinstance(value, (str, int, float, bool)) and not key.startswith("_")
    }
    return RpcError.application(business, message, **extra)
