"""Many threads appending at once: group commit must lose, duplicate or reorder nothing."""

from __future__ import annotations

import random
import threading

import pytest

from sessionloop.eventstore import StoreClosed, WrongExpectedVersion
from tests.eventstore.union import Stepped, open_test_store


def test_many_threads_on_many_streams_lose_and_duplicate_nothing(store):
    streams = [f"session-s{i}" for i in range(100)]
    per_thread = 200
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for j in range(per_thread):
                stream = rng.choice(streams)
                store.append(stream, [Stepped(step=f"{seed}:{j}:{k}") for k in range(rng.randint(1, 4))])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    all_events = list(store.iter_all())
    ids = [e.event.step for e in all_events]
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
                result = store.append(stream, [Stepped(step=f"w{me}")], version)
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
            store.append(f"session-g{i}", [Stepped(step=str(j))], j)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = store.info()
    assert store.head_position == 1000
    assert info["batches"] < 1000


def test_async_appends_from_many_threads_are_committed_in_order_and_each_is_told_once(store):
    outcomes: list = []
    lock = threading.Lock()
    all_done = threading.Event()
    total = 8 * 100

    def done(result, error) -> None:
        with lock:
            outcomes.append((result, error))
            if len(outcomes) == total:
                all_done.set()

    def writer(i: int) -> None:
        for j in range(100):  # each thread owns a stream and chains expected versions unseen
            store.append_async(f"session-a{i}", [Stepped(step=f"{i}:{j}")], j, done)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all_done.wait(10), f"{len(outcomes)} of {total} callbacks arrived"
    assert all(error is None for _, error in outcomes)
    for i in range(8):
        assert [e.event.step for e in store.read_stream(f"session-a{i}")] == [f"{i}:{j}" for j in range(100)]
    assert store.info()["batches"] < store.info()["requests"]


def test_an_async_append_with_a_wrong_expected_version_is_told_the_error_and_writes_nothing(store):
    store.append("session-w", [Stepped(step="a")])
    got: list = []
    arrived = threading.Event()

    def done(result, error) -> None:
        got.append((result, error))
        arrived.set()

    store.append_async("session-w", [Stepped(step="b")], 0, done)
    assert arrived.wait(5)
    result, error = got[0]
    assert result is None and isinstance(error, WrongExpectedVersion)
    assert [e.event.step for e in store.read_stream("session-w")] == ["a"]


def test_async_and_waiting_appends_mixed_all_commit(store):
    """A waiting caller behind asynchronous requests is woken by the writer thread and vice versa."""
    arrived = threading.Semaphore(0)

    def done(result, error) -> None:
        assert error is None
        arrived.release()

    def mixed(i: int) -> None:
        for j in range(50):
            store.append_async(f"session-m{i}", [Stepped(step=f"async{j}")], 2 * j, done)
            store.append(f"session-n{i}", [Stepped(step=f"sync{j}")], j)
            store.append_async(f"session-m{i}", [Stepped(step=f"async{j}b")], 2 * j + 1, done)

    threads = [threading.Thread(target=mixed, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in range(6 * 100):
        assert arrived.acquire(timeout=10)
    for i in range(6):
        assert store.stream_version(f"session-m{i}") == 100
        assert store.stream_version(f"session-n{i}") == 50


def test_async_append_refuses_bad_input_and_a_closed_store_at_once(store):
    with pytest.raises(ValueError, match="at least one event"):
        store.append_async("session-x", [], 0, lambda r, e: None)
    store.close()
    with pytest.raises(StoreClosed):
        store.append_async("session-x", [Stepped(step="a")], 0, lambda r, e: None)


@pytest.mark.parametrize("durability", ["nosync", "sync"])
def test_a_lone_async_append_is_committed_on_its_own_thread_only_when_commits_do_not_wait_for_the_disk(
        store_path, durability):
    """nosync: no group under way, so the caller leads its own (no hand-off to the writer thread and
    back); sync: the writer thread waits for the disk, the caller goes on at once."""
    s = open_test_store(store_path, durability=durability)
    try:
        told: list = []
        arrived = threading.Event()

        def done(result, error) -> None:
            told.append((threading.current_thread(), result, error))
            arrived.set()

        s.append_async("session-lone", [Stepped(step="a")], 0, done)
        told_before_return = bool(told)
        assert arrived.wait(5)
        thread, result, error = told[0]
        assert error is None and result.first_version == 1
        assert [e.event.step for e in s.read_stream("session-lone")] == ["a"]
        writers = [t.name for t in threading.enumerate() if t.name == "sessionloop-writer"]
        if durability == "nosync":
            assert told_before_return and thread is threading.current_thread()
        else:
            assert thread.name == "sessionloop-writer" and writers
    finally:
        s.close()


def test_async_appends_that_arrive_while_an_inline_group_commits_are_led_by_the_writer(store):
    """nosync: the first caller leads; the others queue behind its group, and the writer thread
    leads what they queued (none waits for a caller that went on with other work)."""
    n = 200
    arrived = threading.Semaphore(0)
    threads_told: set[str] = set()

    def done(result, error) -> None:
        assert error is None
        threads_told.add(threading.current_thread().name)
        arrived.release()

    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        barrier.wait()
        for j in range(n // 8):
            store.append_async(f"session-i{i}", [Stepped(step=f"{i}:{j}")], j, done)

    threads = [threading.Thread(target=writer, args=(i,), name=f"caller-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in range(n):
        assert arrived.acquire(timeout=10)
    for i in range(8):
        assert [e.event.step for e in store.read_stream(f"session-i{i}")] == [f"{i}:{j}" for j in range(n // 8)]
    assert store.info()["batches"] < store.info()["requests"]
    assert any(name.startswith("caller-") for name in threads_told)
