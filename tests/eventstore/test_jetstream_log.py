"""The event log on JetStream (eventstore/jetstream_log.py) against a real nats-server with file
storage in a temporary directory, on a free loopback port (``cli/natsproc.py`` starts it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import pytest

from sessionloop.cli.natsproc import NatsServer
from sessionloop.eventstore import WrongExpectedVersion
from sessionloop.eventstore.batch import ANY_VERSION
from sessionloop.eventstore.errors import (
    UNKNOWN,
    CommitTooLarge,
    InvalidStreamName,
    LeaseHeld,
    LeaseLost,
    StorageUnavailable,
)
from sessionloop.eventstore.jetstream_log import JetStreamLog, stream_of_token, token_of_stream
from sessionloop.eventstore.leases import Lease, ShardLeases, ShardOwner

T = TypeVar("T")


def run(factory: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(factory(), 30)
    return asyncio.run(bounded())


async def _log(server: NatsServer, **kw: Any) -> JetStreamLog:
    return await JetStreamLog.connect(server.url, **kw)


# --- naming -----------------------------------------------------------------------------------------


def test_subject_tokens_are_reversible_and_safe() -> None:
    for name in ("session-abc", "session-ü/é.* >x", "s-" + "x" * 398):
        token = token_of_stream(name)
        assert set(token) <= set("abcdefghijklmnopqrstuvwxyz234567")
        assert stream_of_token(token) == name


def test_an_invalid_stream_name_is_refused_before_publishing() -> None:
    with pytest.raises(InvalidStreamName):
        token_of_stream("s-" + "x" * 500)
    with pytest.raises(InvalidStreamName):
        stream_of_token("not a token!")


# --- append and read ----------------------------------------------------------------------------------


def test_append_then_read_stream_round_trips_versions_and_bytes(nats_server: NatsServer) -> None:
    async def go() -> None:
        log = await _log(nats_server)
        try:
            a = await log.append("session-a", [b"e1", b"e2"], 0, "c-1")
            b = await log.append("session-a", [b"e3"], 2, "c-2")
            await log.append("session-b", [b"other"], 0, "c-3")
            assert (a.first_version, a.last_version, b.first_version, b.last_version) == (1, 2, 3, 3)
            assert not a.duplicate and b.first_position > a.first_position
            events = await log.read_stream("session-a")
            assert [(e.version, e.event, e.commit_id) for e in events] == [
                (1, b"e1", "c-1"), (2, b"e2", "c-1"), (3, b"e3", "c-2")]
            assert [e.event for e in await log.read_stream("session-a", 2, limit=1)] == [b"e2"]
            assert await log.read_stream("session-none") == []
            assert await log.stream_version("session-a") == 3
            everything = await log.read_all()
            assert [(e.stream, e.version) for e in everything] == [
                ("session-a", 1), ("session-a", 2), ("session-a", 3), ("session-b", 1)]
            assert [e.stream for e in await log.read_all(after=b.first_position)] == ["session-b"]
        finally:
            await log.close()
    run(go)


def test_expected_version_conflict_is_refused_with_the_actual_version(nats_server: NatsServer) -> None:
    async def go() -> None:
        writer, other = await _log(nats_server), await _log(nats_server)
        try:
            await writer.append("session-a", [b"e1"], 0, "c-1")
            await other.append("session-a", [b"e2", b"e3"], 1, "c-2")  # writer's cached head is now stale
            with pytest.raises(WrongExpectedVersion) as err:
                await writer.append("session-a", [b"late"], 1, "c-3")
            assert (err.value.expected, err.value.actual) == (1, 3)
            with pytest.raises(WrongExpectedVersion) as err:
                await writer.append("session-a", [b"new"], 0, "c-4")
            assert err.value.actual == 3
            assert [e.event for e in await writer.read_stream("session-a")] == [b"e1", b"e2", b"e3"]
            any_version = await writer.append("session-a", [b"e4"], ANY_VERSION, "c-5")
            assert any_version.first_version == 4
        finally:
            await writer.close()
            await other.close()
    run(go)


def test_server_fence_refuses_a_writer_whose_cache_agrees_with_its_expectation(nats_server: NatsServer) -> None:
    """The stale writer's own cache says version 1, so only the server's subject sequence check
    can refuse it: err_code 10071 becomes WrongExpectedVersion with the actual version."""
    async def go() -> None:
        stale, other = await _log(nats_server), await _log(nats_server)
        try:
            await stale.append("session-a", [b"e1"], 0, "c-1")
            await other.append("session-a", [b"e2"], 1, "c-2")
            with pytest.raises(WrongExpectedVersion) as err:
                await stale.append("session-a", [b"stale"], 1, "c-3")
            assert err.value.actual == 2
        finally:
            await stale.close()
            await other.close()
    run(go)


def test_a_retried_publish_with_the_same_commit_id_is_deduplicated(nats_server: NatsServer) -> None:
    async def go() -> None:
        log, retrier = await _log(nats_server), await _log(nats_server)
        try:
            first = await log.append("session-a", [b"e1", b"e2"], 0, "commit-x")
            # a retry from a writer that never saw the ack: same commit id, same expectation
            again = await retrier.append("session-a", [b"e1", b"e2"], 0, "commit-x")
            assert again.duplicate
            assert (again.first_version, again.last_version, again.first_position) == (
                first.first_version, first.last_version, first.first_position)
            assert len(await log.read_stream("session-a")) == 2
            # a later retry, after the stream moved on, still finds the original commit
            await log.append("session-a", [b"e3"], 2, "commit-y")
            late = await retrier.append("session-a", [b"e1", b"e2"], 0, "commit-x")
            assert late.duplicate and late.first_position == first.first_position
            assert [e.event for e in await log.read_all()] == [b"e1", b"e2", b"e3"]
        finally:
            await log.close()
            await retrier.close()
    run(go)


def test_a_commit_above_the_message_bound_is_refused_by_name(nats_server: NatsServer) -> None:
    async def go() -> None:
        log = await _log(nats_server, max_commit_bytes=4096)
        try:
            with pytest.raises(CommitTooLarge) as err:
                await log.append("session-a", [b"x" * 5000], 0, "c-1")
            assert err.value.limit == 4096 and err.value.size > 5000
            with pytest.raises(ValueError, match="commit id"):
                await log.append("session-a", [b"x"], 0, "bad id\r\n")
            assert await log.stream_version("session-a") == 0
        finally:
            await log.close()
    run(go)


def test_the_log_survives_a_restart_of_nats_server(nats_server: NatsServer) -> None:
    async def write() -> None:
        log = await _log(nats_server)
        try:
            await log.append("session-a", [b"e1"], 0, "c-1")
            await log.append("session-a", [b"e2"], 1, "c-2")
        finally:
            await log.close()

    async def read() -> list[bytes]:
        log = await _log(nats_server)
        try:
            await log.append("session-a", [b"e3"], 2, "c-3")
            return [e.event for e in await log.read_stream("session-a")]
        finally:
            await log.close()

    run(write)
    nats_server.stop()
    nats_server.start()
    assert run(read) == [b"e1", b"e2", b"e3"]


def test_concurrent_appends_without_a_version_check_get_contiguous_versions(nats_server: NatsServer) -> None:
    async def go() -> None:
        logs = [await _log(nats_server) for _ in range(3)]
        try:
            async def writer(w: int) -> None:
                for i in range(15):
                    await logs[w].append("session-hot", [f"w{w}-{i}".encode()], ANY_VERSION, f"w{w}-{i}")
            await asyncio.gather(*(writer(w) for w in range(3)))
            events = await logs[0].read_stream("session-hot")
            assert [e.version for e in events] == list(range(1, 46))
            assert sorted(e.event for e in events) == sorted(f"w{w}-{i}".encode() for w in range(3) for i in range(15))
        finally:
            for log in logs:
                await log.close()
    run(go)


def test_an_unacknowledged_commit_is_unknown_and_its_retry_writes_it_once(nats_server: NatsServer) -> None:
    async def before() -> None:
        log = await _log(nats_server, request_timeout_s=0.5)
        try:
            await log.append("session-a", [b"e1"], 0, "c-1")
            nats_server.stop()
            with pytest.raises(StorageUnavailable) as err:
                await log.append("session-a", [b"e2"], 1, "c-2")
            assert err.value.outcome == UNKNOWN
        finally:
            await log.close()

    async def after() -> list[bytes]:
        log = await _log(nats_server)
        try:
            retried = await log.append("session-a", [b"e2"], 1, "c-2")
            again = await log.append("session-a", [b"e2"], 1, "c-2")
            assert again.duplicate and again.first_position == retried.first_position
            return [e.event for e in await log.read_stream("session-a")]
        finally:
            await log.close()

    run(before)
    nats_server.start()
    assert run(after) == [b"e1", b"e2"]


# --- shard leases and the fenced append -----------------------------------------------------------


def test_a_lease_is_exclusive_renewable_and_released(nats_server: NatsServer) -> None:
    async def go() -> None:
        log = await _log(nats_server)
        try:
            leases = await ShardLeases.open(log, ttl_s=30)
            a = await leases.acquire(3, "node-a")
            with pytest.raises(LeaseHeld) as err:
                await leases.acquire(3, "node-b")
            assert err.value.holder == "node-a"
            renewed = await leases.renew(a)
            assert renewed.epoch == a.epoch and renewed.revision > a.revision
            assert await leases.holder(3) == ("node-a", renewed.revision)
            with pytest.raises(LeaseLost):
                await leases.renew(a)  # an old revision: not ours any more
            assert await leases.release(renewed)
            assert await leases.holder(3) is None
            b = await leases.acquire(3, "node-b")
            assert b.epoch > renewed.revision
            assert not await leases.release(renewed)
        finally:
            await log.close()
    run(go)


def test_a_lease_under_the_nodes_own_name_is_taken_on_at_once_with_a_new_epoch(nats_server: NatsServer) -> None:
    """A create whose answer was lost (the lease is the node's, the node does not know it), or the
    node before a restart: the node does not wait out its own lease, and the old one is over."""

    async def go() -> None:
        log = await _log(nats_server)
        try:
            leases = await ShardLeases.open(log, ttl_s=30)
            old = await leases.acquire(5, "node-a")
            again = await leases.acquire(5, "node-a")
            assert again.epoch > old.epoch and await leases.holder(5) == ("node-a", again.revision)
            with pytest.raises(LeaseLost):
                await leases.renew(old)  # the lease before is over
            with pytest.raises(LeaseHeld):
                await leases.acquire(5, "node-b")  # and another node still waits for it
        finally:
            await log.close()
    run(go)


async def _take_over_after_expiry(acquire: Callable[[], Awaitable[Lease]], ttl_s: float) -> Lease:
    """``acquire()`` as soon as the current lease expired on the server (bounded: a few TTLs)."""
    deadline = time.monotonic() + 5 * ttl_s + 5
    while True:
        try:
            return await acquire()
        except LeaseHeld:
            assert time.monotonic() < deadline, "the lease never expired"
            await asyncio.sleep(0.1)


def test_lease_ttl_expiry_lets_a_new_owner_acquire_with_a_higher_revision(nats_server: NatsServer) -> None:
    async def go() -> None:
        log = await _log(nats_server)
        try:
            leases = await ShardLeases.open(log, ttl_s=1)
            a = await leases.acquire(5, "node-a")
            b = await _take_over_after_expiry(lambda: leases.acquire(5, "node-b"), leases.ttl_s)
            assert b.epoch > a.epoch
            with pytest.raises(LeaseLost):
                await leases.renew(a)
            assert (await leases.holder(5)) == ("node-b", b.revision)
        finally:
            await log.close()
    run(go)


async def _stale_owner_scenario(server: NatsServer, stall: bool,
                                 b_writes: bool = True) -> tuple[ShardOwner, list[bytes], BaseException]:
    """node-a owns the session's shard and commits; it pauses past its lease, node-b takes the
    shard over (and, with ``b_writes``, commits to the session); node-a resumes and tries to
    commit. ``stall``: node-a's local deadline check passed before the pause (its lease looks
    valid to it), so only the server can refuse."""
    log_a, log_b = await _log(server), await _log(server)
    try:
        a = ShardOwner(log_a, await ShardLeases.open(log_a, ttl_s=1), "node-a")
        b = ShardOwner(log_b, await ShardLeases.open(log_b, ttl_s=1), "node-b")
        stream = "session-fenced"
        shard = log_a.shard_of(stream)
        lease_a = await a.acquire(shard)
        await a.append(stream, [b"a1"], 0, "a-1")
        lease_b = await _take_over_after_expiry(lambda: b.acquire(shard), 1)
        assert lease_b.epoch > lease_a.epoch
        if b_writes:
            await b.append(stream, [b"b2"], await log_b.stream_version(stream), "b-2")
        if stall:
            a._held[shard] = msgspec.structs.replace(lease_a, deadline=float("inf"))  # noqa: SLF001
        with pytest.raises(LeaseLost) as err:
            await a.append(stream, [b"a-stale"], 1, "a-2")
        events = [e.event for e in await log_a.read_stream(stream)]
        return a, events, err.value
    finally:
        await log_a.close()
        await log_b.close()


def test_a_stale_owner_past_its_lease_refuses_to_append_locally(nats_server: NatsServer) -> None:
    owner, events, err = run(lambda: _stale_owner_scenario(nats_server, stall=False))
    assert events == [b"a1", b"b2"]
    assert "deadline" in str(err) and owner.drops == 1 and not owner.held


def test_a_stale_owner_whose_lease_looks_valid_is_refused_by_the_server_fence(nats_server: NatsServer) -> None:
    owner, events, err = run(lambda: _stale_owner_scenario(nats_server, stall=True))
    assert events == [b"a1", b"b2"]
    assert "fence" in str(err) and owner.drops == 1 and not owner.held


def test_a_stale_owner_is_refused_on_a_session_the_new_owner_never_wrote(nats_server: NatsServer) -> None:
    """The gap a per-stream check leaves: node-b took the shard and wrote nothing to the session,
    so the session's own last sequence is still the one node-a expects; the shard's fence (node-b's
    takeover marker) refuses node-a all the same."""
    owner, events, err = run(lambda: _stale_owner_scenario(nats_server, stall=True, b_writes=False))
    assert events == [b"a1"]
    assert "fence" in str(err) and owner.drops == 1


def test_no_commit_of_a_stalled_owner_is_accepted_after_a_takeover_on_any_stream_of_the_shard(
        nats_server: NatsServer) -> None:
    async def go() -> tuple[int, int, list[bytes]]:
        log_a, log_b = await _log(nats_server), await _log(nats_server)
        try:
            a = ShardOwner(log_a, await ShardLeases.open(log_a, ttl_s=1), "node-a")
            b = ShardOwner(log_b, await ShardLeases.open(log_b, ttl_s=1), "node-b")
            shard = log_a.shard_of("session-x")
            same_shard = [n for n in (f"session-{i}" for i in range(400)) if log_a.shard_of(n) == shard][:5]
            lease_a = await a.acquire(shard)
            for name in same_shard[:4]:  # the fifth is a session node-a creates after the takeover
                await a.append(name, [b"a1"], 0, f"{name}-a1")
            seq_a = a._shard_seq[shard]  # noqa: SLF001  (what node-a's next append expects)
            await _take_over_after_expiry(lambda: b.acquire(shard), 1)
            await b.append(same_shard[0], [b"b2"], 1, "b-2")  # node-b touches one session only
            accepted = 0
            for i, name in enumerate(same_shard):
                # node-a stalled after its deadline check: every try looks valid to it
                a._held[shard] = msgspec.structs.replace(lease_a, deadline=float("inf"))  # noqa: SLF001
                a._shard_seq[shard] = seq_a  # noqa: SLF001
                try:
                    await a.append(name, [b"stale"], await log_a.stream_version(name), f"stale-{i}")
                    accepted += 1
                except LeaseLost:
                    pass
            stale = [e.event for e in await log_b.read_all() if e.event == b"stale"]
            return accepted, a.drops, stale
        finally:
            await log_a.close()
            await log_b.close()
    accepted, drops, stale = run(go)
    assert accepted == 0 and stale == []
    assert drops == 5


def test_an_owner_does_not_append_to_a_shard_it_does_not_hold(nats_server: NatsServer) -> None:
    async def go() -> None:
        log = await _log(nats_server)
        try:
            owner = ShardOwner(log, await ShardLeases.open(log, ttl_s=30), "node-a")
            with pytest.raises(LeaseLost, match="no lease held"):
                await owner.append("session-x", [b"e"], 0, "c-1")
            assert await log.stream_version("session-x") == 0
            lease = await owner.acquire(log.shard_of("session-x"))
            assert owner.epoch_of(lease.shard) == lease.epoch
            done = await owner.append("session-x", [b"e"], 0, "c-1")
            assert done.last_version == 1
            assert await owner.release(lease.shard)
            with pytest.raises(LeaseLost):
                owner.epoch_of(lease.shard)
        finally:
            await log.close()
    run(go)
