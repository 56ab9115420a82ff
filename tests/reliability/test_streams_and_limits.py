"""RELIABILITY fanout_resume_gapless, catchup_to_live_boundary, oversize and handshake_auth_keepalive,
against a real ``sessionloop serve`` subprocess on 127.0.0.1 (port 0) with real WebSocket clients.

How a subscriber rebuilds a session (seed 004, 订阅与条目): ``session/subscribe`` answers a snapshot
``{epoch, seq, items}``; pushes after it carry ``(epoch, seq)``; the client drops pushes with
``seq <=`` the snapshot's; ``item/started`` places an item, ``item/delta`` appends to its text,
``item/completed`` is the full text and overwrites by ``itemId``. There is no replay by seq: resuming
after a disconnect *is* a new snapshot. The seed allows holes in a session's seqs (递增但不一定连续);
our ``SessionChannel`` hands every seq of a session to every subscriber of it, so here a hole is a
lost push and is counted as a gap.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import struct
import time
import zlib
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from sessionloop.cli.serve import request_limit
from sessionloop.protocol.frames import DEFAULT_MAX_FRAME_BYTES
from tests.e2e.conftest import TOKEN, initialized, open_client
from tests.reliability.harness import rss_kib
from tests.reliability.raw_ws import RawWebSocket

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HELLO = {"protocolVersion": "0.2.0", "client": {"name": "streams", "version": "1"}}


# --- a subscriber that rebuilds sessions from snapshot + pushes -----------------------------------


class Mirror:
    """One subscription's view of one session: the snapshot's items, then every push with a seq
    above the snapshot's, applied in arrival order. Whatever breaks the rules lands in ``problems``."""

    def __init__(self, session_id: str, snapshot: dict[str, Any], previous: Mirror | None = None) -> None:
        self.session_id = session_id
        self.epoch = snapshot["epoch"]
        self.snap_seq = self.last = snapshot["seq"]
        self.items: dict[str, dict[str, Any]] = {it["itemId"]: dict(it) for it in snapshot["items"]}
        self.streamed: set[str] = set()  # items that got deltas in this subscription
        self.orphans: set[str] = set()  # streaming items the snapshot did not hold (see below)
        self.applied = self.stale = self.gaps = self.duplicates = self.reorders = self.unknown_deltas = 0
        self.compared = 0  # items whose streamed text was compared with their completed text
        self.mid_stream = False  # the snapshot held an item that was still streaming
        self.problems: list[str] = []
        if previous is not None:  # resuming: same epoch (no restart here), seq never goes back
            if self.epoch != previous.epoch:
                self.problems.append(f"epoch {previous.epoch} -> {self.epoch} without a restart")
            if self.snap_seq < previous.last:
                self.problems.append(f"snapshot seq {self.snap_seq} below seq {previous.last} seen before")

    def apply(self, push: dict[str, Any]) -> None:
        p = push["params"]
        if p["epoch"] != self.epoch:
            self.problems.append(f"push of epoch {p['epoch']} in epoch {self.epoch}")
            return
        seq = p["seq"]
        if seq <= self.snap_seq:  # seed: already in the snapshot, dropped
            self.stale += 1
            return
        if seq == self.last:
            self.duplicates += 1
            self.problems.append(f"seq {seq} twice")
            return
        if seq < self.last:
            self.reorders += 1
            self.problems.append(f"seq {seq} after {self.last}")
            return
        if seq != self.last + 1:
            self.gaps += 1
            self.problems.append(f"gap: seq {seq} after {self.last} (snapshot {self.snap_seq})")
        self.last = seq
        self.applied += 1
        method = push["method"]
        if method == "item/delta":
            item = self.items.get(p["itemId"])
            if item is None:
                # the snapshot lacked a reply that was already streaming: a known product gap, asserted
                # on its own by test_a_snapshot_taken_while_a_reply_streams_holds_it_so_far; here the
                # item must still arrive whole with item/completed (checked at the end)
                self.unknown_deltas += 1
                self.orphans.add(p["itemId"])
                return
            if p["itemId"] not in self.streamed and item.get("text"):
                self.mid_stream = True  # the snapshot caught this item half-streamed
            item["text"] = item.get("text", "") + p["text"]
            self.streamed.add(p["itemId"])
        elif method in ("item/started", "item/completed"):
            item = p["item"]
            iid = item["itemId"]
            if method == "item/completed":
                self.orphans.discard(iid)
            if method == "item/completed" and iid in self.streamed:
                # snapshot text + deltas must be the full text: a delta lost or applied twice at the
                # boundary shows here
                streamed, full = self.items[iid].get("text"), item.get("text")
                if streamed != full:
                    self.problems.append(f"streamed {streamed!r} != completed {full!r}")
                self.compared += 1
                self.streamed.discard(iid)
            self.items[iid] = dict(item)
        else:
            self.problems.append(f"unexpected push {method} at seq {seq}")

    def state(self) -> dict[str, dict[str, Any]]:
        return normalized(self.items.values())

    def settled(self, inputs: int) -> bool:
        """All ``inputs`` user messages are in, each in a turn that has ended, nothing queued."""
        users = [i for i in self.items.values() if i["kind"] == "user-message"]
        ended = {i["itemId"] for i in self.items.values() if i["kind"] == "turn" and "outcome" in i}
        queue = self.items.get("queue", {}).get("entries")
        return len(users) == inputs and all(u.get("turnId") in ended for u in users) and not queue


def normalized(items: Any) -> dict[str, dict[str, Any]]:
    # the snapshot leaves out an empty queue (seed: 空的不带); a pushed empty queue means the same
    return {i["itemId"]: i for i in items if not (i["kind"] == "queue" and not i.get("entries"))}


class Live:
    """A WebSocket client whose reader runs all the time, so replies and pushes are handled in the
    exact order the server sent them: a subscribe reply installs a new Mirror before the next frame
    is looked at. Pushes of a session this connection has no snapshot for are ``unexpected``
    (seed: no push of a session before its snapshot reply; none after session/unsubscribe)."""

    def __init__(self, ws: Any, all_mirrors: list[Mirror]) -> None:
        self.ws = ws
        self.all_mirrors = all_mirrors
        self.mirrors: dict[str, Mirror | None] = {}
        self.unexpected: list[dict[str, Any]] = []
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._on_reply: dict[int, Any] = {}
        self._next = 0
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, server: Any, all_mirrors: list[Mirror]) -> Live:
        live = cls(await open_client(server), all_mirrors)
        await live.result("initialize", HELLO)
        return live

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                msg = json.loads(raw)
                if "id" in msg:
                    on_reply = self._on_reply.pop(msg["id"], None)
                    if on_reply is not None and "result" in msg:
                        on_reply(msg["result"])
                    fut = self._pending.pop(msg["id"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                    continue
                sid = msg["params"].get("sessionId")
                mirror = self.mirrors.get(sid)
                if mirror is None:
                    self.unexpected.append(msg)
                else:
                    mirror.apply(msg)
        except ConnectionClosed:
            pass
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("connection closed"))

    async def call(self, method: str, params: dict[str, Any], on_reply: Any = None) -> dict[str, Any]:
        self._next += 1
        rid = self._next
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        if on_reply is not None:
            self._on_reply[rid] = on_reply
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        return await asyncio.wait_for(fut, 15)

    async def result(self, method: str, params: dict[str, Any], on_reply: Any = None) -> Any:
        reply = await self.call(method, params, on_reply)
        assert "result" in reply, reply
        return reply["result"]

    async def subscribe(self, sid: str, previous: Mirror | None = None) -> Mirror:
        def install(snapshot: dict[str, Any]) -> None:
            mirror = Mirror(sid, snapshot, previous or self.mirrors.get(sid))
            self.mirrors[sid] = mirror
            self.all_mirrors.append(mirror)

        await self.result("session/subscribe", {"sessionId": sid}, install)
        return self.mirror(sid)

    def mirror(self, sid: str) -> Mirror:
        mirror = self.mirrors.get(sid)
        assert mirror is not None, f"not subscribed to {sid}"
        return mirror

    async def unsubscribe(self, sid: str) -> None:
        def forget(_: Any) -> None:
            self.mirrors[sid] = None

        await self.result("session/unsubscribe", {"sessionId": sid}, forget)

    async def close(self, abrupt: bool = False) -> None:
        if abrupt:
            self.ws.transport.abort()  # a vanished client: no close frame, TCP reset
        else:
            await self.ws.close()
        await self._reader


async def until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def fresh_snapshot(server: Any, sid: str) -> dict[str, Any]:
    async with open_client(server) as ws:
        c = await initialized(ws)
        snapshot: dict[str, Any] = await c.result("session/subscribe", {"sessionId": sid})
        return snapshot


async def settle_against_fresh_snapshots(server: Any, sids: list[str],
                                         lives: list[Live]) -> dict[str, dict[str, Any]]:
    """Fresh snapshots once the sessions are quiet, after every live mirror has caught up with them."""
    for _ in range(10):
        finals = {sid: await fresh_snapshot(server, sid) for sid in sids}
        for sid in sids:
            seq = finals[sid]["seq"]
            await until(lambda sid=sid, seq=seq: all(live.mirror(sid).last >= seq for live in lives),
                        15, f"subscribers to reach seq {seq} of {sid}")
        again = {sid: (await fresh_snapshot(server, sid))["seq"] for sid in sids}
        if all(again[sid] == finals[sid]["seq"] for sid in sids):
            return finals
    raise AssertionError("the sessions never went quiet")


def assert_equal_to_snapshot(mirror: Mirror, final: dict[str, Any], who: str) -> None:
    assert "before" not in final, "the final snapshot must hold the whole history for an exact comparison"
    assert mirror.last == final["seq"] and mirror.epoch == final["epoch"], (who, mirror.last, final["seq"])
    assert not mirror.orphans, f"{who}: streamed items that never completed {mirror.orphans}"
    mine, theirs = mirror.state(), normalized(final["items"])
    missing = sorted(theirs.keys() - mine.keys())
    extra = sorted(mine.keys() - theirs.keys())
    differ = [k for k in theirs.keys() & mine.keys() if theirs[k] != mine[k]]
    assert not (missing or extra or differ), (
        f"{who}: missing {missing[:3]}, extra {extra[:3]}, differing "
        f"{[(mine[k], theirs[k]) for k in differ[:2]]}")


# --- fanout_resume_gapless --------------------------------------------------------------------------


def test_fanout_resume_gapless_subscribers_that_drop_and_resume_rebuild_every_session_exactly(server):
    rng = random.Random(4004)
    turns_per_session = 20
    subscribers = 4

    async def main() -> tuple[list[dict[str, Any]], list[Mirror]]:
        mirrors: list[Mirror] = []
        producer = await Live.open(server, mirrors)
        sids = [(await producer.result("session/create", {}))["session"]["id"] for _ in range(2)]
        for sid in sids:
            await producer.subscribe(sid)
        subs = [await Live.open(server, mirrors) for _ in range(subscribers)]
        for live in subs:
            for sid in sids:
                await live.subscribe(sid)
        stats = [{"reconnect": 0, "drop": 0, "resubscribe": 0, "unsubscribe": 0} for _ in subs]
        producing = True

        async def produce(sid: str) -> None:
            def done() -> int:
                items = producer.mirror(sid).items.values()
                return sum(1 for i in items if i["kind"] == "turn" and "outcome" in i)

            for i in range(turns_per_session):
                await until(lambda i=i: done() >= i - 1, 15, "the turn before the last")  # <= 2 in flight
                if i == turns_per_session - 2:  # the churn happens while turns stream, however slow the machine
                    await until(lambda: all(churned_enough(s) for s in stats), 60,
                                "every subscriber to drop and resume")
                text = f"!sleep 10\nturn {i} streams this reply to {sid} in small pieces"
                assert await producer.result("turn/send", {"sessionId": sid, "content": text}) == {}
            await until(lambda: producer.mirror(sid).settled(turns_per_session), 20, "every turn to end")

        async def churn(k: int) -> None:
            while producing:
                await asyncio.sleep(rng.uniform(0.005, 0.03))
                live = subs[k]
                mode = rng.choice(list(stats[k]))
                stats[k][mode] += 1
                if mode in ("reconnect", "drop"):
                    previous = dict(live.mirrors)
                    await live.close(abrupt=mode == "drop")
                    assert not live.unexpected, live.unexpected[:2]
                    live = subs[k] = await Live.open(server, mirrors)
                    for sid in rng.sample(sids, len(sids)):
                        await live.subscribe(sid, previous[sid])
                else:
                    sid = rng.choice(sids)
                    if mode == "unsubscribe":
                        previous_mirror = live.mirrors[sid]
                        await live.unsubscribe(sid)
                        await live.subscribe(sid, previous_mirror)
                    else:  # seed: subscribing again to the same session is a new snapshot
                        await live.subscribe(sid)

        churners = [asyncio.ensure_future(churn(k)) for k in range(subscribers)]
        await asyncio.gather(*(produce(sid) for sid in sids))
        producing = False
        await asyncio.gather(*churners)
        finals = await settle_against_fresh_snapshots(server, sids, [producer, *subs])
        for k, live in enumerate([producer, *subs]):
            assert not live.unexpected, f"subscriber {k}: pushes outside a subscription {live.unexpected[:2]}"
            for sid in sids:
                assert_equal_to_snapshot(live.mirror(sid), finals[sid], f"subscriber {k}, session {sid}")
        for live in [producer, *subs]:
            await live.close()
        return stats, mirrors

    stats, mirrors = asyncio.run(main())
    problems = [p for m in mirrors for p in m.problems]
    gaps, dups, reorders = (sum(getattr(m, a) for m in mirrors) for a in ("gaps", "duplicates", "reorders"))
    print(f"\nfanout_resume_gapless: {len(mirrors)} snapshots, {sum(m.applied for m in mirrors)} pushes "
          f"applied, {sum(m.stale for m in mirrors)} dropped as <= snapshot seq, "
          f"{sum(m.unknown_deltas for m in mirrors)} deltas of a reply missing from the snapshot; "
          f"resumes {stats}; "
          f"gaps {gaps}, duplicates {dups}, reorderings {reorders}")
    assert problems == [], problems[:5]
    assert gaps == dups == reorders == 0
    for k, s in enumerate(stats):  # every subscriber really did drop and resume, several ways
        assert churned_enough(s), (k, s)


def churned_enough(stats: dict[str, int]) -> bool:
    return sum(stats.values()) >= 5 and stats["reconnect"] + stats["drop"] >= 1


# --- catchup_to_live_boundary -----------------------------------------------------------------------


def test_catchup_to_live_boundary_subscribing_at_random_moments_misses_and_doubles_nothing(server):
    rng = random.Random(4005)
    turns_per_session = 40
    preopened, late = 8, 8

    async def main() -> tuple[list[Mirror], int, dict[str, int]]:
        mirrors: list[Mirror] = []
        producer = await Live.open(server, mirrors)
        sids = [(await producer.result("session/create", {}))["session"]["id"] for _ in range(2)]
        for sid in sids:
            await producer.subscribe(sid)
        waiting = [await Live.open(server, []) for _ in range(preopened)]  # connected, not subscribed
        lives: list[Live] = []
        producing = True

        async def produce(sid: str) -> None:
            sender = await Live.open(server, [])
            for i in range(turns_per_session):  # back to back: the turns queue and run at full speed
                # most answers complete at once (taken in place, their deltas pushed after the
                # commit); every third streams for a few ms
                sleep = "!sleep 15" if i % 3 == 0 else ""
                text = f"{sleep}\nturn {i}: as fast as the server goes, a few characters at a time"
                assert await sender.result("turn/send", {"sessionId": sid, "content": text}) == {}
            await until(lambda: producer.mirror(sid).settled(turns_per_session), 30, "every turn to end")
            await sender.close()

        async def subscribe_at_random_moments() -> None:
            pending = [("pre", live) for live in waiting] + [("late", None)] * late
            rng.shuffle(pending)
            while pending and producing:
                await asyncio.sleep(rng.uniform(0, 0.01))
                _, live = pending.pop()
                if live is None:  # a client that connects right now
                    live = await Live.open(server, [])
                live.all_mirrors = mirrors
                lives.append(live)
                for sid in rng.sample(sids, rng.choice([1, 2])):
                    await live.subscribe(sid)
            for _, live in pending:  # production ended first: subscribe after it (still checked)
                live = live or await Live.open(server, [])
                live.all_mirrors = mirrors
                lives.append(live)
                for sid in sids:
                    await live.subscribe(sid)

        spawner = asyncio.ensure_future(subscribe_at_random_moments())
        await asyncio.gather(*(produce(sid) for sid in sids))
        producing = False
        await spawner
        for live in lives:  # one session only so far: take the other one now
            for sid in sids:
                if sid not in live.mirrors:
                    await live.subscribe(sid)
        finals = await settle_against_fresh_snapshots(server, sids, [producer, *lives])
        mid = {"mid_production": 0, "mid_stream": sum(1 for m in mirrors if m.mid_stream)}
        for k, live in enumerate([producer, *lives]):
            assert not live.unexpected, f"subscriber {k}: pushes before the snapshot {live.unexpected[:2]}"
            for sid in sids:
                assert_equal_to_snapshot(live.mirror(sid), finals[sid], f"subscriber {k}, session {sid}")
        mid["mid_production"] = sum(1 for m in mirrors if 0 < m.snap_seq < finals[m.session_id]["seq"])
        for sid in sids:  # every reply streamed, those taken at once too (SPEC §4), and added up
            assert producer.mirror(sid).compared == turns_per_session, (sid, producer.mirror(sid).compared)
        for live in [producer, *lives]:
            await live.close()
        return mirrors, len(lives), mid

    mirrors, subscribers, mid = asyncio.run(main())
    print(f"\ncatchup_to_live_boundary: {subscribers} subscribers, {len(mirrors)} snapshots "
          f"({mid['mid_production']} during production, {mid['mid_stream']} with a reply half-streamed), "
          f"{sum(m.applied for m in mirrors)} pushes applied, "
          f"{sum(m.stale for m in mirrors)} dropped as <= snapshot seq, "
          f"{sum(m.unknown_deltas for m in mirrors)} deltas of a reply missing from the snapshot")
    problems = [p for m in mirrors for p in m.problems]
    assert problems == [], problems[:5]
    # the first push applied after every snapshot followed its seq exactly (no gap counted above), and
    # the boundary was really crossed while events flowed, not only before or after
    assert mid["mid_production"] >= 8, mid


def test_a_snapshot_taken_while_a_reply_streams_holds_it_so_far(server):
    """Seed 004: the snapshot holds the items the turn in flight has produced, and item/delta text is
    appended to that item's streamed text. So a client subscribing in the middle of a streaming
    reply must find the reply in the snapshot with exactly the text streamed up to the snapshot's
    seq; the deltas after it then continue that text."""

    async def main() -> tuple[dict[str, Any], str, str]:
        async with open_client(server) as a_ws, open_client(server) as b_ws:
            a = await initialized(a_ws)
            b = await initialized(b_ws)
            sid = (await a.result("session/create", {}))["session"]["id"]
            await a.result("session/subscribe", {"sessionId": sid})
            seen: list[dict[str, Any]] = []  # every push A got, in order

            async def next_push() -> dict[str, Any]:
                seen.append(await a.push(lambda m: m["params"].get("sessionId") == sid, timeout=5))
                return seen[-1]

            slow = "!sleep 1500\n" + "streaming slowly " * 12
            await a.result("turn/send", {"sessionId": sid, "content": slow})
            while not ((m := await next_push())["method"] == "item/started"
                       and m["params"]["item"]["kind"] == "agent-message"):
                pass
            reply_id = m["params"]["item"]["itemId"]
            while sum(1 for m in seen if m["method"] == "item/delta") < 3:
                await next_push()
            snap = await b.result("session/subscribe", {"sessionId": sid})
            while seen[-1]["params"]["seq"] < snap["seq"]:  # A's pushes up to B's snapshot
                await next_push()
            so_far = "".join(m["params"]["text"] for m in seen
                             if m["method"] == "item/delta" and m["params"]["itemId"] == reply_id
                             and m["params"]["seq"] <= snap["seq"])
            await a.result("turn/abort", {"sessionId": sid})
            await a.turn_done(sid)
            return snap, reply_id, so_far

    snap, reply_id, so_far = asyncio.run(main())
    assert so_far, "the reply had streamed some text before the second client subscribed"
    in_snapshot = {i["itemId"]: i for i in snap["items"]}
    assert reply_id in in_snapshot, (
        f"the snapshot (seq {snap['seq']}) lacks the streaming reply {reply_id} and its text so far "
        f"{so_far!r}; it has {[i['kind'] for i in snap['items']]}")
    assert in_snapshot[reply_id].get("text") == so_far


# --- oversize ---------------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    return rss_kib(pid) / 1024


def test_oversize_requests_get_an_error_or_a_close_and_compression_is_never_negotiated(server_factory):
    hard = 64 * MIB  # the socket's limit (``--max-frame-mb``, default 64): close 1009 above it
    soft = DEFAULT_MAX_FRAME_BYTES  # the application's (protocol/frames.py, 24 MiB): invalidRequest above it
    assert soft < hard
    server = server_factory("--max-frame-mb", str(hard // MIB))
    pid = server.proc.pid
    # a deflate bomb: 100 MiB of zeros inside a request (over the hard limit once inflated), ~100 kB
    # on the wire
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = b'{"jsonrpc":"2.0","id":9,"method":"sessions/list","params":{"q":"'
    bomb = deflate.compress(head + bytes(100 * MIB))
    bomb = (bomb + deflate.flush(zlib.Z_SYNC_FLUSH))[:-4]  # permessage-deflate drops the 00 00 ff ff tail

    async def main() -> dict[str, Any]:
        figures: dict[str, Any] = {"baseline": rss_mib(pid)}
        # a real client offering permessage-deflate: the server negotiates nothing
        ws = await connect(server.url, additional_headers=AUTH, compression="deflate")
        assert ws.request is not None and ws.response is not None
        assert "permessage-deflate" in ws.request.headers["Sec-WebSocket-Extensions"]
        assert ws.response.headers.get("Sec-WebSocket-Extensions") is None
        c = await initialized(ws)
        sid = (await c.result("session/create", {}))["session"]["id"]

        # so a compressed frame (RSV1 set) is a protocol error: close 1002, nothing inflated
        raw = await RawWebSocket.open(server.port, {**AUTH, "Sec-WebSocket-Extensions":
                                                    "permessage-deflate; client_max_window_bits"})
        assert raw.status == 101 and raw.header("Sec-WebSocket-Extensions") is None
        assert "result" in await raw.request(1, "initialize", HELLO)
        raw.send_frame(0x1, bomb, rsv1=True)
        figures["bomb"] = await raw.close_frame()
        assert await raw.reader.read() == b""  # and the server is gone after it
        raw.writer.close()

        # above the hard limit: close 1009 (twice: nothing of it stays behind)
        figures["too_big"] = []
        for _ in range(2):
            big_ws = await connect(server.url, additional_headers=AUTH, max_size=None)
            try:
                await big_ws.send("x" * (hard + 1))
                await asyncio.wait_for(big_ws.recv(), 10)
            except ConnectionClosed:
                pass
            figures["too_big"].append(big_ws.close_code)
        figures["after_refusals"] = rss_mib(pid)

        # between the two limits: invalidRequest "request too large" with the id, the connection
        # stays usable, nothing is written; repeated to see that memory does not keep growing
        filler = "x" * (soft + 64 * 1024)
        figures["between"] = []
        for i in range(8):
            frame = (f'{{"jsonrpc":"2.0","id":"big-{i}","method":"turn/send","params":{{"sessionId":"{sid}",'
                     f'"content":"{filler}"}}}}')
            await ws.send(frame)
            reply = await c.reply(f"big-{i}", 30)
            assert reply == {"jsonrpc": "2.0", "id": f"big-{i}",
                             "error": {"code": -32600, "message": "request too large"}}, reply
            assert await c.result("session/rename", {"sessionId": sid, "title": f"still here {i}"}) == {}
            figures["between"].append(rss_mib(pid))
        snap = await c.result("session/subscribe", {"sessionId": sid})
        assert [i for i in snap["items"] if i["kind"] == "user-message"] == []
        assert snap["session"]["title"] == "still here 7"
        await ws.close()
        return figures

    f = asyncio.run(main())
    print(f"\noversize: RSS {f['baseline']:.0f} MiB at start, {f['after_refusals']:.0f} MiB after a deflate "
          f"bomb and two frames over {hard // MIB} MiB, then {[round(x) for x in f['between']]} MiB after "
          f"each request of {(soft + 64 * 1024) / MIB:.2f} MiB")
    assert f["bomb"][:2] == (1002, "reserved bits must be 0"), f["bomb"]
    assert f["too_big"] == [1009, 1009]
    # refused at the frame header / before inflating: memory does not move (RELIABILITY: +50 MB at most)
    assert f["after_refusals"] - f["baseline"] <= 50
    # a request under the hard limit has to be received whole before it can be answered with its
    # id: each costs a few times its size while it is handled (read buffer, payload, decoded text)
    # and the allocator keeps some of it. What must hold is that it does not add up: the last four
    # stay within one more frame of the first four, and all stay under a ceiling set by the frame.
    first, last = f["between"][:4], f["between"][4:]
    assert max(last) <= max(first) + (soft + 8 * MIB) / MIB, f["between"]
    assert max(f["between"]) - f["baseline"] <= 50 + 5 * soft / MIB, f["between"]


def test_a_smaller_frame_limit_keeps_the_request_too_large_reply_below_it(server_factory):
    """``--max-frame-mb 2``: the application's limit follows it (3/8 of it, as 24 of 64 MiB), so a
    1 MiB request is still answered "request too large" with its id instead of a 1009 close."""
    server = server_factory("--max-frame-mb", "2")
    limit = request_limit(2 * MIB)
    assert limit < MIB < 2 * MIB

    async def main() -> None:
        ws = await connect(server.url, additional_headers=AUTH, max_size=None)
        c = await initialized(ws)
        sid = (await c.result("session/create", {}))["session"]["id"]
        filler = "x" * MIB
        await ws.send(f'{{"jsonrpc":"2.0","id":"big","method":"turn/send","params":{{"sessionId":"{sid}",'
                      f'"content":"{filler}"}}}}')
        assert await c.reply("big", 30) == {"jsonrpc": "2.0", "id": "big",
                                            "error": {"code": -32600, "message": "request too large"}}
        assert await c.result("session/rename", {"sessionId": sid, "title": "still here"}) == {}
        with pytest.raises(ConnectionClosed):  # above the hard limit: the socket closes (1009)
            await ws.send("x" * (2 * MIB + 1))
            await asyncio.wait_for(ws.recv(), 10)
        assert ws.close_code == 1009

    asyncio.run(main())


# --- handshake_auth_keepalive -------------------------------------------------------------------------


def connections_gauge(server: Any) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", headers=AUTH).text
    found = re.search(r"^sessionloop_connections (\S+)$", text, re.MULTILINE)
    assert found is not None, text
    return float(found.group(1))


def test_handshake_refusals_come_before_the_upgrade_and_silent_peers_are_closed_by_keepalive(server_factory):
    """Missing/wrong bearer token -> 401 and a foreign Origin -> 403 are covered by
    tests/e2e/test_server_e2e.py::
    test_a_missing_or_wrong_token_or_a_foreign_origin_is_refused_before_the_upgrade;
    here: a wrong token in the query, Origin ``null``, the ``--allow-origin`` list, that a refusal
    leaves no connection behind, and the keepalive."""
    ping_interval, ping_timeout, close_timeout = 0.4, 0.4, 0.5
    server = server_factory("--allow-origin", "https://app.example", "--ping-interval", str(ping_interval),
                            "--ping-timeout", str(ping_timeout), "--close-timeout", str(close_timeout))
    own_origin = f"http://127.0.0.1:{server.port}"

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        # refusals: an HTTP answer, no upgrade, then the server hangs up
        for path, headers, status in [
            ("/session?token=wrong", {}, 401),
            ("/session", {**AUTH, "Origin": "null"}, 403),  # a file:// page or sandboxed frame
            ("/session", {**AUTH, "Origin": "https://evil.example"}, 403),  # not on the allow list
        ]:
            raw = await RawWebSocket.open(server.port, headers, path)
            upgraded = raw.header("Sec-WebSocket-Accept"), raw.header("Upgrade")
            assert (raw.status, *upgraded) == (status, None, None)
            body = await asyncio.wait_for(raw.reader.read(), 5)  # the server hangs up after the answer
            assert body in (b"missing or wrong token\n", b"forbidden origin\n")
            raw.writer.close()
        for origin in ("https://app.example", own_origin):  # the allow list and the server's own address pass
            async with connect(server.url, additional_headers={**AUTH, "Origin": origin}) as ws:
                await initialized(ws)  # upgraded and served
        await until(lambda: connections_gauge(server) == 0, 5, "the accepted connections to be forgotten")

        healthy_ws = await open_client(server)  # its library answers pings
        healthy = await initialized(healthy_ws)
        opened = time.monotonic()
        silent = await RawWebSocket.open(server.port, AUTH)  # reads, but never answers a ping
        mute = await RawWebSocket.open(server.port, AUTH)  # reads nothing and never closes: a dead peer
        assert "result" in await silent.request(1, "initialize", HELLO)
        await until(lambda: connections_gauge(server) == 3, 5, "three open connections")
        opcodes = []
        while True:
            opcode, payload = await silent.recv_frame(5)
            opcodes.append(opcode)
            if opcode == 0x8:
                code = struct.unpack("!H", payload[:2])[0]
                out["close"] = (code, payload[2:].decode(), time.monotonic() - opened)
                break
        out["eof"] = await asyncio.wait_for(silent.reader.read(), 5)
        out["opcodes"] = opcodes
        await until(lambda: connections_gauge(server) == 1, ping_interval + ping_timeout + close_timeout + 2,
                    "the silent peers to be let go")
        out["released"] = time.monotonic() - opened
        # the healthy client went through several ping intervals and is still served
        out["healthy"] = await healthy.result("sessions/list", {})
        out["healthy_open"] = healthy_ws.close_code is None
        await healthy_ws.close()
        silent.writer.close()
        mute.writer.close()
        return out

    out = asyncio.run(main())
    print(f"\nkeepalive: silent peer closed {out['close'][2]:.2f} s after connecting ({out['close'][:2]}); "
          f"both silent peers released by the server after {out['released']:.2f} s")
    assert 0x9 in out["opcodes"]  # the server pinged before it gave up
    code, reason, after = out["close"]
    assert (code, reason) == (1011, "keepalive ping timeout")
    assert ping_interval + ping_timeout - 0.05 <= after <= ping_interval + ping_timeout + 1.0
    assert out["eof"] == b""
    assert out["released"] <= ping_interval + ping_timeout + close_timeout + 1.5
    assert out["healthy_open"] and out["healthy"]["sessions"] == []
