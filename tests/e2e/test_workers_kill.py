"""``serve --workers N`` under bot load while a random worker is SIGKILLed again and again.

Bots (an app token, the Session Loop API over real WebSockets) each drive one session: a send with
an idempotency key, then ``loop/waitForTurn``; on a dropped connection they connect again (any
worker) and on ``unavailable``/``rejected`` they wait ``retryAfterMs``, always retrying the same
key. Meanwhile a worker chosen at random is killed 20 times, each time after the one before it
serves again. Then the store is read: every acknowledged input is there once, in the order it was
sent (FIFO per session), every turn started once and ended once, and every session answers again.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from tests.e2e.test_workers_wire import worker_pid

BOT_TOKEN = "bot-token-for-the-worker-kill-tests-0123456789"
KILLS = 20
BOTS = 6


class Bot:
    """One session, sent to in order; reconnects and retries the same key until acknowledged."""

    def __init__(self, url: str, index: int) -> None:
        self.url = url
        self.index = index
        self.ws: Any = None
        self.next_id = 0
        self.session_id: str | None = None
        self.acked: list[tuple[str, str]] = []  # (key, turn id), in send order
        self.reconnects = 0
        self.refusals = 0

    def target(self) -> str:
        """The URL the next connection goes to."""
        return self.url

    async def _connect(self) -> None:
        while True:
            try:
                self.ws = await connect(self.target(), additional_headers={"Authorization": f"Bearer {BOT_TOKEN}"},
                                        open_timeout=5)
                await self._call_once("initialize", {"protocolVersion": "0.2.0",
                                                     "client": {"name": "kill-bot", "version": "1"}})
                return
            except (TimeoutError, OSError, WebSocketException):
                self.reconnects += 1
                await asyncio.sleep(0.2)

    async def _call_once(self, method: str, params: dict[str, Any], timeout: float = 15) -> dict[str, Any]:
        self.next_id += 1
        rid = self.next_id
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            if msg.get("id") == rid:
                return msg

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The result, retried across dropped connections and ``unavailable``/``rejected``."""
        while True:
            if self.ws is None:
                await self._connect()
            try:
                reply = await self._call_once(method, params)
            except (TimeoutError, OSError, WebSocketException):
                self.ws = None
                self.reconnects += 1
                continue
            if "result" in reply:
                result = reply["result"]
                if isinstance(result, dict) and result.get("state") == "rejected":
                    self.refusals += 1
                    await asyncio.sleep(result.get("retryAfterMs", 1000) / 1000)
                    continue
                return result
            data = reply["error"].get("data") or {}
            if data.get("code") in ("unavailable", "rejected", "storage-unavailable"):
                self.refusals += 1
                await asyncio.sleep(min(data.get("retryAfterMs", 500), 1000) / 1000)
                continue
            raise AssertionError(f"{method}: {reply}")

    async def run(self, stop: asyncio.Event) -> None:
        created = await self.call("loop/create", {"containerId": "inbox", "initialMessage": {
            "text": "hello", "idempotencyKey": f"bot{self.index}-create"}})
        self.session_id = created["sessionId"]
        n = 0
        while not stop.is_set():
            key = f"bot{self.index}-{n}"
            receipt = await self.call("loop/send", {"sessionId": self.session_id, "text": f"m{n}",
                                                    "idempotencyKey": key})
            self.acked.append((key, receipt["turnId"]))
            await self.call("loop/waitForTurn", {"sessionId": self.session_id, "turnId": receipt["turnId"],
                                                 "timeoutMs": 10000})
            n += 1

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


def serving(server, worker: int, workers: int) -> int:
    """How many incarnations of ``worker`` said they serve (its log line, in the server's log)."""
    server.log.flush()
    with open(server.log.name) as f:
        return f.read().count(f"worker {worker} of {workers} serving")


async def _kill_loop(server, workers: int, rng: random.Random) -> list[int]:
    """Kill a worker that serves, 20 times; with more than two workers the next one may die while
    the last is starting again (one of them always serves)."""
    killed: list[int] = []
    restarting: dict[int, int] = {}  # worker -> its serving count when it was killed
    while len(killed) < KILLS or restarting:
        await asyncio.sleep(0.1)
        for worker, before in list(restarting.items()):
            if serving(server, worker, workers) > before:
                del restarting[worker]
        if len(killed) >= KILLS or len(restarting) >= max(1, workers // 2):
            continue
        await asyncio.sleep(rng.uniform(0.2, 0.5))
        victim = rng.choice([w for w in range(workers) if w not in restarting])
        restarting[victim] = serving(server, victim, workers)
        os.kill(worker_pid(server, victim), signal.SIGKILL)
        killed.append(victim)
    return killed


@pytest.mark.timeout(400)
@pytest.mark.parametrize("workers", [2, 4])
def test_sigkill_a_random_worker_20_times_under_bot_load_loses_duplicates_and_reorders_nothing(
        server_factory, tmp_path, workers):
    data = tmp_path / "data"
    data.mkdir()
    (data / "apps.toml").write_text(f'[apps.killbot]\ntoken = "{BOT_TOKEN}"\nplatform = "telegram"\n'
                                    'containers = ["inbox"]\n')
    server = server_factory("--workers", str(workers), data_dir=str(data))
    rng = random.Random(20 + workers)
    bots = [Bot(server.url, i) for i in range(BOTS)]

    async def go():
        stop = asyncio.Event()
        tasks = [asyncio.create_task(b.run(stop)) for b in bots]
        await asyncio.sleep(1.0)
        killed = await _kill_loop(server, workers, rng)
        # every session answers again, whichever worker runs it now
        return killed, await finish(bots, stop, tasks)

    killed, ends = asyncio.run(go())
    assert len(killed) == KILLS and len(set(killed)) > 1
    assert all(e["state"] == "completed" for e in ends), ends
    assert sum(len(b.acked) for b in bots) > 20  # the bots kept working through the kills
    assert server.stop() == 0
    assert_each_input_once_in_order(os.path.join(str(data), "store"), bots)


async def finish(bots: list[Bot], stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> list[dict[str, Any]]:
    """Stop the bots' loops, then send each session a last input and wait for its turn: the ends."""
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
    finals = [await b.call("loop/send", {"sessionId": b.session_id, "text": "last",
                                         "idempotencyKey": f"bot{b.index}-last"}) for b in bots]
    ends = [await b.call("loop/waitForTurn", {"sessionId": b.session_id, "turnId": f["turnId"],
                                              "timeoutMs": 20000}) for b, f in zip(bots, finals, strict=True)]
    for b in bots:
        await b.close()
    return ends


def assert_each_input_once_in_order(store_path: str, bots: list[Bot]) -> None:
    """The store at ``store_path`` holds each bot's acknowledged inputs once, in the order sent,
    with the turns their receipts named, and ran every turn once, in that order (FIFO)."""
    store = open_store(store_path, readonly=True)
    try:
        for b in bots:
            recorded = [r.event for r in store.read_stream(f"session-{b.session_id}")]
            inputs = [(e.idempotency_key, e.turn_id) for e in recorded if isinstance(e, E.InputAccepted)]
            sent = [(f"bot{b.index}-create", None), *b.acked, (f"bot{b.index}-last", None)]
            # each acknowledged input once, in the order it was sent, with the turn its receipt named
            assert [k for k, _ in inputs] == [k for k, _ in sent], (b.index, inputs, sent)
            assert all(t is None or t == got for (_, t), (_, got) in zip(sent, inputs, strict=True))
            started = [e.turn_id for e in recorded if isinstance(e, E.TurnStarted)]
            ended = [e.turn_id for e in recorded
                     if isinstance(e, (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached))]
            assert started == [t for _, t in inputs]  # FIFO: turns ran in the order the inputs came
            assert sorted(ended) == sorted(started) and len(set(ended)) == len(ended)
    finally:
        store.close()
