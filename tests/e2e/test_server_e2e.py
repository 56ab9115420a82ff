"""The server end to end: a real subprocess, real sockets, the seed's methods and rules."""

from __future__ import annotations

import asyncio
import base64
import json
import os

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.e2e.conftest import TOKEN, initialized, open_client

pytestmark = pytest.mark.e2e


def run(coro):
    return asyncio.run(coro)


def test_health_and_metrics_answer_over_http(server):
    health = httpx.get(f"http://127.0.0.1:{server.port}/healthz").json()
    assert health["status"] == "ok" and health["epoch"] == server.epoch and health["durability"] == "nosync"
    metrics = httpx.get(f"http://127.0.0.1:{server.port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert "sessionloop_store_info" in metrics and 'durability="nosync"' in metrics


@pytest.mark.parametrize("headers, status", [
    ({}, 401), ({"Authorization": "Bearer wrong"}, 401),
    ({"Authorization": f"Bearer {TOKEN}", "Origin": "http://evil.test"}, 403),
])
def test_a_missing_or_wrong_token_or_a_foreign_origin_is_refused_before_the_upgrade(server, headers, status):
    async def go():
        with pytest.raises(InvalidStatus) as info:
            async with connect(server.url, additional_headers=headers):
                pass
        return info.value.response.status_code
    assert run(go()) == status


def test_the_token_is_accepted_in_the_query_and_the_surface_is_reported(server):
    async def go():
        async with connect(f"{server.url}?token={TOKEN}&surface=webui") as ws:
            client = await initialized(ws)
            return client
    async def handshake():
        async with connect(f"{server.url}?token={TOKEN}&surface=webui") as ws:
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                      "params": {"protocolVersion": "0.2.0", "client": {"name": "x", "version": "1"}}}))
            return json.loads(await ws.recv())["result"]
    result = run(handshake())
    assert result["surface"] == "webui" and result["identity"] == {"platform": "console", "userId": "owner"}
    assert result["features"] == {"send": True, "rewind": True, "compress": True, "settings": True}


def test_an_incompatible_version_is_refused_with_unsupported_then_the_connection_closes(server):
    async def go():
        async with open_client(server) as ws:
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                      "params": {"protocolVersion": "1.0",
                                                 "client": {"name": "old", "version": "0.20"}}}))
            reply = json.loads(await ws.recv())
            await ws.wait_closed()
            return reply, ws.close_code
    reply, code = run(go())
    assert reply["error"]["data"]["code"] == "unsupported" and "1.0" in reply["error"]["message"]
    assert code is not None


def test_a_turn_streams_items_with_increasing_seq_after_the_snapshot(server):
    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {"name": "demo"}))["session"]["id"]
            snap = await c.result("session/subscribe", {"sessionId": sid})
            assert await c.result("turn/send", {"sessionId": sid, "content": "  hello  "}) == {}
            turn = await c.turn_done(sid)
            return snap, c.pushes + [turn]
    snap, pushes = run(go())
    assert snap["epoch"] == server.epoch and snap["items"] == []
    seqs = [p["params"]["seq"] for p in pushes]
    assert seqs == sorted(seqs) and all(s > snap["seq"] for s in seqs)
    kinds = [(p["method"], p["params"]["item"]["kind"]) for p in pushes if "item" in p["params"]]
    assert ("item/completed", "user-message") in kinds and ("item/completed", "agent-message") in kinds
    agent = [p["params"]["item"] for p in pushes if p["method"] == "item/completed"
             and p["params"]["item"]["kind"] == "agent-message"][0]
    assert agent["text"] == "echo: hello"
    user = [p["params"]["item"] for p in pushes if p["params"].get("item", {}).get("kind") == "user-message"][0]
    assert user["text"] == "hello"  # trimmed (seed: 文字去掉首尾空白)


def test_an_empty_message_is_invalid_params(server):
    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            return await c.call("turn/send", {"sessionId": sid, "content": "   "})
    reply = run(go())
    assert reply["error"]["code"] == -32602


def test_streaming_deltas_arrive_for_a_slow_model_and_abort_stops_the_turn(server):
    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": sid})
            await c.result("turn/send", {"sessionId": sid, "content": "!sleep 2000\nslow answer here"})
            first = await c.push(lambda m: m["method"] in ("item/delta", "item/started")
                                 and m["params"].get("item", {}).get("kind", "agent-message") == "agent-message")
            assert first["method"] == "item/started"  # seed 004: started, then deltas
            delta = await c.push(lambda m: m["method"] == "item/delta")
            assert delta["params"]["itemId"] == first["params"]["item"]["itemId"]
            turn_started = await c.push(lambda m: m["method"] == "item/started"
                                        and m["params"]["item"]["kind"] == "turn")
            wrong = await c.call("turn/abort", {"sessionId": sid, "turnId": "not-this-one"})
            turn_id = turn_started["params"]["item"]["itemId"]
            assert await c.result("turn/abort", {"sessionId": sid, "turnId": turn_id}) == {}
            done = await c.turn_done(sid)
            return delta, wrong, done
    delta, wrong, done = run(go())
    assert delta["params"]["text"]
    assert wrong["error"]["data"]["code"] == "expected-turn-mismatch"
    assert done["params"]["item"]["outcome"] == "aborted"


def test_list_rename_archive_unarchive_delete_and_history(server):
    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            a = (await c.result("session/create", {"name": "alpha"}))["session"]["id"]
            b = (await c.result("session/create", {"name": "beta"}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": a})
            await c.result("turn/send", {"sessionId": a, "content": "one"})
            await c.turn_done(a)
            await c.result("session/rename", {"sessionId": a, "title": "Alpha!"})
            listed = await c.result("sessions/list", {})
            found = await c.result("sessions/list", {"query": "alpha"})
            await c.result("session/archive", {"sessionId": b})
            after_archive = await c.result("sessions/list", {})
            archived = await c.result("sessions/list", {"archived": True})
            await c.result("session/unarchive", {"sessionId": b})
            history = await c.result("session/history", {"sessionId": a})
            await c.result("session/delete", {"sessionId": b})
            gone = await c.call("session/subscribe", {"sessionId": b})
            final = await c.result("sessions/list", {})
            bad_cursor = await c.call("sessions/list", {"cursor": "!!!"})
            return a, b, listed, found, after_archive, archived, history, gone, final, bad_cursor
    a, b, listed, found, after_archive, archived, history, gone, final, bad_cursor = run(go())
    assert {s["id"] for s in listed["sessions"]} == {a, b}
    assert [s["id"] for s in found["sessions"]] == [a] and found["sessions"][0]["title"] == "Alpha!"
    assert [s["id"] for s in after_archive["sessions"]] == [a]
    assert [s["id"] for s in archived["sessions"]] == [b]
    assert [i["kind"] for i in history["items"]].count("agent-message") == 1
    assert gone["error"]["data"]["code"] == "not-found"
    assert [s["id"] for s in final["sessions"]] == [a]
    assert bad_cursor["error"]["code"] == -32602


def test_sessions_watch_pushes_changes(server):
    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            await c.result("sessions/watch", {})
            sid = (await c.result("session/create", {"name": "watched"}))["session"]["id"]
            change = await c.push(lambda m: m["method"] == "sessions/changed"
                                  and any(s["id"] == sid for s in m["params"]["upserts"]))
            return sid, change
    sid, change = run(go())
    assert change["params"]["removes"] == [] and "groups" in change["params"]


def test_attachments_are_sniffed_stored_and_downloadable_with_a_signed_handle(server):
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    data_url = "data:video/mp2t;base64," + base64.b64encode(png).decode()

    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            other = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": sid})
            await c.result("turn/send", {"sessionId": sid, "content": "look",
                                         "attachments": [{"data": data_url, "name": "pic.ts"}]})
            user = await c.push(lambda m: m["method"] == "item/completed"
                                and m["params"]["item"]["kind"] == "user-message")
            bad = await c.call("turn/send", {"sessionId": sid, "content": "x",
                                             "attachments": [{"data": "https://x/y.png", "name": "y"}]})
            return sid, other, user["params"]["item"]["attachments"][0], bad
    sid, other, att, bad = run(go())
    assert att["kind"] == "image" and att["name"] == "pic.ts"
    handle = att["src"]
    base = f"http://127.0.0.1:{server.port}/api/session-file"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    ok = httpx.get(base, params={"sessionId": sid, "handle": handle}, headers=auth)
    assert ok.status_code == 200 and ok.content == png
    assert ok.headers["content-type"] == "application/octet-stream"
    assert "attachment" in ok.headers["content-disposition"]
    assert httpx.get(base, params={"sessionId": other, "handle": handle}, headers=auth).status_code == 404
    forged = handle[:-2] + ("A" if handle[-2] != "A" else "B") + handle[-1]
    assert httpx.get(base, params={"sessionId": sid, "handle": forged}, headers=auth).status_code == 404
    assert httpx.get(base, params={"sessionId": sid, "handle": handle}).status_code == 401
    assert bad["error"]["code"] == -32602


def test_a_restart_changes_the_epoch_and_a_resubscribe_gets_the_history(server_factory, tmp_path):
    first = server_factory()

    async def one():
        async with open_client(first) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": sid})
            await c.result("turn/send", {"sessionId": sid, "content": "persist me"})
            await c.turn_done(sid)
            return sid
    sid = run(one())
    first.stop()
    second = server_factory(data_dir=first.data_dir)
    assert second.epoch == first.epoch + 1

    async def two():
        async with open_client(second) as ws:
            c = await initialized(ws)
            return await c.result("session/subscribe", {"sessionId": sid})
    snap = run(two())
    assert snap["epoch"] == second.epoch
    assert [i["text"] for i in snap["items"] if i["kind"] == "agent-message"] == ["echo: persist me"]


def test_bad_frames_get_errors_while_another_connection_keeps_working(server):
    async def go():
        async with open_client(server) as bad, open_client(server) as good:
            g = await initialized(good)
            sid = (await g.result("session/create", {}))["session"]["id"]
            await initialized(bad)
            replies = []
            frames = ["not json", "[]", "{}", '{"jsonrpc":"2.0","id":1}', '{"jsonrpc":"2.0","id":2,"method":"nope"}',
                      '{"jsonrpc":"2.0","id":3,"method":"turn/send","params":{"sessionId":5}}', "\xff" * 10,
                      "[" * 5000 + "]" * 5000]
            for i in range(200):
                await bad.send(frames[i % len(frames)])
                replies.append(json.loads(await asyncio.wait_for(bad.recv(), 10)))
                if i % 20 == 0:
                    assert await g.result("session/rename", {"sessionId": sid, "title": f"t{i}"}) == {}
            return replies
    replies = run(go())
    assert len(replies) == 200 and all("error" in r and r["jsonrpc"] == "2.0" for r in replies)
    codes = {r["error"]["code"] for r in replies}
    assert {-32700, -32600, -32601, -32602} <= codes


def test_a_client_that_never_reads_is_closed_as_a_slow_consumer_and_others_are_unaffected(server_factory):
    server = server_factory("--max-outbox-mb", "0.5")

    async def go():
        async with open_client(server, max_queue=1) as slow, open_client(server) as good:
            s = await initialized(slow)
            g = await initialized(good)
            sid = (await g.result("session/create", {}))["session"]["id"]
            await s.result("session/subscribe", {"sessionId": sid})
            for _ in range(120):  # incompressible text: ~100 kB of pushes per turn
                text = base64.b64encode(os.urandom(30_000)).decode()
                await g.result("turn/send", {"sessionId": sid, "content": text})
            still = await g.result("session/rename", {"sessionId": sid, "title": "still fine"})
            # the slow client finally reads: what it finds at the end is the server's close frame
            received = 0
            try:
                async for _ in slow:
                    received += 1
            except ConnectionClosed:
                pass
            return slow.close_code, slow.close_reason, still
    code, reason, still = run(go())
    assert code == 4008 and "slow consumer" in reason
    assert still == {}


def test_sigterm_stops_the_server_cleanly(server):
    assert server.stop() == 0


def test_a_stopping_server_turns_every_feature_off_before_it_closes_the_connection(server):
    """Seed 004: when the services behind the feature bits go away, each connection gets
    features/changed; then the close is 1001 (going away)."""

    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            await c.result("session/create", {})
            stopper = asyncio.get_running_loop().run_in_executor(None, server.stop)
            changed = await c.push(lambda m: m["method"] == "features/changed", timeout=10)
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            except ConnectionClosed as e:
                code = e.rcvd.code if e.rcvd is not None else None
            return changed, code, await stopper

    changed, code, exit_code = run(go())
    assert changed["params"]["features"] == {"send": False, "rewind": False, "compress": False, "settings": False}
    assert code == 1001
    assert exit_code == 0
