"""The delete cascade in process (actors/session/deletion.py): the cases the wire tests do not reach: a
parked session, a purge the store refuses, inputs that arrive while a session is frozen for its
delete, a turn waiter of a dropped input. A real Host on real LMDB."""

from __future__ import annotations

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.errors import ActorError, NotFound
from sessionloop.actors.session.messages import Freeze, Thaw
from sessionloop.actors.system.pubsub import Reply
from sessionloop.eventstore import StorageFull


def no_children(_: str) -> list[str]:
    return []


def test_a_parked_session_can_be_deleted(open_host):
    host = open_host(permission_mode="acceptCalls", park_after_failures=3)
    s = host.create()
    s.run("before it broke")
    host.rt.faults.arm("before-commit", RuntimeError("gremlin"), times=3)
    for _ in range(3):
        with pytest.raises(ActorError):
            s.send("x")
    assert host.rt.deletions.delete_tree(s.id, no_children) == [s.id]
    assert [type(e.event) for e in s.events()] == [E.SessionDeleted]
    assert host.get(s.id) is None


def test_a_purge_the_store_refuses_writes_nothing_and_the_session_takes_input_again(host):
    s = host.create()
    s.run("kept")
    version = host.store.stream_version(f"session-{s.id}")
    host.rt.faults.arm("purge", StorageFull("disk full (injected inside the purge)"))
    with pytest.raises(StorageFull):
        host.rt.deletions.delete_tree(s.id, no_children)
    assert host.store.stream_version(f"session-{s.id}") == version
    assert not host.store.purged(f"session-{s.id}")
    assert s.run("after the failed delete").output_text == "echo: after the failed delete"


def test_while_frozen_for_a_delete_a_session_takes_no_input_but_a_repeated_key_gets_its_receipt(host):
    s = host.create()
    first = s.send("once", idempotency_key="k")
    s.wait(first.turn_id, 10)
    host.rt.ask(s.id, lambda r: Freeze("deleting", r))
    with pytest.raises(NotFound, match="being deleted"):
        s.send("new input")
    assert s.send("once", idempotency_key="k").state == "duplicate"
    host.rt.ask(s.id, Thaw)
    assert s.run("thawed").state == "completed"


def test_a_delete_aborts_the_running_turn_and_fails_the_waiters_of_the_queued_ones(host):
    s = host.create()
    running = s.send("!sleep 30000\nslow")
    queued = s.send("behind it")
    waiter = Reply()
    s.watch_turn(queued.turn_id, waiter)
    host.rt.deletions.delete_tree(s.id, no_children)
    assert waiter.result(5).code == "not-found"
    aborted = s.wait(running.turn_id, 5)  # its waiters heard how it ended
    assert (aborted.state, aborted.code) == ("failed", "aborted")
