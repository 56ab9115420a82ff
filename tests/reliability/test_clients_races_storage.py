"""RELIABILITY: slow and dead clients, races, storage faults and security, on real servers."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import subprocess
import sys

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.conftest import REPO
from tests.e2e.conftest import TOKEN, ServerProcess, initialized, open_client
from tests.reliability.harness import APP_TOKEN, app_client, prepare, result, start

pytestmark = pytest.mark.e2e


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_stalled_subscriber_and_vanished_clients_keep_memory_bounded_and_others_served(server_factory):
    server = server_factory("--max-outbox-mb", "1")
    pid = server.proc.pid

    async def go():
        async with open_client(server) as good_ws, open_client(server, max_queue=1) as stalled:
            good = await initialized(good_ws)
            await initialized(stalled)
            sid = (await good.result("session/create", {}))["session"]["id"]
            await stalled.send('{"jsonrpc":"2.0","id":99,"method":"session/subscribe","params":{"sessionId":"%s"}}' % sid)
            for _ in range(10):  # clients that vanish without closing (TCP reset)
                s = socket.create_connection(("127.0.0.1", server.port))
                s.sendall(b"GET /session HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                          b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()
            before = rss_kib(pid)
            latencies = []
            for i in range(80):
                text = base64.b64encode(os.urandom(20_000)).decode()
                t = asyncio.get_running_loop().time()
                await good.result("turn/send", {"sessionId": sid, "content": text})
                latencies.append(asyncio.get_running_loop().time() - t)
            return before, rss_kib(pid), sorted(latencies)[len(latencies) // 2]
    before, after, median = asyncio.run(go())
    print(f"\nstalled subscriber: RSS {before // 1024} MiB -> {after // 1024} MiB, healthy median {median * 1000:.1f} ms")
    assert after - before < 50 * 1024  # RELIABILITY: RSS growth <= 50 MB
    assert median < 0.5


def test_the_same_key_from_ten_connections_at_once_makes_exactly_one_turn(tmp_path):
    data = str(tmp_path / "data")
    prepare(data)
    server = start(data)
    try:
        async def go():
            ws, c = await app_client(server)
            sid = (await result(c, "loop/create", {"containerId": "inbox"}))["sessionId"]
            clients = [await app_client(server) for _ in range(10)]

            async def send(cl):
                return await result(cl[1], "loop/send", {"sessionId": sid, "text": "once", "idempotencyKey": "k"})

            receipts = await asyncio.gather(*(send(cl) for cl in clients))
            done = await result(c, "loop/waitForTurn", {"sessionId": sid, "turnId": receipts[0]["turnId"]})
            events = await result(c, "loop/listEvents", {"sessionId": sid})
            for w, _ in clients:
                await w.close()
            await ws.close()
            return receipts, done, events
        receipts, done, events = asyncio.run(go())
    finally:
        server.stop()
    assert len({r["turnId"] for r in receipts}) == 1
    assert sorted(r["state"] for r in receipts).count("duplicate") == 9
    assert done["state"] == "completed"
    assert [e["type"] for e in events["events"]].count("turn.started") == 1


def test_abort_racing_turn_completion_ends_the_turn_exactly_once(server):
    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": sid})
            outcomes = []
            for i in range(15):
                await c.result("turn/send", {"sessionId": sid, "content": f"!sleep {i % 5}\nrace {i}"})
                await asyncio.sleep(0.002 * (i % 4))
                reply = await c.call("turn/abort", {"sessionId": sid})
                assert "result" in reply or reply["error"]["data"]["code"] == "expected-turn-mismatch"
                done = await c.turn_done(sid)
                outcomes.append(done["params"]["item"]["outcome"])
            return outcomes
    outcomes = asyncio.run(go())
    assert len(outcomes) == 15 and set(outcomes) <= {"replied", "aborted"}


def test_a_second_server_on_the_same_data_directory_is_refused_with_a_clear_message(server):
    proc = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--data", server.data_dir, "--port", "0",
                           "--token", TOKEN], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "already open for writing by another process" in proc.stderr and proc.stderr.count("\n") <= 2


def test_an_app_cannot_read_another_apps_sessions_events_or_files(tmp_path):
    data = str(tmp_path / "data")
    prepare(data)
    with open(os.path.join(data, "apps.toml"), "a") as f:
        f.write('\n[apps.spy]\ntoken = "spy-token"\nplatform = "x"\ncontainers = ["inbox"]\n')
    server = start(data)
    png = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"1" * 16).decode()
    try:
        async def go():
            ws, bot = await app_client(server)
            sid = (await result(bot, "loop/create", {"containerId": "inbox"}))["sessionId"]
            r = await result(bot, "loop/send", {"sessionId": sid, "text": "secret", "idempotencyKey": "s",
                                                "attachments": [{"data": png, "name": "p.png"}]})
            await result(bot, "loop/waitForTurn", {"sessionId": sid, "turnId": r["turnId"]})
            snap = await result(bot, "session/subscribe", {"sessionId": sid})
            handle = next(i for i in snap["items"] if i["kind"] == "user-message")["attachments"][0]["src"]
            spy_ws = await connect(server.url, additional_headers={"Authorization": "Bearer spy-token"})
            from tests.e2e.conftest import Client

            spy = Client(spy_ws)
            await spy.result("initialize", {"protocolVersion": "0.2.0", "client": {"name": "spy", "version": "1"}})
            events = await spy.call("loop/listEvents", {"sessionId": sid})
            feed = await spy.result("loop/listEvents", {})
            history = await spy.call("session/history", {"sessionId": sid})
            await spy_ws.close()
            await ws.close()
            return sid, handle, events, feed, history
        sid, handle, events, feed, history = asyncio.run(go())
        base = f"http://127.0.0.1:{server.port}/api/session-file"
        ok = httpx.get(base, params={"sessionId": sid, "handle": handle}, headers={"Authorization": f"Bearer {APP_TOKEN}"})
        stolen = httpx.get(base, params={"sessionId": sid, "handle": handle}, headers={"Authorization": "Bearer spy-token"})
    finally:
        server.stop()
    assert events["error"]["data"]["code"] == "not-found" and feed["events"] == []
    assert history["error"]["data"]["code"] == "not-found"
    assert ok.status_code == 200 and stolen.status_code == 404


def _mount_tmpfs(path: str, size: str) -> bool:
    os.makedirs(path, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                          capture_output=True).returncode == 0


def test_a_full_disk_refuses_writes_with_internal_error_writes_nothing_and_recovers(tmp_path):
    """A real full disk: the data directory on a small tmpfs. Where this machine cannot mount one,
    the same failure is injected at the store boundary (SESSIONLOOP_CRASH_AT has no such point, so
    the tmpfs is the only route); without permission to mount we fail loudly rather than skip."""
    mount = str(tmp_path / "small")
    assert _mount_tmpfs(mount, "3m"), "this test needs to mount a tmpfs (root); .ci/run runs as root"
    try:
        server = ServerProcess(mount, "--durability", "sync").start()
        try:
            async def fill():
                async with open_client(server) as ws:
                    c = await initialized(ws)
                    sid = (await c.result("session/create", {}))["session"]["id"]
                    big = "x" * 90_000
                    errors, ok = [], 0
                    for _ in range(80):
                        reply = await c.call("turn/send", {"sessionId": sid, "content": big})
                        if "error" in reply:
                            errors.append(reply["error"])
                            break
                        ok += 1
                    listed = await c.result("sessions/list", {})  # reads still work
                    return sid, ok, errors, listed
            sid, ok, errors, listed = asyncio.run(fill())
            assert errors and errors[0]["code"] == -32603 and ("full" in errors[0]["message"] or "space" in errors[0]["message"])
            assert [s["id"] for s in listed["sessions"]] == [sid]
            subprocess.run(["mount", "-o", "remount,size=64m", mount], check=True)

            async def after():
                async with open_client(server, max_size=None) as ws:
                    c = await initialized(ws)
                    await c.result("session/subscribe", {"sessionId": sid})
                    assert await c.result("turn/send", {"sessionId": sid, "content": "room again"}) == {}
                    return await c.turn_done(sid, 20)
            assert asyncio.run(after())["params"]["item"]["kind"] == "turn"
        finally:
            server.stop()
    finally:
        subprocess.run(["umount", "-l", mount], capture_output=True)
