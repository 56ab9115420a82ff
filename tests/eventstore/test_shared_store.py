"""One environment, several writing processes (``serve --workers``): each owns a share of the shards.

Real processes: the test takes the directory's writer lock as ``serve`` does and starts workers
that inherit its descriptor; each worker opens the store with its shards and writes only them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from sessionloop.eventstore import StoreLocked
from sessionloop.eventstore.lmdb_env import take_lock
from tests.eventstore.union import Opened, Stepped, open_test_store

SHARDS = 16

#: a worker: opens the store with its shards and the inherited lock, writes streams of its shards
#: (a third of them with an idempotency claim of their own), then reports what it wrote and what it
#: read of the others
WORKER = textwrap.dedent("""
    import json, sys
    from sessionloop.eventstore import IdempotencyClaim
    from sessionloop.eventstore.keys import shard_of
    from tests.eventstore.union import Opened, Stepped, open_test_store
    path = sys.argv[1]
    fd, index, count, streams = (int(a) for a in sys.argv[2:6])
    owned = frozenset(k for k in range(16) if k % count == index)
    store = open_test_store(path, durability="nosync", owned_shards=owned, lock_fd=fd)
    mine = [s for s in (f"item-{n}" for n in range(streams)) if shard_of(s, 16) in owned]
    receipts = {}
    for round in range(3):
        for n, stream in enumerate(mine):
            store.append(stream, [Stepped(step=f"{round}")], round)
            if round == 0 and n % 3 == 0:
                claim = IdempotencyClaim("app:shared", f"key-{stream}", "same-request")
                r = store.append(stream + ".claimed", [Opened(name=stream)], idempotency=claim)
                receipts[stream] = [r.stream, r.duplicate]
    print(json.dumps({"mine": mine, "receipts": receipts}), flush=True)
    sys.stdin.readline()  # wait until every worker wrote: then read the others' streams
    seen = {s: store.stream_version(s) for s in (f"item-{n}" for n in range(streams))}
    print(json.dumps({"seen": seen, "head": store.head_position}), flush=True)
    store.close()
""")


def _start_script(script: str, path: str, fd: int, *args: str) -> subprocess.Popen[str]:
    """``script`` in a process of its own that inherits the lock's descriptor ``fd``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.Popen([sys.executable, "-c", script, path, str(fd), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pass_fds=(fd,), cwd=root)


def _start(path: str, fd: int, index: int, count: int, streams: int) -> subprocess.Popen[str]:
    return _start_script(WORKER, path, fd, str(index), str(count), str(streams))


def test_two_worker_processes_write_their_own_shards_of_one_store_and_read_each_others(store_path):
    open_test_store(store_path, durability="nosync", shards=SHARDS).close()  # the store exists
    fd = take_lock(store_path)
    try:
        workers = [_start(store_path, fd, i, 2, 300) for i in range(2)]
        first = [json.loads(w.stdout.readline() or "null") for w in workers]
        assert all(first), [w.stderr.read() for w in workers]
        for w in workers:
            w.stdin.write("\n")
            w.stdin.flush()
        second = [json.loads(w.stdout.readline()) for w in workers]
        for w in workers:
            assert w.wait(30) == 0, w.stderr.read()
    finally:
        os.close(fd)
    mine = [set(f["mine"]) for f in first]
    assert not mine[0] & mine[1] and len(mine[0] | mine[1]) == 300
    for s in second:  # each worker reads every stream, the other's too, at its last version
        assert s["seen"] == {f"item-{n}": 3 for n in range(300)}
    store = open_test_store(store_path, durability="nosync")
    try:
        events = list(store.iter_all())
        claimed = sum(len(f["receipts"]) for f in first)
        assert len(events) == 900 + claimed
        # one log: positions 1..N with no gap and no position twice, although two processes appended
        assert [e.position for e in events] == list(range(1, len(events) + 1))
        assert second[0]["head"] == second[1]["head"] == len(events)
        for f in first:  # a claim is kept once per scope and key; workers used different keys here
            assert all(not dup for _, dup in f["receipts"].values())
    finally:
        store.close()


def test_a_claim_both_workers_make_is_stored_once_and_the_second_gets_the_first_receipt(store_path):
    script = textwrap.dedent("""
        import json, sys
        from sessionloop.eventstore import IdempotencyClaim
        from tests.eventstore.union import Opened, open_test_store
        path, fd, index = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
        owned = frozenset(k for k in range(16) if k % 2 == index)
        store = open_test_store(path, durability="nosync", owned_shards=owned, lock_fd=fd)
        stream = next(f"item-{n}" for n in range(100) if store.shard_of(f"item-{n}") in owned)
        sys.stdin.readline()
        out = []
        for n in range(200):
            r = store.append(f"{stream}.{n}", [Opened(name=str(index))],
                             idempotency=IdempotencyClaim("app:shared", f"key-{n}", "same-request"))
            out.append([r.stream, r.duplicate])
        print(json.dumps(out), flush=True)
        store.close()
    """)
    open_test_store(store_path, durability="nosync", shards=SHARDS).close()
    fd = take_lock(store_path)
    try:
        workers = [_start_script(script, store_path, fd, str(i)) for i in range(2)]
        for w in workers:  # both start at once: their claims race
            w.stdin.write("\n")
            w.stdin.flush()
        results = [json.loads(w.stdout.readline() or "null") for w in workers]
        for w in workers:
            assert w.wait(30) == 0, w.stderr.read()
    finally:
        os.close(fd)
    assert all(results)
    for n in range(200):
        (s0, dup0), (s1, dup1) = results[0][n], results[1][n]
        assert dup0 != dup1, n  # exactly one of the two wrote it
        assert s0 == s1  # and the other got the same receipt: the stream it was written to
    store = open_test_store(store_path, durability="nosync")
    try:
        assert len(list(store.iter_all())) == 200  # no claim written twice
    finally:
        store.close()


RACER = textwrap.dedent("""
    import json, sys
    from sessionloop.eventstore import ANY_VERSION, WrongExpectedVersion
    from tests.eventstore.union import Opened, Stepped, open_test_store
    path, fd, index = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    owned = frozenset(k for k in range(16) if k % 2 == index)
    store = open_test_store(path, durability="nosync", owned_shards=owned, lock_fd=fd)
    sys.stdin.readline()
    firsts = []
    for n in range(100):  # both create the same streams: one wins each, whoever's shard it is
        try:
            store.append(f"place-{n}", [Opened(name=str(index))], 0)
            firsts.append(n)
        except WrongExpectedVersion:
            pass
        for _ in range(5):
            store.append(f"place-{n}", [Stepped(step=str(index))], ANY_VERSION)
    print(json.dumps(firsts), flush=True)
    store.close()
""")


def test_two_workers_writing_the_same_streams_keep_one_history_each_with_every_version_once(store_path):
    """Any worker may write any stream (a place a session was seen in, say): the expected
    version is checked against what both wrote, and versions never collide."""
    open_test_store(store_path, durability="nosync", shards=SHARDS).close()
    fd = take_lock(store_path)
    try:
        workers = [_start_script(RACER, store_path, fd, str(i)) for i in range(2)]
        for w in workers:
            w.stdin.write("\n")
            w.stdin.flush()
        firsts = [json.loads(w.stdout.readline() or "null") for w in workers]
        for w in workers:
            assert w.wait(60) == 0, w.stderr.read()
    finally:
        os.close(fd)
    assert sorted(firsts[0] + firsts[1]) == list(range(100))  # each stream created exactly once
    store = open_test_store(store_path, durability="nosync")
    try:
        for n in range(100):
            recorded = store.read_stream(f"place-{n}")
            assert [r.version for r in recorded] == list(range(1, 12))
            assert isinstance(recorded[0].event, Opened)
            assert sorted(r.event.step for r in recorded[1:]) == ["0"] * 5 + ["1"] * 5
    finally:
        store.close()


def test_a_worker_given_another_file_or_no_lock_is_refused_and_a_second_server_is_locked_out(store_path, tmp_path):
    open_test_store(store_path, durability="nosync", shards=SHARDS).close()
    other = os.open(str(tmp_path / "not-the-lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with pytest.raises(StoreLocked, match="is not"):
            open_test_store(store_path, durability="nosync", owned_shards=frozenset({0}), lock_fd=other)
    finally:
        os.close(other)
    fd = take_lock(store_path)
    try:
        worker = open_test_store(store_path, durability="nosync", owned_shards=frozenset({0}), lock_fd=os.dup(fd))
        try:
            with pytest.raises(StoreLocked):  # a server of its own: the workers' parent holds the lock
                open_test_store(store_path, durability="nosync")
        finally:
            worker.close()
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="below the store's 16"):
        open_test_store(store_path, durability="nosync", owned_shards=frozenset({16}))


def test_a_shared_nosync_store_commits_async_appends_on_the_writer_thread(store_path):
    """Another process may hold LMDB's write lock: the caller (a pool thread) must not wait for it."""
    open_test_store(store_path, durability="nosync", shards=SHARDS).close()
    fd = take_lock(store_path)
    try:
        worker = open_test_store(store_path, durability="nosync", owned_shards=frozenset(range(SHARDS)),
                                 lock_fd=os.dup(fd))
        try:
            told: list = []
            arrived = threading.Event()

            def done(result, error) -> None:
                told.append((threading.current_thread().name, error))
                arrived.set()

            worker.append_async("item-shared", [Stepped(step="a")], 0, done)
            assert arrived.wait(5)
            assert told == [("sessionloop-writer", None)]
        finally:
            worker.close()
    finally:
        os.close(fd)
