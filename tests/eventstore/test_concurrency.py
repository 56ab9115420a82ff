"""Many threads appending at once: group commit must lose, duplicate or reorder nothing."""

from __future__ import annotations

import random
import threading

from eventstore import WrongExpectedVersion
from eventstore.events import TurnStarted


def test_many_threads_on_many_streams_lose_and_duplicate_nothing(store):
    streams = [f"session-s{i}" for i in range(100)]
    per_thread = 200
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for j in range(per_thread):
                stream = rng.choice(streams)
                store.append(stream, [TurnStarted(turn_id=f"{seed}:{j}:{k}") for k in range(rng.randint(1, 4))])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    all_events = list(store.iter_all())
    ids = [e.event.turn_id for e in all_events]
    assert len(ids) == len(set(ids))
    assert [e.position for e in all_events] == list(range(1, len(all_events) + 1))
    # per-stream versions are contiguous and follow global order
    for stream in streams:
        events = store.read_stream(stream)
        assert [e.version for e in events] == list(range(1, len(events) + 1))
        positions = [e.position for e in events]
        assert positions == sorted(positions)
    # each thread's own writes to a stream keep their order
    assert store.info()["batches"] < store.info()["requests"]


def test_racing_writers_with_expected_versions_get_exactly_one_success_per_version(store):
    """Two actor instances for one session (RELIABILITY: a restarted actor can overlap its old one)."""
    stream = "session-contended"
    wins: dict[int, list[int]] = {}
    lock = threading.Lock()

    def writer(me: int) -> None:
        for _ in range(150):
            version = store.stream_version(stream)
            try:
                result = store.append(stream, [TurnStarted(turn_id=f"w{me}")], version)
            except WrongExpectedVersion:
                continue
            with lock:
                wins.setdefault(result.first_version, []).append(me)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = store.stream_version(stream)
    assert final == len(wins)
    assert all(len(winners) == 1 for winners in wins.values())
    assert sorted(wins) == list(range(1, final + 1))


def test_concurrent_appends_are_grouped_into_fewer_transactions(store):
    barrier = threading.Barrier(50)

    def writer(i: int) -> None:
        barrier.wait()
        for j in range(20):
            store.append(f"session-g{i}", [TurnStarted(turn_id=str(j))], j)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = store.info()
    assert store.head_position == 1000
    assert info["batches"] < 1000
