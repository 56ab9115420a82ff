"""Seed 004, method by method over the wire: the methods no other e2e test drives.

A real ``sessionloop serve`` subprocess on 127.0.0.1 port 0 and real WebSocket clients:
session/batch, session/markSeen, session/unsubscribe, turn/continue, session/compress,
plan/clear, background/*, presence/update, approval/respond, and the owner token file that
``serve`` writes on first start (SPEC §7). One server is shared by the module; every test makes
its own sessions and filters pushes by session id, and closes its connections (so its presence
ends) before the next test runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.e2e.conftest import Client, ServerProcess, initialized, open_client

pytestmark = pytest.mark.e2e

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
APPLICATION_ERROR = -32000
NO_SUCH_SESSION = "no-such-session"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    server = ServerProcess(str(tmp_path_factory.mktemp("methods-wire") / "data")).start()
    yield server
    server.stop()


# --- helpers ----------------------------------------------------------------------------------------


async def new_session(c: Client, name: str = "", subscribe: bool = True) -> str:
    params = {"name": name} if name else {}
    sid = (await c.result("session/create", params))["session"]["id"]
    if subscribe:
        await c.result("session/subscribe", {"sessionId": sid})
    return sid


async def set_setting(c: Client, sid: str, plugin: str, key: str, value: Any) -> None:
    reply = await c.call("session/config/update", {"sessionId": sid, "plugin": plugin, "key": key, "value": value})
    assert "result" in reply, reply


def item(sid: str, kind: str, method: str = "item/completed", **fields: Any) -> Any:
    """A predicate for an item push of ``sid`` whose item has ``kind`` and the given fields."""

    def match(m: dict[str, Any]) -> bool:
        if m["method"] != method or m["params"].get("sessionId") != sid:
            return False
        it = m["params"]["item"]
        return it["kind"] == kind and all(it.get(k) == v for k, v in fields.items())

    return match


def of_session(sid: str) -> Any:
    return lambda m: m.get("params", {}).get("sessionId") == sid


async def summary(c: Client, sid: str, **filters: Any) -> dict[str, Any] | None:
    listed = await c.result("sessions/list", {"limit": 200, **filters})
    return next((s for s in listed["sessions"] if s["id"] == sid), None)


def app_code(reply: dict[str, Any]) -> str:
    assert "error" in reply, reply
    assert reply["error"]["code"] == APPLICATION_ERROR, reply
    return reply["error"]["data"]["code"]


def assert_invalid_params_naming(reply: dict[str, Any], field: str) -> None:
    assert "error" in reply, reply
    assert reply["error"]["code"] == INVALID_PARAMS, reply
    assert field in reply["error"]["message"], reply


async def barrier(c: Client) -> None:
    """A round trip: every push queued for this connection before it has arrived after it."""
    await c.result("sessions/list", {"limit": 1})


# --- session/batch ----------------------------------------------------------------------------------


def test_session_batch_applies_each_op_with_children_and_reports_only_the_failed_ids(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            a = await new_session(c, "batch-a", subscribe=False)
            b = await new_session(c, "batch-b", subscribe=False)
            keep = await new_session(c, "batch-keep", subscribe=False)
            child = (await c.result("session/create", {"name": "batch-child", "parentId": a}))["session"]["id"]
            archived = await c.result("session/batch", {"op": "archive", "ids": [a, NO_SUCH_SESSION, b]})
            active = {s["id"] for s in (await c.result("sessions/list", {"limit": 200}))["sessions"]}
            archive_page = await c.result("sessions/list", {"archived": True, "limit": 200})
            in_archive = {s["id"] for s in archive_page["sessions"]}
            archived_children = await c.result("sessions/list", {"parentId": a, "archived": True})
            deleted = await c.result("session/batch", {"op": "delete", "ids": [NO_SUCH_SESSION + "-2", a]})
            archive_page = await c.result("sessions/list", {"archived": True, "limit": 200})
            after_delete = {s["id"] for s in archive_page["sessions"]}
            gone = await c.call("session/subscribe", {"sessionId": a})
            gone_child = await c.call("session/subscribe", {"sessionId": child})
            empty = await c.result("session/batch", {"op": "archive", "ids": []})
            bad_op = await c.call("session/batch", {"op": "rename", "ids": [keep]})
            no_ids = await c.call("session/batch", {"op": "archive"})
            still = await summary(c, keep)
            return (a, b, keep, child, archived, active, in_archive, archived_children, deleted, after_delete, gone,
                    gone_child, empty, bad_op, no_ids, still)

    (a, b, keep, child, archived, active, in_archive, archived_children, deleted, after_delete, gone, gone_child,
     empty, bad_op, no_ids, still) = run(go())
    # seed 004: { failed: Array<{ sessionId, message }> } -- only the ids that failed
    assert [f["sessionId"] for f in archived["failed"]] == [NO_SUCH_SESSION]
    assert archived["failed"][0]["message"]
    assert a not in active and b not in active and keep in active
    assert {a, b} <= in_archive and keep not in in_archive
    assert [s["id"] for s in archived_children["sessions"]] == [child]  # 连同子会话
    assert [f["sessionId"] for f in deleted["failed"]] == [NO_SUCH_SESSION + "-2"]
    assert a not in after_delete and b in after_delete
    assert app_code(gone) == "not-found" and app_code(gone_child) == "not-found"
    assert empty == {"failed": []}
    assert_invalid_params_naming(bad_op, "op")
    assert_invalid_params_naming(no_ids, "ids")
    assert still is not None and still["archived"] is False  # an op never touches ids it was not given


# --- session/markSeen -------------------------------------------------------------------------------


def test_mark_seen_clears_unread_for_every_connection_and_a_later_reply_sets_it_again(srv):
    async def go():
        async with open_client(srv) as ws, open_client(srv) as ws2:
            c, other = await initialized(ws), await initialized(ws2)
            sid = await new_session(c, "seen")
            fresh = await summary(c, sid)
            await c.result("turn/send", {"sessionId": sid, "content": "hi"})
            await c.turn_done(sid)
            unread = await summary(c, sid)
            await other.result("sessions/watch", {})
            seen = await c.result("session/markSeen", {"sessionId": sid})
            mine = await summary(c, sid)
            theirs = await summary(other, sid)
            change = await other.push(lambda m: m["method"] == "sessions/changed"
                                      and any(s["id"] == sid and s["unread"] is False for s in m["params"]["upserts"]))
            await c.result("turn/send", {"sessionId": sid, "content": "again"})
            await c.turn_done(sid)
            again = await summary(c, sid)
            missing = await c.call("session/markSeen", {"sessionId": NO_SUCH_SESSION})
            bad = await c.call("session/markSeen", {})
            return fresh, unread, seen, mine, theirs, change, again, missing, bad

    fresh, unread, seen, mine, theirs, change, again, missing, bad = run(go())
    assert fresh["unread"] is False  # she has not spoken yet
    assert unread["unread"] is True and unread["section"] == "owner" and unread["lastReplyAt"]
    assert seen == {}
    assert mine["unread"] is False and theirs["unread"] is False  # recorded by the server, same everywhere
    assert change["params"]["removes"] == []
    assert again["unread"] is True  # a reply later than the seen time is unread again
    assert app_code(missing) == "not-found"
    assert_invalid_params_naming(bad, "sessionId")


# --- session/unsubscribe ----------------------------------------------------------------------------


def test_after_unsubscribe_no_push_of_that_session_arrives_while_other_subscriptions_go_on(srv):
    async def go():
        async with open_client(srv) as ws, open_client(srv) as ws2:
            c, other = await initialized(ws), await initialized(ws2)
            a = await new_session(c, "unsub-a")
            b = await new_session(c, "unsub-b")
            await other.result("session/subscribe", {"sessionId": a})
            result = await c.result("session/unsubscribe", {"sessionId": a})
            # a turn in a, seen through the other connection
            await other.result("turn/send", {"sessionId": a, "content": "nobody here listens"})
            a_done = await other.turn_done(a)
            # then a turn in b on this connection: its pushes come after anything queued for a
            await c.result("turn/send", {"sessionId": b, "content": "still subscribed"})
            b_done = await c.turn_done(b)
            await barrier(c)
            leaked = [p for p in c.pushes if of_session(a)(p)]
            missing = await c.call("session/unsubscribe", {"sessionId": NO_SUCH_SESSION})
            bad = await c.call("session/unsubscribe", {"sessionId": 7})
            return result, a_done, b_done, leaked, missing, bad

    result, a_done, b_done, leaked, missing, bad = run(go())
    assert result == {}
    assert a_done["params"]["item"]["outcome"] == "replied" and b_done["params"]["item"]["outcome"] == "replied"
    assert leaked == []
    assert app_code(missing) == "not-found"
    assert_invalid_params_naming(bad, "sessionId")


# --- turn/continue ----------------------------------------------------------------------------------


async def _hit_the_tool_limit(c: Client, name: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """maxSteps 1 and one tool call: the turn stops with the tool-limit notice after the call ran."""
    sid = await new_session(c, name)
    await set_setting(c, sid, "agent", "maxSteps", 1)
    await c.result("turn/send", {"sessionId": sid, "content": '!tool list_files {"path": "."}'})
    notice = await c.push(item(sid, "notice", topic="tool-limit"))
    first = await c.turn_done(sid)
    c.pushes.clear()
    return sid, notice["params"]["item"], first["params"]["item"]


def test_turn_continue_resumes_after_the_tool_limit_notice_and_the_agent_finishes(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid, limit, first = await _hit_the_tool_limit(c, "continue")
            cont = await c.result("turn/continue", {"sessionId": sid})
            started = await c.push(item(sid, "turn", method="item/started"))
            reply = await c.push(item(sid, "agent-message"))
            second = await c.turn_done(sid)
            missing = await c.call("turn/continue", {"sessionId": NO_SUCH_SESSION})
            bad = await c.call("turn/continue", {"session": sid})
            return limit, first, cont, started, reply, second, missing, bad

    limit, first, cont, started, reply, second, missing, bad = run(go())
    assert limit["canContinue"] is True and limit["text"]
    assert first["outcome"] != "replied"  # stopped by the limit, no reply
    assert cont == {}
    assert started["params"]["item"]["source"] == "continue"
    assert started["params"]["item"]["itemId"] != first["itemId"]
    assert reply["params"]["item"]["text"] == "done: 1 tool calls"  # the model saw the earlier tool result
    assert second["params"]["item"]["outcome"] == "replied"
    assert app_code(missing) == "not-found"
    assert_invalid_params_naming(bad, "sessionId")


def test_turn_continue_puts_no_empty_user_message_on_the_timeline(srv):
    """Seed 004: a user-message's text is what its speaker wrote; turn/continue is not a message
    (turn/send refuses empty text), the continued turn shows its origin as the turn's source."""

    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid, _, _ = await _hit_the_tool_limit(c, "continue-timeline")
            await c.result("turn/continue", {"sessionId": sid})
            await c.turn_done(sid)
            live = [p["params"]["item"] for p in c.pushes if item(sid, "user-message")(p)]
            snap = await c.result("session/subscribe", {"sessionId": sid})
            stored = [i for i in snap["items"] if i["kind"] == "user-message"]
            return live, stored

    live, stored = run(go())
    assert live == []
    assert [i["text"] for i in stored] == ['!tool list_files {"path": "."}']


# --- session/compress -------------------------------------------------------------------------------


async def _two_turns(c: Client, name: str) -> str:
    sid = await new_session(c, name)
    for text in ("first question", "second question"):
        await c.result("turn/send", {"sessionId": sid, "content": text})
        await c.turn_done(sid)
    return sid


def test_session_compress_answers_after_the_compress_notice_with_the_summarised_turns(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await _two_turns(c, "compress")
            c.pushes.clear()
            result = await c.result("session/compress", {"sessionId": sid})
            already = [p for p in c.pushes if item(sid, "notice", topic="compress")(p)]
            snap = await c.result("session/subscribe", {"sessionId": sid})
            missing = await c.call("session/compress", {"sessionId": NO_SUCH_SESSION})
            bad = await c.call("session/compress", {"sessionId": None})
            return result, already, snap, missing, bad

    result, already, snap, missing, bad = run(go())
    assert result == {}
    assert len(already) == 1  # 压完才回: the notice is out before the reply
    notice = already[0]["params"]["item"]
    assert notice["facts"]["turns"] == 2 and not notice["facts"].get("failed") and notice["text"]
    assert [i["itemId"] for i in snap["items"] if i["kind"] == "notice" and i["topic"] == "compress"] \
        == [notice["itemId"]]
    assert app_code(missing) == "not-found"
    assert_invalid_params_naming(bad, "sessionId")


def test_session_compress_pushes_the_latest_usage_after_the_compress_notice(srv):
    """Seed 004: 进度以 compress 通知推送，之后推最新用量."""

    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await _two_turns(c, "compress-usage")
            c.pushes.clear()
            await c.result("session/compress", {"sessionId": sid})
            await c.push(item(sid, "notice", topic="compress"))
            return await c.push(item(sid, "usage"), timeout=3)

    usage = run(go())["params"]["item"]
    assert usage["itemId"] == "usage"


def test_session_compress_while_a_turn_runs_is_refused_with_internal_error_and_no_notice(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "compress-busy")
            await c.result("turn/send", {"sessionId": sid, "content": "done before"})
            await c.turn_done(sid)
            await c.result("turn/send", {"sessionId": sid, "content": "!sleep 3000\nslow answer"})
            await c.push(item(sid, "turn", method="item/started"))
            refused = await c.call("session/compress", {"sessionId": sid})
            await c.result("turn/abort", {"sessionId": sid})
            await c.turn_done(sid)
            await barrier(c)
            notices = [p for p in c.pushes if item(sid, "notice", topic="compress")(p)
                       or item(sid, "notice", "item/started", topic="compress")(p)]
            return refused, notices

    refused, notices = run(go())
    assert refused["error"]["code"] == INTERNAL_ERROR and refused["error"]["message"]
    assert notices == []  # 直接拒绝: nothing new on the timeline


# --- plan/clear -------------------------------------------------------------------------------------

PLAN = [{"text": "write the tests", "status": "in_progress"}, {"text": "ship it", "status": "pending"}]


def test_plan_clear_empties_the_plan_an_update_plan_call_set(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "plan")
            await c.result("turn/send",
                           {"sessionId": sid, "content": "!tool update_plan " + json.dumps({"entries": PLAN})})
            set_push = await c.push(item(sid, "plan"))
            await c.turn_done(sid)
            with_plan = await c.result("session/subscribe", {"sessionId": sid})
            cleared = await c.result("plan/clear", {"sessionId": sid})
            clear_push = await c.push(item(sid, "plan"))
            without = await c.result("session/subscribe", {"sessionId": sid})
            again = await c.result("plan/clear", {"sessionId": sid})
            missing = await c.call("plan/clear", {"sessionId": NO_SUCH_SESSION})
            bad = await c.call("plan/clear", {})
            return set_push, with_plan, cleared, clear_push, without, again, missing, bad

    set_push, with_plan, cleared, clear_push, without, again, missing, bad = run(go())
    assert set_push["params"]["item"]["itemId"] == "plan" and set_push["params"]["item"]["entries"] == PLAN
    assert [i["entries"] for i in with_plan["items"] if i["kind"] == "plan"] == [PLAN]
    assert cleared == {}
    assert clear_push["params"]["item"]["itemId"] == "plan" and clear_push["params"]["item"]["entries"] == []
    assert [i for i in without["items"] if i["kind"] == "plan"] == []  # 有计划条目才有计划
    assert again == {}
    assert app_code(missing) == "not-found"
    assert_invalid_params_naming(bad, "sessionId")


# --- background/* -----------------------------------------------------------------------------------


def _task_push(status: str, task_id: str | None = None) -> Any:
    return lambda m: m["method"] == "background/changed" and any(
        t["status"] == status and (task_id is None or t["id"] == task_id) for t in m["params"]["upserts"])


def _task_in(push: dict[str, Any], status: str) -> dict[str, Any]:
    return next(t for t in push["params"]["upserts"] if t["status"] == status)


async def _background_exec(c: Client, sid: str, command: str) -> dict[str, Any]:
    """Run exec as a background task (the model asks for it); the tool card with its taskId."""
    args = json.dumps({"command": command, "background": True})
    await c.result("turn/send", {"sessionId": sid, "content": f"!tool exec {args}"})
    card = await c.push(lambda m: item(sid, "tool-call")(m) and m["params"]["item"].get("taskId"))
    await c.turn_done(sid)
    return card["params"]["item"]


def test_background_start_watch_list_output_stop_lifecycle_with_pushes(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            watched = await c.result("background/watch", {})
            sid = await new_session(c, "background")
            await set_setting(c, sid, "tools", "permissionMode", "acceptCalls")
            card = await _background_exec(c, sid, "echo begin; sleep 30")
            running = _task_in(await c.push(_task_push("running", card["taskId"])), "running")
            listed = {t["id"]: t for t in (await c.result("background/list", {}))["tasks"]}
            counted = await summary(c, sid, background=True)
            output = {"text": ""}
            for _ in range(100):
                output = await c.result("background/output", {"taskId": card["taskId"]})
                if output["text"]:
                    break
                await asyncio.sleep(0.05)
            tail = await c.result("background/output", {"taskId": card["taskId"], "after": output["end"]})
            stopped = await c.result("background/stop", {"taskId": card["taskId"]})
            stop_push = _task_in(await c.push(_task_push("stopped", card["taskId"])), "stopped")
            after = {t["id"]: t for t in (await c.result("background/list", {}))["tasks"]}
            idle = await summary(c, sid)
            missing = await c.call("background/stop", {"taskId": "no-such-task"})
            missing_out = await c.call("background/output", {"taskId": "no-such-task"})
            bad = await c.call("background/output", {"after": 0})
            bad_after = await c.call("background/output", {"taskId": card["taskId"], "after": -1})
            return (sid, watched, card, running, listed, counted, output, tail, stopped, stop_push, after, idle,
                    missing, missing_out, bad, bad_after)

    (sid, watched, card, running, listed, counted, output, tail, stopped, stop_push, after, idle, missing,
     missing_out, bad, bad_after) = run(go())
    assert watched == {}
    assert card["status"] == "completed"  # the card ends with what the model was told; the task goes on
    assert running["sessionId"] == sid and running["kind"] == "tool-call" and running["label"] == "exec"
    assert running["call"]["tool"] == "exec" and running["call"]["callId"] == card["itemId"]
    assert running["display"]["kind"] == "command" and running["display"]["command"] == "echo begin; sleep 30"
    assert "exitCode" not in running["display"]  # 不带退出码
    assert isinstance(running["startedAt"], int) and "endedAt" not in running
    assert "args" not in running and "result" not in running  # 不下发的
    assert listed[card["taskId"]]["status"] == "running"
    assert counted is not None and counted["background"] == 1
    assert output["text"] == "begin\n" and output["end"] == len("begin\n") and output["truncated"] is False
    assert tail == {"text": "", "end": len("begin\n"), "truncated": False}
    assert stopped == {}
    assert stop_push["endedAt"] >= stop_push["startedAt"]
    assert after[card["taskId"]]["status"] == "stopped"
    assert idle["background"] == 0
    assert app_code(missing) == "not-found" and app_code(missing_out) == "not-found"
    assert_invalid_params_naming(bad, "taskId")
    assert_invalid_params_naming(bad_after, "after")


def test_background_stop_all_stops_every_task_of_the_session_and_an_unknown_session_is_not_found(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            await c.result("background/watch", {})
            sid = await new_session(c, "background-all")
            await set_setting(c, sid, "tools", "permissionMode", "acceptCalls")
            cards = [await _background_exec(c, sid, "sleep 30") for _ in range(2)]
            for card in cards:
                await c.push(_task_push("running", card["taskId"]))
            result = await c.result("background/stopAll", {"sessionId": sid})
            # 等任务落定才回: the list is settled at the moment of the reply
            listed = {t["id"]: t for t in (await c.result("background/list", {}))["tasks"]}
            counted = await summary(c, sid)
            missing = await c.call("background/stopAll", {"sessionId": NO_SUCH_SESSION})
            bad = await c.call("background/stopAll", {})
            return cards, result, listed, counted, missing, bad

    cards, result, listed, counted, missing, bad = run(go())
    assert result == {}
    assert [listed[card["taskId"]]["status"] for card in cards] == ["stopped", "stopped"]
    assert counted["background"] == 0
    assert app_code(missing) == "not-found"
    assert_invalid_params_naming(bad, "sessionId")


# --- presence/update --------------------------------------------------------------------------------


async def _exec_waiting_for_approval(c: Client, name: str, command: str) -> tuple[str, dict[str, Any]]:
    """An owner session (permission mode ``ask``) whose exec call waits for an approval."""
    sid = await new_session(c, name)
    args = json.dumps({"command": command})
    await c.result("turn/send", {"sessionId": sid, "content": f"!tool exec {args}"})
    pushed = await c.push(lambda m: m["method"] == "approval/requested"
                          and m["params"]["approval"]["sessionId"] == sid)
    return sid, pushed["params"]["approval"]


def test_presence_update_decides_who_gets_approval_requests_and_a_newly_present_connection_gets_the_pending_one(srv):
    async def go():
        async with open_client(srv) as ws, open_client(srv) as ws2:
            c, late = await initialized(ws), await initialized(ws2)
            assert await c.result("presence/update", {"active": True}) == {}
            sid, approval = await _exec_waiting_for_approval(c, "presence", "echo present")
            await barrier(late)
            before = [p for p in late.pushes if p["method"] == "approval/requested"]
            became = await late.result("presence/update", {"active": True})
            repushed = await late.push(lambda m: m["method"] == "approval/requested"
                                       and m["params"]["approval"]["id"] == approval["id"])
            await c.result("approval/respond", {"approvalId": approval["id"], "decision": "deny",
                                                "contentHash": approval["contentHash"]})
            await c.turn_done(sid)
            bad = await c.call("presence/update", {})
            bad_type = await c.call("presence/update", {"active": "yes"})
            return before, became, repushed, bad, bad_type

    before, became, repushed, bad, bad_type = run(go())
    assert before == []  # never reported: not present, no push
    assert became == {}
    assert repushed["params"]["approval"]["state"] == "pending"  # 补推 on becoming present
    assert_invalid_params_naming(bad, "active")
    assert_invalid_params_naming(bad_type, "active")


def test_presence_update_false_means_nobody_present_so_the_call_is_denied_at_once_as_absent(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            await c.result("presence/update", {"active": True})
            assert await c.result("presence/update", {"active": False}) == {}
            sid = await new_session(c, "absent")
            await c.result("turn/send", {"sessionId": sid, "content": '!tool exec {"command": "echo never"}'})
            card = await c.push(item(sid, "tool-call", status="denied"))
            await c.turn_done(sid)
            await barrier(c)
            requested = [p for p in c.pushes if p["method"] == "approval/requested"]
            listed = await summary(c, sid)
            return card, requested, listed

    card, requested, listed = run(go())
    tool = card["params"]["item"]
    assert tool["approvalId"] and tool["settlement"]["state"] == "denied"
    assert tool["settlement"]["source"] == "absent"
    assert requested == []  # 发起时就被拒的审批: no approval/requested, no attention
    assert listed["attention"] is False


# --- approval/respond -------------------------------------------------------------------------------


def test_approval_respond_approve_runs_the_waiting_tool_and_a_second_answer_is_approval_settled(srv):
    async def go():
        async with open_client(srv) as ws, open_client(srv) as ws2:
            c, watcher = await initialized(ws), await initialized(ws2)
            await c.result("presence/update", {"active": True})
            await watcher.result("presence/update", {"active": True})
            sid, approval = await _exec_waiting_for_approval(c, "approve", "echo ran")
            await watcher.push(lambda m: m["method"] == "approval/requested"
                               and m["params"]["approval"]["id"] == approval["id"])
            waiting_card = await c.push(lambda m: item(sid, "tool-call", method="item/started")(m)
                                        and m["params"]["item"].get("approvalId") == approval["id"])
            snap = await c.result("session/subscribe", {"sessionId": sid})
            attention = await summary(c, sid)
            wrong_hash = await c.call("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                                           "contentHash": "not-the-hash"})
            answered = await c.result("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                                           "contentHash": approval["contentHash"]})
            settled = await c.push(lambda m: m["method"] == "approval/settled"
                                   and m["params"]["approvalId"] == approval["id"])
            watcher_settled = await watcher.push(lambda m: m["method"] == "approval/settled"
                                                 and m["params"]["approvalId"] == approval["id"])
            card = await c.push(item(sid, "tool-call", status="completed"))
            await c.turn_done(sid)
            second = await watcher.call("approval/respond", {"approvalId": approval["id"], "decision": "deny",
                                                             "contentHash": approval["contentHash"]})
            after = await summary(c, sid)
            missing = await c.call("approval/respond", {"approvalId": "no-such.approval", "decision": "approve",
                                                        "contentHash": "h"})
            bad = await c.call("approval/respond", {"approvalId": approval["id"], "decision": "maybe",
                                                    "contentHash": approval["contentHash"]})
            return (sid, approval, waiting_card, snap, attention, wrong_hash, answered, settled, watcher_settled,
                    card, second, after, missing, bad)

    (sid, approval, waiting_card, snap, attention, wrong_hash, answered, settled, watcher_settled, card, second,
     after, missing, bad) = run(go())
    assert approval["sessionId"] == sid and approval["tool"] == "exec" and approval["target"] == "tool"
    assert approval["facts"]["command"] == "echo ran" and approval["facts"]["params"] == {"command": "echo ran"}
    assert approval["options"] == ["approve", "deny"] and approval["state"] == "pending"
    assert approval["contentHash"] and approval["expiresAt"] > 0
    assert approval["callId"] == waiting_card["params"]["item"]["itemId"]
    assert [a["id"] for a in snap["approvals"]] == [approval["id"]]
    assert attention["attention"] is True
    assert app_code(wrong_hash) == "hash-mismatch"
    assert answered == {}
    s = settled["params"]
    assert (s["state"], s["source"], s["by"]["owner"]) == ("approved", "answer", True) and s["at"] > 0
    assert watcher_settled["params"] == s  # everyone who got the request hears the settlement
    tool = card["params"]["item"]
    assert tool["approvalId"] == approval["id"] and tool["settlement"]["state"] == "approved"
    assert tool["result"]["exitCode"] == 0 and tool["result"]["output"].strip() == "ran"
    assert app_code(second) == "approval-settled"  # 先答先得
    assert after["attention"] is False
    assert app_code(missing) == "not-found"
    assert_invalid_params_naming(bad, "decision")


def test_approval_respond_deny_with_a_note_denies_the_call(srv):
    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            await c.result("presence/update", {"active": True})
            sid, approval = await _exec_waiting_for_approval(c, "deny", "echo nope")
            answered = await c.result("approval/respond", {"approvalId": approval["id"], "decision": "deny",
                                                           "contentHash": approval["contentHash"],
                                                           "note": "too risky"})
            card = await c.push(item(sid, "tool-call", status="denied"))
            turn = await c.turn_done(sid)
            return answered, card, turn

    answered, card, turn = run(go())
    tool = card["params"]["item"]
    assert answered == {}
    assert tool["settlement"]["state"] == "denied" and tool["settlement"]["source"] == "answer"
    assert turn["params"]["item"]["outcome"] == "replied"  # the model was told and answered


# --- the owner token file ---------------------------------------------------------------------------


class TokenlessServer(ServerProcess):
    """``sessionloop serve`` with neither ``--token`` nor ``SESSIONLOOP_TOKEN``: it uses DATA/token."""

    def start(self) -> TokenlessServer:
        env = {k: v for k, v in os.environ.items() if k != "SESSIONLOOP_TOKEN"}
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        # kept open for the server's lifetime (closed in rest_of_stdout), as in conftest's ServerProcess
        self.log = open(os.path.join(os.path.dirname(os.path.abspath(self.data_dir)), "tokenless.log"), "a")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sessionloop", "serve", "--data", self.data_dir, "--port", "0",
             "--durability", "nosync"],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=root,
        )
        line = self.proc.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)/session", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.port = int(match.group(1))
        return self

    def rest_of_stdout(self) -> str:
        self.stop()
        self.log.close()
        return self.proc.stdout.read()


def test_the_owner_token_is_generated_once_into_the_data_dir_with_mode_0600_and_reused(tmp_path):
    data = str(tmp_path / "data")
    token_path = os.path.join(data, "token")

    async def handshake(server: ServerProcess, token: str) -> dict[str, Any]:
        async with open_client(server, token=token) as ws:
            reply = await initialized(ws)
            return await reply.result("sessions/list", {})

    first = TokenlessServer(data).start()
    try:
        mode = os.stat(token_path).st_mode & 0o777
        with open(token_path) as f:
            token = f.read().strip()
        listed = run(handshake(first, token))
    finally:
        first_out = first.rest_of_stdout()
    second = TokenlessServer(data).start()
    try:
        with open(token_path) as f:
            reused = f.read().strip()
        listed_again = run(handshake(second, token))
        mode_again = os.stat(token_path).st_mode & 0o777
    finally:
        second_out = second.rest_of_stdout()
    assert mode == 0o600 and mode_again == 0o600
    assert len(token) >= 32 and reused == token
    assert "sessions" in listed and "sessions" in listed_again  # the saved token opens the server
    assert token in first_out  # printed once, on the first start ...
    assert token not in second_out  # ... and not again


def test_the_tool_limit_notice_is_the_turns_last_entry_before_its_turn_item_closes(srv):
    """Seed 004: a turn's item closes after the turn's last entry; the tool-limit notice belongs to
    the turn it stopped, so it is pushed, and sits in the timeline, before the turn's end."""

    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "notice-order")
            await set_setting(c, sid, "agent", "maxSteps", 1)
            await c.result("turn/send", {"sessionId": sid, "content": '!tool list_files {"path": "."}'})
            notice = await c.push(item(sid, "notice", topic="tool-limit"))
            ended = await c.turn_done(sid)
            snap = await c.result("session/subscribe", {"sessionId": sid})
            return notice, ended, snap["items"]

    notice, ended, items = run(go())
    assert notice["params"]["seq"] < ended["params"]["seq"]  # pushed before the turn's end
    kinds = [(i["kind"], i.get("topic")) for i in items if i["kind"] in ("notice", "turn")]
    assert kinds[kinds.index(("notice", "tool-limit")) + 1][0] == "turn", kinds  # and placed before it
