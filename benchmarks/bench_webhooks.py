"""What a slow or absent webhook receiver costs the server: turn throughput side by side.

    python benchmarks/bench_webhooks.py                 # 3 repeats x 3 modes, 15 s each
    python benchmarks/bench_webhooks.py --quick

Three modes, interleaved (every repeat runs each once, the order rotated, so the drift of a shared
machine falls on all alike), each a fresh ``sessionloop serve`` (``--durability`` as given, the
server under ``taskset -c 0`` and this process under CPU 1 when the machine has two):

* ``none``:    the app has no webhook (no outbox entries, nothing delivered);
* ``slow``:    a real receiver on 127.0.0.1 that sleeps 2 s before answering 204;
* ``refused``: a URL on 127.0.0.1 where nothing listens (every attempt is a refused connection).

The configured app asks for ``turn.started``, ``turn.completed``, ``turn.failed`` and
``assistant.message``: three outbox entries per turn. Load: ``--bots`` closed-loop bots over
WebSocket, each on its own session, ``loop/send`` then ``loop/waitForTurn``, the mock model;
after a warm-up, turns completed in ``--seconds`` are counted and the server's CPU time read
from /proc. Prints a table (medians, and each mode's throughput relative to ``none``) and
writes ``benchmarks/results/bench_webhooks.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from websockets.asyncio.client import connect

from benchmarks.measure import machine_reference_ms, now, proc_cpu_s, write_results
from benchmarks.server_proc import ServerProc
from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from sessionloop.actors.settings.apps import AppManifest
from sessionloop.actors.webhooks.config import parse_webhook
from sessionloop.actors.webhooks.events import outbox_mark

OWNER = "bench-webhooks-owner-token"
BOT = "bench-webhooks-bot-token-0123456789abcdef"
SECRET = "whsec_" + base64.b64encode(b"b" * 32).decode()
EVENTS = '["turn.started", "turn.completed", "turn.failed", "assistant.message"]'
MODES = ("none", "slow", "refused")


class SlowReceiver:
    """Answers every webhook 204 after ``delay_s`` (a thread per request); counts them."""

    def __init__(self, delay_s: float) -> None:
        self.count = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", "0")))
                time.sleep(delay_s)
                outer.count += 1
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port_url() -> str:
    """A loopback URL where nothing listens (the port was bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


def apps_toml(url: str | None) -> str:
    doc = f'[apps.bench]\ntoken = "{BOT}"\ncontainers = ["inbox"]\n'
    if url is not None:
        doc += f'\n[apps.bench.webhook]\nurl = "{url}"\nsecret = "{SECRET}"\nevents = {EVENTS}\n'
    return doc


class Bot:
    """One WebSocket, one session, closed loop: send, wait for the turn, again."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.rejected = 0

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        rid = self.next_id
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        while True:
            frame = json.loads(await self.ws.recv())
            if frame.get("id") == rid:
                break
        error = frame.get("error")
        if error is None:
            return frame["result"]
        data = error.get("data") or {}
        if data.get("code") == "rejected":  # the connection's token bucket: wait as told, send again
            self.rejected += 1
            await asyncio.sleep(data.get("retryAfterMs", 10) / 1000)
            return await self.call(method, params)
        raise RuntimeError(f"{method}: {error}")


async def load(port: int, bots: int, warmup_s: float, seconds: float, server_pid: int) -> dict[str, Any]:
    url = f"ws://127.0.0.1:{port}/session"
    counted: list[int] = [0]
    window: dict[str, float] = {}

    async def bot(b: int) -> None:
        async with connect(url, additional_headers={"Authorization": f"Bearer {BOT}"}, max_size=None) as ws:
            c = Bot(ws)
            await c.call("initialize", {"protocolVersion": "0.2.0", "client": {"name": "bench", "version": "1"}})
            sid = (await c.call("loop/create", {"containerId": "inbox"}))["sessionId"]
            n = 0
            while "end" not in window:
                n += 1
                receipt = await c.call("loop/send", {"sessionId": sid, "text": f"b{b} t{n}", "idempotencyKey": f"{n}"})
                if receipt["state"] == "rejected":
                    await asyncio.sleep(receipt.get("retryAfterMs", 100) / 1000)
                    continue
                await c.call("loop/waitForTurn", {"sessionId": sid, "turnId": receipt["turnId"], "timeoutMs": 30000})
                if "start" in window and "end" not in window:
                    counted[0] += 1

    async def clock() -> None:
        await asyncio.sleep(warmup_s)
        window["start"], window["cpu0"] = now(), proc_cpu_s(server_pid)
        counted[0] = 0
        await asyncio.sleep(seconds)
        window["end"], window["cpu1"] = now(), proc_cpu_s(server_pid)

    await asyncio.gather(clock(), *(bot(b) for b in range(bots)))
    wall = window["end"] - window["start"]
    turns = counted[0]
    return {"turns": turns, "seconds": wall, "turns_per_s": turns / wall,
            "server_cpu_ms_per_turn": (window["cpu1"] - window["cpu0"]) * 1000 / max(1, turns)}


def append_cost(n: int = 5000, repeats: int = 3) -> dict[str, float]:
    """µs of CPU per append of a turn's five events, with and without the outbox entries of the
    four announced types (three of the five), interleaved, medians of ``repeats``."""
    hook = parse_webhook("bench", {"url": "https://hooks.example/", "secret": SECRET, "events": json.loads(EVENTS)})
    app = AppManifest(id="bench", webhook=hook)
    events = [E.InputAccepted(input_id="i", turn_id="t", text="hello"), E.TurnStarted(turn_id="t"),
              E.LlmStarted(turn_id="t", step_id="s"), E.LlmCompleted(turn_id="t", step_id="s", text="echo: hello"),
              E.TurnCompleted(turn_id="t", output_text="echo: hello")]
    samples: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(repeats):
        for label in ("without", "with"):
            path = tempfile.mkdtemp(prefix="bench-webhooks-append-")
            store = open_store(path, durability="nosync")
            t0 = time.process_time()
            for i in range(n):
                mark = outbox_mark(app, events) if label == "with" else None
                store.append(f"session-s{i % 200}", events, -1, feed="bench", outbox=mark)
            samples[label].append((time.process_time() - t0) / n * 1e6)
            store.close()
            shutil.rmtree(path, ignore_errors=True)
    return {label: statistics.median(v) for label, v in samples.items()}


def one_run(mode: str, args: argparse.Namespace, slow: SlowReceiver, pinned: bool) -> dict[str, Any]:
    data = tempfile.mkdtemp(prefix=f"bench-webhooks-{mode}-")
    url = {"none": None, "slow": slow.url, "refused": closed_port_url()}[mode]
    with open(os.path.join(data, "apps.toml"), "w") as f:
        f.write(apps_toml(url))
    server = ServerProc(data, OWNER, ["--durability", args.durability, "--webhook-allow-net", "127.0.0.1/32"],
                        "0" if pinned else None)
    try:
        delivered0 = slow.count
        out = asyncio.run(load(server.port, args.bots, args.warmup, args.seconds, server.pid))
        out["slow_receiver_answered"] = slow.count - delivered0 if mode == "slow" else 0
        return out
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--bots", type=int, default=32)
    ap.add_argument("--durability", choices=["sync", "nosync"], default="nosync")
    ap.add_argument("--quick", action="store_true", help="2 repeats of 6 s")
    ap.add_argument("--no-pinned", action="store_true")
    args = ap.parse_args()
    args.repeats = args.repeats or (2 if args.quick else 3)
    args.seconds = args.seconds or (6.0 if args.quick else 15.0)
    pinned = not args.no_pinned and shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) >= 2
    if pinned:
        os.sched_setaffinity(0, {1})
    reference_before = machine_reference_ms()
    cost = append_cost()
    print(f"an append of a turn's 5 events: {cost['without']:.1f} µs CPU without outbox entries, "
          f"{cost['with']:.1f} µs with 3", flush=True)
    slow = SlowReceiver(2.0)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    try:
        for r in range(args.repeats):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for mode in order:
                out = one_run(mode, args, slow, pinned)
                runs[mode].append(out)
                print(f"repeat {r + 1}: {mode:<8} {out['turns_per_s']:8,.1f} turns/s  server cpu "
                      f"{out['server_cpu_ms_per_turn']:.3f} ms/turn", flush=True)
    finally:
        slow.close()
    base = statistics.median(o["turns_per_s"] for o in runs["none"])
    base_cpu = statistics.median(o["server_cpu_ms_per_turn"] for o in runs["none"])
    table = {}
    print(f"\n{args.bots} bots, {args.seconds:.0f} s x {args.repeats}, durability {args.durability}, "
          f"{'server on CPU 0, bots and receiver on CPU 1' if pinned else 'unpinned'}")
    # CPU per turn is the steadier figure on a shared machine: when other jobs take the server's
    # core, it makes fewer turns, but each costs about the same
    print(f"{'mode':<9} {'turns/s':>9} {'vs none':>8} {'server CPU ms/turn':>19} {'vs none':>8}")
    for mode in MODES:
        tps = statistics.median(o["turns_per_s"] for o in runs[mode])
        cpu = statistics.median(o["server_cpu_ms_per_turn"] for o in runs[mode])
        table[mode] = {"turns_per_s": tps, "relative_to_none": tps / base, "server_cpu_ms_per_turn": cpu,
                       "cpu_relative_to_none": cpu / base_cpu, "runs": runs[mode]}
        print(f"{mode:<9} {tps:9,.1f} {tps / base:8.1%} {cpu:19.3f} {cpu / base_cpu:8.1%}")
    write_results("bench_webhooks", {
        "bots": args.bots, "seconds": args.seconds, "repeats": args.repeats, "durability": args.durability,
        "pinned": pinned, "events_per_turn_announced": 3, "append_cpu_us": cost,
        "machine_reference_ms": {"before": reference_before, "after": machine_reference_ms()}, "modes": table})


if __name__ == "__main__":
    main()
