"""SessionActor: the thin pykka shell around a session's pure model (``state``: the fold,
``decide``: the decisions).

One mailbox per session. What it accepts is closed: the message classes of ``messages``, and for callers
outside this package two envelopes with frozen values, ``Decide(commands.Command)`` and
``Ask(commands.Query)``, matched in ``decide.decide_command`` and ``queries.answer``; no callable
travels in a message. A busy session still answers cancel, status and subscribe at once: model
calls and tools never run on this thread, their outcomes come back as messages.

The contract of a change (decide, persist, publish):

1. **decide**: the handler's events come from a pure decision over the state (``decide``);
   a refusal raises before anything changes.
2. **evolve in place**: the shell folds them into its working state and runs the default loop
   (``drive``) on it, adding what follows (a turn start, a model step answered at once); this is
   allowed for speed because nothing outside the actor can observe the working state until 3.
3. **persist**: everything is appended as one commit with the expected version. If the append (or
   anything before it) fails, the state is rebuilt from the log (``_reload``): no trace of the
   failed commit is left in the state, the listing record, a push or a reply, and the request
   fails with the store's error (tests/actors/session/test_commit_contract.py).
4. **publish**: only after the commit do pushes go to subscribers, waiters and loop watchers hear
   of it, the reply completes and effects start (``_committed``). A reply goes out only after its
   commit is durable.

On the pooled runtime the hot commits (an input, a model or tool outcome) do not hold a pool
thread while the group commits: the actor suspends, its mailbox waits, and step 4 runs when the
store calls back (Akka Persistence's ``persist``).

The shell is this module (lifecycle, the commit, the handlers) and four parts mixed into it:
``inputs`` (creation and queued inputs, with idempotency and the quota), ``effects`` (model calls
and tool runs, launched after their commit), ``publish`` (pushes, the listing record and the
commit listeners, after the commit), and ``purge`` (its steps of a delete).

Supervision (pykka has none): an exception in a handler fails that request with a clear error,
then the actor rebuilds its state from the store and recovers like after a crash; three failures
within a minute park the session with the reason recorded.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING, Any

import pykka

from sessionloop.actors import events as E
from sessionloop.actors.approvals.model import approval_stream as _approval_stream
from sessionloop.actors.errors import ActorError, CompactionFailed, NotFound, compact_error
from sessionloop.actors.session.decide import (
    AgentConfig,
    DecideContext,
    decide_command,
    decide_compaction_cancelled,
    decide_compaction_interrupted,
    decide_model_done,
    decide_model_retried,
    decide_park,
    decide_stop,
    decide_tool_done,
    ensure_usable,
    repairs_after_restart,
)
from sessionloop.actors.session.drive import drive
from sessionloop.actors.session.effects import Deltas, SessionEffects
from sessionloop.actors.session.history import bounded_fold, whole_fold
from sessionloop.actors.session.inputs import SessionInputs
from sessionloop.actors.session.messages import (
    Cancel,
    Decide,
    ModelDone,
    ModelRetried,
    Msg,
    Passivate,
    Snapshot,
    Subscribe,
    ToolDone,
    now_ms,
)
from sessionloop.actors.session.publish import SessionPublisher
from sessionloop.actors.session.purge import SessionPurge
from sessionloop.actors.session.queries import CallerFacts
from sessionloop.actors.session.state import (
    EncodedHistory,
    SessionState,
    bound,
    decode_state,
    encode_snapshot,
    evolve,
    new_state,
)
from sessionloop.actors.session.stream_sink import StreamSink
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.system.pool import PooledActor
from sessionloop.actors.webhooks.events import outbox_mark
from sessionloop.eventstore import (
    IdempotencyClaim,
    SessionloopError,
    StorageUnavailable,
    StoreError,
    StreamDeleted,
)
from sessionloop.protocol.errors import RpcError

if TYPE_CHECKING:
    from sessionloop.actors.session.compaction import Flight
    from sessionloop.actors.system.runtime import Runtime

log = logging.getLogger("sessionloop.session")

_TURN_END = (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)
_TURN_END_TYPES = frozenset(_TURN_END)
#: a model call's streamed items are in the projection (or gone) once one of these is committed
_STREAM_END_TYPES = _TURN_END_TYPES | {E.LlmCompleted, E.LlmFailed}
#: the events a commit acts on after it is durable (effects to start, turns to report)
_EFFECT_TYPES = _TURN_END_TYPES | {E.LlmStarted, E.ToolStarted, E.ToolApprovalRequested, E.ToolApprovalSettled}
#: model answers a commit takes in place (``_drive``) before the next one goes through the worker
#: loop: a turn of instant answers (unlimited ``maxSteps``, a model that keeps calling a tool
#: that is refused at once) then still lets the mailbox in, so turn/abort always gets through
MAX_INLINE_ANSWERS = 32




# --- the actor --------------------------------------------------------------------------------


class SessionBehaviour(SessionInputs, SessionPurge, SessionEffects, SessionPublisher):
    """The session actor's behaviour, independent of the pykka runtime that runs it: a thread per
    actor (:class:`SessionActor`) or a shared pool (:class:`PooledSessionActor`)."""

    actor_ref: pykka.ActorRef[Any]

    if TYPE_CHECKING:  # given by the pykka actor class the behaviour is mixed into
        def stop(self) -> None: ...

    def __init__(self, runtime: Runtime, session_id: str) -> None:
        super().__init__()
        self.rt = runtime
        self.sid = session_id
        self.stream = f"session-{session_id}"
        self.state: SessionState = new_state(session_id)
        self.channel = runtime.channel(session_id)
        self.broken: BaseException | None = None
        self._model_task: Any = None
        self._sink: StreamSink | None = None  # what the running model call streams to
        self._tool_tasks: dict[str, Any] = {}
        self._failures: list[float] = []
        self._snapshot_version = 0
        self._snapshot_retry_at = 0  # after a refused snapshot: the version to try again at
        self._history = EncodedHistory()  # the history's chunks the store holds as snapshot parts
        self._active: bool | None = None
        self._workspace: Any = None
        self._unfinished = 0
        self._config: tuple[tuple[int, int], AgentConfig] | None = None
        self.items: Any = None  # ItemsProjection, built on the first subscriber
        self._sent_queue: Any = []  # the queue entries last pushed
        self.last_record: Any = None  # the listing record written by the latest commit
        self.record_dirty = False
        self.deleting = False  # frozen for a delete: no new input, no new turn, until the purge
        self.compaction: Flight | None = None  # a compaction under way (actors.session.compaction)

    # --- lifecycle ----------------------------------------------------------------------------

    def on_start(self) -> None:
        try:
            self._load()
            self._recover()
        except Exception as e:  # the directory answers every message with this error
            log.exception("session %s failed to activate", self.sid)
            self.broken = e

    def on_receive(self, message: Any) -> Any:
        if self.broken is not None:
            if isinstance(message, Msg) and message.reply is not None:
                message.reply.fail(ActorError(f"session {self.sid} cannot be activated: {self.broken}"))
            return None
        self._handle(message)
        return None

    def _handle(self, message: Any) -> None:
        self._guarded(message, lambda: message.run(self))

    def _guarded(self, message: Any, step: Any) -> None:
        """Run ``step`` (a message's handler or the rest of it after a commit) under supervision."""
        try:
            step()
        except (SessionloopError, RpcError) as e:  # RpcError: a gateway step's answer for the client
            # A refused command (the state is untouched) or a store failure (``_commit`` has
            # reloaded the state): the request fails with the error; an internal message
            # (a model or tool outcome) is retried, so a full disk does not lose a turn.
            if message.reply is not None:
                if isinstance(e, StorageUnavailable):  # the client hears storage-unavailable; the log says where
                    log.warning("session %s: %s refused, the event store is unavailable (outcome %s): %s",
                                self.sid, type(message).__name__, e.outcome, e)
                message.reply.fail(e)
            elif isinstance(e, StoreError) and not isinstance(e, StreamDeleted) and isinstance(message, Msg):
                self.rt.retry_later(self.actor_ref, message, e)
        except Exception as e:
            self._supervise(message, e)

    def on_stop(self) -> None:
        self._cancel_tasks()
        if self.compaction is not None:
            self.compaction.abandon(ActorError(f"session {self.sid} stopped before its compaction finished"))
            self.compaction = None
        app = self._app_id()
        if app is not None and self._unfinished:
            self.rt.app_unfinished_add(app, -self._unfinished)
            self._unfinished = 0

    def _load(self) -> None:
        store = self.rt.store
        snap = store.load_snapshot(self.stream)
        state = decode_state(snap.state, snap.parts) if snap is not None else None
        if state is not None and snap is not None and snap.parts:  # the parts the store holds are the history's chunks
            self._history.adopt(state.messages, len(snap.parts))
        current = state is not None and state.bounded  # a format-2 snapshot is replaced by the next one
        if state is None:
            state = new_state(self.sid, bounded=True)
        elif not state.bounded:
            bound(state)
        rewound = False
        for recorded in store.read_stream(self.stream, state.version + 1):
            evolve(state, recorded.event)
            rewound = rewound or type(recorded.event) is E.TurnRewound
        if rewound:  # a rewind may reach turns a bounded state holds no record of
            state = bounded_fold(store, self.sid)
        self.state = state
        self._snapshot_version = (snap.version if snap is not None and current and state.version >= snap.version
                                  else 0)
        self._active = bool(state.current_turn or state.queue)
        # subscribers still attached (a reload after a failed commit) need the projection of what is
        # stored now, so the next commit's pushes reach them; built lazily it would already hold that
        # commit's events and push nothing of them
        self.items = self.rt.build_items(self.stream) if self.channel.has_subscribers else None
        self._account_unfinished()
        self.rt.results.expect([q.turn_id for q in state.queue] + ([state.current_turn] if state.current_turn else []))

    def _account_unfinished(self) -> None:
        """Keep the host's count of each app's unfinished turns (an app may have at most 200 unfinished turns)."""
        app = self._app_id()
        if app is None:
            return
        now = self.state.unfinished_turns()
        if now != self._unfinished:
            self.rt.app_unfinished_add(app, now - self._unfinished)
            self._unfinished = now

    def _recover(self) -> None:
        """Reconcile after activation: close what a crash interrupted, then let the loop go on."""
        if self.state.created is None:
            return
        repairs = repairs_after_restart(self.state, now_ms(), self._recorded_answers(), self._carried_approvals())
        if repairs or self.state.queue or self.state.current_turn:
            self.rt.faults.hit("recovery")
            self._commit(repairs)

    def _carried_approvals(self) -> set[str]:
        """This session's open approvals that a takeover carried over (still pending here)."""
        return {rec.approval_id for call_id in self.state.batch
                if (rec := self.state.tool_calls.get(call_id)) is not None and rec.approval_id is not None
                and rec.settlement is None and self.rt.approvals.is_open(rec.approval_id)}

    def _recorded_answers(self) -> dict[str, E.Settlement]:
        """The settlements the approval streams recorded for this session's open approvals (an
        answer committed just before a crash, before the session heard of it). Read once, at
        activation, like the session's own events."""

        out: dict[str, E.Settlement] = {}
        for call_id in self.state.batch:
            rec = self.state.tool_calls.get(call_id)
            if rec is None or rec.approval_id is None or rec.settlement is not None:
                continue
            for recorded in self.rt.store.read_stream(_approval_stream(self.sid, rec.approval_id)):
                if isinstance(recorded.event, E.ApprovalSettled):
                    out[rec.approval_id] = recorded.event.settlement
        return out

    def _supervise(self, message: Any, error: Exception) -> None:
        log.exception("session %s failed handling %s", self.sid, type(message).__name__)
        if isinstance(message, Msg) and message.reply is not None:
            message.reply.fail(ActorError(
                f"session {self.sid} failed while handling {type(message).__name__}: {error}; "
                "it was reloaded from its events"))
        now = time.monotonic()
        self._failures = [t for t in self._failures if now - t < 60] + [now]
        self._cancel_tasks()
        try:
            self._load()
            if len(self._failures) >= self.rt.options.park_after_failures:
                reason = f"{len(self._failures)} failures within a minute; last: {type(error).__name__}: {error}"
                self._commit(decide_park(reason, now_ms()), run_drive=False)
                self.rt.results_fail_pending(self.state, "parked")
            else:
                self._recover()
        except Exception:
            log.exception("session %s could not recover; it stays stopped until reactivated", self.sid)
            self.broken = error
            self.rt.directory.forget(self.sid, self.actor_ref)
            self.stop()

    # --- commit, publish, effects ---------------------------------------------------------------

    def config(self) -> AgentConfig:
        """The effective agent options, cached until the host's or this session's settings change."""
        key = (self.rt.config_generation, self.state.settings_rev)
        if self._config is None or self._config[0] != key:
            self._config = (key, self.rt.agent_config(self.state))
        return self._config[1]

    def workspace(self) -> Any:
        if self._workspace is None:
            self._workspace = self.rt.workspace(self.state)
        return self._workspace

    def _commit(self, events: list[E.Event], *, claim: IdempotencyClaim | None = None,
                run_drive: bool = True, then: Any = None) -> tuple[Any, list[E.Event]]:
        """Apply ``events`` and what follows from them, append all as one commit, then publish.

        The state is updated before the append (``drive`` needs the evolved state); if the
        append fails the state is reloaded from the store, so nothing unpersisted survives.
        A model step the provider can answer at once (the mock with nothing to wait for) is
        taken into the same commit: a plain turn is then one commit (a commit per step
        or per turn, never per delta); its deltas still stream, after the commit (``_publish``).
        ``then(result)`` answers the request once the append committed
        (``None``: nothing to commit), see ``_committed``.
        """
        pending = self._prepare(events, run_drive)
        if pending is None:
            if then is not None:
                then(None)
            return None, []
        try:
            result = self.rt.store.append(self.stream, pending.events, pending.version,
                                          **self._append_options(pending, claim))
        except BaseException:
            self._reload()
            raise
        return self._committed(pending, result, then)

    def _commit_then(self, message: Msg, events: list[E.Event], then: Any, *,
                     claim: IdempotencyClaim | None = None) -> None:
        """``_commit``, then ``then(result)``; on the pooled runtime the pool thread is not held
        while the group commits: the actor suspends (its mailbox waits, other sessions run) and
        resumes with the outcome, so a few threads keep many commits in flight. A ``nosync`` store
        that no other process writes commits a lone append on this thread before ``append_async``
        returns (``groupcommit``'s ``inline_async``): ``done`` then runs here and the resume is
        taken before the next message, with no hand-off."""
        if not isinstance(self, PooledActor):
            self._commit(events, claim=claim, then=then)
            return
        pending = self._prepare(events, True)
        if pending is None:
            then(None)
            return
        resume = self._resume

        def done(result: Any, error: BaseException | None) -> None:  # on the thread that led the group
            resume(lambda: self._guarded(message, lambda: self._resumed(pending, result, error, then)))

        self._suspend()
        try:
            self.rt.store.append_async(self.stream, pending.events, pending.version, done,
                                       **self._append_options(pending, claim))
        except BaseException:
            self._resume(_ignore)
            self._reload()
            raise

    def _append_options(self, pending: _Pending, claim: IdempotencyClaim | None) -> dict[str, Any]:
        """What goes into the commit's transaction beside the events (the same for both paths)."""
        app = self._app_id()
        return {"idempotency": claim, "feed": app, "meta": self._meta(pending.events), "flags": self._flags(),
                "outbox": None if app is None else outbox_mark(self.rt.apps.find(app), pending.events)}

    def _resumed(self, pending: _Pending, result: Any, error: BaseException | None, then: Any) -> None:
        if error is not None:
            self._reload()
            raise error
        self._committed(pending, result, then)

    def _prepare(self, events: list[E.Event], run_drive: bool) -> _Pending | None:
        state = self.state
        version = state.version
        if self.deleting:  # frozen for a delete (``on_freeze``): nothing may start a turn
            if any(type(e) is E.InputAccepted for e in events):
                raise NotFound(Text("error.session-deleting", session=self.sid))
            run_drive = False
        flight = self.compaction
        if flight is not None and not flight.auto:  # a command that moves the history ends it, failed
            events = decide_compaction_interrupted(events, now_ms()) + list(events)
        try:
            for event in events:
                evolve(state, event)
            all_events = list(events)
            compaction = None
            inline: dict[str, Deltas] = {}
            if run_drive:
                compaction = self._drive(all_events, inline, now_ms())
            if not all_events:
                return None
            self.rt.faults.hit("before-commit")
        except BaseException:
            self._reload()
            raise
        return _Pending(all_events, version, inline, compaction)

    def _reload(self) -> None:
        self.record_dirty = False
        self._load()

    def _committed(self, pending: _Pending, result: Any, then: Any = None) -> tuple[Any, list[E.Event]]:
        """After the append committed: publish and start effects, then ``then(result)``. If
        something after the commit fails (a bug in a projection, an effect), the request is still
        answered with its result before supervision takes over: its events are in the log, and a
        client told "failed" would send the input again and get two turns."""
        if result.duplicate:
            self._load()
            if then is not None:
                then(result)
            return result, []
        try:
            self.rt.faults.hit("after-commit")
            self._after_commit(pending.events, pending.inline, pending.compaction, result)
        except BaseException:
            if then is not None:
                then(result)
            raise
        if then is not None:
            then(result)
        return result, pending.events

    def _drive(self, out: list[E.Event], inline: dict[str, Deltas], now: int) -> str | None:
        state, cfg = self.state, self.config()
        check = self.rt.tool_checker(state, self.workspace, cfg)
        apply = lambda e: evolve(state, e)  # noqa: E731
        follow = drive(state, cfg, check, now, apply)
        out.extend(follow.events)
        for _ in range(MAX_INLINE_ANSWERS):
            if state.pending_llm is None or follow.needs_compaction is not None:
                break
            answered = self._answer_now(cfg, now)
            if answered is None:
                break
            step_id, events, deltas = answered
            for event in events:
                evolve(state, event)
            out.extend(events)
            inline[step_id] = deltas
            follow = drive(state, cfg, check, now, apply)
            out.extend(follow.events)
        return follow.needs_compaction

    def _app_id(self) -> str | None:
        created = self.state.created
        return created.app_id if created is not None else None

    def _after_commit(self, events: list[E.Event], inline: dict[str, Deltas], compaction: str | None,
                      result: Any) -> None:
        if any(type(e) is E.TurnRewound for e in events):  # see ``_load``
            self.state = bounded_fold(self.rt.store, self.sid)
        state = self.state
        if (state.version - self._snapshot_version >= self.rt.options.snapshot_every
                and state.version >= self._snapshot_retry_at):
            self._save_snapshot()
        if self.items is not None or self.channel.has_subscribers:
            self._publish(events, inline)
        channel = self.channel
        if (channel.streaming or channel.cards or self._sink is not None) and \
                any(type(e) in _STREAM_END_TYPES for e in events):
            self._end_stream(events)
        accepted = [e.turn_id for e in events if type(e) is E.InputAccepted]
        if accepted:
            self.rt.results.expect(accepted)
        for event in events:
            t = type(event)
            if t not in _EFFECT_TYPES:  # most events start nothing
                continue
            if t in _TURN_END_TYPES:
                self.rt.turn_ended(state, event)
            elif type(event) is E.LlmStarted:
                if event.step_id not in inline:
                    self._launch_model(event.turn_id, event.step_id)
            elif type(event) is E.ToolStarted:
                self._launch_tool(event.turn_id, event.call_id, event.tool, event.args)
            elif type(event) is E.ToolApprovalRequested:
                self.rt.approvals.open(state, event)
            elif type(event) is E.ToolApprovalSettled and event.settlement.source in ("turn-ended", "shutdown"):
                self.rt.approvals.cancel(event.approval_id, event.settlement.source)
        self._account_unfinished()
        self._tell_listeners(events, result, self._loop_deltas_in_place(events, inline) if inline else None)
        if self.compaction is not None:
            self._end_compaction(events)
        if compaction is not None:
            self.rt.compaction.start_auto(self, compaction)

    def _end_compaction(self, events: list[E.Event]) -> None:
        """After a commit: a manual compaction this commit ended (interrupted or cancelled, the
        failure recorded in it) stops and its request fails with the reason; an automatic one
        stops when its turn ended first. Its summary, if it still comes, is then dropped."""
        flight = self.compaction
        assert flight is not None
        if flight.auto:
            if self.state.current_turn != flight.turn_id:
                self.compaction = None
                flight.abandon(None)
            return
        for event in events:
            if type(event) is E.ContextCompactFailed and not event.auto:
                self.compaction = None
                flight.abandon(CompactionFailed(compact_error(event)))
                return

    def _save_snapshot(self) -> None:
        """Save the state as a snapshot. Runs after a commit, before its request is answered: a
        snapshot only makes activation faster, so one the store refuses (a full disk) is logged
        and tried again later, and never turns the committed request into a failure (the input
        is in the log: its client must get its receipt, not "write failed")."""
        try:
            self.rt.faults.hit("snapshot")
            snap = encode_snapshot(self.state, self._history)
            self.rt.store.save_snapshot(self.stream, self.state.version, snap.state, snap.part_count, snap.parts)
            self._history.stored(self.state.messages, snap.part_count)
        except StoreError as e:
            self._snapshot_retry_at = self.state.version + max(1, self.rt.options.snapshot_every // 4)
            log.warning("session %s: the snapshot at version %d was not saved (%s); the events are committed, "
                        "it is tried again %d events later", self.sid, self.state.version, e,
                        self._snapshot_retry_at - self.state.version)
            return
        self._snapshot_version = self.state.version

    # --- handlers -------------------------------------------------------------------------------

    def on_cancel(self, msg: Cancel) -> None:
        now = now_ms()
        events = decide_stop(self.state, msg.turn_id, msg.reason, now, drop_queue=msg.drop_queue)
        flight = self.compaction
        if flight is not None and not flight.auto and self.state.current_turn is None:
            events += decide_compaction_cancelled(msg.reason, now)  # cancel() also stops a manual compaction
        if events:
            self._cancel_tasks()
            self._commit(events)
        assert msg.reply is not None
        msg.reply.set(bool(events))

    def on_model_done(self, msg: ModelDone) -> None:
        events = decide_model_done(self.state, msg.step_id, msg.response, msg.error, msg.duration_ms, now_ms())
        if events:
            self._model_task = None
            self._commit_then(msg, events, _ignore)

    def on_model_retried(self, msg: ModelRetried) -> None:
        """Record the retry as a fact of the step (nothing else changes: the call goes on)."""
        events = decide_model_retried(self.state, msg.step_id, msg.notice, msg.next_item_id, now_ms())
        if events:
            self._commit(events, run_drive=False)

    def on_tool_done(self, msg: ToolDone) -> None:
        self._tool_tasks.pop(msg.call_id, None)
        events = decide_tool_done(self.state, msg.turn_id, msg.call_id, msg.result, msg.duration_ms, now_ms())
        if events:
            self._commit_then(msg, events, _ignore)

    def on_decide(self, msg: Decide) -> None:
        command = msg.command
        events = decide_command(self.state, command, DecideContext(now_ms(), self.rt.settings))
        assert msg.reply is not None
        if not events:
            msg.reply.set(None)
            return
        self._commit(events, run_drive=command.drive, then=msg.reply.set)

    def on_subscribe(self, msg: Subscribe) -> None:
        assert msg.reply is not None
        ensure_usable(self.state)
        items_view = self.projection()
        channel = self.channel
        with channel.lock:  # no push of this session before the snapshot's reply
            items, before = items_view.snapshot_items()
            if channel.streaming:  # a reply streaming now: the text it has produced so far
                have = {it.item_id for it in items}
                items += [it for it in channel.streamed_items() if it.item_id not in have]
            msg.reply.set(Snapshot(epoch=channel.epoch, seq=channel.seq, items=items, before=before))
            channel.subscribers[msg.subscriber] = msg.subscriber
        self.push_usage_estimate()  # a session without usage yet gets it pushed after the snapshot

    def whole_state(self) -> SessionState:
        """The whole fold of the committed events, read from the log (``history``): the live
        state is bounded. Called between commits, so the log holds every event the state has."""
        return whole_fold(self.rt.store, self.sid)

    def projection(self) -> Any:
        """The timeline's items (``views.items.ItemsProjection``), built from the log on first use."""
        if self.items is None:
            self.items = self.rt.build_items(self.stream)
        return self.items

    def caller_facts(self) -> CallerFacts:
        """What a session made with ``context='caller'`` takes from this one: its workspace
        directory (also when it has no explicit cwd), its effective model and permission policy."""
        created = ensure_usable(self.state)
        try:
            cwd = str(self.workspace().root)
        except ValueError:  # its cwd is not a directory: its own tools fail the same way
            cwd = created.cwd
        cfg = self.config()
        return CallerFacts(created=created, cwd=cwd, model=cfg.model, permission_mode=cfg.permission_mode)

    def on_passivate(self, msg: Passivate) -> None:
        state = self.state
        if (state.current_turn or state.queue or self.channel.has_subscribers or self._tool_tasks
                or self.compaction is not None):
            return
        if state.version > self._snapshot_version and state.created is not None:
            self._save_snapshot()
        if self.rt.directory.retire(self.sid, self.actor_ref, msg.routed):
            self.stop()


class SessionActor(SessionBehaviour, pykka.ThreadingActor):
    use_daemon_thread = True

    @staticmethod
    def _create_actor_inbox() -> Any:
        # pykka's documented override point: the C ``SimpleQueue`` has the put/get/empty pykka
        # uses and hands a message to a sleeping actor thread several times cheaper than the
        # Condition-based ``queue.Queue`` (a few messages per turn, thousands of turns/s).
        return queue.SimpleQueue()


class PooledSessionActor(SessionBehaviour, PooledActor):
    """The same session actor on a shared pool of threads (``HostOptions.dispatcher_threads``)."""


class _Pending:
    """A commit under way: the events decided (already applied to the state) and what to do after."""

    __slots__ = ("events", "version", "inline", "compaction")

    def __init__(self, events: list[E.Event], version: int, inline: dict[str, Deltas], compaction: str | None) -> None:
        self.events = events
        self.version = version  # the stream's version the append expects
        self.inline = inline  # model steps answered inside this commit (no model call to start): their deltas
        self.compaction = compaction


def _ignore(*_: Any) -> None:
    return None


__all__ = ["PooledSessionActor", "SessionActor", "SessionBehaviour"]
