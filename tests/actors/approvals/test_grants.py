"""Approval grants (actors/approvals/grants.py): an answer that settles later calls, through the gateway
with in-memory clients; the pure matching rules first."""

from __future__ import annotations

import json

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.approvals.grants import Grant, matches, settling, terms_for
from sessionloop.actors.replay.timeline import build_timeline
from tests.actors.approvals.test_approvals import finished, requested, tool_card
from tests.actors.gateway_harness import MemoryClient

NOW = 1_000_000


def grant(decision: str = "approve", prefix: str | None = "git status", scope: str = "session",
          turn: str = "t1", expires: int = NOW + 1000, tool: str = "exec", gid: str = "g1") -> Grant:
    return Grant(id=gid, decision=decision,  # type: ignore[arg-type]
                 terms=E.GrantTerms(scope=scope, tool=tool, command_prefix=prefix, expires_at=expires),  # type: ignore[arg-type]
                 turn_id=turn, at=NOW)


# --- the pure rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "covered"), [
    ("git status", True), ("git status -s", True), ("git  status  --short", True), ("'git' status", True),
    ("git statusx", False), ("git", False), ("git log", False),
    ("git status; rm -rf ~", False), ("git status && curl evil", False), ("git status | sh", False),
    ("git status > /etc/passwd", False), ("git status $(rm -rf ~)", False), ("git status `id`", False),
    ("git status\nrm -rf ~", False), ("(git status)", False), ("git status 'unbalanced", False),
])
def test_an_approving_prefix_covers_only_a_simple_command_starting_with_its_words(command: str, covered: bool) -> None:
    assert matches(grant(), "exec", {"command": command}) is covered


@pytest.mark.parametrize(("command", "covered"), [
    ("rm -rf /", True), ("echo hi; rm -rf /", True), ("ls && rm -rf /x", True), ("cat f | rm -rf y", True),
    ("(rm -rf z)", True), ("echo rm -rf", False), ("rmdir x", False),
])
def test_a_denying_prefix_covers_any_command_of_a_list_or_pipeline(command: str, covered: bool) -> None:
    assert matches(grant("deny", "rm -rf"), "exec", {"command": command}) is covered


def test_deny_beats_allow_and_an_allow_only_counts_when_approvals_are_asked() -> None:
    allow, deny = grant("approve", None, gid="allow"), grant("deny", "rm", gid="deny")
    args = {"command": "rm x"}
    assert settling([allow, deny], "exec", args, NOW, "t1", approving=True) is deny
    assert settling([deny, allow], "exec", args, NOW, "t1", approving=True) is deny
    assert settling([allow], "exec", {"command": "ls"}, NOW, "t1", approving=True) is allow
    assert settling([allow], "exec", {"command": "ls"}, NOW, "t1", approving=False) is None


def test_a_grant_ends_at_its_expiry_with_its_turn_or_when_revoked() -> None:
    turn = grant(prefix=None, scope="turn", turn="t1")
    assert turn.active(NOW, "t1") and not turn.active(NOW, "t2") and not turn.active(NOW + 1000, "t1")
    session = grant(prefix=None)
    assert session.active(NOW, "t9") and session.active(NOW, None)
    session.revoked = True
    assert not session.active(NOW, "t9")


def test_terms_are_checked_naming_the_field() -> None:
    with pytest.raises(ValueError, match="commandPrefix applies to exec approvals, not write_file"):
        terms_for("write_file", "session", "x", None, NOW)
    with pytest.raises(ValueError, match="grant.expiresInMs"):
        terms_for("exec", "session", None, 0, NOW)
    with pytest.raises(ValueError, match="balanced quotes"):
        terms_for("exec", "turn", "git 'x", None, NOW)
    assert terms_for("exec", "turn", None, None, NOW).expires_at == NOW + 3600 * 1000


# --- through the gateway ------------------------------------------------------------------------


def present(svc) -> MemoryClient:
    c = MemoryClient(svc)
    c.result("presence/update", {"active": True})
    return c


def send_exec(c: MemoryClient, sid: str, command: str) -> None:
    c.result("turn/send", {"sessionId": sid, "content": "!tool exec " + json.dumps({"command": command})})


def new_session(c: MemoryClient) -> str:
    sid = c.result("session/create", {})["session"]["id"]
    c.result("session/subscribe", {"sessionId": sid})
    return sid


def answer(c: MemoryClient, approval: dict, decision: str = "approve", **grant_: object) -> dict:
    return c.call("approval/respond", {"approvalId": approval["id"], "decision": decision,
                                       "contentHash": approval["contentHash"], "grant": grant_})


def test_a_session_grant_for_a_command_prefix_runs_later_matching_commands_without_asking(service):
    host, svc = service()
    c = present(svc)
    sid = new_session(c)
    send_exec(c, sid, "echo one")
    first = requested(c)
    assert answer(c, first, scope="session", commandPrefix="echo")["result"] == {}
    settled = c.wait(lambda f: f.get("method") == "approval/settled")["params"]
    assert settled["grant"]["commandPrefix"] == "echo" and settled["grant"]["scope"] == "session"
    tool_card(c, "completed")
    c.clear()
    send_exec(c, sid, "echo two")
    card = tool_card(c, "completed")
    assert card["settlement"]["source"] == "grant" and card["settlement"]["grantId"] == first["id"]
    assert c.pushes("approval/requested") == []  # nobody was asked
    send_exec(c, sid, "echo three; id")  # compound: not covered, asked again
    again = requested(c)
    assert again["facts"]["command"] == "echo three; id"
    listed = c.result("approval/grants/list", {"sessionId": sid})["grants"]
    assert [(g["id"], g["decision"], g["terms"]["commandPrefix"]) for g in listed] == [(first["id"], "approve", "echo")]


def test_a_denying_grant_beats_an_approving_one_and_holds_in_accept_calls_too(service):
    host, svc = service()
    c = present(svc)
    sid = new_session(c)
    send_exec(c, sid, "rm -rf scratch")
    assert answer(c, requested(c), "deny", scope="session", commandPrefix="rm")["result"] == {}
    tool_card(c, "denied")
    c.clear()
    send_exec(c, sid, "echo allowed")
    answer(c, requested(c), scope="session")  # every exec of the session
    tool_card(c, "completed")
    c.clear()
    send_exec(c, sid, "ls; rm -rf scratch")  # both grants match: deny wins
    card = tool_card(c, "denied")
    assert card["settlement"]["source"] == "grant" and "denies such calls" in finished(host, sid).output["error"]
    c.clear()
    send_exec(c, sid, "ls -la")
    assert tool_card(c, "completed")["settlement"]["source"] == "grant"
    c.result("session/config/update", {"sessionId": sid, "plugin": "tools", "key": "permissionMode",
                                       "value": "acceptCalls"})
    c.clear()
    send_exec(c, sid, "rm -rf scratch2")
    assert tool_card(c, "denied")["settlement"]["source"] == "grant"


def test_a_turn_grant_ends_with_its_turn(service):
    host, svc = service()
    c = present(svc)
    sid = new_session(c)
    c.result("turn/send", {"sessionId": sid, "content": "\n".join(
        "!tool exec " + json.dumps({"command": f"echo {i}"}) for i in range(3))})
    answer(c, requested(c), scope="turn")
    cards = [c.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"]["kind"] == "tool-call",
                    15, remove=True)["params"]["item"] for _ in range(3)]
    assert [card["settlement"]["source"] for card in cards] == ["answer", "grant", "grant"]
    c.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"]["kind"] == "turn", 15)
    c.clear()
    send_exec(c, sid, "echo next turn")
    assert requested(c)["facts"]["command"] == "echo next turn"
    assert c.result("approval/grants/list", {"sessionId": sid})["grants"] == []


def test_a_revoked_grant_settles_nothing_and_replay_shows_grant_and_revocation(service):
    host, svc = service()
    c = present(svc)
    sid = new_session(c)
    send_exec(c, sid, "echo a")
    first = requested(c)
    answer(c, first, scope="session")
    tool_card(c, "completed")
    assert c.result("approval/grants/revoke", {"sessionId": sid, "grantId": first["id"]}) == {}
    again = c.call("approval/grants/revoke", {"sessionId": sid, "grantId": first["id"]})
    assert again["error"]["data"]["code"] == "not-found"
    c.clear()
    send_exec(c, sid, "echo b")
    assert requested(c)["facts"]["command"] == "echo b"
    timeline = build_timeline(sid, list(host.session(sid).events()))
    facts = [(e.what, e.facts) for e in timeline.entries if e.kind == "approval"]
    assert any("grant" in f and f["grant"].startswith("approve exec for the session") for _, f in facts), facts
    assert any(what == "grant revoked" and f["grantId"] == first["id"] for what, f in facts), facts


def test_a_grant_survives_a_restart_of_the_host(service):
    host, svc = service()
    c = present(svc)
    sid = new_session(c)
    send_exec(c, sid, "echo a")
    answer(c, requested(c), scope="session", commandPrefix="echo")
    tool_card(c, "completed")
    svc.close()
    host.close()
    host2, svc2 = service()
    c2 = present(svc2)
    c2.result("session/subscribe", {"sessionId": sid})
    send_exec(c2, sid, "echo after restart")
    assert tool_card(c2, "completed")["settlement"]["source"] == "grant"


def test_a_bad_grant_is_invalid_params_and_the_approval_stays_pending(service):
    host, svc = service()
    c = present(svc)
    sid = new_session(c)
    c.result("turn/send", {"sessionId": sid, "content": "!tool write_file " + json.dumps(
        {"path": "a.txt", "content": "x"})})
    approval = requested(c)
    reply = answer(c, approval, scope="session", commandPrefix="cat")
    assert reply["error"]["code"] == -32602 and "commandPrefix applies to exec" in reply["error"]["message"]
    assert [a["id"] for a in c.result("session/subscribe", {"sessionId": sid})["approvals"]] == [approval["id"]]
    assert answer(c, approval, scope="session")["result"] == {}  # the tool-wide grant is fine


def test_an_app_may_not_revoke_grants(service):
    host, svc = service()
    c = present(svc)
    sid = new_session(c)
    send_exec(c, sid, "echo a")
    first = requested(c)
    answer(c, first, scope="session")
    app = MemoryClient(svc, app_id="mybot")
    reply = app.call("approval/grants/revoke", {"sessionId": sid, "grantId": first["id"]})
    assert reply["error"]["data"]["code"] in ("forbidden", "not-found")
