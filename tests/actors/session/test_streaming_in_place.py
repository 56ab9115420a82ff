"""Answers the mock gives at once are taken in place (inside their step's commit) and still stream:
the cases the wire tests do not reach (a failure after reasoning, queued turns answered in one
commit, a failed commit, a bot in process), on a real host through the gateway without sockets."""

from __future__ import annotations

import threading
from typing import Any

from sessionloop.actors import events as E
from tests.actors.approvals.test_approvals import turn_done
from tests.actors.gateway_harness import MemoryClient, wait_until
from tests.e2e.test_streaming_wire import TOOL, shape, streamed


def item_pushes(c: MemoryClient, sid: str) -> list[dict[str, Any]]:
    return [f for f in c.frames if f.get("method", "").startswith("item/") and f["params"]["sessionId"] == sid]


def one_turn(c: MemoryClient, text: str) -> list[dict[str, Any]]:
    """The pushes a subscriber of a fresh session gets for one turn of ``text``."""
    sid = c.result("session/create", {})["session"]["id"]
    c.result("session/subscribe", {"sessionId": sid})
    c.result("turn/send", {"sessionId": sid, "content": text})
    turn_done(c, sid)
    return item_pushes(c, sid)


def test_a_failure_after_reasoning_taken_at_once_streams_the_reasoning_as_one_streamed_over_time(service):
    host, svc = service(permission_mode="acceptCalls")
    c = MemoryClient(svc)
    at_once = one_turn(c, "!reason weighing it\n!error the model broke")
    over_time = one_turn(c, "!sleep 1\n!reason weighing it\n!error the model broke")
    assert shape(at_once) == shape(over_time)
    assert ("item/delta", "reasoning") in shape(at_once)
    deltas = [p["params"]["text"] for p in at_once if p["method"] == "item/delta"]
    assert "".join(deltas) == "weighing it"


def test_turns_queued_behind_a_slow_one_answered_in_one_commit_each_stream_before_they_complete(service):
    host, svc = service(permission_mode="acceptCalls")
    c = MemoryClient(svc)
    sid = c.result("session/create", {})["session"]["id"]
    c.result("session/subscribe", {"sessionId": sid})
    texts = ["!sleep 200\nslow one", "second", f"third\n{TOOL}", "fourth, a longer answer than the others"]
    for text in texts:
        c.result("turn/send", {"sessionId": sid, "content": text})
    wait_until(lambda: sum(1 for p in item_pushes(c, sid) if p["method"] == "item/completed"
                           and p["params"]["item"]["kind"] == "turn") == len(texts), 15, "every turn to end")
    pushes = item_pushes(c, sid)
    order = shape(pushes)
    answers = streamed(pushes, "agent-message")
    assert [done for _, done in answers] == ["echo: slow one", "echo: second", "done: 1 tool calls",
                                             "echo: fourth, a longer answer than the others"]
    assert all(joined == done for joined, done in answers), answers
    assert order.count(("item/started", "agent-message")) == order.count(("item/completed", "agent-message")) == 4
    seqs = [p["params"]["seq"] for p in pushes]
    assert seqs == sorted(set(seqs))
    # the queued turns after the slow one were answered in place: one commit each at most
    llm_done = [e.event for e in host.session(sid).events() if isinstance(e.event, E.LlmCompleted)]
    assert all(e.duration_ms < 100 for e in llm_done[1:])
    assert not host.rt.channel(sid).streaming  # nothing half streamed is left for a later snapshot
    again = c.result("session/subscribe", {"sessionId": sid})
    assert [i["text"] for i in again["items"] if i["kind"] == "agent-message"] == [d for _, d in answers]


def test_an_answer_taken_at_once_whose_commit_fails_streams_nothing_and_sent_again_streams_once(service):
    host, svc = service(permission_mode="acceptCalls")
    c = MemoryClient(svc)
    sid = c.result("session/create", {})["session"]["id"]
    c.result("session/subscribe", {"sessionId": sid})
    host.rt.faults.arm("before-commit", RuntimeError("the store gave up"))
    refused = c.call("turn/send", {"sessionId": sid, "content": "hello"})
    assert "error" in refused, refused
    c.result("turn/send", {"sessionId": sid, "content": "hello"})
    turn_done(c, sid)
    order = shape(item_pushes(c, sid))
    assert order.count(("item/started", "agent-message")) == 1
    assert streamed(item_pushes(c, sid), "agent-message") == [("echo: hello", "echo: hello")]


def bot_turn(loop_host: Any, text: str, key: str) -> list[Any]:
    """The events an in-process bot's ``on_did_receive_event`` gets for one turn of ``text``."""
    bot = loop_host.sessions(app="mybot")
    session = bot.create(container_id="inbox")
    seen: list[Any] = []
    ended = threading.Event()

    def watch(event: Any) -> None:
        if event.session_id == session.session_id:
            seen.append(event)
            if event.type in ("turn.completed", "turn.failed"):
                ended.set()

    unsubscribe = bot.on_did_receive_event(watch)
    try:
        bot.send(session.session_id, text, idempotency_key=key)
        assert ended.wait(15)
    finally:
        unsubscribe()
    return seen


def test_a_bot_in_process_gets_the_same_events_for_a_tool_turn_taken_at_once_as_for_one_streamed(open_host):
    loop_host = open_host(permission_mode="acceptCalls")
    loop_host.register_app("mybot", platform="telegram", containers=["inbox"])
    at_once = bot_turn(loop_host, TOOL, "a")
    over_time = bot_turn(loop_host, f"!sleep 1\n{TOOL}", "b")
    assert [e.type for e in at_once] == [e.type for e in over_time]
    assert [e.type for e in at_once] == ["turn.started", "tool.started", "tool.finished", "assistant.delta",
                                         "assistant.delta", "assistant.delta", "assistant.message", "turn.completed"]
    deltas = "".join(e.data["text"] for e in at_once if e.type == "assistant.delta")
    assert deltas == "done: 1 tool calls" == at_once[-2].data["text"]


def test_a_subscriber_attached_while_a_commit_fails_gets_every_push_of_the_next_commit(service):
    """The session reloads from its events after the failure; the subscriber stays attached and must
    get the next commit's pushes (the projection used to be rebuilt lazily from a store that
    already held that commit, so they were lost)."""
    host, svc = service(permission_mode="acceptCalls")
    c = MemoryClient(svc)
    sid = c.result("session/create", {})["session"]["id"]
    c.result("session/subscribe", {"sessionId": sid})
    host.rt.faults.arm("before-commit", RuntimeError("the store gave up"))
    assert "error" in c.call("session/rename", {"sessionId": sid, "title": "lost"})
    c.result("turn/send", {"sessionId": sid, "content": "hello"})
    turn_done(c, sid)
    assert shape(item_pushes(c, sid)) == shape(one_turn(c, "hello"))
