"""The store's own observations of its group commits (``EventStore.commit_stats``), which the
metrics turn into histograms: one commit duration and one batch size per write transaction, one
latency per acknowledged append, all agreeing with the store's counters."""

from __future__ import annotations

import threading
import time

import pytest

from sessionloop.eventstore import EventStore, StorageFull, WrongExpectedVersion
from sessionloop.eventstore.groupcommit import BATCH_SIZE_BOUNDS, Observations
from tests.eventstore.union import Noted, Stepped, open_test_store


def agree_with_counters(store: EventStore) -> dict:
    stats, info = store.commit_stats(), store.info()
    assert stats["commit_seconds"].count == info["batches"]
    assert stats["batch_size"].count == info["batches"]
    assert stats["batch_size"].sum == info["requests"]
    return stats


def test_buckets_are_prometheus_le_buckets_and_the_last_one_is_inf():
    h = Observations((1, 2, 4))
    for v in (0, 1, 1.5, 2, 4, 4.01, 1000):
        h.observe(v)
    snap = h.snapshot()
    assert snap.counts == (2, 2, 1, 2)  # <=1: 0, 1; <=2: 1.5, 2; <=4: 4; +Inf: 4.01, 1000
    assert snap.count == 7 and snap.sum == pytest.approx(1012.51)
    h.observe(3)
    assert snap.counts == (2, 2, 1, 2)  # a snapshot is a copy


def test_sequential_appends_one_batch_each_every_append_timed_snapshots_and_failures_not(store):
    for i in range(50):
        store.append("session-a", [Stepped(step=str(i))], i)
    stats = agree_with_counters(store)
    assert stats["append_seconds"].count == stats["commit_seconds"].count == 50
    # a lone writer's append waits for its own transaction (and a little more): never less
    assert stats["append_seconds"].sum >= stats["commit_seconds"].sum > 0
    epoch = store.next_epoch()  # a write request, not an append
    with pytest.raises(WrongExpectedVersion):
        store.append("session-a", [Stepped(step="late")], 3)
    store.save_snapshot("session-a", 50, b"state")
    stats = agree_with_counters(store)
    assert epoch >= 1 and store.info()["requests"] == 50 + 3
    assert stats["batch_size"].count == 53 and stats["batch_size"].counts[0] == 53  # all of size 1 (le=1)
    assert stats["append_seconds"].count == 50  # not the epoch, the refused append or the snapshot
    assert stats["commit_seconds"].sum < 10


def test_concurrent_appends_are_grouped_and_every_one_is_counted(store):
    threads, per_thread = 16, 100
    start = threading.Barrier(threads)

    def writer(i: int) -> None:
        start.wait()
        for j in range(per_thread):
            store.append(f"session-t{i}", [Stepped(step=f"{i}:{j}")], j)

    workers = [threading.Thread(target=writer, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stats = agree_with_counters(store)
    assert stats["append_seconds"].count == threads * per_thread == store.info()["requests"]
    assert stats["batch_size"].sum == threads * per_thread
    assert stats["batch_size"].counts[0] < stats["batch_size"].count  # some groups held several
    assert stats["batch_size"].bounds == BATCH_SIZE_BOUNDS and stats["batch_size"].counts[-1] == 0  # <= 512


def test_async_appends_are_timed_from_submission_to_the_callback(store):
    n = 200
    done = threading.Event()
    results: list = []
    lock = threading.Lock()
    submitted = time.perf_counter()

    def on_done(result, error) -> None:
        with lock:
            results.append((result, error))
            if len(results) == n:
                done.set()

    for i in range(n):
        store.append_async(f"session-x{i % 7}", [Stepped(step=str(i))], -1, on_done)
    assert done.wait(30)
    elapsed = time.perf_counter() - submitted
    assert all(error is None for _, error in results)
    stats = agree_with_counters(store)
    assert stats["append_seconds"].count == n
    assert stats["append_seconds"].sum <= n * elapsed  # each one inside the window it ran in
    assert stats["batch_size"].sum == n


def test_a_failed_transaction_is_a_timed_batch_but_not_an_acknowledged_append(store_path):
    with open_test_store(store_path, durability="nosync", map_size=64 * 1024, max_map_size=128 * 1024) as s:
        appended = 0
        with pytest.raises(StorageFull):
            for i in range(1000):
                s.append("session-b", [Noted(key=str(i), text="z" * 8000)], i)
                appended += 1
        stats = agree_with_counters(s)
        assert stats["append_seconds"].count == appended == s.stream_version("session-b")
        assert stats["batch_size"].count == appended + 1  # the refused group was one more transaction


def test_sync_durability_times_the_fsync_in_the_commit(store_path):
    """In ``sync`` the commit (and so the append) includes the fsync; both are observed as-is."""
    with open_test_store(store_path, durability="sync") as s:
        for i in range(20):
            s.append("session-s", [Stepped(step=str(i))], i)
        stats = agree_with_counters(s)
        assert stats["append_seconds"].count == 20
        assert stats["append_seconds"].sum >= stats["commit_seconds"].sum > 0
