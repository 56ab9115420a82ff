"""``serve --cluster`` when the log's NATS servers fail: real nats-servers (JetStream), real ``serve``
processes, real SIGKILL.

With one NATS server (R=1) a node that cannot reach it cannot renew its leases: it stops within
the lease's TTL, saying why (never serving on while it cannot commit), and serves again, with
everything it acknowledged, once the server is back. (The loss of one of three servers, R=3, is
in tests/e2e/test_cluster_netns.py.)
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sessionloop.cli.natsproc import NatsServer
from tests.e2e.test_cluster_failover import FailoverBot, Node, _wait_started

LEASE_TTL_S = 2.0


async def _send_and_wait(bot: FailoverBot, key: str) -> dict:
    receipt = await bot.call("loop/send", {"sessionId": bot.session_id, "text": key, "idempotencyKey": key})
    end = await bot.call("loop/waitForTurn", {"sessionId": bot.session_id, "turnId": receipt["turnId"],
                                              "timeoutMs": 20000})
    assert end["state"] == "completed", end
    return receipt


@pytest.mark.timeout(120)
def test_a_node_whose_nats_server_died_stops_within_its_lease_saying_why_and_serves_again_after(
        tmp_path: Path, nats_server: NatsServer) -> None:
    a = Node(tmp_path, "a", nats_server.url)
    _wait_started(a)
    cluster = {"active": a}
    bot = FailoverBot(cluster, 0)
    receipts: list[dict] = []

    async def before() -> None:
        created = await bot.call("loop/create", {"containerId": "inbox", "initialMessage": {
            "text": "hello", "idempotencyKey": "bot0-create"}})
        bot.session_id = created["sessionId"]
        for n in range(3):
            receipts.append(await _send_and_wait(bot, f"bot0-{n}"))
        await bot.close()
        bot.ws = None

    asyncio.run(before())
    killed_at = time.monotonic()
    nats_server.kill()
    status = a.proc.wait(LEASE_TTL_S + 15)
    stopped_after = time.monotonic() - killed_at
    assert status == 1
    assert "lost shard" in a.stderr() and "stopped" in a.stderr()
    assert stopped_after <= LEASE_TTL_S + 10, stopped_after  # the lease, then the drain of what was open
    a.stop()

    nats_server.start()  # the same port and store: the log is as it was
    again = Node(tmp_path, "a", nats_server.url)
    try:
        _wait_started(again)
        cluster["active"] = again

        async def after() -> None:
            repeat = await bot.call("loop/send", {"sessionId": bot.session_id, "text": "bot0-2",
                                                  "idempotencyKey": "bot0-2"})
            assert repeat["turnId"] == receipts[-1]["turnId"] and repeat["state"] == "duplicate"
            await _send_and_wait(bot, "bot0-3")
            await bot.close()

        asyncio.run(after())
    finally:
        assert again.stop() == 0
