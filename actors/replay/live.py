"""Reading what a live host or a running server serves for one session (:class:`LiveView`).

:func:`serve_live_view` asks a host opened in this process: an owner connection to its gateway
(:class:`MemoryClient`, no socket) subscribes, unsubscribes and pages ``session/history`` to the
end, then the session actor is asked for its projection and state. :func:`ask_served` is that
conversation over any ``call(method, params)``, so ``replay --verify --url`` holds it with a
server over a WebSocket (``cli/replay_cmd.py``); :func:`remote_decorate` and
:func:`served_handles_masked` make the two sides comparable when the download handles are signed
with a key only the server has. ``actors/replay/verify.py`` compares the view with the log.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgspec

from sessionloop.actors.replay.values import plain, wire_item
from sessionloop.actors.session.commands import ProjectionView
from sessionloop.actors.session.messages import Ask
from sessionloop.actors.views.timeline import HISTORY_MAX_LIMIT
from sessionloop.protocol.file_handles import HANDLE_SHAPE
from sessionloop.protocol.frames import request_frame
from sessionloop.protocol.handshake import SESSION_PROTOCOL_VERSION
from sessionloop.protocol.peer import Peer
from sessionloop.protocol.schemas_items import UserMessageItem
from sessionloop.protocol.schemas_types import ItemAttachment

__all__ = [
    "HANDLE",
    "LiveUnavailable",
    "LiveView",
    "MemoryClient",
    "ask_served",
    "remote_decorate",
    "served_handles_masked",
    "serve_live_view",
]


class LiveView(msgspec.Struct, kw_only=True):
    """What a live host serves for one session, as plain JSON-like values (:func:`serve_live_view`).

    ``items`` is the session actor's own projection (the ``ItemsProjection`` it keeps up to date
    from its commits and serves from; items, then plan, usage and queue), ``state`` and
    ``version`` its folded state; ``snapshot`` (``{items, before}``) and ``history`` (pages,
    newest first, each ``{items, before}``) are the gateway's answers to ``session/subscribe``
    and ``session/history`` as a client receives them. ``error`` is the error object the gateway
    answered instead (a session it does not serve); ``decorate`` is the gateway's decoration of
    items (attachment handles of its epoch), applied to the rebuilt side before comparing.
    """

    session_id: str
    epoch: int = 0
    version: int = 0
    state: Any = None
    items: list[Any] = []
    snapshot: Any = None
    history: list[Any] = []
    error: Any = None
    decorate: Any = None
    #: asked over the wire (``replay --verify --url``): the server's answers only, no session actor
    #: to ask for its projection and state; attachment handles compared as :data:`HANDLE`
    remote: bool = False
    #: the language the host renders human text in; None (a remote server: not announced): the
    #: served items are compared with the rebuilt ones in each language, one must agree
    language: str | None = None
    remote_url: str | None = None


HANDLE = "<download handle>"


def remote_decorate(_session_id: str, item: Any) -> Any:
    """The rebuilt side of a remote comparison: a stored attachment (``blob:<sha256>``) is served
    as a download handle signed with the server's key, which only the server has."""
    if not isinstance(item, UserMessageItem) or not item.attachments:
        return item
    return msgspec.structs.replace(item, attachments=[
        ItemAttachment(kind=a.kind, name=a.name, src=HANDLE) if a.src is not None and a.src.startswith("blob:") else a
        for a in item.attachments])


def served_handles_masked(items: list[Any]) -> list[Any]:
    """The served side of a remote comparison: each download handle (an opaque file handle: docs/protocol.md) in a
    user message's attachments replaced by :data:`HANDLE`."""
    out = []
    for item in items:
        if isinstance(item, dict) and item.get("kind") == "user-message" and item.get("attachments"):
            item = {**item, "attachments": [
                {**a, "src": HANDLE} if isinstance(a, dict) and isinstance(a.get("src"), str)
                and HANDLE_SHAPE.fullmatch(a["src"]) else a for a in item["attachments"]]}
        out.append(item)
    return out


class LiveUnavailable(Exception):
    """The live host did not answer (a timeout): nothing to compare with."""


class MemoryClient:
    """An owner connection to a gateway service with no socket: request frames in, result frames
    out, pushes dropped (``--verify`` reads snapshots and pages; ``rerun`` sets its fork's
    settings and deletes a discarded fork)."""

    def __init__(self, service: Any, timeout: float) -> None:
        self.timeout = timeout
        self.answers: dict[int, dict[str, Any]] = {}
        self.cond = threading.Condition()
        self.next_id = 0
        self.conn = service.connect(Peer(platform="console", user_id="owner", surface="cli"), self._send)

    def _send(self, text: str) -> None:
        frame = msgspec.json.decode(text)
        if isinstance(frame, dict) and isinstance(frame.get("id"), int):
            with self.cond:
                self.answers[frame["id"]] = frame
                self.cond.notify_all()

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The reply frame (``result`` or ``error``) of one request."""
        with self.cond:
            self.next_id += 1
            rid = self.next_id
        self.conn.receive(request_frame(rid, method, params))
        with self.cond:
            if not self.cond.wait_for(lambda: rid in self.answers, self.timeout):
                raise LiveUnavailable(f"the live host did not answer {method} within {self.timeout:g} s")
            return self.answers.pop(rid)

    def initialize(self, name: str) -> None:
        """The handshake, as client ``name``; raises :class:`LiveUnavailable` when refused."""
        hello = self.call("initialize", {"protocolVersion": SESSION_PROTOCOL_VERSION,
                                         "client": {"name": name, "version": "1"}})
        if "error" in hello:
            raise LiveUnavailable(f"the live host refused the connection: {hello['error']}")

    def close(self) -> None:
        self.conn.close()


def serve_live_view(service: Any, session_id: str, *, timeout: float = 30.0) -> LiveView:
    """Ask a live host what it serves for ``session_id``: through ``service`` (the host's
    ``SessionProtocolService``, the gateway a server runs) an owner connection subscribes,
    unsubscribes and pages ``session/history`` to the end (200 messages a page); then the
    session actor is asked for its projection and state.

    Meant for a session at rest: a turn that commits meanwhile makes the answers disagree.
    Raises :class:`LiveUnavailable` when the host does not answer in ``timeout`` seconds.
    """
    view = LiveView(session_id=session_id, epoch=service.rt.epoch, decorate=service.decorate,
                    language=service.rt.language)
    client = MemoryClient(service, timeout)
    try:
        ask_served(client.call, view)
    finally:
        client.close()
    if view.error is None:
        version, state, items = service.rt.ask(session_id, lambda r: Ask(ProjectionView(), r), timeout)
        view.version, view.state, view.items = version, plain(state), [wire_item(i) for i in items]
    return view


def ask_served(call: Callable[[str, dict[str, Any]], dict[str, Any]], view: LiveView,
               served: Callable[[list[Any]], list[Any]] = lambda items: items) -> None:
    """Fill ``view`` with what a connection is served for its session: ``call(method, params)``
    answers one JSON-RPC request (the reply object). Handshake, ``session/subscribe`` (its
    snapshot and epoch), ``session/unsubscribe``, then ``session/history`` to the oldest page;
    ``served`` is applied to every list of items received. An error answer is kept in
    ``view.error``; a refused handshake raises :class:`LiveUnavailable`."""
    sid = view.session_id
    hello = call("initialize", {"protocolVersion": SESSION_PROTOCOL_VERSION,
                                "client": {"name": "sessionloop-verify", "version": "1"}})
    if "error" in hello:
        raise LiveUnavailable(f"the live host refused the connection: {hello['error']}")
    reply = call("session/subscribe", {"sessionId": sid})
    if "error" in reply:
        view.error = reply["error"]
        return
    view.epoch = reply["result"]["epoch"]
    view.snapshot = {"items": served(reply["result"]["items"]), "before": reply["result"].get("before")}
    call("session/unsubscribe", {"sessionId": sid})
    before: str | None = None
    while True:
        params: dict[str, Any] = {"sessionId": sid, "limit": HISTORY_MAX_LIMIT}
        if before is not None:
            params["before"] = before
        reply = call("session/history", params)
        if "error" in reply:
            view.error = reply["error"]
            return
        page = reply["result"]
        view.history.append({"items": served(page["items"]), "before": page.get("before")})
        if page.get("before") is None or len(view.history) > 100_000:
            return
        before = page["before"]


