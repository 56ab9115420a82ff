"""One client process of ``benchmarks/bench_realistic.py``: bots on the Session Loop API over
WebSocket (``loop/create``, ``loop/send``, ``loop/waitForTurn``) and owner connections subscribed
to a share of their sessions, taking every frame.

Run by the parent as ``python benchmarks/realistic_client.py SPEC_JSON``; it talks to the parent
by lines: it prints ``READY`` once its sessions exist and its owner connections are subscribed,
waits for ``GO`` on stdin, runs every session's turns closed-loop (each session sends its next
input when the turn before completed), prints ``DONE``, then its result as one JSON line (per
turn its session, turn id and latency; the parent reads the turn's model time from the store).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from websockets.asyncio.client import connect  # noqa: E402

from benchmarks.measure import now  # noqa: E402
from sessionloop.cli.bench_ws import Rejected, WsClient  # noqa: E402

PROTOCOL = {"protocolVersion": "0.2.0", "client": {"name": "realistic", "version": "1"}}
WAIT_MS = 600_000


def app_id(a: int) -> str:
    return f"bot{a}"


def app_token(a: int) -> str:
    return f"realistic-bench-app-token-{a:08d}"


def turn_text(spec: dict[str, Any], app: int, s: int, t: int) -> str:
    """The input of turn ``t`` of session ``s``: ``--answer-chars`` characters, so the mock's echo
    streams for about ``answer_chars / 4 / tokens_per_s`` seconds."""
    head = f"bot {app} session {s} turn {t}: "
    filler = "the quick brown fox jumps over the lazy dog " * (spec["answer_chars"] // 44 + 1)
    return (head + filler)[: max(len(head), spec["answer_chars"])].rstrip()


async def open_client(port: int, token: str) -> WsClient:
    ws = await connect(f"ws://127.0.0.1:{port}/session", max_size=None, compression=None, ping_interval=None,
                       open_timeout=120, additional_headers={"Authorization": f"Bearer {token}"})
    client = WsClient(ws)
    await call(client, "initialize", PROTOCOL)
    return client


async def call(client: WsClient, method: str, params: dict[str, Any]) -> Any:
    while True:
        try:
            return await client.call(method, params)
        except Rejected as e:  # the per-connection request rate limit: wait as told
            await asyncio.sleep(e.retry_after_ms / 1000)


class Bots:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.port = spec["port"]
        self.conns: dict[int, list[WsClient]] = {}
        self.sessions: list[tuple[int, int, str, WsClient]] = []  # (app, index, session id, connection)
        self.owners: list[WsClient] = []
        self.turns: list[tuple[str, str, float]] = []  # (session id, turn id, send -> completed seconds)
        self.problems: list[str] = []

    async def setup(self) -> None:
        spec = self.spec
        per_app, per_conn = spec["sessions_per_app"], spec["sessions_per_conn"]
        gate = asyncio.Semaphore(64)

        async def make(app: int, s: int, conn: WsClient) -> None:
            async with gate:
                made = await call(conn, "loop/create", {"containerId": "inbox", "title": f"bot {app} chat {s}",
                                                        "permissionMode": "acceptCalls"})
            self.sessions.append((app, s, str(made["sessionId"]), conn))

        jobs = []
        for app in spec["apps"]:
            self.conns[app] = [await open_client(self.port, app_token(app)) for _ in range(-(-per_app // per_conn))]
            jobs += [make(app, s, self.conns[app][s // per_conn]) for s in range(per_app)]
        await asyncio.gather(*jobs)
        self.sessions.sort(key=lambda x: (x[0], x[1]))
        # a share of the sessions watched by owner connections, every frame taken (decoded, checked)
        every = max(1, round(1 / spec["subscribed"])) if spec["subscribed"] > 0 else 0
        watched = [sid for k, (_, _, sid, _) in enumerate(self.sessions) if every and k % every == 0]
        for k in range(0, len(watched), spec["subs_per_owner_conn"]):
            owner = await open_client(self.port, spec["owner_token"])
            self.owners.append(owner)
            await asyncio.gather(*(call(owner, "session/subscribe", {"sessionId": sid})
                                   for sid in watched[k:k + spec["subs_per_owner_conn"]]))
        self.watched = len(watched)

    async def session(self, app: int, s: int, sid: str, conn: WsClient) -> None:
        for t in range(self.spec["turns"]):
            text = turn_text(self.spec, app, s, t)
            key = f"{sid}-t{t}"
            t0 = now()
            while True:
                r = await call(conn, "loop/send", {"sessionId": sid, "text": text, "idempotencyKey": key})
                if r["state"] != "rejected":
                    break
                await asyncio.sleep((r.get("retryAfterMs") or 1000) / 1000)
            res = await call(conn, "loop/waitForTurn", {"sessionId": sid, "turnId": r["turnId"], "timeoutMs": WAIT_MS})
            elapsed = now() - t0
            if res["state"] != "completed" or res.get("outputText") != f"echo: {text}":
                if len(self.problems) < 10:
                    self.problems.append(f"{key}: {res.get('state')} {str(res.get('outputText'))[:60]!r}")
                continue
            self.turns.append((sid, str(r["turnId"]), elapsed))

    async def run(self) -> tuple[float, float]:
        t0 = now()
        await asyncio.gather(*(self.session(*x) for x in self.sessions))
        return t0, now()

    async def close(self) -> None:
        for c in [*(c for cs in self.conns.values() for c in cs), *self.owners]:
            try:
                await c.close()
            except Exception:  # noqa: BLE001,S110 - closing after the run
                pass


async def line(expected: str) -> None:
    got = (await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)).strip()
    if got != expected:
        raise SystemExit(f"client: expected {expected!r} from the parent, got {got!r}")


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    bots = Bots(spec)
    await bots.setup()
    print("READY", flush=True)
    await line("GO")
    cpu0 = time.process_time()
    t0, t1 = await bots.run()
    cpu = time.process_time() - cpu0
    print("DONE", flush=True)
    await asyncio.sleep(0.5)  # the owner connections' last frames (they may trail the bots' replies)
    frames = sum(o.stream.frames for o in bots.owners)
    deltas = sum(o.stream.deltas for o in bots.owners)
    answers = sum(o.stream.answers for o in bots.owners)
    broken = sum(o.stream.broken for o in bots.owners)
    problems = bots.problems + [p for o in bots.owners for p in o.stream.problems][:10]
    await bots.close()
    return {"start": t0, "end": t1, "cpu_s": cpu, "sessions": len(bots.sessions), "watched": bots.watched,
            "connections": sum(len(c) for c in bots.conns.values()) + len(bots.owners),
            "turns": bots.turns,
            "owner_frames": frames, "owner_deltas": deltas, "owner_answers": answers, "owner_broken": broken,
            "failed_turns": spec["turns"] * len(bots.sessions) - len(bots.turns), "problems": problems}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))), flush=True)
