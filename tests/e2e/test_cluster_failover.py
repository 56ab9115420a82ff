"""``serve --cluster`` on one nats-server (JetStream, R=1) on loopback: the nodes (real ``serve``
processes, each on a data directory of its own), the bots and the owner that the cluster tests
share (tests/e2e/test_cluster_netns.py runs them on three hosts under faults), the readers of the
log they check (which node and lease each commit came from), and the owner's resubscription: a
watcher of a killed node resubscribes on the node that took over, in a new epoch, nothing lost.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sessionloop.cli.natsproc import NatsServer
from sessionloop.eventstore.errors import StorageUnavailable
from sessionloop.eventstore.jetstream_log import JetStreamLog
from sessionloop.eventstore.log_replica import LogSidecar
from tests.e2e.conftest import initialized, open_client
from tests.e2e.test_workers_kill import BOT_TOKEN, Bot, finish

LEASE_TTL_S = 2.0
OWNER_TOKEN = "owner-token-of-the-cluster-tests"
TAKEOVERS = 20
BOTS = 4
REPO = Path(__file__).resolve().parents[2]


class Node:
    """One ``serve --cluster`` process; ``started`` once it printed its listening line."""

    def __init__(self, tmp_path: Path, name: str, nats_url: str, *extra: str,
                 lease_ttl_s: float = LEASE_TTL_S, host: str = "127.0.0.1", prefix: Sequence[str] = ()) -> None:
        """``host``: the address it listens on; ``prefix``: what it runs under (``ip netns exec NAME``)."""
        self.name = name
        self.host = host
        self.data = tmp_path / name
        self.data.mkdir(exist_ok=True)
        (self.data / "apps.toml").write_text(f'[apps.killbot]\ntoken = "{BOT_TOKEN}"\nplatform = "telegram"\n'
                                             'containers = ["inbox"]\n')
        self.log_path = tmp_path / f"{name}.log"
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "sessionloop", "serve", "--data", str(self.data), "--host", host,
             "--port", "0", "--token",
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
            match = re.search(rf"{re.escape(self.host)}:(\d+)/session.*epoch (\d+)", line)
            if match and not self.started.is_set():
                self.port, self.epoch = int(match.group(1)), int(match.group(2))
                self.serving_at = time.monotonic()
                self.started.set()

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/session"

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


def _serving_and_standby(tmp_path: Path, nats_url: str) -> tuple[Node, Node]:
    """Node ``a`` serving on the log at ``nats_url``, node ``b`` started after it (it stands by)."""
    a = Node(tmp_path, "a", nats_url)
    _wait_started(a)
    return a, Node(tmp_path, "b", nats_url)


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


def _log_commits(url: str, replicas: int = 1) -> dict[int, list[tuple[str, str, int]]]:
    """Per shard: each of its commits in the log, in log order, as (stream, node, lease revision)."""

    async def read() -> dict[int, list[tuple[str, str, int]]]:
        log = await JetStreamLog.connect(url, shards=16, replicas=replicas)
        try:
            out: dict[int, list[tuple[str, str, int]]] = {}
            for shard in range(16):
                last = await log.shard_head(shard)
                if last:
                    async for _seq, commit in log.shard_commits(shard, last):
                        side = msgspec.msgpack.decode(commit.extra, type=LogSidecar)
                        out.setdefault(shard, []).append((commit.stream, side.node, side.lease))
            return out
        finally:
            await log.close()

    deadline = time.monotonic() + 30
    while True:
        try:
            return asyncio.run(read())
        except StorageUnavailable:  # a cluster that lost a server may still be electing a leader
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _log_nodes(url: str, replicas: int = 1) -> dict[str, list[str]]:
    """Per session stream: the node of each of its commits in the log, in log order."""
    out: dict[str, list[str]] = {}
    for commits in _log_commits(url, replicas).values():
        for stream, node, _lease in commits:
            out.setdefault(stream, []).append(node)
    return out


def stale_commits(url: str, replicas: int = 1) -> int:
    """How many commits the log accepted from a stale owner: written under a lease older than one a
    commit before it in the same shard was written under (every commit carries its lease's revision)."""
    stale = 0
    for commits in _log_commits(url, replicas).values():
        newest = 0
        for _stream, _node, lease in commits:
            assert lease > 0, commits  # every commit names the lease it was written under
            stale += lease < newest
            newest = max(newest, lease)
    return stale


@pytest.mark.timeout(120)
def test_an_owner_watching_on_the_old_node_resumes_on_the_new_one_with_a_new_epoch_and_no_gap(
        tmp_path: Path, nats_server: NatsServer) -> None:
    a, b = _serving_and_standby(tmp_path, nats_server.url)

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


@pytest.mark.timeout(120)
def test_an_approval_pending_on_a_killed_node_goes_on_on_the_new_one_and_its_answer_runs_the_call(
        tmp_path: Path, nats_server: NatsServer) -> None:
    a, b = _serving_and_standby(tmp_path, nats_server.url)

    async def go() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        async with open_client(a, token=OWNER_TOKEN) as ws:
            c = await initialized(ws)
            assert await c.result("presence/update", {"active": True}) == {}
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": sid})
            await c.result("turn/send", {"sessionId": sid, "content": '!tool exec {"command": "echo approved"}'})
            asked = await c.push(lambda m: m["method"] == "approval/requested", timeout=30)
            a.proc.kill()
        await asyncio.to_thread(_wait_started, b)
        async with open_client(b, token=OWNER_TOKEN) as ws:
            c = await initialized(ws)
            await c.result("session/subscribe", {"sessionId": sid})
            assert await c.result("presence/update", {"active": True}) == {}  # back: it is asked again
            again = await c.push(lambda m: m["method"] == "approval/requested", timeout=30)
            carried = again["params"]["approval"]
            answered = await c.call("approval/respond", {"approvalId": carried["id"], "decision": "approve",
                                                         "contentHash": carried["contentHash"]})
            await c.turn_done(sid, timeout=30)
            history = await c.result("session/history", {"sessionId": sid, "limit": 200})
            settled = [p["params"] for p in c.pushes if p["method"] == "approval/settled"]
        return asked["params"]["approval"], carried, answered, [history, *settled]

    try:
        first, carried, answered, (history, *settled) = asyncio.run(go())
    finally:
        a.stop()
        b.stop()
    assert carried == first  # the same approval: its id, facts, hash and expiry
    assert "result" in answered, answered
    assert [(s["state"], s["source"]) for s in settled] == [("approved", "answer")], settled
    calls = [i for i in history["items"] if i["kind"] == "tool-call"]
    assert calls and calls[-1]["status"] == "completed", calls
    assert "approved" in str(calls[-1].get("output") or calls[-1])
    assert "carried 1 pending approvals" in b.stderr()


async def _all_events(bot: FailoverBot, after: str | None = None) -> list[tuple[str, str, str]]:
    """Every event of the bot's app after ``after``, page by page: (cursor, session, type)."""
    out: list[tuple[str, str, str]] = []
    while True:
        page = await bot.call("loop/listEvents", {"limit": 50, **({"after": after} if after else {})})
        out += [(e["cursor"], e["sessionId"], e["type"]) for e in page["events"]]
        if page.get("nextCursor") is None:
            return out
        after = page["nextCursor"]


@pytest.mark.timeout(120)
def test_a_bots_event_cursor_from_the_killed_node_reads_on_on_the_new_one_nothing_skipped_or_repeated(
        tmp_path: Path, nats_server: NatsServer) -> None:
    a, b = _serving_and_standby(tmp_path, nats_server.url)
    cluster = {"active": a}
    bots = [FailoverBot(cluster, i) for i in range(4)]  # four sessions, on different shards

    async def go() -> tuple[list[tuple[str, str, str]], str, list[tuple[str, str, str]], list[tuple[str, str, str]]]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(bot.run(stop)) for bot in bots]  # their commits interleave
        while sum(len(bot.acked) for bot in bots) < 20:
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*tasks)
        on_a = await _all_events(bots[0])
        cursor = on_a[len(on_a) // 3][0]
        a.proc.kill()
        await asyncio.to_thread(_wait_started, b)
        cluster["active"] = b
        await bots[0].close()
        bots[0].ws = None
        after_on_b = await _all_events(bots[0], cursor)
        done = await finish(bots, asyncio.Event(), [])  # one more turn each, on the new node
        assert all(e["state"] == "completed" for e in done), done
        return on_a, cursor, after_on_b, await _all_events(bots[0], on_a[-1][0])

    try:
        on_a, cursor, after_on_b, new = asyncio.run(go())
    finally:
        a.stop()
        b.stop()
    # the cursor of node a means the same on node b: the rest of a's events, nothing skipped or repeated
    assert after_on_b == on_a[len(on_a) // 3 + 1:], (cursor, on_a, after_on_b)
    # and what node b adds comes after every cursor node a gave
    assert new and {s for _c, s, _t in new} == {bot.session_id for bot in bots}
    assert min(int(c) for c, _s, _t in new) > max(int(c) for c, _s, _t in on_a)
