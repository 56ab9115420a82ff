"""A failed turn carries its reason everywhere a person looks, and the server logs it without a
secret (issue "Real models in production": failures are visible), over a real server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.e2e.conftest import TOKEN, initialized, open_client

pytestmark = pytest.mark.e2e

BOT_TOKEN = "failing-bot-token-" + "f" * 20
APPS = f'[apps.bot]\ntoken = "{BOT_TOKEN}"\nplatform = "im"\ncontainers = ["inbox"]\n'
API_KEY = "sk-visible-failures-canary-4242"


@pytest.fixture
def server(server_factory, tmp_path):
    data = tmp_path / "data"
    os.makedirs(data)
    (data / "apps.toml").write_text(APPS)
    return server_factory("--log-format", "json", data_dir=str(data), env={"OPENAI_API_KEY": API_KEY})


def cli(server, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SESSIONLOOP_URL=server.url, SESSIONLOOP_TOKEN=TOKEN)
    return subprocess.run([sys.executable, "-m", "sessionloop", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)


def server_log(server) -> list[dict]:
    server.log.flush()
    with open(server.log.name) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def test_a_failed_turn_shows_its_reason_on_the_item_the_list_wait_for_turn_and_the_log(server):
    async def go():
        async with open_client(server) as ws:
            owner = await initialized(ws)
            sid = (await owner.result("session/create", {}))["session"]["id"]
            await owner.result("session/subscribe", {"sessionId": sid})
            # the reason quotes the owner token: the log must not
            await owner.result("turn/send", {"sessionId": sid, "content": f"!error upstream refused {TOKEN}\nhi"})
            item = (await owner.turn_done(sid))["params"]["item"]
            listed = {s["id"]: s for s in (await owner.result("sessions/list", {}))["sessions"]}[sid]
        async with open_client(server, BOT_TOKEN) as ws:
            bot = await initialized(ws)
            room = (await bot.result("loop/create", {"containerId": "inbox"}))["sessionId"]
            receipt = await bot.result("loop/send", {"sessionId": room, "text": "!error the model is down",
                                                     "idempotencyKey": "k1"})
            waited = await bot.result("loop/waitForTurn", {"sessionId": room, "turnId": receipt["turnId"]})
        return sid, item, listed, waited
    sid, item, listed, waited = asyncio.run(go())
    assert item["outcome"] == "error" and item["reason"] == f"upstream refused {TOKEN}" and item["stepId"]
    assert listed["error"] is True and listed["reason"] == f"upstream refused {TOKEN}"
    assert waited == {"state": "failed", "code": "model-error", "message": "the model is down"}
    lines = server_log(server)
    failed = [line for line in lines if line["level"] == "WARNING" and line["message"].startswith("turn failed")]
    assert any(sid in line["message"] and item["stepId"] in line["message"] and "upstream refused [redacted]"
               in line["message"] for line in failed), failed
    assert any(line["level"] == "INFO" and line["message"].startswith("serving ws://") for line in lines)
    text = json.dumps(lines)
    assert TOKEN not in text and BOT_TOKEN not in text and API_KEY not in text  # no secret in any line


def test_send_wait_prints_the_reason_and_exits_by_outcome(server):
    async def make() -> str:
        async with open_client(server) as ws:
            return (await (await initialized(ws)).result("session/create", {}))["session"]["id"]
    sid = asyncio.run(make())
    ok = cli(server, "send", sid, "hello", "--wait")
    failed = cli(server, "send", sid, "!error disk on fire", "--wait")
    slow = cli(server, "send", sid, "!sleep 3000\nslow", "--wait", "--timeout", "0.5")
    assert (ok.returncode, ok.stdout.strip()) == (0, "echo: hello")
    assert failed.returncode == 1 and "the turn ended: error" in failed.stderr and "disk on fire" in failed.stderr
    assert slow.returncode == 4 and "no answer" in slow.stderr
