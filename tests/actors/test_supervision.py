"""Supervision (pykka has none): failures never lose a session or an accepted input."""

from __future__ import annotations

import threading

import pytest

from actors.errors import ActorError, RequestTimeout, SessionParked
from actors.pubsub import Reply
from eventstore import StorageFull
from eventstore import events as E


def test_a_failing_handler_fails_that_request_clearly_and_the_session_recovers(host):
    s = host.create()
    s.run("before")
    host.rt.faults.arm("before-commit", RuntimeError("injected fault"))
    with pytest.raises(ActorError, match="failed while handling Send.*injected fault"):
        s.send("lost?")
    assert s.run("after").output_text == "echo: after"
    contents = [m.content for m in s.snapshot().messages]
    assert contents == ["before", "echo: before", "after", "echo: after"]


def test_requests_queued_behind_a_failure_are_still_answered(host):
    s = host.create()
    host.rt.faults.arm("before-commit", RuntimeError("injected"))
    results: list = []
    lock = threading.Lock()

    def send(i: int) -> None:
        try:
            r = s.send(f"m{i}")
            out = s.wait(r.turn_id, 10).state
        except ActorError as e:
            out = f"error: {e}"
        with lock:
            results.append(out)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.startswith("error") for r in results) == 1
    assert results.count("completed") == 5


def test_a_session_that_keeps_failing_is_parked_with_its_reason(open_host):
    host = open_host(permission_mode="acceptCalls", park_after_failures=3)
    s = host.create()
    host.rt.faults.arm("before-commit", RuntimeError("disk gremlin"), times=3)
    for _ in range(3):
        with pytest.raises(ActorError):
            s.send("x")
    with pytest.raises(SessionParked, match="disk gremlin"):
        s.send("y")
    parked = [e.event for e in s.events() if isinstance(e.event, E.SessionParked)]
    assert len(parked) == 1 and "3 failures" in parked[0].reason


def test_a_store_error_on_an_input_fails_it_and_writes_nothing(host):
    s = host.create()
    version = host.store.stream_version(f"session-{s.id}")
    host.rt.faults.arm("before-commit", StorageFull("disk full (injected)"))
    with pytest.raises(StorageFull):
        s.send("nope")
    assert host.store.stream_version(f"session-{s.id}") == version
    assert s.run("later").state == "completed"


def test_a_store_error_on_a_model_outcome_is_retried_and_the_turn_completes(open_host):
    host = open_host(permission_mode="acceptCalls", retry_delay_s=0.05)
    s = host.create()
    receipt = s.send("!sleep 100\nslow")  # the answer comes back as a message, then commits
    host.rt.faults.arm("before-commit", StorageFull("disk full (injected)"), times=2)
    assert s.wait(receipt.turn_id, 10).output_text == "echo: slow"


def test_every_wait_on_an_actor_has_a_timeout():
    reply = Reply()
    with pytest.raises(RequestTimeout, match="no answer within 0.05 s"):
        reply.result(0.05)
