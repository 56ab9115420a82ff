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
from sessionloop.actors.errors import InvalidCommand, NotFound, SessionBusy
from sessionloop.actors.session import commands as C
from sessionloop.actors.session.decide import DecideContext, decide_command
from sessionloop.actors.session.state import SessionState, copy_state, evolve, new_state
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
