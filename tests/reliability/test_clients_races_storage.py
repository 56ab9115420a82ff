"""RELIABILITY: slow and dead clients, races, storage faults and security, on real servers."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from tests.conftest import REPO
from tests.e2e.conftest import TOKEN, Client, ServerProcess, initialized, open_client
from tests.reliability.harness import (
    APP_TOKEN,
    Op,
    Recorder,
    app_client,
    audit,
    call,
    prepare,
    result,
    rss_kib,
    start,
)

pytestmark = pytest.mark.e2e


def test_a_stalled_subscriber_and_vanished_clients_keep_memory_bounded_and_others_served(server_factory):
    server = server_factory("--max-outbox-mb", "1")
    pid = server.proc.pid

    async def go():
        async with open_client(server) as good_ws, open_client(server, max_queue=1) as stalled:
            good = await initialized(good_ws)
            await initialized(stalled)
            sid = (await good.result("session/create", {}))["session"]["id"]
            await stalled.send('{"jsonrpc":"2.0","id":99,"method":"session/subscribe","params":{"sessionId":"'
                               + sid + '"}}')
            for _ in range(10):  # clients that vanish without closing (TCP reset)
                s = socket.create_connection(("127.0.0.1", server.port))
                s.sendall(b"GET /session HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                          b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()
            before = rss_kib(pid)
            latencies = []
            for _ in range(80):
                text = base64.b64encode(os.urandom(20_000)).decode()
                t = asyncio.get_running_loop().time()
                await good.result("turn/send", {"sessionId": sid, "content": text})
                latencies.append(asyncio.get_running_loop().time() - t)
            return before, rss_kib(pid), sorted(latencies)[len(latencies) // 2]
    before, after, median = asyncio.run(go())
    print(f"\nstalled subscriber: RSS {before // 1024} MiB -> {after // 1024} MiB, "
          f"healthy median {median * 1000:.1f} ms")
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
    proc = subprocess.run([sys.executable, "-m", "sessionloop", "serve", "--data", server.data_dir, "--port", "0",
                           "--token", TOKEN], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "already open for writing by another process" in proc.stderr and proc.stderr.count("\n") <= 2


def test_an_app_cannot_read_another_apps_sessions_events_or_files(tmp_path):
    data = str(tmp_path / "data")
    prepare(data)
    with open(os.path.join(data, "apps.toml"), "a") as f:
        f.write('\n[apps.spy]\ntoken = "spy-token-for-the-reliability-tests"\nplatform = "x"\ncontainers = ["inbox"]\n')
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
            spy_ws = await connect(server.url,
                                   additional_headers={"Authorization": "Bearer spy-token-for-the-reliability-tests"})

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
        where = {"sessionId": sid, "handle": handle}
        ok = httpx.get(base, params=where, headers={"Authorization": f"Bearer {APP_TOKEN}"})
        stolen = httpx.get(base, params=where, headers={"Authorization": "Bearer spy-token-for-the-reliability-tests"})
    finally:
        server.stop()
    assert events["error"]["data"]["code"] == "not-found" and feed["events"] == []
    assert history["error"]["data"]["code"] == "not-found"
    assert ok.status_code == 200 and stolen.status_code == 404


def _mount_tmpfs(path: str, size: str) -> bool:
    os.makedirs(path, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                          capture_output=True).returncode == 0


def turns_open(data_dir: str, sessions: list[str]) -> dict[str, set[str]]:
    """Turns started and not (yet) ended, per session, read from the log beside the running server."""
    store = open_store(os.path.join(data_dir, "store"), readonly=True)
    try:
        open_turns: dict[str, set[str]] = {}
        for sid in sessions:
            for e in store.read_stream(f"session-{sid}"):
                if isinstance(e.event, E.TurnStarted):
                    open_turns.setdefault(sid, set()).add(e.event.turn_id)
                elif isinstance(e.event, (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)):
                    open_turns.get(sid, set()).discard(e.event.turn_id)
        return {sid: t for sid, t in open_turns.items() if t}
    finally:
        store.close()


def audit_whole_store(data_dir: str) -> dict[str, int]:
    """What harness.audit checks for the sessions it is given, over every stream of the store: the
    log's positions have no hole; each stream's versions run 1..n in log order and its index
    (stream_version, read_stream) agrees with the log; every keyed input has its idempotency receipt
    (committed together, so one without the other is a half-written commit); every turn started
    once, after its input."""
    store = open_store(os.path.join(data_dir, "store"), readonly=True)
    try:
        versions: dict[str, list[int]] = {}
        positions: list[int] = []
        inputs: dict[str, set[str]] = {}
        for e in store.iter_all():
            positions.append(e.position)
            versions.setdefault(e.stream, []).append(e.version)
            ev = e.event
            if isinstance(ev, E.InputAccepted):
                inputs.setdefault(e.stream, set()).add(ev.turn_id)
                if ev.idempotency_key:
                    app = ev.speaker.app_id if ev.speaker else None
                    scope = f"app:{app}:{e.stream.removeprefix('session-')}"
                    assert store.get_receipt(scope, ev.idempotency_key) is not None, \
                        f"{e.stream} v{e.version}: an input without its idempotency receipt"
            elif isinstance(ev, E.TurnStarted):
                assert ev.turn_id in inputs.get(e.stream, set()), f"{e.stream} v{e.version}: a turn without its input"
        assert positions == list(range(positions[0], positions[0] + len(positions))), "a hole in the log"
        for stream, vs in versions.items():
            assert vs == list(range(1, len(vs) + 1)), f"{stream}: versions {vs[:5]}... not contiguous"
            indexed = store.stream_version(stream)
            assert indexed == len(vs), f"{stream}: the index says version {indexed}, the log {len(vs)}"
            assert [e.version for e in store.read_stream(stream)] == vs
        return {"streams": len(versions), "events": len(positions)}
    finally:
        store.close()


def test_a_full_disk_refuses_writes_with_storage_unavailable_writes_nothing_and_recovers(tmp_path):
    """A real full disk: the data directory on a small tmpfs. Where this machine cannot mount one,
    the same failure is injected at the store boundary (SESSIONLOOP_CRASH_AT has no such point, so
    the tmpfs is the only route); without permission to mount we fail loudly rather than skip.
    Afterwards the store is audited: nothing half-written (RELIABILITY lmdb_growth_and_disk_full)."""
    mount = str(tmp_path / "small")
    assert _mount_tmpfs(mount, "3m"), "this test needs to mount a tmpfs (root); .ci/run runs as root"
    try:
        prepare(mount)  # an app too: its inputs carry idempotency keys, committed with their receipts
        server = ServerProcess(mount, "--durability", "sync").start()
        rec = Recorder()
        try:
            async def fill():
                app_ws, app = await app_client(server)
                app_sid = (await result(app, "loop/create", {"containerId": "inbox"}))["sessionId"]
                rec.sessions.append(app_sid)
                for k in range(3):
                    op = Op(app_sid, f"before-{k}", f"keyed {k}")
                    op.receipt = await result(app, "loop/send", {"sessionId": app_sid, "text": op.text,
                                                                 "idempotencyKey": op.key})
                    rec.ops.append(op)
                async with open_client(server) as ws:
                    c = await initialized(ws)
                    sid = (await c.result("session/create", {}))["session"]["id"]
                    rec.sessions.append(sid)
                    errors, ok = [], 0
                    for k in range(80):  # each text unique, to count them in the log
                        reply = await c.call("turn/send", {"sessionId": sid, "content": f"{k:02d}" + "x" * 90_000})
                        if "error" in reply:
                            errors.append(reply["error"])
                            break
                        ok += 1
                    listed = await c.result("sessions/list", {})  # reads still work
                # keyed inputs while the disk is full, until one is refused: nothing is stored under its key
                for k in range(20):
                    full = Op(app_sid, f"while-full-{k}", "y" * 90_000)
                    refused = await app.call("loop/send", {"sessionId": app_sid, "text": full.text,
                                                           "idempotencyKey": full.key})
                    if "result" not in refused or refused["result"]["state"] == "rejected":
                        break
                    full.receipt = refused["result"]
                    rec.ops.append(full)
                await app_ws.close()
                return sid, ok, errors, listed, full, refused
            sid, ok, errors, listed, full, refused = asyncio.run(fill())
            first = errors[0] if errors else {}
            assert first.get("code") == -32000 and first["data"]["code"] == "storage-unavailable", errors
            assert first["data"]["reason"] == "full" and "full" in first["message"], errors
            assert sorted(s["id"] for s in listed["sessions"]) == sorted(rec.sessions)  # the owner sees the room too
            assert "error" in refused and refused["error"]["data"]["code"] == "storage-unavailable", refused
            data = refused["error"]["data"]
            assert data["outcome"] == "not-written" and data["retryAfterMs"] > 0, refused
            subprocess.run(["mount", "-o", "remount,size=64m", mount], check=True)

            async def after():
                async with open_client(server, max_size=None) as ws:
                    c = await initialized(ws)
                    await c.result("session/subscribe", {"sessionId": sid})
                    assert await c.result("turn/send", {"sessionId": sid, "content": "room again"}) == {}
                    done = await c.turn_done(sid, 20)
                app_ws, app = await app_client(server)
                # the refused key sent again: a new input (the refused one left nothing behind)
                full.receipt = await result(app, "loop/send", {"sessionId": full.session_id, "text": full.text,
                                                               "idempotencyKey": full.key})
                rec.ops.append(full)
                await app_ws.close()
                return done
            assert asyncio.run(after())["params"]["item"]["kind"] == "turn"
            assert full.receipt["state"] in ("accepted", "queued"), full.receipt
            # every turn started ends (the server resumes what the full disk interrupted)
            deadline = time.monotonic() + 30
            while (still := turns_open(mount, rec.sessions)) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not still, f"turns started before the disk filled never ended: {still}"
            counts = audit(mount, rec)  # the harness's checks: one input per key, receipts, turns ended
            whole = audit_whole_store(mount)
            # the refused turn/send wrote nothing: the owner's inputs are exactly those acknowledged
            # before it, in order, and the one after the remount
            store = open_store(os.path.join(mount, "store"), readonly=True)
            try:
                owner_inputs = [e.event.text[:2] for e in store.read_stream(f"session-{sid}")
                                if isinstance(e.event, E.InputAccepted)]
            finally:
                store.close()
            assert owner_inputs == [f"{k:02d}" for k in range(ok)] + ["ro"], owner_inputs
            print(f"\ndisk full after {ok} inputs; audit {counts}, {whole}")
        finally:
            server.stop()
    finally:
        subprocess.run(["umount", "-l", mount], capture_output=True)


def _stored_inputs(data_dir: str, sessions: list[str]) -> dict[str, list[tuple[str, str]]]:
    """Per idempotency key, the (session, turn id) of every input stored under it, read beside
    the running server."""
    store = open_store(os.path.join(data_dir, "store"), readonly=True)
    try:
        found: dict[str, list[tuple[str, str]]] = {}
        for sid in sessions:
            for e in store.read_stream(f"session-{sid}"):
                if isinstance(e.event, E.InputAccepted) and e.event.idempotency_key:
                    found.setdefault(e.event.idempotency_key, []).append((sid, e.event.turn_id))
        return found
    finally:
        store.close()


def test_on_a_full_disk_an_input_answered_storage_unavailable_is_not_stored_and_its_retry_makes_one_turn(tmp_path):
    """The issue's adversarial run, on a real small tmpfs: bots send keyed inputs concurrently
    until the disk refuses them. Every input answered with an error must be absent (a client
    that trusts the error and sends the text again under a new key must not get two turns);
    every receipt must be in the store; the error is ``storage-unavailable`` with
    ``retryAfterMs``, logged by the server with the session id. Snapshots are due often, as
    they are after 500 events of a busy session: before the fix a snapshot the full disk refused
    after the input had committed turned the input's answer into "write failed"."""
    mount = str(tmp_path / "small")
    assert _mount_tmpfs(mount, "12m"), "this test needs to mount a tmpfs (root); .ci/run runs as root"
    try:
        prepare(mount)
        server = ServerProcess(mount, "--durability", "sync", "--snapshot-every", "60").start()
        rec = Recorder()
        refused: list[tuple[Op, dict]] = []
        try:
            async def fill(bots: int = 4, refusals_each: int = 3) -> None:
                ws, c = await app_client(server)
                for _ in range(2):
                    rec.sessions.append((await result(c, "loop/create", {"containerId": "inbox"}))["sessionId"])
                await ws.close()

                async def bot(b: int) -> None:
                    ws, c = await app_client(server)
                    mine = 0
                    for j in range(4000):
                        op = Op(rec.sessions[(b + j) % 2], f"b{b}-m{j}", f"b{b}-m{j} " + "y" * 3000)
                        reply = await call(c, "loop/send", {"sessionId": op.session_id, "text": op.text,
                                                            "idempotencyKey": op.key})
                        if "error" in reply:
                            refused.append((op, reply["error"]))
                            mine += 1
                            if mine == refusals_each:
                                break
                            continue
                        op.receipt = reply["result"]
                        rec.ops.append(op)
                    await ws.close()

                await asyncio.gather(*(bot(b) for b in range(bots)))
            asyncio.run(fill())
            assert len(refused) == 12, f"the disk never filled: {len(refused)} refusals"
            for _op, error in refused:
                assert error["code"] == -32000 and error["data"]["code"] == "storage-unavailable", error
                assert error["data"]["outcome"] == "not-written" and error["data"]["retryAfterMs"] > 0, error
                assert mount not in error["message"], "the client's message names no server path"
            subprocess.run(["mount", "-o", "remount,size=256m", mount], check=True)
            stored = _stored_inputs(mount, rec.sessions)
            wrongly = [op.key for op, _ in refused if op.key in stored]
            assert not wrongly, f"inputs answered with an error are stored: {wrongly}"
            assert all(op.key in stored for op in rec.acknowledged()), "an acknowledged input is missing"

            async def retry() -> list[dict]:
                ws, c = await app_client(server)
                done = []
                for op, _ in refused:  # the same key, sent again once there is room: one turn each
                    op.receipt = await result(c, "loop/send", {"sessionId": op.session_id, "text": op.text,
                                                               "idempotencyKey": op.key})
                    rec.ops.append(op)
                    done.append(await result(c, "loop/waitForTurn", {"sessionId": op.session_id,
                                                                     "turnId": op.receipt["turnId"]}))
                await ws.close()
                return done
            done = asyncio.run(retry())
            assert [op.receipt["state"] for op, _ in refused] == ["accepted"] * len(refused)
            assert [d["state"] for d in done] == ["completed"] * len(refused)
            stored = _stored_inputs(mount, rec.sessions)
            assert all(len(stored[op.key]) == 1 for op, _ in refused)
            counts = audit(mount, rec)  # one input per key, receipts, every turn started once and ended
            whole = audit_whole_store(mount)
        finally:
            server.stop()
        with open(server.log.name) as f:
            log_text = f.read()
        for sid in {op.session_id for op, _ in refused}:
            line = rf"WARNING .*session {sid}: Send refused, the event store is unavailable"
            assert re.search(line, log_text), f"no warning with session {sid} in the server's log"
        assert APP_TOKEN not in log_text and TOKEN not in log_text
        print(f"\n{len(refused)} inputs refused on a full disk, none stored; retried: one turn each; "
              f"{counts}, {whole}")
    finally:
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
