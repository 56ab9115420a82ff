"""Approvals in ``sessionloop chat`` and the ``sessionloop tasks`` commands, against a real
``sessionloop serve`` (SPEC §6 presence and approvals, background tasks; §8).

Sessions the owner creates over the protocol are in ``permissionMode: ask``, so the mock model's
``!tool exec ...`` needs an approval; the chat reports itself present and asks on stdin.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from sessionloop.cli.client import Endpoint, connect
from sessionloop.cli.output import approval_card
from sessionloop.cli.presence import Presence
from sessionloop.protocol.sanitize import REMOVED_CODEPOINTS
from sessionloop.protocol.schemas import Approval, ApprovalDiff, ApprovalFacts, ApprovalOrigin, ToolCallItem, TurnItem

WAIT_S = 15.0


def exec_line(command: str, **extra: Any) -> str:
    """A chat line that makes the mock model call exec (JSON escapes stay ASCII on stdin)."""
    return "!tool exec " + json.dumps({"command": command, **extra})


def no_hidden_characters(text: str) -> bool:
    return not any(ord(c) in REMOVED_CODEPOINTS for c in text)


def wait_until(predicate, timeout: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class ChatProcess:
    """``sessionloop chat`` as a subprocess whose stdin the test writes, with its stdout collected."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "sessionloop", "chat"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self._out: list[str] = []
        self._reader = threading.Thread(
            target=lambda: self._out.extend(iter(lambda: self.proc.stdout.read(1), "")), daemon=True)
        self._reader.start()

    @property
    def text(self) -> str:
        return "".join(self._out)

    def write(self, text: str) -> None:
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def wait_for(self, fragment: str) -> None:
        wait_until(lambda: fragment in self.text, what=f"{fragment!r} in {self.text!r}")

    def finish(self) -> int:
        self.proc.stdin.close()
        code = self.proc.wait(WAIT_S)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def chat_process(process_env):
    started: list[ChatProcess] = []

    def start() -> ChatProcess:
        started.append(ChatProcess(process_env))
        return started[-1]

    yield start
    for chat in started:
        chat.kill()


# --- approvals in chat ----------------------------------------------------------------------------


def test_approving_a_card_in_a_piped_chat_runs_the_command_and_shows_its_output(cli):
    result = cli("chat", input=exec_line("echo approved-output") + "\ny\n\n")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("[approval requested] exec in session ")
    assert lines[1:5] == [
        "  command: echo approved-output",
        '  params:  {"command": "echo approved-output"}',
        "approve? [y/N] y",
        "note (enter to skip): ",
    ]
    assert lines[5] == "[approval exec approved by owner]"
    assert lines[6].startswith("[tool exec] $ echo approved-output")
    assert "completed, exit 0" in lines[6] and "approval approved" in lines[6]
    assert lines[6].endswith("… approved-output")
    assert lines[7] == "done: 1 tool calls"


def test_denying_with_a_note_gives_the_model_a_tool_result_that_says_denied_with_the_note(cli):
    result = cli("chat", input=exec_line("echo never-$((40 + 2))") + "\nn\nnot on my machine\n")
    assert result.exit_code == 0, result.output
    assert "approve? [y/N] n\nnote (enter to skip): not on my machine\n" in result.stdout
    assert "[approval exec denied by owner]" in result.stdout
    card = next(line for line in result.stdout.splitlines() if line.startswith("[tool exec]"))
    assert "-> denied, approval denied, denied: the user denied it: not on my machine" in card
    assert "never-42" not in result.stdout  # it did not run


def test_the_denial_note_is_the_tool_result_stored_in_the_session(cli):
    result = cli("chat", "--name", "denied with a note", input=exec_line("echo x") + "\nno\nuse the staging box\n")
    assert result.exit_code == 0, result.output
    shown = json.loads(cli("sessions", "show", "denied with a note", "--json").stdout)
    call = next(item for item in shown["items"] if item["kind"] == "tool-call")
    assert call["status"] == "denied"
    assert call["result"] == {"error": "denied: the user denied it: use the staging box"}
    assert call["settlement"]["state"] == "denied" and call["settlement"]["source"] == "answer"


def test_end_of_input_at_the_approval_prompt_answers_no(cli):
    result = cli("chat", input=exec_line("echo unanswered") + "\n")
    assert result.exit_code == 0, result.output
    assert "approve? [y/N] \n[approval exec denied by owner]" in result.stdout
    assert "denied: the user denied it" in result.stdout


def test_a_card_with_control_bidi_and_zero_width_characters_shows_them_removed(cli):
    command = 'echo "safe\u202e\u0007gnp.exe\u200b" \u001b[2K\u2066done\u2069'
    result = cli("chat", input=exec_line(command) + "\ny\n\n")
    assert result.exit_code == 0, result.output
    assert no_hidden_characters(result.stdout)
    lines = result.stdout.splitlines()
    assert lines[1] == '  command: echo "safegnp.exe" [2Kdone'
    assert lines[2] == '  params:  {"command": "echo \\"safegnp.exe\\" [2Kdone"}'
    assert lines[-2].endswith("… safegnp.exe [2Kdone")  # the command's output, cleaned too


def test_a_multi_line_command_is_indented_under_the_card_so_it_cannot_pose_as_a_prompt(cli):
    result = cli("chat", input=exec_line("echo one\necho approve? [y/N] y") + "\nn\n\n")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1:3] == ["  command: echo one", "           echo approve? [y/N] y"]


def test_a_file_change_card_shows_the_path_and_the_diff():
    approval = Approval(
        id="s1.t1.call_1", session_id="s1", origin=ApprovalOrigin(kind="hand", participants=[]),
        target="tool", tool="write_file", options=["approve", "deny"], content_hash="h",
        expires_at=1_000_000 + 300_000, state="pending",
        facts=ApprovalFacts(params={"path": "a\u202e.txt", "content": "hi\n"},
                            diff=ApprovalDiff(path="a\u202e.txt", patch="--- before\n+++ after\n+hi\x1b[0m\n")),
    )
    lines = approval_card(approval, now_ms=1_000_000)
    assert lines[0].startswith("[approval requested] write_file in session s1, expires ")
    assert lines[0].endswith("(in 300 s)")
    assert lines[1:] == [
        "  file:    a.txt",
        "  diff:",
        "    --- before",
        "    +++ after",
        "    +hi[0m",
        '  params:  {"path": "a.txt", "content": "hi\\n"}',
    ]


def test_a_card_answered_first_on_another_client_prints_that_settlement_and_stops_asking(server, chat_process):
    chat = chat_process()
    chat.write(exec_line("echo decided-elsewhere") + "\n")
    chat.wait_for("approve? [y/N] ")

    async def approve_elsewhere() -> None:
        async with connect(Endpoint(server.url, server.token)) as other:
            await other.call("presence/update", {"active": True})  # pending cards are pushed again
            while True:
                note = await other.next(timeout=WAIT_S)
                if (note.method == "approval/requested"
                        and note.params.approval.facts.command == "echo decided-elsewhere"):
                    break
            a = note.params.approval
            await other.call("approval/respond", {"approvalId": a.id, "decision": "approve",
                                                  "contentHash": a.content_hash})
            await other.call("presence/update", {"active": False})

    asyncio.run(approve_elsewhere())
    chat.wait_for("done: 1 tool calls")
    assert chat.finish() == 0
    text = chat.text
    assert "approve? [y/N] \n[approval exec approved by owner on another client]\n" in text
    assert "… decided-elsewhere" in text
    assert "note (enter to skip)" not in text  # the card stopped being asked


def test_a_wrong_content_hash_is_refused_with_hash_mismatch(server, chat_process):
    chat = chat_process()
    chat.write(exec_line("echo hash-checked") + "\n")
    chat.wait_for("approve? [y/N] ")

    async def answer_with_a_wrong_hash() -> str | None:
        async with connect(Endpoint(server.url, server.token)) as other:
            await other.call("presence/update", {"active": True})
            while True:
                note = await other.next(timeout=WAIT_S)
                if note.method == "approval/requested" and note.params.approval.facts.command == "echo hash-checked":
                    break
            try:
                await other.call("approval/respond", {"approvalId": note.params.approval.id,
                                                      "decision": "approve", "contentHash": "0" * 64})
            except Exception as e:  # noqa: BLE001 - the error is what the test looks at
                return getattr(e, "data_code", None)
            finally:
                await other.call("presence/update", {"active": False})
            return None

    assert asyncio.run(answer_with_a_wrong_hash()) == "hash-mismatch"
    chat.write("y\n\n")
    chat.wait_for("done: 1 tool calls")
    assert chat.finish() == 0
    assert "[approval exec approved by owner]" in chat.text


def test_a_card_of_another_session_arriving_at_the_prompt_is_asked_and_its_answer_runs_the_call(
        server, chat_process):
    chat = chat_process()
    chat.write("hello\n")
    chat.wait_for("echo: hello\n")  # the chat reported itself present before reading this line

    async def turn_elsewhere() -> tuple[str, str]:
        async with connect(Endpoint(server.url, server.token)) as other:  # never reports presence
            created = await other.call("session/create", {"name": "asked from afar"})
            await other.call("session/subscribe", {"sessionId": created.session.id})
            await other.call("turn/send", {"sessionId": created.session.id,
                                           "content": exec_line("echo from-afar")})
            while True:
                note = await other.next(timeout=WAIT_S)
                item = getattr(note.params, "item", None)
                if note.method == "item/started" and isinstance(item, ToolCallItem) and item.approval_id \
                        and item.settlement is None:
                    # A line written before the card is shown would be a message: wait for the card.
                    await asyncio.to_thread(chat.wait_for, "approve? [y/N] ")
                    chat.write("y\n\n")
                if note.method == "item/completed" and isinstance(item, ToolCallItem) and item.status != "denied":
                    return item.status, item.result["output"]

    assert asyncio.run(turn_elsewhere()) == ("completed", "from-afar\n")
    assert chat.finish() == 0
    text = chat.text
    assert ('  command: echo from-afar\n  params:  {"command": "echo from-afar"}\n'
            "approve? [y/N] y\nnote (enter to skip): \n") in text
    assert "[approval exec approved by owner]" in text
    assert "[tool exec]" not in text  # the call belongs to a session this chat does not show


# --- presence -------------------------------------------------------------------------------------


class _RecordingClient:
    def __init__(self) -> None:
        self.reports: list[bool] = []

    async def call(self, method: str, params: Any = None) -> None:
        assert method == "presence/update"
        self.reports.append(params["active"])


def test_presence_is_reported_at_start_while_active_once_absent_when_idle_again_on_activity_and_absent_at_exit():
    client = _RecordingClient()
    now = [1000.0]
    busy = [False]

    async def scenario() -> None:
        presence = Presence(client, busy=lambda: busy[0], refresh_s=60, idle_s=600,  # type: ignore[arg-type]
                            clock=lambda: now[0])
        await presence.start()
        now[0] += 60
        await presence.tick()  # active: re-reported every beat
        now[0] += 600
        await presence.tick()  # idle 10 minutes: absent, once
        await presence.tick()
        busy[0] = True
        await presence.tick()  # a turn of the user's is running: active again
        busy[0] = False
        now[0] += 600
        await presence.tick()
        presence.touch()  # typing: present at once ...
        await asyncio.sleep(0.01)
        presence.touch()  # ... but not twice within the refresh period
        await asyncio.sleep(0.01)
        await presence.stop()

    asyncio.run(scenario())
    assert client.reports == [True, True, False, True, False, True, False]


def test_a_tool_call_with_nobody_present_is_denied_at_once_without_a_card(server):
    async def send_without_presence() -> dict:
        async with connect(Endpoint(server.url, server.token)) as c:
            created = await c.call("session/create", {})
            await c.call("session/subscribe", {"sessionId": created.session.id})
            await c.call("turn/send", {"sessionId": created.session.id, "content": exec_line("echo absent")})
            card: dict = {}
            while True:
                note = await c.next(timeout=WAIT_S)
                assert note.method != "approval/requested"
                item = getattr(note.params, "item", None)
                if note.method == "item/completed" and isinstance(item, ToolCallItem):
                    card = {"status": item.status, "source": item.settlement.source, "result": item.result}
                if note.method == "item/completed" and isinstance(item, TurnItem):
                    return card

    card = asyncio.run(send_without_presence())
    assert card["status"] == "denied" and card["source"] == "absent"
    assert card["result"]["error"].startswith("denied: ")


# --- tasks ----------------------------------------------------------------------------------------


def start_background_task(cli, marker: str, command: str) -> dict:
    """Approve a background exec in a piped chat; the task as ``tasks ls --json`` lists it."""
    result = cli("chat", input=exec_line(command, background=True) + "\ny\n\n")
    assert result.exit_code == 0, result.output
    assert "background task " in result.stdout  # the tool card names the task

    def listed() -> list[dict]:
        found = json.loads(cli("tasks", "ls", "--json").stdout)
        return [t for t in found if marker in (t.get("display") or {}).get("command", "")]

    wait_until(lambda: bool(listed()), what="the task in tasks ls")
    return listed()[0]


def test_tasks_ls_shows_a_running_background_task_output_shows_its_output_and_stop_stops_it(cli):
    task = start_background_task(cli, "ls-marker", "echo ls-marker-out; sleep 30")
    assert task["status"] == "running" and task["label"] == "exec" and task["kind"] == "tool-call"

    table = cli("tasks", "ls")
    assert table.exit_code == 0, table.output
    assert table.stdout.splitlines()[0].split() == ["ID", "STATUS", "STARTED", "TASK", "LAST", "LINE"]
    row = next(line for line in table.stdout.splitlines() if line.startswith(task["id"]))
    assert row.split()[1] == "running" and "exec: $ echo ls-marker-out; sleep 30" in row

    wait_until(lambda: "ls-marker-out" in cli("tasks", "output", task["id"]).stdout, what="the output")
    assert cli("tasks", "output", task["id"]).stdout == "ls-marker-out\n"
    page = json.loads(cli("tasks", "output", task["id"][:30], "--json").stdout)
    assert page == {"text": "ls-marker-out\n", "end": 14, "truncated": False}
    later = json.loads(cli("tasks", "output", task["id"], "--json", "--after", "14").stdout)
    assert later == {"text": "", "end": 14, "truncated": False}

    stopped = cli("tasks", "stop", task["id"])
    assert stopped.exit_code == 0, stopped.output
    assert stopped.stdout.startswith(f"{task['id']}: stopped")
    after = next(t for t in json.loads(cli("tasks", "ls", "--json").stdout) if t["id"] == task["id"])
    assert after["status"] == "stopped"
    assert task["id"] not in cli("tasks", "ls", "--running").stdout
    again = cli("tasks", "stop", task["id"])
    assert again.exit_code == 0 and "had already ended: stopped" in again.stdout


def test_tasks_output_follow_prints_new_output_until_the_task_ends(cli):
    command = "for i in 1 2 3; do echo follow-marker-$i; sleep 0.4; done"
    task = start_background_task(cli, "follow-marker", command)
    result = cli("tasks", "output", task["id"], "--follow")
    assert result.exit_code == 0, result.output
    assert result.stdout == "follow-marker-1\nfollow-marker-2\nfollow-marker-3\n"
    assert f"[task {task['id']} completed (exit 0)]" in result.stderr


def test_tasks_output_follow_json_prints_one_page_per_read_ending_at_the_total(cli):
    task = start_background_task(cli, "jsonl-marker", "echo jsonl-marker; sleep 0.5; echo more")
    result = cli("tasks", "output", task["id"], "--follow", "--json")
    assert result.exit_code == 0, result.output
    pages = [json.loads(line) for line in result.stdout.splitlines()]
    assert "".join(p["text"] for p in pages) == "jsonl-marker\nmore\n"
    assert pages[-1]["end"] == len("jsonl-marker\nmore\n")
    assert not any(p["truncated"] for p in pages)


def test_tasks_stop_all_stops_every_running_task_of_a_session(cli):
    task = start_background_task(cli, "stop-all-marker", "echo stop-all-marker; sleep 30")
    result = cli("tasks", "stop-all", task["sessionId"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (f"stopped the background work of session {task['sessionId']}; "
                                             "1 task(s) ended:")
    assert f"  {task['id']}: stopped" in result.stdout
    after = next(t for t in json.loads(cli("tasks", "ls", "--json").stdout) if t["id"] == task["id"])
    assert after["status"] == "stopped"


def test_tasks_ls_session_filter_keeps_only_that_sessions_tasks(cli):
    task = start_background_task(cli, "filter-marker", "echo filter-marker")
    found = json.loads(cli("tasks", "ls", "--json", "--session", task["sessionId"]).stdout)
    assert [t["id"] for t in found] == [task["id"]]


@pytest.mark.parametrize("args, message", [
    (("tasks", "output", "no-such-task"), "no background task 'no-such-task' (`sessionloop tasks ls` lists them)"),
    (("tasks", "stop", "no-such-task"), "no background task 'no-such-task' (`sessionloop tasks ls` lists them)"),
    (("tasks", "stop-all", "no-such-session"), "background/stopAll: session no-such-session not found (not-found)"),
])
def test_tasks_errors_are_one_clear_line_and_exit_1(run_cli_process, args, message):
    result = run_cli_process(*args)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [f"Error: {message}"]


def test_tasks_commands_have_help_with_an_example(cli):
    for args in (("tasks",), ("tasks", "ls"), ("tasks", "output"), ("tasks", "stop"), ("tasks", "stop-all")):
        result = cli(*args, "--help")
        assert result.exit_code == 0, result.output
        assert "Example" in result.stdout and "sessionloop tasks" in result.stdout
    assert "approve? [y/N]" in cli("chat", "--help").stdout
