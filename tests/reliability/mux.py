"""Clients and figures shared by the reliability tests that measure latency against a real server:
:class:`Mux` (many calls in flight on one connection), percentiles, incompressible payloads, and
the slow-consumer isolation criterion :func:`within`."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.e2e.conftest import TOKEN, ServerProcess

HELLO = {"protocolVersion": "0.2.0", "client": {"name": "isolation", "version": "1"}}


class Mux:
    """A JSON-RPC client with many calls in flight on one connection: one reader task hands each
    reply to its caller by id and keeps the pushes (``Client`` in e2e waits for one reply at a time)."""

    def __init__(self, ws: Any, keep_pushes: bool = True) -> None:
        self.ws = ws
        self.keep_pushes = keep_pushes
        self.pushes: list[dict[str, Any]] = []
        self._next = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                if not self.keep_pushes and raw.startswith('{"jsonrpc":"2.0","method"'):
                    continue  # a push nobody will look at (the server encodes without spaces)
                msg = json.loads(raw)
                fut = self._waiting.pop(msg.get("id"), None) if "id" in msg else None
                if fut is not None:
                    if not fut.done():
                        fut.set_result(msg)
                elif "method" in msg:
                    self.pushes.append(msg)
        except ConnectionClosed:
            pass
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("connection closed"))

    async def call(self, method: str, params: dict[str, Any], timeout: float = 20) -> dict[str, Any]:
        """One request; waits out the per-connection rate limit (its error says how long)."""
        while True:
            self._next += 1
            rid = self._next
            fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._waiting[rid] = fut
            await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
            reply = await asyncio.wait_for(fut, timeout)
            error = reply.get("error")
            if error and error.get("data", {}).get("code") == "rejected":
                await asyncio.sleep(error["data"].get("retryAfterMs", 50) / 1000)
                continue
            return reply

    async def result(self, method: str, params: dict[str, Any]) -> Any:
        reply = await self.call(method, params)
        assert "result" in reply, (method, reply)
        return reply["result"]

    async def close(self) -> None:
        await self.ws.close()
        await self._reader


async def mux(server: ServerProcess, token: str = TOKEN, keep_pushes: bool = True, **kw: Any) -> Mux:
    ws = await connect(server.url, additional_headers={"Authorization": f"Bearer {token}"}, **kw)
    m = Mux(ws, keep_pushes)
    await m.result("initialize", HELLO)
    return m


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def p50(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def noise(n: int) -> str:
    """Incompressible text: base64 of random bytes (a compressible payload hides a full socket)."""
    return base64.b64encode(os.urandom(n)).decode()


def padded(marker: str, n: int) -> str:
    """A turn's text: ``marker`` then ``n`` random bytes of incompressible padding on a line the
    mock model ignores (an unknown ``!`` directive), so the user message item carries the padding
    while the answer is the marker's short echo. Every mock answer streams as deltas of a few
    characters (SPEC §4): echoing the padding would add 15,000 deltas to a 90,000-character turn,
    all at once, which no model produces; these tests are about big pushes to slow readers."""
    return f"{marker} \n!pad {noise(n)}"


def within(base_p99: float, stall_p99: float) -> bool:
    """RELIABILITY: healthy p99 unchanged, <= 2x. With a 50 ms floor: this is a noisy 2-core box
    where the server, the 200 clients' process and other jobs share two cores; a baseline p99 of
    tens of ms grows by a scheduler preemption or two, so a rise under 50 ms is not read as
    interference."""
    return stall_p99 <= max(2 * base_p99, base_p99 + 0.05)
