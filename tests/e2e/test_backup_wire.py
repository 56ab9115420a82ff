"""``sessionloop backup`` while a real server runs, then a second server on the copy: the
sessions, their items and attachments, and the owner token are all there; the copy is owner-only.
"""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from sessionloop.actors.events import open_store
from sessionloop.cli.main import main
from tests.e2e.conftest import ServerProcess, initialized, open_client

pytestmark = pytest.mark.e2e

ATTACHED = b"notes the backup must keep\n"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_backup_taken_while_the_server_runs_serves_the_same_sessions_from_a_second_server(tmp_path):
    data, dest = str(tmp_path / "data"), str(tmp_path / "backup")
    server = ServerProcess(data, token=None).start()  # the server writes DATA/token: the backup must carry it

    async def fill() -> tuple[str, list[str]]:
        async with open_client(server, server.token) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {"name": "kept"}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": sid})
            for text in ("first turn", "second turn"):
                await c.result("turn/send", {"sessionId": sid, "content": text, "attachments": [
                    {"data": "data:text/plain;base64," + base64.b64encode(ATTACHED).decode(), "name": "n.txt"}]})
                await c.turn_done(sid)
            items = (await c.result("session/subscribe", {"sessionId": sid}))["items"]
            return sid, [i["text"] for i in items if i["kind"] == "agent-message"]

    try:
        sid, answers = run(fill())
        result = CliRunner().invoke(main, ["backup", dest, "--data", data])
        assert result.exit_code == 0, result.output
        assert result.output.startswith(f"backed up {data} to {dest}: store ")
        again = CliRunner().invoke(main, ["backup", dest, "--data", data])
        assert again.exit_code == 1 and "exists" in again.output  # never over an existing directory
    finally:
        server.stop()
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(dest, "token")).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.join(dest, "store", "data.mdb")).st_mode) == 0o600
    with open_store(os.path.join(dest, "store"), readonly=True) as copy:
        assert copy.audit() == []
    restored = ServerProcess(dest, token=None).start()
    assert restored.token == server.token  # read from the copied token file

    async def read() -> tuple[list[str], str]:
        async with open_client(restored, restored.token) as ws:
            c = await initialized(ws)
            snapshot = await c.result("session/subscribe", {"sessionId": sid})
            texts = [i["text"] for i in snapshot["items"] if i["kind"] == "agent-message"]
            message = next(i for i in snapshot["items"] if i["kind"] == "user-message" and i.get("attachments"))
            return texts, message["attachments"][0]["src"]

    try:
        texts, handle = run(read())
        body = httpx.get(f"http://127.0.0.1:{restored.port}/api/session-file",
                         params={"sessionId": sid, "handle": handle},
                         headers={"Authorization": f"Bearer {restored.token}"})
    finally:
        restored.stop()
    assert texts == answers and len(answers) == 2
    assert body.status_code == 200 and body.content == ATTACHED
