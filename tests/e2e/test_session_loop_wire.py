"""The Session Loop API over the wire (loop/*), authenticated as apps from apps.toml."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.conftest import initialized, open_client

pytestmark = pytest.mark.e2e

def run(coro):
    return asyncio.run(coro)


def test_a_bot_creates_sends_waits_and_lists_events_over_the_wire(app_server):
    async def go():
        async with open_client(app_server, "bot-token-for-the-end-to-end-tests") as ws:
            c = await initialized(ws)
            created = await c.result("loop/create", {"containerId": "inbox", "title": "Alice",
                                                     "initialMessage": {"text": "hello", "idempotencyKey": "w1"}})
            first = await c.result("loop/waitForTurn", {"sessionId": created["sessionId"], "turnId": created["turnId"]})
            receipt = await c.result("loop/send", {"sessionId": created["sessionId"], "text": "weather?",
                                                   "idempotencyKey": "msg-123"})
            dup = await c.result("loop/send", {"sessionId": created["sessionId"], "text": "weather?",
                                               "idempotencyKey": "msg-123"})
            conflict = await c.call("loop/send", {"sessionId": created["sessionId"], "text": "other",
                                                  "idempotencyKey": "msg-123"})
            done = await c.result("loop/waitForTurn", {"sessionId": created["sessionId"], "turnId": receipt["turnId"],
                                                       "timeoutMs": 30000})
            events = await c.result("loop/listEvents", {"sessionId": created["sessionId"]})
            since = await c.result("loop/listEvents", {"after": receipt["cursor"]})
            return created, first, receipt, dup, conflict, done, events, since
    created, first, receipt, dup, conflict, done, events, since = run(go())
    assert first == {"state": "completed", "outputText": "echo: hello"}
    assert receipt["state"] == "accepted" and dup["state"] == "duplicate" and dup["turnId"] == receipt["turnId"]
    assert conflict["error"]["data"]["code"] == "conflict"
    assert done == {"state": "completed", "outputText": "echo: weather?"}
    assert [e["type"] for e in events["events"]].count("turn.completed") == 2
    assert {e["turnId"] for e in since["events"]} == {receipt["turnId"]}


def test_wait_for_turn_times_out_without_cancelling_the_turn(app_server):
    async def go():
        async with open_client(app_server, "bot-token-for-the-end-to-end-tests") as ws:
            c = await initialized(ws)
            sid = (await c.result("loop/create", {"containerId": "inbox"}))["sessionId"]
            r = await c.result("loop/send", {"sessionId": sid, "text": "!sleep 1500\nslow", "idempotencyKey": "s"})
            early = await c.result("loop/waitForTurn", {"sessionId": sid, "turnId": r["turnId"], "timeoutMs": 1})
            late = await c.result("loop/waitForTurn", {"sessionId": sid, "turnId": r["turnId"]})
            return early, late
    early, late = run(go())
    assert early == {"state": "timeout"} and late["outputText"] == "echo: slow"


def test_loop_watch_pushes_the_apps_events(app_server):
    async def go():
        async with open_client(app_server, "bot-token-for-the-end-to-end-tests") as ws:
            c = await initialized(ws)
            await c.result("loop/watch", {})
            sid = (await c.result("loop/create", {"containerId": "inbox"}))["sessionId"]
            await c.result("loop/send", {"sessionId": sid, "text": "hi", "idempotencyKey": "k"})
            return await c.push(lambda m: m["method"] == "loop/event"
                                and m["params"]["event"]["type"] == "turn.completed")
    event = run(go())["params"]["event"]
    assert event["data"]["outputText"] == "echo: hi"


def test_apps_are_isolated_and_the_owner_cannot_use_loop_methods(app_server):
    async def go():
        async with (open_client(app_server, "bot-token-for-the-end-to-end-tests") as a,
                    open_client(app_server, "other-token-for-the-end-to-end-tests") as b,
                    open_client(app_server) as owner):
            ca, cb, co = await initialized(a), await initialized(b), await initialized(owner)
            mine = (await ca.result("loop/create", {"containerId": "inbox"}))["sessionId"]
            theirs = await cb.call("loop/send", {"sessionId": mine, "text": "x", "idempotencyKey": "x"})
            their_list = await cb.result("sessions/list", {})
            their_sub = await cb.call("session/subscribe", {"sessionId": mine})
            owner_loop = await co.call("loop/create", {"containerId": "inbox"})
            owner_list = await co.result("sessions/list", {})
            undeclared = await ca.call("loop/create", {"containerId": "nope"})
            both = await ca.call("loop/create", {"containerId": "inbox", "space": {"spaceId": "s"}})
            caller = await ca.call("loop/create", {"containerId": "inbox", "context": "caller"})
            return mine, theirs, their_list, their_sub, owner_loop, owner_list, undeclared, both, caller
    mine, theirs, their_list, their_sub, owner_loop, owner_list, undeclared, both, caller = run(go())
    assert theirs["error"]["data"]["code"] == "not-found"
    assert their_list["sessions"] == [] and their_sub["error"]["data"]["code"] == "not-found"
    assert owner_loop["error"]["data"]["code"] == "forbidden"
    room = [s for s in owner_list["sessions"] if s["id"] == mine][0]  # the owner sees the bot's room
    assert room["kind"] == "room" and room["section"] == "rooms" and room["platform"] == "telegram"
    assert {"platform": "telegram", "instance": "mybot"}.items() <= owner_list["groups"][0].items()
    assert "nope" in undeclared["error"]["message"]
    assert both["error"]["code"] == -32602
    assert "inside a tool" in caller["error"]["message"]
