"""Seed 004, 后台任务: exec moves to the background after the yield timeout; tasks as actors."""

from __future__ import annotations

import time

import pytest

from actors.gateway import SessionProtocolService
from eventstore import events as E
from tests.actors.gateway_harness import MemoryClient


@pytest.fixture
def bg(open_host):
    host = open_host(permission_mode="acceptCalls", exec_yield_s=0.2)
    svc = SessionProtocolService(host.rt, host=host)
    client = MemoryClient(svc)
    return host, svc, client


def new_session(client: MemoryClient) -> str:
    sid = client.result("session/create", {})["session"]["id"]
    client.result("session/subscribe", {"sessionId": sid})
    return sid


def wait_task(client: MemoryClient, status: str, timeout: float = 10) -> dict:
    frame = client.wait(lambda f: f.get("method") == "background/changed"
                        and any(t["status"] == status for t in f["params"]["upserts"]), timeout)
    return next(t for t in frame["params"]["upserts"] if t["status"] == status)


def test_a_long_exec_hands_back_a_task_id_and_keeps_running(bg):
    host, svc, c = bg
    c.result("background/watch", {})
    sid = new_session(c)
    c.result("turn/send", {"sessionId": sid, "content": '!tool exec {"command": "echo begin; sleep 1; echo end"}'})
    card = c.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"]["kind"] == "tool-call",
                  10)["params"]["item"]
    assert card["status"] == "completed" and card["taskId"]
    running = wait_task(c, "running")
    assert running["id"] == card["taskId"] and running["call"]["callId"] == card["itemId"]
    assert running["display"]["kind"] == "command"
    done = wait_task(c, "completed")
    assert done["exitCode"] == 0 and done["lastLine"] == "end"
    out = c.result("background/output", {"taskId": done["id"]})
    assert out["text"] == "begin\nend\n" and out["end"] == len("begin\nend\n") and out["truncated"] is False
    tail = c.result("background/output", {"taskId": done["id"], "after": 6})
    assert tail["text"] == "end\n"


def test_a_finished_task_posts_a_notice_that_opens_a_turn(bg):
    host, svc, c = bg
    sid = new_session(c)
    c.result("turn/send", {"sessionId": sid, "content": '!tool exec {"command": "sleep 0.5; exit 3"}'})
    notice = c.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"]["kind"] == "notice"
                    and f["params"]["item"]["topic"] == "background-task", 10)["params"]["item"]
    assert notice["facts"]["exitCode"] == 3 and notice["facts"]["status"] == "failed"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        turns = [e for e in host.session(sid).events() if isinstance(e.event, E.TurnStarted)]
        if len(turns) == 2:
            break
        time.sleep(0.02)
    assert turns[1].event.source == "background-task"


def test_the_model_can_ask_for_the_background_at_once(bg):
    host, svc, c = bg
    sid = new_session(c)
    started = time.monotonic()
    c.result("turn/send", {"sessionId": sid, "content": '!tool exec {"command": "sleep 3", "background": true}'})
    card = c.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"]["kind"] == "tool-call",
                  10)["params"]["item"]
    assert card["taskId"] and time.monotonic() - started < 2
    c.result("background/stop", {"taskId": card["taskId"]})


def test_stop_waits_until_the_task_settles_and_sends_the_model_no_notice(bg):
    host, svc, c = bg
    c.result("background/watch", {})
    sid = new_session(c)
    c.result("turn/send", {"sessionId": sid, "content": '!tool exec {"command": "sleep 30"}'})
    task = wait_task(c, "running")
    assert c.result("background/stop", {"taskId": task["id"]}) == {}
    listed = {t["id"]: t for t in c.result("background/list", {})["tasks"]}
    assert listed[task["id"]]["status"] == "stopped"
    time.sleep(0.3)
    assert not [e for e in host.session(sid).events() if isinstance(e.event, E.NoticePosted)
                and e.event.topic == "background-task"]


def test_stop_all_stops_the_tasks_of_a_session(bg):
    host, svc, c = bg
    sid = new_session(c)
    for i in range(2):
        c.result("turn/send", {"sessionId": sid, "content": f'!tool exec {{"command": "sleep 30", "background": true}}'})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and host.rt.tasks_service.running_count(sid) < 2:
        time.sleep(0.02)
    assert c.result("background/stopAll", {"sessionId": sid}) == {}
    assert host.rt.tasks_service.running_count(sid) == 0
    assert {t["status"] for t in c.result("background/list", {})["tasks"]} == {"stopped"}


def test_an_unknown_task_is_not_found(bg):
    host, svc, c = bg
    assert c.call("background/output", {"taskId": "nope"})["error"]["data"]["code"] == "not-found"
    assert c.call("background/stop", {"taskId": "nope"})["error"]["data"]["code"] == "not-found"


def test_the_summary_counts_running_background_work(bg):
    host, svc, c = bg
    sid = new_session(c)
    c.result("turn/send", {"sessionId": sid, "content": '!tool exec {"command": "sleep 30", "background": true}'})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        listed = c.result("sessions/list", {"background": True})["sessions"]
        if listed:
            break
        time.sleep(0.05)
    assert [s["id"] for s in listed] == [sid] and listed[0]["background"] == 1
    c.result("background/stopAll", {"sessionId": sid})


def test_after_a_restart_running_tasks_are_recorded_aborted_and_keep_their_display(open_host):
    host = open_host(permission_mode="acceptCalls", exec_yield_s=0.1)
    s = host.create()
    s.run('!tool exec {"command": "sleep 30", "background": true}')
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not host.store.flagged("task-running"):
        time.sleep(0.02)
    [stream] = host.store.flagged("task-running")
    host.rt.tasks_service.actors.clear()  # as after a crash: nobody records the end
    host.close()
    again = open_host(permission_mode="acceptCalls")
    [task] = again.rt.tasks_service.listing()
    assert task.status == "aborted" and "stopped while the task was running" in task.reason
    assert task.display.command == "sleep 30"
    assert again.store.flagged("task-running") == []


def test_output_older_than_the_kept_tail_is_reported_truncated(bg):
    host, svc, c = bg
    c.result("background/watch", {})
    sid = new_session(c)
    c.result("turn/send", {"sessionId": sid, "content":
                           '!tool exec {"command": "head -c 300000 /dev/zero | tr \\"\\\\\\\\0\\" a", "background": true}'})
    done = wait_task(c, "completed")
    whole = c.result("background/output", {"taskId": done["id"]})
    assert whole["end"] == 300_000 and whole["truncated"] is True
    assert len(whole["text"]) == 256 * 1024 and set(whole["text"]) == {"a"}
    recent = c.result("background/output", {"taskId": done["id"], "after": 299_990})
    assert recent == {"text": "a" * 10, "end": 300_000, "truncated": False}
