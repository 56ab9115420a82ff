"""``EventStore.compact``: the purged bytes leave ``data.mdb`` (LMDB does not zero freed pages), with
writes racing it kept, and ``sessionloop compact`` refusing a store a server holds.

Real LMDB in temporary directories; the file's raw bytes are read to look for the secret.

A session's events (actors/events.py): what is checked is that a deleted session's bytes leave
the disk. tests/eventstore/test_compact.py checks the same on the store tests' own union, at the
sizes where a purge's tombstone lands on a reused page buffer whose unused end still holds the
deleted bytes (which is why the compacted copy is rebuilt key by key, not copied page by page).
"""

from __future__ import annotations

import os
import threading

from click.testing import CliRunner

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from sessionloop.cli.main import main
from sessionloop.eventstore import ANY_VERSION, EventStore, IdempotencyClaim, request_hash
from tests.eventstore.test_purge import PARTITION, SECRET


def fill(store: EventStore, sid: str = "s1", turns: int = 3) -> None:
    """A session with inputs (idempotent, feed-indexed), an approval, a task, a snapshot, flags."""
    stream = f"session-{sid}"
    store.append(stream, [E.SessionCreated(at=1, session_id=sid, name=SECRET)], 0, feed="bot",
                 meta=b"listing with " + SECRET.encode(), flags={"active": True})
    for i in range(turns):
        store.append(stream, [E.InputAccepted(at=2, input_id=f"i{i}", turn_id=f"t{i}", text=f"{SECRET} {i}"),
                              E.TurnStarted(at=2, turn_id=f"t{i}"),
                              E.TurnCompleted(at=3, turn_id=f"t{i}", output_text=f"echo: {SECRET}")],
                     ANY_VERSION, idempotency=IdempotencyClaim(f"app:bot:{sid}", f"k{i}",
                                                               request_hash({"text": f"{SECRET} {i}"}), b"r"),
                     feed="bot")
    store.save_snapshot(stream, store.stream_version(stream), SECRET.encode())
    store.append(f"approval-{sid}.t0.c1", [E.ApprovalRequested(
        at=4, approval_id=f"{sid}.t0.c1", session_id=sid, turn_id="t0", call_id="c1", tool="exec",
        origin=E.OriginInfo(kind="hand"),
        facts=E.ApprovalFacts(command=f"echo {SECRET}"), content_hash="h", expires_at=9)], 0,
        flags={"approval-pending": True})
    store.append(f"task-{sid}.c2.t1", [E.TaskStarted(at=5, task_id=f"{sid}.c2.t1", session_id=sid, label="exec")], 0,
                 flags={"task-running": True})


def purge(store: EventStore, sid: str = "s1", **kw) -> object:
    return store.purge(f"session-{sid}", [E.SessionDeleted(at=99)], ANY_VERSION, categories=PARTITION, **kw)


def raw_file(store_path: str) -> bytes:
    with open(os.path.join(store_path, "data.mdb"), "rb") as f:
        return f.read()


def test_the_bytes_of_a_purged_session_are_in_the_file_until_compact_and_gone_after_it(store_path):
    store = open_store(store_path, durability="nosync")
    try:
        fill(store, turns=50)
        store.append("session-kept", [E.InputAccepted(at=1, input_id="i", turn_id="t", text="kept text")], 0)
        purge(store)
        store._rec._env.sync(True)
        assert SECRET.encode() in raw_file(store_path)  # what the purge alone leaves on disk
        before, after = store.compact()
        assert SECRET.encode() not in raw_file(store_path)
        assert after <= before and after == os.path.getsize(os.path.join(store_path, "data.mdb"))
        assert [e.event.text for e in store.read_stream("session-kept")] == ["kept text"]
        assert [type(e.event) for e in store.read_stream("session-s1")] == [E.SessionDeleted]
        store.append("session-kept", [E.SessionSeen(at=2)], 1)  # writes go on in the reopened file
        assert store.audit() == []
        assert not os.path.exists(os.path.join(store_path, "compact.tmp"))
        assert oct(os.stat(os.path.join(store_path, "data.mdb")).st_mode & 0o777) == "0o600"
    finally:
        store.close()
    reopened = open_store(store_path, readonly=True)
    try:
        assert [type(e.event) for e in reopened.read_stream("session-kept")] == [E.InputAccepted, E.SessionSeen]
    finally:
        reopened.close()


def test_appends_racing_a_compaction_are_all_in_the_compacted_file(store_path):
    store = open_store(store_path, durability="nosync")
    try:
        fill(store, turns=20)
        purge(store)
        start = threading.Barrier(5)

        def write(i: int) -> None:
            start.wait()
            for n in range(50):
                store.append(f"session-w{i}", [E.SessionSeen(at=n)], ANY_VERSION)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        start.wait()
        store.compact()
        for t in threads:
            t.join()
        store.compact()
    finally:
        store.close()
    store = open_store(store_path, readonly=True)
    try:
        assert [store.stream_version(f"session-w{i}") for i in range(4)] == [50] * 4
        assert SECRET.encode() not in raw_file(store_path)
    finally:
        store.close()


def test_sessionloop_compact_reports_the_sizes_and_refuses_a_store_a_server_holds(tmp_path):
    data = str(tmp_path / "data")
    store = open_store(os.path.join(data, "store"), durability="nosync")
    fill(store, turns=30)
    purge(store)
    held = CliRunner().invoke(main, ["compact", "--data", data])
    assert held.exit_code == 1 and "in use by a running server" in held.output and "stop it" in held.output
    store.close()
    done = CliRunner().invoke(main, ["compact", "--data", data])
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"compacted {data}/store/data.mdb: ") and " MiB -> " in done.output
    assert SECRET.encode() not in raw_file(os.path.join(data, "store"))
    missing = CliRunner().invoke(main, ["compact", "--data", str(tmp_path / "nothing")])
    assert missing.exit_code == 1 and "no event store in" in missing.output
