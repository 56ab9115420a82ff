"""How results and pushes leave an actor without ever blocking it.

* :class:`Reply` — every request message carries one; the actor completes it once. Sync callers
  wait on it with a timeout (never forever); asyncio callers get an awaitable.
* :class:`SessionChannel` — a session's live publication: ``(epoch, seq)`` allocation and the
  subscribers. Each push is one :class:`Publication` handed to every subscriber, so what a
  subscriber derives from it (a protocol connection: the encoded frame) is made once per push,
  not once per subscriber. Pushes are produced on the actor thread (committed events) and on the worker
  loop (live deltas), so both go through one lock: that lock is also what makes the protocol's
  "before the snapshot reply is sent, the connection gets no push of that session" hold,
  because a subscriber is added and its snapshot handed over under it.
* :class:`TurnResults` — the outcome of recent turns and who waits for them (``wait_for_turn``
  wakes on the turn's end; no polling).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from sessionloop.actors.errors import RequestTimeout
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.system.worker import LoopBatch


class Reply:
    """A one-shot result slot completed by an actor, waited on by a caller.

    Waiting uses a bare pre-acquired lock (released on completion): creating one costs well
    under a microsecond, against several for a ``threading.Event``, and a turn makes a few.
    """

    __slots__ = ("_gate", "_guard", "_done", "_value", "_error", "_callbacks")

    def __init__(self) -> None:
        self._gate = threading.Lock()
        self._gate.acquire()
        # its own guard: one shared by every reply made convoys of actor, worker and driver
        # threads queueing for it whenever its holder lost the GIL
        self._guard = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Reply], None]] | None = None

    def set(self, value: Any = None) -> None:
        self._complete(value, None)

    def fail(self, error: BaseException) -> None:
        self._complete(None, error)

    def _complete(self, value: Any, error: BaseException | None) -> None:
        with self._guard:
            if self._done:
                return
            self._value, self._error, self._done = value, error, True
            callbacks, self._callbacks = self._callbacks, None
        self._gate.release()
        if callbacks:
            for cb in callbacks:
                cb(self)

    @property
    def done(self) -> bool:
        return self._done

    def result(self, timeout: float) -> Any:
        """The value, or raise the actor's error; RequestTimeout after ``timeout`` seconds."""
        if not self._done:
            if not self._gate.acquire(timeout=timeout):
                raise RequestTimeout(Text("error.no-answer", seconds=f"{timeout:g}"))
            self._gate.release()
        if self._error is not None:
            raise self._error
        return self._value

    def add_callback(self, cb: Callable[[Reply], None]) -> None:
        with self._guard:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(cb)
                return
        cb(self)

    def outcome(self) -> tuple[Any, BaseException | None]:
        return self._value, self._error

    def future(self, loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Future[Any]:
        """An asyncio future completed from whatever thread completes this reply."""
        loop = loop or asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        inbox = _LoopInbox.of(loop)
        self.add_callback(lambda reply: inbox.put(fut, reply._value, reply._error))
        return fut


class LoopWaiter:
    """An asyncio future of one loop that any thread completes with ``set`` or ``fail``: what
    :meth:`Reply.future` gives, for a waiter whose producer calls back with a plain value
    (``TurnResults.wait``) and needs no Reply (two locks and a callback list) in between."""

    __slots__ = ("future", "_inbox")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        loop = loop or asyncio.get_running_loop()
        self.future: asyncio.Future[Any] = loop.create_future()
        self._inbox = _LoopInbox.of(loop)

    def set(self, value: Any) -> None:
        self._inbox.put(self.future, value, None)

    def fail(self, error: BaseException) -> None:
        self._inbox.put(self.future, None, error)


class _LoopInbox:
    """Completions for one event loop, handed over in batches (:class:`LoopBatch`)."""

    _by_loop: dict[int, _LoopInbox] = {}
    _registry_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.batch: LoopBatch[tuple[asyncio.Future[Any], Any, BaseException | None]] = LoopBatch(loop, _settle_all)

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _LoopInbox:
        key = id(loop)
        inbox = cls._by_loop.get(key)
        if inbox is None or inbox.loop is not loop:
            with cls._registry_lock:
                inbox = cls._by_loop.get(key)
                if inbox is None or inbox.loop is not loop:
                    inbox = cls._by_loop[key] = cls(loop)
        return inbox

    def put(self, fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
        try:
            self.batch.add((fut, value, error))
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass


def _settle_all(items: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for fut, value, error in items:
        _settle(fut, value, error)


def _settle(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


class Publication:
    """One push of a session, made once and handed to every subscriber of it.

    ``memo`` is for the subscribers: the first one that derives something from the push (a protocol
    connection: the frame, encoded) leaves it there, with a key saying whose it is, and the others
    take it (they get the push under the channel's lock, one after another).
    """

    __slots__ = ("session_id", "epoch", "seq", "method", "payload", "memo")

    def __init__(self, session_id: str, epoch: int, seq: int, method: str, payload: Any) -> None:
        self.session_id = session_id
        self.epoch = epoch
        self.seq = seq
        self.method = method
        self.payload = payload
        self.memo: tuple[Any, Any] | None = None

    def __repr__(self) -> str:
        return f"Publication({self.session_id!r}, {self.epoch}, {self.seq}, {self.method!r})"


class Subscriber(Protocol):
    """A receiver of a session's pushes (a protocol connection, a test, a bot watcher).

    ``push`` is called under the session's channel lock from actor and worker threads: it must
    not block (queue the frame and return).
    """

    def push(self, publication: Publication) -> None: ...


class SessionChannel:
    """One session's ``(epoch, seq)`` counter and subscribers."""

    __slots__ = ("session_id", "epoch", "lock", "seq", "subscribers", "streaming", "cards")

    def __init__(self, session_id: str, epoch: int) -> None:
        self.session_id = session_id
        self.epoch = epoch
        self.lock = threading.Lock()
        self.seq = 0  # the seq of the last push; read under ``lock`` for a snapshot
        self.subscribers: dict[Any, Subscriber] = {}
        #: the items a model call is streaming (never persisted): item id -> (the started item,
        #: the text so far); a snapshot taken mid-stream holds them (the items a running turn has produced so far)
        self.streaming: dict[str, tuple[Any, list[str]]] = {}
        #: the tool cards a model call announced while its arguments stream (status
        #: ``generating`` tool-call items), by call id; live only like the text
        self.cards: dict[str, Any] = {}

    @property
    def has_subscribers(self) -> bool:
        return bool(self.subscribers)

    def publish(self, method: str, payload: Any) -> None:
        with self.lock:
            if not self.subscribers:
                return
            self.seq += 1
            self._deliver(list(self.subscribers.values()), method, payload)

    def _deliver(self, subs: list[Subscriber], method: str, payload: Any) -> None:
        """The push of ``self.seq`` to ``subs`` (call under ``lock``)."""
        publication = Publication(self.session_id, self.epoch, self.seq, method, payload)
        for sub in subs:
            sub.push(publication)

    def publish_many(self, pushes: list[tuple[str, Any]]) -> None:
        with self.lock:
            if not self.subscribers:
                return
            subs = list(self.subscribers.values())
            for method, payload in pushes:
                self.seq += 1
                self._deliver(subs, method, payload)

    def stream(self, item_id: str, start: Callable[[str], Any], delta: Callable[[str, str], Any], text: str) -> None:
        """One delta of a streamed item: kept with the item's text so far and pushed, atomically
        with respect to a snapshot (taken under ``lock``): a subscriber gets each piece of text
        once, in the snapshot or in a later push. ``item/started`` (``start(item_id)``) goes out
        with the first delta; ``delta(item_id, text)`` is the push, built only for subscribers."""
        with self.lock:
            entry = self.streaming.get(item_id)
            first = entry is None
            if entry is None:
                entry = self.streaming[item_id] = (start(item_id), [])
            entry[1].append(text)
            if not self.subscribers:
                return
            subs = list(self.subscribers.values())
            push = delta(item_id, text)
            pushes = [("item/started", entry[0]), ("item/delta", push)] if first else [("item/delta", push)]
            for method, payload in pushes:
                self.seq += 1
                self._deliver(subs, method, payload)

    def streamed_items(self) -> list[Any]:
        """The streaming items with their text so far, and the announced tool cards (call under
        ``lock``)."""
        items = [msgspec.structs.replace(item, text="".join(parts)) for item, parts in self.streaming.values()]
        return items + list(self.cards.values()) if self.cards else items

    def stream_card(self, card: Any) -> None:
        """A tool card announced mid-stream: kept for snapshots and pushed as ``item/started``."""
        with self.lock:
            self.cards[card.item_id] = card
            if self.subscribers:
                self.seq += 1
                self._deliver(list(self.subscribers.values()), "item/started", card)

    def discard(self, item_ids: list[str], close: Callable[[Any, str], Any]) -> None:
        """Drop the streaming items ``item_ids`` and every announced card (a model call restarts
        after a failed attempt), pushing ``item/completed`` of ``close(item, text so far)`` for
        each, atomically with respect to a snapshot."""
        with self.lock:
            gone = [(item, "".join(parts)) for item, parts in
                    (self.streaming.pop(i) for i in item_ids if i in self.streaming)]
            gone += [(card, "") for card in self.cards.values()]
            self.cards.clear()
            if not gone or not self.subscribers:
                return
            subs = list(self.subscribers.values())
            for item, text in gone:
                payload = close(item, text)
                self.seq += 1
                self._deliver(subs, "item/completed", payload)

    def end_streams(self) -> dict[str, Any]:
        """The model call's outcome is committed (its items are in the projection now); returns
        the tool cards it had announced, so the caller can close the ones its answer lacks."""
        cards: dict[str, Any] = {}
        if self.streaming or self.cards:
            with self.lock:
                self.streaming.clear()
                cards, self.cards = self.cards, {}
        return cards

    def add(self, key: Any, subscriber: Subscriber) -> None:
        with self.lock:
            self.subscribers[key] = subscriber

    def remove(self, key: Any) -> bool:
        with self.lock:
            return self.subscribers.pop(key, None) is not None


class TurnOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a turn ended, as ``wait_for_turn`` reports it."""

    session_id: str
    turn_id: str
    state: str  # completed | failed
    output_text: str = ""
    code: str | None = None
    reason: str | None = None
    outcome: str = "replied"  # replied | silent | aborted | error


class TurnResults:
    """Recent turn outcomes plus waiters; bounded, thread-safe."""

    def __init__(self, keep: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._results: OrderedDict[str, TurnOutcome] = OrderedDict()
        self._waiters: dict[str, list[Callable[[TurnOutcome], None]]] = {}
        self._expected: set[str] = set()  # turns accepted by a live session and not ended yet
        self._keep = keep

    def expect(self, turn_ids: list[str]) -> None:
        with self._lock:
            self._expected.update(turn_ids)

    def is_expected(self, turn_id: str) -> bool:
        return turn_id in self._expected

    def complete(self, outcome: TurnOutcome) -> None:
        with self._lock:
            self._results[outcome.turn_id] = outcome
            self._expected.discard(outcome.turn_id)
            if len(self._results) > self._keep:
                self._results.popitem(last=False)
            waiters = self._waiters.pop(outcome.turn_id, [])
        for cb in waiters:
            cb(outcome)

    def get(self, turn_id: str) -> TurnOutcome | None:
        with self._lock:
            return self._results.get(turn_id)

    def wait(self, turn_id: str, callback: Callable[[TurnOutcome], None]) -> TurnOutcome | None:
        """The outcome if known now; else ``callback`` is registered and None returned."""
        with self._lock:
            found = self._results.get(turn_id)
            if found is None:
                self._waiters.setdefault(turn_id, []).append(callback)
            return found

    def cancel_wait(self, turn_id: str, callback: Callable[[TurnOutcome], None]) -> None:
        with self._lock:
            waiters = self._waiters.get(turn_id)
            if waiters and callback in waiters:
                waiters.remove(callback)
                if not waiters:
                    del self._waiters[turn_id]


class LoopEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One event of the app's feed (its event types). ``cursor`` is stable: pass the last one
    back as ``after`` to resume."""

    cursor: int
    session_id: str
    type: str
    at: int
    turn_id: str | None = None
    data: dict[str, Any] = {}
    #: a live ``assistant.delta`` of an answer taken in place: the cursor of the stored event it
    #: streamed before (its outcome, committed with it); 0 for one streamed as the model answered
    before: int = 0


class Watchers:
    """``on_did_receive_event`` callbacks per app (the Session Loop API's event watch), fed from
    committed events (and live deltas); one per runtime (``Runtime.loop_watchers``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_app: dict[str, dict[int, Callable[[Any], None]]] = {}
        self._next = 0

    def add(self, app_id: str, cb: Callable[[Any], None]) -> Callable[[], None]:
        with self._lock:
            self._next += 1
            key = self._next
            self._by_app.setdefault(app_id, {})[key] = cb

        def unsubscribe() -> None:
            with self._lock:
                self._by_app.get(app_id, {}).pop(key, None)

        return unsubscribe

    def any(self, app_id: str) -> bool:
        return bool(self._by_app.get(app_id))

    def emit(self, app_id: str, event: Any) -> None:
        for cb in list(self._by_app.get(app_id, {}).values()):
            try:
                cb(event)
            except Exception:  # a bot's callback must not fail the session that published
                logging.getLogger("sessionloop.loop").exception("on_did_receive_event callback failed")
