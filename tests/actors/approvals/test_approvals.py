"""Seed 004, 在场与审批: presence and approvals, through the gateway with in-memory clients and
timers made fast by configuration (never by sleeping the real 300 s)."""

from __future__ import annotations

import threading
import time

from sessionloop.actors import events as E
from tests.actors.gateway_harness import MemoryClient


def start_exec(client: MemoryClient, command: str = "echo approved") -> tuple[str, str]:
    sid = client.result("session/create", {})["session"]["id"]
    client.result("session/subscribe", {"sessionId": sid})
    client.result("turn/send", {"sessionId": sid, "content": f'!tool exec {{"command": "{command}"}}'})
    return sid, ""


def requested(client: MemoryClient, timeout: float = 10) -> dict:
    return client.wait(lambda f: f.get("method") == "approval/requested", timeout)["params"]["approval"]


def turn_done(client: MemoryClient, sid: str) -> dict:
    return client.wait(lambda f: f.get("method") == "item/completed" and f["params"]["sessionId"] == sid
                       and f["params"]["item"]["kind"] == "turn", 15)["params"]["item"]


def tool_card(client: MemoryClient, status: str) -> dict:
    return client.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"]["kind"] == "tool-call"
                       and f["params"]["item"]["status"] == status, 15)["params"]["item"]


def finished(host, sid: str) -> E.ToolFinished:
    return [e.event for e in host.session(sid).events() if isinstance(e.event, E.ToolFinished)][-1]


def test_nobody_present_at_creation_denies_at_once_as_absent_without_a_push(service):
    host, svc = service()
    c = MemoryClient(svc)  # connected but never reported presence: not present
    sid, _ = start_exec(c)
    card = tool_card(c, "denied")
    assert card["settlement"]["source"] == "absent" and card["approvalId"]
    assert c.pushes("approval/requested") == []
    assert "nobody was present" in finished(host, sid).output["error"]


def test_a_present_owner_gets_the_request_and_approving_runs_the_tool(service):
    host, svc = service()
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    sid, _ = start_exec(c, "echo ran")
    approval = requested(c)
    assert approval["tool"] == "exec" and approval["facts"]["command"] == "echo ran"
    assert approval["state"] == "pending" and approval["options"] == ["approve", "deny"]
    # the card shows the approval id while waiting, and the session needs attention
    listed = c.result("sessions/list", {})["sessions"][0]
    assert listed["attention"] is True
    snap = c.result("session/subscribe", {"sessionId": sid})
    assert [a["id"] for a in snap["approvals"]] == [approval["id"]]
    assert c.result("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                         "contentHash": approval["contentHash"]}) == {}
    settled = c.wait(lambda f: f.get("method") == "approval/settled")["params"]
    assert (settled["state"], settled["source"], settled["by"]["owner"]) == ("approved", "answer", True)
    card = tool_card(c, "completed")
    assert card["settlement"]["state"] == "approved" and card["approvalId"] == approval["id"]
    assert finished(host, sid).output["output"].strip() == "ran"
    assert c.result("sessions/list", {})["sessions"][0]["attention"] is False


def test_denying_with_a_note_sends_the_note_to_the_model(service):
    host, svc = service()
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    sid, _ = start_exec(c, "rm -rf /tmp/nothing")
    approval = requested(c)
    c.result("approval/respond", {"approvalId": approval["id"], "decision": "deny",
                                  "contentHash": approval["contentHash"], "note": "too risky"})
    assert tool_card(c, "denied")["settlement"]["source"] == "answer"
    assert finished(host, sid).output == {"error": "denied: the user denied it: too risky"}


def test_two_connections_racing_the_first_answer_wins_and_the_other_gets_approval_settled(service):
    host, svc = service()
    a, b = MemoryClient(svc), MemoryClient(svc)
    for c in (a, b):
        c.result("presence/update", {"active": True})
    start_exec(a)
    approval = requested(a)
    requested(b)
    replies = {}

    def answer(name: str, c: MemoryClient, decision: str) -> None:
        replies[name] = c.call("approval/respond", {"approvalId": approval["id"], "decision": decision,
                                                    "contentHash": approval["contentHash"]})

    threads = [threading.Thread(target=answer, args=("a", a, "approve")),
               threading.Thread(target=answer, args=("b", b, "deny"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outcomes = sorted("result" if "result" in r else r["error"]["data"]["code"] for r in replies.values())
    assert outcomes == ["approval-settled", "result"]
    for c in (a, b):  # everyone who got the request hears the settlement
        c.wait(lambda f: f.get("method") == "approval/settled")


def test_a_wrong_content_hash_is_hash_mismatch_and_an_unknown_id_is_not_found(service):
    host, svc = service()
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    start_exec(c)
    approval = requested(c)
    bad = c.call("approval/respond", {"approvalId": approval["id"], "decision": "approve", "contentHash": "nope"})
    assert bad["error"]["data"]["code"] == "hash-mismatch"
    missing = c.call("approval/respond", {"approvalId": "x.y", "decision": "approve", "contentHash": "h"})
    assert missing["error"]["data"]["code"] == "not-found"


def test_an_identity_that_may_not_answer_gets_forbidden(service):
    host, svc = service()
    host.register_app("bot", containers=["inbox"])
    owner = MemoryClient(svc)
    owner.result("presence/update", {"active": True})
    bot = MemoryClient(svc, app_id="bot")
    start_exec(owner)
    approval = requested(owner)
    reply = bot.call("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                          "contentHash": approval["contentHash"]})
    assert reply["error"]["data"]["code"] == "forbidden"


def test_the_total_wait_expires_the_approval_as_timeout(service):
    host, svc = service(approval_wait_s=0.3)
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    sid, _ = start_exec(c)
    requested(c)
    settled = c.wait(lambda f: f.get("method") == "approval/settled", 5)["params"]
    assert (settled["state"], settled["source"]) == ("expired", "timeout")
    assert tool_card(c, "denied")["settlement"]["source"] == "timeout"


def test_when_every_present_connection_leaves_a_grace_period_ends_as_absent(service):
    host, svc = service(approval_grace_s=0.2)
    c = MemoryClient(svc)
    watcher = MemoryClient(svc)  # stays connected to see the outcome, never present
    c.result("presence/update", {"active": True})
    sid, _ = start_exec(c)
    requested(c)
    watcher.result("session/subscribe", {"sessionId": sid})
    c.result("presence/update", {"active": False})
    card = tool_card(watcher, "denied")
    assert card["settlement"]["source"] == "absent"


def test_coming_back_inside_the_grace_keeps_the_approval_and_pushes_it_again(service):
    host, svc = service(approval_grace_s=0.5)
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    start_exec(c)
    first = requested(c)
    c.frames.clear()
    c.result("presence/update", {"active": False})
    c.result("presence/update", {"active": True})  # false -> true: pushed again
    again = requested(c)
    assert again["id"] == first["id"]
    time.sleep(0.7)  # past the grace: the approval is still pending because someone is present
    assert c.result("approval/respond", {"approvalId": first["id"], "decision": "approve",
                                         "contentHash": first["contentHash"]}) == {}


def test_stopping_the_turn_cancels_its_approval_as_turn_ended(service):
    host, svc = service()
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    sid, _ = start_exec(c)
    requested(c)
    c.result("turn/abort", {"sessionId": sid})
    settled = c.wait(lambda f: f.get("method") == "approval/settled")["params"]
    assert (settled["state"], settled["source"]) == ("cancelled", "turn-ended")
    assert turn_done(c, sid)["outcome"] == "aborted"


def test_too_many_approvals_in_a_minute_are_denied_as_rate_limit(service):
    host, svc = service(approval_rate_limit=1)
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    sid, _ = start_exec(c)
    approval = requested(c)
    c.result("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                  "contentHash": approval["contentHash"]})
    turn_done(c, sid)
    c.result("turn/send", {"sessionId": sid, "content": '!tool exec {"command": "echo again"}'})
    assert tool_card(c, "denied")["settlement"]["source"] == "rate-limit"


def test_after_a_restart_a_pending_approval_is_settled_shutdown_and_the_call_denied(open_host, data_dir):
    host = open_host()
    svc = host.protocol()
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    sid, _ = start_exec(c)
    requested(c)
    host.close()
    again = open_host()
    s = again.session(sid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(isinstance(e.event, E.TurnCompleted) for e in s.events()):
        time.sleep(0.02)
    f = [e.event for e in s.events() if isinstance(e.event, E.ToolFinished)][-1]
    assert f.status == "denied" and f.settlement.source == "shutdown"
    approval_events = again.store.read_stream(f"approval-{f.approval_id}")
    assert [E.event_tag(e.event) for e in approval_events] == ["approval.requested", "approval.settled"]
    assert again.store.flagged("approval-pending") == []



def _taken_over(open_host, tmp_path, **options):
    """A host with an approval pending (asked by a present owner), and a second host opened with
    ``carry_approvals`` on a copy of its store made while it ran (what a node that takes the
    shards over from the log starts on): ``(sid, the approval as pushed, the second host)``."""
    host = open_host(**options.pop("before", {}))
    c = MemoryClient(host.protocol())
    c.result("presence/update", {"active": True})
    sid, _ = start_exec(c)
    approval = requested(c)
    copy = tmp_path / "taken-over"
    copy.mkdir()
    host.store.backup(str(copy / "store"))  # the store as a crash would leave it: the approval pending
    return sid, approval, open_host(at=str(copy), carry_approvals=True, **options)


def _finished(host, sid: str, timeout: float = 10) -> E.ToolFinished:
    s = host.session(sid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e.event for e in s.events() if isinstance(e.event, E.ToolFinished)]
        if found:
            return found[-1]
        time.sleep(0.02)
    raise AssertionError("the carried approval never settled")


def test_a_carried_approval_keeps_its_expiry_and_an_owner_back_in_time_answers_it(open_host, tmp_path):
    sid, approval, again = _taken_over(open_host, tmp_path)
    assert again.store.flagged("approval-pending") == [f"approval-{approval['id']}"]
    c = MemoryClient(again.protocol())
    c.result("presence/update", {"active": True})  # the owner back: asked again, the same approval
    assert requested(c) == approval
    c.result("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                  "contentHash": approval["contentHash"]})
    f = _finished(again, sid)
    settled = [e.event for e in again.session(sid).events() if isinstance(e.event, E.ToolApprovalSettled)]
    assert f.status == "completed"
    assert [(s.settlement.state, s.settlement.source) for s in settled] == [("approved", "answer")]
    assert again.store.flagged("approval-pending") == []


def test_a_carried_approval_expires_when_it_was_due_not_a_whole_wait_after_the_takeover(open_host, tmp_path):
    sid, approval, again = _taken_over(open_host, tmp_path, before={"approval_wait_s": 1.5},
                                       approval_wait_s=300.0)
    f = _finished(again, sid)
    assert f.status == "denied" and f.settlement.source == "timeout"
    assert abs(f.settlement.at - approval["expiresAt"]) < 1000  # when it was due on the node before


def test_a_carried_approval_nobody_comes_back_for_is_settled_absent_after_the_grace(open_host, tmp_path):
    sid, _approval, again = _taken_over(open_host, tmp_path, approval_grace_s=0.3)
    started = time.monotonic()
    f = _finished(again, sid)
    assert f.status == "denied" and f.settlement.source == "absent"
    assert time.monotonic() - started < 5  # the grace, not the 300 s wait
