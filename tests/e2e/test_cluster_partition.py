"""``serve --cluster`` cut off from its log: the active node reaches nats-server through a TCP hop
on loopback that the test cuts (every connection dropped, new ones refused) and heals, as a
network partition does to it; the standby reaches the server directly.

A cut shorter than the lease is ridden out (the node reconnects, renews and serves on, its bots'
commits waiting and landing); a longer one costs the node its leases: it stops saying why, the
standby takes over within the lease and a second of the cut, and when the partition heals the old
node comes back as a standby. Every acknowledged input once and in order, and no commit of the cut-off
node after the new owner's first.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from sessionloop.cli.natsproc import NatsServer
from tests.e2e.test_cluster_failover import FailoverBot, Node, _log_nodes, _wait_started
from tests.e2e.test_workers_kill import assert_each_input_once_in_order, finish

LEASE_TTL_S = 3.0


class Hop:
    """A TCP relay from a loopback port to ``upstream``, on a thread of its own: ``cut()`` drops
    every connection through it and refuses new ones; ``heal()`` accepts again on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        self.heal()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _call(self, coro) -> None:  # type: ignore[no-untyped-def]
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def heal(self) -> None:
        async def listen() -> None:
            self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port, reuse_address=True)
        self._call(listen())

    def cut(self) -> None:
        async def drop() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()
        self._call(drop())

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def close(self) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.mark.timeout(180)
def test_a_partition_shorter_than_the_lease_is_ridden_out_a_longer_one_moves_the_node_to_the_standby(
        tmp_path: Path, nats_server: NatsServer) -> None:
    hop = Hop(("127.0.0.1", nats_server.port))
    a = Node(tmp_path, "a", hop.url, lease_ttl_s=LEASE_TTL_S)
    b: Node | None = None
    try:
        _wait_started(a)
        b = Node(tmp_path, "b", nats_server.url, lease_ttl_s=LEASE_TTL_S)
        cluster = {"active": a}
        bots = [FailoverBot(cluster, i) for i in range(3)]

        async def go() -> tuple[float, list[dict]]:
            assert b is not None
            stop = asyncio.Event()
            tasks = [asyncio.create_task(bot.run(stop)) for bot in bots]
            await asyncio.sleep(1.5)
            # a cut of a third of the lease: the node rides it out
            hop.cut()
            await asyncio.sleep(LEASE_TTL_S / 3)
            hop.heal()
            acked = sum(len(bot.acked) for bot in bots)
            await asyncio.sleep(LEASE_TTL_S * 1.5)
            assert a.proc.poll() is None, a.stderr()[-3000:]
            assert not b.started.is_set()
            assert sum(len(bot.acked) for bot in bots) > acked
            # a cut past the lease: the node stops, the standby takes over
            cut_at = time.monotonic()
            hop.cut()
            await asyncio.to_thread(_wait_started, b)
            took_over = b.serving_at - cut_at
            cluster["active"] = b
            assert await asyncio.to_thread(a.proc.wait, 30) == 1
            hop.heal()
            await asyncio.sleep(1.0)
            return took_over, await finish(bots, stop, tasks)

        took_over, ends = asyncio.run(go())
        assert all(e["state"] == "completed" for e in ends), ends
        assert took_over <= LEASE_TTL_S + 1.0, took_over
        assert "lost shard" in a.stderr()
    finally:
        a.stop()
        if b is not None:
            assert b.stop() == 0
        hop.close()
    assert b is not None
    assert_each_input_once_in_order(os.path.join(str(b.data), "store"), bots)
    in_log = _log_nodes(nats_server.url)
    for bot in bots:
        owners = in_log[f"session-{bot.session_id}"]
        assert owners == sorted(owners) and owners[-1] == "b", owners  # none of a's after b's first
