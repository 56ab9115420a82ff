"""A fake OpenAI-compatible chat-completions server on 127.0.0.1 port 0: real HTTP/1.1, real
chunked Server-Sent Events written as the script says, and connections it can drop mid-stream.

Each request is answered by ``script(exchange)``, a coroutine that reads what was asked
(``exchange.body``, ``.headers``, ``.number``: the request's 1-based arrival order) and writes
the answer (``reply`` for a plain HTTP reply, ``start_sse`` / ``event`` / ``end`` for a stream;
returning without ``end`` closes the connection mid-stream). The server counts the requests open
at once (``open_now``, ``max_open``) and sees a client leave (``Exchange.closed``).

:class:`FakeServer` runs on the test's own event loop (``async with``); :class:`ThreadedFakeServer`
runs it on a loop of its own thread, for tests whose client is another process (a real
``sessionloop serve``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Self

Script = Callable[["Exchange"], Awaitable[None]]


class Exchange:
    """One HTTP request the fake server received, and the means to answer it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        self.reader = reader
        self.writer = writer
        self.number = number
        self.method = self.path = ""
        self.headers: dict[str, str] = {}
        self.body: Any = None
        self.closed = asyncio.Event()  # the client closed its side (read EOF)

    async def read_request(self) -> None:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        self.method, self.path, _ = lines[0].split(" ", 2)
        for line in lines[1:]:
            if line:
                key, _, value = line.partition(":")
                self.headers[key.strip().lower()] = value.strip()
        size = int(self.headers.get("content-length", "0"))
        self.body = json.loads(await self.reader.readexactly(size)) if size else None

    async def wait_closed(self, timeout: float = 10.0) -> None:
        """Until the client closes the connection (EOF on the socket)."""
        await asyncio.wait_for(self.reader.read(), timeout)
        self.closed.set()

    async def start_sse(self) -> None:
        self.writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        await self.writer.drain()

    async def send(self, text: str) -> None:
        data = text.encode()
        self.writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await self.writer.drain()

    async def event(self, payload: Any) -> None:
        await self.send("data: " + (payload if isinstance(payload, str) else json.dumps(payload)) + "\n\n")

    async def end(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    async def reply(self, status: int, reason: str, body: bytes, content_type: str = "application/json",
                    headers: dict[str, str] | None = None) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n{extra}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await self.writer.drain()

    async def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        """An OpenAI-style JSON error reply."""
        body = json.dumps({"error": {"message": message, "type": "error", "code": status}}).encode()
        await self.reply(status, "Error", body, headers=headers)

    async def answer(self, pieces: list[str], *, usage: dict[str, int] | None = None,
                     finish: str = "stop", gap_s: float = 0.0) -> None:
        """A whole streamed answer: the text in ``pieces``, a finish chunk, usage, [DONE]."""
        await self.start_sse()
        for piece in pieces:
            await self.event(chunk(piece))
            if gap_s:
                await asyncio.sleep(gap_s)
        await self.event(chunk(finish=finish))
        if usage is not None:
            await self.event(usage_chunk(**usage))
        await self.event("[DONE]")
        await self.end()


def chunk(content: str | None = None, *, tool_calls: list[dict[str, Any]] | None = None,
          finish: str | None = None, reasoning: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def usage_chunk(prompt_tokens: int = 11, completion_tokens: int = 7) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake-model", "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


class FakeServer:
    """The server on the running loop: ``async with FakeServer(script) as server``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.exchanges: list[Exchange] = []
        self.server: asyncio.Server | None = None
        self.open_now = 0
        self.max_open = 0

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        exchange = Exchange(reader, writer, len(self.exchanges) + 1)
        self.exchanges.append(exchange)
        try:
            await exchange.read_request()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        try:
            await self.script(exchange)
        except ConnectionError:
            pass  # the client went away mid-answer
        finally:
            self.open_now -= 1
            writer.close()


class ThreadedFakeServer:
    """:class:`FakeServer` on an event loop of its own thread (``with ThreadedFakeServer(script)``);
    ``run(coro)`` runs a coroutine there and returns its result (waits on its events)."""

    def __init__(self, script: Script) -> None:
        self.loop = asyncio.new_event_loop()
        self.fake = FakeServer(script)
        self._thread = threading.Thread(target=self.loop.run_forever, name="fake-openai", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        self.run(self.fake.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self.run(self.fake.__aexit__())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def base_url(self) -> str:
        return self.fake.base_url

    @property
    def exchanges(self) -> list[Exchange]:
        return self.fake.exchanges
