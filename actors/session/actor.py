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
   fails with the store's error (tests/actors/test_commit_contract.py).
4. **publish**: only after the commit do pushes go to subscribers, waiters and loop watchers hear
   of it, the reply completes and effects start (``_committed``). A reply goes out only after its
   commit is durable.

On the pooled runtime the hot commits (an input, a model or tool outcome) do not hold a pool
thread while the group commits: the actor suspends, its mailbox waits, and step 4 runs when the
store calls back (Akka Persistence's ``persist``).

Supervision (pykka has none): an exception in a handler fails that request with a clear error,
then the actor rebuilds its state from the store and recovers like after a crash; three failures
within a minute park the session with the reason recorded.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from typing import TYPE_CHECKING, Any

import msgspec
import pykka

from sessionloop.actors import events as E
from sessionloop.actors.approvals.model import approval_stream as _approval_stream
from sessionloop.actors.errors import ActorError, CompactionFailed, NotFound, compact_error
from sessionloop.actors.model.attachments import has_attachments
from sessionloop.actors.model.attachments import resolve as resolve_attachments
from sessionloop.actors.model.base import RetryNotice
from sessionloop.actors.session.commands import Quota
from sessionloop.actors.session.context import estimated_context_tokens, model_view
from sessionloop.actors.session.decide import (
    AgentConfig,
    DecideContext,
    decide_command,
    decide_compaction_cancelled,
    decide_compaction_interrupted,
    decide_create,
    decide_delete,
    decide_input,
    decide_model_done,
    decide_model_retried,
    decide_park,
    decide_stop,
    decide_stop_for_delete,
    decide_tool_done,
    ensure_usable,
    repairs_after_restart,
)
from sessionloop.actors.session.drive import drive, system_messages
from sessionloop.actors.session.messages import (
    Cancel,
    Create,
    Created,
    Decide,
    Freeze,
    ModelDone,
    ModelRetried,
    Msg,
    Passivate,
    Purge,
    Receipt,
    Send,
    Snapshot,
    Subscribe,
    ToolDone,
    now_ms,
)
from sessionloop.actors.session.queries import CallerFacts
from sessionloop.actors.session.state import SessionState, decode_state, encode_state, evolve, new_state
from sessionloop.actors.session.stream_sink import StreamSink, close_cards
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.system.pool import PooledActor
from sessionloop.actors.system.ports import Commit
from sessionloop.actors.system.pubsub import LoopEvent, TurnOutcome
from sessionloop.actors.tools.caller import CURRENT_CALL, CallerContext
from sessionloop.actors.views.summary import encode_summary_record, rewrites_listing, summary_record, tombstone_record
from sessionloop.eventstore import (
    IdempotencyClaim,
    SessionloopError,
    StorageUnavailable,
    StoreError,
    StreamDeleted,
)
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.schemas_types import AgentMessageItem, ReasoningItem

if TYPE_CHECKING:
    from sessionloop.actors.session.compaction import Flight
    from sessionloop.actors.system.runtime import Runtime

log = logging.getLogger("sessionloop.session")

_SINGLETONS = frozenset({"queue", "plan", "usage"})  # items a push replaces whole, never appended to
_TURN_END = (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)
_TURN_END_TYPES = frozenset(_TURN_END)
#: a model call's streamed items are in the projection (or gone) once one of these is committed
_STREAM_END_TYPES = _TURN_END_TYPES | {E.LlmCompleted, E.LlmFailed}
#: a model step's outcome: where the live frames of an answer taken in place go out (``_publish``)
_STEP_END = (E.LlmCompleted, E.LlmFailed)
#: the deltas a model call reported, ``(kind, text)`` in order
Deltas = list[tuple[str, str]]
#: the events a commit acts on after it is durable (effects to start, turns to report)
_EFFECT_TYPES = _TURN_END_TYPES | {E.LlmStarted, E.ToolStarted, E.ToolApprovalRequested, E.ToolApprovalSettled}
#: the categories of a session's streams (``session-S``, ``approval-S.*``, ``task-S.*``): a purge
#: takes them all (``actors/session/deletion.py``)
OWNED_CATEGORIES = ("session", "approval", "task")
#: set with a session's purge, cleared once its files are deleted too (a restart finishes them)
FILES_PENDING = "files-pending"
#: model answers a commit takes in place (``_drive``) before the next one goes through the worker
#: loop: a turn of instant answers (unlimited ``maxSteps``, a model that keeps calling a tool
#: that is refused at once) then still lets the mailbox in, so turn/abort always gets through
MAX_INLINE_ANSWERS = 32


_created_enc = msgspec.msgpack.Encoder()
_created_dec = msgspec.msgpack.Decoder(Created)
_receipt_enc = msgspec.msgpack.Encoder()
_receipt_dec = msgspec.msgpack.Decoder(Receipt)


# --- the actor --------------------------------------------------------------------------------


class SessionBehaviour:
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
        state = decode_state(snap.state) if snap is not None else None
        if state is None:
            state = new_state(self.sid)
        for recorded in store.read_stream(self.stream, state.version + 1):
            evolve(state, recorded.event)
        self.state = state
        self._snapshot_version = snap.version if snap is not None and state.version >= snap.version else 0
        self._active = bool(state.current_turn or state.queue)
        # subscribers still attached (a reload after a failed commit) need the projection of what is
        # stored now, so the next commit's pushes reach them; built lazily it would already hold that
        # commit's events and push nothing of them
        self.items = self.rt.build_items(self) if self.channel.has_subscribers else None
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
        repairs = repairs_after_restart(self.state, now_ms(), self._recorded_answers())
        if repairs or self.state.queue or self.state.current_turn:
            self.rt.faults.hit("recovery")
            self._commit(repairs)

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
        resumes with the outcome, so a few threads keep many commits in flight."""
        if not isinstance(self, PooledActor):
            self._commit(events, claim=claim, then=then)
            return
        pending = self._prepare(events, True)
        if pending is None:
            then(None)
            return
        resume = self._resume

        def done(result: Any, error: BaseException | None) -> None:  # on the store's writing thread
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
        return {"idempotency": claim, "feed": self._app_id(), "meta": self._meta(pending.events),
                "flags": self._flags()}

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

    def _answer_now(self, cfg: AgentConfig, now: int) -> tuple[str, list[E.Event], Deltas] | None:
        """The events of the pending model step when the provider answers it at once, with the
        deltas it streamed; None when the call must go to the worker loop.

        An answer taken in place streams like any other: its deltas are kept here and
        go out after the commit that makes the step exist (``_publish``: persist, then publish), as the same
        frames a subscriber and a loop watcher get for an answer streamed over time."""
        provider = self.rt.provider_for(self.state)
        answer_now = getattr(provider, "answer_now", None)
        if answer_now is None:
            return None
        state = self.state
        step_id, turn_id = state.pending_llm, state.current_turn
        assert step_id is not None and turn_id is not None
        deltas: Deltas = []
        keep = deltas.append
        started = time.perf_counter()
        try:
            request = self._model_request(cfg)
            if has_attachments(request.messages):  # files are read off the actor thread: not in place
                return None
            r = answer_now(request, lambda kind, text: keep((kind, text)))
        except SessionloopError as e:  # what streamed before the failure (reasoning) still goes out
            return step_id, decide_model_done(state, step_id, None, str(e), _ms_since(started), now), deltas
        if r is None:
            return None
        return step_id, decide_model_done(state, step_id, r, None, _ms_since(started), now), deltas

    def _model_request(self, cfg: AgentConfig) -> Any:
        state = self.state
        if cfg.context_chars is None and not state.summaries:
            messages = system_messages(cfg) + state.messages
        else:
            messages, _ = model_view(system_messages(cfg) + state.messages, cfg.context_chars)
        return self.rt.model_request(cfg, messages)

    def _delta_sink(self, step_id: str) -> StreamSink:
        """The ``on_delta`` of a model call: live items, generating cards, and the restart of
        what an attempt showed when the provider retries (``actors/session/stream_sink.py``)."""
        ref = self.actor_ref

        def on_retry(notice: RetryNotice, next_item_id: str) -> None:
            ref.tell(ModelRetried(step_id, notice, next_item_id))

        return StreamSink(channel=self.channel, session_id=self.sid, step_id=step_id, turn_id=self.state.current_turn,
                          delta=self.rt.delta_payload, on_retry=on_retry, now=now_ms, fault=self.rt.faults.hit,
                          loop_delta=self._loop_delta())

    def _loop_delta(self) -> Any:
        """Emits a bot's live ``assistant.delta`` with ``data``; None outside apps."""
        app, watchers = self._app_id(), self.rt.loop_watchers
        if app is None:
            return None
        sid, turn_id = self.sid, self.state.current_turn

        def emit(data: dict[str, Any]) -> None:
            if watchers.any(app):
                watchers.emit(app, LoopEvent(cursor=0, session_id=sid, type="assistant.delta", at=now_ms(),
                                             turn_id=turn_id, data=data))

        return emit

    def push_usage_estimate(self) -> None:
        """When a snapshot has no usage yet, the server has it estimated and pushes it after the
        snapshot (docs/protocol.md, subscribing). Called right
        after a subscriber got its snapshot: a session with history that no model call has
        reported usage on (forked, imported, every call failed) gets the usage item its next
        model call would have, estimated as the mock counts (characters / 4), pushed to its
        subscribers (all of them: none has usage, and each sees every seq, gapless). Derived from
        committed state and not kept in ``items`` (a fold of the log, which ``replay --verify``
        rebuilds), nor written (a read writes nothing): every snapshot without usage is followed
        by one."""
        items, state = self.items, self.state
        if items is None or items.usage_item() is not None or not state.messages:
            return
        try:
            cfg = self.config()
            tokens = estimated_context_tokens(system_messages(cfg) + state.messages, cfg.context_chars)
            self.channel.publish("item/completed", items.estimated_usage(now_ms(), tokens))
        except Exception:  # an estimate is a courtesy: the subscription (answered already) stands
            log.exception("session %s: the usage estimate after a snapshot failed", self.sid)

    def _app_id(self) -> str | None:
        created = self.state.created
        return created.app_id if created is not None else None

    def _meta(self, events: list[E.Event]) -> bytes | None:
        """The listing record, rewritten by commits that change what a listing shows
        (:func:`rewrites_listing`, the rule ``replay --verify`` checks records by)."""
        if not rewrites_listing(events):
            return None
        self.last_record = summary_record(self.state, self._awaiting_approval(), self.rt.background(self.sid))
        self.record_dirty = True
        return encode_summary_record(self.last_record)

    def _awaiting_approval(self) -> bool:
        """The listing's attention flag: an approval was pushed and is not settled yet."""
        state = self.state
        return any((rec := state.tool_calls.get(c)) is not None and rec.approval_id is not None
                   and rec.settlement is None for c in state.batch)

    def _flags(self) -> dict[str, bool] | None:
        active = bool(self.state.current_turn or self.state.queue)
        if active == self._active:
            return None
        self._active = active
        return {"active": active}

    def _after_commit(self, events: list[E.Event], inline: dict[str, Deltas], compaction: str | None,
                      result: Any) -> None:
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
                self.rt.approvals.open(self, event)
            elif type(event) is E.ToolApprovalSettled and event.settlement.source in ("turn-ended", "shutdown"):
                self.rt.approvals.cancel(event.approval_id, event.settlement.source)
        self._account_unfinished()
        self._tell_listeners(events, result, self._loop_deltas_in_place(events, inline) if inline else None)
        if self.compaction is not None:
            self._end_compaction(events)
        if compaction is not None:
            self.rt.compaction.start_auto(self, compaction)

    def _tell_listeners(self, events: list[E.Event], result: Any,
                        loop_deltas: dict[str, list[dict[str, Any]]] | None) -> None:
        """The commit, told to the runtime's commit listeners as a value (``actors.system.ports.Commit``),
        with the listing record when this commit wrote one."""
        record = self.last_record if self.record_dirty else None
        self.record_dirty = False
        self.rt.committed(Commit(self.sid, self.stream, events, result, self.state, record, loop_deltas,
                                 self.rt.store))

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

    def _publish(self, events: list[E.Event], inline: dict[str, Deltas]) -> None:
        """The pushes of a commit, in event order. An answer taken in place (``inline``) streams
        where its outcome is: ``item/started`` and its deltas just before the outcome's
        ``item/completed``, as they would have come had the answer streamed over time (before
        its commit); see ``_stream_in_place``."""
        if self.items is None:
            self.items = self.rt.build_items(self)
            return  # built from the store, which already holds these events
        pushes: list[tuple[str, Any]] = []
        streams = bool(inline) and self.channel.has_subscribers
        for event in events:
            if streams and isinstance(event, _STEP_END) and (deltas := inline.get(event.step_id)):
                pushes.extend(self._stream_in_place(event, deltas))
            pushes.extend(self.items.apply(event))
        pushes = self._coalesce(pushes)
        if any(isinstance(e, E.TurnRewound) and e.chat_deleted for e in events):
            # the history was rewritten; what clients hold is void, they resubscribe
            pushes.append(("session/resync", None))
        if pushes:
            self.channel.publish_many(pushes)

    def _stream_in_place(self, outcome: Any, deltas: Deltas) -> list[tuple[str, Any]]:
        """The live pushes of an answer taken in place: what ``SessionChannel.stream`` sends for
        the same deltas of a model call streaming over time (``StreamSink``), an item's
        ``item/started`` with its first delta, then one ``item/delta`` per delta. They go out in
        the commit's one publication, between the pushes of the events before the outcome and the
        outcome's own; the channel does not keep their text for a snapshot as it does for a
        stream in flight, since no snapshot can fall between them (one is taken on this thread)
        and the outcome's ``item/completed`` in the same publication holds the whole text."""
        step_id, turn_id, sid, delta = outcome.step_id, outcome.turn_id, self.sid, self.rt.delta_payload
        thinking, at = f"{step_id}.thinking", now_ms()
        out: list[tuple[str, Any]] = []
        started: set[str] = set()
        for kind, text in deltas:
            item_id = step_id if kind == "text" else thinking
            if item_id not in started:
                started.add(item_id)
                kind_of = AgentMessageItem if kind == "text" else ReasoningItem
                out.append(("item/started", kind_of(item_id=item_id, at=at, turn_id=turn_id, text="")))
            out.append(("item/delta", delta(sid, item_id, text)))
        return out

    def _loop_deltas_in_place(
        self, events: list[E.Event], inline: dict[str, Deltas]
    ) -> dict[str, list[dict[str, Any]]] | None:
        """The ``assistant.delta`` data of the answers this commit took in place (what
        ``StreamSink`` hands a bot for each text delta), for the app's loop watchers; None when
        nobody watches (or no answer had text)."""
        app, watchers = self._app_id(), self.rt.loop_watchers
        if app is None or not watchers.any(app):
            return None
        out: dict[str, list[dict[str, Any]]] = {}
        for event in events:
            if isinstance(event, _STEP_END) and (deltas := inline.get(event.step_id)):
                step_id = event.step_id
                texts = [{"text": text, "itemId": step_id} for kind, text in deltas if kind == "text"]
                if texts:
                    out[step_id] = texts
        return out or None

    def _coalesce(self, pushes: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """One commit's pushes, with the whole-replacement items (queue, plan, usage) sent once,
        in their last state; a queue that did not change since it was last sent is not sent
        (an input that opens a turn at once never shows as queued)."""
        last: dict[str, int] = {}
        for i, (_, item) in enumerate(pushes):
            if item.item_id in _SINGLETONS:
                last[item.item_id] = i
        out = []
        for i, (method, item) in enumerate(pushes):
            if item.item_id in _SINGLETONS:
                if last[item.item_id] != i:
                    continue
                if item.item_id == "queue":
                    entries = msgspec.to_builtins(item.entries)
                    if entries == self._sent_queue:
                        continue
                    self._sent_queue = entries
            out.append((method, item))
        return out

    def _save_snapshot(self) -> None:
        """Save the state as a snapshot. Runs after a commit, before its request is answered: a
        snapshot only makes activation faster, so one the store refuses (a full disk) is logged
        and tried again later, and never turns the committed request into a failure (the input
        is in the log: its client must get its receipt, not "write failed")."""
        try:
            self.rt.faults.hit("snapshot")
            self.rt.store.save_snapshot(self.stream, self.state.version, encode_state(self.state))
        except StoreError as e:
            self._snapshot_retry_at = self.state.version + max(1, self.rt.options.snapshot_every // 4)
            log.warning("session %s: the snapshot at version %d was not saved (%s); the events are committed, "
                        "it is tried again %d events later", self.sid, self.state.version, e,
                        self._snapshot_retry_at - self.state.version)
            return
        self._snapshot_version = self.state.version

    def _end_stream(self, events: list[E.Event]) -> None:
        """The model call's outcome is committed: its live items end, and the cards it announced
        that its answer does not hold are closed (aborted if the turn was stopped, else failed)."""
        if self._sink is not None:
            self._sink.close()
            self._sink = None
        cards = self.channel.end_streams()
        if not cards:
            return
        keep = {c.call_id for e in events if type(e) is E.LlmCompleted for c in e.tool_calls}
        status = "aborted" if any(type(e) is E.TurnAborted for e in events) else "failed"
        closing = close_cards(cards, keep, status)
        if closing:
            self.channel.publish_many(closing)

    def _cancel_tasks(self) -> None:
        if self._model_task is not None:
            self._model_task.cancel()
            self._model_task = None
        if self._sink is not None:
            self._sink.close()  # a delta still on its way must not revive an item
        for task in self._tool_tasks.values():
            task.cancel()
        self._tool_tasks.clear()

    def _launch_model(self, turn_id: str, step_id: str) -> None:
        request = self._model_request(self.config())
        provider = self.rt.provider_for(self.state)
        ref, on_delta = self.actor_ref, self._delta_sink(step_id)
        self._sink = on_delta

        blobs = self.rt.blobs

        async def call() -> None:
            started = time.perf_counter()
            try:
                sent = request
                if has_attachments(request.messages):  # the files, read off the actor thread
                    sent = await asyncio.to_thread(resolve_attachments, request, blobs.read)
                response = await provider.generate(sent, on_delta)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                ref.tell(ModelDone(step_id, None, str(e) or type(e).__name__, _ms_since(started)))
            else:
                ref.tell(ModelDone(step_id, response, None, _ms_since(started)))

        self._model_task = self.rt.worker.start(call())

    def _launch_tool(self, turn_id: str, call_id: str, tool: str, args: Any) -> None:
        ref = self.actor_ref
        ctx = self.rt.tool_context(self, turn_id, call_id)

        caller = CallerContext(session_id=self.sid, turn_id=turn_id, call_id=call_id)

        async def run() -> None:
            CURRENT_CALL.set(caller)  # this task's own context: only this tool sees it
            self.rt.faults.hit("tool-run")
            started = time.perf_counter()
            result = await self.rt.tools.execute(tool, args, ctx)
            ref.tell(ToolDone(turn_id, call_id, result, _ms_since(started)))

        self._tool_tasks[call_id] = self.rt.worker.start(run())

    # --- handlers -------------------------------------------------------------------------------

    def on_create(self, msg: Create) -> None:
        assert msg.reply is not None
        claim = msg.claim
        if claim is not None:
            known = self.rt.store.lookup_claim(claim)
            if known is not None:
                msg.reply.set(_created_dec.decode(known.receipt))
                return
        events = decide_create(self.state, msg.new, msg.initial, now_ms())
        created = Created(session_id=self.sid, turn_id=msg.initial.turn_id if msg.initial else None)
        if claim is not None:
            claim = IdempotencyClaim(claim.scope, claim.key, claim.request_hash, _created_enc.encode(created))
        reply = msg.reply

        def answer(result: Any) -> None:
            if result is not None and result.duplicate:
                reply.set(msgspec.structs.replace(_created_dec.decode(result.receipt), duplicate=True))
            else:
                reply.set(created)

        self._commit_then(msg, events, answer, claim=claim)

    def on_send(self, msg: Send) -> None:
        assert msg.reply is not None
        claim = msg.claim
        if claim is not None:
            known = self.rt.store.lookup_claim(claim)  # IdempotencyConflict for another body
            if known is not None:  # the original receipt, with the cursor of the original input
                msg.reply.set(msgspec.structs.replace(_receipt_dec.decode(known.receipt), state="duplicate",
                                                      position=known.first_position))
                return
        if self.deleting:  # a repeat above still gets its receipt; a new input is refused
            raise NotFound(Text("error.session-deleting", session=self.sid))
        quota = msg.quota
        if quota is not None:
            if self._over_quota(quota):
                msg.reply.set(Receipt(state="rejected", retry_after_ms=quota.retry_after_ms, epoch=self.rt.epoch))
                return
            if self._app_id() is not None:
                # the check took the app's slot for this input: count it as ours already, so the
                # accounting after the commit does not add it twice (a reload gives it back)
                self._unfinished += 1
        accepted = msg.input
        try:
            events = decide_input(self.state, accepted, now_ms())
        except BaseException:
            if quota is not None and self._app_id() is not None:
                self._account_unfinished()  # refused before any append: the slot goes back
            raise
        state = "accepted" if not self.state.is_busy and not self.state.queue else "queued"
        receipt = Receipt(state=state, turn_id=accepted.turn_id, input_id=accepted.input_id,
                          epoch=self.rt.epoch, seq=self.channel.seq)
        if claim is not None:
            claim = IdempotencyClaim(claim.scope, claim.key, claim.request_hash, _receipt_enc.encode(receipt))
        reply = msg.reply

        def answer(result: Any) -> None:
            if result is not None and result.duplicate:
                reply.set(msgspec.structs.replace(_receipt_dec.decode(result.receipt), state="duplicate",
                                                  position=result.first_position))
            else:
                reply.set(msgspec.structs.replace(receipt, position=result.first_position if result else 0))
            self.rt.faults.hit("after-ack")

        self._commit_then(msg, events, answer, claim=claim)

    def _over_quota(self, quota: Quota) -> bool:
        """Too many unfinished turns in this session, or in all of the app's (whose count is
        shared by its sessions, so the slot is taken atomically here: ``app_reserve``; the
        session's own accounting then counts the input as already there, and a failed or
        duplicate append gives the slot back)."""
        if self.state.unfinished_turns() >= quota.per_session:
            return True
        return not self.rt.app_reserve(quota.app_id, quota.per_app)

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

    def on_freeze(self, msg: Freeze) -> None:
        """Stop what runs before a delete (``actors/session/deletion.py``, step 1): the turn is aborted,
        queued inputs are dropped (their waiters hear the session is gone), and until the purge
        no input is taken. NotFound for a session that does not exist or is deleted."""
        assert msg.reply is not None
        state = self.state
        now = now_ms()
        dropped = [q.turn_id for q in state.queue]
        events = decide_stop_for_delete(state, msg.reason, now)
        self.deleting = True
        if events:
            self._cancel_tasks()
            self._commit(events, run_drive=False)
        for turn_id in dropped:
            self.rt.results.complete(TurnOutcome(session_id=self.sid, turn_id=turn_id, state="failed",
                                                 code="not-found", reason=msg.reason, outcome="error"))
        msg.reply.set(None)

    def on_purge(self, msg: Purge) -> None:
        """Take the session out of the store (``actors/session/deletion.py``, step 3): one transaction
        removes its streams, approval and task streams, leaves ``decide_delete``'s tombstone and
        the tombstone listing record, and flags its files for deletion. After the commit the
        listeners hear of it (the listing drops it), the task registry forgets its tasks, and the
        state is the tombstone's fold (deleted: every later command answers not-found)."""
        assert msg.reply is not None
        state = self.state
        now = now_ms()
        events = decide_delete(state, now)
        record = tombstone_record(state, now)
        self._cancel_tasks()
        try:
            result = self.rt.store.purge(self.stream, events, state.version, categories=OWNED_CATEGORIES,
                                         meta=encode_summary_record(record), flags={FILES_PENDING: True})
        except BaseException:
            self._reload()
            raise
        self.last_record, self.record_dirty = record, True
        self._tell_listeners(events, result.tombstone, None)  # before the reload: listeners read what was deleted
        self.deleting = False
        self._reload()
        self.rt.tasks_service.remove_session(self.sid)
        msg.reply.set(result)

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

    def projection(self) -> Any:
        """The timeline's items (``views.items.ItemsProjection``), built from the log on first use."""
        if self.items is None:
            self.items = self.rt.build_items(self)
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


def _ms_since(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


__all__ = ["FILES_PENDING", "OWNED_CATEGORIES", "PooledSessionActor", "SessionActor", "SessionBehaviour"]
