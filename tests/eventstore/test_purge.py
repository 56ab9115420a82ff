"""``EventStore.purge``: the one write that takes a partition's events out of the store (deleting
a session, seed 004 "清空它们的消息历史"), in one transaction, leaving a content-free tombstone.

Real LMDB in temporary directories; the SIGKILL test kills a real process in the middle of the
purge of a session with many events.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

import lmdb
import pytest

from sessionloop.eventstore import (
    ANY_VERSION,
    EventStore,
    IdempotencyClaim,
    StreamDeleted,
    WrongExpectedVersion,
    request_hash,
)
from sessionloop.eventstore.codec import encode_event
from tests.conftest import REPO
from tests.eventstore.union import Erased, Finished, Noted, Opened, Stepped, Touched, open_test_store

SECRET = "the secret of the purged session"
PARTITION = ["session", "approval", "task"]


def fill(store: EventStore, sid: str = "s1", turns: int = 3) -> None:
    """A session with inputs (idempotent, feed-indexed), an approval, a task, a snapshot, flags."""
    stream = f"session-{sid}"
    store.append(stream, [Opened(at=1, name=sid, title=SECRET)], 0, feed="bot",
                 meta=b"listing with " + SECRET.encode(), flags={"active": True})
    for i in range(turns):
        store.append(stream, [Noted(at=2, key=f"i{i}", text=f"{SECRET} {i}"),
                              Stepped(at=2, step=f"t{i}"),
                              Finished(at=3, step=f"t{i}", output=f"echo: {SECRET}")],
                     ANY_VERSION, idempotency=IdempotencyClaim(f"app:bot:{sid}", f"k{i}",
                                                               request_hash({"text": f"{SECRET} {i}"}), b"r"),
                     feed="bot")
    store.save_snapshot(stream, store.stream_version(stream), SECRET.encode(), 2,
                        {0: f"part 0 {SECRET}".encode(), 1: f"part 1 {SECRET}".encode()})
    store.append(f"approval-{sid}.t0.c1", [Noted(at=4, key=f"{sid}.t0.c1", text=f"echo {SECRET}")], 0,
                 flags={"approval-pending": True})
    store.append(f"task-{sid}.c2.t1", [Noted(at=5, key=f"{sid}.c2.t1", text="exec")], 0,
                 flags={"task-running": True})


def purge(store: EventStore, sid: str = "s1", **kw) -> object:
    return store.purge(f"session-{sid}", [Erased(at=99)], ANY_VERSION, categories=PARTITION, **kw)


def test_a_purge_leaves_the_tombstone_as_the_streams_only_event_at_the_next_version(store):
    fill(store)
    before = store.stream_version("session-s1")
    result = purge(store, meta=b"tombstone")
    events = store.read_stream("session-s1")
    assert [type(e.event) for e in events] == [Erased]
    assert events[0].version == before + 1 == store.stream_version("session-s1")  # versions are never reused
    assert result.tombstone.last_version == before + 1
    assert result.streams == ["approval-s1.t0.c1", "session-s1", "task-s1.c2.t1"]
    assert result.events == before + 2 and result.records == 6
    assert store.stream_meta("session-s1") == b"tombstone"
    assert store.purged("session-s1") and store.purged("task-s1.anything")


def test_a_purge_empties_the_approval_and_task_streams_and_not_a_session_whose_id_extends_the_purged_one(store):
    fill(store, "s1")
    fill(store, "s12")  # "session-s12" and "approval-s12..." sort right after the purged ones
    purge(store, "s1")
    assert store.read_stream("approval-s1.t0.c1") == [] and store.read_stream("task-s1.c2.t1") == []
    assert store.list_streams("approval").streams == ["approval-s12.t0.c1"]
    assert store.list_streams("task").streams == ["task-s12.c2.t1"]
    assert store.list_streams("session").streams == ["session-s1", "session-s12"]  # the tombstone stays listed
    assert len(store.read_stream("session-s12")) == 1 + 3 * 3
    assert not store.purged("session-s12")


def test_a_purge_takes_the_snapshot_the_flags_and_the_feed_entries_with_the_records(store):
    fill(store)
    fill(store, "other")
    feed_before = [e.stream for e in store.read_feed("bot", 0, 1000)]
    purge(store, flags={"files-pending": True})
    assert store.load_snapshot("session-s1") is None
    assert store.load_snapshot("session-other").parts == (f"part 0 {SECRET}".encode(), f"part 1 {SECRET}".encode())
    assert store.flagged("active") == ["session-other"]
    assert store.flagged("approval-pending") == ["approval-other.t0.c1"]
    assert store.flagged("task-running") == ["task-other.c2.t1"]
    assert store.flagged("files-pending") == ["session-s1"]
    assert "session-s1" in feed_before
    assert {e.stream for e in store.read_feed("bot", 0, 1000)} == {"session-other"}
    assert store.audit() == []  # the feed count shrank with its entries


def test_no_event_of_the_purged_partition_is_left_in_the_global_log_and_its_readers_skip_the_gap(store):
    fill(store)
    store.append("session-after", [Opened(at=7, name="after")], 0)
    head = store.head_position
    purge(store)
    assert store.head_position == head + 1  # the tombstone comes after everything: the head never goes back
    log = list(store.iter_all(0, page=2))
    assert [(e.stream, type(e.event)) for e in log] == [("session-after", Opened),
                                                        ("session-s1", Erased)]
    assert store.read_all(0, 1)[0].stream == "session-after"  # a page over the gap still fills
    assert all(store.event_at(p) is None for p in range(1, head))  # purged positions read as absent
    assert SECRET not in "".join(line.decode() for line in store.export_jsonl("session-s1"))


def test_every_append_to_a_purged_partition_is_refused_even_after_the_store_is_reopened(store_path):
    store = open_test_store(store_path, durability="nosync")
    fill(store)
    version = store.stream_version("session-s1")
    purge(store)
    for stream in ("session-s1", "approval-s1.t0.c1", "task-s1.c9.t9"):
        with pytest.raises(StreamDeleted) as info:
            store.append(stream, [Touched(at=1)], ANY_VERSION)
        assert info.value.stream == stream and info.value.code == "not-found"
    with pytest.raises(StreamDeleted):  # a stale writer with the version it last knew
        store.append("session-s1", [Touched(at=1)], version)
    with pytest.raises(StreamDeleted):  # purging twice
        purge(store)
    store.close()
    store = open_test_store(store_path, durability="nosync")
    try:
        with pytest.raises(StreamDeleted):
            store.append("session-s1", [Touched(at=1)], ANY_VERSION)
        store.append("session-s2", [Touched(at=1)], 0)  # other partitions write on
        assert [type(e.event) for e in store.read_stream("session-s1")] == [Erased]
    finally:
        store.close()


def test_a_retried_idempotency_key_of_a_purged_append_is_refused_and_stays_refused_after_an_index_rebuild(store):
    fill(store)
    key = IdempotencyClaim("app:bot:s1", "k1", request_hash({"text": f"{SECRET} 1"}), b"r")
    assert store.lookup_claim(key) is not None
    purge(store)
    for _ in range(2):
        with pytest.raises(StreamDeleted):
            store.lookup_claim(key)
        with pytest.raises(StreamDeleted):  # the same key to a new stream: not written again
            store.append("session-new", [Touched(at=1)], 0, idempotency=key)
        assert store.get_receipt("app:bot:s1", "k1") is None  # no receipt is kept
        assert store.stream_version("session-new") == 0
        assert store.audit() == []  # erased entries hold no scope, key, hash or receipt
        assert store.rebuild_idempotency() == 3  # the tombstone lists the erased claims


def test_a_purge_with_a_wrong_expected_version_writes_nothing(store):
    fill(store)
    head, version = store.head_position, store.stream_version("session-s1")
    with pytest.raises(WrongExpectedVersion):
        store.purge("session-s1", [Erased(at=1)], version - 1, categories=PARTITION)
    assert store.head_position == head and not store.purged("session-s1")
    assert len(store.read_stream("session-s1")) == version
    assert store.read_stream("task-s1.c2.t1") != [] and store.load_snapshot("session-s1") is not None


def test_appends_racing_a_purge_in_one_group_commit_land_before_it_or_are_refused(store):
    """Writers to the purged session and to others, released together with the purge: whatever the
    groups, the purged session ends as its tombstone alone, every other append is there."""
    fill(store)
    barrier = threading.Barrier(9)
    refused: list[str] = []

    def write(i: int) -> None:
        barrier.wait()
        for n in range(20):
            store.append(f"session-busy{i}", [Touched(at=n)], ANY_VERSION)
            try:
                store.append(f"task-s1.c{i}.t{n}", [Touched(at=n)], ANY_VERSION)
            except StreamDeleted:
                refused.append(f"{i}.{n}")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    barrier.wait()
    purge(store)
    for t in threads:
        t.join()
    assert [type(e.event) for e in store.read_stream("session-s1")] == [Erased]
    assert store.list_streams("task").streams == []
    assert refused  # the late ones were refused, not written back
    assert all(store.stream_version(f"session-busy{i}") == 20 for i in range(8))
    assert store.audit() == []


def test_the_audit_names_an_index_entry_whose_record_is_gone(store_path):
    store = open_test_store(store_path, durability="nosync")
    fill(store)
    assert store.audit() == []
    store.close()
    env = lmdb.open(store_path, max_dbs=16)
    log = env.open_db(b"log")
    with env.begin(write=True, db=log) as txn:  # what a purge that forgot the index would leave
        cur = txn.cursor()
        assert cur.first()
        cur.delete()
    env.close()
    store = open_test_store(store_path, durability="nosync", readonly=True)
    try:
        problems = store.audit()
    finally:
        store.close()
    assert any("session-s1 v1 points at no record" in p for p in problems), problems


# --- SIGKILL in the middle of the purge of a session with many events ----------------------------

CHILD = """
import os, signal, sys
from sessionloop.eventstore import ANY_VERSION
from tests.eventstore.union import Erased, open_test_store
inside = sys.argv[2] == "inside"
store = open_test_store(sys.argv[1], durability="sync",
                        on_purge=(lambda: os.kill(os.getpid(), signal.SIGKILL)) if inside else None)
print("purging", flush=True)
store.purge("session-big", [Erased(at=1)], ANY_VERSION, categories=["session", "approval", "task"])
print("purged", flush=True)
signal.pause()  # killed here when the kill comes after the commit
"""


def _big_session(path: str, commits: int) -> int:
    store = open_test_store(path, durability="nosync")
    try:
        batch = [encode_event(Noted(at=1, key=f"i{n}", text=SECRET * 8))
                 for n in range(10)]
        raw = b"session-big"
        for n in range(commits):
            store.append_encoded("session-big", raw, batch, [True] * 10, ANY_VERSION, feed="bot",
                                 idempotency=IdempotencyClaim("app:bot:big", f"k{n}", "h", b"r"))
        store.append("task-big.c1.t1", [Noted(at=1, key="big.c1.t1", text="x")], 0)
        store.append("session-kept", [Touched(at=1)], 0)
        return store.stream_version("session-big")
    finally:
        store.close()


def _purge_killed(path: str, where: str, delay: float = 0.0) -> None:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), path, where], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "purging"
    if where != "inside":
        time.sleep(delay)  # the kill's moment is what the trial varies
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL


def _all_or_tombstone(path: str, version: int) -> bool:
    """Reopen after the kill: the session is either all there or only its tombstone, the store's
    indexes agree with its log, the other session is untouched. Whether it was purged."""
    store = open_test_store(path, durability="nosync")
    try:
        events = store.read_stream("session-big")
        purged = store.purged("session-big")
        if purged:
            assert [type(e.event) for e in events] == [Erased]
            assert store.read_stream("task-big.c1.t1") == [] and store.read_feed("bot", 0, 10) == []
        else:
            assert [e.version for e in events] == list(range(1, version + 1))
            assert len(store.read_stream("task-big.c1.t1")) == 1 and len(store.read_feed("bot", 0, 20)) == 20
            assert store.get_receipt("app:bot:big", f"k{version // 10 - 1}") is not None
        assert len(store.read_stream("session-kept")) == 1
        assert store.audit() == []
        return purged
    finally:
        store.close()


def test_a_sigkill_inside_the_purge_transaction_after_every_record_was_deleted_leaves_the_session_whole(tmp_path):
    path = str(tmp_path / "store")
    version = _big_session(path, 1500)  # 15,000 events
    _purge_killed(path, "inside")
    assert _all_or_tombstone(path, version) is False


def test_sigkills_at_moments_across_the_purge_of_a_session_with_many_events_leave_all_of_it_or_only_its_tombstone(
        tmp_path):
    """Kills from the purge's start to past its commit, a fresh store each: every outcome is one
    of the two, and the trials see both (a kill before the commit and one after it)."""
    seen: set[bool] = set()
    for trial in range(16):
        path = str(tmp_path / f"store{trial}")
        version = _big_session(path, 1500)
        _purge_killed(path, "outside", 0.015 * trial)
        seen.add(_all_or_tombstone(path, version))
        if seen == {True, False}:
            break
    assert seen == {True, False}, f"16 trials saw only purged={seen}"
