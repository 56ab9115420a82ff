"""The places of session settings (docs/owners.md, "Settings"): the place read model of one
settings service, and the writes that record places.

A place is a ``window`` (an IM group or someone's private chat, from ``SessionCreated.place``) or
a ``workspace`` (the default workspace; a project workspace per folder, the session's ``cwd``).
Each recorded place has a stream ``place-<key>``: ``place.registered`` first, then
``place.setting.changed`` for each write to its layer. :class:`Places` knows every place (the
recorded ones, folded from their streams, and those seen on sessions since), which of them are
recorded, and the values written on each. A place seen on a session is recorded when it is first
seen, off the seeing thread; a write to a place not yet recorded registers it in the same append.

The read model shares the settings service's locks: its dictionaries are read and changed with
the service's lock held (the service resolves layer chains under that lock), and its writes are
serialised with the service's other writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.settings.context import DEFAULT_WORKSPACE, Ident, PlaceFacts
from sessionloop.actors.settings.decide import decide_place_registration, decide_place_setting
from sessionloop.actors.settings.fields import MISSING, SettingField
from sessionloop.eventstore import EventStore
from sessionloop.eventstore.errors import WrongExpectedVersion

log = logging.getLogger("sessionloop.settings")

STREAM_PREFIX = "place-"


class Places:
    """The places one settings service knows, and their recorded values (thread-safe with ``lock``)."""

    def __init__(self, store: EventStore[Any], submit: Callable[[Callable[[], None]], Any], lock: threading.RLock,
                 write_lock: threading.Lock, default_name: str) -> None:
        self._store = store
        self._submit = submit
        self._lock = lock
        self._write_lock = write_lock
        self.facts: dict[str, PlaceFacts] = {
            DEFAULT_WORKSPACE: PlaceFacts(key=DEFAULT_WORKSPACE, kind="workspace", name=default_name)}
        self.registered: set[str] = set()
        self.values: dict[str, dict[Ident, Any]] = {}

    # --- reading --------------------------------------------------------------------------------

    def load(self, records: Iterable[Any]) -> None:
        """Fold every recorded place, then know the places of the root sessions in ``records``
        (the listing's records) without recording them again."""
        after = None
        while True:
            page = self._store.list_streams("place", after, 500)
            for stream in page.streams:
                self.fold(stream[len(STREAM_PREFIX):], [r.event for r in self._store.read_stream(stream)])
            if page.next_after is None:
                break
            after = page.next_after
        for rec in records:
            if rec.parent_id is None and rec.place is not None:
                window = rec.place.kind == "window"
                chat = rec.chat.type if rec.chat is not None else None
                self.know(PlaceFacts(key=rec.place.key, kind=rec.place.kind, name=rec.place.name or rec.place.key,
                                     platform=rec.platform if window else None, type=chat if window else None),
                          register=False)

    def fold(self, key: str, events: Iterable[Any]) -> None:
        """Apply the events of stream ``place-<key>``."""
        with self._lock:
            for e in events:
                if isinstance(e, E.PlaceRegistered):
                    known = self.facts.get(key)
                    self.facts[key] = PlaceFacts(key=key, kind=e.kind, name=e.name or key,
                                                 platform=known.platform if known else None,
                                                 type=known.type if known else None)
                    self.registered.add(key)
                elif isinstance(e, E.PlaceSettingChanged):
                    values = self.values.setdefault(key, {})
                    if e.deleted:
                        values.pop((e.plugin, e.key), None)
                    else:
                        values[(e.plugin, e.key)] = e.value

    def get(self, key: str) -> PlaceFacts | None:
        with self._lock:
            return self.facts.get(key)

    def values_of(self, key: str) -> Mapping[Ident, Any]:
        """The values written on place ``key`` (call with the lock held)."""
        return self.values.get(key, {})

    def ordered(self) -> list[str]:
        """Every place key: workspaces first (the default one first), then windows."""
        with self._lock:
            places = list(self.facts.values())
        places.sort(key=lambda p: (p.kind != "workspace", p.key != DEFAULT_WORKSPACE, p.platform or "",
                                   p.type or "", p.name, p.key))
        return [p.key for p in places]

    # --- recording ------------------------------------------------------------------------------

    def know(self, facts: PlaceFacts | None, register: bool = True) -> bool:
        """Remember a place a session is in, and record it (stream ``place-<key>``) off this
        thread; True when the list of layers changed (a new place, or a window's platform)."""
        if facts is None:
            return False
        with self._lock:
            known = self.facts.get(facts.key)
            grew = known is None or bool((facts.platform and not known.platform) or (facts.type and not known.type))
            if known is None:
                self.facts[facts.key] = facts
            elif grew:
                self.facts[facts.key] = msgspec.structs.replace(
                    known, platform=known.platform or facts.platform, type=known.type or facts.type)
            needed = register and facts.key not in self.registered
        if needed:
            self._submit(lambda: self.register(facts.key, _now_ms()))
        return grew

    def register(self, key: str, now: int) -> None:
        """Record place ``key`` if it is still unrecorded (its stream must be new: another writer
        that recorded it meanwhile wins). A failure is logged; the place stays known, unrecorded."""
        with self._write_lock:
            with self._lock:
                facts = self.facts.get(key)
                if facts is None:
                    return
                events = decide_place_registration(facts, key in self.registered, now)
            if not events:
                return
            try:
                self._store.append(f"{STREAM_PREFIX}{key}", events, expected_version=0)
            except WrongExpectedVersion:
                pass  # recorded meanwhile (another service on this runtime)
            except Exception:
                log.exception("could not record place %s", key)
                return
            with self._lock:
                self.registered.add(key)

    def write(self, place: PlaceFacts, f: SettingField | None, plugin: str, key: str, value: Any, now: int) -> bool:
        """Write (``None``: delete) a value on ``place``'s layer (call with the write lock held); True
        when something was recorded. Raises InvalidSetting or a store error, changing nothing."""
        with self._lock:
            current = self.values.get(place.key, {}).get((plugin, key), MISSING)
            registered = place.key in self.registered
            events = decide_place_setting(f, plugin, key, place, registered, current, value, now)
        if not events:
            return False
        self._store.append(f"{STREAM_PREFIX}{place.key}", events)
        self.fold(place.key, events)
        return True


def _now_ms() -> int:
    return int(time.time() * 1000)


__all__ = ["Places"]
