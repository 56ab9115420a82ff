"""The reliability harness (RELIABILITY.md): a real server under bot load, killed with SIGKILL;
a recorder of every client operation; a checker of the history; a store auditor.

Invariants checked after every trial:
* every acknowledged input (a ``loop/send`` receipt the client received) is in the log;
* no input is in the log twice and no turn started twice (idempotency keys, turn ids);
* an input whose receipt never arrived, sent again with its key, is never a second turn;
* every session resumes and every turn ends;
* the store opens cleanly and its indexes agree with its log (auditor).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import connect

from eventstore import EventStore
from eventstore import events as E
from tests.e2e.conftest import Client, ServerProcess

APP_TOKEN = "reliability-bot-token"
APPS = f"""
[apps.loadbot]
token = "{APP_TOKEN}"
platform = "test"
containers = ["inbox"]
"""


def prepare(data_dir: str) -> None:
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "apps.toml"), "w") as f:
        f.write(APPS)


SERVE_ARGS = ("--durability", "sync")


def start(data_dir: str, env: dict[str, str] | None = None) -> ServerProcess:
    return ServerProcess(data_dir, *SERVE_ARGS, env=env).start()


@dataclass
class Op:
    session_id: str
    key: str
    text: str
    receipt: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class Recorder:
    sessions: list[str] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)

    def acknowledged(self) -> list[Op]:
        return [op for op in self.ops if op.receipt is not None and op.receipt.get("state") != "rejected"]

    def unknown(self) -> list[Op]:
        return [op for op in self.ops if op.receipt is None]


async def app_client(server: ServerProcess) -> tuple[Any, Client]:
    ws = await connect(server.url, additional_headers={"Authorization": f"Bearer {APP_TOKEN}"})
    client = Client(ws)
    await client.result("initialize", {"protocolVersion": "0.2.0", "client": {"name": "rel", "version": "1"}})
    return ws, client


async def create_sessions(server: ServerProcess, rec: Recorder, n: int) -> None:
    ws, c = await app_client(server)
    try:
        for _ in range(n):
            rec.sessions.append((await result(c, "loop/create", {"containerId": "inbox"}))["sessionId"])
    finally:
        await ws.close()


async def load(server: ServerProcess, rec: Recorder, rng: random.Random, trial: int, bots: int = 4) -> None:
    """Bots send inputs with idempotency keys until the server dies under them."""

    async def bot(b: int) -> None:
        try:
            ws, c = await app_client(server)
        except Exception:
            return
        j = 0
        try:
            while True:
                sid = rng.choice(rec.sessions)
                text = rng.choice(["hello", "!tool list_files {\"path\": \".\"}", "!sleep 30\nslow"])
                op = Op(sid, f"t{trial}-b{b}-m{j}", text)
                rec.ops.append(op)
                j += 1
                reply = await call(c, "loop/send", {"sessionId": sid, "text": text, "idempotencyKey": op.key})
                if "result" in reply:
                    op.receipt = reply["result"]
                    if op.receipt["state"] == "rejected":
                        await asyncio.sleep(op.receipt["retryAfterMs"] / 1000 / 20)
                else:
                    op.error = json.dumps(reply["error"])
        except Exception:
            return  # the server died: the op in flight stays unknown
        finally:
            await ws.close()

    await asyncio.gather(*(bot(b) for b in range(bots)))


async def call(c: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A call that waits out the per-connection rate limit (its error says how long)."""
    while True:
        reply = await c.call(method, params)
        error = reply.get("error")
        if error and error.get("data", {}).get("code") == "rejected":
            await asyncio.sleep(error["data"].get("retryAfterMs", 50) / 1000)
            continue
        return reply


async def result(c: Client, method: str, params: dict[str, Any]) -> Any:
    reply = await call(c, method, params)
    assert "result" in reply, reply
    return reply["result"]


def kill_after(server: ServerProcess, delay: float) -> None:
    time.sleep(delay)
    if server.proc is not None and server.proc.poll() is None:
        server.proc.send_signal(signal.SIGKILL)


async def settle(server: ServerProcess, rec: Recorder, since: int = 0, timeout: float = 30.0) -> dict[str, Any]:
    """After a restart: resend every unknown op with its key, then wait for every turn of the ops
    from ``since`` on to end (earlier trials' turns were waited for after their own restart)."""
    ws, c = await app_client(server)
    resent = {"duplicate": 0, "accepted": 0, "queued": 0, "rejected": 0}
    try:
        for op in rec.unknown():
            while True:
                reply = await call(c, "loop/send", {"sessionId": op.session_id, "text": op.text,
                                                     "idempotencyKey": op.key})
                assert "result" in reply, f"resend of {op.key} failed: {reply}"
                if reply["result"]["state"] != "rejected":
                    break
                await asyncio.sleep(0.05)
            op.receipt = reply["result"]
            resent[reply["result"]["state"]] += 1
        for op in rec.ops[since:]:
            if op.receipt is None or op.receipt.get("turnId") is None:
                continue
            done = await result(c, "loop/waitForTurn", {"sessionId": op.session_id, "turnId": op.receipt["turnId"],
                                                        "timeoutMs": int(timeout * 1000)})
            assert done["state"] == "completed", f"turn of {op.key} ended {done}"
        # an acknowledged key sent again is a duplicate with the same turn
        for op in [o for o in rec.ops[since:] if o.receipt is not None and o.receipt.get("turnId")][:10]:
            again = await result(c, "loop/send", {"sessionId": op.session_id, "text": op.text, "idempotencyKey": op.key})
            assert again["state"] == "duplicate" and again["turnId"] == op.receipt["turnId"], (op, again)
    finally:
        await ws.close()
    return resent


def audit(data_dir: str, rec: Recorder) -> dict[str, int]:
    """Open the store read-only (the server may run) and check the log against the record."""
    store = EventStore.open(os.path.join(data_dir, "store"), readonly=True)
    try:
        keys_seen: dict[str, str] = {}
        turns: int = 0
        for sid in rec.sessions:
            events = store.read_stream(f"session-{sid}")
            assert [e.version for e in events] == list(range(1, len(events) + 1))
            started: set[str] = set()
            ended: set[str] = set()
            for e in events:
                ev = e.event
                if isinstance(ev, E.InputAccepted) and ev.idempotency_key:
                    assert ev.idempotency_key not in keys_seen, f"input {ev.idempotency_key} twice"
                    keys_seen[ev.idempotency_key] = ev.turn_id
                    assert store.get_receipt(f"app:loadbot:{sid}", ev.idempotency_key) is not None
                elif isinstance(ev, E.TurnStarted):
                    assert ev.turn_id not in started, f"turn {ev.turn_id} started twice"
                    started.add(ev.turn_id)
                elif isinstance(ev, (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)):
                    ended.add(ev.turn_id)
            assert started == ended, f"session {sid}: turns started but not ended: {started - ended}"
            turns += len(started)
        for op in rec.acknowledged():
            assert keys_seen.get(op.key) == op.receipt["turnId"], f"acknowledged input {op.key} lost"
        # RELIABILITY kill9_random, "0 stale readers": the server's own open cleared the reader
        # slots of the process that was killed, so this open finds none left to clear
        assert store.info()["stale_readers_cleared"] == 0, "stale LMDB reader slots survived a restart"
        return {"inputs": len(keys_seen), "turns": turns}
    finally:
        store.close()
