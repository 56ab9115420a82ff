"""RELIABILITY slow_consumer_isolation, approval_first_answer_wins and idempotent_send, at their
pass criteria, against real ``sessionloop serve`` subprocesses with real WebSocket clients.

* slow_consumer_isolation: 200 healthy subscribers' push latency p99 is measured without and then
  with one client that never reads (incompressible payloads), in the same run; the stalled client
  is closed 4008 when its outbox overflows and the server's RSS stays bounded.
* approval_first_answer_wins: 10 approvals x 8 connections answering at once, some with a wrong
  content hash: one settlement each, every other answer refused, each approved tool run once.
* idempotent_send: ``loop/send`` as an app over 2 connections with retries, concurrent duplicates
  and same-key-different-body conflicts; the event log shows one input and one turn per key.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from tests.e2e.conftest import TOKEN, initialized
from tests.reliability.harness import (
    APP_TOKEN,
    Op,
    Recorder,
    audit,
    prepare,
    rss_kib,
    start,
)
from tests.reliability.mux import Mux, mux, noise, p50, p99, padded, within

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024


# --- slow_consumer_isolation ---------------------------------------------------------------------

HEALTHY = 200
HEALTHY_SESSIONS = 4
TICK_S = 0.04  # one healthy turn and one flood turn every tick
TICKS = 75  # per measured phase: 75 turns x 50 subscribers = 3,750 latency samples
FLOOD_BYTES = 67_500  # random bytes per flood turn: 90,000 characters of base64
ATTEMPTS = 3  # (baseline, stalled) pairs at most, each with a fresh stalled client
MARK = re.compile(r'"text": ?"(m[0-9a-z-]+) ')


def test_a_client_that_never_reads_leaves_200_healthy_subscribers_p99_within_2x_and_memory_bounded(server_factory):
    """200 healthy subscribers over 4 sessions, one driver sending a small turn to one of them and a
    90,000-character incompressible turn to a flood session every 40 ms; a draining subscriber
    reads the flood session throughout. Per attempt: a baseline phase, then a client that
    subscribes to the flood and the healthy sessions and never reads again, then the same phase.
    The stalled client must be closed 4008 within the phase, server RSS must grow <= 50 MB, no
    healthy subscriber may lose a push, and the healthy push latency p99 (turn/send -> user-message
    pushed to each subscriber) must stay within 2x of the baseline's."""
    # --close-timeout: the server waits this long for the stalled client to answer its 4008 close
    # before it drops the socket; the test reads the close code only after the phase, and a socket
    # dropped earlier (RST) would discard the close frame still queued in the client's kernel.
    server = server_factory("--max-outbox-mb", "2", "--close-timeout", "60")
    pid = server.proc.pid

    async def go() -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        driver = await mux(server)
        healthy_sids = [(await driver.result("session/create", {}))["session"]["id"] for _ in range(HEALTHY_SESSIONS)]
        arrivals: list[dict[str, float]] = [{} for _ in range(HEALTHY)]  # per client: marker -> arrival
        closed_early: list[int] = []

        async def healthy(i: int, ws: Any) -> None:
            got = arrivals[i]
            try:
                async for raw in ws:  # user-message pushes only; everything else is read and dropped
                    if '"user-message"' in raw and '"item/completed"' in raw:
                        m = MARK.search(raw)
                        if m:
                            got[m.group(1)] = loop.time()
            except ConnectionClosed:
                pass
            if ws.close_code not in (None, 1000):
                closed_early.append(i)

        sockets, readers = [], []
        for i in range(HEALTHY):
            ws = await connect(server.url, additional_headers={"Authorization": f"Bearer {TOKEN}"})
            c = await initialized(ws)
            await c.result("session/subscribe", {"sessionId": healthy_sids[i % HEALTHY_SESSIONS]})
            sockets.append(ws)
            readers.append(asyncio.ensure_future(healthy(i, ws)))
        # every phase floods a session of its own, read (and dropped) by this subscriber, so the
        # only difference between the phases is the client that stops reading; a new session each
        # time because a long history of big items makes the subscribe snapshot itself larger than
        # the outbox (test_a_reading_client_subscribing_to_a_session_with_big_history_...)
        drain = await mux(server, keep_pushes=False)

        rss: list[int] = []
        sampling = True

        async def sample() -> None:
            while sampling:
                rss.append(rss_kib(pid))
                await asyncio.sleep(0.05)
        sampler = asyncio.ensure_future(sample())

        async def flood_session() -> str:
            sid = (await driver.result("session/create", {}))["session"]["id"]
            await drain.result("session/subscribe", {"sessionId": sid})
            return sid

        async def phase(name: str, flood: str) -> tuple[list[float], int]:
            sent: dict[str, float] = {}
            calls = []
            start = loop.time()
            for k in range(TICKS):
                await asyncio.sleep(max(0.0, start + k * TICK_S - loop.time()))
                marker = f"m{name}-{k}"
                sid = healthy_sids[k % HEALTHY_SESSIONS]
                sent[marker] = loop.time()
                calls.append(asyncio.ensure_future(driver.call(
                    "turn/send", {"sessionId": sid, "content": padded(marker, 768)})))
                calls.append(asyncio.ensure_future(driver.call(
                    "turn/send", {"sessionId": flood, "content": padded(f"mF{name}-{k}", FLOOD_BYTES)})))
            replies = await asyncio.gather(*calls)
            assert all("result" in r for r in replies), [r for r in replies if "result" not in r][:3]
            deadline = loop.time() + 30
            expected = {i: {m for j, m in enumerate(sent) if j % HEALTHY_SESSIONS == i % HEALTHY_SESSIONS}
                        for i in range(HEALTHY)}
            while loop.time() < deadline and any(not expected[i] <= arrivals[i].keys() for i in range(HEALTHY)):
                await asyncio.sleep(0.05)
            missing = sum(len(expected[i] - arrivals[i].keys()) for i in range(HEALTHY))
            latencies = [arrivals[i][m] - sent[m] for i in range(HEALTHY) for m in expected[i] if m in arrivals[i]]
            return latencies, missing

        await phase("w", await flood_session())  # warm-up: first-use code paths and page faults
        attempts = []
        for n in range(ATTEMPTS):
            base, base_missing = await phase(f"b{n}", await flood_session())
            # the stalled client: subscribes to a flood and every healthy session, then never reads
            # again (max_queue=1 stops the library reading the socket after one frame, so the
            # server's writes back up into the kernel buffers, then into its outbox)
            flood = await flood_session()
            stalled = await connect(server.url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, max_queue=1)
            st = await initialized(stalled)
            for sid in [flood, *healthy_sids]:
                await st.result("session/subscribe", {"sessionId": sid})
            rss_before, mark_rss = rss_kib(pid), len(rss)
            stall, stall_missing = await phase(f"s{n}", flood)
            rss_peak = max(rss[mark_rss:] + [rss_kib(pid)])
            # now read what the stalled client was sent before the server closed it
            got, last_flood = 0, None
            try:
                while True:
                    raw = await asyncio.wait_for(stalled.recv(), 10)
                    got += len(raw)
                    m = re.search(r'"text": ?"mFs\d+-(\d+) ', raw) if '"user-message"' in raw else None
                    if m:
                        last_flood = int(m.group(1))
            except (ConnectionClosed, TimeoutError):  # a timeout: still open, never closed
                pass
            attempts.append({"base": base, "stall": stall, "missing": base_missing + stall_missing,
                             "rss_before": rss_before, "rss_peak": rss_peak, "stalled_read": got,
                             "last_flood": last_flood, "close": (stalled.close_code, stalled.close_reason)})
            if within(p99(base), p99(stall)) or stall_missing or stalled.close_code != 4008:
                break
        sampling = False
        await sampler
        for ws in sockets:
            await ws.close()
        await asyncio.gather(*readers)
        await drain.close()
        await driver.close()
        for a in attempts:
            a["closed_early"] = list(closed_early)
        return attempts

    attempts = asyncio.run(go())
    print()
    for n, a in enumerate(attempts):
        growth = (a["rss_peak"] - a["rss_before"]) / 1024
        print(f"slow consumer #{n}: healthy p50 {p50(a['base']) * 1000:.1f} -> {p50(a['stall']) * 1000:.1f} ms, "
              f"p99 {p99(a['base']) * 1000:.1f} ms without -> {p99(a['stall']) * 1000:.1f} ms with the stalled client "
              f"({len(a['base'])}/{len(a['stall'])} samples); server RSS {a['rss_before'] // 1024} MiB -> peak "
              f"{a['rss_peak'] // 1024} MiB (+{growth:.1f}); stalled client read {a['stalled_read'] / MIB:.1f} MiB up "
              f"to flood turn {a['last_flood']} of {TICKS}, then close {a['close']}")
    for a in attempts:  # checked for every stalled client
        assert a["missing"] == 0 and a["closed_early"] == [], "a healthy subscriber lost pushes or was closed"
        assert a["close"][0] == 4008, f"the stalled client was not closed as a slow consumer: {a['close']}"
        growth = (a["rss_peak"] - a["rss_before"]) / 1024
        assert growth <= 50, f"server RSS grew {growth:.1f} MiB with one stalled client"
    # the latency criterion holds in one of ATTEMPTS pairs: a real interference fails every pair,
    # a burst of load from another process on this shared box does not fail the test by itself
    assert within(p99(attempts[-1]["base"]), p99(attempts[-1]["stall"])), [
        (round(p99(a["base"]) * 1000, 1), round(p99(a["stall"]) * 1000, 1)) for a in attempts]


def test_a_reading_client_subscribing_to_a_session_with_big_history_is_not_a_slow_consumer(server_factory):
    """SPEC §7: the outgoing-buffer bound is for a client that falls behind. A client that reads
    at once asks for a session whose newest history page (the subscribe snapshot, one frame) is
    larger than the bound: it must get its snapshot, not the slow-consumer close."""
    server = server_factory("--max-outbox-mb", "1")

    async def go() -> tuple[Any, Any]:
        writer = await mux(server)
        sid = (await writer.result("session/create", {}))["session"]["id"]
        for _ in range(12):  # 12 turns x (90,000 characters in + the echo out) ~ 2 MiB of items
            await writer.result("turn/send", {"sessionId": sid, "content": noise(FLOOD_BYTES)})
        await writer.close()
        reader = await connect(server.url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, max_size=None)
        try:
            c = await initialized(reader)
            reply = await c.call("session/subscribe", {"sessionId": sid})
            return len(reply["result"]["items"]), None
        except ConnectionClosed:
            return None, (reader.close_code, reader.close_reason)
        finally:
            await reader.close()

    items, closed = asyncio.run(go())
    assert closed is None and items, f"a client reading promptly was closed {closed} by its own snapshot"


# --- approval_first_answer_wins ------------------------------------------------------------------

APPROVALS = 10
ANSWERERS = 8


def test_ten_approvals_answered_by_eight_connections_at_once_settle_once_each_and_run_each_approved_tool_once(
        server_factory, tmp_path):
    server = server_factory()
    runs = "runs.log"  # the tool's side effect, in the session's workspace: one line per execution
    rng = random.Random(4711)

    async def go() -> dict[str, Any]:
        conns = [await mux(server) for _ in range(ANSWERERS)]
        for c in conns:  # present: every connection gets every approval/requested
            await c.result("presence/update", {"active": True})
        watcher = conns[0]
        sids = [(await watcher.result("session/create", {}))["session"]["id"] for _ in range(APPROVALS)]
        for i, sid in enumerate(sids):  # owner-created sessions are in permission mode `ask` (SPEC §4)
            assert (await watcher.result("session/subscribe", {"sessionId": sid}))["approvals"] == []
            command = f"echo {i} >> {runs}"
            directive = "!tool exec " + json.dumps({"command": command})
            await watcher.result("turn/send", {"sessionId": sid, "content": directive})

        async def requested(c: Mux) -> dict[str, dict[str, Any]]:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                got = {p["params"]["approval"]["id"]: p["params"]["approval"]
                       for p in c.pushes if p["method"] == "approval/requested"}
                if len(got) >= APPROVALS:
                    return got
                await asyncio.sleep(0.02)
            raise AssertionError(f"only {len(got)} approval requests reached a present connection")
        seen = [await requested(c) for c in conns]
        approvals = seen[0]
        assert all(s.keys() == approvals.keys() for s in seen)
        assert {a["sessionId"] for a in approvals.values()} == set(sids)

        # every connection answers every approval at once; per approval 1-3 answerers send a
        # wrong contentHash, the others a random decision with the right one
        plan = []
        for aid, a in approvals.items():
            wrong = set(rng.sample(range(ANSWERERS), rng.randint(1, 3)))
            for k in range(ANSWERERS):
                good = k not in wrong
                plan.append((aid, k, good, rng.choice(["approve", "deny"]),
                             a["contentHash"] if good else a["contentHash"][::-1] + "0"))
        rng.shuffle(plan)
        replies = await asyncio.gather(*(conns[k].call("approval/respond", {
            "approvalId": aid, "decision": decision, "contentHash": h}) for aid, k, _, decision, h in plan))

        # every turn ends; every connection that got the request hears the settlement once
        done = set()
        deadline = time.monotonic() + 30
        while len(done) < APPROVALS and time.monotonic() < deadline:
            done = {p["params"]["sessionId"] for p in watcher.pushes if p["method"] == "item/completed"
                    and p["params"]["item"]["kind"] == "turn"}
            await asyncio.sleep(0.05)
        assert done == set(sids), f"turns still running: {set(sids) - done}"
        await asyncio.sleep(0.2)
        settled_pushes = [[p["params"] for p in c.pushes if p["method"] == "approval/settled"] for c in conns]
        for c in conns:
            await c.close()
        return {"sids": sids, "approvals": approvals, "plan": plan, "replies": replies, "settled": settled_pushes}

    r = asyncio.run(go())
    winners: dict[str, str] = {}
    refused: dict[str, int] = {"approval-settled": 0, "hash-mismatch": 0}
    for (aid, _k, good, decision, _), reply in zip(r["plan"], r["replies"], strict=True):
        if "result" in reply:
            assert good, f"a wrong content hash was accepted for {aid}"
            assert aid not in winners, f"approval {aid} was decided twice"
            winners[aid] = decision
            continue
        code = reply["error"]["data"]["code"]
        # a wrong hash is hash-mismatch, or approval-settled once someone else won: both refused
        assert code == "approval-settled" or (code == "hash-mismatch" and not good), (aid, good, reply)
        refused[code] += 1
    assert winners.keys() == r["approvals"].keys(), "an approval was never decided"
    for pushes in r["settled"]:
        assert sorted(p["approvalId"] for p in pushes) == sorted(winners), "approval/settled missing or twice"
        for p in pushes:
            assert p["state"] == ("approved" if winners[p["approvalId"]] == "approve" else "denied")

    # the store: one settlement per approval stream, one per call in the session, and the tool
    # ran exactly once for each approved call and never for a denied one
    approved_runs = sorted(str(r["sids"].index(r["approvals"][aid]["sessionId"]))
                           for aid, d in winners.items() if d == "approve")
    store = open_store(os.path.join(server.data_dir, "store"), readonly=True)
    try:
        for aid, decision in winners.items():
            events = [e.event for e in store.read_stream(f"approval-{aid}")]
            settlements = [e for e in events if isinstance(e, E.ApprovalSettled)]
            assert len(settlements) == 1 and settlements[0].settlement.source == "answer", events
            state = "approved" if decision == "approve" else "denied"
            assert settlements[0].settlement.state == state
            sid = r["approvals"][aid]["sessionId"]
            session = [e.event for e in store.read_stream(f"session-{sid}")]
            assert [e.settlement.state for e in session if isinstance(e, E.ToolApprovalSettled)] == [state]
            assert len([e for e in session if isinstance(e, E.ToolStarted)]) == (decision == "approve")
            assert [e.status for e in session if isinstance(e, E.ToolFinished)] == [
                "completed" if decision == "approve" else "denied"]
    finally:
        store.close()
    logs = [os.path.join(server.data_dir, "workspaces", sid, runs) for sid in r["sids"]]
    lines = sorted(word for log in logs if os.path.exists(log) for word in open(log).read().split())
    print(f"\napprovals: {len(winners)} decided ({len(approved_runs)} approved), refused {refused}, "
          f"tool runs {len(lines)}")
    assert lines == approved_runs, f"tool runs {lines} != approved calls {approved_runs}"


# --- idempotent_send -----------------------------------------------------------------------------

KEYS = 200


def test_retries_concurrent_duplicates_and_conflicting_bodies_on_two_connections_make_one_turn_per_key(tmp_path):
    """RELIABILITY idempotent_send: of 200 keys sent as an app over 2 connections, ~30% are retried
    (the retry must get the original receipt), ~10% are sent on both connections at once (one
    input), ~5% are sent again with another body (refused ``conflict``, half of them racing the
    original); the log must hold one input and one turn per key."""
    data = str(tmp_path / "data")
    prepare(data)
    server = start(data)
    rng = random.Random(1234)
    kinds = [("retry" if x < 0.30 else "dup" if x < 0.40 else "conflict" if x < 0.45 else "once")
             for x in (rng.random() for _ in range(KEYS))]
    rec = Recorder()
    outcome: dict[str, dict[str, Any]] = {}
    try:
        async def go() -> None:
            conns = [await mux(server, APP_TOKEN) for _ in range(2)]
            for _ in range(8):
                rec.sessions.append((await conns[0].result("loop/create", {"containerId": "inbox"}))["sessionId"])
            gate = asyncio.Semaphore(24)  # keys in flight at once (the app may have 200 unfinished turns)

            async def send(c: Mux, sid: str, key: str, text: str) -> dict[str, Any]:
                while True:  # a `rejected` receipt (quota) stores nothing: the same request again
                    reply = await c.call("loop/send", {"sessionId": sid, "text": text, "idempotencyKey": key})
                    if reply.get("result", {}).get("state") != "rejected":
                        return reply
                    await asyncio.sleep(0.05)

            async def one(n: int, kind: str) -> None:
                async with gate:
                    sid, key, text = rng.choice(rec.sessions), f"key-{n}", f"message {n}"
                    a, b = rng.sample(conns, 2)
                    out: dict[str, Any] = {"kind": kind, "sid": sid, "text": text, "replies": []}
                    outcome[key] = out
                    if kind == "dup" or (kind == "conflict" and n % 2):
                        other = text if kind == "dup" else f"another body {n}"
                        first, second = await asyncio.gather(send(a, sid, key, text), send(b, sid, key, other))
                        out["replies"] = [(text, first), (other, second)]
                    else:
                        out["replies"].append((text, await send(a, sid, key, text)))
                        for _ in range(rng.randint(1, 2) if kind == "retry" else 1 if kind == "conflict" else 0):
                            await asyncio.sleep(rng.random() * 0.02)
                            again = text if kind == "retry" else f"another body {n}"
                            out["replies"].append((again, await send(rng.choice(conns), sid, key, again)))

            await asyncio.gather(*(one(n, kind) for n, kind in enumerate(kinds)))
            for key, out in outcome.items():
                first = next((reply["result"] for _, reply in out["replies"] if "result" in reply), None)
                if first is not None:
                    done = await conns[0].result("loop/waitForTurn", {
                        "sessionId": out["sid"], "turnId": first["turnId"], "timeoutMs": 30_000})
                    assert done["state"] == "completed", (key, done)
            for c in conns:
                await c.close()
        asyncio.run(go())
    finally:
        server.stop()

    counts = {"once": 0, "retry": 0, "dup": 0, "conflict": 0, "duplicate receipts": 0, "conflicts refused": 0}
    for key, out in outcome.items():
        counts[out["kind"]] += 1
        results = [(text, reply["result"]) for text, reply in out["replies"] if "result" in reply]
        errors = [reply["error"] for _, reply in out["replies"] if "error" in reply]
        originals = [(text, r) for text, r in results if r["state"] in ("accepted", "queued")]
        assert len(originals) == 1, f"{key} ({out['kind']}): {len(originals)} inputs accepted: {out['replies']}"
        text, original = originals[0]
        for _, r in results:  # every retry and duplicate got the original receipt
            assert r["turnId"] == original["turnId"] and (r["epoch"], r["seq"]) == (original["epoch"], original["seq"])
            assert r.get("cursor") == original.get("cursor"), (key, r, original)
        counts["duplicate receipts"] += len(results) - 1
        if out["kind"] == "conflict":
            assert len(errors) == 1 and errors[0]["data"]["code"] == "conflict", (key, out["replies"])
            assert all(t != text for t, reply in out["replies"] if "error" in reply)
            counts["conflicts refused"] += 1
        else:
            assert errors == [], (key, errors)
            assert len(results) == len(out["replies"])
        rec.ops.append(Op(out["sid"], key, text, receipt=original))
    # the log: one input per key (with its stored receipt) and one turn per input, all ended
    got = audit(data, rec)
    store = open_store(os.path.join(data, "store"), readonly=True)
    try:
        texts = {e.event.idempotency_key: e.event.text for sid in rec.sessions
                 for e in store.read_stream(f"session-{sid}") if isinstance(e.event, E.InputAccepted)}
    finally:
        store.close()
    print(f"\nidempotent send: {counts}, log {got}")
    assert (got["inputs"], got["turns"]) == (KEYS, KEYS)
    assert texts == {op.key: op.text for op in rec.ops}, "an input holds another request's body"
