"""An in-memory client of the gateway: real ClientConnections on a real host, no sockets (the
protocol tests' "in-memory client/server pair", STYLE rule 11)."""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

from sessionloop.actors.gateway.service import SessionProtocolService
from sessionloop.protocol.peer import Peer


class MemoryClient:
    def __init__(self, service: SessionProtocolService, *, app_id: str | None = None) -> None:
        self.frames: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.closed: tuple[int, str] | None = None
        peer = Peer(platform="console" if app_id is None else "bot", user_id="owner" if app_id is None else app_id,
                    app_id=app_id, disconnect=self._disconnect)
        self.conn = service.connect(peer, self._send)
        self._ids = itertools.count(1)
        self.call("initialize", {"protocolVersion": "0.2.0", "client": {"name": "mem", "version": "1"}})

    def _send(self, text: str) -> None:
        with self.cond:
            self.frames.append(json.loads(text))
            self.cond.notify_all()

    def _disconnect(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 10) -> dict[str, Any]:
        rid = next(self._ids)
        self.conn.receive(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}))
        return self.wait(lambda f: f.get("id") == rid, timeout, remove=True)

    def result(self, method: str, params: dict[str, Any] | None = None) -> Any:
        reply = self.call(method, params)
        assert "result" in reply, reply
        return reply["result"]

    def wait(self, predicate: Any, timeout: float = 10, remove: bool = False) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i, frame in enumerate(self.frames):
                    if predicate(frame):
                        return self.frames.pop(i) if remove else frame
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching frame; have {[f.get('method') for f in self.frames]}")
                self.cond.wait(left)

    def clear(self) -> None:
        """Forget the frames received so far (the next waits see only what comes after)."""
        with self.cond:
            self.frames.clear()

    def pushes(self, method: str) -> list[dict[str, Any]]:
        with self.cond:
            return [f for f in self.frames if f.get("method") == method]

    def close(self) -> None:
        self.conn.close()


def wait_until(check: Any, timeout: float = 5, what: str = "condition") -> Any:
    """``check()``'s first truthy value, polled every 20 ms; AssertionError naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
