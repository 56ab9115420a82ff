"""``serve --cluster`` as a cluster of machines: three hosts (network namespaces joined by veth pairs
to a bridge, tests/e2e/netns.py), each running one nats-server of a three-server JetStream cluster
and one sessionloop node (``--log-replicas 3``), all on their own addresses; bots with idempotency
keys and an owner connect from the test's namespace over the bridge, as clients on the network do.

Under faults: kill -9 the serving node 20 times; partition its host from the others (``ip link set
… down`` on its switch port) briefly and past the lease, and heal it; pause it (SIGSTOP) past its
lease and resume it; kill -9 the NATS server on its host. After each: every acknowledged input once,
in the order sent, every turn run once (FIFO), each takeover within the lease and a second, every
owner's resubscription in a new epoch with nothing it was pushed missing and its pushes above the
snapshot's seq, and the log's count of commits accepted from a stale owner (written under a lease
older than one before it in the shard): 0.

The lease is 3 s where only nodes fail. Where a NATS server is lost to the others (a partition of
its host, a kill), JetStream elects new leaders for what it led (4-9 s in nats-server), so those
tests run the 20 s lease that docs/deployment.md asks of R=3 (``serve`` warns under 15 s).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from sessionloop.cli.natsproc import NatsCluster
from tests.e2e.conftest import Client, initialized
from tests.e2e.netns import Hosts
from tests.e2e.test_cluster_failover import (
    OWNER_TOKEN,
    FailoverBot,
    Node,
    _first_started,
    _log_nodes,
    _wait_started,
    stale_commits,
)
from tests.e2e.test_workers_kill import assert_each_input_once_in_order, finish

NODE_FAULT_TTL_S = 3.0
NATS_FAULT_TTL_S = 20.0
TAKEOVERS = 20
BOTS = 4


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    net = Hosts(3)
    yield net
    net.close()


@pytest.fixture
def nats(hosts: Hosts, tmp_path: Path) -> Iterator[NatsCluster]:
    cluster = NatsCluster(tmp_path / "nats", hosts=hosts.addresses, prefixes=[hosts.prefix(i) for i in range(3)],
                          ready_timeout_s=60)
    cluster.start()
    yield cluster
    cluster.stop()


class Cluster:
    """Node ``h<i>`` on host ``i``, its data in ``tmp_path/h<i>`` (a node started again on its host
    comes back with its data); ``active`` is the node that serves (where bots and the owner go)."""

    def __init__(self, tmp_path: Path, hosts: Hosts, nats: NatsCluster, lease_ttl_s: float) -> None:
        self.tmp_path, self.hosts, self.nats, self.lease_ttl_s = tmp_path, hosts, nats, lease_ttl_s
        self.nodes: list[Node] = []
        self.host_of: dict[int, int] = {}
        self.routes: dict[str, Node] = {}

    def start(self, i: int) -> Node:
        node = Node(self.tmp_path, f"h{i}", self.nats.url, "--log-replicas", "3", lease_ttl_s=self.lease_ttl_s,
                    host=self.hosts.addresses[i], prefix=self.hosts.prefix(i))
        self.nodes.append(node)
        self.host_of[id(node)] = i
        return node

    def first(self, i: int) -> Node:
        """Start the first node, on host ``i``, and wait until it serves."""
        node = self.start(i)
        _wait_started(node, timeout=60)
        self.serve_from(node)
        return node

    def serve_from(self, node: Node) -> None:
        self.routes["active"] = node

    @property
    def active(self) -> Node:
        return self.routes["active"]

    def stop(self) -> dict[int, int | None]:
        return {id(n): n.stop() for n in reversed(self.nodes)}


class Owner:
    """An owner on the serving node: its own session, subscribed, a turn at a time; on a lost
    connection it resubscribes on whichever node serves then. Each snapshot must be in a new epoch
    and hold (with the history pages before it) every item it was pushed before; each push must be
    in its subscription's epoch with a seq above the one before it (above the snapshot's first)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.session_id = ""
        self.epochs: list[int] = []
        self.pushed: set[str] = set()
        self.turns = 0
        self.problems: list[str] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                async with connect(self.cluster.active.url, additional_headers={
                        "Authorization": f"Bearer {OWNER_TOKEN}"}, open_timeout=5) as ws:
                    await self._session(await initialized(ws), stop)
            except (TimeoutError, OSError, WebSocketException):
                await asyncio.sleep(0.2)

    async def _session(self, c: Client, stop: asyncio.Event) -> None:
        if not self.session_id:
            self.session_id = (await c.result("session/create", {}))["session"]["id"]
        snap = await c.result("session/subscribe", {"sessionId": self.session_id})
        if self.epochs and snap["epoch"] <= self.epochs[-1]:
            self.problems.append(f"epoch {snap['epoch']} after {self.epochs[-1]}")
        held = {i["itemId"] for i in snap["items"]}
        before = snap.get("before")
        while before is not None and not self.pushed <= held:  # the older items, a history page at a time
            page = await c.result("session/history", {"sessionId": self.session_id, "before": before, "limit": 200})
            held |= {i["itemId"] for i in page["items"]}
            before = page.get("before")
        missing = self.pushed - held
        if missing:
            self.problems.append(f"snapshot of epoch {snap['epoch']} lacks pushed items {sorted(missing)}")
        self.epochs.append(snap["epoch"])
        seq = snap["seq"]
        while not stop.is_set():
            sent = await c.call("turn/send", {"sessionId": self.session_id, "content": f"owner {self.turns}"})
            if "error" in sent:  # a turn the node before left running is still being settled here
                await asyncio.sleep(0.2)
                continue
            while True:
                msg = await c.push(lambda m: "seq" in m.get("params", {}), timeout=20)
                p = msg["params"]
                if p.get("sessionId") != self.session_id:
                    continue
                if p["epoch"] != snap["epoch"] or p["seq"] <= seq:
                    self.problems.append(f"push {p['epoch']}/{p['seq']} after {snap['epoch']}/{seq}")
                seq = p["seq"]
                if msg["method"] == "item/completed":
                    self.pushed.add(p["item"]["itemId"])
                    if p["item"]["kind"] == "turn":
                        self.turns += 1
                        break


@pytest.mark.timeout(360)
def test_kill_9_of_the_serving_node_20_times_a_standby_on_another_host_takes_over_within_the_lease(
        tmp_path: Path, hosts: Hosts, nats: NatsCluster) -> None:
    cluster = Cluster(tmp_path, hosts, nats, NODE_FAULT_TTL_S)
    first = cluster.first(0)
    standbys = [cluster.start(1), cluster.start(2)]
    takeovers: list[float] = []
    epochs = [first.epoch]
    bots = [FailoverBot(cluster.routes, i) for i in range(BOTS)]
    owner = Owner(cluster)

    async def go() -> list[dict[str, Any]]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(b.run(stop)) for b in bots]
        watching = asyncio.create_task(owner.run(stop))
        for _ in range(TAKEOVERS):
            await asyncio.sleep(1.0)
            assert not any(n.started.is_set() for n in standbys), "a standby served while the leases were held"
            active = cluster.active
            killed_at = time.monotonic()
            active.proc.kill()
            new = await asyncio.to_thread(_first_started, standbys)
            takeovers.append(new.serving_at - killed_at)
            epochs.append(new.epoch)
            cluster.serve_from(new)
            active.stop()
            standbys.remove(new)
            standbys.append(cluster.start(cluster.host_of[id(active)]))  # back on its host, with its data
        await asyncio.sleep(1.0)
        ends = await finish(bots, stop, tasks)
        await asyncio.wait_for(watching, 30)
        return ends

    try:
        ends = asyncio.run(go())
    finally:
        last = cluster.active
        statuses = cluster.stop()
    assert all(e["state"] == "completed" for e in ends), ends
    assert sum(len(b.acked) for b in bots) > 2 * TAKEOVERS  # the bots kept working across the takeovers
    print(f"takeovers (s, kill -> serving): min {min(takeovers):.2f} median {sorted(takeovers)[TAKEOVERS // 2]:.2f} "
          f"max {max(takeovers):.2f}")
    assert max(takeovers) <= NODE_FAULT_TTL_S + 1.0, takeovers
    assert epochs == sorted(set(epochs)), epochs  # each owner's epoch above every earlier one's
    assert statuses[id(last)] == 0
    assert_each_input_once_in_order(os.path.join(str(last.data), "store"), bots)
    # the owner resubscribed after most takeovers (it may sit out one while it reconnects) with no gap
    assert not owner.problems, owner.problems
    assert len(owner.epochs) >= TAKEOVERS // 2 and owner.turns > TAKEOVERS, (owner.epochs, owner.turns)
    assert stale_commits(nats.url, 3) == 0
    in_log = _log_nodes(nats.url, 3)
    for b in bots:
        owners = in_log[f"session-{b.session_id}"]
        changes = [n for i, n in enumerate(owners) if i == 0 or owners[i - 1] != n]
        assert len(changes) <= TAKEOVERS + 1, changes


def _drop_connections(bots: list[FailoverBot]) -> None:
    """What a load balancer does once a backend stops answering: its clients' connections go (a
    partitioned node's sockets would otherwise wait out the bots' 15 s reply timeout)."""
    for bot in bots:
        if bot.ws is not None:
            bot.ws.transport.abort()


@pytest.mark.timeout(300)
def test_a_partitioned_host_rides_out_a_short_cut_and_after_a_long_one_its_node_stops_and_another_takes_over(
        tmp_path: Path, hosts: Hosts, nats: NatsCluster) -> None:
    cluster = Cluster(tmp_path, hosts, nats, NATS_FAULT_TTL_S)
    a = cluster.first(0)
    standbys = [cluster.start(1), cluster.start(2)]
    bots = [FailoverBot(cluster.routes, i) for i in range(3)]

    async def go() -> tuple[float, list[dict[str, Any]]]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(bot.run(stop)) for bot in bots]
        await asyncio.sleep(2.0)
        # a cut of 2 s (a tenth of the lease, under an election's timeout): ridden out
        hosts.cut(0)
        await asyncio.sleep(2.0)
        hosts.heal(0)
        acked = sum(len(bot.acked) for bot in bots)
        deadline = time.monotonic() + 20
        while sum(len(bot.acked) for bot in bots) < acked + 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert a.proc.poll() is None, a.stderr()[-3000:]
        assert not any(n.started.is_set() for n in standbys)
        assert sum(len(bot.acked) for bot in bots) >= acked + 10, a.stderr()[-3000:]
        # a cut past the lease: the host's node stops, a node on another host takes over
        cut_at = time.monotonic()
        hosts.cut(0)
        new = await asyncio.to_thread(_first_started, standbys, NATS_FAULT_TTL_S + 30)
        took_over = new.serving_at - cut_at
        cluster.serve_from(new)
        _drop_connections(bots)
        assert await asyncio.to_thread(a.proc.wait, 30) == 1
        hosts.heal(0)
        # healed, the host's node comes back as a standby and the cluster serves on
        back = cluster.start(0)
        await asyncio.sleep(3.0)
        assert not back.started.is_set()
        return took_over, await finish(bots, stop, tasks)

    try:
        took_over, ends = asyncio.run(go())
    finally:
        hosts.heal(0)
        last = cluster.active
        statuses = cluster.stop()
    assert all(e["state"] == "completed" for e in ends), ends
    print(f"takeover after the cut: {took_over:.2f} s")
    assert took_over <= NATS_FAULT_TTL_S + 1.0, took_over
    assert "lost shard" in a.stderr()
    assert statuses[id(last)] == 0
    assert_each_input_once_in_order(os.path.join(str(last.data), "store"), bots)
    assert stale_commits(nats.url, 3) == 0
    in_log = _log_nodes(nats.url, 3)
    for bot in bots:
        owners = in_log[f"session-{bot.session_id}"]
        assert owners[0] == "h0" and owners[-1] == last.name and "h0" not in owners[owners.index(last.name):], owners


@pytest.mark.timeout(180)
def test_a_node_paused_past_its_lease_is_fenced_and_stops_when_it_wakes(
        tmp_path: Path, hosts: Hosts, nats: NatsCluster) -> None:
    cluster = Cluster(tmp_path, hosts, nats, NODE_FAULT_TTL_S)
    a = cluster.first(0)
    bot = FailoverBot(cluster.routes, 0)
    b: Node | None = None

    async def go() -> None:
        nonlocal b
        created = await bot.call("loop/create", {"containerId": "inbox", "initialMessage": {
            "text": "hello", "idempotencyKey": "p-create"}})
        bot.session_id = created["sessionId"]
        first = await bot.call("loop/send", {"sessionId": bot.session_id, "text": "!sleep 4000\nslow",
                                             "idempotencyKey": "p-0"})
        a.proc.send_signal(signal.SIGSTOP)  # mid-turn: its commits are due while it sleeps
        paused_at = time.monotonic()
        b = cluster.start(1)
        await asyncio.to_thread(_wait_started, b, 60)
        assert b.serving_at - paused_at <= NODE_FAULT_TTL_S + 1.0 + 1.5  # the standby's own start included
        cluster.serve_from(b)
        await bot.close()
        bot.ws = None
        a.proc.send_signal(signal.SIGCONT)
        assert await asyncio.to_thread(a.proc.wait, 30) == 1
        end = await bot.call("loop/waitForTurn", {"sessionId": bot.session_id, "turnId": first["turnId"],
                                                  "timeoutMs": 20000})
        assert end["state"] in ("completed", "failed", "aborted"), end
        again = await bot.call("loop/send", {"sessionId": bot.session_id, "text": "after", "idempotencyKey": "p-1"})
        done = await bot.call("loop/waitForTurn", {"sessionId": bot.session_id, "turnId": again["turnId"],
                                                   "timeoutMs": 20000})
        assert done["state"] == "completed"
        await bot.close()

    try:
        asyncio.run(go())
    finally:
        statuses = cluster.stop()
    assert statuses[id(a)] == 1
    assert "lost shard" in a.stderr() and "stopped" in a.stderr()
    owners = _log_nodes(nats.url, 3)[f"session-{bot.session_id}"]
    assert owners[0] == "h0" and "h1" in owners
    assert owners == sorted(owners), owners  # h0's commits all before h1's
    assert stale_commits(nats.url, 3) == 0


@pytest.mark.timeout(300)
def test_kill_9_of_the_nats_server_on_the_serving_host_the_node_serves_on_through_the_others(
        tmp_path: Path, hosts: Hosts, nats: NatsCluster) -> None:
    cluster = Cluster(tmp_path, hosts, nats, NATS_FAULT_TTL_S)
    a = cluster.first(0)
    standby = cluster.start(1)
    bots = [FailoverBot(cluster.routes, i) for i in range(3)]

    async def go() -> list[dict[str, Any]]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(b.run(stop)) for b in bots]
        await asyncio.sleep(2.0)
        nats.kill_server(0)
        acked = sum(len(b.acked) for b in bots)
        deadline = time.monotonic() + 25  # an election or two, then the bots go on
        while sum(len(b.acked) for b in bots) < acked + 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert a.proc.poll() is None, a.stderr()[-3000:]  # still serving
        assert sum(len(b.acked) for b in bots) >= acked + 10, a.stderr()[-4000:]  # and the bots went on
        assert not standby.started.is_set()
        return await finish(bots, stop, tasks)

    try:
        ends = asyncio.run(go())
    finally:
        statuses = cluster.stop()
    assert all(e["state"] == "completed" for e in ends), ends
    assert statuses[id(a)] == 0
    assert_each_input_once_in_order(os.path.join(str(a.data), "store"), bots)
    assert stale_commits(",".join(nats.urls[1:]), 3) == 0
