"""``EventStore.compact`` and ``EventStore.backup`` on the store tests' own union: the copy they
write holds no byte of a purged partition, and every key and value of every named database of the
source.

LMDB reuses a freed page's buffer without zeroing it, so a page written after a purge (its
tombstone, say) can carry the deleted bytes in its unused end; a page-by-page copy
(``mdb_env_copy2`` with ``MDB_CP_COMPACT``) would keep them. Real LMDB in temporary directories;
the files' raw bytes are read to look for the secret.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import lmdb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionloop.eventstore import ANY_VERSION, EventStore
from sessionloop.eventstore.lmdb_env import DATABASES
from tests.eventstore.test_purge import SECRET, fill, purge
from tests.eventstore.union import Erased, Noted, Touched, open_test_store

#: the named databases of a store
DBS = DATABASES


def holds_secret(store_dir: str) -> bool:
    """Whether the raw bytes of the store's ``data.mdb`` hold the purged session's secret anywhere."""
    with open(os.path.join(store_dir, "data.mdb"), "rb") as f:
        return SECRET.encode() in f.read()


#: how many turns the purged session has: the purge's tombstone record grows with it, and at
#: several of these sizes (50 among them) its overflow page is a reused buffer whose unused end
#: still holds bytes of the purged session
TURNS = range(40, 90)


def purged_store(store: EventStore, turns: int = 50) -> None:
    """A session carrying the secret, purged, and a kept one beside it; flushed to disk."""
    fill(store, "s1", turns=turns)
    store.append("session-kept", [Noted(at=1, key="k", text="kept text")], 0)
    purge(store, "s1")
    store._rec._env.sync(True)


@contextmanager
def raw_env(store_dir: str) -> Iterator[lmdb.Environment]:
    """The store's file opened read-only by lmdb itself, to read every named database as it is."""
    env = lmdb.open(store_dir, readonly=True, lock=False, max_dbs=len(DBS) + 2)
    try:
        yield env
    finally:
        env.close()


def contents(store_dir: str) -> dict[str, tuple[dict[str, object], list[tuple[bytes, bytes]]]]:
    """Every named database of the store in ``store_dir`` (closed in this process)."""
    with raw_env(store_dir) as env:
        return env_contents(env)


def env_contents(env: lmdb.Environment) -> dict[str, tuple[dict[str, object], list[tuple[bytes, bytes]]]]:
    """Every named database by name: its flags and its key/value pairs in order. (The main
    database's values are the named databases' roots: page numbers, which a copy renumbers.)"""
    out: dict[str, tuple[dict[str, object], list[tuple[bytes, bytes]]]] = {}
    with env.begin() as txn:
        names = [bytes(k) for k in txn.cursor().iternext(keys=True, values=False)]
        for name in names:
            db = env.open_db(name, txn=txn, create=False)
            out[name.decode()] = (db.flags(txn), [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)])
    return out


def test_compact_takes_every_byte_of_a_purged_session_out_of_the_file(store_path):
    store = open_test_store(store_path, durability="nosync")
    try:
        purged_store(store)
        assert holds_secret(store_path)  # what the purge alone leaves on disk
        before, after = store.compact()
        assert not holds_secret(store_path)
        assert after <= before and after == os.path.getsize(os.path.join(store_path, "data.mdb"))
        assert [e.event.text for e in store.read_stream("session-kept")] == ["kept text"]
        assert [type(e.event) for e in store.read_stream("session-s1")] == [Erased]
        store.append("session-kept", [Touched(at=2)], 1)  # writes go on in the compacted file
        assert store.audit() == []
        assert not os.path.exists(os.path.join(store_path, "compact.tmp"))
        assert oct(os.stat(os.path.join(store_path, "data.mdb")).st_mode & 0o777) == "0o600"
    finally:
        store.close()
    assert not holds_secret(store_path)
    reopened = open_test_store(store_path, readonly=True)
    try:
        assert [type(e.event) for e in reopened.read_stream("session-kept")] == [Noted, Touched]
    finally:
        reopened.close()


def test_compact_leaves_no_byte_of_a_purged_session_whatever_its_number_of_turns(tmp_path):
    leaked = []
    for turns in TURNS:
        path = str(tmp_path / f"store-{turns}")
        store = open_test_store(path, durability="nosync")
        try:
            purged_store(store, turns)
            assert holds_secret(path)
            store.compact()
            store._rec._env.sync(True)
            if holds_secret(path):
                leaked.append(turns)
        finally:
            store.close()
    assert leaked == []


def test_compact_with_appends_racing_it_keeps_every_append_and_no_byte_of_the_purged_session(store_path):
    store = open_test_store(store_path, durability="nosync")
    try:
        purged_store(store)
        start = threading.Barrier(5)

        def write(i: int) -> None:
            start.wait()
            for n in range(50):
                store.append(f"session-w{i}", [Noted(at=n, text=f"racing {i} {n}")], ANY_VERSION)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        start.wait()
        store.compact()
        for t in threads:
            t.join()
        store.compact()
        assert not holds_secret(store_path)
        assert store.audit() == []
    finally:
        store.close()
    store = open_test_store(store_path, readonly=True)
    try:
        assert [store.stream_version(f"session-w{i}") for i in range(4)] == [50] * 4
        assert [e.event.text for e in store.read_stream("session-w3")] == [f"racing 3 {n}" for n in range(50)]
    finally:
        store.close()
    assert not holds_secret(store_path)


def test_a_backup_holds_no_byte_of_a_purged_session_and_serves_what_the_store_serves(tmp_path):
    leaked = []
    for turns in TURNS:
        path, dest = str(tmp_path / f"store-{turns}"), str(tmp_path / f"backup-{turns}")
        store = open_test_store(path, durability="nosync")
        try:
            purged_store(store, turns)
            size = store.backup(dest)
        finally:
            store.close()
        assert holds_secret(path)  # the backup does not compact the store itself
        assert size == os.path.getsize(os.path.join(dest, "data.mdb"))
        assert oct(os.stat(os.path.join(dest, "data.mdb")).st_mode & 0o777) == "0o600"
        if holds_secret(dest):
            leaked.append(turns)
        assert contents(dest) == contents(path)
    assert leaked == []
    copy = open_test_store(str(tmp_path / "backup-50"), readonly=True)
    try:
        assert [e.event.text for e in copy.read_stream("session-kept")] == ["kept text"]
        assert [type(e.event) for e in copy.read_stream("session-s1")] == [Erased]
        assert copy.audit() == []
    finally:
        copy.close()


def test_a_backup_of_a_read_only_open_holds_no_byte_of_a_purged_session(store_path, tmp_path):
    store = open_test_store(store_path, durability="nosync")
    try:
        purged_store(store)
    finally:
        store.close()
    reader = open_test_store(store_path, readonly=True)
    try:
        reader.backup(str(tmp_path / "backup"))
    finally:
        reader.close()
    assert holds_secret(store_path)
    assert not holds_secret(str(tmp_path / "backup"))
    assert contents(str(tmp_path / "backup")) == contents(store_path)


def test_a_named_database_the_store_does_not_know_is_copied_with_its_flags_and_duplicates(store_path, tmp_path):
    store = open_test_store(store_path, durability="nosync")
    purged_store(store)
    store.close()
    env = lmdb.open(store_path, max_dbs=len(DBS) + 2)
    try:
        dups = env.open_db(b"extra-dups", dupsort=True, dupfixed=True)
        backwards = env.open_db(b"extra-reversed", reverse_key=True)
        with env.begin(write=True) as txn:
            for i in range(3000):
                txn.put(b"k%03d" % (i % 300), b"v%05d" % i, db=dups)
                txn.put(b"%05d-key" % i, b"value %d" % i * 20, db=backwards)
    finally:
        env.close()
    source = contents(store_path)
    assert source["extra-dups"][0]["dupsort"] and len(source["extra-dups"][1]) == 3000
    store = open_test_store(store_path, durability="nosync")
    try:
        store.backup(str(tmp_path / "backup"))
        store.compact()
    finally:
        store.close()
    assert contents(store_path) == source
    assert contents(str(tmp_path / "backup")) == source
    assert os.listdir(tmp_path / "backup") == ["data.mdb"]
    assert not holds_secret(store_path) and not holds_secret(str(tmp_path / "backup"))


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=3000)
streams = st.sampled_from(["session-a", "session-b", "approval-a.t0.c1", "task-b.c1.t1", "other-x"])
writes = st.lists(st.tuples(streams, st.lists(texts, min_size=1, max_size=4), st.booleans()), min_size=1,
                  max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=writes, purged=st.sampled_from([None, "session-a", "session-b"]), snapshot=st.booleans())
def test_every_key_and_value_of_every_named_database_is_in_the_compacted_copy_and_the_backup(
        tmp_path_factory, writes, purged, snapshot):
    base = tmp_path_factory.mktemp("property")
    path, dest = str(base / "store"), str(base / "backup")
    store = open_test_store(path, durability="nosync")
    try:
        for stream, bodies, in_feed in writes:
            store.append(stream, [Noted(at=1, key=str(i), text=b) for i, b in enumerate(bodies)], ANY_VERSION,
                         feed="bot" if in_feed else None, meta=bodies[0].encode()[:200],
                         flags={"active": in_feed})
            if snapshot:
                store.save_snapshot(stream, store.stream_version(stream), bodies[-1].encode())
        if purged is not None and store.stream_version(purged):
            purge(store, purged.removeprefix("session-"))
        store._rec._env.sync(True)
        source = env_contents(store._rec._env)
        store.backup(dest)
        store.compact()
    finally:
        store.close()
    assert contents(dest) == source
    assert contents(path) == source
