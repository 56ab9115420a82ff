"""How LMDB and msgspec fail, and what the store does about it (../shared/RELIABILITY.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import msgspec
import pytest

from sessionloop.eventstore import (
    EventDecodeError,
    StorageError,
    StorageFull,
    StoreLocked,
    UnknownEvent,
)
from sessionloop.eventstore.lmdb_env import ReadGate
from tests.conftest import REPO
from tests.eventstore.union import Noted, Stepped, open_test_store


def run_python(code: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, **kw)


def test_the_map_grows_by_itself_from_a_tiny_size(store_path):
    with open_test_store(store_path, durability="nosync", map_size=64 * 1024) as s:
        big = "x" * 4000
        for i in range(400):  # ~1.6 MB into a 64 KiB map
            s.append("session-a", [Noted(key=str(i), text=big)], i)
        assert s.info()["map_resizes"] >= 4
        assert s.stream_version("session-a") == 400
        assert s.read_stream("session-a", 400)[0].event.key == "399"


def test_map_growth_under_concurrent_readers_and_writers(store_path):
    with open_test_store(store_path, durability="nosync", map_size=64 * 1024) as s:
        stop = threading.Event()
        failures: list[BaseException] = []

        def reader() -> None:
            while not stop.is_set():
                try:
                    s.read_all(max(0, s.head_position - 5), 5)
                except BaseException as e:  # pragma: no cover - reported below
                    failures.append(e)

        def writer(i: int) -> None:
            for j in range(100):
                s.append(f"session-w{i}", [Noted(key=str(j), text="y" * 2000)], j)

        readers = [threading.Thread(target=reader) for _ in range(3)]
        writers = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        for t in readers + writers:
            t.start()
        for t in writers:
            t.join()
        stop.set()
        for t in readers:
            t.join()
        assert not failures
        assert s.head_position == 400 and s.info()["map_resizes"] >= 1


def test_a_map_ceiling_refuses_the_write_cleanly_and_reads_still_work(store_path):
    with open_test_store(store_path, durability="nosync", map_size=64 * 1024, max_map_size=256 * 1024) as s:
        s.append("session-a", [Stepped(step="kept")], 0)
        with pytest.raises(StorageFull, match="ceiling"):
            for i in range(1000):
                s.append("session-b", [Noted(key=str(i), text="z" * 8000)], i)
        version_b = s.stream_version("session-b")
        events_b = s.read_stream("session-b")
        assert len(events_b) == version_b  # nothing half-written
        assert s.read_stream("session-a")[0].event.step == "kept"


def test_a_second_writer_process_is_refused_with_a_clear_error(store_path):
    with open_test_store(store_path, durability="nosync") as s:
        s.append("session-a", [Stepped(step="x")], 0)
        proc = run_python(
            """
            import sys
            from sessionloop.eventstore import StoreLocked
            from tests.eventstore.union import open_test_store
            try:
                open_test_store(sys.argv[1])
            except StoreLocked as e:
                print("LOCKED:", e)
            """,
            store_path,
        )
        assert "LOCKED:" in proc.stdout, proc.stderr
        assert f"pid {os.getpid()}" in proc.stdout
        assert "already open for writing" in proc.stdout


def test_the_same_directory_cannot_be_opened_twice_for_writing_in_one_process(store_path):
    with open_test_store(store_path, durability="nosync"):
        with pytest.raises(StoreLocked):
            open_test_store(store_path, durability="nosync")


def test_a_read_only_open_in_another_process_works_while_a_writer_runs(store_path):
    with open_test_store(store_path, durability="nosync") as s:
        s.append("session-a", [Stepped(step="x")], 0)
        proc = run_python(
            """
            import sys
            from sessionloop.eventstore import ReadOnlyStore
            from tests.eventstore.union import Stepped, open_test_store
            with open_test_store(sys.argv[1], readonly=True) as ro:
                print("READ", ro.read_stream("session-a")[0].event.step)
                try:
                    ro.append("session-a", [Stepped(step="y")], 1)
                except ReadOnlyStore as e:
                    print("REFUSED", e)
            """,
            store_path,
        )
        assert "READ x" in proc.stdout, proc.stderr
        assert "REFUSED" in proc.stdout and "read-only" in proc.stdout
        assert s.stream_version("session-a") == 1


def test_read_only_open_of_a_missing_store_is_a_clear_error(tmp_path):
    with pytest.raises(StorageError, match="no event store"):
        open_test_store(str(tmp_path / "nothing"), readonly=True)


def _reader_process(store_path: str, hold_txn: bool) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            """
            import sys, time, lmdb
            env = lmdb.open(sys.argv[1], max_dbs=10, readonly=True)
            txn = env.begin() if sys.argv[2] == "1" else None
            print("READY", flush=True)
            time.sleep(60)
            """), store_path, "1" if hold_txn else "0"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "READY"
    return proc


def test_stale_reader_slots_of_a_killed_process_are_cleared_at_open(store_path):
    with open_test_store(store_path, durability="nosync") as s:
        s.append("session-a", [Stepped(step="x")], 0)
    # A live process keeps the lock file in use (LMDB resets the reader table when the last
    # process leaves), and a killed one leaves its reader slot behind.
    survivor = _reader_process(store_path, hold_txn=False)
    victim = _reader_process(store_path, hold_txn=True)
    try:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        with open_test_store(store_path, durability="nosync") as s:
            assert s.info()["stale_readers_cleared"] >= 1
            s.append("session-a", [Stepped(step="y")], 1)
    finally:
        survivor.kill()
        survivor.wait()


def test_a_writer_killed_mid_transaction_leaves_nothing_and_the_store_opens(store_path):
    with open_test_store(store_path, durability="sync") as s:
        s.append("session-a", [Stepped(step="committed")], 0)
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            """
            import sys, time, lmdb
            env = lmdb.open(sys.argv[1], max_dbs=10)
            log = env.open_db(b"log")
            txn = env.begin(write=True)
            txn.put(b"\\xff" * 8, b"garbage", db=log)
            print("WRITING", flush=True)
            time.sleep(60)
            """), store_path],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "WRITING"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with open_test_store(store_path, durability="sync") as s:
        assert [e.event.step for e in s.read_all()] == ["committed"]
        assert s.append("session-a", [Stepped(step="next")], 1).first_position == 2


def test_a_payload_that_is_not_an_event_raises_a_decode_error_naming_stream_and_version(store):
    store.append("session-a", [Stepped(step="ok")], 0)
    store.append_encoded("session-a", b"session-a", [msgspec.msgpack.encode([1, 2, 3])], [], 1)
    with pytest.raises(EventDecodeError) as info:
        store.read_stream("session-a")
    assert info.value.stream == "session-a" and info.value.version == 2
    assert "session-a" in str(info.value) and "event 2" in str(info.value)


def test_a_corrupted_commit_record_raises_a_decode_error_naming_the_stream(store):
    store.append("session-a", [Stepped(step="ok")], 0)
    # Raw bytes spliced into the record make the record itself malformed on disk.
    store.append_encoded("session-a", b"session-a", [b"\xc1\xc1 not msgpack"], [], 1)
    with pytest.raises(EventDecodeError) as info:
        store.read_stream("session-a")
    assert info.value.stream == "session-a" and info.value.version == 2
    with pytest.raises(EventDecodeError, match="position 2"):
        store.read_all(1)


def test_a_known_tag_with_a_broken_body_is_a_decode_error(store):
    bad = msgspec.msgpack.encode({"type": "test.stepped", "step": 42})
    store.append_encoded("session-a", b"session-a", [bad], [], 0)
    with pytest.raises(EventDecodeError, match="step"):
        store.read_stream("session-a")


def test_an_unknown_tag_decodes_to_an_unknown_event_that_is_kept(store):
    future = msgspec.msgpack.encode({"type": "session.teleported", "at": 7, "where": "mars"})
    store.append_encoded("session-a", b"session-a", [future], [], 0)
    store.append("session-a", [Stepped(step="after")], 1)
    events = store.read_stream("session-a")
    assert isinstance(events[0].event, UnknownEvent)
    assert events[0].event.type == "session.teleported" and events[0].event.at == 7
    assert msgspec.msgpack.decode(events[0].event.raw)["where"] == "mars"
    assert events[1].event.step == "after"


def test_the_read_gate_keeps_new_reads_out_of_a_resize_and_lets_a_read_under_way_finish_nested():
    """A resize waits for the reads under way (a nested one among them: it must not wait for the
    resize its own outer read holds up); a read that starts meanwhile waits for the resize."""
    gate = ReadGate()
    order: list[str] = []
    inside, go = threading.Event(), threading.Event()

    def long_read() -> None:
        with gate:
            inside.set()
            go.wait(5)
            with gate:
                order.append("nested")
            order.append("outer done")

    def late_read() -> None:
        with gate:
            order.append("late read")

    a = threading.Thread(target=long_read)
    a.start()
    assert inside.wait(5)
    resize = threading.Thread(target=gate.exclusive, args=(lambda: order.append("resize"),))
    resize.start()
    time.sleep(0.1)
    assert order == []  # the resize waits for the read under way
    late = threading.Thread(target=late_read)
    late.start()
    time.sleep(0.1)
    assert order == []  # and a new read waits for the resize
    go.set()
    for t in (a, resize, late):
        t.join(5)
        assert not t.is_alive()
    assert order == ["nested", "outer done", "resize", "late read"]
