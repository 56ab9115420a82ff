"""Crash recovery (SPEC §4): a real process running turns is killed with SIGKILL, then reopened."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from sessionloop.actors import events as E
from sessionloop.actors.api.host import Host
from tests.conftest import REPO

CHILD = textwrap.dedent(
    """
    import sys, time
    from sessionloop.actors.api.host import Host
    host = Host.open(sys.argv[1], durability="sync", permission_mode="acceptCalls")
    s = host.create()
    receipts = [s.send(text) for text in sys.argv[2:]]
    marker = receipts[0].turn_id
    # wait until the first turn is really under way (model streaming or tool running)
    while not any(type(e.event).__name__ in ("LlmStarted", "ToolStarted") and e.event.turn_id == marker
                  for e in s.events()):
        time.sleep(0.01)
    time.sleep(0.2)
    print(s.id, *[r.turn_id for r in receipts], flush=True)
    time.sleep(60)
    """
)


def run_and_kill(data_dir: str, *texts: str) -> tuple[str, list[str]]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, data_dir, *texts], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert line, proc.stderr.read()
    return line[0], line[1:]


def test_queued_inputs_survive_sigkill_and_the_interrupted_model_call_is_reissued(data_dir):
    session_id, turns = run_and_kill(data_dir, "!sleep 1500\nfirst", "second", "third")
    with Host.open(data_dir, durability="sync", permission_mode="acceptCalls") as host:
        s = host.session(session_id)
        outcomes = [s.wait(t, 15) for t in turns]
        assert [o.output_text for o in outcomes] == ["echo: first", "echo: second", "echo: third"]
        events = [e.event for e in s.events()]
        assert [e.turn_id for e in events if isinstance(e, E.TurnStarted)] == turns  # no turn twice
        interrupted = [e for e in events if isinstance(e, E.LlmFailed)]
        assert len(interrupted) == 1 and "interrupted" in interrupted[0].error


def test_a_tool_running_at_the_crash_is_recorded_aborted_never_rerun_and_the_model_is_told(data_dir):
    session_id, turns = run_and_kill(data_dir, '!tool exec {"command": "sleep 30"}')
    with Host.open(data_dir, durability="sync", permission_mode="acceptCalls") as host:
        s = host.session(session_id)
        assert s.wait(turns[0], 15).output_text == "done: 1 tool calls"
        events = [e.event for e in s.events()]
        assert sum(isinstance(e, E.ToolStarted) for e in events) == 1
        [finished] = [e for e in events if isinstance(e, E.ToolFinished)]
        assert (finished.status, finished.repair) == ("aborted", "crash")
        assert "not run again" in finished.output["error"]
        tool_message = [m for m in s.snapshot().messages if m.role == "tool"][0]
        assert "aborted" in tool_message.content


def test_the_store_opens_cleanly_after_every_kill(data_dir):
    for _ in range(3):
        session_id, turns = run_and_kill(data_dir, "!sleep 300\nx")
    with Host.open(data_dir, durability="sync", permission_mode="acceptCalls") as host:
        assert len(host.list()) == 3
        for info in host.list():
            events = host.session(info.id).events()
            started = [e.event.turn_id for e in events if isinstance(e.event, E.TurnStarted)]
            assert len(started) == len(set(started))
            for turn_id in started:
                assert host.session(info.id).wait(turn_id, 10).state == "completed"
