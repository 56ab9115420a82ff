"""protocol.transport.WireFrames: the frame bytes made once per push are what websockets itself
would send, and the cache of them stays within its bounds."""

from __future__ import annotations

from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from sessionloop.protocol.transport import WireFrames


def parse_server_frame(data: bytes) -> Frame:
    reader = StreamReader()
    reader.feed_data(data)
    parser = Frame.parse(reader.read_exact, mask=False)
    try:
        next(parser)
    except StopIteration as done:
        assert not reader.buffer, "bytes left after the frame"
        return done.value
    raise AssertionError("an incomplete frame")


def test_each_text_is_one_unmasked_final_text_frame_that_websockets_parses_back():
    wire = WireFrames()
    for text in ["", "x", "x" * 125, "x" * 126, "x" * 65_535, "x" * 65_536, "é" * 40_000, '{"jsonrpc":"2.0"}']:
        frame = parse_server_frame(wire.wire(text))
        assert (frame.opcode, frame.fin, frame.data.decode()) == (Opcode.TEXT, True, text)


def test_a_push_shared_by_subscribers_is_framed_once_and_the_kept_bytes_stay_bounded():
    wire = WireFrames(max_bytes=10_000, max_frame=1_000)
    push = '{"method":"item/delta","params":{"text":"abcdef"}}'
    assert wire.wire(push) is wire.wire(push)  # the second subscriber gets the same bytes
    big = "y" * 5_000
    assert wire.wire(big) is not wire.wire(big)  # over max_frame: framed each time, never kept
    texts = [f"{i:04d}" * 50 for i in range(1_000)]
    for text in texts:
        wire.wire(text)
    assert wire._size <= 10_000 and len(wire._kept) < 1_000
    assert wire.wire(texts[-1]) is wire.wire(texts[-1])  # the newest are kept, the oldest went
