"""What the transport checks before it trusts a peer with memory or a token guess: sans-I/O parts.

Three small pieces that the transport (the one I/O shell: ``transport.py``, ``transport_http.py``,
``transport_flow.py``) drives. None of them reads a clock, opens a socket or logs: times come in as
arguments, bytes come in as they arrived.

* :class:`FrameScanner` follows the byte stream a WebSocket server receives (the HTTP request
  head, then frames) and reports each frame header as soon as its last byte arrives, *before*
  the payload it announces is buffered. The transport reserves room for that payload in a
  server-wide budget there (a 60 MiB frame is known as 60 MiB after its first 14 bytes), which
  the websockets parser cannot do for us: it accumulates the whole payload, then checks it.
* :class:`AuthThrottle` counts failed authentications per client address in a sliding window
  and says how long an address must wait once it has used up its failures. Its table is
  bounded: past ``max_addresses`` the address that failed longest ago is forgotten.
* :func:`own_origins` and :func:`origin_key` decide which browser origins are the server's own:
  those of its listen address, never the request's ``Host`` header (a page at
  ``http://evil.example:PORT`` whose DNS name was re-pointed at 127.0.0.1 sends
  ``Host: evil.example:PORT`` and ``Origin: http://evil.example:PORT``, which agree).
"""

from __future__ import annotations

import ipaddress
import struct
from collections import OrderedDict, deque
from typing import NamedTuple

__all__ = ["AuthThrottle", "FrameHeader", "FrameScanner", "origin_key", "own_origins"]

_HEAD_END = b"\r\n\r\n"


class FrameHeader(NamedTuple):
    opcode: int  # 0 continuation, 1 text, 2 binary, 8-10 control
    fin: bool
    length: int  # the payload length the header announces

    @property
    def is_data(self) -> bool:
        return self.opcode < 8


class FrameScanner:
    """Finds frame headers in what a WebSocket server receives, chunk by chunk.

    The stream starts with the HTTP request head (up to the first empty line, as websockets
    parses it) and continues with client frames: 2 header bytes, 2 or 8 bytes of extended length,
    4 mask bytes when the mask bit is set, then the payload, which the scanner only counts. It
    never raises on what it is fed: a stream that is not valid WebSocket is the parser's to refuse
    (the connection then closes), the scanner just keeps counting lengths.
    """

    def __init__(self) -> None:
        self._in_head = True
        self._tail = b""  # the last bytes of the request head seen so far (its end may straddle chunks)
        self._header = bytearray()  # a frame header being collected
        self._skip = 0  # payload bytes of the current frame still to come

    def next_header(self, data: bytes, start: int = 0) -> tuple[int, FrameHeader | None]:
        """Scan ``data[start:]``: ``(end, header)`` for the first frame header completed in it,
        ``end`` being the index just past its last byte; ``(len(data), None)`` when none is."""
        pos = start
        if self._in_head:
            pos = self._skip_head(data, pos)
        n = len(data)
        while pos < n:
            if self._skip:
                take = min(self._skip, n - pos)
                self._skip -= take
                pos += take
                continue
            if not self._header and pos + 1 < n:
                # the usual case: the whole header is in this chunk; parsed where it lies
                size = _HEADER_SIZES[data[pos + 1]]
                if pos + size <= n:
                    header = _parse_header(data, pos)
                    self._skip = header.length
                    return pos + size, header
            need = _header_size(self._header) - len(self._header)
            piece = data[pos:pos + need]
            self._header += piece
            pos += len(piece)
            if len(self._header) == _header_size(self._header):
                header = _parse_header(self._header)
                self._header.clear()
                self._skip = header.length
                return pos, header
        return n, None

    def _skip_head(self, data: bytes, pos: int) -> int:
        joined = self._tail + data[pos:pos + 3]
        found = joined.find(_HEAD_END)
        if found >= 0:  # the empty line began in an earlier chunk
            self._in_head = False
            return pos + found + 4 - len(self._tail)
        found = data.find(_HEAD_END, pos)
        if found >= 0:
            self._in_head = False
            return found + 4
        self._tail = (self._tail + data[pos:])[-3:]
        return len(data)


def _size_of(second: int) -> int:
    """A frame header's size from its second byte (the mask bit and the length's first form)."""
    extended = {126: 2, 127: 8}.get(second & 0x7F, 0)
    return 2 + extended + (4 if second & 0x80 else 0)


_HEADER_SIZES = tuple(_size_of(second) for second in range(256))
_U16, _U64 = struct.Struct("!H"), struct.Struct("!Q")


def _header_size(header: bytearray) -> int:
    return 2 if len(header) < 2 else _HEADER_SIZES[header[1]]


def _parse_header(buf: bytes | bytearray, pos: int = 0) -> FrameHeader:
    """The frame header whose first byte is ``buf[pos]`` (all of it in ``buf``)."""
    first, second = buf[pos], buf[pos + 1]
    length = second & 0x7F
    if length == 126:
        length = _U16.unpack_from(buf, pos + 2)[0]
    elif length == 127:
        length = _U64.unpack_from(buf, pos + 2)[0]
    return FrameHeader(first & 0x0F, first >= 0x80, length)


class AuthThrottle:
    """Failed authentications per client address, at most ``max_failures`` in any ``window_s``.

    An address that failed ``max_failures`` times within the last ``window_s`` seconds must wait
    until the oldest of those failures is ``window_s`` old (:meth:`retry_after`); while it waits
    its requests are not checked at all, so they neither count nor tell a guess from the token.
    Addresses are keyed as given, except IPv6 ones by their /64 (one host usually holds a whole
    /64). Memory: at most ``max_addresses`` entries of ``max_failures`` floats each."""

    def __init__(self, max_failures: int, window_s: float, max_addresses: int = 4096) -> None:
        if max_failures < 1 or window_s <= 0 or max_addresses < 1:
            raise ValueError("AuthThrottle needs max_failures >= 1, window_s > 0 and max_addresses >= 1")
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_addresses = max_addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def retry_after(self, address: str, now: float) -> float | None:
        """Seconds ``address`` must still wait, or ``None`` when it may try."""
        failures = self._failures.get(_address_key(address))
        if failures is None or len(failures) < self.max_failures:
            return None
        wait = failures[0] + self.window_s - now
        return wait if wait > 0 else None

    def failed(self, address: str, now: float) -> None:
        key = _address_key(address)
        failures = self._failures.get(key)
        if failures is None:
            failures = self._failures[key] = deque(maxlen=self.max_failures)
        failures.append(now)
        self._failures.move_to_end(key)
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)  # the address whose last failure is the oldest


def _address_key(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def origin_key(origin: str) -> str:
    """An origin as compared: lower case, no trailing slash (browsers send ``scheme://host[:port]``)."""
    return origin.strip().lower().rstrip("/")


def own_origins(host: str, port: int) -> list[str]:
    """The browser origins of a page served from this server's own listen address.

    Bound to loopback: ``http://127.0.0.1:PORT``, ``http://localhost:PORT`` and
    ``http://[::1]:PORT``. Bound to one address or name: ``http://HOST:PORT``. Bound to every
    interface (``0.0.0.0``, ``::``, empty): none, since no single name is the server's own; list
    the origins browsers will use with ``--allow-origin``."""
    if host in ("", "0.0.0.0", "::"):
        return []
    if _is_loopback(host):
        return [f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}"]
    shown = f"[{host}]" if ":" in host else host
    return [origin_key(f"http://{shown}:{port}")]


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
