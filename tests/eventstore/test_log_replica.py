"""A store that materializes the event log on JetStream (eventstore/log_replica.py): real LMDB in
temporary directories, a real nats-server with file storage (``cli/natsproc.py``)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import msgspec
import pytest

from sessionloop.cli.natsproc import NatsServer
from sessionloop.eventstore import WrongExpectedVersion
from sessionloop.eventstore import keys as K
from sessionloop.eventstore.batch import AppendOp
from sessionloop.eventstore.errors import LeaseHeld, LeaseLost, StorageError, StorageUnavailable, StreamDeleted
from sessionloop.eventstore.jetstream_log import JetStreamLog
from sessionloop.eventstore.log_replica import LogReplica, LogSidecar
from sessionloop.eventstore.records import IdempotencyClaim
from sessionloop.eventstore.store import EventStore
from tests.eventstore.union import Erased, Fact, Noted, Opened, Stepped, open_test_store

SHARDS = 4


def _replica(server: NatsServer, node: str, **kw: object) -> LogReplica:
    replica = LogReplica(server.url, node=node, shards=SHARDS, **kw)  # type: ignore[arg-type]
    replica.open(range(SHARDS))
    return replica


def _node(path: Path, server: NatsServer, node: str, **kw: object) -> tuple[EventStore[Fact], LogReplica]:
    store = open_test_store(str(path), durability="nosync", shards=SHARDS)
    replica = _replica(server, node, **kw)
    store.follow_log(replica)
    return store, replica


def _log_commits(server: NatsServer) -> list[tuple[str, LogSidecar]]:
    """(stream, sidecar) of every commit the log holds now, shard by shard, in log order."""

    async def read() -> list[tuple[str, LogSidecar]]:
        log = await JetStreamLog.connect(server.url, shards=SHARDS)
        try:
            out = []
            for shard in range(SHARDS):
                last = await log.shard_head(shard)
                if not last:
                    continue
                async for _seq, commit in log.shard_commits(shard, last):
                    out.append((commit.stream, msgspec.msgpack.decode(commit.extra, type=LogSidecar)))
            return out
        finally:
            await log.close()
    return asyncio.run(read())


def test_a_store_rebuilt_from_the_log_has_every_commit_receipt_feed_entry_and_purge(
        tmp_path: Path, nats_server: NatsServer) -> None:
    store, replica = _node(tmp_path / "a", nats_server, "node-a")
    claim = IdempotencyClaim("app:bot", "key-1", "hash-1", b"receipt-1")
    first = store.append("session-s1", [Opened(name="one", at=1)], 0, idempotency=claim, feed="bot",
                         meta=b"listing-1", flags={"unfinished": True})
    store.append("session-s1", [Stepped(step="a"), Stepped(step="b")], 1, feed="bot")
    for i in range(30):
        store.append(f"session-m{i}", [Opened(name=f"m{i}")], 0)
    store.append("session-gone", [Opened(name="gone")], 0)
    store.append("approval-gone.1", [Noted(text="secret of a deleted session")], 0)
    store.purge("session-gone", [Erased()], categories=["session", "approval"])
    # a repeat of the idempotent append is a duplicate in the store and is not published again
    again = store.append("session-s1", [Opened(name="one", at=1)], 0, idempotency=claim, feed="bot")
    assert again.duplicate and again.receipt == b"receipt-1"
    store.close()
    replica.close()

    rebuilt, replica2 = _node(tmp_path / "b", nats_server, "node-b")
    try:
        events = rebuilt.read_stream("session-s1")
        assert [e.version for e in events] == [1, 2, 3]
        assert [type(e.event).__name__ for e in events] == ["Opened", "Stepped", "Stepped"]
        assert events[0].at == first.at  # the commit's own time, not the rebuild's
        assert rebuilt.stream_meta("session-s1") == b"listing-1"
        assert rebuilt.flagged("unfinished") == ["session-s1"]
        receipt = rebuilt.get_receipt("app:bot", "key-1")
        assert receipt is not None and receipt.receipt == b"receipt-1"
        assert [type(e.event).__name__ for e in rebuilt.read_feed("bot")] == ["Stepped", "Stepped"]
        assert all(rebuilt.stream_version(f"session-m{i}") == 1 for i in range(30))
        assert rebuilt.purged("session-gone")
        assert rebuilt.read_stream("approval-gone.1") == []
        with pytest.raises(StreamDeleted):
            rebuilt.append("approval-gone.1", [Noted(text="x")], 0)
        # the rebuilt node writes on: its commits reach the log, under its own name
        rebuilt.append("session-s1", [Stepped(step="c")], 3)
    finally:
        rebuilt.close()
        replica2.close()
    commits = _log_commits(nats_server)
    assert all("secret" not in repr(side) for _stream, side in commits)
    streams = [stream for stream, _side in commits]
    assert "approval-gone.1" not in streams  # erased from the log, the tombstone stays
    assert streams.count("session-gone") == 1
    assert [side.node for stream, side in commits if stream == "session-s1"] == ["node-a", "node-a", "node-b"]
    # each commit names the lease it was written under: node-b's is newer than node-a's
    leases = [side.lease for stream, side in commits if stream == "session-s1"]
    assert 0 < leases[0] == leases[1] < leases[2]


def test_a_store_rebuilt_from_the_log_keeps_every_commits_position_so_feed_cursors_mean_the_same(
        tmp_path: Path, nats_server: NatsServer) -> None:
    store, replica = _node(tmp_path / "a", nats_server, "node-a")
    names = [f"session-p{i}" for i in range(12)]  # spread over the shards, written in turns
    for name in names:
        store.append(name, [Opened(name=name)], 0, feed="bot")
    for step in range(3):
        for name in reversed(names):
            store.append(name, [Stepped(step=f"{step}a"), Stepped(step=f"{step}b")], 1 + 2 * step, feed="bot")
    store.purge("session-p3", [Erased()], categories=["session"])
    store.append("session-p0", [Stepped(step="last")], 7, feed="bot")
    original = [(r.position, r.stream, r.version) for r in store.read_all(0, 10_000)]
    feed = [(r.position, r.stream, r.version) for r in store.read_feed("bot", 0, 1000)]
    cursor = feed[len(feed) // 2][0]
    after_cursor = [(r.position, r.stream) for r in store.read_feed("bot", cursor, 1000)]
    store.close()
    replica.close()

    rebuilt, replica_b = _node(tmp_path / "b", nats_server, "node-b")
    try:
        again = [(r.position, r.stream, r.version) for r in rebuilt.read_all(0, 10_000)]
        assert [(p, s) for p, s, _v in again] == [(p, s) for p, s, _v in original]
        # (the purged stream's tombstone is numbered from what the log kept of it: itself)
        assert [x for x in again if x[1] != "session-p3"] == [x for x in original if x[1] != "session-p3"]
        assert [(r.position, r.stream, r.version) for r in rebuilt.read_feed("bot", 0, 1000)] == feed
        # a bot's cursor from node-a reads on node-b from where it left off, nothing skipped or repeated
        assert [(r.position, r.stream) for r in rebuilt.read_feed("bot", cursor, 1000)] == after_cursor
        # node-b's own commits come after every position node-a gave
        mine = rebuilt.append("session-p1", [Stepped(step="b")], 7, feed="bot")
        assert mine.first_position > max(p for p, _s, _v in original)
    finally:
        rebuilt.close()
        replica_b.close()


def test_a_node_that_has_some_of_the_log_takes_only_what_it_lacks(tmp_path: Path, nats_server: NatsServer) -> None:
    store, replica = _node(tmp_path / "a", nats_server, "node-a")
    store.append("session-x", [Opened(name="x")], 0)
    store.close()
    replica.close()
    # another node wrote on while this one was down
    other, replica_b = _node(tmp_path / "b", nats_server, "node-b")
    other.append("session-x", [Stepped(step="later")], 1)
    other.append("session-y", [Opened(name="y")], 0)
    other.close()
    replica_b.close()

    store = open_test_store(str(tmp_path / "a"), durability="nosync", shards=SHARDS)
    replica = _replica(nats_server, "node-a")
    try:
        done = store.follow_log(replica)
        assert (done.read, done.applied) == (3, 2)
        assert [e.version for e in store.read_stream("session-x")] == [1, 2]
        assert store.stream_version("session-y") == 1
    finally:
        store.close()
        replica.close()


def test_a_data_directory_with_commits_the_log_lacks_is_refused(tmp_path: Path, nats_server: NatsServer) -> None:
    plain = open_test_store(str(tmp_path / "a"), durability="nosync", shards=SHARDS)
    plain.append("session-local", [Opened(name="local")], 0)
    replica = _replica(nats_server, "node-a")
    try:
        with pytest.raises(StorageError, match="holds commits that the cluster's log does not"):
            plain.follow_log(replica)
    finally:
        plain.close()
        replica.close()


def test_a_second_node_cannot_take_shards_whose_leases_hold(tmp_path: Path, nats_server: NatsServer) -> None:
    store, replica = _node(tmp_path / "a", nats_server, "node-a")
    try:
        with pytest.raises(LeaseHeld, match="leased by node 'node-a'"):
            _replica(nats_server, "node-b")
    finally:
        store.close()
        replica.close()


def test_an_append_the_log_refuses_writes_nothing_to_the_store(tmp_path: Path, nats_server: NatsServer) -> None:
    # another writer moved the stream in the log behind this node's back: its next commit is refused
    store, replica = _node(tmp_path / "a", nats_server, "node-a")
    try:
        store.append("session-z", [Opened(name="z")], 0)

        async def behind_its_back() -> None:
            log = await JetStreamLog.connect(nats_server.url, shards=SHARDS)
            try:
                await log.append("session-z", [b"\x81\xa4type\xacstep"], 1)
            finally:
                await log.close()
        asyncio.run(behind_its_back())
        with pytest.raises(LeaseLost):
            store.append("session-z", [Stepped(step="mine")], 1)
        assert store.stream_version("session-z") == 1
        assert replica.lost  # the shard is given up: nothing more is written to it
        with pytest.raises(LeaseLost):
            store.append("session-z", [Stepped(step="again")], 1)
        with pytest.raises(WrongExpectedVersion):  # a refused check in the store still comes first
            store.append("session-z", [Stepped(step="stale")], 0)
    finally:
        store.close()
        replica.close()


def test_a_paused_owner_past_its_lease_commits_nothing_after_the_new_owner_took_over(
        tmp_path: Path, nats_server: NatsServer) -> None:
    lost: list[int] = []
    store, replica = _node(tmp_path / "a", nats_server, "node-a", lease_ttl_s=1.0,
                           on_lost=lambda shard, why: lost.append(shard))
    try:
        store.append("session-p", [Opened(name="p")], 0)
        # the owner's log thread stops (as SIGSTOP would stop it) past its lease
        paused = threading.Event()
        replica._loop.call_soon_threadsafe(lambda: (paused.set(), time.sleep(2.0)))
        assert paused.wait(5)
        time.sleep(1.6)
        new_store, new_replica = _node(tmp_path / "b", nats_server, "node-b", lease_ttl_s=1.0)
        try:
            assert new_store.stream_version("session-p") == 1
            new_store.append("session-p", [Stepped(step="new owner")], 1)
            with pytest.raises(LeaseLost):  # the old owner wakes and writes: refused, nothing stored
                store.append("session-p", [Stepped(step="stale owner")], 1)
            assert store.stream_version("session-p") == 1
            assert lost
        finally:
            new_store.close()
            new_replica.close()
    finally:
        store.close()
        replica.close()
    commits = _log_commits(nats_server)
    assert [side.node for stream, side in commits if stream == "session-p"] == ["node-a", "node-b"]


def test_a_standby_keeps_its_store_up_to_the_log_and_takes_over_reading_only_what_came_since(
        tmp_path: Path, nats_server: NatsServer) -> None:
    store_a, replica_a = _node(tmp_path / "a", nats_server, "node-a")
    for i in range(20):
        store_a.append(f"session-h{i}", [Opened(name=f"h{i}")], 0)
    store_b = open_test_store(str(tmp_path / "b"), durability="nosync", shards=SHARDS)
    replica_b = LogReplica(nats_server.url, node="node-b", shards=SHARDS)
    standing = threading.Thread(target=store_b.stand_by, args=(replica_b, range(SHARDS)), daemon=True)
    standing.start()
    try:
        deadline = time.monotonic() + 15  # a round applies shard after shard: wait for all of them
        while not all(store_b.stream_version(f"session-h{i}") == 1 for i in range(20)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(store_b.stream_version(f"session-h{i}") == 1 for i in range(20))  # before any takeover
        assert replica_b.held == []
        store_a.append("session-h0", [Stepped(step="last")], 1)
        store_a.close()
        replica_a.close()  # gives the leases back: the standby takes them at once
        standing.join(15)
        assert not standing.is_alive()
        done = store_b.follow_log(replica_b)
        assert done.applied <= 1 and replica_b.commits_read == 21
        assert store_b.stream_version("session-h0") == 2
        assert replica_b.held == list(range(SHARDS))
    finally:
        store_b.close()


def test_a_standby_waits_through_a_log_that_stops_answering_and_takes_over_once_it_answers_again(
        tmp_path: Path, nats_server: NatsServer) -> None:
    store_a, replica_a = _node(tmp_path / "a", nats_server, "node-a")
    store_a.append("session-w0", [Opened(name="w0")], 0)
    store_b = open_test_store(str(tmp_path / "b"), durability="nosync", shards=SHARDS)
    replica_b = LogReplica(nats_server.url, node="node-b", shards=SHARDS, timeout_s=1.0)
    failed: list[BaseException] = []

    def stand_by() -> None:
        try:
            store_b.stand_by(replica_b, range(SHARDS))
        except BaseException as e:  # noqa: BLE001 - the test reports it
            failed.append(e)

    standing = threading.Thread(target=stand_by, daemon=True)
    standing.start()
    try:
        deadline = time.monotonic() + 15
        while store_b.stream_version("session-w0") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store_b.stream_version("session-w0") == 1, failed
        nats_server.kill()
        time.sleep(3.0)  # rounds of a second each that the log does not answer (node-a's 10 s leases hold)
        assert standing.is_alive() and not failed, failed  # still standing by
        nats_server.start()
        store_a.append("session-w0", [Stepped(step="after")], 1)
        store_a.close()
        replica_a.close()
        standing.join(15)
        assert not standing.is_alive() and not failed, failed
        store_b.follow_log(replica_b)
        assert store_b.stream_version("session-w0") == 2
        assert replica_b.held == list(range(SHARDS))
    finally:
        store_b.close()


def test_a_node_that_meets_the_log_down_tries_again_within_its_connect_time(
        tmp_path: Path, nats_server: NatsServer) -> None:
    nats_server.kill()
    replica = LogReplica(nats_server.url, node="node-a", shards=SHARDS, timeout_s=4.0)
    opened: list[BaseException | None] = []

    def open_it() -> None:
        try:
            replica.open(range(SHARDS))
            opened.append(None)
        except BaseException as e:  # noqa: BLE001 - the test reports it
            opened.append(e)

    trying = threading.Thread(target=open_it, daemon=True)
    trying.start()
    time.sleep(1.5)
    assert not opened, opened  # refused connections: it tries again
    nats_server.start()
    trying.join(15)
    try:
        assert opened == [None]
        assert replica.held == list(range(SHARDS))
    finally:
        replica.close()


def test_a_log_that_cannot_be_reached_is_named_without_its_token() -> None:
    replica = LogReplica("nats://s3cret-token@127.0.0.1:1", node="node-a", shards=SHARDS, timeout_s=1.0)
    with pytest.raises(StorageUnavailable) as refused:
        replica.open(range(SHARDS))
    assert "127.0.0.1:1" in str(refused.value) and "s3cret" not in str(refused.value)


def test_a_commit_whose_position_is_taken_in_the_store_goes_next_saying_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A commit of a log written before positions travelled with it (the store numbered it
    already): it is not refused, it goes after the store's last position."""
    store = open_test_store(str(tmp_path / "s"), durability="nosync", shards=SHARDS)
    try:
        store.append("session-t1", [Opened(name="t1")], 0)
        store.append("session-t2", [Opened(name="t2"), Stepped(step="x")], 0)
        raw = K.validate_stream("session-t3")
        op = AppendOp("session-t3", raw, [Opened(name="t3")], [], 0, None, None, None, position=2)
        with caplog.at_level("WARNING", logger="sessionloop.eventstore"):
            result = store._rec.submit(op)  # noqa: SLF001 - what materializing from the log submits
        assert result.first_position == 4
        assert "position 2 of stream 'session-t3' is taken" in caplog.text
        free = store._rec.submit(AppendOp("session-t4", K.validate_stream("session-t4"),  # noqa: SLF001
                                          [Opened(name="t4")], [], 0, None, None, None, position=9))
        assert free.first_position == 9  # a free position is kept, gaps and all
        assert [(r.position, r.stream) for r in store.read_all(0, 100)] == [
            (1, "session-t1"), (2, "session-t2"), (3, "session-t2"), (4, "session-t3"), (9, "session-t4")]
        assert store.append("session-t1", [Stepped(step="y")], 1).first_position == 10
    finally:
        store.close()
