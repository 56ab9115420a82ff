"""Requests for sessions another worker runs: relayed to it over NATS, answered through it.

``serve --workers N`` runs N processes on one port (``SO_REUSEPORT``): a client's connection lands
on any of them, and each runs the sessions of its own shards. A request that names a session
(``sessionId``, or an approval or task id, which begin with it; ``session/create`` names its
parent) goes to the worker that runs that session's shard:

* the connection's worker (the *origin*) sends the request's frame as a NATS request on
  ``sl.w.<owner>.rpc``, with who the peer is and the handshake's client;
* the owner keeps a *relayed connection* for that client connection (opened without a handshake
  of its own) and feeds it the frame, so every method runs exactly as on a local connection; the
  response frame is the NATS reply, which the origin settles its request with;
* ``presence/update`` is also sent to every other worker (no answer awaited), so a session there
  sees the owner present and asks it for approvals;
* pushes to the relayed connection (a subscription's items and deltas, approvals) are published on
  ``sl.w.<origin>.push`` and go out on the client's socket; closing the client's connection closes
  its relayed ones (``sl.w.<owner>.closed``).

When the owner cannot be reached (restarting: nobody serves its subject) the request is answered
``unavailable`` with ``retryAfterMs``, nothing done. Every worker keeps every session's listing
record: each commit's record is published on ``sl.index`` and applied by the others, so
``sessions/list`` and ``sessions/watch`` answer from any worker.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import threading
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from sessionloop.actors.system.nats_link import NatsLink
from sessionloop.actors.system.ports import Commit
from sessionloop.actors.views.index import SummaryIndex
from sessionloop.actors.views.summary import SummaryRecord
from sessionloop.protocol.connection import Dispatch, Push
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.peer import Peer
from sessionloop.protocol.schemas import SessionResync
from sessionloop.protocol.schemas_types import ClientInfo

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from sessionloop.actors.gateway.service import ClientConnection, RelayedConnection, SessionProtocolService

log = logging.getLogger("sessionloop.relay")

#: how long a client is told to wait before retrying a request its session's worker could not take
RETRY_AFTER_MS = 1000
#: how long a relayed request may take beyond what the request itself asks to wait
RELAY_TIMEOUT_S = 60.0
#: listing records in one message at most (a record is a few hundred bytes; NATS takes 1 MB)
INDEX_BATCH = 256

#: what every worker answers for its own sessions: sent to all of them (``session/batch`` to each
#: with the ids of its sessions), the answers merged: the list under this key joined (None: the
#: answer is ``{}``); a worker that cannot be reached makes it ``unavailable``, never a part
SCATTERED: dict[str, str | None] = {"background/list": "tasks", "background/watch": None, "session/batch": "failed"}


class RelayedRequest(msgspec.Struct, array_like=True, frozen=True):
    """A request frame from the origin worker's connection ``conn`` (of its incarnation ``epoch``).
    ``part``: the origin's share-out of one tree operation (:meth:`Relay.tree_part`): the owner
    acts on the sessions it names and theirs, never relaying further."""

    origin: int
    epoch: int
    conn: int
    peer: Peer
    client: ClientInfo | None
    frame: str
    part: bool = False


class RelayedPush(msgspec.Struct, array_like=True, frozen=True):
    """A notification for the origin's connection ``conn``."""

    conn: int
    method: str
    text: str


class ConnectionClosed(msgspec.Struct, array_like=True, frozen=True):
    origin: int
    epoch: int
    conn: int


class WorkerUp(msgspec.Struct, array_like=True, frozen=True):
    """A worker serves, in incarnation ``epoch``; ``ask``: the others answer with theirs."""

    worker: int
    epoch: int
    ask: bool


class IndexRecords(msgspec.Struct, array_like=True, frozen=True):
    """Listing records a worker committed, for every other worker's index (each session's latest)."""

    worker: int
    records: list[SummaryRecord]


_enc = msgspec.msgpack.Encoder()
_request_dec = msgspec.msgpack.Decoder(RelayedRequest)
_push_dec = msgspec.msgpack.Decoder(RelayedPush)
_closed_dec = msgspec.msgpack.Decoder(ConnectionClosed)
_index_dec = msgspec.msgpack.Decoder(IndexRecords)
_up_dec = msgspec.msgpack.Decoder(WorkerUp)


class _InFlight:
    """A request relayed and not answered yet: answered once, by its worker or for it (its worker
    restarted, NATS broke). A scattered request is in the table of every worker it went to."""

    __slots__ = ("answered", "conn", "request_id", "workers")

    def __init__(self, conn: ClientConnection, request_id: Any, workers: list[int]) -> None:
        self.conn = conn
        self.request_id = request_id
        self.workers = workers
        self.answered = False


class Placement(msgspec.Struct, frozen=True):
    """Which worker this process is, of how many, over how many shards."""

    worker: int
    workers: int
    shards: int

    def owner(self, session_id: str) -> int:
        """The worker that runs ``session_id`` (its shard ``crc32(id) mod S``, owned ``mod N``)."""
        return zlib.crc32(session_id.encode("utf-8", "surrogatepass")) % self.shards % self.workers


def session_of(method: str, params: Any) -> str | None:
    """The session a request is about, if it names one (its worker must answer it)."""
    session_id = getattr(params, "session_id", None)
    if isinstance(session_id, str):
        return session_id
    for field in ("approval_id", "task_id"):  # <session>.<turn>.<call>
        value = getattr(params, field, None)
        if isinstance(value, str):
            return value.split(".", 1)[0]
    if method == "session/create":  # a child lives with its parent
        parent = getattr(params, "parent_id", None)
        return parent if isinstance(parent, str) else None
    return None


class IndexReplica:
    """Keeps every worker's listing index whole: publishes the records this worker commits, applies
    the others'. ``committed`` is a commit listener of the worker's host.

    A commit's record waits in a batch for the link's outbox to reach it: the first record of a
    batch queues one message, whose data is every record committed until it is sent, each
    session's latest only (a turn commits several times: the others apply its last record), at
    most :data:`INDEX_BATCH` records to a message. It is queued before anything the commit's
    reply makes this worker send, so a client whose request another worker answered lists what
    that request changed."""

    SUBJECT = "sl.index"

    def __init__(self, link: NatsLink, placement: Placement, index: SummaryIndex) -> None:
        self.link = link
        self.placement = placement
        self.index = index
        self._lock = threading.Lock()
        self._batch: dict[str, SummaryRecord] = {}
        self._queued = False
        link.subscribe(self.SUBJECT, self._received)

    def committed(self, commit: Commit) -> None:
        record = commit.record
        if record is None:
            return
        with self._lock:
            self._batch[record.id] = record
            if self._queued:
                return
            self._queued = True
        self.link.publish_made(self.SUBJECT, self._take)

    def _take(self) -> bytes | None:
        with self._lock:
            records = list(self._batch.values())[:INDEX_BATCH]
            for record in records:
                del self._batch[record.id]
            self._queued = bool(self._batch)
        if self._queued:  # more than one message holds: the rest after this one
            self.link.publish_made(self.SUBJECT, self._take)
        return _enc.encode(IndexRecords(self.placement.worker, records)) if records else None

    def _received(self, msg: Msg) -> None:
        got = _index_dec.decode(msg.data)
        if got.worker != self.placement.worker:
            for record in got.records:
                self.index.update(record)


class Relay:
    """Both sides of relaying for one worker's gateway (see the module docstring)."""

    def __init__(self, service: SessionProtocolService, link: NatsLink, placement: Placement, epoch: int,
                 make_relayed: Callable[[Peer, ClientInfo | None, Callable[[RelayedPush], None]], RelayedConnection]
                 ) -> None:
        self.service = service
        self.link = link
        self.placement = placement
        self.epoch = epoch
        self._make_relayed = make_relayed
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._local: dict[int, ClientConnection] = {}  # this worker's connections, by relay id
        self._relayed: dict[tuple[int, int, int], RelayedConnection] = {}  # (origin, epoch, conn) -> relayed
        #: every worker's incarnation (its epoch), as it announced it (``sl.up``)
        self.epochs: dict[int, int] = {placement.worker: epoch}
        #: requests relayed and not answered yet, by the worker they went to (scattered ones under each)
        self._pending: dict[int, dict[tuple[ClientConnection, Any], _InFlight]] = {}
        me = placement.worker
        link.subscribe(f"sl.w.{me}.rpc", self._request)
        link.subscribe(f"sl.w.{me}.push", self._push)
        link.subscribe(f"sl.w.{me}.closed", self._closed)
        link.subscribe("sl.up", self._up)
        link.on_reconnect(self._reconnected)
        link.publish("sl.up", _enc.encode(WorkerUp(me, epoch, True)))

    def epoch_of(self, session_id: str) -> int | None:
        """The epoch of the worker that runs ``session_id``, if it announced one."""
        return self.epochs.get(self.placement.owner(session_id))

    def _up(self, msg: Msg) -> None:
        up = _up_dec.decode(msg.data)
        if up.worker == self.placement.worker:
            return
        with self._lock:
            before = self.epochs.get(up.worker)
            self.epochs[up.worker] = up.epoch
            # connections of the worker's earlier incarnation are gone with it
            gone = [key for key in self._relayed if key[0] == up.worker and key[1] != up.epoch]
            relayed = [self._relayed.pop(key) for key in gone]
        for conn in relayed:
            conn.close()
        if before is not None and before != up.epoch:
            self._owner_restarted(up.worker, up.epoch)
        if up.ask or before is None:
            self.link.publish("sl.up", _enc.encode(WorkerUp(self.placement.worker, self.epoch, False)))

    # --- the origin's side ------------------------------------------------------------------------

    def register(self, conn: ClientConnection) -> int:
        relay_id = next(self._ids)
        with self._lock:
            self._local[relay_id] = conn
        return relay_id

    def owner_of(self, dispatch: Dispatch) -> int | None:
        """The worker to relay ``dispatch`` to, or None to run it here (a method in
        :data:`SCATTERED` goes to every worker: :meth:`scatter`)."""
        session_id = session_of(dispatch.method, dispatch.params)
        if session_id is None:
            return None
        owner = self.placement.owner(session_id)
        return None if owner == self.placement.worker else owner

    def forward(self, conn: ClientConnection, relay_id: int, owner: int, dispatch: Dispatch, frame: str,
                timeout_s: float) -> None:
        """Send ``frame`` (the request ``dispatch`` came from) to ``owner``; its answer settles the
        request. A request the owner's incarnation took to its end (it exited) is answered
        ``unavailable`` when its next incarnation announces itself."""
        request = RelayedRequest(self.placement.worker, self.epoch, relay_id, _wire_peer(conn.peer),
                                 conn.protocol.client, frame)
        conn.relayed_to.add(owner)
        entry = self._track(conn, dispatch.id, [owner])
        session_id = session_of(dispatch.method, dispatch.params)
        if dispatch.method == "session/subscribe" and session_id is not None:
            conn.relayed_subscriptions[session_id] = owner
        elif dispatch.method == "session/unsubscribe" and session_id is not None:
            conn.relayed_subscriptions.pop(session_id, None)

        def done(answer: bytes | None, error: BaseException | None) -> None:
            with self._lock:
                if not self._settle(entry):  # answered already: its worker went away
                    return
            if answer is not None:
                conn.settle_relayed(dispatch.id, answer.decode("utf-8"))
                return
            log.warning("a %s request for worker %d got no answer: %s", dispatch.method, owner,
                        type(error).__name__)
            conn.error(dispatch.id, _unavailable(owner))

        self.link.request(f"sl.w.{owner}.rpc", _enc.encode(request), timeout_s + RELAY_TIMEOUT_S, done)

    def scatter(self, conn: ClientConnection, dispatch: Dispatch, frame: str) -> None:
        """``dispatch`` to every worker, this one too (through its own relayed connection), and
        one answer merged from theirs (:data:`SCATTERED`)."""
        parts: dict[int, str] = {}
        if dispatch.method == "session/batch":
            ids: dict[int, list[str]] = {}
            for session_id in dispatch.params.ids:  # type: ignore[attr-defined]
                ids.setdefault(self.placement.owner(session_id), []).append(session_id)
            for worker, mine in ids.items():
                parts[worker] = json.dumps({"jsonrpc": "2.0", "id": dispatch.id, "method": dispatch.method,
                                            "params": {"op": dispatch.params.op, "ids": mine}})  # type: ignore[attr-defined]
        else:
            parts = dict.fromkeys(range(self.placement.workers), frame)
        if not parts:
            conn.settle_relayed(dispatch.id, json.dumps({"jsonrpc": "2.0", "id": dispatch.id,
                                                         "result": {SCATTERED[dispatch.method] or "": []}}))
            return
        answers: dict[int, Any] = {}
        entry = self._track(conn, dispatch.id, list(parts))

        def done(worker: int, answer: bytes | None, error: BaseException | None) -> None:
            with self._lock:
                answers[worker] = answer
                if len(answers) < len(parts) or not self._settle(entry):
                    return
            conn.settle_relayed(dispatch.id, self._merged(dispatch, answers))

        for worker, text in parts.items():
            conn.relayed_to.add(worker)
            request = _enc.encode(RelayedRequest(self.placement.worker, self.epoch, conn.relay_id,
                                                 _wire_peer(conn.peer), conn.protocol.client, text))
            self.link.request(f"sl.w.{worker}.rpc", request, RELAY_TIMEOUT_S, functools.partial(done, worker))

    def tree_part(self, worker: int, peer: Peer, client: ClientInfo | None, method: str, session_id: str,
                  timeout_s: float) -> None:
        """Have ``worker`` do ``method`` (``session/archive``, ``session/unarchive``,
        ``session/delete``, ``background/stopAll``) to ``session_id``, a session of a tree this
        worker's session roots, for ``peer``: on a connection of its own that acts on that session
        (as a member of the tree) and those below it on that worker only. Blocks until the answer
        (call it on a thread that may wait). A session deleted meanwhile is no failure; raises the
        worker's error otherwise, or RpcError ``unavailable`` when it does not answer in ``timeout_s``."""
        relay_id = next(self._ids)  # a connection id of this worker nobody else uses
        frame = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"sessionId": session_id}})
        request = _enc.encode(RelayedRequest(self.placement.worker, self.epoch, relay_id, _wire_peer(peer), client,
                                             frame, part=True))
        got: list[bytes | None] = []
        answered = threading.Event()

        def done(answer: bytes | None, error: BaseException | None) -> None:
            if error is not None:
                log.warning("worker %d did not answer its part of a %s: %s", worker, method, type(error).__name__)
            got.append(answer)
            answered.set()

        self.link.request(f"sl.w.{worker}.rpc", request, timeout_s, done)
        answered.wait(timeout_s + 5)
        self.link.publish(f"sl.w.{worker}.closed", _enc.encode(ConnectionClosed(self.placement.worker, self.epoch,
                                                                              relay_id)))
        answer = json.loads(got[0]) if got and got[0] is not None else None
        if answer is None:
            raise _unavailable(worker)
        error = answer.get("error")
        if error is not None and (error.get("data") or {}).get("code") != "not-found":
            data = {k: v for k, v in (error.get("data") or {}).items() if isinstance(k, str)}
            raise RpcError(error.get("code", -32603), f"session {session_id} (worker {worker}): "
                                                     f"{error.get('message', 'error')}", **data)

    def _track(self, conn: ClientConnection, request_id: Any, workers: list[int]) -> _InFlight:
        entry = _InFlight(conn, request_id, workers)
        with self._lock:
            for worker in workers:
                self._pending.setdefault(worker, {})[(conn, request_id)] = entry
        return entry

    def _settle(self, entry: _InFlight) -> bool:
        """Take ``entry`` out of the table (under ``_lock``): True for the one who answers it."""
        if entry.answered:
            return False
        entry.answered = True
        for worker in entry.workers:
            per_worker = self._pending.get(worker)
            if per_worker is not None and per_worker.get((entry.conn, entry.request_id)) is entry:
                del per_worker[(entry.conn, entry.request_id)]
        return True

    @staticmethod
    def _merged(dispatch: Dispatch, raw: dict[int, bytes | None]) -> str:
        answers: dict[int, Any] = {worker: json.loads(text) if text is not None else None
                                   for worker, text in raw.items()}
        for worker, answer in sorted(answers.items()):
            if answer is None:
                return json.dumps({"jsonrpc": "2.0", "id": dispatch.id, "error": _unavailable(worker).error_object()})
            if "error" in answer:
                return json.dumps(answer)
        key = SCATTERED[dispatch.method]
        result: dict[str, Any] = {}
        if key is not None:
            result[key] = [x for _, answer in sorted(answers.items()) for x in answer["result"].get(key, [])]
        return json.dumps({"jsonrpc": "2.0", "id": dispatch.id, "result": result})

    def broadcast(self, conn: ClientConnection, frame: str) -> None:
        """``frame`` (a ``presence/update``) to every other worker too, unanswered: a session there
        asks for approval only when an owner is present, and the owner's connection is here."""
        request = _enc.encode(RelayedRequest(self.placement.worker, self.epoch, conn.relay_id,
                                             _wire_peer(conn.peer), conn.protocol.client, frame))
        for worker in range(self.placement.workers):
            if worker != self.placement.worker:
                conn.relayed_to.add(worker)
                self.link.publish(f"sl.w.{worker}.rpc", request)

    def _reconnected(self) -> None:
        """NATS was away: a request in flight meanwhile may never have reached its worker, or its
        answer never came back. Each is answered ``unavailable`` with ``outcome: unknown`` (retry a
        ``loop/send`` with its idempotency key: the original receipt, or one turn)."""
        with self._lock:
            pending = [(owner, entry) for owner, per_owner in self._pending.items() for entry in per_owner.values()]
            pending = [(owner, entry) for owner, entry in pending if self._settle(entry)]
        for owner, entry in pending:
            entry.conn.error(entry.request_id, _unavailable(owner, outcome="unknown"))
        self.link.publish("sl.up", _enc.encode(WorkerUp(self.placement.worker, self.epoch, True)))

    def _owner_restarted(self, owner: int, epoch: int) -> None:
        """``owner`` came back as a new incarnation: what the old one had is gone. Its requests in
        flight are answered ``unavailable``; each subscription to its sessions gets
        ``session/resync`` (subscribe again: a fresh snapshot, the new epoch)."""
        with self._lock:
            pending = [entry for entry in list(self._pending.get(owner, {}).values()) if self._settle(entry)]
            local = list(self._local.values())
        for entry in pending:  # a scattered request is unavailable as a whole: one of its parts is lost
            entry.conn.error(entry.request_id, _unavailable(owner))
        for conn in local:
            for session_id, at in list(conn.relayed_subscriptions.items()):
                if at == owner:
                    del conn.relayed_subscriptions[session_id]
                    conn.notify("session/resync", SessionResync(session_id=session_id, epoch=epoch, seq=0))

    def forget(self, conn: ClientConnection) -> None:
        """``conn`` closed: its relayed connections on other workers close too."""
        with self._lock:
            self._local.pop(conn.relay_id, None)
        closed = _enc.encode(ConnectionClosed(self.placement.worker, self.epoch, conn.relay_id))
        for owner in conn.relayed_to:
            self.link.publish(f"sl.w.{owner}.closed", closed)

    def _push(self, msg: Msg) -> None:
        push = _push_dec.decode(msg.data)
        with self._lock:
            conn = self._local.get(push.conn)
        if conn is not None:
            conn.send_push(Push(push.method, push.text))

    # --- the owner's side -------------------------------------------------------------------------

    def _request(self, msg: Msg) -> None:
        request = _request_dec.decode(msg.data)
        key = (request.origin, request.epoch, request.conn)
        with self._lock:
            relayed = self._relayed.get(key)
            if relayed is None:
                origin_push = f"sl.w.{request.origin}.push"

                def push(p: RelayedPush, subject: str = origin_push) -> None:
                    self.link.publish(subject, _enc.encode(p))

                relayed = self._make_relayed(request.peer, request.client, push)
                relayed.relay_id = request.conn
                relayed.tree_part = request.part
                self._relayed[key] = relayed
        reply = msg.reply
        relayed.receive_relayed(request.frame, (lambda text: self.link.publish(reply, text.encode("utf-8")))
                                if reply else _unanswered)

    def _closed(self, msg: Msg) -> None:
        closed = _closed_dec.decode(msg.data)
        with self._lock:
            relayed = self._relayed.pop((closed.origin, closed.epoch, closed.conn), None)
        if relayed is not None:
            relayed.close()

    def close(self) -> None:
        with self._lock:
            relayed = list(self._relayed.values())
            self._relayed.clear()
        for conn in relayed:
            conn.close()


def _unanswered(text: str) -> None:
    """The response of a broadcast request: nobody waits for it."""


def _unavailable(owner: int, **extra: str) -> RpcError:
    return RpcError.unavailable(f"the worker that runs this session (worker {owner}) is not answering; retry "
                                f"after {RETRY_AFTER_MS} ms", RETRY_AFTER_MS, **extra)


def _wire_peer(peer: Peer) -> Peer:
    """The peer as another worker sees it: who and on which surface (its close is this worker's)."""
    return Peer(platform=peer.platform, user_id=peer.user_id, surface=peer.surface, app_id=peer.app_id)


__all__ = ["SCATTERED", "IndexReplica", "Placement", "Relay", "RelayedPush", "session_of"]
