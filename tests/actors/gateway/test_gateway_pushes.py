"""Seed 004 pushes that are not items: session/resync after the history was rewritten."""

from __future__ import annotations

from tests.actors.approvals.test_approvals import turn_done
from tests.actors.gateway_harness import MemoryClient


def test_a_rewind_of_the_conversation_tells_subscribers_to_resync(service):
    host, svc = service(permission_mode="acceptCalls")
    c = MemoryClient(svc)
    sid = c.result("session/create", {})["session"]["id"]
    snap = c.result("session/subscribe", {"sessionId": sid})
    c.result("turn/send", {"sessionId": sid, "content": "one"})
    turn = turn_done(c, sid)
    c.result("turn/rewind", {"sessionId": sid, "turnId": turn["itemId"], "scope": "code-and-chat"})
    resync = c.wait(lambda f: f.get("method") == "session/resync", 10)["params"]
    assert resync["sessionId"] == sid and resync["epoch"] == snap["epoch"] and resync["seq"] > snap["seq"]
    again = c.result("session/subscribe", {"sessionId": sid})
    assert [i for i in again["items"] if i["kind"] in ("user-message", "agent-message")] == []
