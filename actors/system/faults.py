"""Named fault points for the reliability harness (tests/reliability: a crash or an error at each named point).

A product feature, not a test double: ``SESSIONLOOP_CRASH_AT=after-commit:3`` makes the server
SIGKILL itself the third time it passes ``after-commit``, so crash tests exercise the real
process at exact moments. In-process, ``arm(point, exc, times)`` raises an exception there
instead (supervision tests). Unarmed points cost one dict lookup.
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = (
    "before-commit",  # events decided, nothing written
    "after-commit",  # committed, not yet acknowledged or published
    "after-ack",  # an input's receipt handed to its connection, its pushes queued, not yet written
    "model-stream",  # a model's answer half streamed (at each delta)
    "tool-run",  # a tool call started, its result not yet committed
    "recovery",  # a session with unfinished work activated after a restart, its repairs not committed
    "snapshot",  # events committed, the snapshot they complete not yet written
    "map-resize",  # the store's map full: the group's transaction aborted, the map not yet grown
    "approval-commit",  # an approval's answer committed, not yet acknowledged or acted on
    "purge",  # a delete's purge transaction: the session's records deleted, nothing committed
    "after-purge",  # a session's purge committed, its attachments and workspace not yet deleted
)


class FaultInjector:
    def __init__(self, spec: str | None = None) -> None:
        self._lock = threading.Lock()
        self._kill: dict[str, int] = {}
        self._raise: dict[str, tuple[BaseException, int]] = {}
        self.hits: dict[str, int] = {}
        for part in (spec or "").split(","):
            if not part.strip():
                continue
            point, _, nth = part.strip().partition(":")
            if point not in POINTS:
                raise ValueError(f"unknown crash point {point!r}; known: {', '.join(POINTS)}")
            self._kill[point] = int(nth or 1)

    @classmethod
    def from_env(cls) -> FaultInjector:
        return cls(os.environ.get("SESSIONLOOP_CRASH_AT"))

    def arm(self, point: str, error: BaseException, times: int = 1) -> None:
        if point not in POINTS:
            raise ValueError(f"unknown fault point {point!r}")
        with self._lock:
            self._raise[point] = (error, times)

    def hit(self, point: str) -> None:
        if not self._kill and not self._raise:
            return
        with self._lock:
            count = self.hits.get(point, 0) + 1
            self.hits[point] = count
            if self._kill.get(point) == count:
                os.kill(os.getpid(), signal.SIGKILL)
            armed = self._raise.get(point)
            if armed is None:
                return
            error, times = armed
            if times <= 1:
                del self._raise[point]
            else:
                self._raise[point] = (error, times - 1)
        raise error
