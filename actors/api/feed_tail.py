"""An app's event feed for one remote consumer, in cursor order with no gap and no duplicate, from
any cursor the retention still holds: what ``loop/watch`` and ``GET /api/loop/events`` deliver.

Theory of operation
-------------------
Live events of an app's sessions are told from each committing session's own thread, so two
sessions' events can be told out of cursor order: a consumer that resumed after the last cursor
it was told could skip an event committed just before it and told just after. A tail therefore
never forwards a stored event as it is told. It reads the feed from the store after its cursor
(``EventStore.read_feed``, strict: a cursor retention passed raises ``CursorExpired``) and hands
the events on in position order; positions are allocated inside the write transaction and the
writes are serial, so what a read sees after a cursor is every event committed after it, whole.
A commit of the app's sessions only wakes the tail (and a timer wakes every tail once a
``poll_s``, which also covers commits of other worker processes, which wake nobody here); one
thread runs every tail's reads, so a tail never reads twice at once and a burst of commits is
one read.

So the cursor of the last event a consumer received is an exact resume point, across
reconnections and server restarts (cursors are global log positions): deliver from it again and
what follows is what was missed, once.

``assistant.delta`` events are live only (never stored): a tail places each among the stored
events where it belongs (before the answer it streams, after its turn's start; see
:meth:`FeedTail._heard`), so a consumer that catches up gets the deltas told meanwhile after the
history, in place; those of answers from before the tail's start are dropped.

Bounded: a tail holds no events of its own (what it read goes straight to the consumer, whose
outbox is bounded: a consumer that does not read is closed as a slow consumer, and its tail with
it); reads take at most ``batch`` events.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sessionloop.actors.api.loop import feed_event, read_feed
from sessionloop.actors.system.pubsub import LoopEvent, Watchers

log = logging.getLogger("sessionloop.loop")

#: events read per store read while catching up
BATCH = 200
#: how often every tail looks at the store without being woken
POLL_S = 1.0
#: live deltas a tail keeps while its reader catches up to where they go
MAX_DELTAS = 1000


class FeedTail:
    """One consumer's tail of ``app``'s feed after ``after``; see the module docstring.

    ``deliver(event)`` hands an event on and says whether the consumer still takes events (False
    closes the tail); ``ended(error)`` is called once when the tail stops by itself (the cursor
    expired under it: ``CursorExpired``; or the store failed)."""

    def __init__(self, tails: FeedTails, app: str, after: int, deliver: Callable[[LoopEvent], bool],
                 ended: Callable[[BaseException], None]) -> None:
        self._tails = tails
        self.app = app
        self.origin = after
        self.cursor = after
        self._deliver = deliver
        self._ended = ended
        self._lock = threading.Lock()
        self._reading = False
        self._again = False
        self.live = False
        self.closed = False
        self.closed_by_consumer = False
        self._begun = False
        self._deltas: deque[tuple[int, LoopEvent]] = deque()  # (placed after this position, delta)
        self._unsubscribe: Callable[[], None] | None = None

    def start(self, begin: bool = True) -> FeedTail:
        """Listen to the app's events; with ``begin``, deliver at once, else from :meth:`begin` on
        (what is told in between is not lost: the reader reads it, the deltas wait)."""
        self._unsubscribe = self._tails.watchers.add(self.app, self._heard)
        self._tails.opened(self)
        if begin:
            self.begin()
        return self

    def begin(self) -> None:
        with self._lock:
            self._begun = True
        self.wake()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._tails.closed(self)

    def _heard(self, event: LoopEvent) -> None:
        """A live event of the app (a session's thread). A stored one only wakes the tail, which
        reads it from the store in its turn. A delta (once caught up) is placed among the stored
        events: one of an answer taken in place goes just before its outcome (``before``), one
        streamed as the model answered after everything committed when it came (the store's
        head: its turn's start among it); it goes out at once when the tail is already past that
        point and not reading, else it waits for the reader (at most ``MAX_DELTAS``; beyond,
        the oldest are dropped: deltas are live only, a reader far behind has no use for them).
        An in-place delta of an answer at or before the tail's start is dropped."""
        if event.type != "assistant.delta" or event.cursor != 0:
            self.wake()
            return
        if event.before and event.before <= self.origin:
            return  # it streams an answer from before where this tail starts
        after = event.before - 1 if event.before else int(self._tails.store.head_position)
        with self._lock:
            if self.closed:
                return
            if self._begun and not self._reading and not self._deltas and after <= self.cursor:
                if not self._deliver(event):
                    self.closed_by_consumer = True
            else:
                self._deltas.append((after, event))
                if len(self._deltas) > MAX_DELTAS:
                    self._deltas.popleft()
        if self.closed_by_consumer:
            self.close()
        else:
            self.wake()

    def _deltas_up_to(self, position: int) -> bool:
        """Hand on the waiting deltas placed at or before ``position`` (the reader, in the order
        they came); False when the consumer stopped taking events."""
        with self._lock:
            if not self._deltas:
                return True
            ready = [e for after, e in self._deltas if after <= position]
            if not ready:
                return True
            self._deltas = deque((after, e) for after, e in self._deltas if after > position)
        return all(self._deliver(e) for e in ready)

    def wake(self) -> None:
        with self._lock:
            if self.closed:
                return
            if self._reading or not self._begun:
                self._again = True
                return
            self._reading = True
        try:
            self._tails.reader.submit(self._read)
        except RuntimeError:  # the reader is shut down: the server is stopping
            self.close()

    def _read(self) -> None:
        """Catch up to the end of the feed (the reader thread)."""
        try:
            while not self.closed:
                with self._lock:
                    self._again = False
                batch = read_feed(self._tails.store, self.app, self.cursor, self._tails.batch,
                                  strict=self.cursor > 0)
                for recorded in batch:
                    event = feed_event(recorded)
                    if not self._deltas_up_to(recorded.position - 1):
                        self.close()
                        return
                    self.cursor = recorded.position
                    if event is not None and not self._deliver(event):
                        self.close()
                        return
                if len(batch) == self._tails.batch:
                    continue
                if not self._deltas_up_to(self.cursor):
                    self.close()
                    return
                with self._lock:
                    if self._again and not self.closed:
                        continue
                    self.live = True
                    self._reading = False
                    return
        except BaseException as e:  # CursorExpired (retention passed it), or the store failed
            self.close()
            self._ended(e)
        finally:
            with self._lock:
                self._reading = False


class FeedTails:
    """Every tail of one server, their reader thread and their poll; see the module docstring."""

    def __init__(self, store: Any, watchers: Watchers, *, batch: int = BATCH, poll_s: float = POLL_S) -> None:
        self.store = store
        self.watchers = watchers
        self.batch = batch
        self.reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sessionloop-feed")
        self._tails: set[FeedTail] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poll_s = poll_s
        self._poller: threading.Thread | None = None

    def tail(self, app: str, after: int, deliver: Callable[[LoopEvent], bool],
             ended: Callable[[BaseException], None], *, begin: bool = True) -> FeedTail:
        """A started tail of ``app``'s feed after ``after`` (check the cursor first with
        :meth:`check`: a tail that finds it expired only ends); ``begin=False``: it delivers
        from its :meth:`FeedTail.begin` on."""
        return FeedTail(self, app, after, deliver, ended).start(begin)

    def check(self, app: str, after: int | None) -> int:
        """The cursor a tail starts after: ``after`` when the retention still holds it (else
        CursorExpired with the oldest cursor), or the present's last position for None."""
        if after is None:
            return int(self.store.head_position)
        if after:
            read_feed(self.store, app, after, 1, strict=True)
        return after

    def opened(self, tail: FeedTail) -> None:
        with self._lock:
            self._tails.add(tail)
            if self._poller is None and not self._stop.is_set():
                self._poller = threading.Thread(target=self._poll, name="sessionloop-feed-poll", daemon=True)
                self._poller.start()

    def closed(self, tail: FeedTail) -> None:
        with self._lock:
            self._tails.discard(tail)

    def __len__(self) -> int:
        return len(self._tails)

    def _poll(self) -> None:
        while not self._stop.wait(self._poll_s):
            with self._lock:
                tails = list(self._tails)
            for tail in tails:
                tail.wake()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            tails = list(self._tails)
        for tail in tails:
            tail.close()
        self.reader.shutdown(wait=False, cancel_futures=True)
