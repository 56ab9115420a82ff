"""A real HTTP receiver of webhooks on 127.0.0.1 (http.server in a thread), for the tests and the
benchmark: it records every request it gets and answers as it is told."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Received:
    def __init__(self, headers: dict[str, str], body: bytes) -> None:
        self.headers = headers
        self.body = body
        self.json: Any = json.loads(body)
        self.status = 0  # what the receiver answered

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]


class Receiver:
    """``fail_first``: answer 500 to the first N attempts of each webhook-id; ``status``: the
    answer otherwise; ``delay_s``: sleep this long before answering."""

    def __init__(self, *, fail_first: int = 0, status: int = 204, delay_s: float = 0.0) -> None:
        self.fail_first = fail_first
        self.status = status
        self.delay_s = delay_s
        self.received: list[Received] = []
        self.attempts: Counter[str] = Counter()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                got = Received({k.lower(): v for k, v in self.headers.items()}, body)
                with outer.lock:
                    outer.attempts[got.id] += 1
                    got.status = 500 if outer.attempts[got.id] <= outer.fail_first else outer.status
                    outer.received.append(got)
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                self.send_response(got.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def delivered(self) -> dict[str, Received]:
        """The requests answered 2xx, by webhook-id (the last one of each)."""
        with self.lock:
            return {got.id: got for got in self.received if 200 <= got.status < 300}

    def wait_for(self, n: int, timeout: float = 30.0) -> dict[str, Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.delivered()
            if len(got) >= n:
                return got
            time.sleep(0.02)
        raise AssertionError(f"{len(self.delivered())} of {n} webhooks delivered within {timeout} s")
