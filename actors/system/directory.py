"""The directory of virtual actors (Orleans-style: activated on first message, passivated when idle).

A session actor exists only while it is used: the first message to a session activates it
(its thread starts, ``on_start`` folds snapshot + later events), and a session idle for
``idle_timeout`` seconds, or the least recently used one when more than ``max_live`` are live,
is passivated. 1,000,000 stored sessions never mean 1,000,000 threads, and opening a host
touches no session that has no unfinished work.

Passivation never loses a message: every message to a session goes through :meth:`tell`,
which counts it under the directory lock. ``Passivate`` carries the count at the time it was
sent; the actor, once its own mailbox reached it, asks :meth:`retire` to remove it, which
succeeds only if nothing was routed to it since. Otherwise the actor stays live and handles
the newer messages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol, cast

import pykka

from sessionloop.actors.errors import HostClosed

log = logging.getLogger("sessionloop.directory")


class _CountedInbox(Protocol):
    """The mailboxes this host's actors have (``queue.SimpleQueue``, ``PooledInbox``) count their
    messages; pykka's ``ActorInbox`` protocol names only put, get and empty."""

    def qsize(self) -> int: ...


class _Entry:
    __slots__ = ("ref", "routed", "last_used", "passivate_sent")

    def __init__(self, ref: pykka.ActorRef[Any]) -> None:
        self.ref = ref
        self.routed = 0
        self.last_used = time.monotonic()
        self.passivate_sent = False


class Directory:
    def __init__(
        self,
        start_actor: Callable[[str], pykka.ActorRef[Any]],
        make_passivate: Callable[[int], Any],
        *,
        idle_timeout: float = 300.0,
        max_live: int = 4000,
        sweep_interval: float | None = None,
    ) -> None:
        self._start_actor = start_actor
        self._make_passivate = make_passivate
        self.idle_timeout = idle_timeout
        self.max_live = max_live
        self._lock = threading.Lock()
        self._live: OrderedDict[str, _Entry] = OrderedDict()
        self._closed = False
        self.activations = 0
        self.passivations = 0
        interval = sweep_interval if sweep_interval is not None else max(0.005, min(idle_timeout / 4, 30.0))
        self._stop = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep_loop, args=(interval,), name="sessionloop-directory",
                                         daemon=True)
        self._sweeper.start()

    def tell(self, session_id: str, message: Any) -> None:
        """Deliver ``message`` to the session's actor, activating it if needed."""
        with self._lock:
            if self._closed:
                raise HostClosed()
            entry = self._live.get(session_id)
            if entry is None or not entry.ref.is_alive():
                entry = _Entry(self._start_actor(session_id))
                self._live[session_id] = entry
                self.activations += 1
            else:
                self._live.move_to_end(session_id)
            entry.routed += 1
            entry.last_used = time.monotonic()
            entry.passivate_sent = False
            entry.ref.tell(message)
            over = len(self._live) - self.max_live
        if over > 0:
            self._passivate_oldest(over)

    def ref(self, session_id: str) -> pykka.ActorRef[Any] | None:
        with self._lock:
            entry = self._live.get(session_id)
            return entry.ref if entry is not None else None

    def retire(self, session_id: str, ref: pykka.ActorRef[Any], routed: int) -> bool:
        """Called by an actor handling ``Passivate``: leave the directory if nothing new came."""
        with self._lock:
            entry = self._live.get(session_id)
            if entry is None or entry.ref is not ref:
                return True
            if entry.routed != routed:
                entry.passivate_sent = False
                return False
            del self._live[session_id]
            self.passivations += 1
            return True

    def forget(self, session_id: str, ref: pykka.ActorRef[Any]) -> None:
        """Drop a broken actor so the next message activates a fresh one."""
        with self._lock:
            entry = self._live.get(session_id)
            if entry is not None and entry.ref is ref:
                del self._live[session_id]

    def live_count(self) -> int:
        with self._lock:
            return len(self._live)

    def mailbox_depth(self) -> int:
        """Messages queued in every live actor's mailbox (a gauge: growth means actors fall behind)."""
        with self._lock:
            refs = [e.ref for e in self._live.values()]
        return sum(cast(_CountedInbox, ref.actor_inbox).qsize() for ref in refs)

    def live_ids(self) -> list[str]:
        with self._lock:
            return list(self._live)

    def _passivate(self, session_id: str, entry: _Entry) -> None:
        if not entry.passivate_sent:
            entry.passivate_sent = True
            entry.ref.tell(self._make_passivate(entry.routed))

    def _passivate_oldest(self, count: int) -> None:
        with self._lock:
            for session_id, entry in list(self._live.items()):
                if count <= 0:
                    break
                if not entry.passivate_sent:
                    self._passivate(session_id, entry)
                    count -= 1

    def _sweep_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            cutoff = time.monotonic() - self.idle_timeout
            with self._lock:
                for session_id, entry in list(self._live.items()):
                    if entry.last_used > cutoff:
                        break  # LRU order: the rest were used more recently
                    if not entry.ref.is_alive():
                        del self._live[session_id]
                        continue
                    entry.passivate_sent = False
                    self._passivate(session_id, entry)
                    # ask again one idle period later if it stays busy (an actor with work ignores it)
                    entry.last_used = time.monotonic()
                    self._live.move_to_end(session_id)

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting messages and stop every live actor after its mailbox drains."""
        with self._lock:
            self._closed = True
            entries = list(self._live.values())
            self._live.clear()
        self._stop.set()
        futures = [e.ref.stop(block=False) for e in entries]
        deadline = time.monotonic() + timeout
        for f in futures:
            try:
                f.get(timeout=max(0.01, deadline - time.monotonic()))
            except (pykka.Timeout, pykka.ActorDeadError):
                pass
        self._sweeper.join(timeout=1)
