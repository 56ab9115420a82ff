"""Webhooks against real ``sessionloop serve`` subprocesses and a real HTTP receiver on 127.0.0.1
(tests/webhooks/receiver.py): signed deliveries, retries, dead letters listed and replayed, the
address check, and SIGKILL of the server during deliveries."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from sessionloop.actors.events import open_store
from tests.e2e.conftest import ServerProcess, initialized, open_client
from tests.webhooks.receiver import Receiver

pytestmark = pytest.mark.e2e

BOT = "bot-token-for-the-webhook-tests-0123456789"
SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
FAST = ("--webhook-retry-first", "0.1", "--webhook-retry-max-delay", "0.4")
ALLOW = ("--webhook-allow-net", "127.0.0.1/32")


def apps_toml(url: str, events: str = '["turn.completed", "turn.failed"]') -> str:
    return f"""
[apps.mybot]
token = "{BOT}"
containers = ["inbox"]

[apps.mybot.webhook]
url = "{url}"
secret = "{SECRET}"
events = {events}
"""


def start(tmp_path, url: str, *extra: str, data: str = "data") -> ServerProcess:
    path = tmp_path / data
    os.makedirs(path, exist_ok=True)
    (path / "apps.toml").write_text(apps_toml(url))
    return ServerProcess(str(path), *extra).start()


async def send_turns(server: ServerProcess, texts: list[str]) -> str:
    async with open_client(server, BOT) as ws:
        c = await initialized(ws)
        sid = (await c.result("loop/create", {"containerId": "inbox"}))["sessionId"]
        for i, text in enumerate(texts):
            await c.result("loop/send", {"sessionId": sid, "text": text, "idempotencyKey": f"k{i}"})
        return sid


async def owner_call(server: ServerProcess, method: str, params: dict) -> dict:
    async with open_client(server) as ws:
        c = await initialized(ws)
        return await c.result(method, params)


def test_each_completed_turn_is_delivered_signed_with_a_stable_id(tmp_path):
    with Receiver() as receiver:
        server = start(tmp_path, receiver.url, *ALLOW)
        try:
            sid = asyncio.run(send_turns(server, ["one", "two", "three"]))
            got = receiver.wait_for(3)
        finally:
            server.stop()
    hook = Webhook(SECRET)
    for message in got.values():
        assert hook.verify(message.body, message.headers) == message.json  # the standardwebhooks package agrees
        assert message.id == f"msg_{sid}_{message.json['data']['sequence']}"
        assert message.json["type"] == "turn.completed"
        assert message.json["data"]["sessionId"] == sid and message.json["data"]["app"] == "mybot"
    assert sorted(m.json["data"]["outputText"] for m in got.values()) == ["echo: one", "echo: three", "echo: two"]
    first = next(iter(got.values()))
    forged = dict(first.headers, **{"webhook-signature": "v1," + base64.b64encode(b"x" * 32).decode()})
    with pytest.raises(WebhookVerificationError, match="signature"):
        hook.verify(first.body, forged)


def test_a_failing_receiver_is_tried_again_with_the_same_id_and_body(tmp_path):
    with Receiver(fail_first=2) as receiver:
        server = start(tmp_path, receiver.url, *ALLOW, *FAST)
        try:
            asyncio.run(send_turns(server, ["a", "b"]))
            got = receiver.wait_for(2)
        finally:
            server.stop()
        for message_id in got:
            attempts = [r for r in receiver.received if r.id == message_id]
            assert len(attempts) == 3
            assert len({r.body for r in attempts}) == 1


def test_a_receiver_that_never_answers_2xx_leaves_dead_letters_that_are_listed_and_replayed(tmp_path):
    with Receiver(status=503) as receiver:
        server = start(tmp_path, receiver.url, *ALLOW, *FAST, "--webhook-retry-window", "1")
        try:
            sid = asyncio.run(send_turns(server, ["lost"]))
            dead = asyncio.run(wait_dead(server, 1))
            (letter,) = dead
            assert letter["sessionId"] == sid and letter["app"] == "mybot" and letter["type"] == "turn.completed"
            assert letter["attempts"] >= 3 and letter["error"] == "HTTP 503"
            assert letter["id"] == f"msg_{sid}_{letter['sequence']}"
            tried = len(receiver.received)
            receiver.status = 200
            replayed = asyncio.run(owner_call(server, "webhooks/deadLetters/replay", {"ids": [letter["id"]]}))
            assert replayed == {"replayed": 1}
            got = receiver.wait_for(1)
            assert list(got) == [letter["id"]] and len(receiver.received) == tried + 1
            assert asyncio.run(owner_call(server, "webhooks/deadLetters/list", {}))["deadLetters"] == []
        finally:
            server.stop()


async def wait_dead(server: ServerProcess, n: int, timeout: float = 20.0) -> list[dict]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        listed = (await owner_call(server, "webhooks/deadLetters/list", {}))["deadLetters"]
        if len(listed) >= n or asyncio.get_running_loop().time() > deadline:
            return listed
        await asyncio.sleep(0.1)


def test_a_loopback_target_is_refused_unless_its_network_is_allowed(tmp_path):
    with Receiver() as receiver:
        server = start(tmp_path, receiver.url.replace("127.0.0.1", "localhost"))
        try:
            asyncio.run(send_turns(server, ["private"]))
            (letter,) = asyncio.run(wait_dead(server, 1))
        finally:
            server.stop()
        assert receiver.received == []
        assert "127.0.0.1 is a loopback address" in letter["error"] and letter["attempts"] == 1


def test_dead_letters_are_listed_from_the_data_directory_by_the_cli(tmp_path):
    with Receiver(status=500) as receiver:
        server = start(tmp_path, receiver.url, *ALLOW, *FAST, "--webhook-retry-window", "0.5")
        try:
            sid = asyncio.run(send_turns(server, ["x"]))
            asyncio.run(wait_dead(server, 1))
            out = subprocess.run([sys.executable, "-m", "sessionloop", "webhooks", "dead-letters", "--data",
                                  server.data_dir], capture_output=True, text=True, timeout=60)
            remote = ["--url", server.url, "--token", server.token]
            listed = subprocess.run([sys.executable, "-m", "sessionloop", "webhooks", "dead-letters", "--json",
                                     *remote], capture_output=True, text=True, timeout=60)
            receiver.status = 204
            replayed = subprocess.run([sys.executable, "-m", "sessionloop", "webhooks", "replay", "--all", *remote],
                                      capture_output=True, text=True, timeout=60)
            got = receiver.wait_for(1)
        finally:
            server.stop()
    assert out.returncode == 0, out.stderr
    assert f"msg_{sid}_" in out.stdout and "HTTP 500" in out.stdout
    (letter,) = json.loads(listed.stdout)
    assert letter["sessionId"] == sid and letter["error"] == "HTTP 500"
    assert replayed.returncode == 0 and "1 dead letter(s) queued" in replayed.stdout
    assert list(got) == [letter["id"]]


def test_sigkill_during_deliveries_loses_none_and_repeats_only_with_the_same_id(tmp_path):
    """20 times: turns committed, deliveries under way (a receiver that takes 30 ms), SIGKILL;
    then a last start delivers what was left. Every completed turn arrives; a repeat has the id
    and the body of the first delivery."""
    rng = random.Random(21)
    with Receiver(delay_s=0.03) as receiver:
        sids, owed_at_kill = [], 0
        for round_ in range(20):
            server = start(tmp_path, receiver.url, *ALLOW, *FAST)
            try:
                sids.append(asyncio.run(send_turns(server, [f"r{round_}-{i}" for i in range(4)])))
                time.sleep(rng.uniform(0, 0.15))
            finally:
                server.stop(signal.SIGKILL)
            owed_at_kill += len(receiver.delivered()) < 4 * len(sids)
        server = start(tmp_path, receiver.url, *ALLOW, *FAST)
        try:
            got = receiver.wait_for(80, timeout=60)
            store = open_store(os.path.join(server.data_dir, "store"), readonly=True)
            try:  # the repeats of what was delivered before a kill but not yet acknowledged, then none
                deadline = time.monotonic() + 30
                while store.read_outbox() and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert store.read_outbox() == [] and store.read_outbox(dead=True) == []
            finally:
                store.close()
        finally:
            server.stop()
        assert owed_at_kill > 0  # the kills landed while deliveries were owed
        store = open_store(os.path.join(server.data_dir, "store"), readonly=True)
        try:  # the indexes (the outbox among them) agree with the log
            assert store.audit() == []
        finally:
            store.close()
        assert len(got) == 80
        assert {m.json["data"]["sessionId"] for m in got.values()} == set(sids)
        bodies: dict[str, bytes] = {}
        for r in receiver.received:
            assert bodies.setdefault(r.id, r.body) == r.body
        assert sorted(m.json["data"]["outputText"] for m in got.values()) == sorted(
            f"echo: r{k}-{i}" for k in range(20) for i in range(4))


def test_with_two_workers_each_delivers_its_own_shards_once(tmp_path):
    """Sessions on both workers (a connection lands on either; a session runs on its shard's
    worker): every completed turn arrives exactly once, as each worker reads only its shards'
    outbox (were both to read every shard, each would also send the other's)."""

    async def drive(server: ServerProcess) -> list[str]:
        sids = []
        for n in range(12):
            async with open_client(server, BOT) as ws:
                c = await initialized(ws)
                sid = (await c.result("loop/create", {"containerId": "inbox"}))["sessionId"]
                for i in range(2):
                    await c.result("loop/send", {"sessionId": sid, "text": f"w{n}-{i}", "idempotencyKey": f"k{i}"})
                sids.append(sid)
        return sids

    with Receiver() as receiver:
        server = start(tmp_path, receiver.url, *ALLOW, "--workers", "2")
        try:
            sids = asyncio.run(drive(server))
            got = receiver.wait_for(24)
            time.sleep(1.0)  # time for a repeat to show
        finally:
            server.stop()
    assert {zlib.crc32(s.encode()) % 16 % 2 for s in sids} == {0, 1}
    assert len(got) == 24 and len(receiver.received) == 24
    assert {m.json["data"]["sessionId"] for m in got.values()} == set(sids)


def test_a_wrong_webhook_table_refuses_the_start_naming_the_app_and_never_the_secret(tmp_path):
    data = tmp_path / "data"
    os.makedirs(data)
    (data / "apps.toml").write_text(apps_toml("ftp://hooks.example/", events='["turn.done"]'))
    out = subprocess.run([sys.executable, "-m", "sessionloop", "serve", "--data", str(data), "--port", "0",
                          "--durability", "nosync"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "[apps.mybot]: app 'mybot': webhook: url must be http:// or https://" in out.stderr
    assert SECRET[6:] not in out.stderr + out.stdout


def test_a_tool_call_that_waits_for_an_approval_is_announced_as_approval_requested(tmp_path):
    path = tmp_path / "data"
    os.makedirs(path)

    async def ask(server: ServerProcess) -> str:
        async with open_client(server) as owner_ws, open_client(server, BOT) as ws:
            owner = await initialized(owner_ws)
            await owner.result("presence/update", {"active": True})  # someone is there to approve
            c = await initialized(ws)
            sid = (await c.result("loop/create", {"containerId": "inbox", "permissionMode": "ask"}))["sessionId"]
            await c.result("loop/send", {"sessionId": sid, "text": '!tool exec {"command": "echo hi"}',
                                         "idempotencyKey": "k"})
            await asyncio.to_thread(receiver.wait_for, 1)  # while the owner is still present
            return sid

    with Receiver() as receiver:
        (path / "apps.toml").write_text(apps_toml(receiver.url, events='["approval.requested"]'))
        server = ServerProcess(str(path), *ALLOW).start()
        try:
            sid = asyncio.run(ask(server))
            (message,) = receiver.wait_for(1).values()
        finally:
            server.stop()
    assert message.json["type"] == "approval.requested"
    data = message.json["data"]
    assert data["sessionId"] == sid and data["approvalId"] and data["callId"] and data["turnId"]
    assert Webhook(SECRET).verify(message.body, message.headers) == message.json
