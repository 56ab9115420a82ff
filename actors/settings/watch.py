"""Who hears that settings changed: :meth:`SettingsService.watch
<sessionloop.actors.settings.service.SettingsService.watch>` subscribes a callback and returns a
:class:`Watch`, whose ``close()`` ends the subscription (a gateway service closes its own when it
closes, so opening and closing services leaves nothing behind).

A callback is called with no arguments on the thread that made the change, after the change is
in effect; one that raises is logged and the others are still called.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable

log = logging.getLogger("sessionloop.settings")


class Watch:
    """One callback's subscription; ``close()`` ends it (closing twice is harmless)."""

    def __init__(self, watchers: ChangeWatchers, key: int) -> None:
        self._watchers = watchers
        self._key = key

    def close(self) -> None:
        self._watchers.remove(self._key)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChangeWatchers:
    """The callbacks subscribed to a settings service's changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._keys = itertools.count(1)

    def watch(self, callback: Callable[[], None]) -> Watch:
        with self._lock:
            key = next(self._keys)
            self._callbacks[key] = callback
        return Watch(self, key)

    def remove(self, key: int) -> None:
        with self._lock:
            self._callbacks.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._callbacks)

    def notify(self) -> None:
        """Call every subscribed callback (those subscribed when the call began)."""
        with self._lock:
            callbacks = list(self._callbacks.values())
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a session/config/changed listener failed")


__all__ = ["ChangeWatchers", "Watch"]
