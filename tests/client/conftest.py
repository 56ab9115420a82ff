"""Fixtures of the client tests: a real ``sessionloop serve`` with two apps, and a real TCP relay in
front of it that a test can cut, stall or point at a restarted server (the client only knows the
relay's address, as a bot knows a load balancer's)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.conftest import APPS, ServerProcess

BOT_TOKEN = "bot-token-for-the-end-to-end-tests"
OTHER_TOKEN = "other-token-for-the-end-to-end-tests"


class Relay:
    """A TCP relay on 127.0.0.1 (its own event loop, in a thread) to ``upstream``'s port.

    ``cut()`` drops every open connection (both sides see the TCP connection end); ``stall``
    holds what the server sends back; ``drop_reply_when(predicate)`` drops the connection
    instead of passing on the first server chunk for which ``predicate(bytes)`` is true (server
    frames are not masked, so a test can recognise a reply). ``connections`` counts the
    connections accepted."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.connections = 0
        self.stall = False
        self._drop_when: Callable[[bytes], bool] | None = None
        self.dropped_replies = 0
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), self._loop).result(5)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/session"

    def drop_reply_when(self, predicate: Callable[[bytes], bool] | None) -> None:
        self._drop_when = predicate

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pump(reader, up_writer, False), self._pump(up_reader, writer, True),
                             return_exceptions=True)
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, from_server: bool) -> None:
        try:
            while data := await reader.read(65536):
                while from_server and self.stall:
                    await asyncio.sleep(0.01)
                if from_server and self._drop_when is not None and self._drop_when(data):
                    self._drop_when = None
                    self.dropped_replies += 1
                    self._cut_now()
                    return
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def _cut_now(self) -> None:
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    def cut(self) -> None:
        self._loop.call_soon_threadsafe(self._cut_now)

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            self._cut_now()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def bot_server(tmp_path) -> Iterator[ServerProcess]:
    """A real server whose apps.toml declares ``mybot`` and ``other`` (tests.e2e.conftest.APPS)."""
    data = tmp_path / "data"
    os.makedirs(data, exist_ok=True)
    (data / "apps.toml").write_text(APPS)
    server = ServerProcess(str(data)).start()
    yield server
    server.stop()


@pytest.fixture
def relay(bot_server) -> Iterator[Relay]:
    r = Relay(bot_server.port)
    yield r
    r.close()
