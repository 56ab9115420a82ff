"""The reliability harness (RELIABILITY.md): a real server under bot load, killed with SIGKILL;
a recorder of every client operation; a checker of the history; a store auditor.

Invariants checked after every trial:
* every acknowledged input (a ``loop/send`` receipt the client received) is in the log;
* no input is in the log twice and no turn started twice (idempotency keys, turn ids);
* an input whose receipt never arrived, sent again with its key, is never a second turn;
* every acknowledged ``turn/send`` (its ``{}`` reply arrived; it has no idempotency key, so each
  text is unique) is in its owner session's log exactly once; one whose reply never arrived at
  most once; nothing else is;
* every session resumes and every turn ends;
* subscribers (owner connections) see a greater epoch after a restart, resubscribe, get the
  pushes of the turns that end after it with seq increasing, and what they built from the
  snapshot and the pushes equals a fresh snapshot;
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

from websockets.exceptions import WebSocketException

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from tests.e2e.conftest import Client, ServerProcess, initialized, open_client

APP_TOKEN = "reliability-bot-token-of-the-harness"
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
class TurnSend:
    """One owner ``turn/send``: acknowledged when its ``{}`` reply arrived. Its text is unique."""

    session_id: str
    text: str
    replied: bool = False
    error: str | None = None


@dataclass
class Recorder:
    sessions: list[str] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    owner_sessions: list[str] = field(default_factory=list)
    sends: list[TurnSend] = field(default_factory=list)

    def acknowledged(self) -> list[Op]:
        return [op for op in self.ops if op.receipt is not None and op.receipt.get("state") != "rejected"]

    def unknown(self) -> list[Op]:
        return [op for op in self.ops if op.receipt is None]

    def acknowledged_sends(self) -> list[TurnSend]:
        return [s for s in self.sends if s.replied]


async def app_client(server: ServerProcess) -> tuple[Any, Client]:
    ws = await open_client(server, APP_TOKEN)
    return ws, await initialized(ws)


async def owner_client(server: ServerProcess) -> tuple[Any, Client]:
    ws = await open_client(server)
    return ws, await initialized(ws)


async def create_owner_sessions(server: ServerProcess, rec: Recorder, n: int) -> None:
    ws, c = await owner_client(server)
    try:
        for i in range(n):
            rec.owner_sessions.append((await result(c, "session/create", {"name": f"owner-{i}"}))["session"]["id"])
    finally:
        await ws.close()


async def create_sessions(server: ServerProcess, rec: Recorder, n: int) -> None:
    ws, c = await app_client(server)
    try:
        for _ in range(n):
            rec.sessions.append((await result(c, "loop/create", {"containerId": "inbox"}))["sessionId"])
    finally:
        await ws.close()


def rss_kib(pid: int) -> int:
    """A process's resident set size (``VmRSS``), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


ITEM_PUSHES = ("item/started", "item/completed", "item/delta", "session/resync")
CLOSED = (WebSocketException, OSError, EOFError, TimeoutError)  # the server died under a connection


@dataclass
class Subscriber:
    """An owner connection subscribed to some owner sessions. It builds each session's items
    from the snapshot and the pushes as seed 004 says a client does (dropping nothing: a push
    with an older epoch or a seq not above the last one fails the check instead)."""

    sessions: list[str]
    epoch: int = 0  # the epoch of the last snapshots
    seq: dict[str, int] = field(default_factory=dict)
    items: dict[str, dict[str, Any]] = field(default_factory=dict)
    snapshot_ids: dict[str, set[str]] = field(default_factory=dict)
    pushed_ids: dict[str, set[str]] = field(default_factory=dict)
    ended_by_push: dict[str, set[str]] = field(default_factory=dict)  # turns whose end was pushed
    ended_in_snapshot: dict[str, set[str]] = field(default_factory=dict)
    resubscribes: int = 0  # after a restart, with a greater epoch
    ws: Any = None
    client: Client | None = None

    async def subscribe(self, server: ServerProcess, after_restart: bool) -> None:
        """Connect and subscribe every session (seed 004: a snapshot first, then pushes)."""
        self.ws, self.client = await owner_client(server)
        before = self.epoch
        for sid in self.sessions:
            snap = await result(self.client, "session/subscribe", {"sessionId": sid})
            assert snap["epoch"] == server.epoch, f"snapshot epoch {snap['epoch']}, the server's is {server.epoch}"
            if after_restart:
                assert snap["epoch"] > before, f"after a restart the epoch went from {before} to {snap['epoch']}"
            self.epoch = snap["epoch"]
            self.seq[sid] = snap["seq"]
            self.items[sid] = {}
            for item in snap["items"]:
                self._put(sid, item)
            self.snapshot_ids[sid] = set(self.items[sid])
            self.ended_in_snapshot[sid] = {i for i, it in self.items[sid].items()
                                           if it["kind"] == "turn" and it.get("outcome")}
            self.pushed_ids[sid] = set()
            self.ended_by_push[sid] = set()
        self.resubscribes += after_restart
        stashed, self.client.pushes = self.client.pushes, []
        for msg in stashed:
            self.apply(msg)

    def _put(self, sid: str, item: dict[str, Any]) -> None:
        if item["kind"] == "queue" and not item.get("entries"):
            self.items[sid].pop("queue", None)  # seed 004: an empty queue is no queue item
        else:
            self.items[sid][item["itemId"]] = item

    def apply(self, msg: dict[str, Any]) -> None:
        method, p = msg.get("method"), msg.get("params", {})
        if method not in ITEM_PUSHES:
            return
        sid = p["sessionId"]
        assert sid in self.items, f"a push of {sid}, which this connection did not subscribe"
        assert p["epoch"] == self.epoch, f"{method} of {sid} has epoch {p['epoch']}, the snapshot's is {self.epoch}"
        assert p["seq"] > self.seq[sid], f"{method} of {sid}: seq {p['seq']} after {self.seq[sid]}"
        self.seq[sid] = p["seq"]
        assert method != "session/resync", f"a resync of {sid} with no rewrite of its history: {p}"
        if method == "item/delta":
            item = self.items[sid].get(p["itemId"])
            assert item is not None, f"a delta of {p['itemId']} that was neither started nor in the snapshot"
            key = "output" if item["kind"] == "tool-call" else "text"
            item[key] = (item.get(key) or "") + p["text"]
            return
        item = p["item"]
        self._put(sid, item)
        self.pushed_ids[sid].add(item["itemId"])
        if method == "item/completed" and item["kind"] == "turn" and item.get("outcome"):
            self.ended_by_push[sid].add(item["itemId"])

    async def pump(self, until: Any, timeout: float, what: str) -> None:
        """Read pushes until ``until()`` holds."""
        assert self.ws is not None
        deadline = asyncio.get_running_loop().time() + timeout
        while not until():
            left = deadline - asyncio.get_running_loop().time()
            assert left > 0, f"subscriber of {self.sessions}: no {what} within {timeout:g} s"
            try:
                msg = json.loads(await asyncio.wait_for(self.ws.recv(), left))
            except TimeoutError:
                continue
            self.apply(msg)

    async def follow(self, server: ServerProcess) -> None:
        """During the load: subscribe, then take pushes until the server dies."""
        try:
            await self.subscribe(server, after_restart=False)
            while True:
                self.apply(json.loads(await self.ws.recv()))
        except CLOSED:
            return
        finally:
            await self.close()

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
            self.ws = None

    def turn_of(self, sid: str, text: str) -> str | None:
        for item in self.items[sid].values():
            if item["kind"] == "user-message" and item["text"] == text:
                turn_id: str | None = item.get("turnId")
                return turn_id
        return None

    def outcome(self, sid: str, turn_id: str) -> str | None:
        item = self.items[sid].get(turn_id)
        outcome: str | None = item.get("outcome") if item is not None and item["kind"] == "turn" else None
        return outcome


def owner_text(rng: random.Random, tag: str) -> str:
    """A ``turn/send`` text, unique by its tag (the mock model echoes the lines that are not directives)."""
    return rng.choice([f"hello {tag}", f"!tool list_files {{\"path\": \".\"}}\n{tag}", f"!sleep 30\nslow {tag}"])


async def load(server: ServerProcess, rec: Recorder, rng: random.Random, trial: int, bots: int = 4,
               owner_bots: int = 1, subscribers: list[Subscriber] | None = None) -> None:
    """Bots send inputs with idempotency keys until the server dies under them; with owner
    sessions, ``owner_bots`` owner connections send ``turn/send`` to them meanwhile, and the
    ``subscribers`` follow their sessions' pushes."""

    async def owner_bot(b: int) -> None:
        try:
            ws, c = await owner_client(server)
        except CLOSED:
            return
        j = 0
        try:
            while True:
                send = TurnSend(rng.choice(rec.owner_sessions), owner_text(rng, f"t{trial}-o{b}-m{j}"))
                rec.sends.append(send)
                j += 1
                reply = await call(c, "turn/send", {"sessionId": send.session_id, "content": send.text})
                if "result" in reply:
                    assert reply["result"] == {}, reply
                    send.replied = True
                else:
                    send.error = json.dumps(reply["error"])
                await asyncio.sleep(0.01)  # owner inputs have no quota: pace them so turns keep up
        except CLOSED:
            return  # the server died: the send in flight stays unreplied
        finally:
            await ws.close()

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
                await send_op(c, op)
        except Exception:
            return  # the server died: the op in flight stays unknown
        finally:
            await ws.close()

    owners = [owner_bot(b) for b in range(owner_bots if rec.owner_sessions else 0)]
    followers = [sub.follow(server) for sub in subscribers or []]
    await asyncio.gather(*(bot(b) for b in range(bots)), *owners, *followers)


async def send_op(c: Client, op: Op) -> None:
    """``loop/send`` of ``op``, its receipt or error recorded on it; a rejected send (quota)
    backs off a little before the bot's next one."""
    reply = await call(c, "loop/send", {"sessionId": op.session_id, "text": op.text, "idempotencyKey": op.key})
    if "result" in reply:
        op.receipt = reply["result"]
        if op.receipt["state"] == "rejected":
            await asyncio.sleep(op.receipt["retryAfterMs"] / 1000 / 20)
    else:
        op.error = json.dumps(reply["error"])


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
            again = await result(c, "loop/send",
                                 {"sessionId": op.session_id, "text": op.text, "idempotencyKey": op.key})
            assert again["state"] == "duplicate" and again["turnId"] == op.receipt["turnId"], (op, again)
    finally:
        await ws.close()
    return resent


ENDS = (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)


def open_turns(data_dir: str, sessions: list[str]) -> dict[str, set[str]]:
    """Per session, the turns the log has an accepted input for and no end yet (read-only: the
    server runs)."""
    store = open_store(os.path.join(data_dir, "store"), readonly=True)
    try:
        left: dict[str, set[str]] = {}
        for sid in sessions:
            accepted: set[str] = set()
            ended: set[str] = set()
            for e in store.read_stream(f"session-{sid}"):
                if isinstance(e.event, E.InputAccepted):
                    accepted.add(e.event.turn_id)
                elif isinstance(e.event, ENDS):
                    ended.add(e.event.turn_id)
            left[sid] = accepted - ended
        return left
    finally:
        store.close()


async def settle_owner(server: ServerProcess, data_dir: str, rec: Recorder, subscribers: list[Subscriber],
                       trial: int, timeout: float = 30.0) -> dict[str, int]:
    """After a restart: the subscribers reconnect and resubscribe (a greater epoch); one more
    ``turn/send`` goes to every owner session; every turn the kill left open and every such new
    turn must end (replied), its end pushed to each subscriber unless its snapshot already had
    it; then what each subscriber built equals a fresh snapshot. Needs every owner session
    followed by some subscriber."""
    assert set(rec.owner_sessions) <= {sid for sub in subscribers for sid in sub.sessions}
    left = open_turns(data_dir, rec.owner_sessions)
    await asyncio.gather(*(sub.subscribe(server, after_restart=True) for sub in subscribers))
    ws, c = await owner_client(server)
    probes: dict[str, str] = {}
    try:
        for sid in rec.owner_sessions:
            send = TurnSend(sid, f"after restart t{trial} {sid}")
            rec.sends.append(send)
            reply = await call(c, "turn/send", {"sessionId": sid, "content": send.text})
            assert reply.get("result") == {}, f"turn/send after the restart: {reply}"
            send.replied = True
            probes[sid] = send.text

        def waited(sub: Subscriber, sid: str) -> set[str] | None:
            probe = sub.turn_of(sid, probes[sid])
            return None if probe is None else left[sid] | {probe}

        def settled(sub: Subscriber) -> bool:
            for sid in sub.sessions:
                turns = waited(sub, sid)
                if turns is None or any(sub.outcome(sid, t) is None for t in turns):
                    return False
            return True

        await asyncio.gather(*(sub.pump(lambda sub=sub: settled(sub), timeout, "end of every open turn")
                               for sub in subscribers))
        pushed = 0
        for sub in subscribers:
            for sid in sub.sessions:
                for t in waited(sub, sid) or ():
                    assert sub.outcome(sid, t) == "replied", f"turn {t} of {sid} ended {sub.outcome(sid, t)}"
                    if t not in sub.ended_in_snapshot[sid]:
                        assert t in sub.ended_by_push[sid], f"the end of turn {t} of {sid} was not pushed"
                        pushed += 1
        # what each subscriber built from its snapshot and the pushes equals a fresh snapshot
        # (the session is quiet now: every push up to the fresh snapshot's seq, and none after)
        for sid in rec.owner_sessions:
            snap = await result(c, "session/subscribe", {"sessionId": sid})
            await result(c, "session/unsubscribe", {"sessionId": sid})
            fresh = {item["itemId"]: item for item in snap["items"]}
            for sub in [s for s in subscribers if sid in s.sessions]:
                await sub.pump(lambda sub=sub, sid=sid, seq=snap["seq"]: sub.seq[sid] >= seq, timeout,
                               "push up to the fresh seq")
                assert sub.seq[sid] == snap["seq"], f"{sid}: pushes after the fresh snapshot's seq {snap['seq']}"
                built = sub.items[sid]
                assert fresh.keys() <= built.keys(), (
                    f"{sid}: items missing from the built state: {fresh.keys() - built.keys()}")
                differ = {k: (built[k], fresh[k]) for k in fresh if built[k] != fresh[k]}
                assert not differ, f"{sid}: built items differ from a fresh snapshot: {differ}"
                # items the fresh snapshot has not: only old ones of the first snapshot that left its newest page
                extra = built.keys() - fresh.keys()
                assert extra <= sub.snapshot_ids[sid] - sub.pushed_ids[sid], (
                    f"{sid}: built but not in a fresh snapshot: {extra}")
        return {"probes": len(probes), "turn_pushes": pushed}
    finally:
        await ws.close()
        for sub in subscribers:
            await sub.close()


def _check_stream(sid: str, events: list[Any]) -> tuple[set[str], set[str]]:
    """Versions contiguous, no turn started twice, every started turn ended: (started, ended)."""
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    started: set[str] = set()
    ended: set[str] = set()
    for e in events:
        ev = e.event
        if isinstance(ev, E.TurnStarted):
            assert ev.turn_id not in started, f"turn {ev.turn_id} started twice"
            started.add(ev.turn_id)
        elif isinstance(ev, ENDS):
            ended.add(ev.turn_id)
    assert started == ended, f"session {sid}: turns started but not ended: {started - ended}"
    return started, ended


def audit(data_dir: str, rec: Recorder) -> dict[str, int]:
    """Open the store read-only (the server may run) and check the log against the record."""
    store = open_store(os.path.join(data_dir, "store"), readonly=True)
    try:
        keys_seen: dict[str, str] = {}
        turns: int = 0
        for sid in rec.sessions:
            events = store.read_stream(f"session-{sid}")
            started, _ = _check_stream(sid, events)
            for e in events:
                ev = e.event
                if isinstance(ev, E.InputAccepted) and ev.idempotency_key:
                    assert ev.idempotency_key not in keys_seen, f"input {ev.idempotency_key} twice"
                    keys_seen[ev.idempotency_key] = ev.turn_id
                    assert store.get_receipt(f"app:loadbot:{sid}", ev.idempotency_key) is not None
            turns += len(started)
        for op in rec.acknowledged():
            assert keys_seen.get(op.key) == op.receipt["turnId"], f"acknowledged input {op.key} lost"
        # owner turn/send: no idempotency key, so each text is unique and counted in the log
        sent = {s.text: s for s in rec.sends}
        texts_seen: dict[str, int] = {}
        owner_turns = 0
        for sid in rec.owner_sessions:
            events = store.read_stream(f"session-{sid}")
            started, _ = _check_stream(sid, events)
            for e in events:
                ev = e.event
                if isinstance(ev, E.InputAccepted):
                    send = sent.get(ev.text)
                    assert send is not None and send.session_id == sid, (
                        f"session {sid}: an input nobody sent: {ev.text!r}")
                    assert ev.speaker is not None and ev.speaker.owner and ev.idempotency_key is None, ev
                    assert ev.turn_id in started, f"session {sid}: the turn of {ev.text!r} never started"
                    texts_seen[ev.text] = texts_seen.get(ev.text, 0) + 1
            owner_turns += len(started)
        for s in rec.acknowledged_sends():
            n = texts_seen.get(s.text, 0)
            assert n == 1, f"acknowledged turn/send {s.text!r} is in the log {n} times"
        for s in rec.sends:
            n = texts_seen.get(s.text, 0)
            assert n <= 1, f"turn/send {s.text!r} (reply never arrived) is in the log {n} times"
        # RELIABILITY kill9_random, "0 stale readers": the server's own open cleared the reader
        # slots of the process that was killed, so this open finds none left to clear
        assert store.info()["stale_readers_cleared"] == 0, "stale LMDB reader slots survived a restart"
        problems = store.audit()  # every index (streams, feed, receipts, snapshots, flags) agrees with the log
        assert problems == [], f"the store's indexes disagree with its log: {problems}"
        return {"inputs": len(keys_seen), "turns": turns, "owner_inputs": sum(texts_seen.values()),
                "owner_turns": owner_turns,
                "unreplied_committed": sum(1 for s in rec.sends if not s.replied and s.text in texts_seen)}
    finally:
        store.close()
