"""``sessionloop replay --verify`` passes on healthy sessions after every owner action a server
serves (SPEC §9): background tasks stopped with ``sessionloop tasks stop`` or ended by
themselves, approvals approved, denied and settled by a grant, rewinds, compressions and forks.

Each session is made on a real ``sessionloop serve`` subprocess over real WebSockets (the owner's
actions through the real CLI where the CLI is how an owner does it); then ``replay --verify`` is
run three ways: against the running server over the wire (``--url``), with the store only
(``--offline``), and, after the server stopped, against a live host opened on the data directory.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from click.testing import CliRunner

from sessionloop.actors.api.host import Host
from sessionloop.cli.main import main
from tests.e2e.conftest import TOKEN, Client, initialized, open_client

pytestmark = pytest.mark.e2e

WAIT_S = 15.0


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def verify_json(sid: str, data_dir: str, *extra: str) -> tuple[int, dict[str, Any]]:
    out = cli("replay", sid, "--data", data_dir, "--verify", "--json", *extra)
    return out.exit_code, json.loads(out.stdout)


def assert_verifies_while_serving(server: Any, sid: str) -> None:
    """``--verify --url`` (what the server answers) and ``--verify --offline`` (the store) pass."""
    for extra in (("--url", server.url, "--token", TOKEN), ("--offline",)):
        code, report = verify_json(sid, server.data_dir, *extra)
        assert code == 0 and "difference" not in report, (extra, report)
    assert report["events"] > 0


def assert_verifies_with_a_live_host(data_dir: str, sid: str) -> dict[str, Any]:
    code, report = verify_json(sid, data_dir)
    assert code == 0 and "difference" not in report, report
    assert report["compared"] == "live", report
    return report


def wait_until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


async def new_session(c: Client, mode: str | None = None) -> str:
    sid = (await c.result("session/create", {}))["session"]["id"]
    await c.result("session/subscribe", {"sessionId": sid})
    if mode is not None:
        await c.result("session/config/update", {"sessionId": sid, "plugin": "tools", "key": "permissionMode",
                                                 "value": mode})
    return sid


async def send(c: Client, sid: str, text: str) -> None:
    await c.result("turn/send", {"sessionId": sid, "content": text})
    await c.turn_done(sid)


def exec_line(command: str, **extra: Any) -> str:
    return "!tool exec " + json.dumps({"command": command, **extra})


async def background_task(c: Client, sid: str, command: str) -> str:
    await c.result("turn/send", {"sessionId": sid, "content": exec_line(command, background=True)})
    card = await c.push(lambda m: m["method"] == "item/completed" and m["params"]["sessionId"] == sid
                        and m["params"]["item"]["kind"] == "tool-call" and m["params"]["item"].get("taskId"))
    await c.turn_done(sid)
    return str(card["params"]["item"]["taskId"])


def task_status(env: dict[str, str], task_id: str) -> str:
    listed = json.loads(cli("tasks", "ls", "--json", env=env).stdout)
    return next(t["status"] for t in listed if t["id"] == task_id)


# --- background tasks ------------------------------------------------------------------------------


def test_verify_passes_after_a_background_task_is_stopped_with_tasks_stop(server):
    env = {"SESSIONLOOP_URL": server.url, "SESSIONLOOP_TOKEN": TOKEN}

    async def go() -> tuple[str, str]:
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "acceptCalls")
            task_id = await background_task(c, sid, "echo stop-me; sleep 30")
            return sid, task_id

    sid, task_id = run(go())
    stopped = cli("tasks", "stop", task_id, env=env)
    assert stopped.exit_code == 0 and "stopped" in stopped.stdout, stopped.output
    assert task_status(env, task_id) == "stopped"
    assert_verifies_while_serving(server, sid)
    server.stop()
    assert_verifies_with_a_live_host(server.data_dir, sid)


def test_verify_passes_after_a_background_task_ends_by_itself_and_the_model_is_told(server):
    env = {"SESSIONLOOP_URL": server.url, "SESSIONLOOP_TOKEN": TOKEN}

    async def go() -> tuple[str, str]:
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "acceptCalls")
            task_id = await background_task(c, sid, "sleep 0.3; echo done-by-itself")
            await c.turn_done(sid)  # the end notice is an input: the model is told in a turn of its own
            return sid, task_id

    sid, task_id = run(go())
    assert task_status(env, task_id) == "completed"
    assert_verifies_while_serving(server, sid)
    server.stop()
    assert_verifies_with_a_live_host(server.data_dir, sid)


def test_verify_passes_after_stop_all_of_a_sessions_background_work(server):
    env = {"SESSIONLOOP_URL": server.url, "SESSIONLOOP_TOKEN": TOKEN}

    async def go() -> str:
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "acceptCalls")
            await background_task(c, sid, "sleep 30")
            await background_task(c, sid, "sleep 31")
            return sid

    sid = run(go())
    result = cli("tasks", "stop-all", sid, env=env)
    assert result.exit_code == 0 and "2 task(s) ended" in result.stdout, result.output
    assert_verifies_while_serving(server, sid)
    server.stop()
    assert_verifies_with_a_live_host(server.data_dir, sid)


def test_verify_passes_after_a_restart_records_a_running_background_task_aborted(server_factory, tmp_path):
    first = server_factory()

    async def go() -> str:
        async with open_client(first) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "acceptCalls")
            await background_task(c, sid, "sleep 60")
            return sid

    sid = run(go())
    first.stop()
    second = server_factory()  # the same data directory: the task of the first run is recorded aborted
    assert_verifies_while_serving(second, sid)
    second.stop()
    assert_verifies_with_a_live_host(second.data_dir, sid)


# --- approvals -------------------------------------------------------------------------------------


async def approve_next(c: Client, sid: str, decision: str, grant: dict[str, Any] | None = None) -> None:
    pushed = await c.push(lambda m: m["method"] == "approval/requested" and m["params"]["approval"]["sessionId"] == sid)
    approval = pushed["params"]["approval"]
    params: dict[str, Any] = {"approvalId": approval["id"], "decision": decision,
                              "contentHash": approval["contentHash"]}
    if grant is not None:
        params["grant"] = grant
    await c.result("approval/respond", params)


def test_verify_passes_after_approvals_approved_denied_and_settled_by_a_grant(server):
    async def go() -> str:
        async with open_client(server) as ws:
            c = await initialized(ws)
            await c.result("presence/update", {"active": True})
            sid = await new_session(c)  # ask: the owner's default
            await c.result("turn/send", {"sessionId": sid, "content": exec_line("echo approved")})
            await approve_next(c, sid, "approve")
            await c.turn_done(sid)
            await c.result("turn/send", {"sessionId": sid, "content": exec_line("echo denied")})
            await approve_next(c, sid, "deny")
            await c.turn_done(sid)
            await c.result("turn/send", {"sessionId": sid, "content": exec_line("echo granted")})
            await approve_next(c, sid, "approve", {"scope": "session", "commandPrefix": "echo"})
            await c.turn_done(sid)
            await send(c, sid, exec_line("echo by-the-grant"))  # no approval asked: the grant settles it
            return sid

    sid = run(go())
    assert_verifies_while_serving(server, sid)
    server.stop()
    assert_verifies_with_a_live_host(server.data_dir, sid)


# --- rewinds, compressions, forks ------------------------------------------------------------------


def test_verify_passes_after_rewinds_of_code_and_of_code_and_chat(server):
    async def go() -> str:
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "acceptCalls")
            turns = []
            for content in ("one", "two", "three"):
                await c.result("turn/send", {"sessionId": sid, "content": "!tool write_file " + json.dumps(
                    {"path": "f.txt", "content": content})})
                done = await c.turn_done(sid)
                turns.append(done["params"]["item"]["turnId"])
            await c.result("turn/rewind", {"sessionId": sid, "turnId": turns[2], "scope": "code"})
            await c.result("turn/rewind", {"sessionId": sid, "turnId": turns[1], "scope": "code-and-chat"})
            await send(c, sid, "after the rewind")
            return sid

    sid = run(go())
    assert_verifies_while_serving(server, sid)
    server.stop()
    assert_verifies_with_a_live_host(server.data_dir, sid)


def test_verify_passes_after_a_compression_and_a_turn_after_it(server):
    async def go() -> str:
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = await new_session(c)
            for text in ("first question", "second question"):
                await send(c, sid, text)
            await c.result("session/compress", {"sessionId": sid})
            await send(c, sid, "after the compression")
            return sid

    sid = run(go())
    assert_verifies_while_serving(server, sid)
    server.stop()
    assert_verifies_with_a_live_host(server.data_dir, sid)


def test_verify_passes_on_a_fork_and_on_the_session_it_was_forked_from(server):
    async def go() -> str:
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = await new_session(c, "acceptCalls")
            for text in ("first", '!tool write_file {"path": "a.txt", "content": "a"}', "third"):
                await send(c, sid, text)
            return sid

    sid = run(go())
    server.stop()
    with Host.open(server.data_dir, durability="nosync") as host:
        fork = host.fork(sid, turns=2, title="fork")
        assert fork.run("on the fork", timeout=WAIT_S).state == "completed"
        fork_id = fork.id
    for session_id in (sid, fork_id):
        assert_verifies_with_a_live_host(server.data_dir, session_id)
        code, report = verify_json(session_id, server.data_dir, "--offline")
        assert code == 0, report
