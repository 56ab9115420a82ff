"""A background task decided purely (``actors/tasks/model.py``): no actor, no store, no process.

Every decided event is round-tripped through the store's codec, and the fold of the task's
stream from nothing is checked equal to the task the service holds after the same steps (what
``background/list`` shows live is what a restart restores).
"""

from __future__ import annotations

import msgspec
import pytest

from sessionloop.actors import events as E
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.tasks import model as M
from sessionloop.protocol.schemas_types import BackgroundCall, BackgroundTask, CommandDisplay
from tests.actors.testkit import round_trip

NOW = 1_700_000_000_000
DISPLAY = E.ToolDisplay(kind="command", command="make test", cwd="/w")


def started(at: int = NOW - 5000, call_id: str = "c1") -> tuple[list[E.Event], BackgroundTask]:
    """A task's stream after its start, and the task the service holds then."""
    events = round_trip(M.decide_start(M.Start(session_id="s1", turn_id="t1", call_id=call_id, tool="exec",
                                               display=DISPLAY), at))
    [event] = events
    assert isinstance(event, E.TaskStarted)
    return events, M.task_of(event)


def with_output(task: BackgroundTask, line: str, at: int) -> BackgroundTask:
    """The task as the live output leaves it (not an event: the end records it)."""
    return msgspec.structs.replace(task, last_line=line, last_output_at=at)


def end(stream: list[E.Event], task: BackgroundTask, command: M.End, now: int = NOW) -> BackgroundTask:
    """Decide the end, append it to ``stream`` and return the task as the service records it."""
    decided = round_trip(M.decide_end(task, command, now))
    stream += decided
    for event in decided:
        assert isinstance(event, E.TaskEnded)
        task = M.ended(task, event)
    assert M.fold(stream) == task
    return task


def test_a_start_records_the_tool_call_under_an_id_of_its_session_call_and_turn() -> None:
    stream, task = started()
    assert stream == [E.TaskStarted(at=NOW - 5000, task_id="s1.c1.t1", session_id="s1", label="exec",
                                    call=E.ToolCallRef(tool="exec", turn_id="t1", call_id="c1"), display=DISPLAY)]
    assert task == BackgroundTask(id="s1.c1.t1", session_id="s1", kind="tool-call", label="exec", status="running",
                                  started_at=NOW - 5000, call=BackgroundCall(tool="exec", turn_id="t1", call_id="c1"),
                                  display=CommandDisplay(command="make test", cwd="/w"))
    assert M.fold(stream) == task


@pytest.mark.parametrize(("exit_code", "status"), [(0, "completed"), (2, "failed")])
def test_an_exit_is_completed_on_zero_and_failed_otherwise_with_the_last_line_of_output(exit_code, status) -> None:
    stream, task = started()
    task = with_output(task, "3 passed", NOW - 10)
    done = end(stream, task, M.End(exit_code=exit_code))
    assert stream[-1] == E.TaskEnded(at=NOW, task_id="s1.c1.t1", status=status, exit_code=exit_code,
                                     last_line="3 passed", last_output_at=NOW - 10)
    assert (done.status, done.ended_at, done.exit_code, done.reason, done.last_line) == (
        status, NOW, exit_code, None, "3 passed")


def test_a_stop_wins_over_the_exit_code_and_keeps_its_reason_as_a_text_object() -> None:
    stream, task = started()
    done = end(stream, task, M.End(exit_code=-9, stopped=Text("task.reason.stopped")))
    ended = stream[-1]
    assert isinstance(ended, E.TaskEnded)
    assert (ended.status, ended.exit_code, ended.reason_key) == ("stopped", -9, "task.reason.stopped")
    assert done.status == "stopped" and done.reason == ended.reason


def test_a_command_that_could_not_be_waited_for_failed_with_the_error_as_its_reason() -> None:
    stream, task = started()
    done = end(stream, task, M.End(error="no child process"))
    assert stream[-1] == E.TaskEnded(at=NOW, task_id="s1.c1.t1", status="failed", reason="no child process")
    assert (done.status, done.reason, done.exit_code) == ("failed", "no child process", None)


def test_an_ended_task_decides_no_second_end_nor_an_abort() -> None:
    stream, task = started()
    done = end(stream, task, M.End(exit_code=0))
    assert M.decide_end(done, M.End(exit_code=1), NOW + 1) == []
    assert M.decide_abort(done, M.Abort(), NOW + 1) == []


def test_a_task_an_earlier_run_left_running_is_aborted_for_the_restart_and_keeps_its_last_line() -> None:
    stream, task = started()
    stream += round_trip(M.decide_abort(task, M.Abort(), NOW))
    ended = stream[-1]
    assert isinstance(ended, E.TaskEnded)
    assert (ended.status, ended.reason_key, ended.exit_code) == ("aborted", "task.reason.restarted", None)
    restored = M.fold(stream)
    assert restored is not None and restored.status == "aborted" and str(restored.reason) == ended.reason


def test_the_copy_of_a_sessions_latest_end_is_of_its_most_recently_ended_task() -> None:
    first_stream, first = started(NOW - 9000)
    first = end(first_stream, first, M.End(exit_code=0), NOW - 6000)  # started first, ended last
    second_stream, second = started(NOW - 8000, "c2")
    second = end(second_stream, second, M.End(exit_code=1), NOW - 7000)
    _, running = started(NOW - 100)
    copy = M.copy_of_latest_end([first, second, running], NOW)
    assert copy == E.TaskEnded(at=NOW, task_id="s1.c1.t1", status="completed", exit_code=0)
    assert round_trip([copy]) == [copy]


def test_the_copy_for_a_session_without_an_ended_task_is_an_empty_abort() -> None:
    _, running = started()
    assert M.copy_of_latest_end([running], NOW) == E.TaskEnded(at=NOW, task_id="", status="aborted")


def test_a_stream_folds_to_nothing_without_a_start_and_ignores_other_events() -> None:
    assert M.fold([E.TaskEnded(at=NOW, task_id="x", status="aborted")]) is None
    stream, task = started()
    assert M.evolve(task, E.SessionSeen(at=NOW)) == task
