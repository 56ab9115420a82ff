"""One background task, pure: what its stream folds to, and the decisions that add to it.

A task's stream (``task-<session>.<task id>``) holds a ``task.started`` and, once it is over, one
``task.ended``. Its state is the protocol's :class:`BackgroundTask` (``background/list``), the fold
of them (:func:`evolve`); between the two the live output changes its last line, which the end
records. The decisions take the state (or, to start, nothing), a typed command and the time and
return the events to append (this module is the only place those two events are built):

* :func:`decide_start` (:class:`Start`): a command of a tool call goes on in the background;
* :func:`decide_end` (:class:`End`): the command exited (``completed``, or ``failed`` on a
  non-zero exit or an error waiting for it) or was stopped (``stopped``, with the stop's reason);
* :func:`decide_abort` (:class:`Abort`): after a restart, a task that was running is ``aborted``;
* :func:`copy_of_latest_end`: the end a session's listing record is rewritten with after a restart.

An ended task decides nothing more. No I/O, no clock: ``now`` (epoch milliseconds) is handed in;
the shell (``actors/tasks/actor.py``) appends what is decided.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.settings.texts import Text, stored_parts
from sessionloop.actors.views.wire import wire_display
from sessionloop.protocol.schemas_types import BackgroundCall, BackgroundTask

#: the reason a task left running by an earlier run is recorded ``aborted`` with
RESTARTED = Text("task.reason.restarted")


def task_id_of(session_id: str, turn_id: str, call_id: str) -> str:
    """The id of the task a tool call becomes: its session, call and turn."""
    return f"{session_id}.{call_id}.{turn_id}"


def task_stream(task_id: str) -> str:
    return f"task-{task_id}"


# --- state ---------------------------------------------------------------------------------------


def task_of(e: E.TaskStarted) -> BackgroundTask:
    """The running task a ``task.started`` records."""
    call = BackgroundCall(tool=e.call.tool, turn_id=e.call.turn_id, call_id=e.call.call_id) if e.call else None
    return BackgroundTask(id=e.task_id, session_id=e.session_id, kind="tool-call", label=e.label, call=call,
                          status="running", started_at=e.at, display=wire_display(e.display))


def ended(task: BackgroundTask, e: E.TaskEnded) -> BackgroundTask:
    """``task`` as a ``task.ended`` leaves it (a last line the end lacks is kept)."""
    reason = Text.stored(e.reason, e.reason_key, e.reason_values) if e.reason is not None else None
    return msgspec.structs.replace(task, status=e.status, ended_at=e.at, exit_code=e.exit_code, reason=reason,
                                   last_line=e.last_line or task.last_line,
                                   last_output_at=e.last_output_at or task.last_output_at)


def evolve(task: BackgroundTask | None, event: E.Event) -> BackgroundTask | None:
    """The task after ``event`` (total: an end before any start, or another kind, changes nothing)."""
    match event:
        case E.TaskStarted():
            return task_of(event)
        case E.TaskEnded() if task is not None:
            return ended(task, event)
    return task


def fold(events: Iterable[E.Event]) -> BackgroundTask | None:
    """The task a stream holding ``events`` records (None: it never started)."""
    task: BackgroundTask | None = None
    for event in events:
        task = evolve(task, event)
    return task


# --- commands and decisions ----------------------------------------------------------------------


class Start(msgspec.Struct, frozen=True, kw_only=True):
    """Tool call ``call_id`` of turn ``turn_id`` (a run of ``tool``) goes on in the background."""

    session_id: str
    turn_id: str
    call_id: str
    tool: str
    display: E.ToolDisplay | None = None


class End(msgspec.Struct, frozen=True, kw_only=True):
    """The command exited with ``exit_code`` (None: unknown); ``error`` says why it could not be
    waited for; ``stopped`` is the reason of a stop that asked it to end (``background/stop``)."""

    exit_code: int | None = None
    error: str | None = None
    stopped: str | None = None


class Abort(msgspec.Struct, frozen=True, kw_only=True):
    """A task an earlier run left running (none of it runs now)."""

    reason: str = RESTARTED


def decide_start(command: Start, now: int) -> list[E.TaskStarted]:
    """The ``task.started`` of a tool call's command going on in the background."""
    return [E.TaskStarted(at=now, task_id=task_id_of(command.session_id, command.turn_id, command.call_id),
                          session_id=command.session_id, label=command.tool,
                          call=E.ToolCallRef(tool=command.tool, turn_id=command.turn_id, call_id=command.call_id),
                          display=command.display)]


def decide_end(task: BackgroundTask, command: End, now: int) -> list[E.TaskEnded]:
    """How a running task ended, with its last line of output; nothing once it has ended.

    A stop wins over how the command exited (the kill is what ended it); an error waiting for it
    is a failure; else the exit code says: 0 completed, anything else failed."""
    if task.status != "running":
        return []
    if command.stopped is not None:
        status, reason = "stopped", command.stopped
    elif command.error is not None:
        status, reason = "failed", command.error
    else:
        status, reason = ("completed" if command.exit_code == 0 else "failed"), None
    return [task_ended(at=now, task_id=task.id, status=status, exit_code=command.exit_code, reason=reason,
                       last_line=task.last_line, last_output_at=task.last_output_at)]


def decide_abort(task: BackgroundTask, command: Abort, now: int) -> list[E.TaskEnded]:
    """A task recorded running by an earlier run is ``aborted``; nothing once it has ended."""
    if task.status != "running":
        return []
    return [task_ended(at=now, task_id=task.id, status="aborted", reason=command.reason)]


def copy_of_latest_end(tasks: Iterable[BackgroundTask], now: int) -> E.TaskEnded:
    """A ``task.ended`` copying the end of the most recently ended of ``tasks`` (one session's), for
    an append that rewrites that session's listing record; an empty ``aborted`` one without any."""
    done = [t for t in tasks if t.status != "running"]
    if not done:
        return E.TaskEnded(at=now, task_id="", status="aborted")
    t = max(done, key=lambda t: (t.ended_at or 0, t.started_at))
    return task_ended(at=now, task_id=t.id, status=t.status, exit_code=t.exit_code, reason=t.reason,
                      last_line=t.last_line, last_output_at=t.last_output_at)


def task_ended(*, reason: str | None, **fields: Any) -> E.TaskEnded:
    """A ``task.ended`` whose ``reason`` may be a text object: the event keeps its English text,
    key and values (events hold plain data; ``actors.settings.texts``)."""
    if reason is None:
        return E.TaskEnded(**fields)
    shown, key, values = stored_parts(reason)
    return E.TaskEnded(reason=shown, reason_key=key, reason_values=values, **fields)
