"""The commands a session accepts from outside (``actors/session/commands.py``), decided purely.

``run_command(log, command)`` is the testkit: the decision's events, each round-tripped through the
store's codec (what is decided is what a reload reads), folded into the state, and the fold of the
whole log from nothing checked equal to that state (the state is a fold of its events).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pytest

from sessionloop.actors import events as E
from sessionloop.actors.errors import Conflict, InvalidCommand, NotFound, SessionBusy
from sessionloop.actors.model.base import ModelResponse, RetryNotice
from sessionloop.actors.session import commands as C
from sessionloop.actors.session.decide import (
    AgentConfig,
    DecideContext,
    ToolPolicy,
    decide_command,
    decide_create,
    decide_input,
    decide_model_done,
    decide_model_retried,
    decide_park,
    decide_stop,
    decide_tool_done,
)
from sessionloop.actors.session.drive import drive
from sessionloop.actors.session.state import SessionState, copy_state, evolve, new_state
from sessionloop.actors.tools.registry import ToolResult
from tests.actors.testkit import round_trip

SID = "s1"
NOW = 1_700_000_000_000


@dataclass
class Log:
    """A session as its log: every event so far and the state they fold to."""

    state: SessionState
    events: list[E.Event] = field(default_factory=list)


def created(**fields) -> Log:
    log = Log(new_state(SID))
    append(log, [E.SessionCreated(at=NOW - 10, session_id=SID, title="first", **fields)])
    return log


def append(log: Log, events: list[E.Event]) -> None:
    for event in events:
        evolve(log.state, event)
    log.events += events


def fold(events: list[E.Event]) -> SessionState:
    state = new_state(SID)
    for event in events:
        evolve(state, event)
    return state


def run_command(log: Log, command: C.Command, now: int = NOW, settings=None) -> list[E.Event]:
    """Decide ``command`` on a copy of the state; round-trip, fold and check the events."""
    before = copy_state(log.state)
    events = decide_command(before, command, DecideContext(now, settings))
    assert msgspec.to_builtins(before) == msgspec.to_builtins(log.state)  # deciding changed nothing
    decoded = round_trip(events)
    append(log, decoded)
    assert msgspec.to_builtins(fold(log.events)) == msgspec.to_builtins(log.state)
    return events


def test_rename_records_the_trimmed_title_and_refuses_an_empty_one() -> None:
    log = created()
    assert run_command(log, C.Rename(title="  Chat with Alice ")) == [E.SessionRenamed(at=NOW, title="Chat with Alice")]
    assert log.state.title == "Chat with Alice"
    with pytest.raises(InvalidCommand):
        run_command(log, C.Rename(title="   "))


def test_every_command_refuses_a_session_that_does_not_exist() -> None:
    log = Log(new_state(SID))
    for command in (C.Rename(title="x"), C.MarkSeen(), C.ClearPlan(), C.Archive(archived=True)):
        with pytest.raises(NotFound):
            run_command(log, command)
    assert log.events == []


def test_archive_and_unarchive_write_only_a_change() -> None:
    log = created()
    assert run_command(log, C.Archive(archived=False)) == []
    assert run_command(log, C.Archive(archived=True)) == [E.SessionArchived(at=NOW)]
    assert run_command(log, C.Archive(archived=True)) == []
    assert log.state.archived
    assert run_command(log, C.Archive(archived=False)) == [E.SessionUnarchived(at=NOW)]
    assert not log.state.archived


def test_clear_plan_writes_nothing_without_a_plan() -> None:
    log = created()
    assert run_command(log, C.ClearPlan()) == []
    append(log, [E.PlanUpdated(at=NOW - 5, entries=[E.PlanEntry(text="read", status="pending")])])
    assert run_command(log, C.ClearPlan()) == [E.PlanCleared(at=NOW)]
    assert not log.state.plan


def test_mark_seen_is_recorded() -> None:
    log = created()
    assert run_command(log, C.MarkSeen()) == [E.SessionSeen(at=NOW)]


def test_a_grant_is_revoked_once_and_an_unknown_one_is_not_found() -> None:
    log = created()
    terms = E.GrantTerms(scope="session", tool="exec", expires_at=NOW + 60_000)
    answered = E.Settlement(state="approved", source="answer", at=NOW - 1, grant=terms)
    append(log, [E.ToolApprovalSettled(at=NOW - 1, turn_id="t0", call_id="c0", approval_id="g1", settlement=answered)])
    assert list(log.state.grants) == ["g1"]
    by = E.Speaker(platform="console", user_id="owner", owner=True)
    assert run_command(log, C.RevokeGrant(grant_id="g1", by=by)) == [
        E.ApprovalGrantRevoked(at=NOW, grant_id="g1", by=by)]
    with pytest.raises(NotFound):
        run_command(log, C.RevokeGrant(grant_id="g1", by=by))  # revoked: no longer active
    with pytest.raises(NotFound):
        run_command(log, C.RevokeGrant(grant_id="nope", by=by))


def test_a_fork_copies_the_creation_under_the_new_id_and_refuses_an_existing_session() -> None:
    source = E.SessionCreated(at=1, session_id="src", title="source", cwd="/w", permission_mode="acceptCalls")
    messages = [E.Message(role="user", content="hi"), E.Message(role="assistant", content="echo: hi")]
    log = Log(new_state(SID))
    fork = C.ImportFork(source_id="src", source_created=source, session_id=SID, title="copy", turns=1,
                        messages=messages)
    events = run_command(log, fork)
    assert events[0] == msgspec.structs.replace(source, at=NOW, session_id=SID, forked_from="src", fork_turns=1,
                                                title="copy")
    assert events[1] == E.MessagesImported(at=NOW, source_session_id="src", turns=1, messages=messages)
    assert [m.content for m in log.state.messages] == ["hi", "echo: hi"]
    with pytest.raises(InvalidCommand, match="already exists"):
        run_command(log, fork)


def test_a_task_notice_opens_a_turn_and_a_deleted_session_gets_none() -> None:
    notice = C.PostTaskNotice(task_id="task-1", turn_id="t1", input_id="i1", text="task-1 exited 0",
                              text_key="", text_values={}, facts={"taskId": "task-1", "exitCode": 0})
    log = created()
    posted, accepted = run_command(log, notice)
    assert isinstance(posted, E.NoticePosted) and posted.starts_turn and posted.turn_id == "t1"
    assert accepted == E.InputAccepted(at=NOW, input_id="i1", turn_id="t1", text="task-1 exited 0",
                                       source="background-task")
    assert [q.turn_id for q in log.state.queue] == ["t1"]
    gone = created()
    append(gone, [E.SessionDeleted(at=NOW - 1)])
    assert run_command(gone, notice) == []


def test_an_approval_settles_only_the_running_turns_unsettled_call() -> None:
    log = created()
    settle = C.SettleApproval(turn_id="t1", call_id="c1", approval_id="a1",
                              settlement=E.Settlement(state="approved", source="answer", at=NOW))
    assert run_command(log, settle) == []  # no such call


def test_a_rewind_is_refused_while_a_turn_runs() -> None:
    rewind = C.Rewind(turn_id="t0", scope="code", restored=["a.txt"], removed=[], conflicts=[], chat_deleted=False,
                      deleted_messages=0)
    log = created()
    append(log, [E.InputAccepted(at=NOW - 3, input_id="i1", turn_id="t1", text="go"),
                 E.TurnStarted(at=NOW - 2, turn_id="t1", input_ids=["i1"])])
    with pytest.raises(SessionBusy):
        run_command(log, rewind)


def test_checkpoints_record_each_file_once_per_turn() -> None:
    log = created()
    images = [C.CheckpointImage("a.txt", True, b"old"), C.CheckpointImage("a.txt", True, b"newer"),
              C.CheckpointImage("b.txt", False, None)]
    events = run_command(log, C.RecordCheckpoints(turn_id="t1", call_id="c1", images=images))
    assert [(e.path, e.existed, e.content) for e in events] == [("a.txt", True, b"old"), ("b.txt", False, None)]
    again = run_command(log, C.RecordCheckpoints(turn_id="t1", call_id="c2", images=images[:1]))
    assert again == []


def test_a_task_end_is_copied_unless_the_session_is_gone() -> None:
    ended = E.TaskEnded(at=NOW - 1, task_id="task-1", status="stopped")
    log = created()
    assert run_command(log, C.RecordTaskEnd(ended=ended)) == [ended]
    assert run_command(Log(new_state(SID)), C.RecordTaskEnd(ended=ended)) == []


def test_a_setting_write_without_a_settings_service_is_refused_naming_why() -> None:
    with pytest.raises(InvalidCommand, match="settings"):
        run_command(created(), C.SetSetting(plugin="tools", key="permissionMode", value="deny"))


def test_a_command_outside_the_closed_set_is_a_type_error() -> None:
    class Stray(C.Command, frozen=True, kw_only=True):
        pass

    with pytest.raises(TypeError, match="Stray"):
        decide_command(created().state, Stray(), DecideContext(NOW))


# --- the session's own inputs and outcomes, decided (what the actor shell is told) -------------------


def record(log: Log, events: list[E.Event]) -> list[E.Event]:
    """Round-trip ``events`` through the codec, fold them in, check the fold of the whole log."""
    append(log, round_trip(events))
    assert msgspec.to_builtins(fold(log.events)) == msgspec.to_builtins(log.state)
    return events


def fields_of(struct_type: type) -> set[str]:
    return {f.name for f in msgspec.structs.fields(struct_type)}


def test_what_a_creator_and_a_sender_say_has_every_field_of_the_events_but_time_and_id() -> None:
    assert fields_of(C.NewSession) == fields_of(E.SessionCreated) - {"at", "session_id"}
    assert fields_of(C.NewInput) == fields_of(E.InputAccepted) - {"at"}


def test_a_create_records_the_session_under_its_id_with_its_first_input_and_refuses_a_second() -> None:
    log = Log(new_state(SID))
    first = C.NewInput(input_id="i1", turn_id="t1", text="hello", idempotency_key="k1")
    events = record(log, decide_create(log.state, C.NewSession(title="demo", activity="background"), first, NOW))
    assert events == [E.SessionCreated(at=NOW, session_id=SID, title="demo", activity="background"),
                      E.InputAccepted(at=NOW, input_id="i1", turn_id="t1", text="hello", idempotency_key="k1")]
    assert [q.turn_id for q in log.state.queue] == ["t1"]
    with pytest.raises(Conflict):
        decide_create(log.state, C.NewSession(title="again"), None, NOW)


def test_an_input_is_accepted_once_by_its_input_id_and_not_into_a_deleted_session() -> None:
    log = created()
    new = C.NewInput(input_id="i1", turn_id="t1", text="hi", speaker=E.Speaker(platform="im", user_id="u1"))
    assert record(log, decide_input(log.state, new, NOW)) == [
        E.InputAccepted(at=NOW, input_id="i1", turn_id="t1", text="hi", speaker=E.Speaker(platform="im", user_id="u1"))]
    with pytest.raises(Conflict):
        decide_input(log.state, new, NOW)
    record(log, [E.SessionDeleted(at=NOW)])
    with pytest.raises(NotFound):
        decide_input(log.state, C.NewInput(input_id="i2", turn_id="t2"), NOW)


def running_call(tool: str, args: dict) -> Log:
    """A session whose turn t1 runs ``tool`` as call c1 (decided by the default loop)."""
    log = created()
    record(log, decide_input(log.state, C.NewInput(input_id="i1", turn_id="t1", text="go"), NOW))
    cfg = AgentConfig(permission_mode="acceptCalls")

    def check(name: str, args: object, call_id: str) -> ToolPolicy:
        return ToolPolicy(exists=True)

    def decide_drive() -> None:
        scratch = copy_state(log.state)
        record(log, drive(scratch, cfg, check, NOW, lambda e: evolve(scratch, e)).events)

    decide_drive()
    step = log.state.pending_llm
    assert step is not None
    answer = ModelResponse(tool_calls=[E.ToolCallSpec(call_id="c1", name=tool, args=args)])
    record(log, decide_model_done(log.state, step, answer, None, 5, NOW))
    decide_drive()
    assert log.state.tool_calls["c1"].status == "running"
    return log


def test_a_plan_tools_result_replaces_the_plan_and_a_late_result_is_dropped() -> None:
    log = running_call("update_plan", {"entries": [{"text": "read", "status": "pending"}]})
    output = {"entries": [{"text": "read", "status": "pending"}], "explanation": "first"}
    events = record(log, decide_tool_done(log.state, "t1", "c1", ToolResult(output=output), 7, NOW))
    assert [type(e) for e in events] == [E.ToolFinished, E.PlanUpdated]
    assert events[0].status == "completed" and events[0].duration_ms == 7
    assert events[1] == E.PlanUpdated(at=NOW, entries=[E.PlanEntry(text="read", status="pending")],
                                      explanation="first")
    assert decide_tool_done(log.state, "t1", "c1", ToolResult(output=output), 7, NOW) == []  # finished already


def test_a_failed_command_is_a_failed_call_that_names_its_background_task() -> None:
    log = running_call("exec", {"command": "make"})
    result = ToolResult(output={"taskId": "task-1", "stdout": ""}, exit_code=2)
    (finished,) = record(log, decide_tool_done(log.state, "t1", "c1", result, 3, NOW))
    assert (finished.status, finished.exit_code, finished.task_id) == ("failed", 2, "task-1")


def test_a_retry_is_recorded_for_the_running_step_only() -> None:
    log = running_call("exec", {"command": "true"})
    notice = RetryNotice(attempt=1, status=503, cause="http", wait_ms=250, error="HTTP 503")
    assert decide_model_retried(log.state, "not-the-step", notice, "item-2", NOW) == []
    record(log, decide_tool_done(log.state, "t1", "c1", ToolResult(output="ok"), 1, NOW))
    scratch = copy_state(log.state)
    follow = drive(scratch, AgentConfig(permission_mode="acceptCalls"), lambda *a: ToolPolicy(exists=True), NOW,
                   lambda e: evolve(scratch, e))
    record(log, follow.events)
    step = log.state.pending_llm
    assert step is not None
    (retried,) = record(log, decide_model_retried(log.state, step, notice, "item-2", NOW))
    assert (retried.attempt, retried.status, retried.wait_ms, retried.next_item_id) == (1, 503, 250, "item-2")


def test_stop_all_drops_the_queue_before_it_aborts_the_turn() -> None:
    log = running_call("exec", {"command": "sleep 9"})
    record(log, decide_input(log.state, C.NewInput(input_id="i2", turn_id="t2"), NOW))
    events = record(log, decide_stop(log.state, None, "stopped", NOW, drop_queue=True))
    assert events[0] == E.InputDropped(at=NOW, input_id="i2", turn_id="t2", reason="stopped")
    assert isinstance(events[-1], E.TurnAborted) and log.state.queue == [] and log.state.current_turn is None


def test_parking_is_a_recorded_fact_with_its_reason() -> None:
    log = created()
    assert record(log, decide_park("3 failures", NOW)) == [E.SessionParked(at=NOW, reason="3 failures")]
    assert log.state.parked == "3 failures"
