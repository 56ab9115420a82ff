"""The decisions of setting writes (docs/owners.md, "Settings"), pure: whether a write is allowed,
and the stored facts it records. This module is the only place in ``actors/settings/`` where
``session.setting.changed``, ``place.registered`` and ``place.setting.changed`` are constructed;
the service reads what a decision needs (the field, the value there now, whether the place is
recorded), calls a function here, and appends what it returns.

What a write may be refused for, before anything changes (:class:`InvalidSetting`, each naming
the field and what is wrong): an unknown field; a value that does not fit the field's type,
bounds or options (:func:`check_value`); a field that does not apply to the session's kind or to
the layer; a session value for a ``narrowest: 'place'`` field. ``None`` deletes and skips those
scope and value rules. Writing the value that is already there (same value, same type) or deleting
what is not there records nothing.

Functions: :func:`decide_session_setting` (a session's own layer), :func:`decide_place_setting`
(a place's layer, registering the place with its first value), :func:`decide_place_registration`
(recording a place first seen on a session), :func:`check_layer_write` (a write to a layer of the
configuration document, which records no event: the document is written instead).
"""

from __future__ import annotations

import math
from typing import Any

from sessionloop.actors import events as E
from sessionloop.actors.errors import InvalidCommand
from sessionloop.actors.settings.context import PlaceFacts
from sessionloop.actors.settings.fields import MISSING, SettingField, layer_kinds
from sessionloop.actors.settings.texts import Text
from sessionloop.protocol.limits import MAX_INT, MIN_INT
from sessionloop.protocol.schemas_types import PlaceLayer


class InvalidSetting(InvalidCommand):
    """The peer asked for a write the rules refuse (the gateway answers ``invalidParams``)."""


# --- values ---------------------------------------------------------------------------------------


def check_value(f: SettingField, value: Any) -> str | None:
    """Why ``value`` does not fit ``f`` (a sentence naming the field: a text object, English as a
    string), or None when it fits."""
    problem = _type_problem(f, value)
    if problem is None and f.check is not None:
        found = f.check(value)
        problem = None if found is None else f"{f.plugin}/{f.key}: {found}"
    return problem


def _type_problem(f: SettingField, value: Any) -> Any:
    name = f"{f.plugin}/{f.key}"
    if f.type in ("string", "text", "llm-ref"):
        if not isinstance(value, str):
            return Text("setting.expected-string", name=name)
        if f.type == "llm-ref" and not value.strip():
            return Text("setting.expected-model", name=name)
        if f.max_length is not None and len(value) > f.max_length:
            return Text("setting.max-length", name=name, max=f.max_length)
        return None
    if f.type == "boolean":
        return None if isinstance(value, bool) else Text("setting.expected-boolean", name=name)
    if f.type == "enum":
        return None if isinstance(value, str) and value in f.options else \
            Text("setting.expected-enum", name=name, options=", ".join(f.options))
    if f.type in ("integer", "number"):
        expected = Text(f"setting.expected-{f.type}", name=name)
        numeric = isinstance(value, int) or (f.type == "number" and isinstance(value, float))
        # an int is never checked with math.isfinite: it overflows on 10**400 (the Python API
        # passes any int; the wire refuses ones outside int64 before they get here)
        if isinstance(value, bool) or not numeric or (isinstance(value, float) and not math.isfinite(value)):
            return expected
        if f.minimum is not None and value < f.minimum:
            return Text("setting.at-least", name=name, min=f"{f.minimum:g}")
        if f.maximum is not None and value > f.maximum:
            return Text("setting.at-most", name=name, max=f"{f.maximum:g}")
        if isinstance(value, int) and not MIN_INT <= value <= MAX_INT:  # the store holds int64
            return Text(f"setting.{f.type}-range", name=name)
        return None
    return Text("setting.unknown-type", name=name, type=repr(f.type))


def same_value(current: Any, value: Any) -> bool:
    """Whether writing ``value`` (``None``: delete) over ``current`` (:data:`MISSING`: none)
    changes nothing: a delete of nothing, or the same value of the same type (``1`` is not ``True``)."""
    if value is None:
        return current is MISSING
    return current is not MISSING and current == value and type(current) is type(value)


def _known(f: SettingField | None, plugin: str, key: str) -> SettingField:
    if f is None:
        raise InvalidSetting(Text("setting.no-such", field="params.key", name=f"{plugin}/{key}"))
    return f


def _fits(f: SettingField, value: Any) -> None:
    problem = check_value(f, value)
    if problem is not None:
        raise InvalidSetting(Text("setting.field-problem", field="params.value", problem=problem))


# --- writes ---------------------------------------------------------------------------------------


def decide_session_setting(f: SettingField | None, plugin: str, key: str, kind: str, current: Any, value: Any,
                           now: int) -> list[E.Event]:
    """A write to the own layer of a session of ``kind`` whose value is ``current`` (:data:`MISSING`:
    none). Raises InvalidSetting, changing nothing."""
    f = _known(f, plugin, key)
    if value is not None:
        if f.narrowest == "place":
            raise InvalidSetting(Text("setting.place-narrowest", field="params.key", name=f"{plugin}/{key}"))
        if not f.applies(frozenset({kind})):
            raise InvalidSetting(Text("setting.not-for-kind", field="params.key", name=f"{plugin}/{key}", kind=kind))
        _fits(f, value)
    if same_value(current, value):
        return []
    if value is None:
        return [E.SessionSettingChanged(at=now, plugin=plugin, key=key, deleted=True)]
    return [E.SessionSettingChanged(at=now, plugin=plugin, key=key, value=value)]


def check_layer_write(f: SettingField | None, plugin: str, key: str, kinds: frozenset[str] | None,
                      value: Any) -> SettingField:
    """Allow a write to a layer whose rows are for sessions of ``kinds`` (:func:`layer_kinds`;
    None: every field) and return the field. Raises InvalidSetting, changing nothing."""
    f = _known(f, plugin, key)
    if value is not None:
        if not f.applies(kinds):
            raise InvalidSetting(Text("setting.not-for-layer", field="params.key", name=f"{plugin}/{key}"))
        _fits(f, value)
    return f


def decide_place_registration(place: PlaceFacts, registered: bool, now: int) -> list[E.Event]:
    """Record a place (its stream's first event), unless it is recorded already."""
    if registered:
        return []
    return [E.PlaceRegistered(at=now, key=place.key, kind=place.kind, name=place.name)]


def decide_place_setting(f: SettingField | None, plugin: str, key: str, place: PlaceFacts, registered: bool,
                         current: Any, value: Any, now: int) -> list[E.Event]:
    """A write to ``place``'s layer whose value is ``current`` (:data:`MISSING`: none); a place not
    yet recorded is registered first, in the same append. Raises InvalidSetting, changing nothing."""
    f = check_layer_write(f, plugin, key, layer_kinds(PlaceLayer(key=place.key), place.kind), value)
    if same_value(current, value):
        return []
    return [*decide_place_registration(place, registered, now),
            E.PlaceSettingChanged(at=now, plugin=f.plugin, key=f.key, value=value, deleted=value is None)]


__all__ = [
    "InvalidSetting", "check_layer_write", "check_value", "decide_place_registration", "decide_place_setting",
    "decide_session_setting", "same_value",
]
