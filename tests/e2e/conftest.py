"""A real ``sessionloop serve`` subprocess on 127.0.0.1 with port 0, and real WebSocket clients."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from typing import Any

import pytest
from websockets.asyncio.client import connect

TOKEN = "e2e-owner-token"


class ServerProcess:
    """``token=None``: no ``--token``; the server makes its own token file, read into ``token``."""

    def __init__(self, data_dir: str, *extra: str, env: dict[str, str] | None = None,
                 token: str | None = TOKEN) -> None:
        self.data_dir = data_dir
        self.extra = extra
        self.env = env
        self.token = token
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self) -> ServerProcess:
        env = dict(os.environ, **(self.env or {}))
        # the server's log goes to a file: a pipe nobody drains would block a chatty server
        log_path = os.path.join(os.path.dirname(os.path.abspath(self.data_dir)), f"server-{os.getpid()}.log")
        self.log = open(log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sessionloop", "serve", "--data", self.data_dir, "--port", "0",
             *(("--token", self.token) if self.token is not None else ("--quiet",)), "--durability", "nosync",
             *self.extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        )
        line = self.proc.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)/session", line)
        if not match:
            self.proc.kill()
            self.log.flush()
            with open(self.log.name) as f:
                raise RuntimeError(f"server did not start: {line!r} {f.read()[-2000:]}")
        self.port = int(match.group(1))
        self.epoch = int(re.search(r"epoch (\d+)", line).group(1))
        if self.token is None:
            with open(os.path.join(self.data_dir, "token")) as f:
                self.token = f.read().strip()
        return self

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/session"

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)


@pytest.fixture
def server_factory(tmp_path):
    servers: list[ServerProcess] = []

    def make(*extra: str, data_dir: str | None = None, env: dict[str, str] | None = None) -> ServerProcess:
        s = ServerProcess(data_dir or str(tmp_path / "data"), *extra, env=env).start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def server(server_factory):
    return server_factory()


#: two bot apps for the Session Loop API tests (``app_server``); ``mybot`` owns sessions
APPS = """
[apps.mybot]
token = "bot-token-for-the-end-to-end-tests"
platform = "telegram"
sessions = true
containers = ["inbox", "workers"]

[apps.other]
token = "other-token-for-the-end-to-end-tests"
platform = "slack"
containers = ["inbox"]
"""


@pytest.fixture
def apps_server(server_factory, tmp_path):
    """``make(apps_toml) -> ServerProcess``: a server whose data directory has that apps.toml."""

    def make(apps: str) -> ServerProcess:
        data = tmp_path / "data"
        os.makedirs(data, exist_ok=True)
        (data / "apps.toml").write_text(apps)
        return server_factory(data_dir=str(data))

    return make


@pytest.fixture
def app_server(apps_server):
    """A server with :data:`APPS` in its apps.toml (connect a bot with ``open_client(server, token)``)."""
    return apps_server(APPS)


class Client:
    """A JSON-RPC client over a real WebSocket; keeps the pushes it did not wait for."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.pushes: list[dict[str, Any]] = []
        self._next = 0

    async def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 10) -> dict[str, Any]:
        self._next += 1
        rid = self._next
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            frame["params"] = params
        await self.ws.send(json.dumps(frame))
        return await self.reply(rid, timeout)

    async def reply(self, rid: Any, timeout: float = 10) -> dict[str, Any]:
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            if "id" in msg and msg["id"] == rid:
                return msg
            if "method" in msg:
                self.pushes.append(msg)

    async def result(self, method: str, params: dict[str, Any] | None = None) -> Any:
        reply = await self.call(method, params)
        assert "result" in reply, reply
        return reply["result"]

    async def push(self, predicate: Any, timeout: float = 10) -> dict[str, Any]:
        for i, p in enumerate(self.pushes):
            if predicate(p):
                return self.pushes.pop(i)
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            if "method" in msg and predicate(msg):
                return msg
            self.pushes.append(msg)

    async def turn_done(self, session_id: str, timeout: float = 10) -> dict[str, Any]:
        return await self.push(lambda m: m["method"] == "item/completed" and m["params"]["sessionId"] == session_id
                               and m["params"]["item"]["kind"] == "turn", timeout)


def open_client(server: ServerProcess, token: str = TOKEN, **kw: Any) -> Any:
    return connect(server.url, additional_headers={"Authorization": f"Bearer {token}"}, **kw)


async def initialized(ws: Any) -> Client:
    client = Client(ws)
    await client.result("initialize", {"protocolVersion": "0.2.0", "client": {"name": "e2e", "version": "1"}})
    return client
