"""``EventStore.compact``: the purged bytes leave ``data.mdb`` (LMDB does not zero freed pages), with
writes racing it kept, and ``sessionloop compact`` refusing a store a server holds.

Real LMDB in temporary directories; the file's raw bytes are read to look for the secret.
"""

from __future__ import annotations

import os
import threading

from click.testing import CliRunner

from sessionloop.cli.main import main
from sessionloop.eventstore import ANY_VERSION, EventStore
from sessionloop.eventstore import events as E
from tests.eventstore.test_purge import SECRET, fill, purge


def raw_file(store_path: str) -> bytes:
    with open(os.path.join(store_path, "data.mdb"), "rb") as f:
        return f.read()


def test_the_bytes_of_a_purged_session_are_in_the_file_until_compact_and_gone_after_it(store_path):
    store = EventStore.open(store_path, durability="nosync")
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
    reopened = EventStore.open(store_path, readonly=True)
    try:
        assert [type(e.event) for e in reopened.read_stream("session-kept")] == [E.InputAccepted, E.SessionSeen]
    finally:
        reopened.close()


def test_appends_racing_a_compaction_are_all_in_the_compacted_file(store_path):
    store = EventStore.open(store_path, durability="nosync")
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
    store = EventStore.open(store_path, readonly=True)
    try:
        assert [store.stream_version(f"session-w{i}") for i in range(4)] == [50] * 4
        assert SECRET.encode() not in raw_file(store_path)
    finally:
        store.close()


def test_sessionloop_compact_reports_the_sizes_and_refuses_a_store_a_server_holds(tmp_path):
    data = str(tmp_path / "data")
    store = EventStore.open(os.path.join(data, "store"), durability="nosync")
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
