"""A bare WebSocket client over a TCP socket, for the tests that need a peer no library would be:
one that sends compressed frames without the extension, never answers a ping or a close, stops
reading, or sends half a frame and waits."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import time
from typing import Any

from websockets.utils import apply_mask

TCP_ESTABLISHED, TCP_CLOSE = 1, 7


def client_frame(opcode: int, payload: bytes, rsv1: bool = False, fin: bool = True) -> bytes:
    """A masked client frame (RFC 6455 §5.2)."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", first, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", first, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, n)
    mask = os.urandom(4)
    return head + mask + apply_mask(payload, mask)


class RawWebSocket:
    """A bare WebSocket client over a TCP socket: it sends what a library would not (RSV1 set
    without an extension) and answers nothing by itself (no pong, no close reply), like a dead peer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: str) -> None:
        self.reader, self.writer, self.head = reader, writer, head

    @classmethod
    async def open(cls, port: int, headers: dict[str, str], path: str = "/session",
                   rcvbuf: int | None = None) -> RawWebSocket:
        """Connect and send the upgrade request; ``rcvbuf`` sets SO_RCVBUF before connecting
        (a client that will stop reading then holds that little in its kernel)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket",
                 "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13",
                 *(f"{k}: {v}" for k, v in headers.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode("latin-1")
        return cls(reader, writer, head)

    @property
    def status(self) -> int:
        return int(self.head.split(" ", 2)[1])

    def header(self, name: str) -> str | None:
        for line in self.head.split("\r\n")[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None

    def send_frame(self, opcode: int, payload: bytes, rsv1: bool = False) -> None:
        self.writer.write(client_frame(opcode, payload, rsv1))

    async def recv_frame(self, timeout: float = 10) -> tuple[int, bytes]:
        """(opcode, payload) of the server's next frame; IncompleteReadError at EOF."""
        async def read() -> tuple[int, bytes]:
            first, second = await self.reader.readexactly(2)
            n = second & 0x7F
            if n == 126:
                n = struct.unpack("!H", await self.reader.readexactly(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", await self.reader.readexactly(8))[0]
            return first & 0x0F, await self.reader.readexactly(n)
        return await asyncio.wait_for(read(), timeout)

    async def request(self, rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        frame = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        self.send_frame(0x1, json.dumps(frame).encode())
        while True:
            opcode, payload = await self.recv_frame()
            if opcode == 0x1:
                msg: dict[str, Any] = json.loads(payload)
                if msg.get("id") == rid:
                    return msg

    async def close_frame(self, timeout: float = 10) -> tuple[int, str, float]:
        """Skip to the server's close frame: (code, reason, when it came)."""
        while True:
            opcode, payload = await self.recv_frame(timeout)
            if opcode == 0x8:
                when = time.monotonic()
                code = struct.unpack("!H", payload[:2])[0]
                return code, payload[2:].decode(), when

    def stop_reading(self) -> None:
        """Read nothing more from the socket, not even into this process's buffers: the kernel's
        receive buffer fills, then the server's send buffer."""
        self.writer.transport.pause_reading()  # type: ignore[attr-defined]

    def resume_reading(self) -> None:
        self.writer.transport.resume_reading()  # type: ignore[attr-defined]

    def tcp_state(self) -> int:
        """The kernel's state of this TCP connection (``TCP_INFO``), read without reading any data:
        1 established; 7 closed, e.g. after the peer's reset; 8 close-wait, after its FIN."""
        sock = self.writer.get_extra_info("socket")
        return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0])

    def close(self) -> None:
        self.writer.transport.abort()
