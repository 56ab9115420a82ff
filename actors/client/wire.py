"""What the client reads and writes, without I/O: envelopes, decoders built once, params checks,
the Python name of every method and which methods are safe to send again.

Results are decoded two-stage, as the server decodes params (STYLE: msgspec): the envelope with
``result: Raw``, then the method's result Struct from :data:`protocol.registry.METHODS`; a push's
``params`` with the Struct of :data:`protocol.registry.NOTIFICATIONS`.

Params are checked here before anything is sent: a params Struct (or the keyword arguments that
make one) is encoded and decoded again with the server's own decoder, so a value beyond a bound
is refused locally (:class:`~sessionloop.client.errors.InvalidArguments`, naming the field) with
the same rule the server would apply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from sessionloop.client.errors import ClientError, InvalidArguments
from sessionloop.protocol.registry import METHODS, NOTIFICATIONS, MethodSpec

__all__ = [
    "ENVELOPE",
    "OWNER_METHODS",
    "RETRY_SAFE",
    "Envelope",
    "Notification",
    "check_params",
    "decode_push",
    "decode_result",
    "python_name",
]


class ErrorBody(msgspec.Struct, frozen=True):
    code: int
    message: str
    data: Any = None


class Envelope(msgspec.Struct, frozen=True):
    """Any server frame; ``result``/``params`` stay raw until we know which Struct they are."""

    id: int | str | None = None
    method: str | None = None
    params: msgspec.Raw = msgspec.Raw()
    result: msgspec.Raw = msgspec.Raw()
    error: ErrorBody | None = None


ENVELOPE: Final = msgspec.json.Decoder(Envelope)
_RESULTS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    name: msgspec.json.Decoder(spec.result) for name, spec in METHODS.items()
}
_PUSHES: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    name: msgspec.json.Decoder(struct) for name, struct in NOTIFICATIONS.items()
}
_ANY: Final[msgspec.json.Decoder[Any]] = msgspec.json.Decoder()
_ENCODER: Final = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Notification:
    """A push: ``params`` is the Struct registered for ``method`` (plain data for unknown ones).
    After a reconnection the client queues each renewed ``session/subscribe`` snapshot as a
    notification of that method (``params``: the :class:`~protocol.schemas.SubscribeResult`, or the
    :class:`~sessionloop.client.errors.RpcFailed` that refused it, e.g. the session was deleted:
    that subscription ends)."""

    method: str
    params: Any


def decode_result(method: str, raw: msgspec.Raw) -> Any:
    """The method's result Struct (plain data for a method this client does not know)."""
    try:
        return _RESULTS.get(method, _ANY).decode(raw or b"{}")
    except msgspec.DecodeError as e:
        raise ClientError(f"{method}: the server's result is not what this client reads: {e}") from e


def decode_push(method: str, raw: msgspec.Raw) -> Any:
    try:
        return _PUSHES.get(method, _ANY).decode(raw or b"{}")
    except msgspec.DecodeError as e:
        raise ClientError(f"the server sent a {method} this client cannot read: {e}") from e


def check_params(spec: MethodSpec, params: msgspec.Struct | None, fields: dict[str, Any]) -> msgspec.Struct:
    """The params Struct of ``spec``: ``params`` as given, or built from ``fields`` (snake_case
    keyword arguments, nested values as Structs or dicts with either spelling of their keys);
    checked against the method's bounds. Raises :class:`InvalidArguments` naming the field."""
    if params is not None and fields:
        raise InvalidArguments(f"{spec.name}: give a params Struct or keyword arguments, not both")
    if params is None:
        try:
            params = msgspec.convert(_camel(fields), spec.params)
        except msgspec.ValidationError as e:
            raise InvalidArguments(f"{spec.name}: {_field_message(e)}") from None
    elif not isinstance(params, spec.params):
        raise InvalidArguments(f"{spec.name} takes {spec.params.__name__}, not {type(params).__name__}")
    try:
        return spec.decoder.decode(_ENCODER.encode(params))  # type: ignore[no-any-return]
    except msgspec.ValidationError as e:
        raise InvalidArguments(f"{spec.name}: {_field_message(e)}") from None


def _field_message(e: msgspec.ValidationError) -> str:
    # msgspec names the path on the wire ("at `$.initialMessage.text`"): say it as params.<path>
    return re.sub(r"`\$\.?", "`params.", str(e)).replace("`params.`", "`params`")


def _camel(value: Any) -> Any:
    """Keys of dicts (and the top level) in the wire's camelCase; Structs pass as they are."""
    if isinstance(value, dict):
        return {_to_camel(k) if isinstance(k, str) else k: _camel(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_camel(v) for v in value]
    return value


def _to_camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def python_name(method: str) -> str:
    """``"session/config/layer/get"`` -> ``"session_config_layer_get"``,
    ``"session/markSeen"`` -> ``"session_mark_seen"``."""
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), method)
    return snake.replace("/", "_")


#: every method but the handshake and the Session Loop API's (those have methods of their own)
OWNER_METHODS: Final[dict[str, MethodSpec]] = {
    name: spec for name, spec in METHODS.items() if name != "initialize" and not name.startswith("loop/")
}

#: Methods that may be sent again after the connection was lost with the request in flight: they
#: read, or they set a value (a second time changes nothing), or an idempotency key makes the
#: repeat answer the first one (``loop/send``; ``loop/create`` only with ``initialMessage``, see
#: the client). Any other call in flight when the connection drops raises ConnectionLost.
RETRY_SAFE: Final[frozenset[str]] = frozenset({
    "sessions/list", "sessions/watch", "session/rename", "session/archive", "session/unarchive",
    "session/markSeen", "session/config/get", "session/config/update", "session/config/layers",
    "session/config/layer/get", "session/config/layer/update", "session/config/overrides",
    "session/subscribe", "session/unsubscribe", "session/history", "background/list", "background/watch",
    "background/output", "presence/update", "approval/grants/list",
    "loop/send", "loop/waitForTurn", "loop/listEvents", "loop/watch",
})
