"""The gateway: JSON-RPC frames in, actor messages out; projections back to subscribed connections.

The transport (``protocol/transport.py``) knows nothing of actors: it calls
:meth:`SessionProtocolService.connect` with the authenticated peer and a thread-safe ``send``,
then feeds every received text to :meth:`ClientConnection.receive` (the transport's
``connect(peer, send) -> {receive, close}``). Each connection owns a sans-I/O
``protocol.Connection``; decoded requests become messages to the ``GatewayActor``, whose
handlers translate them into session actor messages and never wait: replies come back as
callbacks that encode the result frame and hand it to ``send``.

Every frame goes out through the connection's ``protocol.Connection``, whose state decides whether
it is sent (nothing after a close). Pushes: a connection subscribed to a session is one of that
session channel's subscribers. The frame of a push is encoded once per push
(``protocol.connection.encode_push``), left in the push's ``Publication.memo`` by the first
subscriber and taken from there by the others; each hands it to its own ``Connection.push``.

Human text: every frame of the service is encoded by :attr:`SessionProtocolService.encoder`,
whose ``enc_hook`` renders the text objects in it (``actors.settings.texts``) in the server's language as
it is when the frame is encoded (after the language changes, the next frame is in the new one).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import pykka

from sessionloop.actors.gateway.loop import loop_handlers, wire_event
from sessionloop.actors.gateway.methods import build_handlers
from sessionloop.actors.gateway.relay import SCATTERED, Placement, Relay, RelayedPush
from sessionloop.actors.gateway.settings import install_settings
from sessionloop.actors.gateway.webhooks import webhook_handlers
from sessionloop.actors.settings.service import SettingsService
from sessionloop.actors.settings.texts import Text, enc_hook
from sessionloop.actors.system.app_counts import SharedAppCounts
from sessionloop.actors.system.nats_link import NatsLink
from sessionloop.actors.system.pool import PooledActor
from sessionloop.actors.system.pubsub import Publication
from sessionloop.actors.system.runtime import DeltaPayload, Runtime
from sessionloop.actors.views.index import SummaryIndex
from sessionloop.protocol import file_handles
from sessionloop.protocol.connection import (
    Close,
    Connection,
    Dispatch,
    Limits,
    Push,
    Send,
    ServerInfo,
    encode_push,
)
from sessionloop.protocol.errors import RpcError, from_domain_error, is_domain_error
from sessionloop.protocol.peer import Peer
from sessionloop.protocol.schemas import FeaturesChanged, ItemDelta, ItemPush, SessionResync
from sessionloop.protocol.schemas_items import UserMessageItem
from sessionloop.protocol.schemas_types import ClientInfo, Features, Identity, ItemAttachment

log = logging.getLogger("sessionloop.gateway")

SERVER_NAME = "sessionloop"


def _push_params(publication: Publication, decorate: Callable[[str, Any], Any]) -> msgspec.Struct:
    """The params of a session push: a live delta, a resync, or an item (attachments signed)."""
    sid, epoch, seq, payload = publication.session_id, publication.epoch, publication.seq, publication.payload
    if isinstance(payload, DeltaPayload):
        return ItemDelta(session_id=sid, epoch=epoch, seq=seq, item_id=payload.item_id, text=payload.text)
    if publication.method == "session/resync":
        return SessionResync(session_id=sid, epoch=epoch, seq=seq)
    return ItemPush(session_id=sid, epoch=epoch, seq=seq, item=decorate(sid, payload))


class ClusterPorts(msgspec.Struct, frozen=True):
    """What a worker's gateway needs to reach the others (``serve --workers``)."""

    link: NatsLink
    placement: Placement
    app_counts: SharedAppCounts


class ClientConnection:
    """One client connection; every method is thread-safe (transport, gateway and session
    threads all use it)."""

    def __init__(self, service: SessionProtocolService, peer: Peer, send: Callable[[str], None]) -> None:
        self.service = service
        self.peer = peer
        self._send = send
        self._lock = threading.Lock()
        self.protocol = Connection(Identity(platform=peer.platform, user_id=peer.user_id), peer.surface,
                                   service.server_info, service.limits, service.encoder)
        self.subscriptions: set[str] = set()
        self.closed = False
        self._methods: dict[Any, str] = {}  # request id -> method, for the frames metric
        #: ``serve --workers``: this connection's id among its worker's, and the workers it relayed to
        self.relay_id = 0
        self.relayed_to: set[int] = set()
        self.relayed_subscriptions: dict[str, int] = {}  # session -> the worker that runs it
        #: another worker's share-out of one tree operation (``Relay.tree_part``): act here only
        self.tree_part = False

    # --- transport side ---------------------------------------------------------------------

    def receive(self, frame: str | bytes) -> None:
        with self._lock:
            outputs = self.protocol.receive(frame, time.monotonic())
        relay = self.service.relay
        for out in outputs:
            if isinstance(out, Send):
                self._send(out.text)
            elif isinstance(out, Dispatch):
                with self._lock:
                    self._methods[out.id] = out.method
                if relay is not None and self._relayed(relay, out, frame):
                    continue
                self.service.gateway.tell(Request(self, out))
            elif isinstance(out, Close) and self.peer.disconnect is not None:
                self.peer.disconnect(out.code, out.reason)

    def _relayed(self, relay: Relay, out: Dispatch, frame: str | bytes) -> bool:
        """Whether ``out`` went to the worker that runs its session, or to every worker."""
        text = frame if isinstance(frame, str) else frame.decode("utf-8")
        if out.method in SCATTERED:
            relay.scatter(self, out, text)
            return True
        owner = relay.owner_of(out)
        if owner is None:
            if out.method == "presence/update":  # the other workers' sessions see the owner too
                relay.broadcast(self, text)
            return False
        wait_ms = getattr(out.params, "timeout_ms", None)
        relay.forward(self, self.relay_id, owner, out, text, (wait_ms or 0) / 1000)
        return True

    def settle_relayed(self, request_id: Any, frame: str) -> None:
        """The response another worker made for a request relayed to it."""
        with self._lock:
            method = self._methods.pop(request_id, "?")
            text = self.protocol.relayed(request_id, frame)
        self.service.rt.metrics.frames.labels(method, "relayed").inc()
        if text is not None:
            self._send(text)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.protocol.close()
        self.service.gateway.tell(Closed(self))

    # --- gateway side -----------------------------------------------------------------------

    def result(self, request_id: Any, result: msgspec.Struct) -> None:
        with self._lock:
            method = self._methods.pop(request_id, "?")
            text = self.protocol.result(request_id, result)
        self.service.rt.metrics.frames.labels(method, "ok").inc()
        if text is not None:
            self._answer(request_id, text)

    def error(self, request_id: Any, error: BaseException) -> None:
        """Answer with ``error``: one of ours (a ``code`` and ``data``) as the protocol translates it,
        anything else as ``internalError`` (and logged: it is a bug)."""
        ours: bool = is_domain_error(error)  # a plain bool: ``error`` stays an exception for mypy
        if not ours:
            log.exception("request failed", exc_info=error)
            error = from_domain_error(error)
        with self._lock:
            method = self._methods.pop(request_id, "?")
            text = self.protocol.error(request_id, error)
        label = str(error.data.get("code") or error.code) if is_domain_error(error) else "error"
        self.service.rt.metrics.frames.labels(method, label).inc()
        if text is not None:
            self._answer(request_id, text)

    def _answer(self, request_id: Any, text: str) -> None:
        """The response frame of a request (a relayed connection sends it back to the origin worker)."""
        self._send(text)

    def _notify_out(self, method: str, text: str) -> None:
        """A notification frame (a relayed connection publishes it to the origin worker)."""
        self._send(text)

    def notify(self, method: str, params: msgspec.Struct) -> None:
        with self._lock:
            text = self.protocol.notify(method, params)
        if text is not None:
            self._notify_out(method, text)

    def push(self, publication: Publication) -> None:
        """A session channel's push (called under the channel's lock: must not block). The frame is
        encoded by the first subscriber and left in the publication for the others."""
        memo = publication.memo
        if memo is not None and memo[0] is self.service:
            frame: Push = memo[1]
        else:
            frame = encode_push(publication.method, _push_params(publication, self.service.decorate),
                                self.service.encoder)
            publication.memo = (self.service, frame)
        text = self.protocol.push(frame)
        if text is not None:
            self._notify_out(frame.method, text)

    def send_push(self, frame: Push) -> None:
        """A notification encoded once for many connections (``SessionProtocolService.notify_all``)."""
        text = self.protocol.push(frame)
        if text is not None:
            self._notify_out(frame.method, text)

    def visible(self, record: Any) -> bool:
        """What this identity may see: the owner everything, an app only what it created."""
        return self.peer.is_owner or record.app_id == self.peer.app_id


class RelayedConnection(ClientConnection):
    """A client connection of another worker, as the worker that runs its sessions sees it
    (``actors.gateway.relay``): opened without a handshake of its own; each response goes back as
    the answer of the relayed request it settles, each notification to the origin worker."""

    def __init__(self, service: SessionProtocolService, peer: Peer, client: ClientInfo | None,
                 push_out: Callable[[RelayedPush], None]) -> None:
        super().__init__(service, peer, self._no_send)
        self.protocol.open_relayed(client)
        self._push_out = push_out
        self._answers: dict[Any, Callable[[str], None]] = {}

    @staticmethod
    def _no_send(text: str) -> None:
        log.warning("a relayed connection had a frame with nowhere to go")

    def receive_relayed(self, frame: str, answer: Callable[[str], None]) -> None:
        """A request frame from the origin worker; ``answer`` takes its response frame. The origin
        applied the connection's rate limit, so none is applied here."""
        with self._lock:
            outputs = self.protocol.receive(frame)
        for out in outputs:
            if isinstance(out, Send):
                answer(out.text)
            elif isinstance(out, Dispatch):
                with self._lock:
                    self._methods[out.id] = out.method
                    self._answers[out.id] = answer
                self.service.gateway.tell(Request(self, out))

    def _answer(self, request_id: Any, text: str) -> None:
        with self._lock:
            answer = self._answers.pop(request_id, None)
        if answer is not None:
            answer(text)

    def _notify_out(self, method: str, text: str) -> None:
        self._push_out(RelayedPush(self.relay_id, method, text))


class Request(msgspec.Struct, frozen=True):
    """A connection's decoded request, for the gateway to dispatch to its method's handler."""

    conn: ClientConnection
    request: Dispatch


class Closed(msgspec.Struct, frozen=True):
    """A connection closed: the gateway forgets its subscriptions, watches and presence."""

    conn: ClientConnection


class GatewayBehaviour:
    """Translates requests into session actor messages; never waits for their answers. Its
    mailbox takes :class:`Request` and :class:`Closed`. Run as :class:`PooledGatewayActor` on
    the runtime's dispatcher when it has one (a request then goes from the connection's asyncio
    thread to a pool thread, not to a thread of the gateway's own first), else as
    :class:`GatewayActor`, a thread of its own."""

    def __init__(self, service: SessionProtocolService) -> None:
        super().__init__()
        self.service = service

    def on_receive(self, message: Any) -> Any:
        match message:
            case Request(conn=conn, request=request):
                self._dispatch(conn, request)
            case Closed(conn=conn):
                self.service.forget(conn)
            case _:
                log.warning("the gateway ignored a message it does not take: %s", type(message).__name__)
        return None

    def _dispatch(self, conn: ClientConnection, request: Dispatch) -> None:
        handler = self.service.handlers.get(request.method)
        if handler is None:
            conn.error(request.id, RpcError.unsupported(Text("error.method-unavailable", method=request.method)))
            return
        try:
            handler(conn, request.id, request.params)
        except Exception as e:
            ours: bool = is_domain_error(e)
            if not ours:  # a bug in a handler: the request fails, the gateway lives on
                log.exception("handler for %s failed", request.method)
                e = from_domain_error(e)
            conn.error(request.id, e)


class GatewayActor(GatewayBehaviour, pykka.ThreadingActor):
    """The gateway on a thread of its own (a runtime without a dispatcher)."""

    use_daemon_thread = True


class PooledGatewayActor(GatewayBehaviour, PooledActor):
    """The gateway on the runtime's dispatcher (``dispatcher`` set by the service)."""


class SessionProtocolService:
    """What the transport talks to (the protocol's ``SessionProtocolService``): ``connect`` and
    ``resolve_file``. Owns the gateway actor, the listing index and the file-handle key."""

    def __init__(self, runtime: Runtime, *, index: SummaryIndex, settings: SettingsService, host: Any,
                 limits: Limits | None = None, cluster: ClusterPorts | None = None) -> None:
        """Built by the composition root (``Host.protocol``): ``index`` is the host's listing index
        (kept current by the sessions' commits), ``settings`` the runtime's settings service,
        ``host`` the Session Loop API's ``loop/*``."""
        self.rt = runtime
        self.settings = settings
        #: every frame of this service: text objects rendered in the language of the moment
        self.encoder = msgspec.json.Encoder(enc_hook=enc_hook(lambda: runtime.language))
        self.limits = limits or Limits()
        self.server_info = ServerInfo(name=SERVER_NAME, describe=self._describe)
        self.index = index
        self.blobs = runtime.blobs
        self._secret = master_secret(runtime.data_dir)  # read once: each worker's epoch key derives from it
        self.file_key = file_handles.derive_epoch_key(self._secret, runtime.epoch)
        self.slow = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sessionloop-slow")
        #: another worker's share-outs of tree operations (``serve --workers``): never waiting on
        #: the pool whose threads may wait for this worker's answers, so two workers' trees never
        #: hold each other up
        self.parts = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sessionloop-parts")
        self.connections: set[ClientConnection] = set()
        self.relayed: set[ClientConnection] = set()  # other workers' connections, for their sessions here
        self._lock = threading.Lock()
        self.handlers = build_handlers(self)
        loop, self.loop = loop_handlers(self, host)
        self.handlers.update(loop)
        self.handlers.update(webhook_handlers(self, host))
        gateway = GatewayActor if runtime.dispatcher is None else runtime.dispatcher.bind(PooledGatewayActor)
        self.gateway = gateway.start(self)
        #: ``serve --workers``: requests for sessions other workers run go to them (None: one process)
        self.relay: Relay | None = None
        if cluster is not None:
            self.relay = Relay(self, cluster.link, cluster.placement, runtime.epoch, self._relayed_connection)

        self._settings_watch = install_settings(self)

    def _describe(self) -> tuple[Features, str]:
        """The features and the ``appName`` of a handshake: config.toml's ``name``, read again
        when the file changed (a rename reaches the next connection without a restart; a bad
        edit is refused and the name read before stays)."""
        name = self.settings.app_name()
        return Features(send=True, rewind=True, compress=True, settings=True), name or SERVER_NAME

    def connect(self, peer: Peer, send: Callable[[str], None]) -> ClientConnection:
        conn = ClientConnection(self, peer, send)
        if self.relay is not None:
            conn.relay_id = self.relay.register(conn)
        with self._lock:
            self.connections.add(conn)
        self.rt.metrics.connections.inc()
        return conn

    def _relayed_connection(self, peer: Peer, client: ClientInfo | None,
                            push_out: Callable[[RelayedPush], None]) -> RelayedConnection:
        conn = RelayedConnection(self, peer, client, push_out)
        with self._lock:
            self.relayed.add(conn)
        return conn

    def forget(self, conn: ClientConnection) -> None:
        with self._lock:
            if conn in self.relayed:
                self.relayed.discard(conn)
            elif conn in self.connections:
                self.connections.discard(conn)
                self.rt.metrics.connections.dec()
                if self.relay is not None:
                    self.relay.forget(conn)
            else:
                return
        for session_id in list(conn.subscriptions):
            self.rt.channel(session_id).remove(conn)
        self.index.unwatch(conn)
        self.rt.disconnected(conn)
        self.loop.forget(conn)

    def watch_feed(self, peer: Peer, cursor: int | None, deliver: Callable[[Any], bool],
                   ended: Callable[[BaseException], None]) -> tuple[int, Callable[[], None]]:
        """``GET /api/loop/events`` (``protocol/transport_sse.py``): the app's feed after ``cursor``
        (None: from the present) as wire ``LoopEvent`` values to ``deliver``; returns the cursor it
        starts after and the function that stops it. Raises ``forbidden`` for a peer that is not
        an app, CursorExpired for a cursor retention passed."""
        if peer.app_id is None:
            raise RpcError.forbidden("the event feed is for apps: connect with an app token")
        return self.loop.tail(peer.app_id, cursor, lambda e: deliver(wire_event(e)), ended)

    def can_read(self, peer: Peer, session_id: str) -> bool:
        record = self.index.get(session_id)
        return record is not None and (peer.is_owner or record.app_id == peer.app_id)

    def resolve_file(self, session_id: str, handle: str) -> tuple[str, str] | None:
        """The blob path and name a handle stands for, if this epoch issued it for this session
        (with several workers: the epoch of the worker that runs the session, which issued it)."""
        key = self.file_key
        if self.relay is not None:
            epoch = self.relay.epoch_of(session_id)
            if epoch is None:
                return None
            key = file_handles.derive_epoch_key(self._secret, epoch)
        file_id = file_handles.resolve(key, session_id, handle)
        if file_id is None:
            return None
        sha256, _, name = file_id.partition("/")
        if not self.blobs.exists(sha256):
            return None
        return self.blobs.path(sha256), name or sha256

    def options(self, peer: Peer, source: str, dependency: str | None) -> Any:
        """``GET /api/models/<source>`` (a settings field's option list): ``{"service", "options"}``, or None for a
        source nobody answers. Any authenticated peer may ask: an app sets its own sessions' rows."""
        found = self.settings.option_list(source, dependency)
        return None if found is None else {"service": source, "options": found}

    def decorate(self, session_id: str, item: Any) -> Any:
        """Replace the internal ``blob:<sha256>`` source of each attachment of a user message by a
        download handle signed for this session and epoch."""
        if not isinstance(item, UserMessageItem) or not item.attachments:
            return item
        out = []
        for att in item.attachments:
            if att.src is not None and att.src.startswith("blob:"):
                handle = file_handles.issue(self.file_key, session_id, f"{att.src[5:]}/{att.name}")
                att = ItemAttachment(kind=att.kind, name=att.name, src=handle)
            out.append(att)
        return msgspec.structs.replace(item, attachments=out)

    def going_offline(self) -> None:
        """When the services behind the feature bits go away, every connection is told
        with ``features/changed`` (all off), so a client disables its input while the server
        drains instead of finding out from a dropped socket."""
        self.notify_all("features/changed",
                        FeaturesChanged(features=Features(send=False, rewind=False, compress=False, settings=False)))

    def notify_all(self, method: str, params: msgspec.Struct) -> None:
        """``method`` to every open connection, encoded once."""
        frame = encode_push(method, params, self.encoder)
        with self._lock:
            conns = list(self.connections)
        for conn in conns:
            conn.send_push(frame)

    def close(self) -> None:
        self._settings_watch.close()  # no more session/config/changed pushes from this service
        with self._lock:
            conns = list(self.connections)
        for conn in conns:
            if conn.peer.disconnect is not None:
                conn.peer.disconnect(1001, "server shutting down")
        if self.relay is not None:
            self.relay.close()
        self.loop.tails.close()
        try:
            self.gateway.stop(timeout=5)
        except pykka.Timeout:
            pass
        self.slow.shutdown(wait=False, cancel_futures=True)
        self.parts.shutdown(wait=False, cancel_futures=True)


def master_secret(data_dir: str) -> bytes:
    """A per-data-directory secret (file mode 0600); file-handle keys derive from it per epoch."""
    path = os.path.join(data_dir, "secret")
    try:
        with open(path, "rb") as f:
            secret = f.read()
        if len(secret) >= 32:
            return secret
    except FileNotFoundError:
        pass
    secret = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    return secret
