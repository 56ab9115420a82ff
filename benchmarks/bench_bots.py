"""Bots on the Session Loop API (SPEC §5, issue "Session Loop API"): throughput, latency, idempotency,
quotas under overload — in process and over WebSocket, checked against the event log.

    python benchmarks/bench_bots.py             # 20 bots x 50 sessions x 10 turns per transport
    python benchmarks/bench_bots.py --quick     # 4 bots x 10 sessions x 10 turns (under a minute)
    python benchmarks/bench_bots.py --transports inprocess,ws --rate 800 --turns 20 --no-pinned
                                                # the wire against in process at a fixed load

Every bot is an app of its own (``bot0`` ... ``botK-1``, container ``inbox``, its own token) owning
``--sessions-per-bot`` sessions created with ``permissionMode: acceptCalls``. Transports:

* ``inprocess``: ``host.async_sessions(app=...)`` on one asyncio loop: per session a task that
  sends (``await loop.send(..., idempotency_key=...)``) and waits (``await loop.wait_for_turn(...)``);
* ``inprocess-sync``: ``host.sessions(app=...)``, one thread per bot, in rounds: ``send`` to each of
  its sessions, then ``wait_for_turn`` each;
* ``ws``: a ``sessionloop serve`` process (``--durability`` as given, apps from ``apps.toml``) and per
  bot app-token WebSocket connections (one per ``--ws-sessions-per-conn`` sessions, default 5, so
  the per-connection request rate limit of 100/s, burst 200, is mostly not what is measured;
  rate-limit errors are waited out as told and counted) using ``loop/create``, ``loop/send`` and
  ``loop/waitForTurn``.

Phases, per transport, in a fresh child process (in process: unpinned and under ``taskset -c 0``;
ws: unpinned, and the server under ``taskset -c 0`` with the bots under ``taskset -c 1``):

1. **throughput** (measured): every session sends ``--turns`` new inputs one after another, half of
   them a tool turn (``!tool list_files {"path": "."}`` -> ``done: 1 tool calls``), the others
   ``hello <key>`` -> ``echo: hello <key>``; ``--dup-ratio`` (10%) of all sends repeat an earlier key
   of the session with the same text and must get ``duplicate`` with the original turn id (and its
   ``wait_for_turn`` the original result). Reported: turns/s, send -> completed latency p50/p99.
2. **overload** (``--overload-bots`` bots): ``--overload-one`` sends to one session at once (over
   the 20-unfinished-turns-per-session quota), then ``--overload-each`` to every session of the bot
   at once (over the 200-per-app quota); each session's first one is ``!sleep 2000``, acknowledged
   before the rest are sent (so no turn ends while the others are sent, whatever the transport's
   speed or the order concurrent sends arrive in), the rest ``!sleep 20``.
   Reported: the ``rejected`` receipt rate, whether every rejection says ``retryAfterMs: 1000``,
   whether repeats of accepted keys sent while over
   quota still get ``duplicate``; then every accepted turn is waited for, and rejected keys sent
   again after the queue drained must be accepted (a rejection is not recorded).
3. **event-log check**: every idempotency key appears once among ``input.accepted`` (with its
   receipt in the idempotency index), every acknowledged receipt's turn is that key's turn, no
   rejected-only key is in the log, every turn started once and ended once. Any loss, duplicate or
   wrong answer fails the benchmark (exit 1).

Prints a table and writes ``benchmarks/results/bots.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.measure import (  # noqa: E402
    fill_defaults,
    now,
    percentile,
    proc_rss_mib,
    proc_tree,
    proc_tree_cpu_s,
    proc_tree_switches,
    rss_peak_mib,
    run_job,
    write_results,
)
from benchmarks.server_proc import ServerProc, log_messages, start_log, stop_log
from sessionloop.actors.api.loop import APP_QUOTA  # noqa: E402  (seed 000: unfinished turns per app)
from sessionloop.actors.gateway.relay import Placement  # noqa: E402
from sessionloop.cli.natsproc import NatsCluster  # noqa: E402

OWNER_TOKEN = "sessionloop-bots-owner"
TOOL_TEXT, TOOL_ANSWER = '!tool list_files {"path": "."}', "done: 1 tool calls"
HEAD_SLEEP_MS = 2000  # the first overload input of a session: nothing ends while the rest are sent
SLEEP_MS = 20
WAIT_MS = 120_000
SHARDS = 16  # the server's default shards (a session's worker: actors.gateway.relay.Placement)










def app_id(bot: int) -> str:
    return f"bot{bot}"


def app_token(bot: int) -> str:
    return f"bots-bench-app-token-of-bot-{bot:08d}"


def expected_answer(text: str) -> str:
    if text == TOOL_TEXT:
        return TOOL_ANSWER
    if text.startswith("!sleep"):
        return "echo: " + text.split("\n", 1)[1]
    return f"echo: {text}"


# --- what the bots did ------------------------------------------------------------------------------


@dataclass
class Op:
    bot: int
    session_id: str
    key: str
    text: str
    phase: str  # throughput | dup | overload | overload-dup | retry
    receipt: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    original_turn: str | None = None  # for a duplicate: the turn of the key's first receipt


@dataclass
class Record:
    ops: list[Op] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    rejected_in_throughput: int = 0
    rate_limited: int = 0
    sessions: dict[int, list[str]] = field(default_factory=dict)

    def problem(self, text: str) -> None:
        self.problems.append(text)


def state_of(op: Op) -> str | None:
    return (op.receipt or {}).get("state")


def _receipt(r: Any) -> dict[str, Any]:
    return {"state": r.state, "turnId": r.turn_id, "retryAfterMs": r.retry_after_ms}


def _result(r: Any) -> dict[str, Any]:
    return {"state": r.state, "outputText": r.output_text, "code": r.code}


# --- transports: one async interface ------------------------------------------------------------------


class InProcessApi:
    def __init__(self, host: Any, bots: int) -> None:
        self.loops = [host.async_sessions(app=app_id(b)) for b in range(bots)]

    async def create(self, bot: int, title: str) -> str:
        made = await self.loops[bot].create(container_id="inbox", title=title, permission_mode="acceptCalls")
        return str(made.session_id)

    async def send(self, bot: int, sid: str, text: str, key: str, blast: bool = False) -> dict[str, Any]:
        return _receipt(await self.loops[bot].send(sid, text, idempotency_key=key))

    async def widen(self, bot: int, sends: int) -> None:
        pass

    async def wait(self, bot: int, sid: str, turn_id: str, timeout_ms: int) -> dict[str, Any]:
        return _result(await self.loops[bot].wait_for_turn(sid, turn_id, timeout_ms=timeout_ms))

    async def close(self) -> None:
        pass


class WsApi:
    """Per bot a few app-token connections (``cli.bench_ws.WsClient``: multiplexed by request id);
    session i of a bot uses connection i mod n."""

    def __init__(self, port: int, rec: Record) -> None:
        self.port = port
        self.rec = rec
        self.conns: dict[int, list[Any]] = {}
        self.route: dict[str, Any] = {}
        self.blast: dict[int, list[Any]] = {}  # extra connections for the overload phase
        self.blast_next = 0
        self.created: dict[int, int] = {}

    async def open(self, bot: int, n: int) -> None:
        from websockets.asyncio.client import connect

        from sessionloop.cli.bench_ws import WsClient

        self.conns[bot] = []
        for _ in range(n):
            ws = await connect(f"ws://127.0.0.1:{self.port}/session", max_size=None, compression=None,
                               ping_interval=None, additional_headers={"Authorization": f"Bearer {app_token(bot)}"})
            c = WsClient(ws)
            await c.call("initialize", {"protocolVersion": "0.2.0", "client": {"name": f"bot{bot}", "version": "1"}})
            self.conns[bot].append(c)

    async def call(self, client: Any, method: str, params: dict[str, Any]) -> Any:
        from sessionloop.cli.bench_ws import Rejected

        while True:
            try:
                return await client.call(method, params)
            except Rejected as e:  # the per-connection request rate limit: wait as told
                self.rec.rate_limited += 1
                await asyncio.sleep(e.retry_after_ms / 1000)

    async def create(self, bot: int, title: str) -> str:
        conns = self.conns[bot]
        self.created[bot] = self.created.get(bot, 0) + 1  # counted before the await: creates run at once
        client = conns[(self.created[bot] - 1) % len(conns)]
        made = await self.call(client, "loop/create", {"containerId": "inbox", "title": title,
                                                       "permissionMode": "acceptCalls"})
        self.route[made["sessionId"]] = client
        return str(made["sessionId"])

    async def widen(self, bot: int, sends: int) -> None:
        """Enough connections that ``sends`` sends at once fit in their request-rate bursts (200
        each): the overload phase measures the quotas, not the per-connection rate limit."""
        extra = -(-sends // 150)
        base = self.conns[bot]
        await self.open(bot, extra)
        self.blast[bot] = self.conns[bot]
        self.conns[bot] = base + self.blast[bot]

    async def send(self, bot: int, sid: str, text: str, key: str, blast: bool = False) -> dict[str, Any]:
        client = self.route[sid]
        if blast and self.blast.get(bot):
            self.blast_next += 1
            client = self.blast[bot][self.blast_next % len(self.blast[bot])]
        r = await self.call(client, "loop/send", {"sessionId": sid, "text": text, "idempotencyKey": key})
        return {"state": r["state"], "turnId": r.get("turnId"), "retryAfterMs": r.get("retryAfterMs")}

    async def wait(self, bot: int, sid: str, turn_id: str, timeout_ms: int) -> dict[str, Any]:
        r = await self.call(self.route[sid], "loop/waitForTurn", {"sessionId": sid, "turnId": turn_id,
                                                                  "timeoutMs": timeout_ms})
        return {"state": r["state"], "outputText": r.get("outputText"), "code": r.get("code")}

    async def close(self) -> None:
        for conns in self.conns.values():
            for c in conns:
                try:
                    await c.close()
                except Exception:  # noqa: BLE001,S110
                    pass


# --- phase 1: throughput --------------------------------------------------------------------------------


def check_result(rec: Record, op: Op, res: dict[str, Any]) -> None:
    op.result = res
    want = expected_answer(op.text)
    if res["state"] != "completed" or res.get("outputText") != want:
        rec.problem(f"{op.key}: wait gave {res}, expected completed {want!r}")


def check_duplicate(rec: Record, op: Op, r: dict[str, Any]) -> None:
    op.receipt = r
    if r["state"] != "duplicate" or r["turnId"] != op.original_turn:
        rec.problem(f"{op.key} sent again ({op.phase}): receipt {r}, expected duplicate of turn {op.original_turn}")


def schedule(spec: dict[str, Any], index: int) -> list[bool]:
    """Session number ``index``'s sends in order, True for a repeat of an earlier key: ``turns`` new
    keys (the first send is always new) and its share of repeats, spread so that over all sessions
    repeats are ``dup_ratio`` of the sends."""
    x = spec["turns"] * spec["dup_ratio"] / (1 - spec["dup_ratio"])
    n_dup = int((index + 1) * x + 1e-9) - int(index * x + 1e-9)
    rest = [False] * (spec["turns"] - 1) + [True] * n_dup
    random.Random(index).shuffle(rest)
    return [False, *rest]


class Pacer:
    """``--rate``: new keys sent at most ``rate`` a second over all sessions, on a fixed schedule
    (a session that is late, waiting for its previous turn, takes the next free slot; slots are
    not saved up, so there is no burst), so the latency is the server's at that load."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next = 0.0

    async def wait(self) -> None:
        t = now()
        slot = max(self.next, t)
        self.next = slot + self.interval
        if slot > t:
            await asyncio.sleep(slot - t)


async def session_worker(api: Any, rec: Record, bot: int, s: int, sid: str, spec: dict[str, Any],
                         pacer: Pacer | None = None) -> None:
    rng = random.Random(f"{bot}-{s}")
    done: list[Op] = []
    n = 0
    for repeat in schedule(spec, bot * spec["sessions_per_bot"] + s):
        if repeat:
            first = rng.choice(done)
            op = Op(bot, sid, first.key, first.text, "dup", original_turn=first.receipt["turnId"])  # type: ignore[index]
            rec.ops.append(op)
            check_duplicate(rec, op, await api.send(bot, sid, op.text, op.key))
            check_result(rec, op, await api.wait(bot, sid, op.original_turn, WAIT_MS))
            continue
        key = f"b{bot}-s{s}-t{n}"
        op = Op(bot, sid, key, TOOL_TEXT if n % 2 == 0 else f"hello {key}", "throughput")
        rec.ops.append(op)
        if pacer is not None:
            await pacer.wait()
        t0 = now()
        while True:
            r = await api.send(bot, sid, op.text, key)
            if r["state"] != "rejected":
                break
            rec.rejected_in_throughput += 1
            await asyncio.sleep((r["retryAfterMs"] or 1000) / 1000)
        op.receipt = r
        if r["state"] not in ("accepted", "queued"):
            rec.problem(f"{key}: new key answered {r}")
            return
        check_result(rec, op, await api.wait(bot, sid, r["turnId"], WAIT_MS))
        rec.latencies.append(now() - t0)
        done.append(op)
        n += 1


async def throughput_async(api: Any, rec: Record, spec: dict[str, Any]) -> float:
    pacer = Pacer(spec["rate"]) if spec.get("rate") else None
    t0 = now()
    await asyncio.gather(*(session_worker(api, rec, b, s, sid, spec, pacer)
                           for b, sids in rec.sessions.items() for s, sid in enumerate(sids)))
    return now() - t0


def throughput_sync(host: Any, rec: Record, spec: dict[str, Any]) -> float:
    """One thread per bot with the sync API: each round sends to every session of the bot, then
    waits for each turn (the latency of a turn counts from its send to its wait's return)."""
    lock = threading.Lock()

    def bot(b: int) -> None:
        loop = host.sessions(app=app_id(b))
        sids = rec.sessions[b]
        plans = [schedule(spec, b * spec["sessions_per_bot"] + s) for s in range(len(sids))]
        rngs = [random.Random(f"{b}-{s}") for s in range(len(sids))]
        done: list[list[Op]] = [[] for _ in sids]
        counts = [0] * len(sids)
        while any(plans):
            pending: list[tuple[Op, float]] = []
            for s, sid in enumerate(sids):
                while plans[s] and plans[s][0]:  # the repeats due before this session's next new key
                    plans[s].pop(0)
                    first = rngs[s].choice(done[s])
                    op = Op(b, sid, first.key, first.text, "dup", original_turn=first.receipt["turnId"])  # type: ignore[index]
                    check_duplicate(rec, op, _receipt(loop.send(sid, op.text, idempotency_key=op.key)))
                    check_result(rec, op, _result(loop.wait_for_turn(sid, op.original_turn, timeout_ms=WAIT_MS)))
                    with lock:
                        rec.ops.append(op)
                if not plans[s]:
                    continue
                plans[s].pop(0)
                key = f"b{b}-s{s}-t{counts[s]}"
                op = Op(b, sid, key, TOOL_TEXT if counts[s] % 2 == 0 else f"hello {key}", "throughput")
                t0 = now()
                while True:
                    r = _receipt(loop.send(sid, op.text, idempotency_key=key))
                    if r["state"] != "rejected":
                        break
                    with lock:
                        rec.rejected_in_throughput += 1
                    time.sleep((r["retryAfterMs"] or 1000) / 1000)
                op.receipt = r
                with lock:
                    rec.ops.append(op)
                pending.append((op, t0))
                counts[s] += 1
            for op, t0 in pending:
                check_result(rec, op, _result(loop.wait_for_turn(op.session_id, op.receipt["turnId"],  # type: ignore[index]
                                                                 timeout_ms=WAIT_MS)))
                with lock:
                    rec.latencies.append(now() - t0)
                done[sids.index(op.session_id)].append(op)

    t0 = now()
    with ThreadPoolExecutor(len(rec.sessions)) as pool:
        list(pool.map(bot, list(rec.sessions)))
    return now() - t0


# --- phase 2: overload ------------------------------------------------------------------------------------


async def overload(api: Any, rec: Record, spec: dict[str, Any]) -> dict[str, Any]:
    """Over the per-session quota (one session), then over the per-app quota (every session), at once."""
    out: Counter[str] = Counter()
    for b in range(min(spec["overload_bots"], len(rec.sessions))):
        await overload_bot(api, rec, b, spec, out)
    sent = out["one_sent"] + out["app_sent"]
    rejected_n = out["one_rejected"] + out["app_rejected"]
    return {**out, "app_quota_held": out["peak_unfinished"] <= APP_QUOTA,
            "quota_test_conclusive": out["send_window_ms"] < HEAD_SLEEP_MS, "sent": sent, "rejected": rejected_n,
            "rejected_rate": rejected_n / sent if sent else 0.0,
            "all_rejections_retry_after_1000": out["retry_after_1000"] == rejected_n,
            "dups_over_quota_all_duplicate": out["dups_over_quota_ok"] == out["dups_over_quota"],
            "rejected_resent_all_accepted": out["rejected_resent_accepted"] == out["rejected_resent"]}


async def overload_bot(api: Any, rec: Record, b: int, spec: dict[str, Any], out: Counter[str]) -> None:
    sids = rec.sessions[b]

    async def send(sid: str, key: str, text: str, phase: str) -> Op:
        op = Op(b, sid, key, text, phase)
        rec.ops.append(op)
        op.receipt = await api.send(b, sid, text, key, blast=True)
        return op

    def text(k: int, what: str) -> str:
        return f"!sleep {HEAD_SLEEP_MS if k == 0 else SLEEP_MS}\nover {what} {k}"

    await api.widen(b, spec["overload_one"] + spec["overload_each"] * len(sids))
    rate_limited0 = rec.rate_limited
    t0 = now()
    # each session's slow head is acknowledged before the rest are sent: concurrent sends may
    # reach a session in any order (over two workers some are relayed), and a short turn first
    # would end, and free its slot, inside the send window
    one = [await send(sids[0], f"b{b}-over1-0", text(0, "one"), "overload")]
    one += await asyncio.gather(*(send(sids[0], f"b{b}-over1-{k}", text(k, "one"), "overload")
                                  for k in range(1, spec["overload_one"])))
    each = await asyncio.gather(*(send(sid, f"b{b}-s{s}-over-0", text(0, str(s)), "overload")
                                  for s, sid in enumerate(sids)))
    each += await asyncio.gather(*(send(sid, f"b{b}-s{s}-over-{k}", text(k, str(s)), "overload")
                                   for k in range(1, spec["overload_each"]) for s, sid in enumerate(sids)))
    # no turn of this bot can end before HEAD_SLEEP_MS: everything accepted is unfinished at once
    out["send_window_ms"] = max(out["send_window_ms"], int((now() - t0) * 1000))
    out["rate_limited"] += rec.rate_limited - rate_limited0
    # repeats of accepted keys while the app is over its quota: still the original receipt
    accepted = [op for op in one + each if state_of(op) in ("accepted", "queued")]
    dups = []
    for first in accepted[:10]:
        op = Op(b, first.session_id, first.key, first.text, "overload-dup",
                original_turn=first.receipt["turnId"])  # type: ignore[index]
        rec.ops.append(op)
        check_duplicate(rec, op, await api.send(b, op.session_id, op.text, op.key))
        dups.append(op)
    for name, ops in (("one", one), ("app", each)):
        states = Counter(state_of(op) for op in ops)
        out[f"{name}_sent"] += len(ops)
        out[f"{name}_accepted"] += states["accepted"] + states["queued"]
        out[f"{name}_rejected"] += states["rejected"]
    out["peak_unfinished"] = max(out["peak_unfinished"], len(one) + len(each) - len(
        [op for op in one + each if state_of(op) == "rejected"]))
    rejected = [op for op in one + each if state_of(op) == "rejected"]
    out["retry_after_1000"] += len([op for op in rejected if (op.receipt or {}).get("retryAfterMs") == 1000])
    out["dups_over_quota"] += len(dups)
    out["dups_over_quota_ok"] += len([op for op in dups if state_of(op) == "duplicate"])
    gate = asyncio.Semaphore(100)

    async def wait(op: Op) -> None:
        async with gate:
            check_result(rec, op, await api.wait(b, op.session_id, op.receipt["turnId"], WAIT_MS))  # type: ignore[index]

    t0 = now()
    await asyncio.gather(*(wait(op) for op in accepted))
    out["drain_ms"] = max(out["drain_ms"], int((now() - t0) * 1000))
    # a rejection is not recorded: the same key sent again later is a new input
    retried = []
    for first in rejected[:10]:
        op = Op(b, first.session_id, first.key, first.text, "retry")
        rec.ops.append(op)
        op.receipt = await api.send(b, op.session_id, op.text, op.key)
        retried.append(op)
    out["rejected_resent"] += len(retried)
    out["rejected_resent_accepted"] += len([op for op in retried if state_of(op) in ("accepted", "queued")])
    await asyncio.gather(*(wait(op) for op in retried if state_of(op) != "rejected"))


# --- phase 3: the event log ---------------------------------------------------------------------------------


def check_log(store: Any, rec: Record) -> dict[str, Any]:
    from sessionloop.actors import events as E

    turn_end = (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)
    keys: dict[tuple[str, str], list[str]] = defaultdict(list)  # (session, key) -> turn ids
    started: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    bot_of = {sid: b for b, sids in rec.sessions.items() for sid in sids}
    problems: list[str] = []
    for recorded in store.iter_all(0):
        sid = recorded.stream[len("session-"):] if recorded.stream.startswith("session-") else None
        if sid not in bot_of:
            continue
        ev = recorded.event
        if isinstance(ev, E.InputAccepted):
            keys[(sid, ev.idempotency_key or "")].append(ev.turn_id)
        elif isinstance(ev, E.TurnStarted):
            started[ev.turn_id] += 1
        elif isinstance(ev, turn_end):
            ended[ev.turn_id] += 1
    lost = dup = 0
    for (sid, key), turns in keys.items():
        if len(turns) > 1:
            dup += 1
            problems.append(f"key {key}: {len(turns)} inputs accepted")
        if store.get_receipt(f"app:{app_id(bot_of[sid])}:{sid}", key) is None:
            lost += 1
            problems.append(f"key {key}: no receipt in the idempotency index")
        for tid in turns:
            if started[tid] != 1 or ended[tid] != 1:
                if started[tid] > 1 or ended[tid] > 1:
                    dup += 1
                else:
                    lost += 1
                problems.append(f"key {key} turn {tid}: started {started[tid]}x, ended {ended[tid]}x")
    acked: dict[tuple[str, str], str] = {}
    for op in rec.ops:
        state = (op.receipt or {}).get("state")
        if state in ("accepted", "queued"):
            acked[(op.session_id, op.key)] = op.receipt["turnId"]  # type: ignore[index]
    for k, tid in acked.items():
        if keys.get(k, [None])[0] != tid:
            lost += 1
            problems.append(f"acknowledged key {k[1]}: receipt turn {tid}, log {keys.get(k)}")
    only_rejected = {(op.session_id, op.key) for op in rec.ops if (op.receipt or {}).get("state") == "rejected"}
    only_rejected -= set(acked)
    leaked = [k for k in only_rejected if k in keys]
    if leaked:
        dup += len(leaked)
        problems.append(f"{len(leaked)} rejected keys are in the log, e.g. {leaked[:3]}")
    extra = set(keys) - set(acked)
    if extra:
        dup += len(extra)
        problems.append(f"{len(extra)} inputs in the log that no receipt acknowledged, e.g. {list(extra)[:3]}")
    wrong = len(rec.problems)
    return {"ok": not (lost or dup or wrong), "keys_verified": len(keys),
            "turns_verified": sum(len(t) for t in keys.values()), "lost": lost, "duplicated": dup, "wrong": wrong,
            "problems": (rec.problems + problems)[:20]}


# --- jobs -------------------------------------------------------------------------------------------------------


def summarize(rec: Record, wall: float, spec: dict[str, Any], cpu_s: float) -> dict[str, Any]:
    lat = sorted(rec.latencies)
    tp = [op for op in rec.ops if op.phase == "throughput"]
    dups = [op for op in rec.ops if op.phase == "dup"]
    return {"bots": spec["bots"], "sessions": spec["bots"] * spec["sessions_per_bot"], "turns": len(lat),
            "seconds": wall, "turns_per_s": len(lat) / wall if wall else 0.0,
            "sends": len(tp) + len(dups), "dup_sends": len(dups),
            "dup_share": len(dups) / (len(tp) + len(dups)) if tp else 0.0,
            "dups_answered_duplicate": sum(1 for op in dups if (op.receipt or {}).get("state") == "duplicate"),
            "p50_ms": percentile(lat, 0.50) * 1000, "p95_ms": percentile(lat, 0.95) * 1000,
            "p99_ms": percentile(lat, 0.99) * 1000, "max_ms": (lat[-1] if lat else float("nan")) * 1000,
            "rejected_in_throughput": rec.rejected_in_throughput, "rate_limited_requests": rec.rate_limited,
            "cpu_ms_per_turn": cpu_s / len(lat) * 1000 if lat else float("nan")}


def job_inprocess(spec: dict[str, Any]) -> dict[str, Any]:
    from sessionloop.actors.api.host import Host

    data_dir = tempfile.mkdtemp(prefix="bench-bots-")
    try:
        host = Host.open(data_dir, durability=spec["durability"],
                         max_live=max(4000, 2 * spec["bots"] * spec["sessions_per_bot"]))
        try:
            for b in range(spec["bots"]):
                host.register_app(app_id(b), platform="bench", containers=["inbox"], token=app_token(b))
            rec = Record()
            api = InProcessApi(host, spec["bots"])

            async def setup() -> None:
                for b in range(spec["bots"]):
                    rec.sessions[b] = list(await asyncio.gather(*(api.create(b, f"bot {b} chat {s}")
                                                                  for s in range(spec["sessions_per_bot"]))))

            asyncio.run(setup())
            head0 = host.store.head_position
            cpu0 = time.process_time()
            if spec["transport"] == "inprocess-sync":
                wall = throughput_sync(host, rec, spec)
            else:
                wall = asyncio.run(throughput_async(api, rec, spec))
            cpu = time.process_time() - cpu0
            events = host.store.head_position - head0
            out = summarize(rec, wall, spec, cpu)
            out["events_per_s"] = events / wall
            out["overload"] = asyncio.run(overload(api, rec, spec))
            time.sleep(0.2)
            out["check"] = check_log(host.store, rec)
            out["peak_rss_mib"] = rss_peak_mib()
            return out
        finally:
            host.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def reroute_to_other_workers(api: WsApi, rec: Record, workers: int) -> float:
    """``--ws-route other``: each session driven through a connection of its bot on another worker
    than the session's (every request relayed, as a front process would pass every frame on);
    the share of sessions that could be. A connection's worker is that of the sessions it made
    (a session is made on its maker's worker)."""
    owner = Placement(0, workers, SHARDS).owner

    moved = 0
    for b, sids in rec.sessions.items():
        at = {id(api.route[sid]): owner(sid) for sid in sids}
        for sid in sids:
            other = [c for c in api.conns[b] if at.get(id(c), owner(sid)) != owner(sid)]
            if other:
                api.route[sid] = other[hash(sid) % len(other)]
                moved += 1
    return moved / max(1, sum(len(s) for s in rec.sessions.values()))


def job_ws(spec: dict[str, Any]) -> dict[str, Any]:
    from sessionloop.actors.events import open_store

    pinned = spec["placement"] != "unpinned"
    if pinned:
        os.sched_setaffinity(0, {1})
    data_dir = tempfile.mkdtemp(prefix="bench-bots-ws-")
    with open(os.path.join(data_dir, "apps.toml"), "w") as f:
        f.writelines(f'[apps.{app_id(b)}]\ntoken = "{app_token(b)}"\nplatform = "bench"\ncontainers = ["inbox"]\n\n'
                     for b in range(spec["bots"]))
    workers = spec.get("workers", 1)
    log_dir = tempfile.mkdtemp(prefix="bench-bots-log-")
    nats, cluster_args = start_log(spec.get("log", "lmdb"), log_dir)
    try:
        server = ServerProc(data_dir, OWNER_TOKEN, ["--durability", spec["durability"], "--workers", str(workers),
                                                    *cluster_args], "0" if pinned else None)
    except BaseException:
        stop_log(nats, log_dir)
        raise
    log_pids = [srv.proc.pid for srv in (nats.servers if isinstance(nats, NatsCluster) else [nats]) if srv]
    try:
        rec = Record()
        api = WsApi(server.port, rec)

        async def run() -> dict[str, Any]:
            try:
                per_conn = spec["ws_sessions_per_conn"]
                for b in range(spec["bots"]):
                    await api.open(b, max(1, -(-spec["sessions_per_bot"] // per_conn)))
                    rec.sessions[b] = list(await asyncio.gather(*(api.create(b, f"bot {b} chat {s}")
                                                                  for s in range(spec["sessions_per_bot"]))))
                if spec.get("ws_route") == "other":
                    out_relayed = reroute_to_other_workers(api, rec, workers)
                # the server's CPU: the process and, with --workers, its workers and nats-server
                cpu0, scpu0 = time.process_time(), proc_tree_cpu_s(server.proc.pid)
                lcpu0 = sum(proc_tree_cpu_s(pid) for pid in log_pids)
                switches0 = proc_tree_switches(server.proc.pid)
                wall = await throughput_async(api, rec, spec)
                cpu, scpu = time.process_time() - cpu0, proc_tree_cpu_s(server.proc.pid) - scpu0
                lcpu = sum(proc_tree_cpu_s(pid) for pid in log_pids) - lcpu0
                switches = proc_tree_switches(server.proc.pid) - switches0
                out = summarize(rec, wall, spec, cpu + scpu + lcpu)
                out["server_cpu_ms_per_turn"] = scpu / out["turns"] * 1000 if out["turns"] else float("nan")
                if log_pids:  # the log's servers (nats-server), not children of serve
                    out["log_cpu_ms_per_turn"] = lcpu / out["turns"] * 1000 if out["turns"] else float("nan")
                out["server_switches_per_turn"] = switches / out["turns"] if out["turns"] else float("nan")
                out["connections"] = sum(len(c) for c in api.conns.values())
                out["server_rss_mib"] = sum(proc_rss_mib(p) for p in proc_tree(server.proc.pid))
                out["server_processes"] = len(proc_tree(server.proc.pid))
                if nats is not None:  # messages in the log (commits, one fence a shard) per turn
                    out["log_messages_per_turn"] = await log_messages(nats) / out["turns"] if out["turns"] else 0.0
                if spec.get("ws_route") == "other":
                    out["relayed_share"] = out_relayed
                out["overload"] = await overload(api, rec, spec)
                return out
            finally:
                await api.close()

        out = asyncio.run(run())
        time.sleep(0.2)
    finally:
        out_exit = server.stop()
        stop_log(nats, log_dir)
    try:
        store = open_store(os.path.join(data_dir, "store"), readonly=True)
        try:
            out["check"] = check_log(store, rec)
        finally:
            store.close()
        out["server_exit"] = out_exit
        out["server_log_tail"] = server.tail[-10:]
        out["peak_rss_mib"] = out["server_rss_mib"]
        return out
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


JOBS = {"inprocess": job_inprocess, "inprocess-sync": job_inprocess, "ws": job_ws}


# --- the parent ---------------------------------------------------------------------------------------------------


def run_child(spec: dict[str, Any], pinned: bool) -> dict[str, Any]:
    return run_job(__file__, spec, pinned=pinned, cwd=ROOT, label=f"{spec['transport']} {spec['placement']}")

def flat(res: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in res.items() if k not in ("overload", "check")}
    out.update({f"over_{k}": v for k, v in res["overload"].items()})
    return out


def median_of(samples: list[dict[str, Any]]) -> dict[str, Any]:
    flats = [flat(s) for s in samples]
    out: dict[str, Any] = {k: statistics.median(f[k] for f in flats) for k in flats[0]
                           if isinstance(flats[0][k], (int, float)) and not isinstance(flats[0][k], bool)}
    for k in flats[0]:
        if isinstance(flats[0][k], bool):
            out[k] = all(f[k] for f in flats)
    out["check_ok"] = all(s["check"]["ok"] for s in samples)
    out["samples"] = samples
    return out


ROWS = [("sessions", "sessions (bots x sessions each)", ",.0f"), ("turns", "turns completed", ",.0f"),
        ("turns_per_s", "turns/s", ",.0f"), ("p50_ms", "send -> completed p50 (ms)", ",.1f"),
        ("p95_ms", "send -> completed p95 (ms)", ",.1f"), ("p99_ms", "send -> completed p99 (ms)", ",.1f"),
        ("max_ms", "send -> completed max (ms)", ",.1f"), ("sends", "sends (new + repeated keys)", ",.0f"),
        ("dup_share", "share of sends repeating a key", ".3f"),
        ("dups_answered_duplicate", "repeats answered 'duplicate'", ",.0f"),
        ("rejected_in_throughput", "rejected receipts (throughput)", ",.0f"),
        ("rate_limited_requests", "rate-limited requests (ws, retried)", ",.0f"),
        ("events_per_s", "events/s", ",.0f"), ("cpu_ms_per_turn", "CPU ms per turn (all procs)", ".3f"),
        ("server_cpu_ms_per_turn", "server CPU ms per turn", ".3f"),
        ("server_switches_per_turn", "server context switches per turn", ".1f"),
        ("log_cpu_ms_per_turn", "log (nats-server) CPU ms per turn", ".3f"),
        ("log_messages_per_turn", "log messages per turn", ".2f"),
        ("peak_rss_mib", "peak RSS server (MiB)", ",.0f"),
        ("relayed_share", "sessions driven through another worker", ".2f"),
        ("over_one_sent", "overload: sends to one session", ",.0f"),
        ("over_one_accepted", "overload: one session accepted", ",.0f"),
        ("over_one_rejected", "overload: one session rejected", ",.0f"),
        ("over_app_sent", "overload: sends to all sessions", ",.0f"),
        ("over_app_accepted", "overload: all sessions accepted", ",.0f"),
        ("over_app_rejected", "overload: all sessions rejected", ",.0f"),
        ("over_rejected_rate", "overload: rejected receipt rate", ".3f"),
        ("over_peak_unfinished", "overload: unfinished at once (<=200)", ",.0f"),
        ("over_send_window_ms", "overload: send window (ms, < 2000)", ",.0f"),
        ("over_rate_limited", "overload: rate-limited, retried", ",.0f"),
        ("over_drain_ms", "overload: drain accepted (ms)", ",.0f")]
BOOL_ROWS = [("over_app_quota_held", "app quota held (<= 200 unfinished)"),
             ("over_quota_test_conclusive", "overload sent before any turn ended"),
             ("over_all_rejections_retry_after_1000", "rejections say retryAfterMs 1000"),
             ("over_dups_over_quota_all_duplicate", "repeats over quota -> duplicate"),
             ("over_rejected_resent_all_accepted", "rejected keys resent -> accepted"), ("check_ok", "event log check")]


def print_table(title: str, cols: dict[str, dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"{'measure':<38}" + "".join(f"{c:>31}" for c in cols))
    print("-" * (38 + 31 * len(cols)))
    for key, name, fmt in ROWS:
        cells = []
        for col in cols.values():
            v = col.get(key)
            cells.append(f"{format(v, fmt) if isinstance(v, (int, float)) else '-':>31}")
        print(f"{name:<38}" + "".join(cells))
    for key, name in BOOL_ROWS:
        print(f"{name:<38}" + "".join(f"{('yes' if cols[c].get(key) else 'NO'):>31}" for c in cols))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 bots x 10 sessions x 10 turns, one repeat")
    ap.add_argument("--bots", type=int, help="bot apps (default 20; 4 with --quick)")
    ap.add_argument("--sessions-per-bot", type=int, help="sessions each bot owns (default 50; 10 with --quick)")
    ap.add_argument("--turns", type=int, help="new inputs per session (default 10)")
    ap.add_argument("--dup-ratio", type=float, default=0.1, help="share of sends repeating an earlier key")
    ap.add_argument("--durability", choices=["sync", "nosync"], default="nosync")
    ap.add_argument("--transports", default="inprocess,inprocess-sync,ws",
                    help="comma-separated: inprocess, inprocess-sync, ws")
    ap.add_argument("--overload-bots", type=int, default=1, help="bots that run the overload phase")
    ap.add_argument("--overload-one", type=int, default=30, help="sends at once to one session (quota 20)")
    ap.add_argument("--overload-each", type=int, default=25,
                    help="sends at once to every session of the bot (app quota 200)")
    ap.add_argument("--ws-sessions-per-conn", type=int, default=5,
                    help="ws: sessions sharing one bot connection (the server allows 100 requests/s, burst 200, "
                         "per connection; a turn is 2 requests)")
    ap.add_argument("--workers", default="1",
                    help="ws: comma-separated worker counts of the server (serve --workers), each a column, "
                         "unpinned (e.g. 1,2)")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="new turns sent per second over all sessions, on a fixed schedule (0: as fast as "
                         "turns end); with a rate below capacity the latency is the server's at that load "
                         "(inprocess and ws; not inprocess-sync)")
    ap.add_argument("--ws-route", default="own",
                    help="ws with --workers > 1: drive each session through a connection on its own worker "
                         "(own: what a bot that makes its sessions gets), on another one (other: every "
                         "request relayed, the cost a front process passing every frame on would add), "
                         "or both (own,other: a column each)")
    ap.add_argument("--log", default="lmdb",
                    help="ws: comma-separated stores of the server, each a column: lmdb (the embedded default), "
                         "r1 (serve --cluster: the store follows a JetStream log on one nats-server), r3 (the log "
                         "at R=3 on a three-server NATS cluster on this machine)")
    ap.add_argument("--repeats", type=int, help="runs per figure, median reported (default 3; 1 with --quick)")
    ap.add_argument("--no-pinned", action="store_true", help="skip the pinned runs")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    fill_defaults(args, [("bots", 20, 4), ("sessions_per_bot", 50, 10), ("turns", 10, 10), ("repeats", 3, 1)])
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(JOBS[spec["transport"]](spec)))
        return
    can_pin = not args.no_pinned and shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) >= 2
    base = {"bots": args.bots, "sessions_per_bot": args.sessions_per_bot, "turns": args.turns,
            "dup_ratio": args.dup_ratio, "durability": args.durability, "overload_bots": args.overload_bots,
            "overload_one": args.overload_one, "overload_each": args.overload_each,
            "ws_sessions_per_conn": args.ws_sessions_per_conn, "rate": args.rate}
    if args.rate and "inprocess-sync" in args.transports:
        raise SystemExit("--rate paces the asyncio bots: use it with --transports inprocess,ws")
    modes: list[tuple[str, str, bool, int, str, str]] = []
    worker_counts = [int(n) for n in args.workers.split(",")]
    logs = [k.strip() for k in args.log.split(",")]
    if not set(logs) <= {"lmdb", "r1", "r3"} or (logs != ["lmdb"] and worker_counts != [1]):
        raise SystemExit(f"--log takes lmdb, r1 and r3 (with one worker), not {args.log!r}")
    routes = [r.strip() for r in args.ws_route.split(",")]
    if not set(routes) <= {"own", "other"}:
        raise SystemExit(f"--ws-route takes own, other or both, not {args.ws_route!r}")
    for t in args.transports.split(","):
        t = t.strip()
        if t not in JOBS:
            raise SystemExit(f"unknown transport {t!r}")
        for n in worker_counts if t == "ws" else [1]:
            for route in routes if t == "ws" and n > 1 else ["own"]:
                for kind in logs if t == "ws" else ["lmdb"]:
                    modes.append((t, "unpinned", False, n, route, kind))
        if can_pin and (t != "ws" or worker_counts == [1]):  # workers spread over the cores: not pinned
            modes.append((t, "server-cpu0" if t == "ws" else "pinned_cpu0", t != "ws", 1, "own", "lmdb"))
    print(f"bots: {args.bots} bot apps x {args.sessions_per_bot} sessions x {args.turns} turns, "
          f"{args.dup_ratio:.0%} repeated keys, durability {args.durability}; the clients and the server share "
          f"this {len(os.sched_getaffinity(0))}-CPU machine (ws server-cpu0: server under taskset -c 0, bots under "
          f"taskset -c 1)", flush=True)
    samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in range(args.repeats):
        for transport, placement, pinned, workers, route, kind in modes:
            res = run_child({**base, "transport": transport, "placement": placement, "workers": workers,
                             "ws_route": route, "log": kind}, pinned)
            label = f"{transport} {placement}" + (f" workers={workers}" if transport == "ws" and workers > 1 else "")
            label += " relayed" if route == "other" else ""
            label += f" log={kind}" if kind != "lmdb" else ""
            samples[label].append(res)
            print(f"  run {r + 1}/{args.repeats} {label}: {res['turns_per_s']:,.0f} turns/s, p99 "
                  f"{res['p99_ms']:.1f} ms, overload rejected {res['overload']['rejected_rate']:.0%}, check "
                  f"{'ok' if res['check']['ok'] else 'FAILED'}", flush=True)
    cols = {k: median_of(v) for k, v in samples.items()}
    print_table(f"Session Loop API bots (medians of {args.repeats})", cols)
    failed = []
    for k, v in cols.items():
        for s in v["samples"]:
            c = s["check"]
            if c["ok"]:
                print(f"event log check ({k}): ok: {c['keys_verified']:,} idempotency keys, {c['turns_verified']:,} "
                      f"turns, none lost or duplicated")
            else:
                failed.append(k)
                print(f"event log check ({k}): FAILED: {c['lost']} lost, {c['duplicated']} duplicated, "
                      f"{c['wrong']} wrong; first: {c['problems'][:5]}")
    results = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick, "params": base,
               "cpus": len(os.sched_getaffinity(0)), "results": cols,
               "note": "clients and server share the machine"}
    write_results("bots", results)
    if failed:
        raise SystemExit(f"event log check FAILED: {', '.join(sorted(set(failed)))}")


if __name__ == "__main__":
    main()
