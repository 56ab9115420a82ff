"""Seed 004 turn control, increments and snapshots over the wire: what ``session/compress``
refuses and when it fails, token accounting pushed with every model call, the usage a session
without any gets after its snapshot, ``maxSteps`` without a limit (``serve --max-steps
unlimited``), archived sessions that run a turn, and the approvals a snapshot carries.

Real ``sessionloop serve`` subprocesses on 127.0.0.1 port 0 and real WebSocket clients. A
compaction is held open by the mock's ``!sleep`` in an earlier user message: the summary call
reads the transcript, where that line is a directive again. One server is shared by the tests
that need no options; each makes its own sessions and closes its connections.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from tests.e2e.conftest import Client, ServerProcess, open_client

pytestmark = pytest.mark.e2e

INTERNAL_ERROR = -32603
HOLD_MS = 1500  # how long the summary call of a compaction takes (the mock's !sleep)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    server = ServerProcess(str(tmp_path_factory.mktemp("turn-control") / "data")).start()
    yield server
    server.stop()


class Calls(Client):
    """A client with several requests in flight: a reply that comes while it waits for another
    one (or for a push) is kept for :meth:`reply`, not dropped."""

    def __init__(self, ws: Any) -> None:
        super().__init__(ws)
        self.replies: dict[Any, dict[str, Any]] = {}

    async def reply(self, rid: Any, timeout: float = 10) -> dict[str, Any]:
        for i, kept in enumerate(self.pushes):  # ``push`` keeps what it read past, replies too
            if "method" not in kept and kept.get("id") == rid:
                return self.pushes.pop(i)
        if rid in self.replies:
            return self.replies.pop(rid)
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            if "method" in msg:
                self.pushes.append(msg)
            elif msg.get("id") == rid:
                return msg
            else:
                self.replies[msg.get("id")] = msg


async def initialized(ws: Any) -> Calls:
    client = Calls(ws)
    await client.result("initialize", {"protocolVersion": "0.2.0", "client": {"name": "e2e", "version": "1"}})
    return client


async def new_session(c: Client, name: str, **params: Any) -> str:
    sid = (await c.result("session/create", {"name": name, **params}))["session"]["id"]
    await c.result("session/subscribe", {"sessionId": sid})
    return sid


async def turn(c: Client, sid: str, content: str) -> dict[str, Any]:
    await c.result("turn/send", {"sessionId": sid, "content": content})
    return (await c.turn_done(sid, timeout=15))["params"]["item"]


async def slow_history(c: Client, name: str) -> str:
    """A session whose compaction's summary call takes HOLD_MS."""
    sid = await new_session(c, name)
    await turn(c, sid, f"first\n!sleep {HOLD_MS}")
    return sid


async def send_raw(c: Client, rid: int, method: str, params: dict[str, Any]) -> None:
    """A request whose reply is awaited later (``c.reply(rid)``): two requests in flight at once."""
    await c.ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))


def compress_notices(items_or_pushes: list[dict[str, Any]], sid: str | None = None) -> list[dict[str, Any]]:
    out = []
    for entry in items_or_pushes:
        if "method" in entry:
            if entry["method"] != "item/completed" or entry["params"].get("sessionId") != sid:
                continue
            entry = entry["params"]["item"]
        if entry.get("kind") == "notice" and entry.get("topic") == "compress":
            out.append(entry)
    return out


async def barrier(c: Client) -> None:
    await c.result("sessions/list", {"limit": 1})


# --- session/compress: 正在压缩时直接拒绝 -------------------------------------------------------------------


def test_a_second_session_compress_while_one_runs_is_refused_with_internal_error_and_adds_no_notice(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await slow_history(c, "compress-twice")
            c.pushes.clear()
            await send_raw(c, 9001, "session/compress", {"sessionId": sid})
            second = await c.call("session/compress", {"sessionId": sid})
            first = await c.reply(9001, timeout=15)
            await barrier(c)
            snap = await c.result("session/subscribe", {"sessionId": sid})
            return second, first, compress_notices(c.pushes, sid), compress_notices(snap["items"])

    second, first, pushed, stored = run(go())
    assert second["error"]["code"] == INTERNAL_ERROR, second
    assert "already being compressed" in second["error"]["message"]
    assert first == {"jsonrpc": "2.0", "id": 9001, "result": {}}
    assert len(pushed) == 1 and not pushed[0]["facts"].get("failed")  # only the first one's notice
    assert [n["itemId"] for n in stored] == [pushed[0]["itemId"]]


# --- session/compress: 期间历史被改动 -> 没压成 -----------------------------------------------------------------


def test_a_send_during_session_compress_fails_it_with_internal_error_and_the_notice_says_why(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await slow_history(c, "compress-send")
            c.pushes.clear()
            await send_raw(c, 9002, "session/compress", {"sessionId": sid})
            during = await turn(c, sid, "during")
            failed = await c.reply(9002, timeout=15)
            # a compaction that starts now summarises "during" too, and outlasts the first one's call
            again = await c.call("session/compress", {"sessionId": sid}, timeout=15)
            await barrier(c)
            snap = await c.result("session/subscribe", {"sessionId": sid})
            return during, failed, again, compress_notices(snap["items"])

    during, failed, again, notices = run(go())
    assert during["outcome"] == "replied"
    assert failed["error"]["code"] == INTERNAL_ERROR, failed
    assert "history changed during compression: a new input arrived" in failed["error"]["message"]
    assert again == {"jsonrpc": "2.0", "id": again["id"], "result": {}}
    first, second = notices  # no summary of the first compaction was ever committed
    assert first["facts"]["failed"] is True and "a new input arrived" in first["text"]
    assert second["facts"]["turns"] == 2 and not second["facts"].get("failed")


def test_turn_abort_during_session_compress_stops_it_with_internal_error(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await slow_history(c, "compress-abort")
            c.pushes.clear()
            await send_raw(c, 9003, "session/compress", {"sessionId": sid})
            aborted = await c.call("turn/abort", {"sessionId": sid})
            failed = await c.reply(9003, timeout=15)
            await barrier(c)
            return aborted, failed, compress_notices(c.pushes, sid)

    aborted, failed, notices = run(go())
    assert aborted["result"] == {}
    assert failed["error"]["code"] == INTERNAL_ERROR and "cancelled: stopped by the owner" in failed["error"]["message"]
    assert [n["facts"].get("failed") for n in notices] == [True]


# --- session/compress: 摘要模型不在或失败 ---------------------------------------------------------------------


def test_session_compress_with_a_failing_summary_model_answers_internal_error_with_the_reason(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "compress-model-error")
            ended = await turn(c, sid, "ask\n!error the model is on fire")  # the summary call reads it too
            c.pushes.clear()
            failed = await c.call("session/compress", {"sessionId": sid})
            await barrier(c)
            return ended, failed, compress_notices(c.pushes, sid)

    ended, failed, notices = run(go())
    assert ended["outcome"] == "error"
    assert failed["error"]["code"] == INTERNAL_ERROR
    assert "the summary model failed: the model is on fire" in failed["error"]["message"]
    [notice] = notices
    assert notice["facts"]["failed"] is True and "the model is on fire" in notice["text"]


def test_session_compress_with_an_unreachable_summary_model_answers_internal_error_with_the_reason(server_factory):
    closed = socket.socket()  # bound, never listening: every connection to it is refused
    closed.bind(("127.0.0.1", 0))
    try:
        base = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        server = server_factory("--model", "openai", env={"OPENAI_BASE_URL": base, "OPENAI_API_KEY": ""})

        async def go():
            async with open_client(server) as ws:
                c = await initialized(ws)
                sid = await new_session(c, "compress-unreachable")
                ended = await turn(c, sid, "hello")
                c.pushes.clear()
                failed = await c.call("session/compress", {"sessionId": sid}, timeout=20)
                await barrier(c)
                return ended, failed, compress_notices(c.pushes, sid)

        ended, failed, notices = run(go())
    finally:
        closed.close()
    assert ended["outcome"] == "error"
    assert failed["error"]["code"] == INTERNAL_ERROR
    assert f"the summary model failed: cannot reach {base}/chat/completions" in failed["error"]["message"]
    [notice] = notices
    assert notice["facts"]["failed"] is True and "cannot reach" in notice["text"]


# --- 增量: token 记账 pushes sessions/changed ----------------------------------------------------------------


def test_every_model_call_pushes_the_tokens_of_the_session_and_its_ancestors_before_the_turn_ends(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            parent = (await c.result("session/create", {"name": "tokens-parent"}))["session"]["id"]
            child = await new_session(c, "tokens-child", parentId=parent)
            await c.result("sessions/watch", {})
            # two model calls of 1.2 s each: the first one's tokens are committed well before the end
            await c.result("turn/send", {"sessionId": child, "content": '!tool list_files {"path": "."}\n!sleep 1200'})

            def mid_turn(m: dict[str, Any]) -> bool:
                if m["method"] != "sessions/changed":
                    return False
                mine = {s["id"]: s for s in m["params"]["upserts"]}
                return child in mine and mine[child]["running"] and mine[child].get("tokens") is not None

            changed = await c.push(mid_turn, timeout=10)
            listed = await c.result("sessions/list", {"limit": 200})
            ended = await c.turn_done(child, timeout=15)
            return changed["params"]["upserts"], listed["sessions"], ended

    upserts, listed, ended = run(go())
    by_id = {s["id"]: s for s in upserts}
    child_row = next(s for s in upserts if s["parentId"] is not None)
    parent_row = by_id[child_row["parentId"]]
    assert child_row["tokens"]["input"] > 0 and child_row["tokens"]["output"] > 0
    assert parent_row["tokens"] == child_row["tokens"]  # the parent's tokens are its subtree's
    listed_parent = next(s for s in listed if s["id"] == parent_row["id"])
    assert listed_parent["tokens"]["input"] >= child_row["tokens"]["input"]
    assert ended["params"]["item"]["outcome"] == "replied"


# --- 快照: 还没有用量时，服务端在快照之后请 agent 算一次 -----------------------------------------------------------


def test_a_session_without_usage_gets_its_usage_pushed_after_the_snapshot(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "usage-later")
            await turn(c, sid, "no usage here\n!error down")  # history, and no model call reported usage
            rows = (await c.result("session/config/get", {"sessionId": sid}))["items"]
            prompt = next(r for r in rows if (r["plugin"], r["key"]) == ("agent", "systemPrompt"))["actual"]["value"]
            async with open_client(srv) as ws2:
                other = await initialized(ws2)
                snap = await other.result("session/subscribe", {"sessionId": sid})
                usage = await other.push(lambda m: m["method"] == "item/completed"
                                         and m["params"]["sessionId"] == sid
                                         and m["params"]["item"]["kind"] == "usage", timeout=5)
                return snap, usage["params"], prompt

    snap, usage, prompt = run(go())
    assert [i for i in snap["items"] if i["kind"] == "usage"] == []
    assert usage["seq"] > snap["seq"] and usage["epoch"] == snap["epoch"]
    assert usage["item"]["itemId"] == "usage"
    # what the next call would send: the built-in system prompt and the message (mock: characters // 4)
    assert usage["item"]["tokens"] == (len(prompt) + len("no usage here\n!error down")) // 4


# --- maxSteps: Infinity 不限 ------------------------------------------------------------------------------------


def test_serve_with_unlimited_max_steps_runs_a_loop_past_the_default_and_turn_abort_stops_it(server_factory):
    server = server_factory("--max-steps", "unlimited")

    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "endless")
            await c.result("session/config/update", {"sessionId": sid, "plugin": "tools",
                                                     "key": "permissionMode", "value": "acceptCalls"})
            await c.result("turn/send", {"sessionId": sid, "content": "!loop"})
            done: set[str] = set()
            while len(done) < 30:  # the default limit is 20 model calls
                p = await c.push(lambda m: m["method"] == "item/completed" and m["params"]["sessionId"] == sid
                                 and m["params"]["item"]["kind"] in ("tool-call", "turn"), timeout=10)
                assert p["params"]["item"]["kind"] == "tool-call", p  # the turn did not end by itself
                done.add(p["params"]["item"]["itemId"])
            stopped = await c.result("turn/abort", {"sessionId": sid})
            ended = await c.turn_done(sid, timeout=10)
            await barrier(c)
            limits = [m for m in c.pushes if m["method"] == "item/completed"
                      and m["params"]["item"].get("topic") == "tool-limit"]
            return stopped, ended["params"]["item"], limits

    stopped, ended, limits = run(go())
    assert stopped == {}
    assert ended["outcome"] == "aborted"
    assert limits == []


def test_serve_refuses_a_max_steps_that_is_neither_a_count_nor_unlimited(tmp_path):
    with pytest.raises(RuntimeError, match="--max-steps.*expected a whole number"):
        ServerProcess(str(tmp_path / "data"), "--max-steps", "lots").start()


# --- 归档: 她在已归档的会话里跑一轮不会让它回到列表 ----------------------------------------------------------


def test_a_turn_in_an_archived_session_does_not_bring_it_back_to_the_list(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "archived-runs")
            await c.result("session/archive", {"sessionId": sid})
            ended = await turn(c, sid, "still here")
            active = await c.result("sessions/list", {"limit": 200})
            archived = await c.result("sessions/list", {"archived": True, "limit": 200})
            return ended, active["sessions"], archived["sessions"]

    ended, active, archived = run(go())
    assert ended["outcome"] == "replied"
    row = next(s for s in archived if s["title"] == "archived-runs")
    assert row["id"] not in {s["id"] for s in active}
    assert row["archived"] is True and row["lastTurn"]["outcome"] == "replied"


# --- 快照的 approvals -------------------------------------------------------------------------------------------


def test_the_subscribe_snapshot_carries_the_sessions_pending_approvals_and_not_settled_ones(srv):
    async def go():
        async with open_client(srv) as ws, open_client(srv) as ws2:
            owner = await initialized(ws)
            other = await initialized(ws2)  # never present: it sees approvals only through snapshots
            await owner.result("presence/update", {"active": True})
            sid = await new_session(owner, "approval-snapshot")
            await owner.result("turn/send", {"sessionId": sid,
                                             "content": '!tool write_file {"path": "a.txt", "content": "x"}'})
            requested = (await owner.push(lambda m: m["method"] == "approval/requested"
                                          and m["params"]["approval"]["sessionId"] == sid))["params"]["approval"]
            pending = await other.result("session/subscribe", {"sessionId": sid})
            await owner.result("approval/respond", {"approvalId": requested["id"], "decision": "deny",
                                                    "contentHash": requested["contentHash"]})
            await owner.turn_done(sid)
            settled = await other.result("session/subscribe", {"sessionId": sid})
            return requested, pending, settled

    requested, pending, settled = run(go())
    [approval] = pending["approvals"]
    assert approval == requested  # the same object the push carried
    assert approval["state"] == "pending" and approval["tool"] == "write_file"
    card = next(i for i in pending["items"] if i["kind"] == "tool-call")
    assert card["approvalId"] == approval["id"]
    assert settled["approvals"] == []
