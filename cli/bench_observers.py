"""Who watches the turns of an in-process load run (``sessionloop bench --observe``, and the
benchmarks that drive turns the same way): the observers a real deployment has, so a run
measures the streaming it pays for (every answer of the mock model streams).

* ``subscriber``: per session a subscribed protocol connection, as an owner's client has one.
  Each connection is a real :class:`actors.gateway.service.ClientConnection` (``SessionProtocolService.
  connect``, the call the WebSocket transport makes), subscribed with ``session/subscribe``, whose
  frames go to the transport's own bounded :class:`protocol.transport_flow.Outbox`. A writer task per
  connection takes them as the transport's does; where that one writes them to a socket, this one
  reads back the frames of the answers (``item/delta``, and ``item/started`` / ``item/completed``
  of agent messages, picked by their text: the other frames are taken and counted, not decoded, as
  decoding is a client's work) and checks the stream. ``--via ws`` measures real sockets, with the
  clients in the same process. Sessions per connection as for ``--via ws``.
* ``watcher``: the sessions belong to a bot app and the bot watches them with
  ``on_did_receive_event`` (the Session Loop API's event hook), handing every event to its asyncio loop in batches
  (:class:`actors.system.worker.LoopBatch`), where it is checked.
* ``none``: nobody watches; the turns still stream inside (the mock produces its deltas), but no
  frame is built for nobody.

The check, for every answer of the run: ``item/started``, then deltas whose texts make the
answer, then ``item/completed`` (a subscriber: with ``seq`` increasing per session); or
``turn.started``, ``assistant.delta`` making the text, then ``assistant.message`` and
``turn.completed`` (a watcher). A run whose observers missed or mangled anything fails.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from sessionloop.actors.system.worker import LoopBatch
from sessionloop.protocol.frames import request_frame
from sessionloop.protocol.handshake import SESSION_PROTOCOL_VERSION
from sessionloop.protocol.peer import Peer
from sessionloop.protocol.transport_flow import DEFAULT_MAX_OUTBOX, Outbox, Waker

OBSERVE_MODES = ("subscriber", "watcher", "none")
#: the bot app that owns the sessions of a ``watcher`` run, and its one container
BENCH_APP, BENCH_CONTAINER = "bench-bot", "bench"

_decode = msgspec.json.Decoder().decode
#: how frames begin (protocol/frames.py): a reply, a delta; and how an agent message's item shows
_REPLY, _DELTA, _AGENT = '{"jsonrpc":"2.0","id":', '{"jsonrpc":"2.0","method":"item/delta"', '"kind":"agent-message"'


class StreamCheck:
    """What one observer saw: counts, and every rule broken (the first few kept)."""

    def __init__(self) -> None:
        self.frames = 0
        self.deltas = 0
        self.answers = 0  # answers seen streamed whole
        self.problems: list[str] = []
        self.broken = 0

    def problem(self, text: str) -> None:
        self.broken += 1
        if len(self.problems) < 10:
            self.problems.append(text)

    def report(self, mode: str, turns: int, connections: int = 0) -> dict[str, Any]:
        if self.answers != turns:
            self.problem(f"{self.answers} answers seen streamed whole, {turns} turns ended")
        return {"mode": mode, "ok": not self.broken, "connections": connections, "frames": self.frames,
                "frames_per_turn": self.frames / turns if turns else 0.0, "deltas": self.deltas,
                "deltas_per_turn": self.deltas / turns if turns else 0.0, "answers_streamed": self.answers,
                "broken": self.broken, "problems": self.problems}


class PushCheck:
    """The pushes of one connection, checked frame by frame (an item streams as item/started, then deltas
    appended to that item's text, then item/completed with the whole text; seq increasing)."""

    def __init__(self, check: StreamCheck, replies: dict[int, asyncio.Future[Any]] | None = None) -> None:
        self.check = check
        self.replies = replies if replies is not None else {}
        self.seq: dict[str, int] = {}
        self.streaming: dict[str, list[str]] = {}  # item id -> deltas so far

    def frame(self, text: str) -> None:
        """One frame as the transport's writer takes it: a reply (while subscribing), or a push,
        decoded only when it is part of an answer's stream."""
        if text.startswith(_REPLY):
            msg = _decode(text)
            fut = self.replies.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            return
        if text.startswith(_DELTA) or _AGENT in text:
            self.push(_decode(text))
        else:
            self.check.frames += 1

    def push(self, msg: dict[str, Any]) -> None:
        """One decoded notification; only ``item/*`` pushes are checked."""
        method, params = msg.get("method"), msg.get("params") or {}
        if not str(method).startswith("item/"):
            return
        check = self.check
        check.frames += 1
        sid, seq = params["sessionId"], params["seq"]
        if seq <= self.seq.get(sid, 0):
            check.problem(f"session {sid}: seq {seq} after {self.seq[sid]}")
        self.seq[sid] = seq
        if method == "item/delta":
            check.deltas += 1
            parts = self.streaming.get(params["itemId"])
            if parts is None:
                check.problem(f"session {sid}: a delta of {params['itemId']} before its item/started")
            else:
                parts.append(params["text"])
            return
        item = params["item"]
        if item["kind"] != "agent-message":
            return
        if method == "item/started":
            self.streaming[item["itemId"]] = []
            return
        parts = self.streaming.pop(item["itemId"], None)
        if not parts:
            check.problem(f"session {sid}: answer {item['itemId']} completed without being streamed")
        elif "".join(parts) != item["text"]:
            check.problem(f"session {sid}: deltas {''.join(parts)!r} != answer {item['text']!r}")
        else:
            check.answers += 1


class Subscribers:
    """Every session subscribed by a real gateway connection (see the module docstring)."""

    def __init__(self, host: Any, per_connection: int) -> None:
        self.service = host.protocol()
        self.per_connection = per_connection
        self.check = StreamCheck()
        self.outboxes: list[Outbox] = []
        self.writers: list[asyncio.Future[None]] = []
        self.ids = itertools.count(1)

    async def attach(self, session_ids: list[str]) -> None:
        waker = Waker(asyncio.get_running_loop())  # one for every connection, as the transport has
        for start in range(0, len(session_ids), self.per_connection):
            outbox = Outbox(waker, DEFAULT_MAX_OUTBOX, self._overflowed)
            replies: dict[int, asyncio.Future[Any]] = {}
            conn = self.service.connect(Peer(platform="console", user_id="owner", surface="cli"), outbox.put)
            self.outboxes.append(outbox)
            self.writers.append(asyncio.ensure_future(self._write(outbox, PushCheck(self.check, replies))))
            await self._call(conn, replies, "initialize",
                             {"protocolVersion": SESSION_PROTOCOL_VERSION,
                              "client": {"name": "sessionloop-bench", "version": "1"}})
            await asyncio.gather(*(self._call(conn, replies, "session/subscribe", {"sessionId": sid})
                                   for sid in session_ids[start:start + self.per_connection]))

    async def _call(self, conn: Any, replies: dict[int, asyncio.Future[Any]], method: str,
                    params: dict[str, Any]) -> None:
        rid = next(self.ids)
        replies[rid] = asyncio.get_running_loop().create_future()
        conn.receive(request_frame(rid, method, params))
        reply = await asyncio.wait_for(replies[rid], 30)
        if "error" in reply:
            raise RuntimeError(f"{method} refused: {reply['error']}")

    def _overflowed(self) -> None:
        self.check.problem("a connection's outbox overflowed: its writer fell behind")

    async def _write(self, outbox: Outbox, pushes: PushCheck) -> None:
        """The transport's writer (``SessionServer._write``), with the stream check for the socket."""
        while not outbox.closed:
            await outbox.wait()
            for frame in outbox.take():
                pushes.frame(frame)

    async def settle(self) -> None:
        """Let the writers take what is queued (the last turn's frames)."""
        for outbox in self.outboxes:
            await outbox.drained()
        await asyncio.sleep(0)

    def report(self, turns: int) -> dict[str, Any]:
        return self.check.report("subscriber", turns, len(self.outboxes))

    def close(self) -> None:
        for outbox in self.outboxes:
            outbox.close()
        for writer in self.writers:
            writer.cancel()
        self.service.close()


class Watcher:
    """The bot app's ``on_did_receive_event``: events to the bot's loop in batches, checked there."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.check = StreamCheck()
        self.turns: dict[str, dict[str, Any]] = defaultdict(lambda: {"started": False, "deltas": [], "text": None})
        self.unsubscribe: Callable[[], None] | None = None
        self.batch: LoopBatch[Any] | None = None

    def attach(self) -> None:
        self.batch = LoopBatch(asyncio.get_running_loop(), self._take)
        self.unsubscribe = self.host.sessions(app=BENCH_APP).on_did_receive_event(self.batch.add)

    def _take(self, events: list[Any]) -> None:
        check = self.check
        for event in events:
            check.frames += 1
            turn = self.turns[event.turn_id]
            kind = event.type
            if kind == "turn.started":
                turn["started"] = True
            elif kind == "assistant.delta":
                check.deltas += 1
                if not turn["started"] or turn["text"] is not None:
                    check.problem(f"turn {event.turn_id}: a delta outside its turn's answer")
                turn["deltas"].append(event.data["text"])
            elif kind == "assistant.message":
                turn["text"] = event.data["text"]
            elif kind in ("turn.completed", "turn.failed"):
                done = self.turns.pop(event.turn_id)
                joined = "".join(done["deltas"])
                if not done["deltas"] or joined != done["text"]:
                    check.problem(f"turn {event.turn_id}: deltas {joined!r}, answer {done['text']!r}")
                else:
                    check.answers += 1

    async def settle(self) -> None:
        await asyncio.sleep(0.05)  # the batch of the last turn's events is on its way to this loop

    def report(self, turns: int) -> dict[str, Any]:
        return self.check.report("watcher", turns)

    def close(self) -> None:
        if self.unsubscribe is not None:
            self.unsubscribe()


def create_sessions(host: Any, n: int, observe: str) -> list[str]:
    """``n`` sessions for the run: owner sessions, or the bot app's rooms for a ``watcher`` run."""
    if observe == "watcher":
        host.register_app(BENCH_APP, containers=[BENCH_CONTAINER])
        bot = host.sessions(app=BENCH_APP)

        def make(i: int) -> str:
            return str(bot.create(container_id=BENCH_CONTAINER, title=f"bench {i}").session_id)
    else:
        def make(i: int) -> str:
            return str(host.create(title=f"bench {i}").id)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(make, range(n), chunksize=64))


async def attach(host: Any, observe: str, session_ids: list[str], per_connection: int) -> Subscribers | Watcher | None:
    """The observers of ``observe`` mode, watching ``session_ids`` (None for ``none``)."""
    if observe == "subscriber":
        subs = Subscribers(host, per_connection)
        await subs.attach(session_ids)
        return subs
    if observe == "watcher":
        watcher = Watcher(host)
        watcher.attach()
        return watcher
    if observe != "none":
        raise ValueError(f"observe: one of {', '.join(OBSERVE_MODES)}, got {observe!r}")
    return None
