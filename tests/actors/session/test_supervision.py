"""Supervision (pykka has none): failures never lose a session or an accepted input."""

from __future__ import annotations

import threading

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.errors import ActorError, RequestTimeout, SessionParked
from sessionloop.actors.system.pubsub import Reply
from sessionloop.eventstore import StorageFull, WrongExpectedVersion


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


def test_an_append_refused_at_commit_time_fails_the_input_and_the_session_goes_on(host):
    """The persist-and-resume path: the store refuses the group's append after the actor has
    suspended (here another writer took the stream's next version, as an overlapping actor
    instance would). The input fails with the store's error, nothing of it is written, the actor
    reloads from the log, and its next input runs."""

    s = host.create()
    stream = f"session-{s.id}"
    s.run("first")
    # another writer appends behind the actor's back; the actor's state still has the old version
    host.store.append(stream, [E.SessionRenamed(at=1, title="renamed elsewhere")])
    version = host.store.stream_version(stream)
    with pytest.raises(WrongExpectedVersion):
        s.send("lost race")
    assert host.store.stream_version(stream) == version  # nothing of the refused input
    assert not any(isinstance(r.event, E.InputAccepted) and r.event.text == "lost race" for r in s.events())
    assert s.run("after").output_text == "echo: after"
    assert s.snapshot().title == "renamed elsewhere"  # reloaded from the log, the other write included


def test_a_tool_outcome_refused_at_commit_time_is_retried_and_the_turn_completes(open_host, caplog):
    host = open_host(permission_mode="acceptCalls", retry_delay_s=0.05)
    s = host.create()
    stream = f"session-{s.id}"
    gate = threading.Event()
    original = host.rt.tools.execute

    async def held(name, args, ctx):
        # while the tool runs, another writer takes the stream's next version
        host.store.append(stream, [E.SessionRenamed(at=1, title="meanwhile")])
        gate.set()
        return await original(name, args, ctx)

    host.rt.tools.execute = held
    result = s.run('!tool list_files {"path": "."}\ngo')
    assert gate.is_set()
    assert result.output_text == "done: 1 tool calls"
    finished = [r.event for r in s.events() if isinstance(r.event, E.ToolFinished)]
    assert len(finished) == 1  # the outcome was committed once, after the reload
    assert any("retrying ToolDone" in r.getMessage() and "expected" in r.getMessage().lower() for r in caplog.records)


def test_a_snapshot_the_store_refuses_after_an_input_committed_still_answers_with_its_receipt(open_host, caplog):
    """The snapshot is written after the input's commit and before its reply. A full disk that
    refuses the snapshot must not turn the committed input into an error: its client, told
    "write failed", would send it again and get two turns (seen on a full tmpfs)."""
    host = open_host(permission_mode="acceptCalls", snapshot_every=3)
    s = host.create()
    stream = f"session-{s.id}"
    host.rt.faults.arm("snapshot", StorageFull("disk full (injected)"))
    receipt = s.send("kept")  # before the fix: raises StorageFull, and the turn runs anyway
    assert receipt.state == "accepted"
    assert s.wait(receipt.turn_id, 10).output_text == "echo: kept"
    assert [e.event.text for e in s.events() if isinstance(e.event, E.InputAccepted)] == ["kept"]
    assert host.store.load_snapshot(stream) is None
    assert f"session {s.id}: the snapshot at version" in caplog.text
    assert s.run("later").output_text == "echo: later"  # the snapshot is tried again, and made
    assert host.store.load_snapshot(stream).version == host.store.stream_version(stream)


def test_a_failure_after_an_input_committed_still_answers_with_its_receipt_and_runs_one_turn(host):
    """Supervision takes over after a handler fails; when the failure comes after the commit
    (here injected at ``after-commit``, as a bug in a projection would), the input is in the
    log and its client gets its receipt, not an error."""
    s = host.create()
    host.rt.faults.arm("after-commit", RuntimeError("a projection bug"))
    receipt = s.send("kept")  # before the fix: ActorError "failed while handling Send"
    assert receipt.state == "accepted"
    assert s.wait(receipt.turn_id, 10).output_text == "echo: kept"
    started = [e.event.turn_id for e in s.events() if isinstance(e.event, E.TurnStarted)]
    assert started == [receipt.turn_id]
