"""Tools inside turns: permission modes, workspace confinement, checkpoints and rewind, repairs."""

from __future__ import annotations

import os
import time

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.errors import NotFound, SessionBusy
from sessionloop.actors.events import open_store
from sessionloop.actors.model import ModelResponse
from sessionloop.actors.model.scripted import ScriptedProvider


def finished(session) -> list[E.ToolFinished]:
    return [e.event for e in session.events() if isinstance(e.event, E.ToolFinished)]


def workspace_of(host, session) -> str:
    return host.rt.workspace(session.snapshot()).root.as_posix()


def test_accept_calls_runs_tools_that_need_approval(host):
    s = host.create()
    s.run('!tool write_file {"path": "notes.txt", "content": "hello"}')
    assert open(os.path.join(workspace_of(host, s), "notes.txt")).read() == "hello"
    assert finished(s)[0].status == "completed"


def test_deny_mode_refuses_tools_that_need_approval_and_tells_the_model(open_host):
    host = open_host(permission_mode="deny")
    s = host.create()
    result = s.run('!tool write_file {"path": "x.txt", "content": "no"}')
    [f] = finished(s)
    assert f.status == "denied" and "permission mode is deny" in f.output["error"]
    assert f.settlement.state == "denied"
    assert result.output_text == "done: 1 tool calls"
    assert not os.path.exists(os.path.join(workspace_of(host, s), "x.txt"))


def test_ask_mode_with_nobody_present_denies_at_once_as_absent(open_host):
    host = open_host()
    s = host.create()  # interactive: default ask
    s.run('!tool exec {"command": "echo hi"}')
    [f] = finished(s)
    assert (f.status, f.settlement.source) == ("denied", "absent")


def test_tools_without_approval_run_in_ask_mode(open_host):
    host = open_host()
    s = host.create()
    s.run('!tool list_files {"path": "."}')
    assert finished(s)[0].status == "completed"


def test_background_sessions_default_to_accept_calls(open_host):
    host = open_host()
    s = host.create(activity="background")
    s.run('!tool exec {"command": "echo hi"}')
    [f] = finished(s)
    assert f.status == "completed" and f.exit_code == 0 and "hi" in f.output["output"]


def test_a_path_outside_the_workspace_is_refused_with_a_clear_tool_error(host):
    s = host.create()
    s.run('!tool read_file {"path": "../../etc/passwd"}')
    [f] = finished(s)
    assert f.status == "failed" and "outside the workspace" in f.output["error"]


def test_an_unknown_tool_fails_the_call_not_the_turn(host):
    s = host.create()
    result = s.run('!tool teleport {"to": "mars"}')
    assert result.state == "completed"
    assert "unknown tool" in finished(s)[0].output["error"]
    assert not any(isinstance(e.event, E.ToolStarted) for e in s.events())


def test_invalid_arguments_fail_the_call_naming_the_field(host):
    s = host.create()
    s.run('!tool read_file {"path": 42}')
    [f] = finished(s)
    assert f.status == "failed" and "path" in f.output["error"]


def test_exec_display_carries_the_exit_code_and_a_nonzero_exit_fails_the_card(host):
    s = host.create()
    s.run('!tool exec {"command": "exit 3"}')
    [f] = finished(s)
    assert (f.status, f.exit_code) == ("failed", 3)
    call = next(iter(s.snapshot().tool_calls.values()))
    assert call.display.kind == "command" and call.display.command == "exit 3" and call.display.exit_code == 3


def test_write_file_records_the_before_image_once_per_file_per_turn(host):
    s = host.create()
    s.run('!tool write_file {"path": "a.txt", "content": "v1"}')
    s.run('!tool write_file {"path": "a.txt", "content": "v2"}\n!tool write_file {"path": "a.txt", "content": "v3"}')
    checkpoints = [e.event for e in s.events() if isinstance(e.event, E.CheckpointRecorded)]
    assert [(c.existed, c.content) for c in checkpoints] == [(False, None), (True, b"v1")]


def test_rewind_code_restores_files_to_their_state_before_the_turn(host):
    s = host.create()
    first = s.run('!tool write_file {"path": "a.txt", "content": "v1"}')
    second = s.run('!tool write_file {"path": "a.txt", "content": "v2"}\n'
                   '!tool write_file {"path": "b.txt", "content": "new"}')
    ws = workspace_of(host, s)
    result = s.rewind(second.turn_id, "code")
    assert result == {"turnId": second.turn_id, "restored": ["a.txt"], "removed": ["b.txt"], "conflicts": []}
    assert open(os.path.join(ws, "a.txt")).read() == "v1"
    assert not os.path.exists(os.path.join(ws, "b.txt"))
    assert len(s.snapshot().messages) == 9  # code only: the conversation stays
    s.rewind(first.turn_id, "code")
    assert not os.path.exists(os.path.join(ws, "a.txt"))


def test_rewind_code_and_chat_also_removes_the_turn_and_later_ones(host):
    s = host.create()
    s.run("keep me")
    gone = s.run('!tool write_file {"path": "a.txt", "content": "x"}')
    s.run("also gone")
    result = s.rewind(gone.turn_id, "code-and-chat")
    assert result["chatDeleted"] is True and result["deletedMessages"] == 6
    assert [m.content for m in s.snapshot().messages] == ["keep me", "echo: keep me"]
    assert s.run("after").output_text == "echo: after"


def test_rewind_of_an_unknown_turn_is_not_found_and_refused_while_running(host):
    s = host.create()
    with pytest.raises(NotFound):
        s.rewind("nope")
    done = s.run("x")
    s.send("!sleep 3000\nbusy")
    time.sleep(0.05)
    with pytest.raises(SessionBusy):
        s.rewind(done.turn_id)
    s.cancel()


def test_cancel_while_a_tool_runs_records_it_aborted_and_later_calls_not_executed(host):
    s = host.create()
    receipt = s.send('!tool exec {"command": "sleep 5"}\n!tool list_files {"path": "."}')
    deadline = time.time() + 5
    while not any(isinstance(e.event, E.ToolStarted) for e in s.events()) and time.time() < deadline:
        time.sleep(0.01)
    assert s.cancel()
    assert s.wait(receipt.turn_id, 5).code == "aborted"
    running, pending = finished(s)
    assert (running.status, running.repair, running.not_executed) == ("aborted", "cancel", False)
    assert (pending.status, pending.not_executed) == ("aborted", True)
    # the history pairs every call with a result, so the next run needs no repair
    assert s.run("next").output_text == "echo: next"
    assert not [f for f in finished(s) if f.repair == "not-executed"]


def test_a_new_run_first_closes_unanswered_calls_with_not_executed(open_host, data_dir):
    """Seed 002 v0.22: the provider must never see a tool call without its result. A fork can copy
    an assistant message whose calls have no results; the next run repairs that explicitly."""
    scripted = ScriptedProvider([ModelResponse(tool_calls=[E.ToolCallSpec(call_id="c9", name="list_files",
                                                                          args={"path": "."})]), "fine"])
    host = open_host(permission_mode="acceptCalls", provider=scripted)
    source = host.create()
    receipt = source.send("go")
    source.wait(receipt.turn_id, 5)
    broken = E.Message(role="assistant", content="", tool_calls=[E.ToolCallSpec(call_id="orphan", name="exec")])
    fork_id = host.fork(source.id).id
    host.close()  # the orphan call is in the log when the session loads (as an older server left it)
    store = open_store(os.path.join(data_dir, "store"), durability="nosync")
    stream = f"session-{fork_id}"
    store.append(stream, [E.MessagesImported(at=1, source_session_id=source.id, messages=[broken])],
                 expected_version=store.stream_version(stream))
    store.close()
    host = open_host(permission_mode="acceptCalls", provider=scripted)
    fork = host.session(fork_id)
    scripted.extend(["after repair"])
    assert fork.run("continue").output_text == "after repair"
    repairs = [f for f in finished(fork) if f.repair == "not-executed"]
    assert [(r.call_id, r.not_executed) for r in repairs] == [("orphan", True)]
    sent = scripted.requests[-1].messages
    assert [m.role for m in sent if m.role != "system"] == ["assistant", "tool", "user"]


def test_update_plan_replaces_the_sessions_plan(host):
    s = host.create()
    s.run('!tool update_plan {"entries": [{"text": "read", "status": "completed"}, '
          '{"text": "write", "status": "pending"}]}')
    state = s.snapshot()
    assert [(e.text, e.status) for e in state.plan] == [("read", "completed"), ("write", "pending")]
    assert any(isinstance(e.event, E.PlanUpdated) for e in s.events())


def test_exec_records_the_before_images_of_the_files_it_changes_and_rewind_restores_them(host):
    s = host.create()
    s.run('!tool write_file {"path": "keep.txt", "content": "original"}')
    turn = s.run('!tool exec {"command": "echo changed > keep.txt; echo new > made.txt"}')
    ws = workspace_of(host, s)
    assert open(os.path.join(ws, "keep.txt")).read() == "changed\n"
    images = {c.path: (c.existed, c.content) for c in s.snapshot().checkpoints if c.turn_id == turn.turn_id}
    assert images == {"keep.txt": (True, b"original"), "made.txt": (False, None)}
    result = s.rewind(turn.turn_id, "code")
    assert result["restored"] == ["keep.txt"] and result["removed"] == ["made.txt"]
    assert open(os.path.join(ws, "keep.txt")).read() == "original"
