"""Seed 004, 在场与审批: the presence window, presence held by an unsettled approval, approval
timers that do not depend on the session actor, and the approval's ``chain`` for child sessions.
A real host on LMDB with in-memory clients; timers made short through the host options."""

from __future__ import annotations

import time

from sessionloop.actors import events as E
from sessionloop.actors.session.commands import StateCopy
from sessionloop.actors.session.messages import Ask
from tests.actors.gateway_harness import MemoryClient, wait_until


def send_exec(client: MemoryClient, sid: str, command: str = "echo hi") -> None:
    client.result("turn/send", {"sessionId": sid, "content": f'!tool exec {{"command": "{command}"}}'})


def new_session(client: MemoryClient, subscribe: bool = True, **params) -> str:
    sid = client.result("session/create", params)["session"]["id"]
    if subscribe:
        client.result("session/subscribe", {"sessionId": sid})
    return sid


def requested(client: MemoryClient, sid: str, timeout: float = 5) -> dict:
    return client.wait(lambda f: f.get("method") == "approval/requested"
                       and f["params"]["approval"]["sessionId"] == sid, timeout)["params"]["approval"]


def tool_card(client: MemoryClient, sid: str, status: str, timeout: float = 5) -> dict:
    return client.wait(lambda f: f.get("method") == "item/completed" and f["params"]["sessionId"] == sid
                       and f["params"]["item"]["kind"] == "tool-call" and f["params"]["item"]["status"] == status,
                       timeout)["params"]["item"]


def last_finished(host, sid: str) -> E.ToolFinished | None:
    found = [e.event for e in host.session(sid).events() if isinstance(e.event, E.ToolFinished)]
    return found[-1] if found else None


def test_a_connection_is_present_for_the_window_after_its_last_active_report(service):
    host, svc = service(presence_window_s=0.5)
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    reported = time.monotonic()
    inside = new_session(c)
    send_exec(c, inside)
    approval = requested(c, inside)  # inside the window: pushed
    c.result("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                  "contentHash": approval["contentHash"]})
    tool_card(c, inside, "completed")
    assert time.monotonic() - reported < 0.5
    time.sleep(max(0.0, reported + 0.65 - time.monotonic()))  # the window is over
    assert host.rt.approvals.present_approvers() == []
    after = new_session(c)
    send_exec(c, after)
    assert tool_card(c, after, "denied")["settlement"]["source"] == "absent"  # nobody present: denied at once
    assert [f for f in c.pushes("approval/requested") if f["params"]["approval"]["sessionId"] == after] == []
    c.result("presence/update", {"active": True})  # a new report opens a new window
    again = new_session(c)
    send_exec(c, again)
    assert requested(c, again)["sessionId"] == again


def test_a_connection_holding_an_unsettled_approval_stays_present_after_its_window(service):
    host, svc = service(presence_window_s=0.2, approval_grace_s=0.2)
    holder = MemoryClient(svc)
    other = MemoryClient(svc)
    holder.result("presence/update", {"active": True})
    sid = new_session(holder)
    send_exec(holder, sid, "echo held")
    approval = requested(holder, sid)
    time.sleep(0.35)  # past the presence window: only the approval it holds keeps it present
    other.result("presence/update", {"active": False})  # makes every pending approval look at presence
    time.sleep(0.4)  # past the grace that would start if nobody were present
    assert holder.conn in host.rt.approvals.present_approvers()
    assert holder.pushes("approval/settled") == []
    assert holder.result("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                              "contentHash": approval["contentHash"]}) == {}
    assert tool_card(holder, sid, "completed")["settlement"]["source"] == "answer"
    # settled: it holds nothing now, and its window is long over
    wait_until(lambda: host.rt.approvals.present_approvers() == [], what="presence to end with the approval")


def test_approval_timers_survive_the_passivation_of_the_session_actor(service):
    host, svc = service(approval_wait_s=0.8, idle_timeout_s=0.05)
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    sid = new_session(c, subscribe=False)  # no subscriber: nothing but its own state keeps the actor live
    send_exec(c, sid, "echo later")
    requested(c, sid)
    settled = c.wait(lambda f: f.get("method") == "approval/settled", 5)["params"]
    assert (settled["state"], settled["source"]) == ("expired", "timeout")
    finished = wait_until(lambda: last_finished(host, sid), what="the denied tool call")
    assert finished.status == "denied" and finished.settlement.source == "timeout"
    # the idle sweeps (every ~12 ms) did ask the whole time; once the turn is over the actor does go
    wait_until(lambda: host.rt.directory.ref(sid) is None, what="the session actor's passivation")
    assert host.rt.directory.passivations >= 1


def test_the_chain_of_a_child_session_runs_from_below_the_root_down_to_it(service):
    host, svc = service()
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    root = new_session(c, name="root")
    child = new_session(c, name="child", parentId=root)
    grandchild = new_session(c, name="grandchild", parentId=child)
    for sid in (root, child, grandchild):
        send_exec(c, sid)
    assert "chain" not in requested(c, root)  # a root session has no chain
    assert requested(c, child)["chain"] == [{"id": child, "title": "child"}]
    assert requested(c, grandchild)["chain"] == [{"id": child, "title": "child"},
                                                 {"id": grandchild, "title": "grandchild"}]

    state = host.rt.ask(grandchild, lambda r: Ask(StateCopy(), r))
    assert [link.id for link in host.rt.chain_of(state)] == [child, grandchild]
