"""Background tasks: commands that outlived their tool call, one actor each,
persisted in their own stream (``task-<session>.<task id>``).

``exec`` runs in the foreground up to the yield timeout (or until the model asks for the
background); then the command is handed to a ``TaskActor``: the tool card completes with the
output so far and the task id, the command keeps running, and its output goes into a bounded
tail buffer addressed by character offset (``background/output {after}``). When it ends, the
task records how (completed / failed on a non-zero exit), and posts a ``background-task`` notice
to its session (notice id = task id) that opens a turn, so the agent hears of it; a task that
was stopped sends the model no notice. After a restart, tasks that were running are recorded
``aborted``; their exit code and display survive, their output does not.

Pushes (``background/changed``): start, end, stop and removal at once; changes of only the last
line are coalesced to at most one push per second per task.

This module is the shell: the registry, the output buffer, the pushes and the store. A task's
events are decided in ``actors/tasks/model.py``; a ``TaskActor`` takes a closed set of messages
(:data:`TaskMessage`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import msgspec
import pykka

from sessionloop.actors import events as E
from sessionloop.actors.errors import HostClosed, NotFound
from sessionloop.actors.session.commands import RecordTaskEnd
from sessionloop.actors.session.messages import Decide
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.system.pubsub import Reply
from sessionloop.actors.tasks.model import (
    Abort,
    End,
    Start,
    copy_of_latest_end,
    decide_abort,
    decide_end,
    decide_start,
    ended,
    fold,
    task_of,
    task_stream,
)
from sessionloop.actors.views.summary import decode_summary_record, encode_summary_record
from sessionloop.eventstore import ANY_VERSION
from sessionloop.protocol.schemas import BackgroundChanged
from sessionloop.protocol.schemas_types import BackgroundTask

if TYPE_CHECKING:
    from sessionloop.actors.system.runtime import Runtime

_STOPPED = Text("task.reason.stopped")  # background/stop, stopAll: the reason of a stopped task

log = logging.getLogger("sessionloop.tasks")

KEEP_ENDED = 20  # each session keeps its 20 most recent ended tasks
OUTPUT_KEEP = 256 * 1024  # characters of output kept per task (the tail)


def now_ms() -> int:
    return int(time.time() * 1000)


class _Output:
    """The tail of a task's output, addressed by absolute character offsets."""

    def __init__(self) -> None:
        self.text = ""
        self.end = 0  # characters produced so far

    def add(self, text: str) -> None:
        self.text = (self.text + text)[-OUTPUT_KEEP:]
        self.end += len(text)

    def read(self, after: int | None) -> tuple[str, int, bool]:
        start = self.end - len(self.text)
        after = 0 if after is None else after
        truncated = after < start
        offset = max(0, after - start)
        return self.text[offset:], self.end, truncated


class TaskService:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self._lock = threading.RLock()
        self.tasks: OrderedDict[str, BackgroundTask] = OrderedDict()
        self.outputs: dict[str, _Output] = {}
        self.actors: dict[str, pykka.ActorRef[Any]] = {}
        self.watchers: dict[Any, Any] = {}
        self._line_pending: dict[str, float] = {}
        self._loaded = False
        self.load()  # before any task of this run exists: what is flagged running now was left by a crash

    # --- registry -------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the tasks of earlier runs once; tasks left running by a crash become ``aborted``.

        Each session keeps its 20 most recent ended tasks here as after ``record``.
        Runs from the ``Runtime`` constructor, before any session actor exists; a session whose
        stored listing record still counts running tasks (none of an earlier run is running now)
        gets its record rewritten (:meth:`_settle_listing_records`)."""
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
        aborted: dict[str, list[E.TaskEnded]] = {}
        for stream in self.rt.store.flagged("task-running"):
            started = self.rt.store.read_stream(stream, 1, 1)
            if started and isinstance(started[0].event, E.TaskStarted):
                events = decide_abort(task_of(started[0].event), Abort(), now_ms())
                self.rt.store.append(stream, events, ANY_VERSION, flags={"task-running": False})
                aborted.setdefault(started[0].event.session_id, []).extend(events)
        restored: list[BackgroundTask] = []
        after = None
        while True:
            page = self.rt.store.list_streams("task", after, 500)
            for stream in page.streams:
                task = self._restore(stream)
                if task is not None:
                    restored.append(task)
            if page.next_after is None:
                break
            after = page.next_after
        restored.sort(key=lambda t: (t.started_at, t.id))
        with self._lock:
            for task in restored:
                self.tasks.setdefault(task.id, task)
            for session_id in {t.session_id for t in restored}:
                self._trim(session_id)
        self._settle_listing_records({t.session_id for t in restored}, aborted)

    def _restore(self, stream: str) -> BackgroundTask | None:
        return fold(r.event for r in self.rt.store.read_stream(stream) if isinstance(r.event, E.Event))

    def _settle_listing_records(self, session_ids: set[str], aborted: dict[str, list[E.TaskEnded]]) -> None:
        """After a restart no task of an earlier run is running, so a session's listing record that
        still counts some (a task recorded ``aborted`` just now, a stop whose session commit was
        lost at shutdown) is rewritten in the store, where ``SummaryIndex`` loads it from.

        A listing record is only written with an append to the session's stream, so the record goes
        with a copy of the task's end (the session's state and timeline ignore it); no session
        actor exists yet, so nobody else appends to the stream meanwhile."""

        for session_id in sorted(session_ids):
            stream = f"session-{session_id}"
            try:
                meta = self.rt.store.stream_meta(stream)
                if meta is None:
                    continue
                record = decode_summary_record(meta)
                running = self.running_count(session_id)
                if record.deleted or record.background == running:
                    continue
                events = aborted.get(session_id) or [self._end_of_latest(session_id)]
                at = max(e.at for e in events)
                record = msgspec.structs.replace(record, background=running, updated_at=max(record.updated_at, at))
                self.rt.store.append(stream, events, self.rt.store.stream_version(stream),
                                     meta=encode_summary_record(record))
            except Exception:  # one session's record must not keep the host from starting
                log.exception("could not rewrite the listing record of session %s", session_id)

    def _end_of_latest(self, session_id: str) -> E.TaskEnded:
        with self._lock:
            tasks = [t for t in self.tasks.values() if t.session_id == session_id]
        return copy_of_latest_end(tasks, now_ms())

    def running_count(self, session_id: str) -> int:
        if not self.tasks:  # the common case, asked by every commit that rewrites a listing record
            return 0
        with self._lock:
            return sum(1 for t in self.tasks.values() if t.session_id == session_id and t.status == "running")

    def running_total(self) -> int:
        with self._lock:
            return sum(1 for t in self.tasks.values() if t.status == "running")

    def listing(self) -> list[BackgroundTask]:
        self.load()
        with self._lock:
            return list(self.tasks.values())

    def get(self, task_id: str) -> BackgroundTask | None:
        self.load()
        with self._lock:
            return self.tasks.get(task_id)

    def output(self, task_id: str, after: int | None) -> tuple[str, int, bool]:
        with self._lock:
            out = self.outputs.get(task_id)
        if out is None:  # a task from before a restart left no output
            return "", 0, bool(after)
        return out.read(after)

    # --- lifecycle ------------------------------------------------------------------------------

    def adopt(self, running: Any, session_id: str, turn_id: str, call_id: str, tool: str,
              display: E.ToolDisplay | None) -> str:
        """Take over a running command from a tool call (called on the worker loop)."""
        [started] = decide_start(Start(session_id=session_id, turn_id=turn_id, call_id=call_id, tool=tool,
                                       display=display), now_ms())
        task_id = started.task_id
        output = _Output()
        output.add(running.tail)
        with self._lock:
            self.outputs[task_id] = output
            self.tasks[task_id] = task_of(started)
        running.redirect(lambda text: self._output(task_id, text))
        with self._lock:  # registered before its first push can reach a client (who may stop it)
            self.actors[task_id] = TaskActor.start(self, started, running)
        return task_id

    def _output(self, task_id: str, text: str) -> None:
        with self._lock:
            out = self.outputs.get(task_id)
            task = self.tasks.get(task_id)
            if out is None or task is None:
                return
            out.add(text)
            lines = [ln for ln in out.text.splitlines() if ln.strip()]
            self.tasks[task_id] = msgspec.structs.replace(task, last_line=lines[-1][-500:] if lines else None,
                                                          last_output_at=now_ms())
            pending = task_id in self._line_pending
            self._line_pending[task_id] = time.monotonic()
        if not pending:  # last-line changes are pushed at most once a second
            loop = self.rt.worker.loop
            loop.call_later(1.0, self._flush_line, task_id)

    def _flush_line(self, task_id: str) -> None:
        with self._lock:
            if self._line_pending.pop(task_id, None) is None:
                return
            task = self.tasks.get(task_id)
        if task is not None and task.status == "running":
            self.changed([task], [])

    def record(self, task: BackgroundTask) -> None:
        with self._lock:
            self.tasks[task.id] = task
            self._line_pending.pop(task.id, None)  # merged into this push
            removed = self._trim(task.session_id)
        self.changed([task], removed)

    def _trim(self, session_id: str) -> list[str]:
        ended = [t for t in self.tasks.values() if t.session_id == session_id and t.status != "running"]
        if len(ended) <= KEEP_ENDED:
            return []
        ended.sort(key=lambda t: (t.ended_at or 0, t.started_at))  # the most recently ended are kept
        removed = [t.id for t in ended[:-KEEP_ENDED]]
        for task_id in removed:
            self.tasks.pop(task_id, None)
            self.outputs.pop(task_id, None)
        return removed

    def ended_quietly(self, session_id: str, ended: E.TaskEnded, then: Reply) -> None:
        """A task ended without a notice (stopped): the session commits a copy of the end, which
        rewrites its listing record with the running count (``SessionSummary.background``) and so
        reaches ``sessions/list`` and the ``sessions/changed`` pushes; its state and timeline
        ignore the event, the model never hears of it. ``then`` (the stop's reply) completes once
        that commit is done, so a listing read after ``background/stop`` answered is current."""

        committed = Reply()
        committed.add_callback(lambda _: then.set(None))
        try:
            self.rt.tell(session_id, Decide(RecordTaskEnd(ended=ended), committed))
        except HostClosed:  # the next start settles the record (``load``)
            log.warning("could not tell session %s that task %s ended", session_id, ended.task_id)
            then.set(None)

    def finished(self, task_id: str) -> None:
        with self._lock:
            self.actors.pop(task_id, None)

    def stop(self, task_id: str, reply: Reply, reason: str = _STOPPED) -> None:
        with self._lock:
            ref = self.actors.get(task_id)
        task = self.get(task_id)
        if task is None:
            reply.fail(NotFound(Text("error.task-not-found", task=task_id)))
            return
        if ref is None or task.status != "running":
            reply.set(None)
            return
        ref.tell(Stop(reply=reply, reason=reason))

    def stop_session(self, session_ids: list[str]) -> list[Reply]:
        with self._lock:
            running = [t.id for t in self.tasks.values() if t.session_id in session_ids and t.status == "running"]
        replies = []
        for task_id in running:
            reply = Reply()
            self.stop(task_id, reply)
            replies.append(reply)
        return replies

    def remove_session(self, session_id: str) -> None:
        with self._lock:
            gone = [t.id for t in self.tasks.values() if t.session_id == session_id and t.status != "running"]
            for task_id in gone:
                self.tasks.pop(task_id, None)
                self.outputs.pop(task_id, None)
        if gone:
            self.changed([], gone)

    # --- pushes ---------------------------------------------------------------------------------

    def watch(self, conn: Any) -> None:
        with self._lock:
            self.watchers[conn] = conn

    def unwatch(self, conn: Any) -> None:
        with self._lock:
            self.watchers.pop(conn, None)

    def changed(self, upserts: list[BackgroundTask], removes: list[str]) -> None:
        with self._lock:
            watchers = list(self.watchers)
        for conn in watchers:
            visible = [t for t in upserts if self.rt.can_see(conn, t.session_id)]
            if visible or removes:
                conn.notify("background/changed", BackgroundChanged(upserts=visible, removes=removes))

    def shutdown(self) -> None:
        for task_id, ref in list(self.actors.items()):
            reply = Reply()
            self.stop(task_id, reply, reason=Text("task.reason.shutdown"))
            try:
                reply.result(5)
                ref.stop(timeout=2)
            except Exception:
                pass


# --- the task actor's messages (a closed set) ---------------------------------------------------


class Stop(msgspec.Struct, frozen=True, kw_only=True):
    """Stop the task (``background/stop``, stopAll, shutdown) for ``reason``; ``reply`` completes
    once its end is recorded and the session's listing has it, at once if it has ended."""

    reply: Reply
    reason: str


class Exited(msgspec.Struct, frozen=True, kw_only=True):
    """The command exited with ``code``, or could not be waited for (``error`` says why)."""

    code: int | None = None
    error: str | None = None


TaskMessage = Stop | Exited


class TaskActor(pykka.ThreadingActor):
    """One running background task: its stream, its end, its stop.

    Decide, persist, publish: its start and its end are decided by the model
    (``actors/tasks/model.py``) and appended before the service pushes them (``background/changed``)
    or the session hears of them. The service's registry holds the task from ``adopt`` on (before
    its ``task.started`` is committed), so that the tool call's own commit counts it running and a
    stop by its id finds it. An end that could not be appended is logged and still published: the
    command did end, and the next start records the task ``aborted`` (its flag is still set).
    """

    use_daemon_thread = True

    def __init__(self, service: TaskService, started: E.TaskStarted, running: Any) -> None:
        super().__init__()
        self.svc = service
        self.started = started
        self.running = running
        self.stream = task_stream(started.task_id)
        self.stopping: Stop | None = None
        self.ended = False

    def on_start(self) -> None:
        self.svc.rt.store.append(self.stream, [self.started], ANY_VERSION, flags={"task-running": True})
        self.svc.changed([self.svc.tasks[self.started.task_id]], [])
        ref = self.actor_ref

        async def watch() -> None:
            try:
                code = await self.running.wait()
            except Exception as e:  # the process could not be waited for: record it failed
                log.exception("background task %s failed", self.started.task_id)
                ref.tell(Exited(error=str(e)))
                return
            ref.tell(Exited(code=code))

        self.svc.rt.worker.call_soon(lambda: asyncio.ensure_future(watch()))

    def on_receive(self, message: Any) -> Any:
        match message:
            case Stop() if not self.ended:
                self.stopping = message
                self.svc.rt.worker.call_soon(lambda: asyncio.ensure_future(self.running.kill()))
            case Stop():
                message.reply.set(None)
            case Exited() if not self.ended:
                self._end(message)
            case Exited():
                pass  # ended already
            case _:
                log.warning("background task %s ignores a message it does not know: %r", self.started.task_id,
                            message)
        return None

    def _end(self, exited: Exited) -> None:
        self.ended = True
        task = self.svc.tasks.get(self.started.task_id) or task_of(self.started)
        stopped = self.stopping.reason if self.stopping is not None else None
        # one end: the registry shows the task running until this records its end
        [end] = decide_end(task, End(exit_code=exited.code, error=exited.error, stopped=stopped), now_ms())
        try:
            self.svc.rt.store.append(self.stream, [end], ANY_VERSION, flags={"task-running": False})
        except Exception:
            log.exception("could not record the end of background task %s", self.started.task_id)
        done = ended(task, end)
        self.svc.record(done)
        if self.stopping is not None:  # a stopped task sends the model no end notice ...
            self.svc.ended_quietly(self.started.session_id, end, self.stopping.reply)  # ... but its listing changes
        else:  # the notice's commit rewrites the session's listing record
            self.svc.rt.task_notice(done)
        self.svc.finished(self.started.task_id)
        self.stop()
