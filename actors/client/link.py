"""One WebSocket of the client: its requests in flight, and what a failure to connect means.

A :class:`Link` numbers its requests, resolves each reply into the method's result Struct or the
typed error of its error frame (:mod:`sessionloop.client.wire`, :mod:`sessionloop.client.errors`),
and when the connection goes away fails every request still waiting with :class:`Lost`, which the
client turns into a repeat or a ``ConnectionLost``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from sessionloop.client.errors import ClientError, ConnectFailed, TokenRefused, error_from_frame
from sessionloop.client.wire import Envelope, decode_result
from sessionloop.protocol.frames import request_frame

__all__ = ["Link", "Lost", "connect_error", "describe"]


class Lost(Exception):
    """The connection went away under a request (internal): ``sent`` says whether it was written."""

    def __init__(self, sent: bool) -> None:
        super().__init__("connection lost")
        self.sent = sent


class Link:
    """One WebSocket's requests in flight."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.pending: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self.next_id = 0
        self.lost = False

    async def request(self, method: str, params: msgspec.Struct) -> Any:
        if self.lost:
            raise Lost(sent=False)
        self.next_id += 1
        rid = self.next_id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[rid] = (method, future)
        try:
            await self.ws.send(request_frame(rid, method, params))
        except ConnectionClosed:
            self.pending.pop(rid, None)
            raise Lost(sent=True) from None
        try:
            return await future
        finally:
            self.pending.pop(rid, None)

    def resolve(self, frame: Envelope) -> None:
        entry = self.pending.pop(frame.id, None) if isinstance(frame.id, int) else None
        if entry is None:
            return  # an answer nobody waits for any more (its call timed out)
        method, future = entry
        if future.done():
            return
        if frame.error is not None:
            future.set_exception(error_from_frame(method, frame.error.code, frame.error.message, frame.error.data))
            return
        try:
            future.set_result(decode_result(method, frame.result))
        except ClientError as e:
            future.set_exception(e)

    def lose(self) -> None:
        self.lost = True
        for _, future in self.pending.values():
            if not future.done():
                future.set_exception(Lost(sent=True))
        self.pending.clear()



def describe(error: BaseException) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (is `sessionloop serve` running?)"
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error) or type(error).__name__


def connect_error(url: str, e: Exception) -> ClientError:
    if isinstance(e, InvalidStatus):
        status = e.response.status_code
        if status in (401, 403):
            return TokenRefused(f"the server refused the token ({url}: HTTP {status})", status=status)
        return ConnectFailed(f"cannot connect to {url}: HTTP {status}", status=status)
    if isinstance(e, InvalidURI):
        return ConnectFailed(f"cannot connect to {url}: not a ws:// or wss:// URL")
    if isinstance(e, InvalidHandshake):
        return ConnectFailed(f"cannot connect to {url}: {e}")
    return ConnectFailed(f"cannot connect to {url}: {describe(e)}")


