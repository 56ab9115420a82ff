"""Who may change what, over a real server (SPEC §7): an app's manifest bounds its sessions, and
the owner's approval grants are made, listed and revoked over the protocol (0.2.1)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.e2e.conftest import initialized, open_client

pytestmark = pytest.mark.e2e

LIMITED_TOKEN = "limited-bot-token-" + "l" * 20
APPS = f"""
[apps.limited]
token = "{LIMITED_TOKEN}"
platform = "im"
containers = ["inbox"]
permission_modes = ["ask", "deny"]
sandbox = "read-only"
"""


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def server(apps_server):
    return apps_server(APPS)


def test_an_app_cannot_switch_its_background_session_to_accept_calls_or_widen_its_sandbox(server):
    async def go():
        async with open_client(server, LIMITED_TOKEN) as ws:
            c = await initialized(ws)
            sid = (await c.result("loop/create", {"containerId": "inbox", "activity": "background"}))["sessionId"]
            refused = [await c.call("session/config/update", {"sessionId": sid, "plugin": "tools", "key": k,
                                                               "value": v})
                       for k, v in (("permissionMode", "acceptCalls"), ("sandbox", "danger-full-access"))]
            asked = await c.call("loop/create", {"containerId": "inbox", "permissionMode": "acceptCalls"})
            rows = (await c.result("session/config/get", {"sessionId": sid}))["items"]
            return refused, asked, {(r["plugin"], r["key"]): r for r in rows}
    refused, asked, rows = run(go())
    assert [r["error"]["data"]["code"] for r in refused] == ["forbidden", "forbidden"], refused
    assert asked["error"]["data"]["code"] == "forbidden"
    mode = rows[("tools", "permissionMode")]
    assert "value" not in mode and mode["actual"]["value"] == "ask"  # a background session, held to its manifest


def test_an_owner_grant_runs_later_matching_commands_and_is_listed_and_revoked_over_the_wire(server):
    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            await c.result("presence/update", {"active": True})
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": sid})

            async def exec_(command: str) -> None:
                await c.result("turn/send", {"sessionId": sid,
                                             "content": "!tool exec " + json.dumps({"command": command})})

            await exec_("echo first")
            approval = (await c.push(lambda m: m["method"] == "approval/requested"))["params"]["approval"]
            await c.result("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                                "contentHash": approval["contentHash"],
                                                "grant": {"scope": "session", "commandPrefix": "echo"}})
            await c.turn_done(sid)
            await exec_("echo second")
            card = (await c.push(lambda m: m["method"] == "item/completed"
                                 and m["params"]["item"]["kind"] == "tool-call"
                                 and m["params"]["item"]["status"] == "completed"
                                 and "second" in json.dumps(m["params"]["item"].get("args")), 20))["params"]["item"]
            await c.turn_done(sid)
            listed = await c.result("approval/grants/list", {"sessionId": sid})
            revoked = await c.result("approval/grants/revoke", {"sessionId": sid, "grantId": approval["id"]})
            after = await c.result("approval/grants/list", {"sessionId": sid})
            await exec_("echo third")
            again = (await c.push(lambda m: m["method"] == "approval/requested", 20))["params"]["approval"]
            return approval, card, listed, revoked, after, again
    approval, card, listed, revoked, after, again = run(go())
    assert card["settlement"] == {**card["settlement"], "source": "grant", "grantId": approval["id"]}
    assert [g["terms"]["commandPrefix"] for g in listed["grants"]] == ["echo"]
    assert revoked == {} and after == {"grants": []}
    assert again["facts"]["command"] == "echo third"  # asked again once revoked
