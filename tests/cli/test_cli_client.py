"""The client commands (chat, sessions, watch, send) against a real ``sessionloop serve`` (SPEC §8)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from sessionloop.cli.client import Notification
from sessionloop.cli.session_view import SessionView
from sessionloop.protocol.schemas import ItemDelta, SessionSummary, SubscribeResult


def new_session(cli, name: str) -> str:
    result = cli("sessions", "new", name)
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def ls_json(cli, *args: str) -> list[dict]:
    result = cli("sessions", "ls", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# --- chat -----------------------------------------------------------------------------------------


def test_chat_piped_a_line_prints_the_echo_answer(cli):
    result = cli("chat", input="hello\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == "echo: hello\n"


def test_chat_streams_a_slow_answer_and_prints_a_tool_card(cli):
    script = '!sleep 200\\\nslow words here\n!tool list_files {"path": "."}\n'
    result = cli("chat", "--name", "streams", input=script)
    assert result.exit_code == 0, result.output
    lines = [re.sub(r", \d+ ms$", "", line) for line in result.stdout.splitlines()]  # a duration if >= 1 ms
    assert lines == [
        "echo: slow words here",
        "[tool list_files] path=. -> completed",
        "done: 1 tool calls",
    ]


def test_chat_continues_an_existing_session_named_by_title_and_shows_its_history(cli):
    cli("chat", "--name", "continued chat", input="first\n")
    result = cli("chat", "continued chat", input="second\n")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.endswith("agent    echo: first") for line in lines)
    assert lines[-1] == "echo: second"


def test_chat_shows_an_aborted_or_failed_turn_and_goes_on(cli):
    result = cli("chat", input="!error the model broke\nstill here\n")
    assert result.exit_code == 0, result.output
    assert "[turn error]" in result.stdout
    assert result.stdout.splitlines()[-1] == "echo: still here"


def test_chat_output_has_no_control_or_bidi_characters(cli):
    result = cli("chat", input="\x1b[31mred\u202e text\u200b\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == "echo: [31mred text\n"


def test_ctrl_c_during_a_turn_aborts_it_and_the_chat_goes_on(process_env):
    proc = subprocess.Popen([sys.executable, "-m", "sessionloop", "chat"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=process_env)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(iter(lambda: proc.stdout.read(1), "")), daemon=True)
    reader.start()
    try:
        proc.stdin.write("!sleep 5000\\\na long answer that takes five seconds to stream\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 10
        while "echo" not in "".join(out) and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        while "[turn aborted]" not in "".join(out) and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.stdin.write("after\n")
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(5)
    text = "".join(out)
    assert "[turn aborted]" in text
    assert text.endswith("echo: after\n")
    assert "five seconds" not in text  # the stream stopped


# --- sessions -------------------------------------------------------------------------------------


def test_sessions_ls_shows_a_new_session_in_the_table_and_in_json(cli):
    session_id = new_session(cli, "listed session")
    table = cli("sessions", "ls")
    assert table.exit_code == 0
    assert table.stdout.splitlines()[0].split() == ["ID", "TITLE", "STATUS", "LAST", "TURN", "UPDATED"]
    assert any(line.startswith(session_id) and "listed session" in line for line in table.stdout.splitlines())
    summary = next(s for s in ls_json(cli) if s["id"] == session_id)
    assert summary["title"] == "listed session" and summary["archived"] is False


def test_sessions_ls_query_keeps_only_matching_sessions(cli):
    session_id = new_session(cli, "needle in a haystack")
    new_session(cli, "hay only")
    assert [s["id"] for s in ls_json(cli, "--query", "NEEDLE")] == [session_id]


def test_sessions_show_prints_the_summary_and_the_conversation(cli):
    session_id = new_session(cli, "shown")
    assert cli("send", session_id, "show me", "--wait").exit_code == 0
    result = cli("sessions", "show", session_id)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"{session_id}  shown"
    assert any(line.split() == ["last", "turn", "replied", "at", *line.split()[4:]] for line in lines)
    assert any(line.endswith("owner    show me") for line in lines)
    assert any(line.endswith("agent    echo: show me") for line in lines)


def test_sessions_show_json_has_the_session_and_its_items(cli):
    session_id = new_session(cli, "shown as json")
    cli("send", session_id, "items please", "--wait")
    doc = json.loads(cli("sessions", "show", session_id[:12], "--json").stdout)
    assert doc["session"]["id"] == session_id
    kinds = [item["kind"] for item in doc["items"]]
    assert "user-message" in kinds and "agent-message" in kinds


def test_sessions_rename_changes_the_title_ls_shows(cli):
    session_id = new_session(cli, "old title")
    result = cli("sessions", "rename", session_id, "new title")
    assert result.exit_code == 0, result.output
    assert result.stdout == f'renamed {session_id} to "new title"\n'
    assert next(s for s in ls_json(cli) if s["id"] == session_id)["title"] == "new title"


def test_sessions_archive_moves_the_session_to_the_archived_list_and_unarchive_brings_it_back(cli):
    session_id = new_session(cli, "to archive")
    assert cli("sessions", "archive", "to archive").exit_code == 0
    assert session_id not in [s["id"] for s in ls_json(cli)]
    assert session_id in [s["id"] for s in ls_json(cli, "--archived")]
    assert cli("sessions", "unarchive", session_id).exit_code == 0
    assert session_id in [s["id"] for s in ls_json(cli)]


def test_sessions_delete_keeps_the_session_when_the_answer_is_no(cli):
    session_id = new_session(cli, "kept")
    result = cli("sessions", "delete", session_id, input="n\n")
    assert result.exit_code == 1
    assert "not deleted" in result.stderr
    assert session_id in [s["id"] for s in ls_json(cli)]


def test_sessions_delete_with_yes_removes_the_session(cli):
    session_id = new_session(cli, "deleted")
    result = cli("sessions", "delete", session_id, "--yes")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"deleted {session_id}\n"
    assert session_id not in [s["id"] for s in ls_json(cli)]
    shown = cli("sessions", "show", session_id)
    assert shown.exit_code == 1 and "not-found" in shown.stderr


def test_an_unknown_session_is_one_line_naming_not_found(run_cli_process):
    result = run_cli_process("sessions", "show", "no-such-session")
    assert result.returncode == 1
    assert result.stderr.splitlines() == ["Error: session/subscribe: session no-such-session not found (not-found)"]


def test_an_ambiguous_session_prefix_is_refused_with_the_candidates(cli):
    first, second = new_session(cli, "twin"), new_session(cli, "twin")
    result = cli("sessions", "rename", "twin", "x")
    assert result.exit_code == 1
    assert "matches 2 sessions" in result.stderr and first in result.stderr and second in result.stderr


# --- send -----------------------------------------------------------------------------------------


def test_send_wait_prints_the_agents_answer(cli):
    session_id = new_session(cli, "send target")
    result = cli("send", session_id, "are you there?", "--wait")
    assert result.exit_code == 0, result.output
    assert result.stdout == "echo: are you there?\n"


def test_send_wait_json_reports_the_turn_and_its_outcome(cli):
    session_id = new_session(cli, "send json")
    result = cli("send", session_id, "json please", "--wait", "--json")
    receipt = json.loads(result.stdout)
    assert receipt["sessionId"] == session_id and receipt["key"] is None
    assert receipt["outcome"] == "replied" and receipt["text"] == "echo: json please"
    assert receipt["idempotent"] is False and receipt["turnId"]


def test_send_with_the_owner_token_and_no_key_sends_a_new_message_each_time(cli):
    session_id = new_session(cli, "fire and forget")
    for _ in range(2):
        result = cli("send", session_id, "later")
        assert result.exit_code == 0, result.output
        assert result.stdout == f"accepted: sent to {session_id}\n"


def user_messages(cli, session_id: str, **kw) -> list[str]:
    shown = json.loads(cli("sessions", "show", session_id, "--json", **kw).stdout)
    return [i["text"] for i in shown["items"] if i["kind"] == "user-message"]


def test_send_with_the_owner_token_refuses_a_key_it_cannot_keep_before_sending_anything(cli, run_cli_process):
    session_id = new_session(cli, "keyed owner send")
    for args in (("--key", "same"), ("--key", "same"), ("--key", "same", "--wait")):
        result = run_cli_process("send", session_id, "twice?", *args)
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.strip().splitlines() == [(
            "Error: --key cannot be kept with the owner token: the owner sends with turn/send, which takes no "
            "idempotency key, so sending again would make a second turn; send without --key, or with "
            "an app token (loop/send keeps the key)")]
    assert user_messages(cli, session_id) == []  # the same key twice made two turns before: now none


def test_send_with_an_app_token_twice_with_one_key_gives_the_first_turn_back(cli, server):
    as_app = {"SESSIONLOOP_TOKEN": server.app_token}
    session_id = cli("sessions", "new", "bot session", env=as_app).stdout.strip()
    first = json.loads(cli("send", session_id, "once", "--key", "same", "--wait", "--json", env=as_app).stdout)
    again = json.loads(cli("send", session_id, "once", "--key", "same", "--wait", "--json", env=as_app).stdout)
    assert (first["state"], first["idempotent"], first["outcome"], first["text"]) == \
        ("accepted", True, "completed", "echo: once")
    assert (again["state"], again["turnId"], again["text"]) == ("duplicate", first["turnId"], "echo: once")
    shown = json.loads(cli("sessions", "show", session_id, "--json", env=as_app).stdout)
    assert [i["text"] for i in shown["items"] if i["kind"] == "user-message"] == ["once"]


def test_send_wait_exits_non_zero_when_the_turn_fails(cli):
    session_id = new_session(cli, "failing turn")
    result = cli("send", session_id, "!error boom", "--wait")
    assert result.exit_code == 1
    assert "the turn ended: error" in result.stderr


def test_send_with_an_app_token_requires_a_key_and_sends_nothing_without_one(cli, server, run_cli_process):
    as_app = {"SESSIONLOOP_TOKEN": server.app_token}
    session_id = cli("sessions", "new", "bot session without a key", env=as_app).stdout.strip()
    result = run_cli_process("send", session_id, "no key", env={**server.env, **as_app})
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [(
        "Error: --key is required with an app token: loop/send needs an idempotency key (sending again with the "
        "same key returns the first receipt)")]
    assert user_messages(cli, session_id, env=as_app) == []


# --- watch ----------------------------------------------------------------------------------------


def test_watch_prints_a_change_when_a_session_is_created(cli, process_env):
    proc = subprocess.Popen([sys.executable, "-m", "sessionloop", "watch", "--json", "--count", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=process_env)
    try:
        assert proc.stderr.readline().startswith("watching sessions on ")
        session_id = new_session(cli, "watched")
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    change = json.loads(out.splitlines()[0])
    assert session_id in [s["id"] for s in change["upserts"]]


# --- connecting ------------------------------------------------------------------------------------


def test_a_wrong_token_exits_non_zero_with_one_clear_line(run_cli_process, server):
    result = run_cli_process("sessions", "ls", env={"SESSIONLOOP_URL": server.url, "SESSIONLOOP_TOKEN": "wrong"})
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1
    assert "the server refused the token" in result.stderr


def test_no_server_gives_one_cannot_connect_line(run_cli_process):
    result = run_cli_process("sessions", "ls", "--url", "ws://127.0.0.1:9/session", "--token", "t", env={})
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "Error: cannot connect to ws://127.0.0.1:9/session: connection refused (is `sessionloop serve` running?)"]


def test_no_token_anywhere_says_how_to_get_one(run_cli_process, server):
    result = run_cli_process("chat", env={"SESSIONLOOP_URL": server.url})
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1
    assert "no token" in result.stderr and "SESSIONLOOP_TOKEN" in result.stderr


def test_the_token_file_of_the_current_directory_is_used_by_default(run_cli_process, server, tmp_path):
    os.makedirs(tmp_path / ".sessionloop")
    shutil.copy(os.path.join(server.data_dir, "token"), tmp_path / ".sessionloop" / "token")
    result = run_cli_process("sessions", "ls", "--json", env={"SESSIONLOOP_URL": server.url})
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout), list)


# --- help -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    ["chat"], ["watch"], ["send"], ["sessions"], ["sessions", "ls"], ["sessions", "show"], ["sessions", "new"],
    ["sessions", "rename"], ["sessions", "archive"], ["sessions", "unarchive"], ["sessions", "delete"],
])
def test_every_client_command_has_help_with_an_example(cli, command):
    result = cli(*command, "--help")
    assert result.exit_code == 0
    assert "Example" in result.stdout and "sessionloop " + " ".join(command) in result.stdout


# --- the view's snapshot rules (seed 004, 推送与去重), without a server -------------------------------


def _view(seq: int = 5, epoch: int = 1):
    summary = SessionSummary(id="s1", title="t", child_count=0, kind="owner", section="owner", created_at=0,
                             updated_at=0, running=False, error=False, unread=False, attention=False,
                             archived=False, background=0)
    shown: list[str] = []
    view = SessionView(SubscribeResult(epoch=epoch, seq=seq, session=summary, items=[], approvals=[]),
                       emit=lambda text, newline: shown.append(text + ("\n" if newline else "")))
    return view, shown


def _delta(seq: int, text: str, epoch: int = 1, session_id: str = "s1"):
    return Notification("item/delta", ItemDelta(session_id=session_id, epoch=epoch, seq=seq, item_id="m1", text=text))


def test_pushes_with_a_seq_not_above_the_snapshots_are_dropped():
    view, shown = _view(seq=5)
    for note in (_delta(4, "old "), _delta(5, "same "), _delta(6, "new"), _delta(7, "x", session_id="other")):
        view.feed(note)
    assert "".join(shown) == "new"


def test_a_push_of_another_epoch_asks_for_a_new_subscription():
    view, shown = _view(seq=5, epoch=1)
    view.feed(_delta(1, "after a restart", epoch=2))
    assert view.needs_resubscribe and shown == []


def test_streamed_text_is_sanitized_before_it_is_printed():
    view, shown = _view(seq=0)
    view.feed(_delta(1, "a\x1b[2Jb\u202ec"))
    assert "".join(shown) == "a[2Jbc"
