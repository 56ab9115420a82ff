"""The public face of the actor system: ``Host`` (one per data directory) and ``Session`` handles.

    with Host.open("./.sessionloop", durability="nosync") as host:
        session = host.create(title="demo")
        result = session.run("hello")          # RunResult(state="completed", output_text="echo: hello")

The API is the session service (``create / get / list / fork``, ``run / resume /
cancel / compact``); every call that waits on an actor has a timeout.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, cast

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.api.loop import AsyncSessionLoop, LoopFeed, SessionLoop
from sessionloop.actors.api.spawn import spawn_session_spec
from sessionloop.actors.errors import InvalidCommand, NotFound, RequestTimeout
from sessionloop.actors.gateway.relay import IndexReplica
from sessionloop.actors.gateway.service import ClusterPorts, SessionProtocolService
from sessionloop.actors.model import Provider
from sessionloop.actors.model.registry import ModelRegistry
from sessionloop.actors.session import commands as C
from sessionloop.actors.session.actor import SessionActor
from sessionloop.actors.session.context import keep_turns
from sessionloop.actors.session.decide import steps_limit
from sessionloop.actors.session.messages import Ask, Cancel, Compact, Create, Decide, Receipt, Send
from sessionloop.actors.session.rewind import rewind
from sessionloop.actors.session.state import SessionState, Status
from sessionloop.actors.settings.apps import MODES, AppManifest
from sessionloop.actors.settings.service import SettingsService
from sessionloop.actors.system.faults import FaultInjector
from sessionloop.actors.system.ids import new_id
from sessionloop.actors.system.ports import ApprovalsFactory, CommitListener, HostPorts, ToolWrapper
from sessionloop.actors.system.pubsub import Reply, TurnOutcome, Watchers
from sessionloop.actors.system.runtime import HostOptions, Runtime, open_data_store
from sessionloop.actors.tools.sandbox import DEFAULT_POLICY
from sessionloop.actors.views.index import SummaryIndex
from sessionloop.actors.views.summary import decode_summary_record
from sessionloop.actors.webhooks.deliverer import WebhookDeliverer
from sessionloop.eventstore import IdempotencyClaim, LogReplica, RecordedEvent, request_hash
from sessionloop.protocol.connection import Limits
from sessionloop.protocol.limits import MAX_TITLE

log = logging.getLogger("sessionloop.host")

class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    turn_id: str
    state: str  # completed | failed | timeout
    output_text: str = ""
    code: str | None = None
    reason: str | None = None


class SessionInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    title: str
    kind: str
    parent_id: str | None
    status: str
    created_at: int
    updated_at: int
    archived: bool


class Host:
    """The composition root: opens the store and builds everything on it, wired by typed ports
    (``actors.system.ports``); one per data directory.

    ``Host.open`` builds, in this order: the models (a model that cannot be used refuses the start
    before anything is opened), the store, the listing index, the runtime (with its commit
    listeners: the index, the Session Loop API's feed and the caller's, the factory of the
    settings service and the caller's ports: a provider, approvals, a tool wrapper), then the
    host. :meth:`protocol` builds a session protocol service (the gateway) over them. Nothing is
    attached to any of them afterwards.

    Sessions with unfinished work (queued inputs or an interrupted turn) are activated at open
    and resume by themselves; every other session stays on disk until it is used.
    """

    def __init__(self, runtime: Runtime, index: SummaryIndex, settings: SettingsService,
                 settings_work: ThreadPoolExecutor, cluster: ClusterPorts | None = None) -> None:
        self.rt = runtime
        self.cluster = cluster
        self.index = index
        self.settings = settings  # the runtime's settings service (it sees it as ``SessionSettings``)
        self._settings_work = settings_work
        if "spawn_session" not in runtime.tools:
            runtime.tools.register(runtime.ports.tool(spawn_session_spec(self)))
        self.apps = runtime.apps
        self.loop_watchers = runtime.loop_watchers
        #: delivers the outbox of this process's shards to the apps' webhooks (actors/webhooks/)
        self.webhooks = WebhookDeliverer(runtime.store, runtime.apps, runtime.options.webhooks)
        if runtime.options.webhooks.enabled:
            self.webhooks.start()
        if runtime.options.carry_approvals:  # a takeover: the approvals the node before left open go on
            runtime.approvals.carry_leftovers()
        else:
            runtime.approvals.settle_leftovers()
        for session_id in runtime.store.flagged("active"):
            if session_id.startswith("session-") and runtime.store.owns(session_id):
                runtime.tell(session_id[len("session-"):], Ask(C.Wake(), Reply()))

    @classmethod
    def open(cls, data_dir: str = ".sessionloop", *, listeners: Sequence[CommitListener] = (),
             cluster: ClusterPorts | None = None, provider: Provider | None = None,
             approvals: ApprovalsFactory | None = None, tool_handler: ToolWrapper | None = None,
             apps: Sequence[AppManifest] = (), log: LogReplica | None = None, **options: Any) -> Host:
        """Open the host on ``data_dir``; ``options`` are the fields of :class:`HostOptions`;
        ``listeners`` hear every commit (``actors.system.ports.Commit``) from the first, before
        the sessions with unfinished work resume (a tracer sees their repairs too).

        The other keywords put a part of the runtime in place of the real one, for the host's
        whole life (``actors.system.ports.HostPorts``): ``provider`` answers every session's model
        calls instead of the configured models (a scripted or replayed model: tests, benchmarks,
        ``rerun``); ``approvals(runtime)`` makes the approval service instead of the real one
        (``rerun`` answers its fork's approvals from the recording); ``tool_handler(spec)`` gives
        the handler each tool runs with, the built-in ones and ``spawn_session`` (``rerun``
        replays the recorded results).

        ``apps``: the app manifests in force from the start (``serve``'s apps file), registered
        before the sessions with unfinished work resume and before webhooks are delivered.

        ``cluster`` (``serve --workers``): this process is one of several workers (the options
        ``worker`` and ``workers`` say which); every commit's listing record goes to the others and
        theirs come into this host's index, so it lists every session.

        ``log`` (``serve --cluster``): the cluster's event log, whose shard leases this node holds;
        the store is brought up to it before anything reads the store, and follows it (a commit is
        in the store once the log holds it: ``eventstore/log_replica.py``).

        Raises StoreLocked if another process serves this directory, ValueError for an unknown
        option.
        """
        try:
            if "max_steps" in options:  # maxSteps without a limit: math.inf, "unlimited" or 0
                options = {**options, "max_steps": steps_limit(options["max_steps"])}
            opts = msgspec.convert(options, HostOptions)
        except ValueError as e:
            raise ValueError(f"invalid host option: {e}") from e
        if log is not None:  # every start of a cluster node takes its shards over from the log
            opts.carry_approvals = True
        data_dir = os.path.abspath(data_dir)
        models = ModelRegistry.for_host(opts.models, opts.model, opts.model_options)
        faults = FaultInjector.from_env()
        store = open_data_store(data_dir, opts, faults, log)
        settings_work = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sessionloop-settings")
        try:
            index = SummaryIndex()  # loaded below, after the runtime's start-up repairs
            watchers = Watchers()
            # the other workers' records, from before the index is loaded on (none is missed)
            replica = () if cluster is None else (IndexReplica(cluster.link, cluster.placement, index).committed,)

            def settings(rt: Runtime) -> SettingsService:
                return SettingsService(rt, index, _submitter(settings_work))

            runtime = Runtime(data_dir, opts, store=store, models=models, faults=faults, loop_watchers=watchers,
                              listeners=(index.committed, LoopFeed(watchers).committed, *replica, *listeners),
                              settings=settings, app_counts=None if cluster is None else cluster.app_counts,
                              ports=HostPorts(provider=provider, approvals=approvals, tool_handler=tool_handler))
            runtime.apps.register_all(list(apps))  # before a session resumes or a webhook is delivered
            index.load(store)
        except BaseException:
            settings_work.shutdown(wait=False)
            store.close()
            raise
        return cls(runtime, index, cast(SettingsService, runtime.settings), settings_work, cluster)

    def protocol(self, *, limits: Limits | None = None) -> SessionProtocolService:
        """A session protocol service (the gateway, ``actors.gateway.service``) over this host: what
        a transport (``serve``) or an in-memory client talks to. Close it before the host."""
        return SessionProtocolService(self.rt, index=self.index, settings=self.settings, host=self, limits=limits,
                                      cluster=self.cluster)

    def close(self) -> None:
        self.webhooks.close()
        self.rt.close()
        self._settings_work.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def epoch(self) -> int:
        return self.rt.epoch

    @property
    def store(self) -> Any:
        return self.rt.store

    # --- the Session Loop API -----------------------------------------------------------------------

    def register_app(self, app_id: str, *, platform: str = "", sessions: bool = True,
                     containers: list[str] | tuple[str, ...] = (), token: str | None = None,
                     permission_modes: list[str] | tuple[str, ...] = MODES, sandbox: str = DEFAULT_POLICY,
                     name: str = "") -> None:
        """Register an app (a bot) with its manifest; ``permission_modes`` and
        ``sandbox`` bound what its sessions may do (:mod:`actors.settings.apps`). Raises InvalidCommand."""
        self.apps.register(AppManifest(id=app_id, platform=platform or app_id, sessions=sessions,
                                       containers=list(containers), token=token, name=name,
                                       permission_modes=list(permission_modes), sandbox=sandbox))

    def sessions(self, app: str) -> Any:
        """The Session Loop API handle of a registered app (sync)."""

        return SessionLoop(self, self.apps.get(app))

    def async_sessions(self, app: str) -> Any:
        """The same API with coroutines, for asyncio bots."""

        return AsyncSessionLoop(SessionLoop(self, self.apps.get(app)))

    # --- the session service -----------------------------------------------------------------------

    def create(self, *, title: str = "", name: str = "", permission_mode: E.PermissionMode | None = None,
               activity: E.Activity = "interactive", cwd: str = "", model: str | None = None,
               parent_id: str | None = None, kind: E.SessionKind = "owner", initial_input: str | None = None,
               idempotency_key: str | None = None, **created: Any) -> Session:
        """Create a session (``session.created``); with ``initial_input`` its first input is
        accepted in the same commit, so a failure leaves no session behind."""
        for field, value in (("title", title), ("name", name)):
            if len(value) > MAX_TITLE:
                raise InvalidCommand(f"{field}: at most {MAX_TITLE} characters, got {len(value)}")
        session_id = self.rt.new_session_id()
        try:
            new = C.NewSession(title=title, name=name, kind=kind, parent_id=parent_id, activity=activity, cwd=cwd,
                               model=model, permission_mode=permission_mode or self.rt.options.permission_mode
                               or _default_mode(activity), **created)
        except (TypeError, msgspec.ValidationError) as e:
            raise InvalidCommand(f"invalid session: {e}") from e
        initial = None
        if initial_input is not None:
            initial = C.NewInput(input_id=new_id(), turn_id=new_id(), text=initial_input,
                                 idempotency_key=idempotency_key)
        created_now = self.rt.ask(session_id, lambda r: Create(new, initial, r))
        session = Session(self, created_now.session_id)
        session.initial_turn_id = initial.turn_id if initial is not None else None
        return session

    def get(self, session_id: str) -> Session | None:
        """The session, or None if it does not exist (or was deleted)."""
        try:
            exists = self.rt.ask(session_id, lambda r: Ask(C.Exists(), r))
        except NotFound:
            return None
        return Session(self, session_id) if exists else None

    def session(self, session_id: str) -> Session:
        """A handle without an existence check (its calls raise NotFound if it does not exist)."""
        return Session(self, session_id)

    def list(self) -> list[SessionInfo]:
        """Every stored session, newest activity first, read from the listing records (no actor
        is activated)."""

        out = []
        for stream, meta in self.rt.store.scan_stream_meta():
            if not stream.startswith("session-"):
                continue
            rec = decode_summary_record(meta)
            if rec.deleted:
                continue
            out.append(SessionInfo(id=rec.id, title=rec.title, kind=rec.kind, parent_id=rec.parent_id,
                                   status=rec.status, created_at=rec.created_at, updated_at=rec.updated_at,
                                   archived=rec.archived))
        out.sort(key=lambda s: s.updated_at, reverse=True)
        return out

    def fork(self, session_id: str, turns: int | None = None, *, title: str | None = None) -> Session:
        """A new session with a copy of the source's messages (``fork``): new id, steps
        and events start empty, the source is unchanged; ``turns=N`` keeps the first N turns
        (counted by user messages; 0 keeps only the system part)."""
        if turns is not None and turns < 0:
            raise InvalidCommand("turns must be >= 0")
        source = self.rt.ask(session_id, lambda r: Ask(C.ForkSource(), r))
        messages = source.messages if turns is None else keep_turns(source.messages, turns)
        new = self.rt.new_session_id()
        fork = C.ImportFork(source_id=session_id, source_created=source.created, session_id=new, turns=turns,
                            title=title if title is not None else (source.title or source.created.name),
                            messages=messages)
        self.rt.ask(new, lambda r: Decide(fork, r))
        return Session(self, new)


def _default_mode(activity: str) -> E.PermissionMode:
    return "acceptCalls" if activity == "background" else "ask"


class HasRuntime(Protocol):
    """What a session handle needs of what made it (a :class:`Host`, the gateway's service):
    the runtime that reaches the session."""

    @property
    def rt(self) -> Runtime: ...


class Session:
    """A handle on one session; cheap to create, safe to share between threads."""

    def __init__(self, host: HasRuntime, session_id: str) -> None:
        self.host = host
        self.rt = host.rt
        self.id = session_id
        self.initial_turn_id: str | None = None

    def __repr__(self) -> str:
        return f"Session({self.id!r})"

    def _query(self, query: C.Query, timeout: float | None = None) -> Any:
        return self.rt.ask(self.id, lambda r: Ask(query, r), timeout)

    @property
    def state(self) -> str:
        """``idle | running | waiting_tool | completed | failed | cancelled``."""
        return str(self._query(C.StatusOf()))

    def snapshot(self) -> SessionState:
        """A copy of the folded state: messages, steps, tool calls, artifacts, checkpoints."""
        return self._query(C.StateCopy())

    def events(self) -> list[RecordedEvent]:
        return self.rt.store.read_stream(f"session-{self.id}")

    def send(self, text: str, *, idempotency_key: str | None = None, scope: str = "session",
             speaker: E.Speaker | None = None, source: str | None = None,
             attachments: list[E.AttachmentRef] | None = None) -> Receipt:
        """Queue an input (strict FIFO); with ``idempotency_key`` a repeat returns the original
        receipt (``state='duplicate'``) and starts nothing, and a different body is refused."""
        accepted = C.NewInput(input_id=new_id(), turn_id=new_id(), text=text, attachments=attachments or [],
                              speaker=speaker, source=source, idempotency_key=idempotency_key)
        claim = None
        if idempotency_key is not None:
            body = {"text": text, "attachments": [a.sha256 for a in attachments or []]}
            claim = IdempotencyClaim(f"{scope}:{self.id}", idempotency_key, request_hash(body))
        return self.rt.ask(self.id, lambda r: Send(accepted, claim, r))

    def run(self, text: str, timeout: float = 600.0) -> RunResult:
        """Send ``text`` and wait for its turn to end."""
        receipt = self.send(text)
        assert receipt.turn_id is not None
        return self.wait(receipt.turn_id, timeout)

    def wait(self, turn_id: str, timeout: float = 60.0) -> RunResult:
        """Wait for ``turn_id`` to end: woken by the turn's end event, never by polling."""
        outcome = self.wait_outcome(turn_id, timeout)
        if outcome is None:
            return RunResult(turn_id=turn_id, state="timeout")
        return RunResult(turn_id=turn_id, state=outcome.state, output_text=outcome.output_text,
                         code=outcome.code, reason=outcome.reason)

    def wait_outcome(self, turn_id: str, timeout: float) -> TurnOutcome | None:
        reply = Reply()
        self.watch_turn(turn_id, reply)
        try:
            return reply.result(timeout)
        except Exception as e:
            if isinstance(e, RequestTimeout):
                return None
            raise
        finally:
            self.rt.results.cancel_wait(turn_id, reply.set)

    def watch_turn(self, turn_id: str, reply: Reply) -> None:
        """Complete ``reply`` with the turn's outcome when it ends (at once if it has ended)."""
        found = self.rt.results.wait(turn_id, reply.set)
        if found is not None:
            reply.set(found)
            return
        if self.rt.results.is_expected(turn_id):
            return  # a live session will end it: the waiter is registered, no message needed
        # not among recent outcomes: the session knows whether the turn ended long ago
        known = Reply()
        known.add_callback(lambda r: _known_turn(r, reply))
        self.rt.tell(self.id, Ask(C.TurnEnd(turn_id=turn_id), known))

    def resume(self, timeout: float = 600.0) -> RunResult | None:
        """Activate the session so interrupted work goes on, and wait for the last turn it has
        (running or queued); None when there is nothing to resume."""
        last = self._query(C.LastTurn())
        if last is None:
            return None
        return self.wait(last, timeout)

    def continue_turn(self) -> Receipt:
        """Let the agent go on after a ``tool-limit`` stop (``turn/continue``): a new
        turn with no user message, queued like any input."""
        return self.send("", source="continue")

    def cancel(self, turn_id: str | None = None, reason: str = "cancelled by the user") -> bool:
        """Stop the running turn (model and tools get the abort), or the running manual compaction
        (its ``compact()`` raises CompactionFailed); True if one was."""
        return bool(self.rt.ask(self.id, lambda r: Cancel(turn_id, reason, r)))

    def compact(self, timeout: float = 600.0) -> dict[str, int] | None:
        """Summarise all turns so far into one summary message (manual compaction):
        ``{turns, chars}``, or None when there is nothing to compact. Raises SessionBusy while a
        turn or another compaction runs, CompactionFailed when the summary model is not available
        or fails, the history changes meanwhile (an input, a rewind...) or ``cancel()`` stops it."""
        return self.rt.ask(self.id, Compact, timeout)

    def rename(self, title: str) -> None:
        self.rt.ask(self.id, lambda r: Decide(C.Rename(title=title), r))

    def rewind(self, turn_id: str, scope: str = "code") -> dict[str, Any]:
        """Restore files to their state before ``turn_id`` (the checkpoints taken before each file change); with
        ``code-and-chat`` the turn and later ones leave the conversation too."""

        return rewind(self.rt, self.id, turn_id, scope)


def _known_turn(known: Reply, waiter: Reply) -> None:
    """The session's answer about a turn the recent outcomes forgot: its outcome (the waiter
    completes), None while it is queued or running (the registered waiter completes when it
    ends), or not-found."""
    value, error = known.outcome()
    if error is not None:
        waiter.fail(error)
    elif value is not None:
        waiter.set(value)


def _submitter(pool: ThreadPoolExecutor) -> Callable[[Callable[[], None]], None]:
    """The settings service's way to run store writes and file reads off the actor threads."""

    def submit(work: Callable[[], None]) -> None:
        try:
            pool.submit(work)
        except RuntimeError:  # the pool is shut down: the place is recorded on its next use
            log.debug("settings work dropped at shutdown")

    return submit


__all__ = ["Host", "HostOptions", "RunResult", "Session", "SessionActor", "SessionInfo", "Status", "new_id"]

