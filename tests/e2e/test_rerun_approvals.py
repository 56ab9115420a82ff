"""``sessionloop rerun --provider replay`` of sessions recorded on a real server in ``ask`` mode
(the chat default): approvals are replayed as recorded answers, ``--override-approval`` answers
one otherwise (winning over a recorded grant), the fork takes the session's settings (its
sandbox policy shows in every command's display), is titled as a rerun and ``--discard``
removes it (SPEC §9).

The recording: a real ``sessionloop serve`` subprocess, an owner connection that reports
presence and answers ``approval/requested`` with ``approval/respond``. The server is stopped
before ``rerun`` runs (it needs the writer lock), through click's CliRunner.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest
from click.testing import CliRunner

from sessionloop.actors import events as E
from sessionloop.actors.api.host import Host
from sessionloop.actors.events import open_store
from sessionloop.cli.main import main
from tests.e2e.conftest import Client, initialized, open_client

pytestmark = pytest.mark.e2e


def exec_line(command: str) -> str:
    return "!tool exec " + json.dumps({"command": command})


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def rerun_json(data_dir: str, sid: str, *extra: str) -> tuple[int, dict[str, Any]]:
    out = cli("rerun", sid, "--data", data_dir, "--from-turn", "0", "--json", *extra)
    assert out.exit_code in (0, 1), out.output
    return out.exit_code, json.loads(out.stdout)


def session_events(data_dir: str, sid: str) -> list[Any]:
    with open_store(os.path.join(data_dir, "store"), readonly=True) as store:
        return [r.event for r in store.read_stream(f"session-{sid}")]


def settlements(data_dir: str, sid: str) -> list[tuple[str, str, str | None]]:
    """(state, source, note) of every settled approval, in log order, with tool.finished's
    settlement of the calls denied at once (no approval event for those)."""
    out = []
    for e in session_events(data_dir, sid):
        denied_at_once = isinstance(e, E.ToolFinished) and e.settlement is not None and e.settlement.source == "absent"
        if isinstance(e, E.ToolApprovalSettled) or denied_at_once:
            out.append((e.settlement.state, e.settlement.source, e.settlement.note))
    return out


async def answer_next(c: Client, sid: str, decision: str, note: str | None = None,
                      grant: dict[str, Any] | None = None) -> None:
    pushed = await c.push(lambda m: m["method"] == "approval/requested"
                          and m["params"]["approval"]["sessionId"] == sid)
    approval = pushed["params"]["approval"]
    params: dict[str, Any] = {"approvalId": approval["id"], "decision": decision,
                              "contentHash": approval["contentHash"]}
    if note is not None:
        params["note"] = note
    if grant is not None:
        params["grant"] = grant
    await c.result("approval/respond", params)


async def turn(c: Client, sid: str, text: str, *answer: Any, **kw: Any) -> None:
    await c.result("turn/send", {"sessionId": sid, "content": text})
    if answer:
        await answer_next(c, sid, *answer, **kw)
    await c.turn_done(sid)


async def record_ask_session(server: Any) -> str:
    """An owner session in ``ask`` mode: approved, denied with a note, approved with a session
    grant for ``echo``, a call that grant settles, and a call made while nobody was present."""
    async with open_client(server) as ws:
        c = await initialized(ws)
        await c.result("presence/update", {"active": True})
        sid = (await c.result("session/create", {}))["session"]["id"]
        await c.result("session/subscribe", {"sessionId": sid})
        await turn(c, sid, "hello")
        await turn(c, sid, exec_line("echo approved"), "approve")
        await turn(c, sid, exec_line("echo denied"), "deny", note="not now")
        await turn(c, sid, exec_line("echo granted"), "approve", grant={"scope": "session", "commandPrefix": "echo"})
        await turn(c, sid, exec_line("echo by-the-grant"))
        await c.result("presence/update", {"active": False})
        await turn(c, sid, '!tool write_file {"path": "absent.txt", "content": "x"}')
        return sid


@pytest.fixture
def ask_session(server) -> tuple[str, str]:
    sid = asyncio.run(record_ask_session(server))
    server.stop()
    return server.data_dir, sid


def test_rerun_with_the_replay_provider_answers_approvals_as_recorded_and_reproduces_the_log(ask_session) -> None:
    data_dir, sid = ask_session
    assert settlements(data_dir, sid) == [("approved", "answer", None), ("denied", "answer", "not now"),
                                          ("approved", "answer", None), ("approved", "grant", None),
                                          ("denied", "absent", None)]
    code, report = rerun_json(data_dir, sid)
    assert code == 0 and report["identical"] is True and report["divergence"] is None, report
    assert report["turnsSent"] == 6 and report["problems"] == []
    assert settlements(data_dir, report["fork"]) == settlements(data_dir, sid)
    ran = [e.output for e in session_events(data_dir, report["fork"])
           if isinstance(e, E.ToolFinished) and e.status == "completed"]
    assert [o["output"] for o in ran] == ["approved\n", "granted\n", "by-the-grant\n"]  # replayed results
    verified = cli("replay", report["fork"], "--data", data_dir, "--verify")
    assert verified.exit_code == 0, verified.output


def test_rerun_text_output_says_identical_for_an_ask_mode_session(ask_session) -> None:
    data_dir, sid = ask_session
    result = cli("rerun", sid, "--data", data_dir, "--from-turn", "1")
    assert result.exit_code == 0, result.output
    assert "identical: " in result.stdout


def test_override_approval_denies_a_recorded_approval_and_reports_what_the_agent_did_then(ask_session) -> None:
    data_dir, sid = ask_session
    code, report = rerun_json(data_dir, sid, "--override-approval", "1=deny")
    assert code == 0, report  # a what-if: the changes it caused are the answer, not a failure
    (override,) = report["overrides"]
    assert (override["kind"], override["decision"], override["recorded"], override["turn"]) == \
        ("approval", "deny", "approved (answer)", 2)
    assert [d["path"] for d in report["overrideChanges"]][:1] == ["settlement.state"]
    assert report["divergence"]["expectedTag"] == "tool.started" and report["divergence"]["gotTag"] == "tool.finished"
    denied = [e for e in session_events(data_dir, report["fork"]) if isinstance(e, E.ToolFinished)]
    assert denied[0].status == "denied" and denied[0].output == {"error": "denied: the user denied it"}


def test_override_approval_wins_over_the_grant_that_settled_the_call_in_the_recording(ask_session) -> None:
    data_dir, sid = ask_session
    plain = cli("rerun", sid, "--data", data_dir, "--from-turn", "0", "--json")
    grant_settled = [e for e in session_events(data_dir, json.loads(plain.stdout)["fork"])
                     if isinstance(e, E.ToolApprovalSettled) and e.settlement.source == "grant"]
    assert len(grant_settled) == 1  # without the override the grant settles it again
    code, report = rerun_json(data_dir, sid, "--override-approval", "4=deny")
    assert code == 0, report
    assert report["overrides"][0]["recorded"] == "approved (grant)"
    fork = session_events(data_dir, report["fork"])
    fifth = [e for e in fork if getattr(e, "turn_id", None) == _turn_ids(fork)[4]]
    assert [type(e) for e in fifth if isinstance(e, (E.ToolApprovalRequested, E.ToolApprovalSettled))] == \
        [E.ToolApprovalRequested, E.ToolApprovalSettled]  # asked, not settled by the grant
    settled = next(e for e in fifth if isinstance(e, E.ToolApprovalSettled)).settlement
    assert (settled.state, settled.source, settled.grant_id) == ("denied", "answer", None)
    d = report["divergence"]
    assert (d["turn"], d["expectedTag"], d["gotTag"]) == (5, "tool.approval.settled", "tool.approval.requested")


def _turn_ids(events: list[Any]) -> list[str]:
    return [e.turn_id for e in events if isinstance(e, E.TurnStarted)]


def test_override_approval_refuses_what_names_no_approval_in_one_line(ask_session) -> None:
    data_dir, sid = ask_session
    for value, expected in (
        ("9=deny", "--override-approval 9: approval 9 does not exist: 5 approvals after turn 0"),
        ("1=maybe", "--override-approval '1=maybe': expected ID=approve or ID=deny"),
        ("nope=approve", "--override-approval nope: 'nope' names no approval after turn 0"),
    ):
        result = cli("rerun", sid, "--data", data_dir, "--from-turn", "0", "--override-approval", value)
        assert result.exit_code != 0 and expected in result.output, (value, result.output)
        assert len(result.output.strip().splitlines()) == 1
    events = session_events(data_dir, sid)
    first = next(e for e in events if isinstance(e, E.ToolApprovalRequested))
    for ref in (first.approval_id, first.call_id):  # the same approval, as it was recorded: nothing changes
        code, report = rerun_json(data_dir, sid, "--override-approval", f"{ref}=approve", "--discard")
        assert code == 0 and report["overrides"][0]["approvalId"] == first.approval_id, report
        assert report["divergence"] is None and report["overrideChanges"] == []


def test_the_fork_is_titled_as_a_rerun_and_discard_deletes_it_and_its_workspace(ask_session) -> None:
    data_dir, sid = ask_session
    code, kept = rerun_json(data_dir, sid)
    assert code == 0 and kept["discarded"] is False
    created = session_events(data_dir, kept["fork"])[0]
    assert created.title == f"rerun of {sid} from turn 0" and created.forked_from == sid
    result = cli("rerun", sid, "--data", data_dir, "--from-turn", "0", "--discard")
    assert result.exit_code == 0, result.output
    fork_id = result.stdout.split(" to fork ")[1].split()[0]
    assert result.stdout.strip().splitlines()[-1] == f"the fork {fork_id} was discarded (--discard)"
    assert not os.path.exists(os.path.join(data_dir, "workspaces", fork_id))
    with Host.open(data_dir, durability="nosync") as host:
        listed = {s.id for s in host.list()}
        assert kept["fork"] in listed and fork_id not in listed and sid in listed
        assert host.get(fork_id) is None


async def record_with_settings(server: Any) -> str:
    async with open_client(server) as ws:
        c = await initialized(ws)
        sid = (await c.result("session/create", {}))["session"]["id"]
        await c.result("session/subscribe", {"sessionId": sid})
        for key, value in (("permissionMode", "acceptCalls"), ("sandbox", "read-only")):
            await c.result("session/config/update", {"sessionId": sid, "plugin": "tools", "key": key, "value": value})
        await turn(c, sid, exec_line("echo read-only"))
        await c.result("session/config/update", {"sessionId": sid, "plugin": "tools", "key": "sandbox",
                                                 "value": "workspace-write"})
        await turn(c, sid, exec_line("echo writable"))
        return sid


def test_rerun_gives_the_fork_the_sessions_settings_so_each_command_runs_under_its_recorded_sandbox(server) -> None:
    sid = asyncio.run(record_with_settings(server))
    server.stop()
    code, report = rerun_json(server.data_dir, sid)
    assert code == 0 and report["identical"] is True, report
    shown = [e.display.sandbox for e in session_events(server.data_dir, report["fork"])
             if isinstance(e, E.ToolStarted)]
    assert shown == ["read-only", "workspace-write"]
