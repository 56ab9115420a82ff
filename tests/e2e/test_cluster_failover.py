"""``serve --cluster``: nodes whose stores follow the event log on a real nats-server (JetStream),
real ``serve`` processes on loopback, real SIGKILL and SIGSTOP.

One node serves, two stand by, each on a data directory of its own. Bots (an app token, the
Session Loop API over real WebSockets, idempotency keys) drive their sessions on whichever node
serves; the active node is killed 20 times, and each time one standby (never both) takes over, its store
brought up to the log, and the killed one comes back as a standby. Then the log and the
last node's store are read: every acknowledged input once, in the order it was sent, every turn
run once, each takeover within the lease's TTL and a second, every epoch above the one before.
A node paused past its lease is fenced: when it wakes the log refuses it, it stops (status 1,
saying why), and the log holds no commit of it after the new owner took over.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sessionloop.cli.natsproc import NatsServer
from sessionloop.eventstore.jetstream_log import JetStreamLog
from sessionloop.eventstore.log_replica import LogSidecar
from tests.e2e.conftest import initialized, open_client
from tests.e2e.test_workers_kill import BOT_TOKEN, Bot, assert_each_input_once_in_order, finish

LEASE_TTL_S = 2.0
OWNER_TOKEN = "owner-token-of-the-cluster-tests"
TAKEOVERS = 20
BOTS = 4
REPO = Path(__file__).resolve().parents[2]


class Node:
    """One ``serve --cluster`` process; ``started`` once it printed its listening line."""

    def __init__(self, tmp_path: Path, name: str, nats_url: str, *extra: str,
                 lease_ttl_s: float = LEASE_TTL_S) -> None:
        self.name = name
        self.data = tmp_path / name
        self.data.mkdir(exist_ok=True)
        (self.data / "apps.toml").write_text(f'[apps.killbot]\ntoken = "{BOT_TOKEN}"\nplatform = "telegram"\n'
                                             'containers = ["inbox"]\n')
        self.log_path = tmp_path / f"{name}.log"
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sessionloop", "serve", "--data", str(self.data), "--port", "0", "--token",
             OWNER_TOKEN, "--durability", "nosync", "--cluster", nats_url,
             "--node-id", name, "--lease-ttl", str(lease_ttl_s), *extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=REPO)
        self.port = self.epoch = 0
        self.started = threading.Event()
        self.serving_at = 0.0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            match = re.search(r"127\.0\.0\.1:(\d+)/session.*epoch (\d+)", line)
            if match and not self.started.is_set():
                self.port, self.epoch = int(match.group(1)), int(match.group(2))
                self.serving_at = time.monotonic()
                self.started.set()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/session"

    def stderr(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        return self.proc.wait(5)


class FailoverBot(Bot):
    """A bot that connects to whichever node serves now."""

    def __init__(self, cluster: dict[str, Node], index: int) -> None:
        super().__init__("", index)
        self.cluster = cluster

    def target(self) -> str:
        return self.cluster["active"].url


def _wait_started(node: Node, timeout: float = 30) -> None:
    if not node.started.wait(timeout):
        raise AssertionError(f"node {node.name} did not serve: {node.stderr()[-3000:]}")


def _first_started(nodes: list[Node], timeout: float = 30) -> Node:
    """The first of ``nodes`` to serve; the others must still stand by a moment later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = [n for n in nodes if n.started.is_set()]
        if started:
            time.sleep(0.3)
            assert len([n for n in nodes if n.started.is_set()]) == 1, "two standbys both took over"
            return started[0]
        time.sleep(0.01)
    raise AssertionError(f"no standby took over: {[n.stderr()[-1500:] for n in nodes]}")


def _log_nodes(url: str) -> dict[str, list[str]]:
    """Per session stream: the node of each of its commits in the log, in log order."""

    async def read() -> dict[str, list[str]]:
        log = await JetStreamLog.connect(url, shards=16)
        try:
            out: dict[str, list[str]] = {}
            for shard in range(16):
                last = await log.shard_head(shard)
                if last:
                    async for _seq, commit in log.shard_commits(shard, last):
                        side = msgspec.msgpack.decode(commit.extra, type=LogSidecar)
                        out.setdefault(commit.stream, []).append(side.node)
            return out
        finally:
            await log.close()
    return asyncio.run(read())


@pytest.mark.timeout(300)
def test_a_standby_takes_over_each_killed_node_within_the_lease_losing_and_duplicating_nothing(
        tmp_path: Path, nats_server: NatsServer) -> None:
    nodes = [Node(tmp_path, "a", nats_server.url)]
    _wait_started(nodes[0])
    cluster = {"active": nodes[0]}
    standbys = [Node(tmp_path, "b", nats_server.url), Node(tmp_path, "c", nats_server.url)]
    nodes.extend(standbys)
    takeovers: list[float] = []
    epochs = [nodes[0].epoch]
    bots = [FailoverBot(cluster, i) for i in range(BOTS)]

    async def go() -> list[dict[str, Any]]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(b.run(stop)) for b in bots]
        for _ in range(TAKEOVERS):
            await asyncio.sleep(1.0)
            assert not any(n.started.is_set() for n in standbys), "a standby served while the leases were held"
            active = cluster["active"]
            killed_at = time.monotonic()
            active.proc.kill()
            new = await asyncio.to_thread(_first_started, standbys)
            takeovers.append(new.serving_at - killed_at)
            epochs.append(new.epoch)
            cluster["active"] = new
            active.stop()
            standbys.remove(new)
            standbys.append(Node(tmp_path, active.name, nats_server.url))  # the killed node's data comes back
            nodes.append(standbys[-1])
        await asyncio.sleep(1.0)
        return await finish(bots, stop, tasks)

    try:
        ends = asyncio.run(go())
    finally:
        last = cluster["active"]
        statuses = {id(n): n.stop() for n in reversed(nodes)}
    assert all(e["state"] == "completed" for e in ends), ends
    assert sum(len(b.acked) for b in bots) > 2 * TAKEOVERS  # the bots kept working across the takeovers
    assert len(takeovers) == TAKEOVERS
    print(f"takeovers (s, kill -> serving): min {min(takeovers):.2f} median {sorted(takeovers)[TAKEOVERS // 2]:.2f} "
          f"max {max(takeovers):.2f}")
    assert max(takeovers) <= LEASE_TTL_S + 1.0, takeovers
    assert epochs == sorted(set(epochs)), epochs  # each owner's epoch above every earlier one's
    assert statuses[id(last)] == 0
    assert_each_input_once_in_order(os.path.join(str(last.data), "store"), bots)
    # the log holds the same history: every session stream's commits came from one node at a time
    in_log = _log_nodes(nats_server.url)
    for b in bots:
        owners = in_log[f"session-{b.session_id}"]
        changes = [n for i, n in enumerate(owners) if i == 0 or owners[i - 1] != n]
        assert len(changes) <= TAKEOVERS + 1, changes


@pytest.mark.timeout(120)
def test_a_node_paused_past_its_lease_is_fenced_and_stops_when_it_wakes(
        tmp_path: Path, nats_server: NatsServer) -> None:
    a = Node(tmp_path, "a", nats_server.url)
    _wait_started(a)
    cluster = {"active": a}
    bot = FailoverBot(cluster, 0)
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
        b = Node(tmp_path, "b", nats_server.url)
        await asyncio.to_thread(_wait_started, b)
        assert b.serving_at - paused_at <= LEASE_TTL_S + 1.0 + 1.0  # the standby's own start included
        cluster["active"] = b
        await bot.close()
        bot.ws = None
        a.proc.send_signal(signal.SIGCONT)
        status = await asyncio.to_thread(a.proc.wait, 30)
        assert status == 1
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
        a_status = a.stop()
        if b is not None:
            b.stop()
    assert a_status == 1
    assert "lost shard" in a.stderr() and "stopped" in a.stderr()
    owners = _log_nodes(nats_server.url)[f"session-{bot.session_id}"]
    assert owners[0] == "a" and "b" in owners
    # 0 commits from the stale owner after the new one's first: a's are all before b's
    assert owners == sorted(owners), owners


@pytest.mark.timeout(120)
def test_an_owner_watching_on_the_old_node_resumes_on_the_new_one_with_a_new_epoch_and_no_gap(
        tmp_path: Path, nats_server: NatsServer) -> None:
    a = Node(tmp_path, "a", nats_server.url)
    _wait_started(a)
    b = Node(tmp_path, "b", nats_server.url)

    async def go() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        async with open_client(a, token=OWNER_TOKEN) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            before = await c.result("session/subscribe", {"sessionId": sid})
            for text in ("one", "two"):
                assert await c.result("turn/send", {"sessionId": sid, "content": text}) == {}
                await c.turn_done(sid, timeout=30)
            seen = [p for p in c.pushes if p["method"] == "item/completed" and p["params"]["sessionId"] == sid]
            a.proc.kill()
        await asyncio.to_thread(_wait_started, b)
        async with open_client(b, token=OWNER_TOKEN) as ws:
            c = await initialized(ws)
            after = await c.result("session/subscribe", {"sessionId": sid})
            assert await c.result("turn/send", {"sessionId": sid, "content": "three"}) == {}
            await c.turn_done(sid, timeout=30)
            later = [p["params"] for p in c.pushes if p["params"].get("sessionId") == sid and "seq" in p["params"]]
        return before, after, [p["params"] for p in seen] + later, {"sid": sid}

    try:
        before, after, pushes, _ = asyncio.run(go())
    finally:
        a.stop()
        b.stop()
    assert after["epoch"] > before["epoch"]
    # the new node's snapshot holds every item the old one pushed (nothing lost in the takeover) ...
    old_items = {p["item"]["itemId"] for p in pushes if p["epoch"] == before["epoch"] and "item" in p}
    assert old_items and old_items <= {i["itemId"] for i in after["items"]}
    texts = [i["text"] for i in after["items"] if i["kind"] == "agent-message"]
    assert texts == ["echo: one", "echo: two"]
    # ... and its pushes continue above the snapshot's seq, in the new epoch, in order
    new = [p for p in pushes if p["epoch"] == after["epoch"]]
    assert new and all(p["seq"] > after["seq"] for p in new)
    assert [p["seq"] for p in new] == sorted(p["seq"] for p in new)
