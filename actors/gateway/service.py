"""The gateway: JSON-RPC frames in, actor messages out; projections back to subscribed connections.

The transport (``protocol/transport.py``) knows nothing of actors: it calls
:meth:`SessionProtocolService.connect` with the authenticated peer and a thread-safe ``send``,
then feeds every received text to :meth:`ClientConnection.receive` (the transport's
``connect(peer, send) -> {receive, close}``). Each connection owns a sans-I/O
``protocol.Connection``; decoded requests become messages to the ``GatewayActor``, whose
handlers translate them into session actor messages and never wait: replies come back as
callbacks that encode the result frame and hand it to ``send``.

Pushes: a connection subscribed to a session is one of that session channel's subscribers. The
frame of a push is encoded once per push and shared by every subscriber (a thread-local
one-entry cache: a channel publishes to its subscribers in one go on one thread).

Human text: every frame of the service is encoded by :attr:`SessionProtocolService.encoder`,
whose ``enc_hook`` renders the text objects in it (``actors.settings.texts``) in the server's language as
it is when the frame is encoded (after the global layer's language changes, the frames sent are in the new language).
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

from sessionloop.actors.settings.texts import Text, enc_hook
from sessionloop.actors.system.runtime import DeltaPayload, Runtime
from sessionloop.actors.views.index import SummaryIndex
from sessionloop.eventstore.errors import SessionloopError
from sessionloop.protocol import file_handles
from sessionloop.protocol.connection import Close, Connection, Dispatch, Limits, Send, ServerInfo
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.frames import notification_frame
from sessionloop.protocol.schemas import FeaturesChanged, ItemDelta, ItemPush, SessionResync
from sessionloop.protocol.schemas_types import Features, Identity, ItemAttachment, UserMessageItem
from sessionloop.protocol.transport import Peer

log = logging.getLogger("sessionloop.gateway")

SERVER_NAME = "sessionloop"


_tls = threading.local()


def _push_frame(session_id: str, epoch: int, seq: int, method: str, payload: Any,
                decorate: Callable[[str, Any], Any], encoder: msgspec.json.Encoder) -> str:
    cached: tuple[tuple[str, int, int], str] | None = getattr(_tls, "last", None)
    key = (session_id, epoch, seq)
    if cached is not None and cached[0] == key:
        return cached[1]
    params: msgspec.Struct
    if isinstance(payload, DeltaPayload):
        params = ItemDelta(session_id=session_id, epoch=epoch, seq=seq, item_id=payload.item_id, text=payload.text)
    elif method == "session/resync":
        params = SessionResync(session_id=session_id, epoch=epoch, seq=seq)
    else:
        params = ItemPush(session_id=session_id, epoch=epoch, seq=seq, item=decorate(session_id, payload))
    frame = notification_frame(method, params, encoder)
    _tls.last = (key, frame)
    return frame


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

    # --- transport side ---------------------------------------------------------------------

    def receive(self, frame: str | bytes) -> None:
        with self._lock:
            outputs = self.protocol.receive(frame, time.monotonic())
        for out in outputs:
            if isinstance(out, Send):
                self._send(out.text)
            elif isinstance(out, Dispatch):
                with self._lock:
                    self._methods[out.id] = out.method
                self.service.gateway.tell(("request", self, out))
            elif isinstance(out, Close) and self.peer.disconnect is not None:
                self.peer.disconnect(out.code, out.reason)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.protocol.close()
        self.service.gateway.tell(("closed", self, None))

    # --- gateway side -----------------------------------------------------------------------

    def result(self, request_id: Any, result: msgspec.Struct) -> None:
        with self._lock:
            method = self._methods.pop(request_id, "?")
            text = self.protocol.result(request_id, result)
        self.service.rt.metrics.frames.labels(method, "ok").inc()
        if text is not None:
            self._send(text)

    def error(self, request_id: Any, error: BaseException) -> None:
        if not isinstance(error, SessionloopError):
            log.exception("request failed", exc_info=error)
            error = RpcError.internal_error(f"{type(error).__name__}: {error}")
        with self._lock:
            method = self._methods.pop(request_id, "?")
            text = self.protocol.error(request_id, error)
        code = getattr(error, "data", {}).get("code") if isinstance(getattr(error, "data", None), dict) else None
        self.service.rt.metrics.frames.labels(method, str(code or getattr(error, "code", "error"))).inc()
        if text is not None:
            self._send(text)

    def notify(self, method: str, params: msgspec.Struct) -> None:
        with self._lock:
            text = self.protocol.notify(method, params)
        if text is not None:
            self._send(text)

    def push(self, session_id: str, epoch: int, seq: int, method: str, payload: Any) -> None:
        """A session channel's push (called under the channel's lock: must not block)."""
        if self.closed:
            return
        self._send(_push_frame(session_id, epoch, seq, method, payload, self.service.decorate,
                               self.service.encoder))

    def visible(self, record: Any) -> bool:
        """What this identity may see: the owner everything, an app only what it created."""
        return self.peer.is_owner or record.app_id == self.peer.app_id


class GatewayActor(pykka.ThreadingActor):
    """Translates requests into session actor messages; never waits for their answers."""

    use_daemon_thread = True

    def __init__(self, service: SessionProtocolService) -> None:
        super().__init__()
        self.service = service

    def on_receive(self, message: Any) -> Any:
        kind, conn, payload = message
        if kind == "request":
            self._dispatch(conn, payload)
        elif kind == "closed":
            self.service.forget(conn)
        return None

    def _dispatch(self, conn: ClientConnection, request: Dispatch) -> None:
        handler = self.service.handlers.get(request.method)
        if handler is None:
            conn.error(request.id, RpcError.unsupported(Text("error.method-unavailable", method=request.method)))
            return
        try:
            handler(conn, request.id, request.params)
        except SessionloopError as e:
            conn.error(request.id, e)
        except Exception as e:  # a bug in a handler: the request fails, the gateway lives on
            log.exception("handler for %s failed", request.method)
            conn.error(request.id, RpcError.internal_error(f"{type(e).__name__}: {e}"))


class SessionProtocolService:
    """What the transport talks to (``SessionProtocolService``): ``connect`` and
    ``resolve_file``. Owns the gateway actor, the listing index and the file-handle key."""

    def __init__(self, runtime: Runtime, *, limits: Limits | None = None, host: Any = None) -> None:
        from sessionloop.actors.gateway.loop import loop_handlers
        from sessionloop.actors.gateway.methods import build_handlers

        self.rt = runtime
        #: every frame of this service: text objects rendered in the language of the moment
        self.encoder = msgspec.json.Encoder(enc_hook=enc_hook(lambda: runtime.language))
        self.limits = limits or Limits()
        self.server_info = ServerInfo(name=SERVER_NAME, describe=self._describe)
        self.index = SummaryIndex(runtime.store)
        self.blobs = runtime.blobs
        self.file_key = file_handles.derive_epoch_key(_master_secret(runtime.data_dir), runtime.epoch)
        self.slow = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sessionloop-slow")
        self.connections: set[ClientConnection] = set()
        self._lock = threading.Lock()
        self.handlers = build_handlers(self)
        self._forget_loop_watch: Callable[[Any], None] | None = None
        if host is not None:
            loop, self._forget_loop_watch = loop_handlers(self, host)
            self.handlers.update(loop)
        runtime.listeners.append(self._on_commit)
        self.gateway = GatewayActor.start(self)
        from sessionloop.actors.gateway.settings import install_settings

        install_settings(self)

    def _describe(self) -> tuple[Features, str]:
        """The features and the ``appName`` of a handshake: config.toml's ``name``, read again
        when the file changed (a rename reaches the next connection without a restart; a bad
        edit is refused and the name read before stays)."""
        settings = self.rt.settings_service
        name = settings.app_name() if settings is not None else None
        return Features(send=True, rewind=True, compress=True, settings=settings is not None), name or SERVER_NAME

    def connect(self, peer: Peer, send: Callable[[str], None]) -> ClientConnection:
        conn = ClientConnection(self, peer, send)
        with self._lock:
            self.connections.add(conn)
        self.rt.metrics.connections.inc()
        return conn

    def forget(self, conn: ClientConnection) -> None:
        with self._lock:
            if conn not in self.connections:
                return
            self.connections.discard(conn)
        self.rt.metrics.connections.dec()
        for session_id in list(conn.subscriptions):
            self.rt.channel(session_id).remove(conn)
        self.index.unwatch(conn)
        self.rt.disconnected(conn)
        if self._forget_loop_watch is not None:
            self._forget_loop_watch(conn)

    def can_read(self, peer: Peer, session_id: str) -> bool:
        record = self.index.get(session_id)
        return record is not None and (peer.is_owner or record.app_id == peer.app_id)

    def resolve_file(self, session_id: str, handle: str) -> tuple[str, str] | None:
        """The blob path and name a handle stands for, if this epoch issued it for this session."""
        file_id = file_handles.resolve(self.file_key, session_id, handle)
        if file_id is None:
            return None
        sha256, _, name = file_id.partition("/")
        if not self.blobs.exists(sha256):
            return None
        return self.blobs.path(sha256), name or sha256

    def options(self, peer: Peer, source: str, dependency: str | None) -> Any:
        """``GET /api/models/<source>`` (a setting's options): ``{"service", "options"}``, or None for a
        source nobody answers. Any authenticated peer may ask: an app sets its own sessions' rows."""
        settings = self.rt.settings_service
        found = settings.option_list(source, dependency) if settings is not None else None
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

    def _on_commit(self, actor: Any, events: list[Any], result: Any) -> None:
        record = actor.last_record
        if record is not None and actor.record_dirty:
            actor.record_dirty = False
            self.index.update(record)

    def going_offline(self) -> None:
        """When the services behind the feature bits go away, every connection is told
        with ``features/changed`` (all off), so a client disables its input while the server
        drains instead of finding out from a dropped socket."""
        self.notify_all("features/changed",
                        FeaturesChanged(features=Features(send=False, rewind=False, compress=False, settings=False)))

    def notify_all(self, method: str, params: msgspec.Struct) -> None:
        """``method`` to every open connection."""
        with self._lock:
            conns = list(self.connections)
        for conn in conns:
            if not conn.closed:
                conn.notify(method, params)

    def close(self) -> None:
        with self._lock:
            conns = list(self.connections)
        for conn in conns:
            if conn.peer.disconnect is not None:
                conn.peer.disconnect(1001, "server shutting down")
        try:
            self.gateway.stop(timeout=5)
        except pykka.Timeout:
            pass
        self.slow.shutdown(wait=False, cancel_futures=True)


def _master_secret(data_dir: str) -> bytes:
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
