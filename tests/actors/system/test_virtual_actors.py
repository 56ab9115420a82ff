"""Virtual actors: activation, passivation without losing messages, the live cap, snapshots."""

from __future__ import annotations

import random
import threading
import time

from sessionloop.actors.session.state import decode_state, evolve, new_state


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_an_idle_session_is_passivated_and_reactivated_transparently(open_host):
    host = open_host(permission_mode="acceptCalls", idle_timeout_s=0.2)
    s = host.create()
    s.run("before")
    assert wait_until(lambda: host.rt.directory.live_count() == 0)
    assert host.rt.directory.passivations >= 1
    assert s.run("after").output_text == "echo: after"
    assert [m.content for m in s.snapshot().messages] == ["before", "echo: before", "after", "echo: after"]


def test_messages_racing_passivation_are_never_lost(open_host):
    host = open_host(permission_mode="acceptCalls", idle_timeout_s=0.01)
    sessions = [host.create() for _ in range(8)]
    receipts = []
    lock = threading.Lock()

    def sender(s) -> None:
        rng = random.Random(s.id)
        for i in range(25):
            r = s.send(f"m{i}")
            with lock:
                receipts.append((s, r))
            time.sleep(rng.choice([0, 0.001, 0.02, 0.03]))  # idle gaps for the sweeper to find

    threads = [threading.Thread(target=sender, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s, r in receipts:
        assert s.wait(r.turn_id, 10).state == "completed"
    assert host.rt.directory.passivations > 0, "the race was not exercised"
    for s in sessions:
        assert len(s.snapshot().turns) == 25


def test_live_actors_are_capped(open_host):
    host = open_host(permission_mode="acceptCalls", max_live=5)
    sessions = [host.create() for _ in range(20)]
    for s in sessions:
        s.run("x")
    assert wait_until(lambda: host.rt.directory.live_count() <= 5)
    assert all(s.run("again").state == "completed" for s in sessions)


def test_a_session_with_a_running_turn_is_not_passivated(open_host):
    host = open_host(permission_mode="acceptCalls", idle_timeout_s=0.05)
    s = host.create()
    receipt = s.send("!sleep 500\nslow")
    time.sleep(0.3)
    assert s.id in host.rt.directory.live_ids()
    assert s.wait(receipt.turn_id, 5).state == "completed"


def test_snapshots_bound_activation_and_equal_the_full_fold(open_host):
    host = open_host(permission_mode="acceptCalls", snapshot_every=20, idle_timeout_s=0.1)
    s = host.create()
    for i in range(15):
        s.run(f"m{i}")
    snap = host.store.load_snapshot(f"session-{s.id}")
    assert snap is not None and snap.version >= 20
    full = new_state(s.id)
    for recorded in s.events():
        evolve(full, recorded.event)
    assert wait_until(lambda: host.rt.directory.live_count() == 0)
    assert s.snapshot() == full
    partial = decode_state(host.store.load_snapshot(f"session-{s.id}").state)
    assert partial.version <= full.version
