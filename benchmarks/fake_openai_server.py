"""A fast fake OpenAI-compatible endpoint for ``bench_models.py``: HTTP/1.1 with keep-alive on
127.0.0.1, every ``POST /v1/chat/completions`` answered with a stream of ``--chunks`` text chunks
spread evenly over ``--latency-ms`` (the last one at the latency), then the finish chunk, a usage
chunk and ``[DONE]``.

    python benchmarks/fake_openai_server.py --latency-ms 500 --chunks 50   # prints "listening PORT"

Cheap on purpose, because it shares the machine with the server it measures: chunk bytes are made
once, one heap of due chunks and one timer drive every stream (no timer per chunk), requests are
parsed only as far as needed. It records how long each answer took from the request's arrival to
its last byte (by the text of the request's last message), so the benchmark can subtract the
fake's own time per turn: ``GET /stats`` answers ``{"requests", "connections", "answers": {text:
ms}}`` and forgets them.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import json
import time
from typing import Any

_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
         b"Connection: keep-alive\r\n\r\n")


def _framed(text: str) -> bytes:
    data = text.encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(payload: dict[str, Any]) -> bytes:
    return _framed("data: " + json.dumps(payload, separators=(",", ":")) + "\n\n")


def _chunk(content: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {"content": content} if content is not None else {}
    return {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


class Answers:
    """The precomputed bytes of the answer and the schedule of every open stream."""

    def __init__(self, latency_s: float, chunks: int) -> None:
        self.latency_s = latency_s
        self.interval = latency_s / chunks
        self.pieces = [_event(_chunk(f"w{i} ")) for i in range(chunks)]
        usage = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
                 "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": chunks,
                                          "total_tokens": 10 + chunks}}
        self.tail = _event(_chunk(None, "stop")) + _event(usage) + _framed("data: [DONE]\n\n") + b"0\r\n\r\n"
        self.heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self.durations: dict[str, float] = {}
        self.requests = 0
        self.connections = 0

    def start(self, transport: asyncio.Transport, key: str) -> None:
        self.requests += 1
        now = time.monotonic()
        transport.write(_HEAD)
        self._push(now + self.interval, [transport, key, now, 0])

    def _push(self, due: float, stream: list[Any]) -> None:
        heapq.heappush(self.heap, (due, next(self._order), stream))
        if due < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = due
            self._timer = asyncio.get_running_loop().call_at(due, self._run)

    def _run(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        heap, now = self.heap, time.monotonic()
        while heap and heap[0][0] <= now:
            _, _, stream = heapq.heappop(heap)
            transport, key, started, index = stream
            if transport.is_closing():
                continue
            transport.write(self.pieces[index])
            index += 1
            if index < len(self.pieces):
                stream[3] = index
                heapq.heappush(heap, (started + (index + 1) * self.interval, next(self._order), stream))
            else:
                transport.write(self.tail)
                self.durations[key] = (time.monotonic() - started) * 1000
        if heap:
            due = heap[0][0]
            self._timer_at = due
            self._timer = asyncio.get_running_loop().call_at(due, self._run)


class Connection(asyncio.Protocol):
    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.answers.connections += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4:end + 4 + length])
            del self.buffer[:end + 4 + length]
            self._answer(head.split(" ", 2), body)

    def _answer(self, request_line: list[str], body: bytes) -> None:
        assert self.transport is not None
        if request_line[0] == "GET" and request_line[1].startswith("/stats"):
            a = self.answers
            stats = json.dumps({"requests": a.requests, "connections": a.connections, "answers": a.durations}).encode()
            a.durations = {}
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(stats), stats))
            return
        messages = json.loads(body).get("messages") or [{}]
        self.answers.start(self.transport, str(messages[-1].get("content", "")))


async def serve(port: int, latency_ms: float, chunks: int) -> None:
    answers = Answers(latency_ms / 1000, chunks)
    server = await asyncio.get_running_loop().create_server(lambda: Connection(answers), "127.0.0.1", port,
                                                            backlog=4096)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--chunks", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.latency_ms, args.chunks))


if __name__ == "__main__":
    main()
