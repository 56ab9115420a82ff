"""How long a takeover takes on ``serve --cluster`` as the log grows: a hot standby against a cold one.

    python benchmarks/bench_failover.py                 # 200 sessions x 25 turns, lease 2 s
    python benchmarks/bench_failover.py --quick         # 50 sessions x 10 turns

A nats-server with JetStream on loopback; node A serves (``--lease-ttl``), its log filled by bots
(the Session Loop API over WebSocket: ``loop/send`` then ``loop/waitForTurn``, an idempotency key
each). Then, for each size of the log:

* **hot**: node B, started on an empty data directory once the log is filled, stands by long
  enough to read it (a fifth of a millisecond a message, at least 3 s) and keeps up with it; A is
  SIGKILLed and the time from the kill to B's listening line is measured;
* **cold**: node C starts on an empty data directory right after B is SIGKILLed, so it must read
  the whole log before it serves; the same time is measured from B's kill.

The log is filled again between rounds (``--rounds``), so each round's takeover meets a longer
log. Prints a table and writes ``benchmarks/results/failover.json``. Every figure includes the
lease running out (at most ``--lease-ttl`` after the kill) and the node's own start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from websockets.asyncio.client import connect  # noqa: E402

from benchmarks.measure import fill_defaults, write_results  # noqa: E402
from benchmarks.server_proc import log_messages  # noqa: E402
from sessionloop.cli.natsproc import NatsServer  # noqa: E402

BOT_TOKEN = "bench-failover-bot-token-0123456789abcdef"
OWNER_TOKEN = "bench-failover-owner-token-0123456789"


class Node:
    """A ``serve --cluster`` process; ``serving_at`` once it printed its listening line."""

    def __init__(self, work: str, name: str, nats_url: str, ttl: float) -> None:
        self.data = os.path.join(work, f"{name}-{time.monotonic_ns()}")
        os.makedirs(self.data)
        with open(os.path.join(self.data, "apps.toml"), "w") as f:
            f.write(f'[apps.bench]\ntoken = "{BOT_TOKEN}"\nplatform = "bench"\ncontainers = ["inbox"]\n')
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sessionloop", "serve", "--data", self.data, "--port", "0", "--token",
             OWNER_TOKEN, "--durability", "nosync", "--cluster", nats_url, "--node-id", name,
             "--lease-ttl", str(ttl)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        self.port = 0
        self.serving_at = 0.0
        self.started = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            match = re.search(r"127\.0\.0\.1:(\d+)/session", line)
            if match and not self.started.is_set():
                self.port, self.serving_at = int(match.group(1)), time.monotonic()
                self.started.set()

    def wait(self, timeout: float = 600) -> None:
        if not self.started.wait(timeout):
            raise SystemExit(f"node {self.data} did not serve within {timeout} s")

    def kill(self) -> float:
        self.proc.kill()
        self.proc.wait()
        return time.monotonic()


async def fill(port: int, sessions: int, turns: int, tag: str) -> int:
    """``sessions`` bots (one connection and session each) send ``turns`` inputs one after another."""

    async def bot(i: int) -> int:
        async with connect(f"ws://127.0.0.1:{port}/session", max_size=None,
                           additional_headers={"Authorization": f"Bearer {BOT_TOKEN}"}) as ws:
            next_id = 0

            async def call(method: str, params: dict[str, Any]) -> Any:
                nonlocal next_id
                next_id += 1
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params}))
                while True:
                    msg = json.loads(await ws.recv())
                    if msg.get("id") == next_id:
                        if "result" not in msg:
                            raise SystemExit(f"{method}: {msg}")
                        return msg["result"]

            await call("initialize", {"protocolVersion": "0.2.0", "client": {"name": "failover", "version": "1"}})
            sid = (await call("loop/create", {"containerId": "inbox"}))["sessionId"]
            for n in range(turns):
                receipt = await call("loop/send", {"sessionId": sid, "text": f"m{n}",
                                                   "idempotencyKey": f"{tag}-{i}-{n}"})
                await call("loop/waitForTurn", {"sessionId": sid, "turnId": receipt["turnId"], "timeoutMs": 60000})
            return turns

    done = await asyncio.gather(*(bot(i) for i in range(sessions)))
    return sum(done)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50 sessions x 10 turns a round, 2 rounds")
    ap.add_argument("--sessions", type=int, help="bots (a session each) filling the log (default 200)")
    ap.add_argument("--turns", type=int, help="turns each bot sends a round (default 25)")
    ap.add_argument("--rounds", type=int, help="rounds: fill, hot takeover, cold takeover (default 3)")
    ap.add_argument("--lease-ttl", type=float, default=2.0)
    args = ap.parse_args()
    fill_defaults(args, [("sessions", 200, 50), ("turns", 25, 10), ("rounds", 3, 2)])
    work = tempfile.mkdtemp(prefix="bench-failover-")
    nats = NatsServer(log_path=os.path.join(work, "nats.log"), store_dir=os.path.join(work, "js"))
    nats.start()
    rows: list[dict[str, Any]] = []
    nodes: list[Node] = []
    try:
        active = Node(work, "n0", nats.url, args.lease_ttl)
        nodes.append(active)
        active.wait()
        turns = 0
        for r in range(args.rounds):
            turns += asyncio.run(fill(active.port, args.sessions, args.turns, f"r{r}"))
            messages = asyncio.run(log_messages(nats))
            hot = Node(work, f"hot{r}", nats.url, args.lease_ttl)
            nodes.append(hot)
            # it stands by, catching up with the log (a new standby reads ~10,000 messages a second here)
            time.sleep(max(3.0, args.lease_ttl * 2, messages / 5_000))
            killed = active.kill()
            hot.wait()
            hot_s = hot.serving_at - killed
            killed = hot.kill()
            cold = Node(work, f"cold{r}", nats.url, args.lease_ttl)
            nodes.append(cold)
            cold.wait()
            cold_s = cold.serving_at - killed
            active = cold
            rows.append({"round": r + 1, "turns": turns, "log_messages": messages, "hot_takeover_s": hot_s,
                         "cold_takeover_s": cold_s})
            print(f"  round {r + 1}: {turns:,} turns, {messages:,} log messages: hot {hot_s:.2f} s, "
                  f"cold {cold_s:.2f} s", flush=True)
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
                try:
                    node.proc.wait(30)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
        nats.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nTakeover (kill -> the new node's listening line), lease ttl {args.lease_ttl:.1f} s")
    print(f"{'turns in the log':>18}{'log messages':>15}{'hot standby (s)':>18}{'cold, empty dir (s)':>22}")
    for row in rows:
        print(f"{row['turns']:>18,}{row['log_messages']:>15,}{row['hot_takeover_s']:>18.2f}"
              f"{row['cold_takeover_s']:>22.2f}")
    write_results("failover", {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick,
                               "lease_ttl_s": args.lease_ttl, "sessions": args.sessions, "turns": args.turns,
                               "rows": rows})


if __name__ == "__main__":
    main()
