"""The JetStream log and shard leases at R=3 on a real three-server nats cluster on loopback
(``cli/natsproc.py``), with servers killed by SIGKILL: a majority keeps accepting commits, a lost
majority makes an append fail as StorageUnavailable within the request timeout, and nothing that
was acknowledged is lost or written twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest

from sessionloop.cli.natsproc import NatsCluster
from sessionloop.eventstore.errors import NOT_WRITTEN, UNKNOWN, LeaseHeld, LeaseLost, StorageUnavailable
from sessionloop.eventstore.jetstream_log import DEFAULT_STREAM, JetStreamLog
from sessionloop.eventstore.leases import DEFAULT_BUCKET, ShardLeases, ShardOwner
from sessionloop.eventstore.records import AppendResult, RecordedEvent
from tests.eventstore.test_jetstream_log import _take_over_after_expiry, run

T = TypeVar("T")

#: a leader election after a kill takes a few seconds; an append retried with its commit id waits this long at most
RETRY_FOR_S = 20.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    nodes = NatsCluster(Path(tmp_path_factory.mktemp("cluster")))
    nodes.start()
    yield nodes
    nodes.stop()


@pytest.fixture(autouse=True)
def all_servers_up(cluster: NatsCluster) -> Iterator[None]:
    """Every test starts (and leaves the next one) with the three servers running."""
    cluster.start()
    yield
    cluster.start()




async def _leader_of(log: JetStreamLog, stream: str) -> int:
    """The index of the server leading ``stream``'s replicas (servers are named n0, n1, n2)."""
    info = await log.jetstream.stream_info(stream)
    assert info.cluster is not None and info.cluster.leader, f"stream {stream} has no leader"
    return int(info.cluster.leader.removeprefix("n"))


async def _until_available(factory: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """``factory()``'s result, called again while it raises StorageUnavailable (an election in
    progress after a kill; bounded by RETRY_FOR_S), and how many calls failed."""
    deadline = time.monotonic() + RETRY_FOR_S
    failed = 0
    while True:
        try:
            return await factory(), failed
        except StorageUnavailable:
            failed += 1
            assert time.monotonic() < deadline, f"still unavailable after {RETRY_FOR_S} s"
            await asyncio.sleep(0.2)


async def _first(pair: Awaitable[tuple[T, int]]) -> T:
    return (await pair)[0]


async def _log(cluster: NatsCluster, request_timeout_s: float = 2.0) -> JetStreamLog:
    """A log on the whole cluster; the connection waits out an election left by the test before
    (a server restarted, the stream's leader moving)."""
    log, _ = await _until_available(lambda: JetStreamLog.connect(cluster.url, replicas=3,
                                                                 request_timeout_s=request_timeout_s))
    return log


async def _append_until_acked(log: JetStreamLog, stream: str, event: bytes, expected: int,
                              commit_id: str) -> tuple[AppendResult, int]:
    """Append, retrying with the same commit id while the cluster answers StorageUnavailable."""
    return await _until_available(lambda: log.append(stream, [event], expected, commit_id))


def test_appends_and_reads_at_r3_are_served_by_every_server(cluster: NatsCluster) -> None:
    async def go() -> None:
        log = await _log(cluster)
        try:
            info = await log.jetstream.stream_info(DEFAULT_STREAM)
            assert info.config.num_replicas == 3
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2
            await log.append("session-r3", [b"e1", b"e2"], 0, "r3-1")
            await log.append("session-r3", [b"e3"], 2, "r3-2")
            for url in cluster.urls:  # each server alone answers with the same stream
                one = await JetStreamLog.connect(url, replicas=3)
                try:
                    assert [e.event for e in await one.read_stream("session-r3")] == [b"e1", b"e2", b"e3"]
                finally:
                    await one.close()
        finally:
            await log.close()
    run(go)


def test_with_a_follower_killed_every_append_is_accepted_and_none_is_lost(cluster: NatsCluster) -> None:
    async def go() -> None:
        probe = await _log(cluster)
        try:
            leader = await _leader_of(probe, DEFAULT_STREAM)
        finally:
            await probe.close()
        follower = (leader + 1) % 3
        log = await JetStreamLog.connect(cluster.urls[leader], replicas=3)  # not on the server killed
        try:
            await log.append("session-follower", [b"0"], 0, "f-0")
            cluster.kill_server(follower)
            for i in range(1, 21):  # a majority (two of three) stores each one: no error at all
                await log.append("session-follower", [str(i).encode()], i, f"f-{i}")
            await asyncio.to_thread(cluster.start_server, follower)
            back = await JetStreamLog.connect(cluster.urls[follower], replicas=3)
            try:
                events = await _read_when_caught_up(back, "session-follower", 21)
                assert [e.event for e in events] == [str(i).encode() for i in range(21)]
            finally:
                await back.close()
        finally:
            await log.close()
    run(go)


async def _read_when_caught_up(log: JetStreamLog, stream: str, count: int) -> list[RecordedEvent[bytes]]:
    """``stream``'s events as ``log``'s server has them once it holds ``count`` (a restarted
    replica catches up from the leader; bounded wait)."""
    deadline = time.monotonic() + RETRY_FOR_S
    while True:
        try:
            events = await log.read_stream(stream)
            if len(events) >= count:
                return events
        except StorageUnavailable:
            pass
        assert time.monotonic() < deadline, f"the restarted server never caught up to {count} events of {stream}"
        await asyncio.sleep(0.2)


def test_with_the_leader_killed_acknowledged_commits_survive_once_each(cluster: NatsCluster) -> None:
    async def go() -> None:
        log = await _log(cluster, request_timeout_s=1.0)
        try:
            stream = "session-leader"
            for i in range(5):
                await log.append(stream, [str(i).encode()], i, f"l-{i}")
            leader = await _leader_of(log, DEFAULT_STREAM)
            cluster.kill_server(leader)
            failed = 0
            for i in range(5, 15):  # retried with the same id until the new leader acknowledges it
                _, f = await _append_until_acked(log, stream, str(i).encode(), i, f"l-{i}")
                failed += f
            assert await _leader_of(log, DEFAULT_STREAM) != leader
            await asyncio.to_thread(cluster.start_server, leader)
            back = await JetStreamLog.connect(cluster.urls[leader], replicas=3)
            try:
                events = await _read_when_caught_up(back, stream, 15)
            finally:
                await back.close()
            assert [e.event for e in events] == [str(i).encode() for i in range(15)]
            assert [e.version for e in events] == list(range(1, 16))
            assert len({e.commit_id for e in events}) == 15, f"a commit landed twice ({failed} retries)"
        finally:
            await log.close()
    run(go)


def test_with_two_servers_killed_an_append_fails_unavailable_and_its_retry_writes_it_once(
        cluster: NatsCluster) -> None:
    async def go() -> None:
        log = await JetStreamLog.connect(cluster.urls[0], replicas=3, request_timeout_s=1.0)
        try:
            await log.append("session-quorum", [b"e1"], 0, "q-1")
            cluster.kill_server(1)
            cluster.kill_server(2)
            started = time.monotonic()
            with pytest.raises(StorageUnavailable) as err:
                await log.append("session-quorum", [b"e2"], 1, "q-2")
            assert err.value.outcome in (UNKNOWN, NOT_WRITTEN)
            assert time.monotonic() - started < 5, "the append without a majority was not bounded by its timeout"
            await asyncio.to_thread(cluster.start)
            retried, _ = await _append_until_acked(log, "session-quorum", b"e2", 1, "q-2")
            assert (retried.first_version, retried.last_version) == (2, 2)
            again = await log.append("session-quorum", [b"e2"], 1, "q-2")
            assert again.duplicate and again.first_position == retried.first_position
            assert [e.event for e in await log.read_stream("session-quorum")] == [b"e1", b"e2"]
        finally:
            await log.close()
    run(go)


def test_a_lease_taken_at_r3_survives_the_kill_of_its_bucket_leader(cluster: NatsCluster) -> None:
    async def go() -> None:
        log = await _log(cluster, request_timeout_s=1.0)
        try:
            leases = await ShardLeases.open(log, ttl_s=30, replicas=3)
            lease = await leases.acquire(7, "node-a")
            leader = await _leader_of(log, f"KV_{DEFAULT_BUCKET}")
            cluster.kill_server(leader)
            # the renewal waits out the bucket's election, then succeeds at the same epoch
            renewed, _ = await _until_available(lambda: leases.renew(lease))
            assert renewed.epoch == lease.epoch
            assert (await _until_available(lambda: leases.holder(7)))[0] == ("node-a", renewed.revision)
            with pytest.raises(LeaseHeld) as held:
                await leases.acquire(7, "node-b")
            assert held.value.holder == "node-a"
        finally:
            await log.close()
    run(go)


def test_the_shard_fence_refuses_a_stalled_owner_at_r3(cluster: NatsCluster) -> None:
    """The fence's check (the last sequence of ``sl.log.<shard>.>``) on a clustered stream, whose
    publishes the stream leader checks before it proposes them."""
    # Every step waits out an election left by the test before (the new bucket's and the log
    # stream's leaders being placed: JetStream answers "no responders" until then, nothing written)
    async def go() -> tuple[int, list[bytes]]:
        log_a, log_b = await _log(cluster), await _log(cluster)
        try:
            def leases(log: JetStreamLog) -> Callable[[], Awaitable[ShardLeases]]:
                return lambda: ShardLeases.open(log, bucket="SL_FENCE_R3", ttl_s=1, replicas=3)
            a = ShardOwner(log_a, (await _until_available(leases(log_a)))[0], "node-a")
            b = ShardOwner(log_b, (await _until_available(leases(log_b)))[0], "node-b")
            stream = "session-fence-r3"
            shard = log_a.shard_of(stream)
            lease_a, _ = await _until_available(lambda: a.acquire(shard))
            await _until_available(lambda: a.append(stream, [b"a1"], 0, "fr3-a1"))
            lease_b = await _take_over_after_expiry(lambda: _first(_until_available(lambda: b.acquire(shard))), 1)
            assert lease_b.epoch > lease_a.epoch
            a._held[shard] = msgspec.structs.replace(lease_a, deadline=float("inf"))  # noqa: SLF001
            accepted = 0
            try:
                # node-b never wrote this session
                await _until_available(lambda: a.append(stream, [b"stale"], 1, "fr3-a2"))
                accepted += 1
            except LeaseLost:
                pass
            await _until_available(lambda: b.append(stream, [b"b2"], 1, "fr3-b2"))
            return accepted, [e.event for e in (await _until_available(lambda: log_b.read_stream(stream)))[0]]
        finally:
            await log_a.close()
            await log_b.close()
    accepted, events = run(go)
    assert accepted == 0 and events == [b"a1", b"b2"]
