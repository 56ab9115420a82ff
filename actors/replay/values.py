"""Plain values, their first difference, and the fold: what every replay tool compares with.

A timeline, a verification and a re-run all reduce what they compare to JSON-like data with every
field (:func:`plain`), find the first place two such values differ (:func:`first_difference`,
reported with its field path), and rebuild a session's state the way activation does
(:func:`fold_events`). :func:`wire_item` is a protocol item as a client receives it, in a server's
language. Pure: no clock, no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec
from msgspec import UNSET

from sessionloop.actors import events as E
from sessionloop.actors.session.state import SessionState, evolve, new_state
from sessionloop.actors.settings.texts import DEFAULT_LANGUAGE, LANGUAGES, enc_hook
from sessionloop.actors.views.items import ItemsProjection
from sessionloop.eventstore.records import RecordedEvent

__all__ = [
    "ABSENT",
    "EXCERPT",
    "excerpt",
    "first_difference",
    "fold_events",
    "one_line",
    "plain",
    "singleton_items",
    "summarize_args",
    "wire_item",
]

ABSENT: Final = "(absent)"  # how a missing key or list element is shown in a difference
EXCERPT: Final = 120


def plain(value: Any) -> Any:
    """``value`` as JSON-like data with *every* field (defaults too), so two values compare field by
    field and a difference names a real field. Events carry their tag as ``type``."""
    if isinstance(value, E.UnknownEvent):
        return {"type": value.type, "raw": plain(value.raw)}
    if isinstance(value, msgspec.Struct):
        out: dict[str, Any] = {}
        if isinstance(value, E.Event):
            out["type"] = E.event_tag(value)
        for name in value.__struct_fields__:
            out[name] = plain(getattr(value, name))
        return out
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return msgspec.to_builtins(bytes(value))  # base64, as the JSON export writes it
    if value is UNSET:
        return ABSENT
    return value


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def first_difference(expected: Any, got: Any, path: str = "",
                     ignore: frozenset[str] = frozenset()) -> tuple[str, Any, Any] | None:
    """The first place where two plain values differ: ``(path, expected, got)``, or None.

    Dict keys are visited in ``expected``'s order, then keys only ``got`` has; a missing key or
    list element is shown as :data:`ABSENT`. Keys in ``ignore`` are skipped at every depth.
    """
    if isinstance(expected, dict) and isinstance(got, dict):
        keys = [k for k in expected if k not in ignore] + [k for k in got if k not in expected and k not in ignore]
        for key in keys:
            here = _join(path, key)
            if key not in got:
                return here, expected[key], ABSENT
            if key not in expected:
                return here, ABSENT, got[key]
            found = first_difference(expected[key], got[key], here, ignore)
            if found is not None:
                return found
        return None
    if isinstance(expected, list) and isinstance(got, list):
        for i in range(max(len(expected), len(got))):
            if i >= len(got):
                return _join(path, i), expected[i], ABSENT
            if i >= len(expected):
                return _join(path, i), ABSENT, got[i]
            found = first_difference(expected[i], got[i], _join(path, i), ignore)
            if found is not None:
                return found
        return None
    if type(expected) is not type(got) and not (_is_number(expected) and _is_number(got)):
        return path or "$", expected, got
    return None if expected == got else (path or "$", expected, got)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def excerpt(text: str, limit: int = EXCERPT) -> str:
    """One line of at most ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summarize_args(args: Any, limit: int = 80) -> str:
    """A tool call's arguments as one short line of JSON."""
    if args is None:
        return "{}"
    try:
        text = msgspec.json.encode(args).decode()
    except (TypeError, msgspec.EncodeError):
        text = repr(args)
    return excerpt(text, limit)


def fold_events(session_id: str, events: Iterable[Any], state: SessionState | None = None) -> SessionState:
    """The session state folded from ``events`` (recorded or bare), the same fold activation runs."""
    state = state if state is not None else new_state(session_id)
    for item in events:
        evolve(state, item.event if isinstance(item, RecordedEvent) else item)
    return state


def one_line(value: Any, limit: int = 100) -> str:
    """A value as one short line: text excerpted, anything else as JSON."""
    return excerpt(value, limit) if isinstance(value, str) else summarize_args(value, limit)


def _text_hook(language: str) -> Callable[[Any], Any]:
    """Renders text objects in ``language``, fixed for the hook's life."""
    return enc_hook(lambda: language)


_TEXT_HOOKS: Final = {language: _text_hook(language) for language in LANGUAGES}


def wire_item(item: Any, language: str = DEFAULT_LANGUAGE) -> Any:
    """An item as plain JSON-like values, its human text rendered in ``language`` (as a frame of
    a server in that language has it; ``actors.settings.texts``)."""
    return msgspec.to_builtins(item, enc_hook=_TEXT_HOOKS.get(language, _TEXT_HOOKS[DEFAULT_LANGUAGE]))


def singleton_items(items: ItemsProjection) -> list[Any]:
    """The projection's one-per-session items (plan, usage, queue) that exist."""
    return [x for x in (items.plan_item(), items.usage_item(), items.queue_item()) if x is not None]
