"""protocol.guards: the frame-header scanner agrees with websockets' own parser however the
bytes are cut; the auth throttle's window and its memory bound; the server's own origins."""

from __future__ import annotations

import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from sessionloop.protocol.guards import AuthThrottle, FrameHeader, FrameScanner, origin_key, own_origins
from tests.reliability.raw_ws import client_frame

HEAD = (b"GET /session HTTP/1.1\r\nHost: 127.0.0.1:1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: x\r\nSec-WebSocket-Version: 13\r\n\r\n")


def scan(chunks: list[bytes]) -> list[tuple[int, FrameHeader]]:
    """Every header the scanner reports, with its end as an offset in the whole stream."""
    scanner, found, offset = FrameScanner(), [], 0
    for chunk in chunks:
        pos = 0
        while True:
            end, header = scanner.next_header(chunk, pos)
            if header is None:
                break
            found.append((offset + end, header))
            pos = end
        offset += len(chunk)
    return found


def parsed(frames: bytes) -> list[Frame]:
    reader = StreamReader()
    reader.feed_data(frames)
    out = []
    while reader.buffer:
        parser = Frame.parse(reader.read_exact, mask=True)
        try:
            next(parser)
        except StopIteration as done:
            out.append(done.value)
    return out


def cut(data: bytes, rng: random.Random) -> list[bytes]:
    chunks, pos = [], 0
    while pos < len(data):
        n = rng.choice([1, 2, 3, 7, 100, 70_000])
        chunks.append(data[pos:pos + n])
        pos += n
    return chunks


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 125, 126, 127, 65_535, 65_536, 200_000]), min_size=1, max_size=6),
       seed=st.integers(0, 2**32))
def test_the_scanner_finds_every_frame_header_websockets_parses_however_the_stream_is_cut(sizes, seed):
    rng = random.Random(seed)
    frames = []
    for n in sizes:
        opcode = rng.choice([0x1, 0x2, 0x9]) if n < 126 else rng.choice([0x1, 0x2])
        frames.append(client_frame(opcode, os.urandom(n), fin=opcode == 0x9 or rng.random() < 0.8))
    stream = HEAD + b"".join(frames)
    found = scan(cut(stream, rng))
    assert [(h.opcode, h.fin, h.length) for _, h in found] == [
        (f.opcode.value, f.fin, len(f.data)) for f in parsed(b"".join(frames))]
    ends, pos = [], len(HEAD)
    for frame, n in zip(frames, sizes, strict=True):
        ends.append(pos + len(frame) - n)  # a header ends where its payload starts
        pos += len(frame)
    assert [end for end, _ in found] == ends


def test_a_header_is_reported_before_any_of_its_payload_arrives():
    frame = client_frame(0x1, b"x" * 60_000_000)
    scanner = FrameScanner()
    assert scanner.next_header(HEAD[:-1]) == (len(HEAD) - 1, None)
    end, header = scanner.next_header(HEAD[-1:] + frame[:14])
    assert (end, header) == (15, FrameHeader(opcode=Opcode.TEXT.value, fin=True, length=60_000_000))
    assert header.is_data


def test_the_throttle_lets_an_address_fail_n_times_per_window_then_names_the_wait():
    t = AuthThrottle(max_failures=3, window_s=10)
    for now in (0.0, 1.0, 2.0):
        assert t.retry_after("10.0.0.1", now) is None
        t.failed("10.0.0.1", now)
    assert t.retry_after("10.0.0.1", 2.5) == 7.5
    assert t.retry_after("10.0.0.2", 2.5) is None  # another address is not affected
    assert t.retry_after("10.0.0.1", 10.0) is None  # the first failure left the window: one more try
    t.failed("10.0.0.1", 10.0)
    assert t.retry_after("10.0.0.1", 10.5) == 0.5  # now the second one must leave it


def test_the_throttle_remembers_a_bounded_number_of_addresses_and_an_ipv6_host_by_its_64():
    t = AuthThrottle(max_failures=2, window_s=60, max_addresses=100)
    for i in range(10_000):
        t.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", float(i))
    assert len(t) == 100
    for i in range(2):  # two addresses of one /64 are one entry
        t.failed(f"2001:db8::{i + 1}", 20_000.0)
    assert t.retry_after("2001:db8::ffff", 20_001.0) is not None
    assert t.retry_after("2001:db8:0:1::1", 20_001.0) is None
    assert len(t) == 100


def test_own_origins_come_from_the_listen_address_never_from_a_request():
    assert own_origins("127.0.0.1", 8765) == ["http://127.0.0.1:8765", "http://localhost:8765", "http://[::1]:8765"]
    assert own_origins("localhost", 1) == own_origins("::1", 1) == own_origins("127.0.0.1", 1)
    assert own_origins("192.0.2.7", 80) == ["http://192.0.2.7:80"]
    assert own_origins("Console.Example", 443) == ["http://console.example:443"]
    assert own_origins("0.0.0.0", 8765) == own_origins("::", 8765) == []
    assert origin_key("HTTPS://App.Example/") == "https://app.example"
