"""A fake OpenAI-compatible endpoint on 127.0.0.1 for tests that start a real ``sessionloop``
process (serve, doctor): real HTTP/1.1, real SSE streaming in chunked transfer encoding, in a
thread of the test process. It records every request (path, headers, body) and answers
``POST /v1/chat/completions`` for the model ids it serves:

* a request with tools and a named ``tool_choice`` gets that tool called (``{"text": "ok"}``);
* any other request gets ``reply from <model id>`` streamed in three deltas;
* a usage chunk follows unless ``usage=False``; an unknown model id gets 404
  ``The model `X` does not exist``.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class FakeOpenAI:
    def __init__(self, models: tuple[str, ...] = ("model-a", "model-b"), *, usage: bool = True) -> None:
        self.models = set(models)
        self.usage = usage
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep the test output clean
                pass

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(size) or b"null")
                with fake._lock:
                    fake.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                fake.answer(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def bodies(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r["body"] for r in self.requests]

    # --- answers ---------------------------------------------------------------------------------

    def answer(self, h: BaseHTTPRequestHandler, body: Any) -> None:
        if h.path != "/v1/chat/completions":
            _plain(h, 404, {"error": {"message": f"no route {h.path}"}})
            return
        model = body.get("model") if isinstance(body, dict) else None
        if model not in self.models:
            _plain(h, 404, {"error": {"message": f"The model `{model}` does not exist", "code": "model_not_found"}})
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("Connection", "close")
        h.end_headers()
        for chunk in self.chunks(body, model):
            data = f"data: {json.dumps(chunk)}\n\n".encode()
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            h.wfile.flush()
        done = b"data: [DONE]\n\n"
        h.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        h.wfile.flush()
        h.close_connection = True

    def chunks(self, body: dict[str, Any], model: str) -> list[dict[str, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        choice = body.get("tool_choice")
        out: list[dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
        if body.get("tools") and isinstance(choice, dict):
            name = choice["function"]["name"]
            out.append(chunk({"tool_calls": [{"index": 0, "id": "call_fake", "type": "function",
                                              "function": {"name": name, "arguments": ""}}]}))
            for piece in ('{"text"', ': "ok"}'):
                out.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
            out.append(chunk({}, "tool_calls"))
        else:
            for piece in ("reply ", "from ", model):
                out.append(chunk({"content": piece}))
            out.append(chunk({}, "stop"))
        if self.usage:
            out.append({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model, "choices": [],
                        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}})
        return out


def _plain(h: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
    data = json.dumps(payload).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.send_header("Connection", "close")
    h.end_headers()
    h.wfile.write(data)
    h.close_connection = True


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
