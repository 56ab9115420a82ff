"""Fan-out of pushes to subscribed WebSocket connections under load (SPEC §10, issue "session protocol").

    python benchmarks/bench_fanout.py            # 100 sessions x 10 subscribers = 1,000 connections,
                                                 # 1,000 items/s for 20 s (and 2,000, 3,000 for the
                                                 # headroom), then ws vs in-process turns/s
    python benchmarks/bench_fanout.py --quick    # the same 1,000 connections for 5 s (under a minute)

Set-up (one fan-out run, in a fresh child process of this script):

* **server**: ``sessionloop serve --port 0 --durability nosync --max-outbox-mb 64`` in its own
  process (``sys.executable -m cli.main serve ...``), so client CPU does not count against it
  inside one GIL.
* **subscribers**: ``--sessions`` x ``--per-session`` WebSocket connections (default 100 x 10 =
  1,000), spread over ``--client-procs`` processes (default 4 x 250); each connection
  ``initialize``s and ``session/subscribe``s to exactly one session, keeps the snapshot's
  ``(epoch, seq)``, drops pushes with ``seq <=`` it (counted as stale) and checks that ``seq``
  only grows. Every frame received is counted; the ``item/completed`` push of each turn's
  ``turn`` item (the turn's end) is time-stamped.
* **driver**: a few owner connections (at most ~50 ``turn/send``/s each, well under the
  per-connection rate limit) send plain text turns (mock model, ``fanout s<i> n<k>`` ->
  ``echo: ...``), open loop, round-robin over the sessions, at ``--rate`` ``item/completed``
  pushes per second *produced* (per session, before fan-out): turns/s = rate / items per turn,
  where items per turn is measured first on a probe connection. Both are reported.

Measured over the ``--duration`` window:

* **push latency**: from the moment the driver sent ``turn/send`` to the moment each subscribed
  connection received the ``item/completed`` push of that turn's ``turn`` item (one sample per
  turn x subscriber, on one machine: CLOCK_MONOTONIC is shared by the processes). It includes the
  whole turn (accept, mock model, commit). Also reported: the ``turn/send`` acknowledgement latency
  and the fan-out spread (per turn, latest minus earliest of its subscribers' receive times).
* frames/s received in total (every push: ``item/started``, ``item/delta``, ``item/completed``,
  ...), ``item/completed`` frames/s delivered, and the items/s produced as measured (delivered /
  subscribers per session); CPU used by the server, the subscriber processes and the driver.

Target: p99 push latency < 20 ms at 1,000 items/s. **Clients and server share the machine** (2
cores): the subscriber processes and the driver use the same CPUs as the server, so the figures
are a lower bound for a server with the machine to itself. Two placements are run side by side:
``unpinned`` (everyone anywhere) and ``server-cpu0`` (the server under ``taskset -c 0``, clients
and driver under ``taskset -c 1``).

After each run the server is stopped and its event log is read back: every turn sent was
accepted once, started once and completed once with the expected answer; every subscriber of its
session received its end exactly once. Anything else fails the benchmark loudly (exit 1).

**Turns/s through the full WebSocket path vs in process**, in the same run: ``cli/bench_cmd.py``'s
``run_bench`` with ``via=ws`` (a ``Server`` on port 0 and WebSocket clients in the same process, as
``sessionloop bench --via ws``) and ``via=inprocess``, ``nosync``, each in a fresh child process,
unpinned and pinned (``taskset -c 0``), medians of ``--repeats``; both with the same event-log check.

Prints tables and writes ``benchmarks/results/fanout.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from typing import Any

import msgspec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.measure import now, percentile, proc_cpu_s, proc_rss_mib, run_job, write_results  # noqa: E402
from benchmarks.server_proc import ServerProc

TOKEN = "sessionloop-fanout-token"
PROTOCOL_VERSION = "0.2.0"










# --- a subscriber process -----------------------------------------------------------------------


class _Head(msgspec.Struct, rename="camel"):
    kind: str = ""
    item_id: str = ""
    outcome: str | None = None


class _PushParams(msgspec.Struct, rename="camel"):
    session_id: str = ""
    epoch: int = 0
    seq: int = 0
    item: _Head | None = None


class _Push(msgspec.Struct):
    method: str | None = None
    params: _PushParams | None = None


class _AnyFrame(msgspec.Struct):
    method: str | None = None
    id: Any = None


class _SeqOnly(msgspec.Struct, rename="camel"):
    session_id: str = ""
    epoch: int = 0
    seq: int = 0


class _SeqFrame(msgspec.Struct):
    method: str | None = None
    params: _SeqOnly | None = None


async def subscriber_main(spec: dict[str, Any]) -> None:
    """Open this process's share of connections, subscribe each to its session, print ``ready``,
    count and time-stamp until ``stop`` arrives on stdin, then print one JSON line of results."""
    from websockets.asyncio.client import connect

    url, conns = spec["url"], spec["conns"]  # conns: [[global index, session id], ...]
    decode_push = msgspec.json.Decoder(_Push).decode
    decode_any = msgspec.json.Decoder(_AnyFrame).decode
    decode_seq = msgspec.json.Decoder(_SeqFrame).decode
    encode = msgspec.json.Encoder().encode
    turn_items: list[tuple[str, int, float]] = []  # (turn id, connection index, receive time)
    frames: Counter[int] = Counter()  # tenth of a second -> frames
    completed: Counter[int] = Counter()  # tenth of a second -> item/completed frames
    methods: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    problems: Counter[str] = Counter()
    examples: list[str] = []
    sockets: list[Any] = []

    def problem(name: str, detail: str) -> None:
        problems[name] += 1
        if len(examples) < 10:
            examples.append(f"{name}: {detail}")

    async def open_one(index: int, session_id: str) -> tuple[Any, int, int]:
        ws = await connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, max_size=None,
                           compression=None, ping_interval=None, open_timeout=60)
        for rid, method, params in ((1, "initialize", {"protocolVersion": PROTOCOL_VERSION,
                                                       "client": {"name": "fanout", "version": "1"}}),
                                    (2, "session/subscribe", {"sessionId": session_id})):
            await ws.send(encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).decode())
            while True:
                msg = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if msg.get("id") == rid:
                    break
            if "error" in msg:
                raise RuntimeError(f"{method} failed: {msg['error']}")
        return ws, int(msg["result"]["epoch"]), int(msg["result"]["seq"])

    async def reader(ws: Any, index: int, session_id: str, epoch: int, snap_seq: int) -> None:
        last = snap_seq
        try:
            async for raw in ws:
                t = now()
                tenth = int(t * 10)
                frames[tenth] += 1
                if raw.startswith('{"jsonrpc":"2.0","method":"item/completed"') or '"item/completed"' in raw[:60]:
                    msg = decode_push(raw)
                    completed[tenth] += 1
                    methods["item/completed"] += 1
                    p = msg.params
                    if p is None or p.item is None:
                        problem("malformed item/completed", raw[:200])
                        continue
                    kinds[p.item.kind] += 1
                    if p.session_id != session_id:
                        problem("push for another session", raw[:200])
                        continue
                    if p.epoch != epoch:
                        problem("new epoch", raw[:200])
                        continue
                    if p.seq <= snap_seq:
                        problems["stale (seq <= snapshot), dropped"] += 1
                        continue
                    if p.seq <= last:
                        problem("seq did not grow", f"{p.seq} after {last}")
                    last = max(last, p.seq)
                    if p.item.kind == "turn" and p.item.outcome is not None:
                        turn_items.append((p.item.item_id, index, t))
                    continue
                head = decode_any(raw)
                methods[head.method or "response"] += 1
                if head.method in ("item/started", "item/delta"):
                    sp = decode_seq(raw).params
                    if sp is not None and sp.epoch == epoch and sp.seq > snap_seq:
                        if sp.seq <= last:
                            problem("seq did not grow", f"{head.method} {sp.seq} after {last}")
                        last = max(last, sp.seq)
                elif head.method == "session/resync":
                    problem("session/resync", raw[:200])
        except Exception as e:  # noqa: BLE001 - reported
            problem("connection error", f"{type(e).__name__}: {e}")
        else:
            if not stopping:
                problem("closed by the server", f"code {ws.close_code} {ws.close_reason!r}")

    stopping = False
    readers = []
    gate = asyncio.Semaphore(spec.get("connect_concurrency", 25))

    async def start_one(index: int, session_id: str) -> None:
        async with gate:
            ws, epoch, seq = await open_one(index, session_id)
        sockets.append(ws)
        readers.append(asyncio.ensure_future(reader(ws, index, session_id, epoch, seq)))

    cpu0 = time.process_time()
    await asyncio.gather(*(start_one(i, s) for i, s in conns))
    print("ready", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    assert line.strip() == "stop", line
    stopping = True
    cpu = time.process_time() - cpu0
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    for r in readers:
        r.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    print(json.dumps({"turn_items": turn_items, "frames": dict(frames), "completed": dict(completed),
                      "methods": dict(methods), "kinds": dict(kinds), "problems": dict(problems),
                      "examples": examples, "cpu_s": cpu}), flush=True)


# --- the server process ---------------------------------------------------------------------------


class SubscriberProc:
    def __init__(self, url: str, conns: list[tuple[int, str]], cpus: str | None) -> None:
        cmd = [sys.executable, os.path.abspath(__file__), "--subscriber", json.dumps({"url": url, "conns": conns})]
        if cpus is not None:
            cmd = ["taskset", "-c", cpus, *cmd]
        self.n = len(conns)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def wait_ready(self) -> None:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"subscriber process failed: {line!r} {self.proc.stderr.read()}")  # type: ignore[union-attr]

    def stop(self) -> dict[str, Any]:
        self.proc.stdin.write("stop\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        out, err = self.proc.communicate(timeout=120)
        if self.proc.returncode != 0:
            raise RuntimeError(f"subscriber process failed ({self.proc.returncode}): {err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


# --- the driver -----------------------------------------------------------------------------------


class Driver:
    """Owner connections that create the sessions and send turns, open loop."""

    def __init__(self) -> None:
        self.clients: list[Any] = []
        self.sent: dict[str, float] = {}  # text -> send time
        self.acks: dict[str, float] = {}  # text -> turn/send acknowledgement latency
        self.rate_limited = 0
        self.refused: list[str] = []
        self.measured: set[str] = set()

    async def open(self, port: int, n: int) -> None:
        from websockets.asyncio.client import connect

        from sessionloop.cli.bench_ws import WsClient

        for _ in range(n):
            ws = await connect(f"ws://127.0.0.1:{port}/session", max_size=None, compression=None, ping_interval=None,
                               additional_headers={"Authorization": f"Bearer {TOKEN}"})
            client = WsClient(ws)
            await client.call("initialize", {"protocolVersion": PROTOCOL_VERSION,
                                             "client": {"name": "fanout-driver", "version": "1"}})
            self.clients.append(client)

    async def create(self, n: int) -> list[str]:
        ids: list[str] = []
        for start in range(0, n, 50):
            ids += await asyncio.gather(*(self._create(i) for i in range(start, min(n, start + 50))))
        return ids

    async def _create(self, i: int) -> str:
        made = await self.clients[i % len(self.clients)].call("session/create", {"name": f"fanout {i}"})
        return str(made["session"]["id"])

    async def send(self, client: Any, session_id: str, text: str) -> None:
        from sessionloop.cli.bench_ws import NotAccepted, Rejected

        t0 = now()
        self.sent[text] = t0
        while True:
            try:
                await asyncio.wait_for(client.call("turn/send", {"sessionId": session_id, "content": text}), 60)
                break
            except Rejected as e:
                self.rate_limited += 1
                await asyncio.sleep(e.retry_after_ms / 1000)
            except NotAccepted as e:
                self.sent.pop(text, None)
                self.refused.append(f"{text}: {e}")
                return
        self.acks[text] = now() - t0

    async def close(self) -> None:
        for c in self.clients:
            try:
                await c.close()
            except Exception:  # noqa: BLE001,S110
                pass


async def probe_items_per_turn(port: int, session_id: str, driver: Driver, turns: int = 3) -> float:
    """Subscribe one extra connection to a session, send ``turns`` turns one after another and count
    the ``item/completed`` pushes they produce (per session, before fan-out)."""
    from websockets.asyncio.client import connect

    async with connect(f"ws://127.0.0.1:{port}/session", max_size=None, compression=None,
                       additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        async def call(rid: int, method: str, params: dict[str, Any]) -> None:
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
            while True:
                msg = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if msg.get("id") == rid:
                    return

        await call(1, "initialize", {"protocolVersion": PROTOCOL_VERSION, "client": {"name": "probe", "version": "1"}})
        await call(2, "session/subscribe", {"sessionId": session_id})
        items = 0
        for k in range(turns):
            await driver.send(driver.clients[0], session_id, f"fanout probe n{k}")
            while True:
                msg = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if msg.get("method") == "item/completed":
                    items += 1
                    item = msg["params"]["item"]
                    if item["kind"] == "turn" and item.get("outcome") is not None:
                        break
        end = now() + 0.3  # anything the turn pushes after its end
        while (left := end - now()) > 0:
            try:
                msg = json.loads(await asyncio.wait_for(ws.recv(), left))
            except TimeoutError:
                break
            if msg.get("method") == "item/completed":
                items += 1
    return items / turns


async def drive(spec: dict[str, Any], port: int, subscribers: list[SubscriberProc], server: ServerProc,
                ids: list[str], driver: Driver) -> dict[str, Any]:
    items_per_turn = await probe_items_per_turn(port, ids[0], driver)
    # warm-up: one turn per session (activates every actor), not measured
    await asyncio.gather(*(driver.send(driver.clients[i % len(driver.clients)], sid, f"fanout warmup s{i}")
                           for i, sid in enumerate(ids)))
    await asyncio.sleep(1.0)
    turn_rate = spec["rate"] / items_per_turn
    total = max(1, int(turn_rate * spec["duration"]))
    pids = [server.pid, os.getpid()] + [s.proc.pid for s in subscribers]
    cpu0 = {pid: proc_cpu_s(pid) for pid in pids}
    tasks = []
    counts = [0] * len(ids)
    late = 0
    t0 = now()
    for i in range(total):
        due = t0 + i / turn_rate
        delay = due - now()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.005:
            late += 1
        s = i % len(ids)
        text = f"fanout s{s} n{counts[s]}"
        counts[s] += 1
        driver.measured.add(text)
        tasks.append(asyncio.ensure_future(driver.send(driver.clients[s % len(driver.clients)], ids[s], text)))
    t_end_send = now()
    await asyncio.gather(*tasks)
    t1 = t0 + spec["duration"]
    cpu1 = {pid: proc_cpu_s(pid) for pid in pids}
    window = max(t_end_send, t1) - t0
    rss = proc_rss_mib(server.pid)
    await asyncio.sleep(spec["drain"])  # the last pushes reach the subscribers
    return {"items_per_turn": items_per_turn, "turn_rate_target": turn_rate, "turns_sent": total,
            "window": (t0, t0 + window), "send_window_s": t_end_send - t0, "late_sends": late,
            "server_cpu_s": cpu1[server.pid] - cpu0[server.pid],
            "driver_cpu_s": cpu1[os.getpid()] - cpu0[os.getpid()],
            "subscribers_cpu_s": sum(cpu1[p] - cpu0[p] for p in pids[2:]), "server_rss_mib": rss}


# --- checking ---------------------------------------------------------------------------------------


def read_log(data_dir: str) -> dict[str, Any]:
    """The server's event log, read back after it stopped: per input text its turn id; starts, ends."""
    from sessionloop.actors import events as E
    from sessionloop.actors.events import open_store

    turn_end = (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)
    store = open_store(os.path.join(data_dir, "store"), readonly=True)
    texts: dict[str, list[str]] = defaultdict(list)  # text -> turn ids
    session_of: dict[str, str] = {}
    started: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    answers: dict[str, str | None] = {}
    try:
        for recorded in store.iter_all(0):
            ev = recorded.event
            if isinstance(ev, E.InputAccepted):
                texts[ev.text].append(ev.turn_id)
                session_of[ev.turn_id] = recorded.stream[len("session-"):]
            elif isinstance(ev, E.TurnStarted):
                started[ev.turn_id] += 1
            elif isinstance(ev, turn_end):
                ended[ev.turn_id] += 1
                answers[ev.turn_id] = ev.output_text if isinstance(ev, E.TurnCompleted) else None
    finally:
        store.close()
    return {"texts": texts, "session_of": session_of, "started": started, "ended": ended, "answers": answers}


def check_and_measure(driver: Driver, log: dict[str, Any], subs: list[dict[str, Any]],
                      conn_session: dict[int, str], per_session: int, subscribed_from: set[str]) -> dict[str, Any]:
    """Lost/duplicated turns and deliveries, and the latency samples of the measured turns."""
    problems: list[str] = []
    lost = dup = wrong = 0
    turn_of_text: dict[str, str] = {}
    for text in driver.sent:
        ids = log["texts"].get(text, [])
        if not ids:
            lost += 1
            problems.append(f"{text!r}: acknowledged but no input accepted in the log")
            continue
        if len(ids) > 1:
            dup += 1
            problems.append(f"{text!r}: accepted {len(ids)}x")
        tid = ids[0]
        turn_of_text[text] = tid
        for name, counts in (("turn.started", log["started"]), ("turn end", log["ended"])):
            if counts[tid] == 0:
                lost += 1
            elif counts[tid] > 1:
                dup += 1
            if counts[tid] != 1:
                problems.append(f"{text!r} turn {tid}: {counts[tid]}x {name}")
        if log["answers"].get(tid) != f"echo: {text}":
            wrong += 1
            problems.append(f"{text!r} turn {tid}: ended with {log['answers'].get(tid)!r}")
    received: dict[tuple[str, int], list[float]] = defaultdict(list)
    for sub in subs:
        for tid, conn, t in sub["turn_items"]:
            received[(tid, conn)].append(t)
    subscribers: dict[str, list[int]] = defaultdict(list)
    for conn, sid in conn_session.items():
        subscribers[sid].append(conn)
    latencies: list[float] = []
    spreads: list[float] = []
    missing = extra = 0
    for text, tid in turn_of_text.items():
        if text not in subscribed_from:
            continue
        sid = log["session_of"][tid]
        times = []
        for conn in subscribers[sid]:
            got = received.pop((tid, conn), [])
            if not got:
                missing += 1
                if missing <= 5:
                    problems.append(f"{text!r} turn {tid}: its end never reached connection {conn}")
            elif len(got) > 1:
                extra += 1
                problems.append(f"{text!r} turn {tid}: its end reached connection {conn} {len(got)}x")
            if got:
                times.append(got[0])
        if text in driver.measured and times:
            latencies += [t - driver.sent[text] for t in times]
            spreads.append(max(times) - min(times))
    if received:
        extra += len(received)
        problems.append(f"{len(received)} turn ends received for turns not sent to that session, e.g. "
                        f"{list(received)[:3]}")
    lost += missing
    dup += extra
    for sub in subs:
        for name, n in sub["problems"].items():
            if name != "stale (seq <= snapshot), dropped":
                problems.append(f"subscriber: {n}x {name}")
        problems += sub["examples"][:3]
    ok = not (lost or dup or wrong or driver.refused) and not any(
        n for sub in subs for name, n in sub["problems"].items() if name != "stale (seq <= snapshot), dropped")
    return {"ok": ok, "turns_verified": len(turn_of_text), "deliveries_verified": sum(
        len(subscribers[log["session_of"][t]]) for x, t in turn_of_text.items() if x in subscribed_from),
        "lost": lost, "duplicated": dup, "wrong": wrong, "refused": len(driver.refused),
        "problems": (driver.refused + problems)[:20], "latencies": latencies, "spreads": spreads}


# --- one fan-out run (a child process) ----------------------------------------------------------------


def job_fanout(spec: dict[str, Any]) -> dict[str, Any]:
    pinned = spec["placement"] == "server-cpu0"
    if pinned:
        os.sched_setaffinity(0, {1})
    data_dir = tempfile.mkdtemp(prefix="bench-fanout-")
    server = ServerProc(data_dir, TOKEN, ["--durability", "nosync", "--max-outbox-mb", "64"], "0" if pinned else None)
    subscribers: list[SubscriberProc] = []
    try:
        return asyncio.run(_fanout(spec, server, subscribers, data_dir, "1" if pinned else None))
    finally:
        for s in subscribers:
            if s.proc.poll() is None:
                s.proc.kill()
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


async def _fanout(spec: dict[str, Any], server: ServerProc, subscribers: list[SubscriberProc], data_dir: str,
                  client_cpus: str | None) -> dict[str, Any]:
    driver = Driver()
    n_sessions, per = spec["sessions"], spec["per_session"]
    await driver.open(server.port, 1)
    ids = await driver.create(n_sessions)
    # connection j subscribes to session j % sessions; process p holds connections j = p (mod procs)
    conn_session = {j: ids[j % n_sessions] for j in range(n_sessions * per)}
    url = f"ws://127.0.0.1:{server.port}/session"
    t_setup = now()
    procs = spec["client_procs"]
    for p in range(procs):
        mine = [(j, sid) for j, sid in conn_session.items() if j % procs == p]
        subscribers.append(SubscriberProc(url, mine, client_cpus))
    for s in subscribers:
        await asyncio.to_thread(s.wait_ready)
    setup_s = now() - t_setup
    # enough driver connections for ~50 turn/send per second each (the server allows 100/s per connection)
    turn_rate_guess = spec["rate"] / 2
    await driver.open(server.port, max(4, math.ceil(turn_rate_guess / 50)) - 1)
    subscribed_from = set()
    try:
        out = await drive(spec, server.port, subscribers, server, ids, driver)
        subscribed_from = set(driver.sent)
    finally:
        results = [await asyncio.to_thread(s.stop) for s in subscribers]
        await driver.close()
    server_exit = server.stop()
    check = check_and_measure(driver, read_log(data_dir), results, conn_session, per, subscribed_from)
    lat, spreads = sorted(check.pop("latencies")), sorted(check.pop("spreads"))
    acks = sorted(v for k, v in driver.acks.items() if k in driver.measured)
    w0, w1 = out.pop("window")
    span = w1 - w0
    lo, hi = int(w0 * 10), int(w1 * 10)
    frames = sum(n for sub in results for k, n in sub["frames"].items() if lo <= int(k) < hi)
    completed = sum(n for sub in results for k, n in sub["completed"].items() if lo <= int(k) < hi)
    span_b = (hi - lo) / 10
    methods: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for sub in results:
        methods.update(sub["methods"])
        kinds.update(sub["kinds"])
    measured_turns = len([t for t in driver.measured if t in driver.sent])
    return {
        "connections": n_sessions * per, "sessions": n_sessions, "subscribers_per_session": per,
        "client_procs": procs, "driver_connections": len(driver.clients), "placement": spec["placement"],
        "setup_s": setup_s, **out,
        "turns_per_s": measured_turns / span, "items_per_s_target": spec["rate"],
        "items_per_s_produced": out["items_per_turn"] * measured_turns / span,
        "items_per_s_produced_measured": completed / span_b / per,
        "item_completed_frames_per_s": completed / span_b, "frames_per_s": frames / span_b,
        "push_p50_ms": percentile(lat, 0.50) * 1000, "push_p95_ms": percentile(lat, 0.95) * 1000,
        "push_p99_ms": percentile(lat, 0.99) * 1000, "push_max_ms": (lat[-1] if lat else float("nan")) * 1000,
        "ack_p50_ms": percentile(acks, 0.50) * 1000, "ack_p99_ms": percentile(acks, 0.99) * 1000,
        "spread_p50_ms": percentile(spreads, 0.50) * 1000, "spread_p99_ms": percentile(spreads, 0.99) * 1000,
        "latency_samples": len(lat), "rate_limited_sends": driver.rate_limited,
        "server_cpu_pct": out["server_cpu_s"] / span * 100,
        "subscribers_cpu_pct": out["subscribers_cpu_s"] / span * 100,
        "driver_cpu_pct": out["driver_cpu_s"] / span * 100,
        "stale_dropped": sum(sub["problems"].get("stale (seq <= snapshot), dropped", 0) for sub in results),
        "frames_by_method": dict(methods), "item_completed_by_kind": dict(kinds),
        "server_exit": server_exit, "server_log_tail": server.tail[-10:], "check": check,
    }


def job_turns(spec: dict[str, Any]) -> dict[str, Any]:
    """``cli/bench_cmd.py``'s ``run_bench`` (via ws or in process), nosync."""
    from sessionloop.cli.bench_cmd import run_bench
    from sessionloop.cli.bench_config import BenchConfig

    cfg = BenchConfig(sessions=spec["sessions"], turns=spec["turns"], via=spec["via"], durability="nosync",
                      progress=False)
    report = run_bench(cfg)
    keep = ("turns", "seconds", "turns_per_s", "events_per_s", "p50_ms", "p95_ms", "p99_ms", "cpu_ms_per_turn",
            "peak_rss_mib")
    out = {k: report[k] for k in keep}
    out["check"] = report["check"]
    out["connections"] = report.get("connections", 0)
    return out


JOBS = {"fanout": job_fanout, "turns": job_turns}


# --- the parent ---------------------------------------------------------------------------------------


def run_child(spec: dict[str, Any], pinned: bool = False) -> dict[str, Any]:
    return run_job(__file__, spec, pinned=pinned, cwd=ROOT,
                   label=f"{spec.get('job')}, {spec.get('placement', spec.get('via'))}")

def median_of(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: statistics.median(s[k] for s in samples) for k in samples[0]
                           if isinstance(samples[0][k], (int, float)) and not isinstance(samples[0][k], bool)}
    out["check_ok"] = all(s["check"]["ok"] for s in samples)
    out["samples"] = samples
    return out


FANOUT_ROWS = [
    ("connections", "subscribed connections", ",.0f"), ("setup_s", "connect + subscribe all (s)", ",.1f"),
    ("items_per_turn", "item/completed per turn (probe)", ".2f"),
    ("items_per_s_target", "items/s produced: target", ",.0f"),
    ("items_per_s_produced", "items/s offered: sent x items/turn", ",.0f"),
    ("items_per_s_produced_measured", "items/s produced: delivered / subs", ",.0f"),
    ("turns_per_s", "turns/s sent", ",.0f"), ("late_sends", "sends >5 ms behind schedule", ",.0f"),
    ("item_completed_frames_per_s", "item/completed frames/s delivered", ",.0f"),
    ("frames_per_s", "frames/s received (all pushes)", ",.0f"),
    ("push_p50_ms", "push latency p50 (ms)", ",.2f"), ("push_p95_ms", "push latency p95 (ms)", ",.2f"),
    ("push_p99_ms", "push latency p99 (ms)", ",.2f"), ("push_max_ms", "push latency max (ms)", ",.1f"),
    ("spread_p50_ms", "fan-out spread p50 (ms)", ",.2f"), ("spread_p99_ms", "fan-out spread p99 (ms)", ",.2f"),
    ("ack_p50_ms", "turn/send ack p50 (ms)", ",.2f"), ("ack_p99_ms", "turn/send ack p99 (ms)", ",.2f"),
    ("latency_samples", "latency samples", ",.0f"),
    ("server_cpu_pct", "server CPU % (of one core)", ",.0f"),
    ("subscribers_cpu_pct", "subscriber procs CPU %", ",.0f"), ("driver_cpu_pct", "driver CPU %", ",.0f"),
    ("server_rss_mib", "server RSS (MiB)", ",.0f"), ("stale_dropped", "pushes dropped (seq <= snapshot)", ",.0f"),
]
TURN_ROWS = [("turns_per_s", "turns/s", ",.0f"), ("p50_ms", "p50 turn latency (ms)", ",.1f"),
             ("p99_ms", "p99 turn latency (ms)", ",.1f"), ("events_per_s", "events/s", ",.0f"),
             ("cpu_ms_per_turn", "CPU ms per turn", ".3f"), ("peak_rss_mib", "peak RSS (MiB)", ",.0f")]


def print_table(title: str, cols: dict[str, dict[str, Any]], rows: list[tuple[str, str, str]]) -> None:
    print(f"\n{title}")
    print(f"{'measure':<38}" + "".join(f"{c:>24}" for c in cols))
    print("-" * (38 + 24 * len(cols)))
    for key, name, fmt in rows:
        print(f"{name:<38}" + "".join(f"{format(col.get(key, float('nan')), fmt):>24}" for col in cols.values()))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1,000 connections for 5 s, short turn runs")
    ap.add_argument("--sessions", type=int, default=100, help="sessions the driver sends to (default 100)")
    ap.add_argument("--per-session", type=int, default=10, help="subscribed connections per session (default 10)")
    ap.add_argument("--client-procs", type=int, default=4, help="processes holding the subscriber connections")
    ap.add_argument("--rate", type=float, default=1000.0,
                    help="item/completed pushes produced per second, before fan-out (default 1000); the target "
                         "is checked at this rate")
    ap.add_argument("--extra-rates", default=None,
                    help="comma-separated further rates, run the same way to show the headroom "
                         "(default 2000,3000; none with --quick)")
    ap.add_argument("--duration", type=float, help="seconds of load per fan-out run (default 20; 5 with --quick)")
    ap.add_argument("--drain", type=float, default=2.0, help="seconds to wait for the last pushes")
    ap.add_argument("--repeats", type=int, help="runs per figure, median reported (default 3; 1 with --quick)")
    ap.add_argument("--turn-sessions", type=int, default=100, help="sessions of the ws vs in-process turns/s runs")
    ap.add_argument("--turns", type=int, help="turns per session of those runs (default 10; 4 with --quick)")
    ap.add_argument("--no-pinned", action="store_true", help="skip the pinned placements")
    ap.add_argument("--no-turns", action="store_true", help="skip the ws vs in-process turns/s comparison")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--subscriber", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.duration is None:
        args.duration = 5.0 if args.quick else 20.0
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.turns is None:
        args.turns = 4 if args.quick else 10
    if args.extra_rates is None:
        args.extra_rates = "" if args.quick else "2000,3000"
    args.rates = [args.rate] + [float(r) for r in args.extra_rates.split(",") if r.strip()]
    return args


def main() -> None:
    args = parse_args()
    if args.subscriber:
        asyncio.run(subscriber_main(json.loads(args.subscriber)))
        return
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(JOBS[spec["job"]](spec)))
        return
    can_pin = not args.no_pinned and shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) >= 2
    placements = ["unpinned"] + (["server-cpu0"] if can_pin else [])
    results: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick,
                               "cpus": len(os.sched_getaffinity(0)),
                               "params": {k: v for k, v in vars(args).items() if k not in ("child", "subscriber")},
                               "note": "clients (subscriber processes and driver) and the server share the machine"}
    print(f"fan-out: {args.sessions} sessions x {args.per_session} subscribers = {args.sessions * args.per_session:,} "
          f"WebSocket connections in {args.client_procs} processes, "
          f"{' and '.join(f'{r:,.0f}' for r in args.rates)} items/s produced, "
          f"{args.duration:g} s per run; server `serve --durability nosync --max-outbox-mb 64` in its own process.\n"
          f"NOTE: the clients and the server share this {results['cpus']}-CPU machine; placements: unpinned, and "
          f"server-cpu0 = server under taskset -c 0, clients and driver under taskset -c 1.", flush=True)
    samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
    turn_samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
    turn_modes = [] if args.no_turns else [(via, label, pinned) for via in ("inprocess", "ws")
                                           for label, pinned in [("unpinned", False)] + ([("pinned_cpu0", True)]
                                                                                          if can_pin else [])]
    for r in range(args.repeats):
        for placement in placements:
            for rate in args.rates:
                spec = {"job": "fanout", "placement": placement, "sessions": args.sessions,
                        "per_session": args.per_session, "client_procs": args.client_procs, "rate": rate,
                        "duration": args.duration, "drain": args.drain}
                res = run_child(spec)
                col = placement if rate == args.rate else f"{placement} @{rate:,.0f}/s"
                samples[col].append(res)
                print(f"  run {r + 1}/{args.repeats} {col}: p99 push {res['push_p99_ms']:.1f} ms at "
                      f"{res['items_per_s_produced']:,.0f} items/s, {res['frames_per_s']:,.0f} frames/s, "
                      f"check {'ok' if res['check']['ok'] else 'FAILED'}", flush=True)
        for via, label, pinned in turn_modes:
            res = run_child({"job": "turns", "via": via, "sessions": args.turn_sessions, "turns": args.turns}, pinned)
            turn_samples[f"{via} {label}"].append(res)
    results["fanout"] = fan = {p: median_of(s) for p, s in samples.items()}
    print_table(f"fan-out (medians of {args.repeats}); clients and server share the machine", fan, FANOUT_ROWS)
    failed = []
    for p, res in fan.items():
        if p in placements:
            target = "MET" if res["push_p99_ms"] < 20 and res["items_per_s_produced"] >= 0.9 * args.rate else "NOT MET"
            print(f"target p99 < 20 ms at {args.rate:,.0f} items/s ({p}): {target} "
                  f"(p99 {res['push_p99_ms']:.1f} ms at {res['items_per_s_produced']:,.0f} items/s)")
        for s in res["samples"]:
            c = s["check"]
            verdict = (f"ok: {c['turns_verified']:,} turns, {c['deliveries_verified']:,} deliveries, none lost or "
                       f"duplicated" if c["ok"] else
                       f"FAILED: {c['lost']} lost, {c['duplicated']} duplicated, {c['wrong']} wrong, "
                       f"{c['refused']} refused; first: {c['problems'][:3]}")
            print(f"event log check ({p}): {verdict}")
            if not c["ok"]:
                failed.append(p)
    if turn_samples:
        results["turns"] = tt = {k: median_of(s) for k, s in turn_samples.items()}
        print_table(f"turns/s, {args.turn_sessions} sessions x {args.turns} turns, nosync, half tool turns "
                    f"(cli/bench_cmd.run_bench; ws = in-process Server + WebSocket clients in one process; "
                    f"medians of {args.repeats})", tt, TURN_ROWS)
        for label in ("unpinned", "pinned_cpu0"):
            if f"ws {label}" in tt:
                ratio = tt[f"ws {label}"]["turns_per_s"] / tt[f"inprocess {label}"]["turns_per_s"]
                results.setdefault("ws_vs_inprocess", {})[label] = ratio
                print(f"WebSocket path / in process ({label}): {ratio:.2f}x")
        for k, res in tt.items():
            if not res["check_ok"]:
                failed.append(k)
                print(f"event log check ({k}): FAILED {[s['check']['problems'][:3] for s in res['samples']]}")
        if not failed:
            verified = sum(s["check"]["turns_verified"] for v in turn_samples.values() for s in v)
            print(f"event log check (turn runs): ok, {verified:,} turns, none lost or duplicated")
    write_results("fanout", results)
    if failed:
        raise SystemExit(f"event log check FAILED: {', '.join(failed)}")


if __name__ == "__main__":
    main()
