"""One codec for events: msgpack on disk, a JSON form for export and import.

Encoders and decoders are built once at import (msgspec perf tips). Decoding is two-stage so
that an unknown tag never crashes a reader: a payload whose ``type`` this release does not know
becomes :class:`~eventstore.events.UnknownEvent` (kept and skipped); a payload whose tag is
known but whose body is broken raises :class:`~eventstore.errors.EventDecodeError` naming the
stream and version.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, Union

import msgspec

from sessionloop.eventstore.errors import EventDecodeError
from sessionloop.eventstore.events import EVENT_TYPES, AnyEvent, Event, UnknownEvent

# a union of a runtime tuple of types: `X | Y` has no spelling for it
EventUnion = Union[EVENT_TYPES]  # type: ignore[valid-type]  # noqa: UP007

KNOWN_TAGS: frozenset[str] = frozenset(
    t.__struct_config__.tag for t in EVENT_TYPES  # type: ignore[misc]
)

#: tag -> function rewriting an old payload (as a dict) into the current shape. Applied on
#: read only; stored bytes are never rewritten (STYLE rule 6). Empty while no field has been
#: retyped since the first release.
UPCASTERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}


class _TagOnly(msgspec.Struct):
    type: str


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(EventUnion)
_tag_decoder = msgspec.msgpack.Decoder(_TagOnly)
_dict_decoder = msgspec.msgpack.Decoder(dict[str, Any])
_json_encoder = msgspec.json.Encoder()


def encode_event(event: Event) -> bytes:
    """The msgpack bytes of one event (the tag travels inside, as ``type``)."""
    return _encoder.encode(event)


def decode_event(data: bytes, stream: str = "?", version: int = 0) -> AnyEvent:
    """Decode one stored event payload.

    The fast path decodes straight into the union; only a payload that fails it is looked at
    twice, to tell an unknown tag (UnknownEvent) from a broken body (EventDecodeError naming
    ``stream`` and ``version``).
    """
    if not UPCASTERS:
        try:
            return _decoder.decode(data)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            pass
    try:
        tag = _tag_decoder.decode(data).type
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as e:
        raise EventDecodeError(stream, version, f"not an event payload ({e})") from e
    if tag not in KNOWN_TAGS:
        return UnknownEvent(type=tag, raw=bytes(data), at=_peek_at(data))
    try:
        upcast = UPCASTERS.get(tag)
        if upcast is not None:
            return msgspec.convert(upcast(_dict_decoder.decode(data)), EventUnion)  # type: ignore[no-any-return]
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as e:
        raise EventDecodeError(stream, version, str(e)) from e


def _peek_at(data: bytes) -> int:
    try:
        value = _dict_decoder.decode(data).get("at", 0)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return 0
    return value if isinstance(value, int) else 0


# --- the JSON form ------------------------------------------------------------------------------


def event_to_builtins(event: AnyEvent) -> dict[str, Any]:
    """The event as plain JSON-compatible data (bytes become base64 strings, as msgspec does)."""
    if isinstance(event, UnknownEvent):
        return {"type": event.type, "$unknown": base64.b64encode(event.raw).decode("ascii")}
    out: dict[str, Any] = msgspec.to_builtins(event)
    return out


def event_from_builtins(data: dict[str, Any]) -> AnyEvent:
    """Inverse of :func:`event_to_builtins`.

    Raises EventDecodeError when the data is not a valid event of a known tag.
    """
    if "$unknown" in data:
        return UnknownEvent(type=str(data.get("type")), raw=base64.b64decode(data["$unknown"]))
    tag = data.get("type")
    if not isinstance(tag, str) or tag not in KNOWN_TAGS:
        raise EventDecodeError("<json>", 0, f"unknown event type {tag!r}")
    try:
        return msgspec.convert(data, EventUnion)  # type: ignore[no-any-return]
    except msgspec.ValidationError as e:
        raise EventDecodeError("<json>", 0, str(e)) from e


def encode_json(obj: Any) -> bytes:
    return _json_encoder.encode(obj)
