"""JSON-RPC 2.0 framing for the session protocol: decode requests, build reply frames.

Decoding is two-stage, as msgspec recommends for envelopes: :func:`decode_request` reads only the
envelope (``params`` kept as :class:`msgspec.Raw`, unparsed), and :func:`decode_params` decodes
the raw params with the method's own decoder once the method is known. Neither raises on peer
input: every failure comes back as a :class:`BadFrame` or an :class:`~protocol.errors.RpcError`
value that becomes one error frame.

How each kind of bad input is answered (docs/protocol.md, Errors; the msgspec and websockets
failure modes each gets its row):

=========================================  =====================  ==========================
input                                      reply                  id
=========================================  =====================  ==========================
larger than the application limit          invalidRequest         cheaply found, else null
  ("request too large")
not UTF-8 / not JSON / NaN / trailing junk parseError             null
nested deeper than MAX_NESTING (512)       invalidRequest         cheaply found, else null
  levels, measured before parsing
a JSON array (batches are not supported)   invalidRequest         null
any other non-object JSON value            invalidRequest         null
no ``id`` (a client notification: the      invalidRequest         null
  protocol says clients never send them)
``id`` not a string or an integer          invalidRequest         null
``jsonrpc`` missing or not ``"2.0"``       invalidRequest         the id
``method`` not a string                    invalidRequest         the id
``params`` present but not an object       invalidRequest         the id
params not matching the method's schema    invalidParams          the id
=========================================  =====================  ==========================

Catch order matters: ``ValidationError`` is a subclass of ``DecodeError``, so it is caught first
(else every invalid request looks like a parse error). Unknown keys are accepted everywhere (an
object schema never refuses extra keys). Encoders and decoders are built once, at import.

Human text: a field may hold a *text object*, a ``str`` subclass that the application renders in
its language (text is rendered to a plain string before it is sent). The frame functions take the ``encoder``
whose ``enc_hook`` renders them (the gateway builds one); the shared encoder writes any ``str``
subclass as the plain string it is, so a text object never makes a frame fail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from sessionloop.protocol.errors import ProtocolMisuse, RpcError
from sessionloop.protocol.limits import MAX_NESTING
from sessionloop.protocol.nesting import nests_deeper

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "MAX_ID_CHARS",
    "BadFrame",
    "Request",
    "RequestId",
    "decode_params",
    "decode_request",
    "encode_json",
    "error_frame",
    "is_too_large",
    "notification_frame",
    "peek_id",
    "render_validation_error",
    "request_frame",
    "result_frame",
]

RequestId = str | int

#: The application's frame limit, kept below the transport's ``max_size`` so an oversized request
#: gets an ``invalidRequest`` reply instead of a bare close 1009 (RELIABILITY, websockets). 24 MiB
#: leaves room for 20 MB of attachments base64-encoded (the attachment limit).
DEFAULT_MAX_FRAME_BYTES: Final = 24 * 1024 * 1024

#: A peer could choose an id of any length and have it echoed in every reply; bound it.
MAX_ID_CHARS: Final = 1024

_NO_PARAMS: Final = msgspec.Raw()
_EMPTY_OBJECT: Final = b"{}"


class _Envelope(msgspec.Struct):
    """Everything typed ``Any`` so that a wrong type is *our* error message, not msgspec's."""

    jsonrpc: Any = msgspec.UNSET
    id: Any = msgspec.UNSET
    method: Any = msgspec.UNSET
    params: msgspec.Raw = _NO_PARAMS


_ENVELOPE_DECODER: Final = msgspec.json.Decoder(_Envelope)
_RAW_DECODER: Final = msgspec.json.Decoder(msgspec.Raw)
_ANY_DECODER: Final = msgspec.json.Decoder()


def plain_str(obj: Any) -> Any:
    """The msgspec ``enc_hook`` for ``str`` subclasses: their plain string; other types are refused."""
    if isinstance(obj, str):
        return str.__str__(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_ENCODER: Final = msgspec.json.Encoder(enc_hook=plain_str)

# A cheap look for the id in the head of a frame we will not parse (too large or too deep): a key
# "id" right after "{" or ",", with a string or integer value. It can be fooled by a string
# value that contains `,"id":` (then the echoed id is wrong, which the client tolerates as "no
# id"); it never reads more than the first 200 bytes.
_HEAD_BYTES: Final = 200
_HEAD_ID_TEXT: Final = re.compile(r'[{,]\s*"id"\s*:\s*("(?:[^"\\]|\\.){0,160}"|-?[0-9]{1,19})\s*[,}]')
_HEAD_ID_BYTES: Final = re.compile(_HEAD_ID_TEXT.pattern.encode())


@dataclass(frozen=True, slots=True)
class Request:
    """A well-formed JSON-RPC request envelope; ``params`` is still raw JSON."""

    id: RequestId
    method: str
    params: msgspec.Raw


@dataclass(frozen=True, slots=True)
class BadFrame:
    """A frame that cannot be carried out; reply ``error`` with ``id`` (``None`` -> ``null``)."""

    id: RequestId | None
    error: RpcError


# --- decoding -------------------------------------------------------------------------------------


def is_too_large(data: str | bytes, max_bytes: int) -> bool:
    """Whether ``data`` is over ``max_bytes`` on the wire (UTF-8 bytes for text frames).

    A text frame is only encoded to count its bytes when its length in characters leaves the
    answer open (between ``max_bytes / 4`` and ``max_bytes`` characters).
    """
    if not isinstance(data, str) or len(data) > max_bytes:
        return len(data) > max_bytes
    if len(data) * 4 <= max_bytes:
        return False
    return len(data.encode("utf-8", "surrogatepass")) > max_bytes


def _valid_id(value: object) -> RequestId | None:
    # bool is an int subclass, and JSON true is not an id.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and len(value) <= MAX_ID_CHARS:
        return value
    return None


def peek_id(data: str | bytes) -> RequestId | None:
    """The request id if it is visible in the first 200 bytes of ``data``, else ``None``."""
    head = data[:_HEAD_BYTES]
    if isinstance(head, str):
        match = _HEAD_ID_TEXT.search(head)
        token: str | bytes | None = match.group(1) if match else None
    else:
        found = _HEAD_ID_BYTES.search(bytes(head))
        token = found.group(1) if found else None
    if token is None:
        return None
    try:
        return _valid_id(_ANY_DECODER.decode(token))
    except (msgspec.DecodeError, UnicodeError, RecursionError):
        return None


def _not_an_object(data: str | bytes) -> BadFrame:
    """The top level decoded to something other than an object: batch, scalar, or bad JSON."""
    try:
        raw = _RAW_DECODER.decode(data)
    except (msgspec.DecodeError, UnicodeError):
        return BadFrame(None, RpcError.parse_error())
    except RecursionError:
        return BadFrame(None, _too_deep())
    if memoryview(raw)[:1].tobytes() == b"[":
        return BadFrame(None, RpcError.invalid_request("batch requests are not supported"))
    return BadFrame(None, RpcError.invalid_request("request must be a JSON object"))


def decode_request(data: str | bytes, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Request | BadFrame:
    """Decode and check a request envelope; never raises on any input."""
    if is_too_large(data, max_bytes):
        return BadFrame(peek_id(data), RpcError.invalid_request("request too large"))
    if nests_deeper(data, MAX_NESTING):  # before msgspec, whose own limit depends on the Python
        return BadFrame(peek_id(data), _too_deep())
    try:
        env = _ENVELOPE_DECODER.decode(data)
    except msgspec.ValidationError as e:  # before DecodeError: it is a subclass
        if str(e).startswith("Expected `object`"):
            return _not_an_object(data)
        # e.g. "Number out of range - at `$.id`": the envelope itself cannot be trusted
        return BadFrame(
            None, RpcError.invalid_request(f"invalid request: {render_validation_error(e, 'request')}")
        )
    except (msgspec.DecodeError, UnicodeError):
        return BadFrame(None, RpcError.parse_error())
    except RecursionError:  # not after the check above; kept total
        return BadFrame(peek_id(data), _too_deep())
    return _check_envelope(env)


def _too_deep() -> RpcError:
    return RpcError.invalid_request(f"request is nested too deeply: more than {MAX_NESTING} levels")


def _check_envelope(env: _Envelope) -> Request | BadFrame:
    if env.id is msgspec.UNSET:
        return BadFrame(
            None, RpcError.invalid_request("request has no id (clients do not send notifications)")
        )
    request_id = _valid_id(env.id)
    if request_id is None:
        return BadFrame(None, RpcError.invalid_request("id must be a string or an integer"))
    if env.jsonrpc != "2.0":
        return BadFrame(request_id, RpcError.invalid_request('jsonrpc must be "2.0"'))
    if not isinstance(env.method, str):
        return BadFrame(request_id, RpcError.invalid_request("method must be a string"))
    if env.params and memoryview(env.params)[:1].tobytes() != b"{":
        return BadFrame(request_id, RpcError.invalid_request("params must be an object"))
    return Request(request_id, env.method, env.params)


def decode_params(decoder: msgspec.json.Decoder[Any], raw: msgspec.Raw) -> Any:
    """Decode a request's raw params with its method's decoder.

    Returns the params Struct, or an :class:`RpcError` (invalidParams naming the field) as a
    value; never raises on peer input. Absent params decode as ``{}`` (no params and ``{}`` mean the same).
    """
    try:
        return decoder.decode(raw if raw else _EMPTY_OBJECT)
    except msgspec.ValidationError as e:  # before DecodeError: it is a subclass
        return RpcError.invalid_params(render_validation_error(e))
    except (msgspec.DecodeError, UnicodeError):  # cannot happen after stage one; kept total
        return RpcError.invalid_params("params: not valid JSON")
    except RecursionError:
        return RpcError.invalid_params("params: nested too deeply")


def render_validation_error(error: msgspec.ValidationError, root: str = "params") -> str:
    """``Expected `str`, got `int` - at `$.sessionId``` -> ``params.sessionId: Expected `str`, got `int```.

    A missing field is named in the path too: ``params.sessionId: missing required field``.
    """
    text = str(error)
    message, sep, path = text.rpartition(" - at `")
    if sep:
        where = root + path.rstrip("`")[1:]
    else:
        message, where = text, root
    missing = re.fullmatch(r"Object missing required field `(.+)`", message)
    if missing:
        where, message = f"{where}.{missing.group(1)}", "missing required field"
    return f"{where}: {message}"


# --- encoding -------------------------------------------------------------------------------------


class _ResultFrame(msgspec.Struct):
    jsonrpc: str
    id: RequestId
    result: Any


class _ErrorBody(msgspec.Struct, omit_defaults=True):
    code: int
    message: str
    data: dict[str, Any] | None = None


class _ErrorFrame(msgspec.Struct):
    jsonrpc: str
    id: RequestId | None
    error: _ErrorBody


class _RequestFrame(msgspec.Struct):
    jsonrpc: str
    id: RequestId
    method: str
    params: Any


class _NotificationFrame(msgspec.Struct):
    jsonrpc: str
    method: str
    params: Any


def encode_json(value: Any, encoder: msgspec.json.Encoder | None = None) -> str:
    """Encode with ``encoder`` (default: the shared one); raises :class:`ProtocolMisuse` for
    unencodable values."""
    try:
        return (encoder or _ENCODER).encode(value).decode("utf-8")
    except (TypeError, ValueError, OverflowError) as e:  # UnicodeEncodeError is a ValueError
        raise ProtocolMisuse(f"cannot encode a frame: {e}") from e


def request_frame(request_id: RequestId, method: str, params: Any = None,
                  encoder: msgspec.json.Encoder | None = None) -> str:
    """``{"jsonrpc":"2.0","id":…,"method":…,"params":{…}}``, the frame a client sends; ``params`` is a
    params Struct or a dict with the wire's camelCase keys, ``None`` for ``{}``."""
    return encode_json(_RequestFrame("2.0", request_id, method, {} if params is None else params), encoder)


def result_frame(request_id: RequestId, result: msgspec.Struct, encoder: msgspec.json.Encoder | None = None) -> str:
    """``{"jsonrpc":"2.0","id":…,"result":{…}}``; ``result`` must encode to a JSON object."""
    return encode_json(_ResultFrame("2.0", request_id, result), encoder)


def error_frame(request_id: RequestId | None, error: RpcError, encoder: msgspec.json.Encoder | None = None) -> str:
    """``{"jsonrpc":"2.0","id":…|null,"error":{code,message,data?}}``."""
    body = _ErrorBody(error.rpc_code, error.message, dict(error.data) if error.data else None)
    return encode_json(_ErrorFrame("2.0", request_id, body), encoder)


def notification_frame(method: str, params: msgspec.Struct, encoder: msgspec.json.Encoder | None = None) -> str:
    """``{"jsonrpc":"2.0","method":…,"params":{…}}``: encode once, send to every subscriber."""
    return encode_json(_NotificationFrame("2.0", method, params), encoder)
