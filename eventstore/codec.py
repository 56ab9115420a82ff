"""One codec for events: msgpack on disk, a JSON form for export and import.

The store is generic: it keeps bytes under tags, streams and versions and does not know which
events exist. The application describes its events once, as an :class:`EventTypes` (the union of
its tagged msgspec Structs, which of them the per-app feed indexes, and the upcasters of old
shapes), and hands it in when the store opens (``EventStore.open(path, events=...)``).

Decoders are built once per union, when it is described (msgspec perf tips). Decoding is
two-stage so that an unknown tag never crashes a reader: a payload whose ``type`` the union does
not know becomes :class:`UnknownEvent` (kept and skipped); a payload whose tag is known but whose
body is broken raises :class:`~eventstore.errors.EventDecodeError` naming the stream and version.
Old payloads are upcast on read only; stored bytes are never rewritten.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar, Union, cast

import msgspec

from sessionloop.eventstore.errors import EventDecodeError

__all__ = [
    "EventTypes",
    "UnknownEvent",
    "Upcaster",
    "encode_event",
    "encode_json",
    "event_to_builtins",
]

#: An event type of a union: a tagged msgspec Struct whose tag travels in the field ``type``.
EvT = TypeVar("EvT", bound=msgspec.Struct)

#: Rewrites an old payload (as a dict) into the current shape of its tag, on read.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

#: The field every event type carries its tag in (msgspec's ``tag_field``).
TAG_FIELD = "type"


class UnknownEvent(msgspec.Struct, frozen=True, gc=False):
    """A payload whose tag the store's union does not know: kept as raw bytes, skipped by folds,
    so rolling back a release never bricks a store. ``at`` is the payload's own ``at`` when it
    has an integer one (0 otherwise)."""

    type: str
    raw: bytes
    at: int = 0
    feed: ClassVar[bool] = False


class _TagOnly(msgspec.Struct):
    type: str


_encoder = msgspec.msgpack.Encoder()
_tag_decoder = msgspec.msgpack.Decoder(_TagOnly)
_dict_decoder = msgspec.msgpack.Decoder(dict[str, Any])
_json_encoder = msgspec.json.Encoder()
_DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


class EventTypes(Generic[EvT]):
    """The union of event types a store decodes, described once and handed in when it opens.

    ``types``: every known event type, each a msgspec Struct tagged through the field ``type``
    with a distinct string tag. ``feed``: the types the per-app feed indexes when an append names
    a feed (the others are stored but not indexed). ``upcasters``: tag -> function rewriting an
    old payload of that tag into the current shape, applied on read only.

    Raises ValueError naming the type or tag that breaks these rules.
    """

    def __init__(
        self,
        types: Sequence[type[EvT]],
        *,
        feed: Collection[type[EvT]] = (),
        upcasters: Mapping[str, Upcaster] | None = None,
    ) -> None:
        if not types:
            raise ValueError("an event union needs at least one event type")
        self.types: tuple[type[EvT], ...] = tuple(types)
        self.tags: frozenset[str] = frozenset(_tags_of(self.types))
        unknown_feed = [t.__name__ for t in feed if t not in self.types]
        if unknown_feed:
            raise ValueError(f"feed types not in the union: {', '.join(unknown_feed)}")
        self._feed: frozenset[type[EvT]] = frozenset(feed)
        self._upcasters: dict[str, Upcaster] = dict(upcasters or {})
        stray = sorted(set(self._upcasters) - self.tags)
        if stray:
            raise ValueError(f"upcasters for tags not in the union: {', '.join(stray)}")
        # a union of a runtime tuple of types: `X | Y` has no spelling for it
        self._union: Any = Union[self.types]  # noqa: UP007
        self._decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(self._union)

    def in_feed(self, event: EvT) -> bool:
        """Whether the per-app feed indexes ``event`` (its type was named in ``feed``)."""
        return type(event) in self._feed

    def decode(self, data: bytes, stream: str = "?", version: int = 0) -> EvT | UnknownEvent:
        """Decode one stored event payload.

        The fast path decodes straight into the union; only a payload that fails it is looked
        at twice, to tell an unknown tag (UnknownEvent) from a broken body (EventDecodeError
        naming ``stream`` and ``version``).
        """
        if not self._upcasters:
            try:
                return cast("EvT", self._decoder.decode(data))
            except _DECODE_ERRORS:
                pass
        try:
            tag = _tag_decoder.decode(data).type
        except _DECODE_ERRORS as e:
            raise EventDecodeError(stream, version, f"not an event payload ({e})") from e
        if tag not in self.tags:
            return UnknownEvent(type=tag, raw=bytes(data), at=_peek_at(data))
        try:
            upcast = self._upcasters.get(tag)
            if upcast is not None:
                return cast("EvT", msgspec.convert(upcast(_dict_decoder.decode(data)), self._union))
            return cast("EvT", self._decoder.decode(data))
        except (*_DECODE_ERRORS, msgspec.ValidationError) as e:
            raise EventDecodeError(stream, version, str(e)) from e

    def from_builtins(self, data: dict[str, Any]) -> EvT | UnknownEvent:
        """Inverse of :func:`event_to_builtins`.

        Raises EventDecodeError when the data is not a valid event of a known tag.
        """
        if "$unknown" in data:
            return UnknownEvent(type=str(data.get(TAG_FIELD)), raw=base64.b64decode(data["$unknown"]))
        tag = data.get(TAG_FIELD)
        if not isinstance(tag, str) or tag not in self.tags:
            raise EventDecodeError("<json>", 0, f"unknown event type {tag!r}")
        try:
            return cast("EvT", msgspec.convert(data, self._union))
        except msgspec.ValidationError as e:
            raise EventDecodeError("<json>", 0, str(e)) from e


def _tags_of(types: Sequence[type[msgspec.Struct]]) -> list[str]:
    tags: list[str] = []
    for t in types:
        config = t.__struct_config__
        if config.tag_field != TAG_FIELD or not isinstance(config.tag, str):
            raise ValueError(f"event type {t.__name__} needs a string tag in the field {TAG_FIELD!r} "
                             f"(has tag {config.tag!r} in {config.tag_field!r})")
        if config.tag in tags:
            raise ValueError(f"event type {t.__name__} repeats the tag {config.tag!r}")
        tags.append(config.tag)
    return tags


def _peek_at(data: bytes) -> int:
    try:
        value = _dict_decoder.decode(data).get("at", 0)
    except _DECODE_ERRORS:
        return 0
    return value if isinstance(value, int) else 0


def encode_event(event: msgspec.Struct) -> bytes:
    """The msgpack bytes of one event (the tag travels inside, as ``type``)."""
    return _encoder.encode(event)


# --- the JSON form ------------------------------------------------------------------------------


def event_to_builtins(event: msgspec.Struct) -> dict[str, Any]:
    """The event as plain JSON-compatible data (bytes become base64 strings, as msgspec does);
    an :class:`UnknownEvent` keeps its raw payload under ``$unknown``."""
    if isinstance(event, UnknownEvent):
        return {TAG_FIELD: event.type, "$unknown": base64.b64encode(event.raw).decode("ascii")}
    out: dict[str, Any] = msgspec.to_builtins(event)
    return out


def encode_json(obj: Any) -> bytes:
    """Canonical-enough JSON bytes of plain data (msgspec's encoder)."""
    return _json_encoder.encode(obj)
