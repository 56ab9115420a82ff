"""The WebSocket client of ``sessionloop bench --via ws`` (``cli/bench_cmd.py``; the benchmarks in
``benchmarks/`` drive servers with it too): one multiplexed connection, JSON-RPC calls by id,
and per session the ``item/completed`` push of its ``turn`` item.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import msgspec

from sessionloop.cli.bench_observers import PushCheck, StreamCheck
from sessionloop.protocol.frames import request_frame


class NotAccepted(Exception):
    """The server answered ``turn/send`` with an error: the input was not accepted (not a lost turn)."""


class Rejected(Exception):
    """Back-pressure (``rejected`` with ``retryAfterMs``): the server's per-connection rate limit."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class WsClient:
    """One multiplexed WebSocket connection: JSON-RPC calls by id, and per session a waiter for
    the ``item/completed`` push of its ``turn`` item (one turn at a time per session)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.calls: dict[int, asyncio.Future[Any]] = {}
        self.turn_waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.unexpected: list[str] = []
        self.rejected = 0  # turn/send requests refused by the rate limit, then retried
        self.stream = StreamCheck()  # the answers as this client got them streamed
        self.pushes = PushCheck(self.stream)
        self.decode = msgspec.json.Decoder().decode
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                msg = self.decode(raw)
                rid = msg.get("id")
                if rid is not None and "method" not in msg:
                    fut = self.calls.pop(rid, None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                    continue
                self.pushes.push(msg)
                if msg.get("method") != "item/completed":
                    continue
                params = msg.get("params") or {}
                item = params.get("item") or {}
                if item.get("kind") != "turn":
                    continue
                waiter = self.turn_waiters.pop(str(params.get("sessionId")), None)
                if waiter is None or waiter.done():
                    self.unexpected.append(f"session {params.get('sessionId')}: unexpected turn end "
                                           f"{item.get('itemId')}")
                else:
                    waiter.set_result(item)
        except Exception as e:  # noqa: BLE001 - the connection closed: fail everything waiting
            error: BaseException = e
        else:
            error = ConnectionError("the server closed the connection")
        for fut in [*self.calls.values(), *self.turn_waiters.values()]:
            if not fut.done():
                fut.set_exception(error)

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        rid = next(self.ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.calls[rid] = fut
        await self.ws.send(request_frame(rid, method, params))
        msg = await fut
        if "error" in msg:
            error, data = msg["error"], msg["error"].get("data") or {}
            if data.get("code") == "rejected":
                raise Rejected(f"{method}: {error.get('message')}", int(data.get("retryAfterMs", 100)))
            raise NotAccepted(f"{method}: {error.get('message')}")
        return msg["result"]

    async def turn(self, session_id: str, text: str) -> tuple[str, str]:
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.turn_waiters[session_id] = waiter
        try:
            while True:
                try:
                    await self.call("turn/send", {"sessionId": session_id, "content": text})
                    break
                except Rejected as e:  # as a well-behaved client: wait as told, send again
                    self.rejected += 1
                    await asyncio.sleep(e.retry_after_ms / 1000)
        except BaseException:
            self.turn_waiters.pop(session_id, None)
            raise
        item = await waiter
        outcome = item.get("outcome")
        return str(item["itemId"]), "completed" if outcome in ("replied", "silent") else str(outcome)

    async def close(self) -> None:
        await self.ws.close()
        self.reader.cancel()
        try:
            await self.reader
        except asyncio.CancelledError:
            pass


__all__ = ["NotAccepted", "Rejected", "WsClient"]
