"""A pooled runtime for pykka actors: many mailboxes, few threads (an Akka-style dispatcher).

pykka's ``ThreadingActor`` gives every actor an OS thread. With a thousand busy sessions that
means a thousand runnable threads handing the GIL to one another, and the CPU per turn doubles
under load (README, benchmarks). ``PooledActor`` keeps pykka's actor model — one mailbox per
actor, messages handled one at a time in order, ``tell``/``ask``/``stop``, ``on_start``,
``on_stop``, ``on_failure``, the registry — but runs actors on a fixed pool of threads: a message
to an idle actor puts the actor on the pool's run queue; a pool thread then handles up to
``BUDGET`` of its messages and puts it back at the end of the queue if more are waiting, so a
busy actor cannot starve the others.

An actor may also *suspend* itself while a commit it started is under way (Akka Persistence's
``persist``): its mailbox is not served, but its pool thread goes back to the pool instead of
sleeping until the store answers; ``_resume(fn)`` (from any thread) runs ``fn`` on the actor
before any further message. Messages that arrive meanwhile wait in order, so the actor still
handles one thing at a time.

It implements pykka's documented runtime hooks (``_create_actor_inbox``, ``_create_future``,
``_start_actor_loop``), like pykka's own gevent and eventlet runtimes do.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from collections import deque
from typing import Any

import pykka
from pykka import messages
from pykka._threading import ThreadingFuture

log = logging.getLogger("sessionloop.dispatch")

BUDGET = 32  # messages an actor may handle before yielding its pool thread


class Dispatcher:
    """A run queue of actors with messages, served by ``threads`` daemon threads."""

    def __init__(self, threads: int, name: str = "sessionloop-pool") -> None:
        if threads < 1:
            raise ValueError("a dispatcher needs at least one thread")
        self._runq: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def bind(self, actor_class: type[Any]) -> type[Any]:
        """A subclass of ``actor_class`` (a :class:`PooledActor`) whose actors this dispatcher runs."""
        return type(actor_class.__name__, (actor_class,), {"dispatcher": self})

    def submit(self, actor: Any) -> None:
        self._runq.put(actor)

    def _serve(self) -> None:
        while True:
            actor = self._runq.get()
            if actor is None:
                return
            try:
                actor._run_slice()  # noqa: SLF001 - the dispatcher is the actor's runtime
            except BaseException:  # a runtime bug must not take a pool thread down
                log.exception("actor %s failed outside its handlers", actor)

    def stop(self) -> None:
        for _ in self._threads:
            self._runq.put(None)


class PooledInbox:
    """A mailbox that schedules its actor on the dispatcher when a message arrives while idle.

    ``put`` takes no lock a consumer holds: senders (the driver, the gateway, the worker loop)
    would otherwise queue behind a pool thread that lost the GIL while holding it, a convoy that
    costs a GIL hand-off per message. The deque's ``append``/``popleft`` are atomic, and the
    right to run the actor is a lock taken without blocking (``_run``): the sender that gets it
    submits the actor, the pool thread gives it back when the mailbox is empty and checks once
    more afterwards, so no message is left behind unscheduled. Suspension has a lock of its own,
    touched once per commit and never by ``put``.
    """

    __slots__ = ("_q", "_run", "_park", "owner", "suspended", "parked", "resume")

    def __init__(self) -> None:
        self._q: deque[Any] = deque()
        self._run = threading.Lock()  # held while the actor is on the run queue, running or suspended
        self._park = threading.Lock()
        self.owner: PooledActor | None = None
        self.suspended = False  # waiting for a ``resume``; messages are not taken meanwhile
        self.parked = False  # suspended and off every pool thread: ``resume`` must submit it
        self.resume: Any = None  # the continuation handed in by ``resume_with``

    def put(self, envelope: Any) -> None:
        self._q.append(envelope)
        if self._run.acquire(False):
            assert self.owner is not None
            self.owner.dispatcher.submit(self.owner)

    def claim(self) -> bool:
        """Take the right to run, unless a message sent first already took it (and submitted)."""
        return self._run.acquire(False)

    def take_or_idle(self) -> Any:
        """The next message (a continuation first), or None after marking the actor idle or
        parked; called only by the thread running the actor."""
        while True:
            if self.resume is not None:
                fn, self.resume, self.suspended = self.resume, None, False
                return _Resume(fn)
            if self.suspended:
                with self._park:
                    if self.resume is None:
                        self.parked = True
                        return None
                continue
            try:
                return self._q.popleft()
            except IndexError:
                pass
            self._run.release()
            # a message put between the failed popleft and the release found the lock held
            # and did not submit: take it now, unless a sender has already taken the lock
            if not self._q or not self._run.acquire(False):
                return None

    def suspend(self) -> None:
        self.suspended = True

    def resume_with(self, fn: Any) -> None:
        with self._park:
            self.resume = fn
            if not self.parked:
                return  # the thread running the actor takes it before its next message
            self.parked = False
        assert self.owner is not None
        self.owner.dispatcher.submit(self.owner)

    def get(self) -> Any:
        return self._q.popleft()

    def empty(self) -> bool:
        return not self._q

    def qsize(self) -> int:
        return len(self._q)


class _Resume:
    __slots__ = ("fn",)

    def __init__(self, fn: Any) -> None:
        self.fn = fn


class PooledActor(pykka.Actor):
    """A pykka actor run by a :class:`Dispatcher`; set ``dispatcher`` before starting it."""

    dispatcher: Dispatcher
    actor_inbox: PooledInbox  # what ``_create_actor_inbox`` makes

    @staticmethod
    def _create_actor_inbox() -> Any:
        return PooledInbox()

    @staticmethod
    def _create_future() -> Any:
        return ThreadingFuture()

    def __init__(self) -> None:
        super().__init__()
        self.actor_inbox.owner = self
        self._started = False

    def _start_actor_loop(self) -> None:
        inbox = self.actor_inbox
        if inbox.claim():
            self.dispatcher.submit(self)

    def _run_slice(self) -> None:
        if not self._started:
            self._started = True
            self._actor_loop_setup()
        inbox = self.actor_inbox
        for _ in range(BUDGET):
            if self.actor_stopped.is_set():
                self._actor_loop_teardown()
                return  # stays "scheduled": a stopped actor is never run again
            envelope = inbox.take_or_idle()
            if envelope is None:
                return
            if type(envelope) is _Resume:
                self._run_continuation(envelope.fn)
            else:
                self._handle_envelope(envelope)
        if self.actor_stopped.is_set():
            self._actor_loop_teardown()
            return
        self.dispatcher.submit(self)  # more waiting: back of the queue, others get a turn

    def _suspend(self) -> None:
        """Serve no further message until ``_resume``; call it from the actor's own handler."""
        self.actor_inbox.suspend()

    def _resume(self, fn: Any) -> None:
        """Run ``fn`` on the actor (before its next message) and serve its mailbox again."""
        self.actor_inbox.resume_with(fn)

    def _run_continuation(self, fn: Any) -> None:
        """Like a message nobody waits on (a tell): a failure goes to ``on_failure``."""
        try:
            fn()
        except Exception:
            self._unanswered_failure()
        except BaseException:  # noqa: BLE001 - as for a message
            self._stop()
            pykka.ActorRegistry.stop_all()

    def _unanswered_failure(self) -> None:
        """pykka's rule for an exception nobody receives: log it, stop, call ``on_failure``."""
        self._handle_failure(*sys.exc_info())
        try:
            self.on_failure(*sys.exc_info())
        except Exception:  # noqa: BLE001
            self._handle_failure(*sys.exc_info())

    def _handle_envelope(self, envelope: Any) -> None:
        """pykka's per-message rules (``Actor._actor_loop_running``), for one message."""
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                envelope.reply_to.set_exception()
            else:
                self._unanswered_failure()
        except BaseException:  # noqa: BLE001 - pykka: SystemExit and the like stop every actor
            self._stop()
            pykka.ActorRegistry.stop_all()

    def _actor_loop_teardown(self) -> None:
        inbox = self.actor_inbox
        while not inbox.empty():
            envelope = inbox.get()
            if envelope.reply_to is None:
                continue
            if isinstance(envelope.message, messages._ActorStop):  # noqa: SLF001
                envelope.reply_to.set(None)
            else:
                envelope.reply_to.set_exception(exc_info=(
                    pykka.ActorDeadError, pykka.ActorDeadError(f"{self.actor_ref} stopped before handling the message"),
                    None))
