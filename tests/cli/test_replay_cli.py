"""``sessionloop replay / rerun / events / import`` on real stores (SPEC §8, §9).

Each store is recorded with a real ``Host`` (mock model unless a test scripts one, permission mode
``acceptCalls``), closed, and then read by the command through ``click.testing.CliRunner``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import click
import msgspec
import pytest
from click.testing import CliRunner, Result

from sessionloop.actors import events as E
from sessionloop.actors.api.host import Host
from sessionloop.actors.events import open_store
from sessionloop.actors.model import ScriptedProvider
from sessionloop.actors.replay.values import fold_events
from sessionloop.actors.session.state import encode_state
from sessionloop.actors.views.summary import decode_summary_record, encode_summary_record, summary_record
from sessionloop.cli.main import main
from sessionloop.cli.rerun_cmd import _check_unchanged
from sessionloop.eventstore.codec import event_to_builtins

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONTINUE = object()  # in a script of turns: ``continue_turn()`` instead of a message

TURNS = [
    "hello",
    '!tool list_files {"path": "."}',
    '!tool write_file {"path": "notes.txt", "content": "first"}',
    "!error broken model",
    "!reason weigh the options\nanswer",
    '!tool write_file {"path": "notes.txt", "content": "second"}',
]


def record(data_dir: str, turns: list[Any], *, provider: Any = None, title: str = "demo",
           **options: Any) -> tuple[str, list[str]]:
    """Run ``turns`` in a new session on a real host over ``data_dir``; returns (session id, turn ids)."""
    options.setdefault("durability", "nosync")
    with Host.open(data_dir, permission_mode="acceptCalls", provider=provider, **options) as host:
        session = host.create(title=title)
        turn_ids = []
        for text in turns:
            receipt = session.continue_turn() if text is CONTINUE else session.send(text)
            result = session.wait(receipt.turn_id, 20)
            assert result.state != "timeout"
            turn_ids.append(receipt.turn_id)
        return session.id, turn_ids


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def cli_json(*args: str) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def stream_events(data_dir: str, session_id: str) -> list[Any]:
    with open_store(os.path.join(data_dir, "store"), readonly=True) as store:
        return store.read_stream(f"session-{session_id}")


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, list[str]]:
    """One recorded session of every kind of turn, snapshotted every 5 events."""
    data_dir = str(tmp_path_factory.mktemp("golden") / "data")
    session_id, turn_ids = record(data_dir, TURNS, snapshot_every=5)
    return data_dir, session_id, turn_ids


@pytest.fixture
def recorded(golden: tuple[str, str, list[str]], tmp_path: Any) -> tuple[str, str, list[str]]:
    """A private copy of the golden data directory, for commands that write (forks, imports)."""
    data_dir, session_id, turn_ids = golden
    copy = str(tmp_path / "data")
    shutil.copytree(data_dir, copy)
    return copy, session_id, turn_ids


@pytest.fixture
def writer_process(recorded: tuple[str, str, list[str]]) -> Iterator[None]:
    """Another process holding the data directory's writer lock, as a running server does."""
    data_dir = recorded[0]
    code = ("import sys; from sessionloop.actors.events import open_store; "
            f"s = open_store({os.path.join(data_dir, 'store')!r}); print('ready', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)


# --- replay --------------------------------------------------------------------------------------


def test_replay_prints_turns_with_their_model_calls_tool_calls_and_checkpoints(golden) -> None:
    data_dir, session_id, _ = golden
    result = cli("replay", session_id, "--data", data_dir)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"session {session_id} \"demo\"" in out
    for n in range(1, 7):
        assert f"turn {n}  " in out
    assert "model call  mock/mock" in out and "prompt +" in out and "completion tokens" in out
    assert 'tool call  list_files {"path":"."}' in out
    assert "write_file" in out and "checkpoint  notes.txt (new file)" in out
    assert "checkpoint  notes.txt (existed, 5 bytes)" in out
    assert "model call  failed" in out and "broken model" in out
    assert "(reasoning 'weigh the options')" in out
    assert "totals: 6 turns" in out


def test_replay_json_has_turns_with_outcomes_and_steps_with_tokens_and_statuses(golden) -> None:
    data_dir, session_id, turn_ids = golden
    timeline = cli_json("replay", session_id, "--data", data_dir)
    assert [t["turnId"] for t in timeline["turns"]] == turn_ids
    assert [t["status"] for t in timeline["turns"]] == ["completed"] * 3 + ["failed"] + ["completed"] * 2
    assert timeline["turns"][3]["code"] == "model-error"
    assert all(t["durationMs"] >= 0 for t in timeline["turns"])
    models = [e for e in timeline["entries"] if e["kind"] == "model"]
    assert models[0]["facts"]["provider"] == "mock" and models[0]["facts"]["promptTokens"] >= 1
    assert any(m["status"] == "failed" and m["facts"]["error"] == "broken model" for m in models)
    tools = [e for e in timeline["entries"] if e["kind"] == "tool"]
    assert [(t["facts"]["tool"], t["status"]) for t in tools] == [
        ("list_files", "completed"), ("write_file", "completed"), ("write_file", "completed")]
    assert tools[0]["turn"] == 2 and tools[0]["endVersion"] > tools[0]["version"]


def test_replay_until_an_event_version_stops_at_that_event(golden) -> None:
    data_dir, session_id, _ = golden
    timeline = cli_json("replay", session_id, "--data", data_dir, "--until", "10")
    assert timeline["events"] == 10 and timeline["until"] == 10
    assert max(e["version"] for e in timeline["entries"]) <= 10


def test_replay_until_a_turn_keeps_that_turn_and_nothing_after_it(golden) -> None:
    data_dir, session_id, turn_ids = golden
    timeline = cli_json("replay", session_id, "--data", data_dir, "--until", turn_ids[1])
    assert [t["turnId"] for t in timeline["turns"]] == turn_ids[:2]
    assert timeline["turns"][1]["status"] == "completed"


def test_replay_of_an_unknown_turn_is_one_clear_error(golden) -> None:
    data_dir, session_id, _ = golden
    result = cli("replay", session_id, "--data", data_dir, "--until", "nosuchturn")
    assert result.exit_code != 0
    assert result.output.strip() == f"Error: turn nosuchturn not found in session {session_id}"


def test_an_unknown_session_is_reported_as_not_found_in_the_data_directory(golden) -> None:
    data_dir = golden[0]
    for command in (["replay"], ["replay", "--verify"], ["events"], ["rerun", "--from-turn", "0"]):
        result = cli(command[0], "nosuch", *command[1:], "--data", data_dir)
        assert result.exit_code != 0
        assert result.output.strip() == f"Error: session nosuch not found in {data_dir}"


def test_a_missing_data_directory_is_one_clear_error(tmp_path) -> None:
    result = cli("replay", "abc", "--data", str(tmp_path / "nothing"))
    assert result.exit_code != 0
    assert "session abc not found in" in result.output and "no event store there" in result.output


def test_replay_reads_a_store_while_another_process_writes_it(recorded, writer_process) -> None:
    data_dir, session_id, _ = recorded
    assert cli("replay", session_id, "--data", data_dir).exit_code == 0
    result = cli("replay", session_id, "--data", data_dir, "--verify")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].startswith(
        f"compared offline, with the store only: {data_dir} is in use by a running server (")


# --- verify ----------------------------------------------------------------------------------------


def test_verify_passes_on_a_healthy_store_and_says_what_it_checked(golden) -> None:
    data_dir, session_id, _ = golden
    result = cli("replay", session_id, "--data", data_dir, "--verify")
    assert result.exit_code == 0, result.output
    events = len(stream_events(data_dir, session_id))
    line, compared = result.stdout.strip().splitlines()
    assert line.startswith(f"verified: {events} events, snapshot at version ")
    assert line.endswith(" items") and "listing record, history of " in line
    assert compared.startswith(f"compared with a live host on {data_dir} (epoch ")
    assert "the session actor's projection and state, 1 session/history page(s), the session/subscribe " \
           "snapshot of " in compared


def test_verify_json_says_what_the_live_host_served(recorded) -> None:
    data_dir, session_id, _ = recorded
    report = cli_json("replay", session_id, "--data", data_dir, "--verify")
    assert report["compared"] == "live" and "difference" not in report and "offlineReason" not in report
    assert report["liveEpoch"] >= 2 and report["historyPages"] == 1  # the recording drew epoch 1
    assert report["snapshotItems"] >= report["historyItems"]


def test_verify_offline_compares_with_the_store_only_and_says_so(recorded) -> None:
    data_dir, session_id, _ = recorded
    result = cli("replay", session_id, "--data", data_dir, "--verify", "--offline")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "compared offline, with the store only: --offline was given"
    report = cli_json("replay", session_id, "--data", data_dir, "--verify", "--offline")
    assert (report["compared"], report["offlineReason"]) == ("offline", "--offline was given")
    assert "liveEpoch" not in report
    bad = cli("replay", session_id, "--data", data_dir, "--offline")
    assert bad.exit_code != 0 and bad.output.strip() == "Error: --offline only applies to --verify"


def test_verify_stays_offline_when_opening_a_host_would_resume_unfinished_turns(recorded) -> None:
    data_dir, session_id, _ = recorded
    with Host.open(data_dir, durability="nosync", permission_mode="acceptCalls") as host:
        busy = host.create(title="busy")
        busy.send("!sleep 60000\nstill thinking")
    before = len(stream_events(data_dir, busy.id))
    report = cli_json("replay", session_id, "--data", data_dir, "--verify")
    assert report["compared"] == "offline" and "difference" not in report
    assert report["offlineReason"].startswith(f"opening {data_dir} would resume 1 session(s) with unfinished work")
    assert f"session-{busy.id}" in report["offlineReason"]
    assert len(stream_events(data_dir, busy.id)) == before  # nothing ran


def test_verify_reports_a_listing_record_that_missed_a_rename(recorded) -> None:
    data_dir, session_id, _ = recorded
    stream = f"session-{session_id}"
    with open_store(os.path.join(data_dir, "store"), durability="nosync") as store:
        stale = store.stream_meta(stream)
        store.append(stream, [E.SessionRenamed(at=1, title="renamed")], meta=stale)
    result = cli("replay", session_id, "--data", data_dir, "--verify")
    assert result.exit_code == 1
    assert "difference in the listing record at record.title" in result.stdout
    assert "expected (from the events): renamed" in result.stdout
    assert "got (stored/served):        demo" in result.stdout


def test_verify_reports_a_snapshot_that_disagrees_with_the_events(recorded) -> None:
    data_dir, session_id, _ = recorded
    stream = f"session-{session_id}"
    events = stream_events(data_dir, session_id)

    state = fold_events(session_id, events[:7])
    state.title = "tampered"
    with open_store(os.path.join(data_dir, "store"), durability="nosync") as store:
        store.save_snapshot(stream, 7, encode_state(state))
    report = cli_json("replay", session_id, "--data", data_dir, "--verify")
    assert report["difference"] == {"check": "snapshot", "path": "state.title", "expected": "demo",
                                    "got": "tampered", "version": 7}
    assert cli("replay", session_id, "--data", data_dir, "--verify").exit_code == 1


def test_verify_ignores_listing_fields_that_come_from_other_streams(recorded) -> None:
    data_dir, session_id, _ = recorded
    stream = f"session-{session_id}"
    with open_store(os.path.join(data_dir, "store"), durability="nosync") as store:
        record = decode_summary_record(store.stream_meta(stream))
        events = store.read_stream(stream)

        state = fold_events(session_id, events)
        state = fold_events(session_id, [E.SessionSeen(at=state.updated_at)], state)
        forged = msgspec.structs.replace(summary_record(state), attention=True, background=2)
        store.append(stream, [E.SessionSeen(at=state.updated_at)], meta=encode_summary_record(forged))
        assert record.attention is False
    assert cli("replay", session_id, "--data", data_dir, "--verify").exit_code == 0


# --- rerun -------------------------------------------------------------------------------------------


def test_rerun_with_the_replay_provider_reproduces_the_log_exactly(recorded) -> None:
    data_dir, session_id, _ = recorded
    report = cli_json("rerun", session_id, "--data", data_dir, "--from-turn", "1")
    assert report["identical"] is True and report["divergence"] is None
    assert report["turns"] == report["turnsSent"] == 5 and report["compared"] > 30
    original = [e.event for e in stream_events(data_dir, session_id) if isinstance(e.event, E.LlmCompleted)]
    forked = [e.event for e in stream_events(data_dir, report["fork"]) if isinstance(e.event, E.LlmCompleted)]
    assert [(e.text, e.tool_calls) for e in forked] == [(e.text, e.tool_calls) for e in original[1:]]


def test_rerun_prints_identical_and_exits_zero_when_nothing_diverged(recorded) -> None:
    data_dir, session_id, _ = recorded
    result = cli("rerun", session_id, "--data", data_dir, "--from-turn", "3")
    assert result.exit_code == 0, result.output
    assert "identical: " in result.stdout and "events match the recording (modulo ids and times)" in result.stdout
    assert "inspect the fork: sessionloop replay " in result.stdout


def test_rerun_with_live_tools_starts_from_the_files_as_they_were_at_the_fork(recorded) -> None:
    data_dir, session_id, _ = recorded
    report = cli_json("rerun", session_id, "--data", data_dir, "--from-turn", "3", "--tools", "live")
    assert report["identical"] is True, report
    with open(os.path.join(data_dir, "workspaces", report["fork"], "notes.txt")) as f:
        assert f.read() == "second"


def test_rerun_with_another_model_reports_the_first_divergence_like_a_replayer(tmp_path) -> None:
    data_dir = str(tmp_path / "data")
    session_id, _ = record(data_dir, ["hi", "again"], provider=ScriptedProvider(["first answer", "second answer"]))
    result = cli("rerun", session_id, "--data", data_dir, "--from-turn", "0", "--provider", "mock")
    assert result.exit_code == 1
    assert "divergence at event 4 (re-run turn 1 of 2): expected llm.completed" in result.stdout
    assert "field text: expected first answer, got echo: hi" in result.stdout
    report = cli_json("rerun", session_id, "--data", data_dir, "--from-turn", "0", "--provider", "mock")
    d = report["divergence"]
    assert (d["index"], d["expectedTag"], d["gotTag"], d["path"]) == (4, "llm.completed", "llm.completed", "text")
    assert report["turnsSent"] == 1  # stops at the first turn that diverged


def test_rerun_replays_continue_turns_after_a_tool_limit(tmp_path) -> None:
    data_dir = str(tmp_path / "data")
    session_id, _ = record(data_dir, ["!loop", CONTINUE, "done"], max_steps=2)
    report = cli_json("rerun", session_id, "--data", data_dir, "--from-turn", "0")
    assert report["identical"] is True, report
    tags = [E.event_tag(e.event) for e in stream_events(data_dir, report["fork"])]
    assert tags.count("turn.limit-reached") == 2


def test_rerun_reproduces_an_input_that_was_queued_while_a_turn_ran(tmp_path) -> None:
    data_dir = str(tmp_path / "data")
    with Host.open(data_dir, durability="nosync", permission_mode="acceptCalls") as host:
        session = host.create(title="queue")
        slow = session.send("!sleep 100\nslow")
        fast = session.send("fast")
        assert session.wait(slow.turn_id, 10).state == "completed"
        assert session.wait(fast.turn_id, 10).state == "completed"
        session_id = session.id
    versions = {(E.event_tag(r.event), getattr(r.event, "turn_id", None)): r.version
                for r in stream_events(data_dir, session_id)}
    assert versions[("input.accepted", fast.turn_id)] < versions[("turn.completed", slow.turn_id)]  # it queued
    report = cli_json("rerun", session_id, "--data", data_dir, "--from-turn", "0")
    assert report["identical"] is True, report


def test_rerun_override_reports_the_changed_result_and_exits_zero(recorded) -> None:
    data_dir, session_id, _ = recorded
    result = cli("rerun", session_id, "--data", data_dir, "--from-turn", "1",
                 "--override-tool", '1={"path": ".", "entries": ["planted.txt"], "truncated": false}')
    assert result.exit_code == 0, result.output
    assert "override: tool call call_1 (list_files, re-run turn 1)" in result.stdout
    assert "changed by the override: event 6 (tool.finished" in result.stdout
    assert "output.entries[0]" in result.stdout
    report = cli_json("rerun", session_id, "--data", data_dir, "--from-turn", "1", "--override-tool", "call_2={}")
    assert report["overrides"][0]["tool"] == "write_file"
    assert report["overrideChanges"][0]["path"].startswith("output.")
    assert report["divergence"] is None and report["identical"] is False


def test_rerun_refuses_an_override_of_a_call_that_did_not_run(recorded) -> None:
    data_dir, session_id, _ = recorded
    result = cli("rerun", session_id, "--data", data_dir, "--from-turn", "1", "--override-tool", "9={}")
    assert result.exit_code != 0
    assert "--override-tool 9: tool call 9 does not exist: 3 tool calls ran after turn 1" in result.output
    bad = cli("rerun", session_id, "--data", data_dir, "--from-turn", "1", "--override-tool", "1={nope")
    assert bad.exit_code != 0 and "not valid JSON" in bad.output


def test_rerun_with_live_tools_refuses_a_session_that_works_in_its_own_directory(tmp_path) -> None:
    """Live tools would change the original's own folder: one line naming the fix, exit 1, no
    fork made, and the writer lock released (the next command opens the data directory)."""
    data_dir, folder = str(tmp_path / "data"), tmp_path / "project"
    folder.mkdir()
    with Host.open(data_dir, permission_mode="acceptCalls", durability="nosync") as host:
        session = host.create(title="own folder", cwd=str(folder))
        assert session.wait(session.send("hello").turn_id, 20).state != "timeout"
        session_id = session.id
    result = cli("rerun", session_id, "--data", data_dir, "--from-turn", "0", "--tools", "live")
    assert result.exit_code == 1
    assert (f"Error: session {session_id} works in its own directory ({folder}); --tools live would change it: "
            "use --tools replay") in result.output
    with open_store(os.path.join(data_dir, "store")) as store:  # a writer: the lock was released
        assert store.count_streams("session") == 1  # the original only: no fork was made


def model_steps(data_dir: str, session_id: str) -> list[str]:
    return [e.event.step_id for e in stream_events(data_dir, session_id)
            if isinstance(e.event, (E.LlmCompleted, E.LlmFailed))]


def test_replay_shows_the_step_id_of_each_model_call(golden) -> None:
    data_dir, session_id, _ = golden
    out = cli("replay", session_id, "--data", data_dir).stdout
    for step in model_steps(data_dir, session_id):
        assert f"  [{step}]" in out


def test_rerun_override_of_a_model_answer_reports_what_the_agent_did_then(recorded) -> None:
    data_dir, session_id, _ = recorded
    result = cli("rerun", session_id, "--data", data_dir, "--from-turn", "1",
                 "--override-tool", 'llm:1={"text": "no need to list anything"}')
    assert result.exit_code == 0, result.output
    step = model_steps(data_dir, session_id)[1]  # the first model call of turn 2 (re-run turn 1)
    assert f"override: model call 1 of re-run turn 1 (step {step}) answered with " \
           '{"text":"no need to list anything"}' in result.stdout
    assert "changed by the override: event 4 (llm.completed" in result.stdout
    assert ("behaviour after the override diverged at event 5 (re-run turn 1 of 5): expected tool.started"
            in result.stdout)
    assert "got turn.completed" in result.stdout
    report = cli_json("rerun", session_id, "--data", data_dir, "--from-turn", "1",
                      "--override-tool", f'{step}={{"text": "no need to list anything"}}')
    assert report["overrides"] == [{"step": step, "kind": "model", "stepId": step, "turn": 1, "call": 1,
                                    "answer": {"text": "no need to list anything"}}]
    assert report["turnsSent"] == 1 and report["divergence"]["gotTag"] == "turn.completed"
    fork = [e.event for e in stream_events(data_dir, report["fork"]) if isinstance(e.event, E.TurnCompleted)]
    assert fork[-1].output_text == "no need to list anything"


def test_rerun_override_of_a_model_answer_with_the_same_calls_replays_on(recorded) -> None:
    data_dir, session_id, _ = recorded
    answer = '{"text": "listing", "toolCalls": [{"name": "list_files", "args": {"path": "."}, "callId": "call_1"}]}'
    report = cli_json("rerun", session_id, "--data", data_dir, "--from-turn", "1", "--override-tool", f"llm:1={answer}")
    assert report["divergence"] is None and report["turnsSent"] == 5
    assert [(d["index"], d["path"]) for d in report["overrideChanges"]] == [(4, "text")]


def test_rerun_override_can_make_a_model_call_fail(recorded) -> None:
    data_dir, session_id, _ = recorded
    report = cli_json("rerun", session_id, "--data", data_dir, "--from-turn", "2",
                      "--override-tool", 'llm:1={"error": "rate limited"}')
    d = report["divergence"]
    assert (d["expectedTag"], d["gotTag"], d["turn"]) == ("llm.completed", "llm.failed", 1)
    failed = [e.event for e in stream_events(data_dir, report["fork"]) if isinstance(e.event, E.TurnFailed)]
    assert [(e.code, e.reason) for e in failed][-1] == ("model-error", "rate limited")


def test_rerun_override_of_a_model_answer_with_a_live_model(tmp_path) -> None:
    data_dir = str(tmp_path / "data")
    session_id, _ = record(data_dir, ['!tool list_files {"path": "."}', "bye"])
    report = cli_json("rerun", session_id, "--data", data_dir, "--from-turn", "0", "--provider", "mock",
                      "--override-tool", 'llm:2={"text": "overridden"}')
    assert report["divergence"]["path"] == "output_text" and report["divergence"]["got"] == "overridden"
    texts = [e.event.text for e in stream_events(data_dir, report["fork"]) if isinstance(e.event, E.LlmCompleted)]
    assert texts == ["", "overridden"]


def test_rerun_refuses_an_unknown_model_step_or_a_bad_answer(recorded) -> None:
    data_dir, session_id, _ = recorded
    for overrides, expected in (
        (["llm:9={}"], ("--override-tool llm:9: model call llm:9 does not exist: 8 model calls were recorded after "
                        "turn 1 (llm:1 to llm:8)")),
        (["x.1={}"], ("--override-tool x.1: step 'x.1' is neither a tool call that ran nor a model call recorded "
                      "after turn 1")),
        (['llm:1={"txt": "a"}'], "not a model answer (Object contains unknown field `txt`)"),
        (["llm:1=[]"], "a model answer must be a JSON object"),
        (['llm:1={"text": "a'], "--override-tool llm:1: not valid JSON"),
        (['llm:1={"text": "a"}', 'llm:1={"text": "b"}'],
         "--override-tool llm:1: the same step as --override-tool llm:1"),
    ):
        args = [arg for value in overrides for arg in ("--override-tool", value)]
        result = cli("rerun", session_id, "--data", data_dir, "--from-turn", "1", *args)
        assert result.exit_code != 0 and expected in result.output, (overrides, result.output)
        assert len(result.output.strip().splitlines()) == 1


def test_rerun_refuses_a_turn_beyond_the_last_one(golden) -> None:
    data_dir, session_id, _ = golden
    result = cli("rerun", session_id, "--data", data_dir, "--from-turn", "6")
    assert result.exit_code != 0
    assert "--from-turn must be between 0 and 5" in result.output


def test_rerun_refuses_clearly_while_a_server_holds_the_data_directory(recorded, writer_process) -> None:
    data_dir, session_id, _ = recorded
    result = cli("rerun", session_id, "--data", data_dir, "--from-turn", "1")
    assert result.exit_code != 0
    assert f"{data_dir} is in use by a running server" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_rerun_refuses_when_opening_the_directory_would_resume_another_sessions_turn(recorded) -> None:
    data_dir, session_id, _ = recorded
    with Host.open(data_dir, durability="nosync", permission_mode="acceptCalls") as host:
        busy = host.create(title="busy")
        busy.send("!sleep 60000\nstill thinking")
    result = cli("rerun", session_id, "--data", data_dir, "--from-turn", "1")
    assert result.exit_code != 0
    assert "1 other session(s)" in result.output and f"session-{busy.id}" in result.output


def test_rerun_refuses_a_session_that_changed_between_its_plan_and_the_writer_lock(recorded) -> None:
    """The rerun's answers come from the events read before the lock was taken; read again under
    the lock, a session a server wrote to in between is refused, naming what changed."""
    data_dir, session_id, _ = recorded
    planned = stream_events(data_dir, session_id)
    assert _check_unchanged(stream_events(data_dir, session_id), planned, data_dir, session_id) is None
    with Host.open(data_dir, durability="nosync", permission_mode="acceptCalls") as host:
        assert host.session(session_id).run("one more", timeout=20).state == "completed"
        now = host.store.read_stream(f"session-{session_id}")
    with pytest.raises(click.ClickException) as refused:
        _check_unchanged(now, planned, data_dir, session_id)
    assert refused.value.message == (
        f"session {session_id} in {data_dir} changed while the rerun was being prepared ({len(planned)} events "
        f"when planned, {len(now)} now, up to version {now[-1].version}); nothing was re-run: run rerun again")
    assert len(now) > len(planned)


# --- events and import -------------------------------------------------------------------------------


def test_events_json_exports_one_object_per_event_with_its_place_in_the_log(golden) -> None:
    data_dir, session_id, _ = golden
    result = cli("events", session_id, "--data", data_dir, "--json")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    recorded_events = stream_events(data_dir, session_id)
    assert len(lines) == len(recorded_events)
    assert [line["version"] for line in lines] == list(range(1, len(lines) + 1))
    assert {"stream", "version", "position", "at", "event"} <= set(lines[0])
    assert lines[0]["event"]["type"] == "session.created"
    assert [line["event"] for line in lines] == [event_to_builtins(e.event) for e in recorded_events]


def test_events_without_json_prints_one_readable_line_per_event(golden) -> None:
    data_dir, session_id, _ = golden
    lines = cli("events", session_id, "--data", data_dir).stdout.splitlines()
    assert len(lines) == len(stream_events(data_dir, session_id))
    assert lines[0].startswith("v1 ") and "session.created" in lines[0]


def test_exported_events_import_back_into_a_new_session(golden, tmp_path) -> None:
    data_dir, session_id, _ = golden
    export = tmp_path / "s.jsonl"
    export.write_text(cli("events", session_id, "--data", data_dir, "--json").stdout)
    target = str(tmp_path / "other")
    result = cli("import", str(export), "--data", target, "--as", "copy-1")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"imported {len(stream_events(data_dir, session_id))} events as session copy-1 " \
                                    f"into {target}"
    original = [event_to_builtins(e.event) for e in stream_events(data_dir, session_id)]
    copied = [event_to_builtins(e.event) for e in stream_events(target, "copy-1")]
    original[0]["session_id"] = "copy-1"
    assert copied == original
    assert cli("replay", "copy-1", "--data", target, "--verify").exit_code == 0
    with Host.open(target, durability="nosync") as host:
        assert [s.id for s in host.list()] == ["copy-1"]
        assert host.session("copy-1").run("after import", timeout=10).output_text == "echo: after import"


def test_import_keeps_the_session_id_of_the_file_by_default(golden, tmp_path) -> None:
    data_dir, session_id, _ = golden
    export = tmp_path / "s.jsonl"
    export.write_text(cli("events", session_id, "--data", data_dir, "--json").stdout)
    target = str(tmp_path / "other")
    assert cli("import", str(export), "--data", target).exit_code == 0
    assert len(stream_events(target, session_id)) == len(stream_events(data_dir, session_id))


def test_import_refuses_an_existing_session_id(recorded, tmp_path) -> None:
    data_dir, session_id, _ = recorded
    export = tmp_path / "s.jsonl"
    export.write_text(cli("events", session_id, "--data", data_dir, "--json").stdout)
    before = len(stream_events(data_dir, session_id))
    result = cli("import", str(export), "--data", data_dir)
    assert result.exit_code != 0
    assert result.output.strip() == (f"Error: session {session_id} already exists in {data_dir}; "
                                     "choose another id with --as")
    assert len(stream_events(data_dir, session_id)) == before


def test_import_refuses_a_bad_line_naming_it_and_writes_nothing(golden, tmp_path) -> None:
    data_dir, session_id, _ = golden
    lines = cli("events", session_id, "--data", data_dir, "--json").stdout.splitlines()
    broken = json.loads(lines[2])
    broken["event"]["type"] = "no.such.event"
    lines[2] = json.dumps(broken)
    export = tmp_path / "bad.jsonl"
    export.write_text("\n".join(lines) + "\n")
    target = str(tmp_path / "other")
    result = cli("import", str(export), "--data", target, "--as", "x1")
    assert result.exit_code != 0
    assert result.output.strip() == "Error: line 3: unknown event type 'no.such.event'"
    assert not os.path.exists(os.path.join(target, "store"))


def test_import_refuses_a_line_that_is_not_json_or_skips_a_version(golden, tmp_path) -> None:
    data_dir, session_id, _ = golden
    lines = cli("events", session_id, "--data", data_dir, "--json").stdout.splitlines()
    for bad, expected in (([*lines[:4], "{not json", *lines[4:]], "line 5: not an exported event"),
                          ([*lines[:4], *lines[5:]], "line 5: version 6, expected 5"),
                          (lines[1:], "line 1: the first event must be session.created")):
        export = tmp_path / "bad.jsonl"
        export.write_text("\n".join(bad) + "\n")
        result = cli("import", str(export), "--data", str(tmp_path / "other"), "--as", "x2")
        assert result.exit_code != 0 and expected in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


# --- help ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["replay", "rerun", "events", "import"])
def test_every_replay_command_has_help_with_an_example(command: str) -> None:
    result = cli(command, "--help")
    assert result.exit_code == 0
    assert "Example" in result.stdout and f"sessionloop {command} " in result.stdout
    assert "--data" in result.stdout

