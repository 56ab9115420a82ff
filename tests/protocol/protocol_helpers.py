"""Helpers for protocol tests: an in-memory client/server pair (STYLE rule 11).

:class:`Peer` plays the transport and a scripted gateway around one :class:`Connection`: it sends
a request as text, carries out ``Dispatch`` outputs with handlers given by the test, and gives
back the parsed reply frames. No sockets, no threads, no sleeping.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from sessionloop.protocol.connection import Close, Connection, Dispatch, Limits, Output, Send, ServerInfo
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.schemas_types import Features, Identity

OWNER = Identity(platform="console", user_id="owner")
ALL_FEATURES = Features(send=True, rewind=True, compress=True, settings=True)

Handler = Callable[[msgspec.Struct], msgspec.Struct]


def hello(version: str = "0.2.0", request_id: int | str = "init") -> str:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "initialize",
            "params": {"protocolVersion": version, "client": {"name": "pytest", "version": "1"}},
        }
    )


def request(method: str, params: Any = None, request_id: int | str = 1) -> str:
    frame: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        frame["params"] = params
    return json.dumps(frame)


class Peer:
    """The client side plus a scripted gateway, wired to one connection."""

    def __init__(self, conn: Connection, handlers: dict[str, Handler] | None = None) -> None:
        self.conn = conn
        self.handlers = handlers or {}
        self.closed: Close | None = None
        self.dispatched: list[Dispatch] = []

    def feed(self, data: str | bytes, now: float | None = None) -> list[dict[str, Any]]:
        """Send raw text; carry out dispatches; return every frame the server sent, parsed."""
        return self.carry_out(self.conn.receive(data, now))

    def carry_out(self, outputs: list[Output]) -> list[dict[str, Any]]:
        frames: list[dict[str, Any]] = []
        for out in outputs:
            if isinstance(out, Send):
                frames.append(json.loads(out.text))
            elif isinstance(out, Dispatch):
                self.dispatched.append(out)
                handler = self.handlers.get(out.method)
                if handler is None:
                    continue  # left in flight: the test answers it itself
                try:
                    text = self.conn.result(out.id, handler(out.params))
                except RpcError as e:
                    text = self.conn.error(out.id, e)
                if text is not None:
                    frames.append(json.loads(text))
            else:
                self.closed = out
        return frames

    def call(self, method: str, params: Any = None, request_id: int | str = 1) -> dict[str, Any]:
        """One request, exactly one reply frame."""
        frames = self.feed(request(method, params, request_id))
        assert len(frames) == 1, frames
        return frames[0]


def make_connection(
    *,
    limits: Limits | None = None,
    describe: Callable[[], tuple[Features, str]] | None = None,
    surface: str = "cli",
    server_version: str | None = None,
) -> Connection:
    info = ServerInfo(name="sessionloop", describe=describe or (lambda: (ALL_FEATURES, "Aalis")))
    if server_version is not None:
        info = ServerInfo(name="sessionloop", describe=info.describe, protocol_version=server_version)
    return Connection(OWNER, surface, info, limits)


def error_of(frame: dict[str, Any]) -> tuple[Any, int, str]:
    """``(id, code, message)`` of an error frame (asserting it is one)."""
    assert frame["jsonrpc"] == "2.0" and "error" in frame and "result" not in frame, frame
    return frame["id"], frame["error"]["code"], frame["error"]["message"]
