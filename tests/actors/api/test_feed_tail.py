"""The feed tail behind ``loop/watch`` and ``GET /api/loop/events`` (actors/api/feed_tail.py), on a
real host: stored events in cursor order from a cursor, live deltas in place, and a cursor the
retention passes under a tail ending it with CursorExpired."""

from __future__ import annotations

import queue
import threading

import pytest

from sessionloop.actors.api.feed_tail import FeedTails
from sessionloop.actors.errors import CursorExpired


@pytest.fixture
def tails_of(open_host):
    made: list[FeedTails] = []

    def make(**options):
        host = open_host(permission_mode="acceptCalls", **options)
        host.register_app("mybot", platform="telegram", containers=["inbox"])
        tails = FeedTails(host.rt.store, host.loop_watchers, batch=3, poll_s=0.05)
        made.append(tails)
        return host, host.sessions(app="mybot"), tails

    yield make
    for tails in made:
        tails.close()


def _turn(loop, sid, text, key):
    assert loop.wait_for_turn(sid, loop.send(sid, text, idempotency_key=key).turn_id).state == "completed"


def test_a_tail_delivers_the_stored_events_after_its_cursor_then_the_live_ones_in_place(tails_of):
    host, loop, tails = tails_of()
    sid = loop.create(container_id="inbox").session_id
    for i in range(3):
        _turn(loop, sid, f"old {i}", f"k{i}")
    stored = loop.list_events(limit=100).events
    got: queue.Queue = queue.Queue()
    tail = tails.tail("mybot", stored[1].cursor, lambda e: got.put(e) or True, got.put)
    for expected in stored[2:]:
        assert got.get(timeout=5) == expected
    _turn(loop, sid, "new", "k-new")
    live = [got.get(timeout=5) for _ in range(3)]
    while live[-1].type != "turn.completed":
        live.append(got.get(timeout=5))
    types = [e.type for e in live]
    assert types[0] == "turn.started" and "assistant.delta" in types
    assert max(i for i, t in enumerate(types) if t == "assistant.delta") < types.index("assistant.message")
    tail.close()
    assert len(tails) == 0


def test_a_cursor_the_retention_passes_under_a_tail_ends_it_with_cursor_expired(tails_of):
    host, loop, tails = tails_of(feed_max_events=4)
    sid = loop.create(container_id="inbox").session_id
    _turn(loop, sid, "first", "k0")
    cursor = loop.list_events(limit=100).events[0].cursor
    assert tails.check("mybot", cursor) == cursor  # still held
    stopped = threading.Event()

    def deliver(event):  # a consumer that is slow to start: retention passes its cursor first
        stopped.wait(5)
        return True

    ended: queue.Queue = queue.Queue()
    tail = tails.tail("mybot", cursor, deliver, ended.put, begin=False)
    for i in range(3):
        _turn(loop, sid, f"more {i}", f"k{i + 1}")
    tail.begin()
    error = ended.get(timeout=5)
    stopped.set()
    assert isinstance(error, CursorExpired) and error.code == "cursor-expired"
    assert error.oldest_cursor > cursor and error.data["oldestCursor"] == str(error.oldest_cursor)
    assert tail.closed
    with pytest.raises(CursorExpired):
        tails.check("mybot", cursor)
