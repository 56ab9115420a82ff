"""Bots describe the rooms they create (SPEC §5; seed 004 摘要, 分组, 搜索, 场所), over a real server:
the chat window, the bot account and the window place a bot gives ``loop/create`` show in the
listing, its groups, its search and the settings layers."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.conftest import initialized, open_client

pytestmark = pytest.mark.e2e

BOT_TOKEN = "im-bridge-bot-token-" + "b" * 20
APPS = f"""
[apps.imbot]
token = "{BOT_TOKEN}"
name = "IM Bridge"
platform = "onebot"
containers = ["rooms"]
"""
GROUP_KEY = "onebot:10001:group:20001"


@pytest.fixture
def server(apps_server):
    return apps_server(APPS)


def test_rooms_a_bot_describes_are_listed_grouped_found_and_have_a_place_layer(server):
    async def go():
        async with open_client(server, BOT_TOKEN) as bot_ws:
            bot = await initialized(bot_ws)
            group = await bot.result("loop/create", {
                "containerId": "rooms", "title": "Team", "account": "10001",
                "chat": {"type": "group", "multiParty": True}, "place": {"key": GROUP_KEY, "name": "Team chat"}})
            private = await bot.result("loop/create", {
                "containerId": "rooms", "title": "Alice", "account": "10002",
                "chat": {"type": "private"}, "place": {"key": "onebot:10002:private:555", "name": "Alice"}})
            misplaced = await bot.call("loop/create", {"space": {"spaceId": "s"}, "chat": {"type": "group"}})
        async with open_client(server) as ws:
            owner = await initialized(ws)
            listed = await owner.result("sessions/list", {"section": "rooms"})
            found = await owner.result("sessions/list", {"query": "onebot:20001"})
            layers = await owner.result("session/config/layers", {})
            await owner.result("session/config/layer/update", {"layer": {"scope": "place", "key": GROUP_KEY},
                                                               "plugin": "agent", "key": "maxSteps", "value": 7})
            rows = (await owner.result("session/config/get", {"sessionId": group["sessionId"]}))["items"]
        return group, private, misplaced, listed, found, layers, rows
    group, private, misplaced, listed, found, layers, rows = asyncio.run(go())
    by_id = {s["id"]: s for s in listed["sessions"]}
    team = by_id[group["sessionId"]]
    assert team["chat"] == {"type": "group", "multiParty": True} and team["account"] == "10001"
    assert team["place"] == {"key": GROUP_KEY, "kind": "window", "name": "Team chat"}
    assert by_id[private["sessionId"]]["chat"] == {"type": "private", "multiParty": False}
    assert listed["groups"] == [{"platform": "onebot", "instance": "imbot", "label": "IM Bridge", "rooms": 2,
                                 "accounts": 2, "attention": 0}]
    assert [s["id"] for s in found["sessions"]] == [group["sessionId"]]  # platform:group finds the room
    assert GROUP_KEY in str(layers)
    step_row = next(r for r in rows if (r["plugin"], r["key"]) == ("agent", "maxSteps"))
    assert (step_row["effective"], step_row["source"]) == (7, "place")
    assert misplaced["error"]["code"] == -32602 and "describe a room" in misplaced["error"]["message"]
