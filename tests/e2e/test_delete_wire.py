"""Seed 004 ``session/delete`` and ``session/batch`` delete over the wire: a delete ends everything
the session and its children own (running turns, foreground and background commands, pending
approvals), pushes the removals, and clears their history and files (会话与列表: 连同子会话,
并清空它们的消息历史与长期记忆; 后台任务: 删掉的在 removes 里).

A real ``sessionloop serve`` subprocess, real WebSocket clients, real sandboxed commands found by
a unique argument (their PID namespace hides their pids), the real store and data directory
read after the server stopped, and the real ``sessionloop`` commands.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import random
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from sessionloop.actors.views.summary import decode_summary_record
from sessionloop.cli.main import main as cli_main
from sessionloop.eventstore.codec import event_to_builtins
from tests.conftest import processes_with_arg, wait_no_process_with_arg
from tests.e2e.conftest import APPS, Client, ServerProcess, initialized, open_client

pytestmark = pytest.mark.e2e

APPLICATION_ERROR = -32000
SECRET = "the owner secret 7f3a"
BOT_TOKEN = "bot-token-for-the-end-to-end-tests"  # mybot in APPS


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def marker() -> str:
    """A unique ``sleep`` argument: the command's process is found by it."""
    return f"30.{random.randrange(10**8, 10**9)}"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    server = ServerProcess(str(tmp_path_factory.mktemp("delete-wire") / "data")).start()
    yield server
    server.stop()


# --- helpers ----------------------------------------------------------------------------------------


async def new_session(c: Client, name: str = "", **params: Any) -> str:
    sid = (await c.result("session/create", {"name": name, **params} if name else params))["session"]["id"]
    await c.result("session/subscribe", {"sessionId": sid})
    return sid


async def accept_calls(c: Client, sid: str) -> None:
    reply = await c.call("session/config/update", {"sessionId": sid, "plugin": "tools", "key": "permissionMode",
                                                   "value": "acceptCalls"})
    assert "result" in reply, reply


def tool_card(sid: str, **fields: Any) -> Any:
    def match(m: dict[str, Any]) -> bool:
        if m["method"] not in ("item/started", "item/completed") or m["params"].get("sessionId") != sid:
            return False
        it = m["params"]["item"]
        return it["kind"] == "tool-call" and all(it.get(k) == v for k, v in fields.items())

    return match


async def background_command(c: Client, sid: str, command: str) -> str:
    """Run ``command`` as a background task of ``sid`` (the model asks for it); its task id."""
    args = json.dumps({"command": command, "background": True})
    await c.result("turn/send", {"sessionId": sid, "content": f"!tool exec {args}"})
    card = await c.push(lambda m: tool_card(sid)(m) and m["params"]["item"].get("taskId"))
    await c.turn_done(sid)
    return str(card["params"]["item"]["taskId"])


async def until_running(*markers: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not all(processes_with_arg(m) for m in markers):
        assert asyncio.get_running_loop().time() < deadline, f"commands {markers} never started"
        await asyncio.sleep(0.02)


async def removals(c: Client, method: str, wanted: set[str]) -> set[str]:
    """The ids ``method`` pushes (``background/changed``, ``sessions/changed``) remove, until
    every one of ``wanted`` was removed."""
    removed: set[str] = set()
    while not wanted <= removed:
        push = await c.push(lambda m: m["method"] == method and bool(m["params"]["removes"]))
        removed.update(push["params"]["removes"])
    return removed


def app_code(reply: dict[str, Any]) -> str:
    assert "error" in reply, reply
    assert reply["error"]["code"] == APPLICATION_ERROR, reply
    return str(reply["error"]["data"]["code"])


# --- point 1: delete ends everything the session owns -------------------------------------------


def test_deleting_a_session_kills_the_background_commands_of_it_and_its_child_and_pushes_their_removal(srv):
    parent_cmd, child_cmd = marker(), marker()

    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            await c.result("background/watch", {})
            await c.result("sessions/watch", {})
            parent = await new_session(c, "parent with work")
            await accept_calls(c, parent)
            child = await new_session(c, "its child", parentId=parent)
            await accept_calls(c, child)
            tasks = {await background_command(c, parent, f"sleep {parent_cmd}"),
                     await background_command(c, child, f"sleep {child_cmd}")}
            await until_running(parent_cmd, child_cmd)
            deleted = await c.result("session/delete", {"sessionId": parent})
            task_removes = await removals(c, "background/changed", tasks)
            session_removes = await removals(c, "sessions/changed", {parent, child})
            listed = {t["id"] for t in (await c.result("background/list", {}))["tasks"]}
            task = min(tasks)
            output = await c.call("background/output", {"taskId": task})
            stop = await c.call("background/stop", {"taskId": task})
            sessions = {s["id"] for s in (await c.result("sessions/list", {"limit": 200}))["sessions"]}
            again = await c.call("session/delete", {"sessionId": parent})
            return parent, child, tasks, deleted, task_removes, session_removes, listed, output, stop, sessions, again

    parent, child, tasks, deleted, task_removes, session_removes, listed, output, stop, sessions, again = run(go())
    assert deleted == {}
    assert wait_no_process_with_arg(parent_cmd), "the parent's background command outlived its session"
    assert wait_no_process_with_arg(child_cmd), "the child's background command outlived its session"
    assert tasks <= task_removes  # 后台任务: 删掉的(会话删除)在 removes 里
    assert {parent, child} <= session_removes
    assert not tasks & listed
    assert app_code(output) == "not-found" and app_code(stop) == "not-found"
    assert parent not in sessions and child not in sessions
    assert app_code(again) == "not-found"


def test_deleting_a_session_stops_its_running_turn_and_kills_the_command_in_the_foreground(srv):
    command = marker()

    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "foreground")
            await accept_calls(c, sid)
            await c.result("turn/send", {"sessionId": sid,
                                         "content": "!tool exec " + json.dumps({"command": f"sleep {command}"})})
            await c.push(tool_card(sid, status="running"))
            await until_running(command)
            waiting = await c.call("turn/send", {"sessionId": sid, "content": "queued behind the running turn"})
            deleted = await c.result("session/delete", {"sessionId": sid})
            history = await c.call("session/history", {"sessionId": sid})
            send = await c.call("turn/send", {"sessionId": sid, "content": "after the delete"})
            return waiting, deleted, history, send

    waiting, deleted, history, send = run(go())
    assert "result" in waiting
    assert deleted == {}
    assert wait_no_process_with_arg(command), "the running turn's command outlived its session"
    assert app_code(history) == "not-found" and app_code(send) == "not-found"


def test_a_batch_delete_ends_the_work_of_every_session_in_it_and_names_only_the_ids_it_could_not_delete(srv):
    first, second = marker(), marker()

    async def go():
        async with open_client(srv) as ws:
            c = await initialized(ws)
            await c.result("background/watch", {})
            a, b = await new_session(c, "batch a"), await new_session(c, "batch b")
            child = await new_session(c, "child of a", parentId=a)
            for sid in (a, b):
                await accept_calls(c, sid)
            tasks = {await background_command(c, a, f"sleep {first}"),
                     await background_command(c, b, f"sleep {second}")}
            await until_running(first, second)
            result = await c.result("session/batch", {"op": "delete", "ids": [a, child, b, "no-such-session"]})
            removed = await removals(c, "background/changed", tasks)
            sessions = {s["id"] for s in (await c.result("sessions/list", {"limit": 200}))["sessions"]}
            return a, b, child, tasks, result, removed, sessions

    a, b, child, tasks, result, removed, sessions = run(go())
    assert [f["sessionId"] for f in result["failed"]] == ["no-such-session"]  # the child went with its parent
    assert wait_no_process_with_arg(first) and wait_no_process_with_arg(second)
    assert tasks <= removed
    assert not {a, b, child} & sessions


# --- point 2: delete clears the history ----------------------------------------------------------


def _data_url(payload: bytes) -> str:
    return "data:application/octet-stream;base64," + base64.b64encode(payload).decode()


class Deleted(msgspec.Struct):
    data: str
    sid: str
    kept: str
    shared: str
    own: str
    workspace: str
    feed: list[dict[str, Any]]
    retried_send: dict[str, Any]
    retried_create: dict[str, Any]
    listed_by_app: list[str]


@pytest.fixture(scope="module")
def deleted(tmp_path_factory) -> Deleted:
    """A bot's session with everything a session can hold (inputs with attachments, an approval,
    a background task that wrote to its workspace, a snapshot, the app's feed), deleted by the
    owner; another session that sent one of the same attachments stays. The server is stopped
    before the tests look at the data directory."""
    data = str(tmp_path_factory.mktemp("delete-disk") / "data")
    os.makedirs(data)
    with open(os.path.join(data, "apps.toml"), "w") as f:
        f.write(APPS)
    server = ServerProcess(data, "--snapshot-every", "3").start()
    # the shared file carries no secret: the session that keeps it sends it to the model too, whose
    # answer (the mock echoes a text file it is sent) stays in that session's log
    shared, own = b"shared attachment", f"own attachment {SECRET}".encode()
    command = marker()

    async def go() -> Deleted:
        async with open_client(server, BOT_TOKEN) as bws, open_client(server) as ows:
            bot, c = await initialized(bws), await initialized(ows)
            made = await bot.result("loop/create", {"containerId": "inbox", "initialMessage": {
                "text": f"{SECRET} first", "idempotencyKey": "create-1"}})
            sid = made["sessionId"]
            await bot.result("loop/waitForTurn", {"sessionId": sid, "turnId": made["turnId"]})
            sent = await bot.result("loop/send", {
                "sessionId": sid, "text": f"{SECRET} with files", "idempotencyKey": "k1",
                "attachments": [{"data": _data_url(shared), "name": "s.bin"},
                                {"data": _data_url(own), "name": "o.bin"}]})
            await bot.result("loop/waitForTurn", {"sessionId": sid, "turnId": sent["turnId"]})
            await c.result("session/subscribe", {"sessionId": sid})
            await c.result("presence/update", {"active": True})
            write = json.dumps({"path": "approved.txt", "content": SECRET})
            await c.result("turn/send", {"sessionId": sid, "content": f"!tool write_file {write}"})
            approval = (await c.push(lambda m: m["method"] == "approval/requested"))["params"]["approval"]
            await c.result("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                                "contentHash": approval["contentHash"]})
            await c.turn_done(sid)
            await accept_calls(c, sid)
            await background_command(c, sid, f"echo '{SECRET}' > note.txt; sleep {command}")
            await until_running(command)
            kept = await new_session(c, "keeps the shared attachment")
            await c.result("turn/send", {"sessionId": kept, "content": "the same file",
                                         "attachments": [{"data": _data_url(shared), "name": "s.bin"}]})
            await c.turn_done(kept)
            workspace = os.path.join(data, "workspaces", sid)
            assert os.path.exists(os.path.join(workspace, "approved.txt"))
            before = (await bot.result("loop/listEvents", {"sessionId": sid}))["events"]
            assert before, "the feed had the session's events before the delete"
            assert await c.result("session/delete", {"sessionId": sid}) == {}
            feed = (await bot.result("loop/listEvents", {}))["events"]
            retried_send = await bot.call("loop/send", {"sessionId": sid, "text": f"{SECRET} with files",
                                                        "idempotencyKey": "k1"})
            retried_create = await bot.call("loop/create", {"containerId": "inbox", "initialMessage": {
                "text": f"{SECRET} first", "idempotencyKey": "create-1"}})
            listed = [s["id"] for s in (await bot.result("sessions/list", {"limit": 200}))["sessions"]]
            return Deleted(data, sid, kept, hashlib.sha256(shared).hexdigest(), hashlib.sha256(own).hexdigest(),
                           workspace, feed, retried_send, retried_create, listed)

    try:
        return run(go())
    finally:
        server.stop()


def test_the_deleted_session_is_only_its_tombstone_in_the_store_and_nothing_of_it_is_in_the_global_log(deleted):
    store = open_store(os.path.join(deleted.data, "store"), readonly=True)
    try:
        stream = f"session-{deleted.sid}"
        assert [type(e.event) for e in store.read_stream(stream)] == [E.SessionDeleted]
        assert store.load_snapshot(stream) is None
        owned = [s for cat in ("approval", "task") for s in store.list_streams(cat, None, 1000).streams
                 if s.split("-", 1)[1].startswith(deleted.sid + ".")]
        assert owned == []
        record = decode_summary_record(store.stream_meta(stream))
        assert record.deleted and record.title == "" and record.name == "" and record.last_reason is None
        assert store.flagged("files-pending") == []  # its files were deleted too
        logged = [json.dumps(event_to_builtins(e.event)) for e in store.iter_all()]
        assert not [line for line in logged if SECRET in line]
        assert any(deleted.kept in line for line in logged)  # the other session is untouched
        assert store.audit() == []
    finally:
        store.close()


def test_the_deleted_sessions_own_attachment_and_workspace_are_gone_and_an_attachment_another_session_sent_stays(
        deleted):
    blobs = os.path.join(deleted.data, "blobs")
    assert not os.path.exists(os.path.join(blobs, deleted.own[:2], deleted.own))
    assert os.path.exists(os.path.join(blobs, deleted.shared[:2], deleted.shared))
    assert os.listdir(os.path.join(blobs, deleted.shared[:2], deleted.shared + ".refs")) == [deleted.kept]
    assert not os.path.exists(os.path.join(blobs, "sessions", deleted.sid))
    assert not os.path.exists(deleted.workspace)


def test_the_apps_feed_serves_nothing_of_the_deleted_session_and_retries_of_its_keys_are_not_found(deleted):
    assert [e for e in deleted.feed if e["sessionId"] == deleted.sid] == []
    assert app_code(deleted.retried_send) == "not-found"
    assert app_code(deleted.retried_create) == "not-found"  # the create is not made again
    assert deleted.listed_by_app == []


@pytest.mark.parametrize("args", [["events"], ["events", "--json"], ["replay"], ["replay", "--json"],
                                  ["replay", "--verify", "--offline"], ["rerun", "--from-turn", "0"]])
def test_events_replay_rerun_and_the_json_export_of_a_deleted_session_answer_not_found_in_one_line(deleted, args):
    result = CliRunner().invoke(cli_main, [args[0], deleted.sid, "--data", deleted.data, *args[1:]])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "not found" in lines[0] and "deleted" in lines[0], result.output
    assert SECRET not in result.output
