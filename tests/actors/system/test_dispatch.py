"""The pooled pykka runtime: pykka's actor semantics on a few shared threads."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pykka
import pytest

from sessionloop.actors.system.pool import Dispatcher, PooledActor


@pytest.fixture
def dispatcher():
    d = Dispatcher(2)
    yield d
    d.stop()


def actor_class(dispatcher, **body):
    return type("Probe", (PooledActor,), {"dispatcher": dispatcher, **body})


def test_messages_are_handled_one_at_a_time_in_order_and_asks_are_answered(dispatcher):
    seen: list[int] = []

    def on_receive(self, message):
        seen.append(message)
        return message * 2

    ref = actor_class(dispatcher, on_receive=on_receive).start()
    for i in range(100):
        ref.tell(i)
    assert ref.ask(100, timeout=5) == 200
    assert seen == list(range(101))
    ref.stop(timeout=5)


def test_many_actors_share_the_pool_threads(dispatcher):
    threads: set[str] = set()
    lock = threading.Lock()

    def on_receive(self, message):
        with lock:
            threads.add(threading.current_thread().name)

    refs = [actor_class(dispatcher, on_receive=on_receive).start() for _ in range(200)]
    for ref in refs:
        ref.ask("ping", timeout=5)
    assert len(threads) <= 2 and all(name.startswith("sessionloop-pool") for name in threads)
    for ref in refs:
        ref.stop(timeout=5)


def test_a_busy_actor_does_not_starve_the_others(dispatcher):
    def slow(self, message):
        time.sleep(0.01)

    busy = actor_class(dispatcher, on_receive=slow).start()
    for _ in range(200):  # two seconds of work queued on one actor
        busy.tell("work")
    quick = actor_class(dispatcher, on_receive=lambda self, m: "ok").start()
    started = time.monotonic()
    assert quick.ask("hi", timeout=5) == "ok"
    assert time.monotonic() - started < 1.0
    busy.stop(block=False)
    quick.stop(timeout=5)


def test_start_and_stop_hooks_run_and_a_stopped_actor_refuses_messages(dispatcher):
    events: list[str] = []
    cls = actor_class(dispatcher, on_start=lambda self: events.append("start"),
                      on_stop=lambda self: events.append("stop"), on_receive=lambda self, m: events.append(m))
    ref = cls.start()
    ref.tell("hello")
    ref.stop(timeout=5)
    assert events == ["start", "hello", "stop"]
    assert not ref.is_alive()
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("late")


def test_an_exception_in_an_ask_goes_back_to_the_caller_and_the_actor_lives_on(dispatcher):
    def on_receive(self, message):
        if message == "boom":
            raise ValueError("bad message")
        return "fine"

    ref = actor_class(dispatcher, on_receive=on_receive).start()
    with pytest.raises(ValueError, match="bad message"):
        ref.ask("boom", timeout=5)
    assert ref.ask("again", timeout=5) == "fine"
    ref.stop(timeout=5)


def test_a_suspended_actor_takes_no_message_until_resumed_and_frees_its_pool_thread():
    """Akka Persistence's persist: the mailbox waits while a commit is under way, the thread does not."""
    d = Dispatcher(1)  # one pool thread: another actor can only run if the suspended one let go of it
    try:
        seen: list[str] = []
        holder: dict[str, object] = {}

        def on_receive(self, message):
            seen.append(message)
            if message == "commit":
                self._suspend()
                holder["actor"] = self

        ref = actor_class(d, on_receive=on_receive).start()
        other = actor_class(d, on_receive=lambda self, m: m).start()
        ref.tell("commit")
        answer = ref.ask("after", block=False)
        assert other.ask("ping", timeout=5) == "ping"  # the pool thread is free
        with pytest.raises(pykka.Timeout):  # "after" waits for the resume
            answer.get(timeout=0.05)
        assert seen == ["commit"]
        actor = holder["actor"]
        threading.Thread(target=lambda: actor._resume(lambda: seen.append("resumed"))).start()
        answer.get(timeout=5)
        assert seen == ["commit", "resumed", "after"]
        ref.stop(timeout=5)
        other.stop(timeout=5)
    finally:
        d.stop()


def test_a_resume_that_arrives_before_the_handler_returns_runs_next(dispatcher):
    seen: list[str] = []

    def on_receive(self, message):
        seen.append(message)
        if message == "commit":
            self._suspend()
            self._resume(lambda: seen.append("resumed"))  # the store answered at once
            seen.append("handler done")

    ref = actor_class(dispatcher, on_receive=on_receive).start()
    ref.tell("commit")
    ref.ask("after", timeout=5)
    assert seen == ["commit", "handler done", "resumed", "after"]
    ref.stop(timeout=5)


def test_an_exception_in_a_continuation_is_handled_like_one_in_a_tell(dispatcher):
    """pykka's rule for a failing message nobody waits on: on_failure runs and the actor stops."""
    failures: list[str] = []

    def on_receive(self, message):
        if message == "commit":
            self._suspend()
            self._resume(lambda: 1 / 0)
        return message

    def on_failure(self, exc_type, exc, tb):
        failures.append(exc_type.__name__)

    ref = actor_class(dispatcher, on_receive=on_receive, on_failure=on_failure).start()
    ref.tell("commit")
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("after", timeout=5)
    assert failures == ["ZeroDivisionError"]


@pytest.mark.parametrize("threads", [0, 4])
def test_sessions_run_turns_on_either_runtime(open_host, threads):
    host = open_host(permission_mode="acceptCalls", dispatcher_threads=threads)
    sessions = [host.create() for _ in range(20)]
    results = [s.run(f'!tool list_files {{"path": "."}}\nm{i}') for i, s in enumerate(sessions)]
    assert all(r.output_text == "done: 1 tool calls" for r in results)
    assert all(s.run("x").output_text == "echo: x" for s in sessions)


def test_one_pool_thread_keeps_many_sessions_commits_in_one_group(open_host):
    """A session waiting for its commit does not hold the pool thread: with a single thread and
    durable (fsynced) commits, concurrent sessions still share write transactions."""
    host = open_host(permission_mode="acceptCalls", dispatcher_threads=1, durability="sync")
    sessions = [host.create() for _ in range(40)]
    before = host.store.info()
    with ThreadPoolExecutor(40) as pool:
        results = list(pool.map(lambda s: s.run(f'!tool list_files {{"path": "."}}\n{s.id}'), sessions))
    assert all(r.output_text == "done: 1 tool calls" for r in results)
    info = host.store.info()
    commits, transactions = info["requests"] - before["requests"], info["batches"] - before["batches"]
    assert commits >= 80  # the input's commit and the tool result's, per session
    assert transactions < commits / 2, f"{transactions} transactions for {commits} commits"


def test_many_senders_racing_an_actor_going_idle_lose_no_message(dispatcher):
    """``put`` takes no lock the consumer holds: a message sent while the actor goes idle must
    still be handled, exactly once, in each sender's order, by one thread at a time."""
    seen: list[tuple[int, int]] = []
    inside: dict[int, int] = {}  # per actor: handlers running now
    overlaps: list[int] = []

    def on_receive(self, message):
        me = id(self)
        inside[me] = inside.get(me, 0) + 1
        if inside[me] != 1:
            overlaps.append(inside[me])
        time.sleep(0) if isinstance(message, tuple) and message[1] % 500 == 0 else None
        seen.append(message)
        inside[me] -= 1

    refs = [actor_class(dispatcher, on_receive=on_receive).start() for _ in range(4)]

    def sender(k: int) -> None:
        for j in range(3000):
            refs[j % 4].tell((k, j))
            if j % 97 == 0:
                time.sleep(0)  # let the actors drain and go idle now and then

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(6)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: widen every race window
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    deadline = time.monotonic() + 10
    while len(seen) < 6 * 3000 and time.monotonic() < deadline:  # nothing more is sent to wake them
        time.sleep(0.01)
    got = list(seen)
    assert len(got) == 6 * 3000 and len(set(got)) == len(got)
    for k in range(6):
        mine = [j for (s, j) in got if s == k]
        for a in range(4):
            assert [j for j in mine if j % 4 == a] == list(range(a, 3000, 4))
    assert not overlaps
    for ref in refs:
        ref.stop(timeout=5)


def test_a_message_sent_just_as_the_actor_goes_idle_is_still_handled(dispatcher):
    """The sender sends the next message the moment the previous one is handled, i.e. while the
    pool thread is finding the mailbox empty and letting the actor go idle: none may be stranded."""
    seen: list[int] = []
    ref = actor_class(dispatcher, on_receive=lambda self, m: seen.append(m)).start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    stranded = None
    try:
        for i in range(3000):
            ref.tell(i)
            deadline = time.monotonic() + 2
            while len(seen) <= i:
                if time.monotonic() > deadline:
                    stranded = i
                    break
            if stranded is not None:
                break
    finally:
        sys.setswitchinterval(interval)
    assert stranded is None, f"message {stranded} was never handled"
    assert seen == list(range(3000))
    ref.stop(timeout=5)
